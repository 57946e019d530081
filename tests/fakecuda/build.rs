//! Link flags for the simulated driver.
fn main() {
    // Loaded by the soname programs link against (`-lcuda` records `libcuda.so.1`).
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // Bind the library's own references to its own definitions: the addresses that `cuGetProcAddress`
    // hands out are then always this library's functions (what `dlsym` on its handle gives), even when a
    // preloaded shim exports the same names, as the real driver behaves.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    println!("cargo:rerun-if-changed=build.rs");
}

//! Link flags for the simulated NVML.
fn main() {
    // Loaded by the soname programs link against (`-lnvidia-ml` records `libnvidia-ml.so.1`).
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    // The library's own references bind to its own definitions, as in the real NVML, even when a preloaded shim
    // exports the same names.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    println!("cargo:rerun-if-changed=build.rs");
}

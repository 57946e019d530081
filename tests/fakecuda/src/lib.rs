//! `libfakecuda.so`: a stand-in for `libcuda.so.1` (soname `libcuda.so.1`) with the real driver's names,
//! ABI and memory semantics, and no GPU. Tests put a `libcuda.so.1` / `libcuda.so` symlink to it on
//! `LD_LIBRARY_PATH`.
//!
//! One module per concern:
//! - `types`: the ABI (types, structs, codes); `config`: the environment, read once;
//! - `driver`: the process-wide tables behind one lock, `cuInit` state, context stacks, fork and exit;
//! - `device`: init, devices, attributes, error strings; `context`: primary and created contexts;
//! - `stream`: streams and events; `alloc`: the allocator; `memory`: the classic and stream-ordered
//!   allocation entry points; `pool`: memory pools; `vmm`: `cuMemCreate` and the virtual memory calls;
//! - `copy`: memcpy/memset (a host-side copy of small allocations' contents);
//! - `state`: device accounting, process-local or shared between processes (`FAKECUDA_STATE`);
//! - `log`: the driver's own call log (`FAKECUDA_LOG`); `procaddr`: `cuGetProcAddress` and its table.
//!
//! Every entry point catches panics (none unwinds across the FFI boundary: a panic returns
//! `CUDA_ERROR_UNKNOWN`).

// Driver entry points keep the driver's names, and their contract is the CUDA API's own.
#![allow(non_snake_case, non_camel_case_types, clippy::missing_safety_doc)]

/// Defines exported driver entry points: `fn name(args) => implementation;`. The implementation is a safe
/// expression returning `CUresult`; it runs under `catch_unwind`.
macro_rules! export {
    ($( $(#[$m:meta])* fn $name:ident ( $($a:ident : $t:ty),* $(,)? ) => $imp:expr ; )*) => {$(
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $crate::types::CUresult {
            $crate::ffi(move || $imp)
        }
    )*};
}

mod alloc;
mod config;
mod context;
mod copy;
mod device;
mod driver;
mod log;
mod memory;
mod pool;
mod procaddr;
mod state;
mod stream;
mod types;
mod vmm;

use types::{CUresult, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS};

/// Runs an entry point's body; a panic becomes `CUDA_ERROR_UNKNOWN`.
fn ffi(f: impl FnOnce() -> CUresult) -> CUresult {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(CUDA_ERROR_UNKNOWN)
}

/// Writes an out-parameter; a null one is `CUDA_ERROR_INVALID_VALUE`.
fn put<T>(p: *mut T, v: T) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's out-parameter, as the API contract says.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Writes an optional out-parameter (null: ignored).
fn put_opt<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: as `put`.
        unsafe { p.write_unaligned(v) };
    }
}

/// Reads an in-parameter struct; a null one is `CUDA_ERROR_INVALID_VALUE`.
fn get<T: Copy>(p: *const T) -> Result<T, CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's in-parameter, as the API contract says.
    Ok(unsafe { p.read_unaligned() })
}

fn rc<T>(r: Result<T, CUresult>) -> CUresult {
    match r {
        Ok(_) => CUDA_SUCCESS,
        Err(e) => e,
    }
}

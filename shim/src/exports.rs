//! The exported C symbols, and nothing else: each unpacks its arguments, calls its hook and returns the
//! driver's result code unchanged. The names are the driver's exact versioned names, because that is what a
//! program linked with `-lcuda` binds to (cuda.h `#define`s `cuMemAlloc` to `cuMemAlloc_v2`). NVML's two memory
//! functions are here too, for programs linked with `-lnvidia-ml` (nvml.rs), and libc's wait functions, whose
//! reaps the shim reports (reap.rs).

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::contexts::{self, driver_fn};
use crate::cuda::*;
use crate::driver::{for_each_driver_function, Sym};
use crate::hooks;
use crate::nvml;

/// Builds this file's half of the driver functions' one list (driver.rs): `wrapper`, each wrapped function's
/// export below.
macro_rules! declare_wrappers {
    (
        wrapped { $( $(#[$wm:meta])* $w:ident = $wname:literal => $wfn:ident, )* }
        called { $( $(#[$cm:meta])* $c:ident = $cname:literal, )* }
    ) => {
        /// The export standing in for `f` (null for a function the shim only calls): what `dlsym` and
        /// `cuGetProcAddress` hand out in place of the driver's.
        pub(crate) fn wrapper(f: Sym) -> *mut c_void {
            match f {
                $( Sym::$w => $wfn as *const () as *mut c_void, )*
                _ => std::ptr::null_mut(),
            }
        }

        /// Each wrapper's Rust name (its `#[no_mangle]` symbol) beside the name it stands in for, and the
        /// functions only called.
        #[cfg(test)]
        const EXPORTED_AS: &[(Sym, &str, &std::ffi::CStr)] = &[$( (Sym::$w, stringify!($wfn), $wname), )*];
        #[cfg(test)]
        const ONLY_CALLED: &[Sym] = &[$( Sym::$c, )*];
    };
}

for_each_driver_function!(declare_wrappers);

#[no_mangle]
#[link_section = ".vramtrace.hot"]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    hooks::mem_alloc(dptr, bytesize)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    hooks::mem_alloc_pitch(dptr, pitch, width, height, element_size)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    hooks::mem_alloc_managed(dptr, bytesize, flags)
}

#[no_mangle]
#[link_section = ".vramtrace.hot"]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    hooks::mem_free(dptr)
}

#[no_mangle]
#[link_section = ".vramtrace.hot"]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    hooks::mem_alloc_async(Sym::MemAllocAsync, dptr, bytesize, stream)
}

#[no_mangle]
#[link_section = ".vramtrace.hot"]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    hooks::mem_alloc_async(Sym::MemAllocAsyncPtsz, dptr, bytesize, stream)
}

#[no_mangle]
#[link_section = ".vramtrace.hot"]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    hooks::mem_alloc_from_pool(Sym::MemAllocFromPoolAsync, dptr, bytesize, pool, stream)
}

#[no_mangle]
#[link_section = ".vramtrace.hot"]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    hooks::mem_alloc_from_pool(Sym::MemAllocFromPoolAsyncPtsz, dptr, bytesize, pool, stream)
}

#[no_mangle]
#[link_section = ".vramtrace.hot"]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    hooks::mem_free_async(Sym::MemFreeAsync, dptr, stream)
}

#[no_mangle]
#[link_section = ".vramtrace.hot"]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    hooks::mem_free_async(Sym::MemFreeAsyncPtsz, dptr, stream)
}

#[no_mangle]
#[link_section = ".vramtrace.hot"]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    hooks::mem_create(handle, size, prop, flags)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    contexts::create(Sym::CtxCreate, pctx, dev, || {
        let f = driver_fn!(
            Sym::CtxCreate,
            unsafe extern "C" fn(*mut CUcontext, c_uint, CUdevice) -> CUresult
        );
        f(pctx, flags, dev)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut c_void,
    n: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    contexts::create(Sym::CtxCreateV3, pctx, dev, || {
        let f = driver_fn!(
            Sym::CtxCreateV3,
            unsafe extern "C" fn(*mut CUcontext, *mut c_void, c_int, c_uint, CUdevice) -> CUresult
        );
        f(pctx, params, n, flags, dev)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    contexts::create(Sym::CtxCreateV4, pctx, dev, || {
        let f = driver_fn!(
            Sym::CtxCreateV4,
            unsafe extern "C" fn(*mut CUcontext, *mut c_void, c_uint, CUdevice) -> CUresult
        );
        f(pctx, params, flags, dev)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    contexts::destroy(ctx)
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    contexts::primary_reset(Sym::PrimaryCtxReset, dev)
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    contexts::primary_release(Sym::PrimaryCtxRelease, dev)
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    contexts::primary_reset(Sym::PrimaryCtxResetV1, dev)
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    contexts::primary_release(Sym::PrimaryCtxReleaseV1, dev)
}

#[no_mangle]
#[link_section = ".vramtrace.hot"]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    hooks::mem_release(handle)
}

#[no_mangle]
#[link_section = ".vramtrace.hot"]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    hooks::mem_map(ptr, size, offset, handle, flags)
}

#[no_mangle]
#[link_section = ".vramtrace.hot"]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    hooks::mem_unmap(ptr, size)
}

#[no_mangle]
#[link_section = ".vramtrace.hot"]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    hooks::mem_address_reserve(ptr, size, alignment, addr, flags)
}

#[no_mangle]
#[link_section = ".vramtrace.hot"]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    hooks::mem_address_free(ptr, size)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    hooks::mem_get_info(free, total)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    hooks::device_total_mem(bytes, dev)
}

/// The 4-argument lookup (CUDA 11.3 to 11.8 ABI).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    hooks::get_proc_address(symbol, pfn, cuda_version, flags, None, wrapper)
}

/// The 5-argument lookup (CUDA 12.0 on): `cuGetProcAddress` in cuda.h is `#define`d to this.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    hooks::get_proc_address(symbol, pfn, cuda_version, flags, Some(status), wrapper)
}

/// NVML's memory figures (v1), for programs linked with `-lnvidia-ml`; `dlsym` hands out the same function.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvml::NvmlDevice,
    memory: *mut nvml::NvmlMemory,
) -> nvml::NvmlReturn {
    nvml::memory_info(device, memory)
}

/// NVML's memory figures (v2: with the driver's reservation apart).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvml::NvmlDevice,
    memory: *mut nvml::NvmlMemoryV2,
) -> nvml::NvmlReturn {
    nvml::memory_info_v2(device, memory)
}

/// `dlsym`, as a trampoline. It asks `driver::dlsym_route` whether the lookup concerns us; if not, it jumps
/// straight into the next `dlsym` (glibc's, or another interposer's preloaded after us) with the caller's return
/// address still on the stack, so glibc resolves
/// `RTLD_NEXT` and `RTLD_DEFAULT` from the caller's scope exactly as it would without the shim. Tracked names
/// go to `dlsym_hook`. Written as a naked function because only a tail jump keeps the caller's address.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // At entry rsp is 8 mod 16; two pushes and 8 bytes realign it for the call. The CFI directives let
    // profilers and debuggers unwind through it at every instruction; `endbr64` makes it a valid target of an
    // indirect call on hosts that enforce indirect-branch tracking.
    core::arch::naked_asm!(
        ".cfi_startproc",
        "endbr64",
        "push rdi",
        ".cfi_adjust_cfa_offset 8",
        "push rsi",
        ".cfi_adjust_cfa_offset 8",
        "sub rsp, 8",
        ".cfi_adjust_cfa_offset 8",
        "call {route}",
        "add rsp, 8",
        ".cfi_adjust_cfa_offset -8",
        "pop rsi",
        ".cfi_adjust_cfa_offset -8",
        "pop rdi",
        ".cfi_adjust_cfa_offset -8",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "jmp {hook}",
        ".cfi_endproc",
        route = sym crate::driver::dlsym_route,
        hook = sym dlsym_hook,
    )
}

/// A `dlsym` of a tracked name (the trampoline's second way): the driver's answer, with our wrapper in its place.
unsafe extern "C" fn dlsym_hook(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    crate::driver::dlsym_hook(handle, symbol, wrapper)
}

#[cfg(not(target_arch = "x86_64"))]
compile_error!(
    "vramtrace's dlsym trampoline is written for x86_64; other architectures need their own (see exports.rs)"
);

// ---- the wait functions (reap.rs): a process reaping its own children tells the collector how they ended ----

#[no_mangle]
pub unsafe extern "C" fn wait4(
    pid: libc::pid_t,
    status: *mut c_int,
    options: c_int,
    rusage: *mut libc::rusage,
) -> libc::pid_t {
    crate::reap::wait4(pid, status, options, rusage)
}

#[no_mangle]
pub unsafe extern "C" fn waitpid(
    pid: libc::pid_t,
    status: *mut c_int,
    options: c_int,
) -> libc::pid_t {
    crate::reap::waitpid(pid, status, options)
}

#[no_mangle]
pub unsafe extern "C" fn wait(status: *mut c_int) -> libc::pid_t {
    crate::reap::wait(status)
}

/// `wait3` is `wait4(-1, ...)` (as glibc defines it): Python's `os.wait3` reaches it.
#[no_mangle]
pub unsafe extern "C" fn wait3(
    status: *mut c_int,
    options: c_int,
    rusage: *mut libc::rusage,
) -> libc::pid_t {
    crate::reap::wait4(-1, status, options, rusage)
}

#[no_mangle]
pub unsafe extern "C" fn waitid(
    idtype: libc::idtype_t,
    id: libc::id_t,
    infop: *mut libc::siginfo_t,
    options: c_int,
) -> c_int {
    crate::reap::waitid(idtype, id, infop, options)
}

// ---- the Python bridge's door (bridge.rs): not driver entry points, called through ctypes ----

#[no_mangle]
pub extern "C" fn vramtrace_bridge_version() -> c_int {
    crate::bridge::VERSION
}

#[no_mangle]
pub unsafe extern "C" fn vramtrace_framework_sample(
    framework: c_uint,
    device: c_uint,
    values: *const u64,
    n: c_uint,
    ts_ns: u64,
) -> c_int {
    crate::bridge::sample(framework, device, values, n, ts_ns)
}

#[no_mangle]
pub unsafe extern "C" fn vramtrace_bridge_record(
    what: *const c_char,
    device: c_uint,
    doc: *const c_char,
    len: usize,
    ack: c_int,
) -> c_int {
    crate::bridge::record(what, device, doc, len, ack)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each wrapper is exported under exactly the name it stands in for (`#[no_mangle]` exports a function by
    /// its Rust name), and every wrapped function has one; the functions only called have none.
    #[test]
    fn each_wrapper_is_exported_under_its_drivers_name() {
        for (f, rust, c) in EXPORTED_AS {
            assert_eq!(c.to_str().unwrap(), *rust, "{f:?}");
            assert_eq!(f.name(), *c);
            assert!(!wrapper(*f).is_null(), "{f:?}");
        }
        for f in ONLY_CALLED {
            assert!(wrapper(*f).is_null(), "{f:?}");
        }
        assert!(EXPORTED_AS.len() > 20 && ONLY_CALLED.len() > 5);
    }
}

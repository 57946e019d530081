//! NVML's memory figures as a program reaching NVML through `dlsym` sees them (pynvml's way: ctypes is `dlopen` +
//! `dlsym`), before and after the CUDA driver is initialised and some memory allocated.
//!
//! `nvml_probe [--device D] [--alloc BYTES] [--before]`:
//! 1. `dlopen("libnvidia-ml.so.1")`, `dlsym` of each NVML function, `nvmlInit_v2`;
//! 2. with `--before`, one `before` line per NVML device (the driver not yet loaded);
//! 3. `dlopen("libcuda.so.1")`, `cuInit`, device D's primary context current, `cuMemAlloc_v2(BYTES)` (kept);
//! 4. one `after` line per NVML device, then `cuda <rc> <free> <total>` (`cuMemGetInfo_v2`), then
//!    `badversion <rc>` (`nvmlDeviceGetMemoryInfo_v2` of NVML device 0 with version 0), then `PASS`.
//!
//! A device line: `<phase> <nvml index> <uuid> v1 <rc> <total> <free> <used> v2 <rc> <total> <reserved> <free>
//! <used>`. Exit 1 after `FAIL <why>` when a step other than the figures fails.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

use vramtrace_test_programs::{fail, open_libcuda, CUcontext, CUdevice, CUdeviceptr, CUresult};

#[repr(C)]
#[derive(Default)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
#[derive(Default)]
struct MemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

const NVML_MEMORY_V2: c_uint = std::mem::size_of::<MemoryV2>() as c_uint | (2 << 24);

type Device = *mut c_void;

struct Nvml {
    count: unsafe extern "C" fn(*mut c_uint) -> c_uint,
    handle: unsafe extern "C" fn(c_uint, *mut Device) -> c_uint,
    uuid: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_uint,
    mem: unsafe extern "C" fn(Device, *mut Memory) -> c_uint,
    mem_v2: unsafe extern "C" fn(Device, *mut MemoryV2) -> c_uint,
}

fn dl_error() -> String {
    // SAFETY: dlerror returns a message or null.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated message.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

fn open_nvml() -> Nvml {
    // SAFETY: dlopen of a library by name.
    let h = unsafe { libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_NOW) };
    if h.is_null() {
        fail(&format!("dlopen(libnvidia-ml.so.1) failed: {}", dl_error()));
    }
    let sym = |name: &str| -> *mut c_void {
        let c = CString::new(name).unwrap();
        // SAFETY: dlsym on a live handle, through the PLT (what a preloaded shim intercepts).
        let p = unsafe { libc::dlsym(h, c.as_ptr()) };
        if p.is_null() {
            fail(&format!("dlsym({name}) gave null"));
        }
        p
    };
    /// A looked-up pointer as `T` (its function pointer type).
    fn func<T: Copy>(p: *mut c_void) -> T {
        assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: T is the NVML function's pointer type (the caller's promise).
        unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) }
    }
    let init: unsafe extern "C" fn() -> c_uint = func(sym("nvmlInit_v2"));
    let nvml = Nvml {
        count: func(sym("nvmlDeviceGetCount_v2")),
        handle: func(sym("nvmlDeviceGetHandleByIndex_v2")),
        uuid: func(sym("nvmlDeviceGetUUID")),
        mem: func(sym("nvmlDeviceGetMemoryInfo")),
        mem_v2: func(sym("nvmlDeviceGetMemoryInfo_v2")),
    };
    // SAFETY: NVML's initialisation, no arguments.
    unsafe {
        let r = init();
        if r != 0 {
            fail(&format!("nvmlInit_v2 returned {r}"));
        }
        nvml
    }
}

fn report(nvml: &Nvml, phase: &str) {
    let mut n: c_uint = 0;
    // SAFETY: NVML calls with valid out-pointers.
    unsafe {
        let r = (nvml.count)(&mut n);
        if r != 0 {
            fail(&format!("nvmlDeviceGetCount_v2 returned {r}"));
        }
        for i in 0..n {
            let mut d: Device = std::ptr::null_mut();
            let r = (nvml.handle)(i, &mut d);
            if r != 0 {
                fail(&format!("nvmlDeviceGetHandleByIndex_v2({i}) returned {r}"));
            }
            let mut buf = [0 as c_char; 96];
            let r = (nvml.uuid)(d, buf.as_mut_ptr(), buf.len() as c_uint);
            if r != 0 {
                fail(&format!("nvmlDeviceGetUUID({i}) returned {r}"));
            }
            let uuid = CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
            let mut m = Memory::default();
            let r1 = (nvml.mem)(d, &mut m);
            let mut m2 = MemoryV2 {
                version: NVML_MEMORY_V2,
                ..Default::default()
            };
            let r2 = (nvml.mem_v2)(d, &mut m2);
            println!(
                "{phase} {i} {uuid} v1 {r1} {} {} {} v2 {r2} {} {} {} {}",
                m.total, m.free, m.used, m2.total, m2.reserved, m2.free, m2.used
            );
        }
    }
}

fn main() {
    let mut device: c_int = 0;
    let mut alloc: usize = 0;
    let mut before = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> usize {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| fail(&format!("{what} needs a number")))
        };
        match a.as_str() {
            "--device" => device = num("--device") as c_int,
            "--alloc" => alloc = num("--alloc"),
            "--before" => before = true,
            _ => fail(&format!("unknown argument {a:?}")),
        }
    }
    let nvml = open_nvml();
    if before {
        report(&nvml, "before");
    }
    let cu = open_libcuda();
    // SAFETY: driver calls with valid out-pointers, signatures as in cuda.h.
    unsafe {
        let init: unsafe extern "C" fn(c_uint) -> CUresult = cu.func("cuInit");
        let get: unsafe extern "C" fn(*mut CUdevice, c_int) -> CUresult = cu.func("cuDeviceGet");
        let retain: unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult =
            cu.func("cuDevicePrimaryCtxRetain");
        let set: unsafe extern "C" fn(CUcontext) -> CUresult = cu.func("cuCtxSetCurrent");
        let malloc: unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult =
            cu.func("cuMemAlloc_v2");
        let info: unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult =
            cu.func("cuMemGetInfo_v2");
        let mut dev: CUdevice = 0;
        let mut ctx: CUcontext = std::ptr::null_mut();
        for (what, r) in [
            ("cuInit", init(0)),
            ("cuDeviceGet", get(&mut dev, device)),
            ("cuDevicePrimaryCtxRetain", retain(&mut ctx, dev)),
            ("cuCtxSetCurrent", set(ctx)),
        ] {
            if r != 0 {
                fail(&format!("{what} returned {r}"));
            }
        }
        if alloc > 0 {
            let mut p: CUdeviceptr = 0;
            let r = malloc(&mut p, alloc);
            if r != 0 {
                fail(&format!("cuMemAlloc_v2({alloc}) returned {r}"));
            }
        }
        report(&nvml, "after");
        let (mut free, mut total) = (0usize, 0usize);
        let r = info(&mut free, &mut total);
        println!("cuda {r} {free} {total}");
        let mut d: Device = std::ptr::null_mut();
        (nvml.handle)(0, &mut d);
        let mut m2 = MemoryV2::default();
        println!("badversion {}", (nvml.mem_v2)(d, &mut m2));
    }
    println!("PASS");
}

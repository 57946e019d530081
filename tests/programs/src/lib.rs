//! Shared code of the test programs: the driver ABI bits they need, the table of driver functions the
//! PATTERN uses (filled through whichever door a program tests), and the PATTERN itself (see PATTERN.md).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

pub type CUresult = c_uint;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUmemoryPool = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CU_MEM_ATTACH_GLOBAL: c_uint = 1;
pub const CU_STREAM_NON_BLOCKING: c_uint = 1;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
pub const MIB: usize = 1 << 20;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemLocation {
    pub type_: c_uint,
    pub id: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemAllocationProp {
    pub type_: c_uint,
    pub requested_handle_types: c_uint,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: [u8; 8],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_uint,
}

/// `cuGetProcAddress_v2` (5 arguments, CUDA >= 12.0).
pub type GetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_uint) -> CUresult;
/// `cuGetProcAddress` (4 arguments, CUDA 11.3).
pub type GetProcAddress =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;

/// How one table entry is found: its exact exported name (dlsym, direct linking), or its base name,
/// ABI version and flags (`cuGetProcAddress`).
pub struct Sym {
    pub exact: &'static str,
    pub base: &'static str,
    pub version: c_int,
    pub flags: u64,
}

macro_rules! api {
    ($( $field:ident : $exact:literal , $base:literal @ $ver:literal $(/ $flags:literal)? => fn($($t:ty),*); )*) => {
        /// The driver functions the PATTERN calls.
        pub struct Api {
            $( pub $field: unsafe extern "C" fn($($t),*) -> CUresult, )*
        }

        impl Api {
            /// Every entry and how to find it.
            pub const SYMS: &'static [Sym] = &[
                $( Sym { exact: $exact, base: $base, version: $ver, flags: 0 $(+ $flags)? }, )*
            ];

            /// Fills the table with `find` (null: an error naming the symbol).
            pub fn load(mut find: impl FnMut(&Sym) -> *mut c_void) -> Result<Api, String> {
                let mut it = Self::SYMS.iter();
                Ok(Api {
                    $( $field: {
                        let s = it.next().unwrap();
                        let p = find(s);
                        if p.is_null() {
                            return Err(format!("no function for {} ({}@{} flags {})", s.exact, s.base, s.version, s.flags));
                        }
                        // SAFETY: the driver's function of that name has this signature.
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> CUresult>(p) }
                    }, )*
                })
            }
        }
    };
}

api! {
    init: "cuInit", "cuInit" @ 12000 => fn(c_uint);
    device_get: "cuDeviceGet", "cuDeviceGet" @ 12000 => fn(*mut CUdevice, c_int);
    device_total_mem: "cuDeviceTotalMem_v2", "cuDeviceTotalMem" @ 12000 => fn(*mut usize, CUdevice);
    primary_ctx_retain: "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain" @ 12000 => fn(*mut CUcontext, CUdevice);
    ctx_set_current: "cuCtxSetCurrent", "cuCtxSetCurrent" @ 12000 => fn(CUcontext);
    stream_create: "cuStreamCreate", "cuStreamCreate" @ 12000 => fn(*mut CUstream, c_uint);
    stream_synchronize: "cuStreamSynchronize", "cuStreamSynchronize" @ 12000 => fn(CUstream);
    stream_destroy: "cuStreamDestroy_v2", "cuStreamDestroy" @ 12000 => fn(CUstream);
    device_get_default_mem_pool: "cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool" @ 12000 => fn(*mut CUmemoryPool, CUdevice);
    mem_alloc: "cuMemAlloc_v2", "cuMemAlloc" @ 3020 => fn(*mut CUdeviceptr, usize);
    mem_alloc_pitch: "cuMemAllocPitch_v2", "cuMemAllocPitch" @ 3020 => fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint);
    mem_alloc_managed: "cuMemAllocManaged", "cuMemAllocManaged" @ 6000 => fn(*mut CUdeviceptr, usize, c_uint);
    mem_free: "cuMemFree_v2", "cuMemFree" @ 3020 => fn(CUdeviceptr);
    mem_get_info: "cuMemGetInfo_v2", "cuMemGetInfo" @ 3020 => fn(*mut usize, *mut usize);
    mem_alloc_async: "cuMemAllocAsync", "cuMemAllocAsync" @ 11020 => fn(*mut CUdeviceptr, usize, CUstream);
    mem_alloc_async_ptsz: "cuMemAllocAsync_ptsz", "cuMemAllocAsync" @ 11020 / 2 => fn(*mut CUdeviceptr, usize, CUstream);
    mem_alloc_from_pool_async: "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync" @ 11020 => fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream);
    mem_alloc_from_pool_async_ptsz: "cuMemAllocFromPoolAsync_ptsz", "cuMemAllocFromPoolAsync" @ 11020 / 2 => fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream);
    mem_free_async: "cuMemFreeAsync", "cuMemFreeAsync" @ 11020 => fn(CUdeviceptr, CUstream);
    mem_free_async_ptsz: "cuMemFreeAsync_ptsz", "cuMemFreeAsync" @ 11020 / 2 => fn(CUdeviceptr, CUstream);
    mem_create: "cuMemCreate", "cuMemCreate" @ 12000 => fn(*mut u64, usize, *const CUmemAllocationProp, u64);
    mem_address_reserve: "cuMemAddressReserve", "cuMemAddressReserve" @ 12000 => fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, u64);
    mem_map: "cuMemMap", "cuMemMap" @ 12000 => fn(CUdeviceptr, usize, usize, u64, u64);
    mem_set_access: "cuMemSetAccess", "cuMemSetAccess" @ 12000 => fn(CUdeviceptr, usize, *const CUmemAccessDesc, usize);
    mem_unmap: "cuMemUnmap", "cuMemUnmap" @ 12000 => fn(CUdeviceptr, usize);
    mem_address_free: "cuMemAddressFree", "cuMemAddressFree" @ 12000 => fn(CUdeviceptr, usize);
    mem_release: "cuMemRelease", "cuMemRelease" @ 12000 => fn(u64);
}

/// A `dlopen`ed driver library.
#[derive(Clone, Copy)]
pub struct LibCuda(*mut c_void);

// SAFETY: a dlopen handle may be used from any thread.
unsafe impl Send for LibCuda {}
// SAFETY: as for Send: the handle is only passed to dlsym, which is thread-safe.
unsafe impl Sync for LibCuda {}

impl LibCuda {
    /// `dlsym(handle, name)` through the PLT (what a preloaded shim intercepts); null if absent.
    pub fn sym(&self, name: &str) -> *mut c_void {
        let c = CString::new(name).unwrap();
        // SAFETY: dlsym on a live handle.
        unsafe { libc::dlsym(self.0, c.as_ptr()) }
    }

    /// The function `name` as `T` (its function pointer type), or exit 1 if it is missing.
    pub fn func<T: Copy>(&self, name: &str) -> T {
        assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
        let p = self.sym(name);
        if p.is_null() {
            fail(&format!("dlsym({name}) gave null"));
        }
        // SAFETY: T is the driver function's pointer type (the caller's promise).
        unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) }
    }
}

/// `dlopen("libcuda.so.1")` (found through `LD_LIBRARY_PATH`), or exit 1 saying why.
pub fn open_libcuda() -> LibCuda {
    let name = c"libcuda.so.1";
    // SAFETY: dlopen of a library by name.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW) };
    if h.is_null() {
        // SAFETY: dlerror returns a message or null.
        let err = unsafe { libc::dlerror() };
        let msg = if err.is_null() {
            String::new()
        } else {
            // SAFETY: a NUL-terminated message.
            unsafe { CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned()
        };
        fail(&format!("dlopen(libcuda.so.1) failed: {msg}"));
    }
    LibCuda(h)
}

/// Prints `FAIL <msg>` and exits 1.
pub fn fail(msg: &str) -> ! {
    println!("FAIL {msg}");
    std::process::exit(1)
}

/// `--repeat N` (steps 1-4 N times) and `--threads T` (steps 1-4 on T threads at once).
#[derive(Clone, Copy, Debug)]
pub struct Opts {
    pub repeat: usize,
    pub threads: usize,
}

pub fn parse_opts(args: impl IntoIterator<Item = String>) -> Result<Opts, String> {
    let mut o = Opts {
        repeat: 1,
        threads: 1,
    };
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut num = |name: &str| -> Result<usize, String> {
            let v = it.next().ok_or(format!("{name} needs a value"))?;
            v.parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or(format!("{name}: not a positive number: {v}"))
        };
        match a.as_str() {
            "--repeat" => o.repeat = num("--repeat")?,
            "--threads" => o.threads = num("--threads")?,
            _ => {
                return Err(format!(
                    "unknown argument {a:?} (expected --repeat N, --threads T)"
                ))
            }
        }
    }
    Ok(o)
}

/// A call's result checked against what the real driver returns.
fn expect(what: &str, got: CUresult, want: CUresult) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "{what} returned {got} ({}), expected {want} ({})",
            code_name(got),
            code_name(want)
        ))
    }
}

fn ok(what: &str, got: CUresult) -> Result<(), String> {
    expect(what, got, CUDA_SUCCESS)
}

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

pub fn code_name(c: CUresult) -> &'static str {
    match c {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        400 => "CUDA_ERROR_INVALID_HANDLE",
        500 => "CUDA_ERROR_NOT_FOUND",
        _ => "?",
    }
}

/// Makes device 0's primary context current on the calling thread.
pub fn bind_device0(api: &Api) -> Result<(), String> {
    let mut dev: CUdevice = -1;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: driver calls with valid out-pointers.
    unsafe {
        ok("cuDeviceGet(0)", (api.device_get)(&mut dev, 0))?;
        ok(
            "cuDevicePrimaryCtxRetain",
            (api.primary_ctx_retain)(&mut ctx, dev),
        )?;
        ok("cuCtxSetCurrent", (api.ctx_set_current)(ctx))?;
    }
    Ok(())
}

/// Steps 1-4 of the PATTERN, once; returns the (freed) address of A.
pub fn steps_1_to_4(api: &Api) -> Result<CUdeviceptr, String> {
    let null = std::ptr::null_mut();
    // SAFETY: driver calls with valid out-pointers and the handles they returned.
    unsafe {
        // 1. Classic allocations.
        let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
        let mut pitch = 0usize;
        ok(
            "step 1: cuMemAlloc_v2(A, 1 MiB)",
            (api.mem_alloc)(&mut a, MIB),
        )?;
        ok(
            "step 1: cuMemAllocPitch_v2(B, 1000 x 100, 4)",
            (api.mem_alloc_pitch)(&mut b, &mut pitch, 1000, 100, 4),
        )?;
        check(pitch == 1024, || {
            format!("step 1: cuMemAllocPitch_v2 pitch {pitch}, expected 1024")
        })?;
        ok(
            "step 1: cuMemAllocManaged(C, 2 MiB, GLOBAL)",
            (api.mem_alloc_managed)(&mut c, 2 * MIB, CU_MEM_ATTACH_GLOBAL),
        )?;
        check(a != 0 && b != 0 && c != 0, || {
            "step 1: a null pointer came back".into()
        })?;

        // 2. Stream-ordered allocations on a created stream S.
        let mut s: CUstream = null;
        let mut pool: CUmemoryPool = null;
        ok(
            "step 2: cuStreamCreate(S)",
            (api.stream_create)(&mut s, CU_STREAM_NON_BLOCKING),
        )?;
        ok(
            "step 2: cuDeviceGetDefaultMemPool(0)",
            (api.device_get_default_mem_pool)(&mut pool, 0),
        )?;
        let (mut d, mut e, mut f, mut g) = (0u64, 0u64, 0u64, 0u64);
        ok(
            "step 2: cuMemAllocAsync(D, 3 MiB)",
            (api.mem_alloc_async)(&mut d, 3 * MIB, s),
        )?;
        ok(
            "step 2: cuMemAllocAsync_ptsz(E, 4 MiB)",
            (api.mem_alloc_async_ptsz)(&mut e, 4 * MIB, s),
        )?;
        ok(
            "step 2: cuMemAllocFromPoolAsync(F, 5 MiB)",
            (api.mem_alloc_from_pool_async)(&mut f, 5 * MIB, pool, s),
        )?;
        ok(
            "step 2: cuMemAllocFromPoolAsync_ptsz(G, 6 MiB)",
            (api.mem_alloc_from_pool_async_ptsz)(&mut g, 6 * MIB, pool, s),
        )?;
        check(d != 0 && e != 0 && f != 0 && g != 0, || {
            "step 2: a null pointer came back".into()
        })?;

        // 3. Virtual memory: physical memory on device 1, mapped into a reserved range.
        let prop = CUmemAllocationProp {
            type_: 1, // CU_MEM_ALLOCATION_TYPE_PINNED
            requested_handle_types: 0,
            location: CUmemLocation { type_: 1, id: 1 }, // CU_MEM_LOCATION_TYPE_DEVICE, device 1
            win32_handle_meta_data: null,
            alloc_flags: [0; 8],
        };
        let (mut h, mut r) = (0u64, 0u64);
        ok(
            "step 3: cuMemCreate(H, 2 MiB, device 1)",
            (api.mem_create)(&mut h, 2 * MIB, &prop, 0),
        )?;
        ok(
            "step 3: cuMemAddressReserve(R, 4 MiB)",
            (api.mem_address_reserve)(&mut r, 4 * MIB, 0, 0, 0),
        )?;
        check(r != 0 && r % (2 * MIB as u64) == 0, || {
            format!("step 3: reserved range {r:#x} not 2 MiB aligned")
        })?;
        ok(
            "step 3: cuMemMap(R, 2 MiB, H)",
            (api.mem_map)(r, 2 * MIB, 0, h, 0),
        )?;
        let access = CUmemAccessDesc {
            location: CUmemLocation { type_: 1, id: 1 },
            flags: 3, // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        };
        ok(
            "step 3: cuMemSetAccess(R, 2 MiB)",
            (api.mem_set_access)(r, 2 * MIB, &access, 1),
        )?;
        let (mut free, mut total) = (0usize, 0usize);
        ok(
            "step 3: cuMemGetInfo_v2",
            (api.mem_get_info)(&mut free, &mut total),
        )?;
        check(total > 0 && free <= total, || {
            format!("step 3: cuMemGetInfo_v2 free {free} total {total}")
        })?;

        // 4. Frees.
        ok("step 4: cuMemFree_v2(A)", (api.mem_free)(a))?;
        ok("step 4: cuMemFree_v2(B)", (api.mem_free)(b))?;
        ok("step 4: cuMemFree_v2(C)", (api.mem_free)(c))?;
        ok("step 4: cuMemFreeAsync(D)", (api.mem_free_async)(d, s))?;
        ok("step 4: cuMemFreeAsync(F)", (api.mem_free_async)(f, s))?;
        ok(
            "step 4: cuMemFreeAsync_ptsz(E)",
            (api.mem_free_async_ptsz)(e, s),
        )?;
        ok(
            "step 4: cuMemFreeAsync_ptsz(G)",
            (api.mem_free_async_ptsz)(g, s),
        )?;
        ok(
            "step 4: cuStreamSynchronize(S)",
            (api.stream_synchronize)(s),
        )?;
        ok("step 4: cuMemUnmap(R)", (api.mem_unmap)(r, 2 * MIB))?;
        ok(
            "step 4: cuMemAddressFree(R)",
            (api.mem_address_free)(r, 4 * MIB),
        )?;
        ok("step 4: cuMemRelease(H)", (api.mem_release)(h))?;
        ok("step 4: cuStreamDestroy_v2(S)", (api.stream_destroy)(s))?;
        Ok(a)
    }
}

/// Steps 5 (errors) and 6 (the 7 MiB leak). `a` is a freed address of A.
pub fn steps_5_and_6(api: &Api, a: CUdeviceptr) -> Result<(), String> {
    // SAFETY: driver calls with valid out-pointers.
    unsafe {
        let mut total = 0usize;
        ok(
            "step 5: cuDeviceTotalMem_v2(0)",
            (api.device_total_mem)(&mut total, 0),
        )?;
        let mut x = 0u64;
        expect(
            "step 5: cuMemAlloc_v2(device size + 1 MiB)",
            (api.mem_alloc)(&mut x, total + MIB),
            CUDA_ERROR_OUT_OF_MEMORY,
        )?;
        expect(
            "step 5: cuMemFree_v2(0xdead0000)",
            (api.mem_free)(0xdead_0000),
            CUDA_ERROR_INVALID_VALUE,
        )?;
        expect(
            "step 5: cuMemFree_v2(A) again",
            (api.mem_free)(a),
            CUDA_ERROR_INVALID_VALUE,
        )?;
        let mut l = 0u64;
        ok(
            "step 6: cuMemAlloc_v2(L, 7 MiB)",
            (api.mem_alloc)(&mut l, 7 * MIB),
        )?;
        check(l != 0, || "step 6: a null pointer came back".into())?;
    }
    Ok(())
}

/// The whole PATTERN: `cuInit`, steps 1-4 `repeat` times on each of `threads` threads (each with device
/// 0's primary context current), then steps 5-6 once on the main thread.
pub fn run_pattern(api: &Api, opts: Opts) -> Result<(), String> {
    // SAFETY: a driver call.
    ok("cuInit(0)", unsafe { (api.init)(0) })?;
    bind_device0(api)?;
    let worker = || -> Result<CUdeviceptr, String> {
        bind_device0(api)?;
        let mut a = 0;
        for _ in 0..opts.repeat {
            a = steps_1_to_4(api)?;
        }
        Ok(a)
    };
    let a = if opts.threads == 1 {
        worker()?
    } else {
        let results: Vec<Result<CUdeviceptr, String>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..opts.threads).map(|_| s.spawn(worker)).collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("a pattern thread panicked".into()))
                })
                .collect()
        });
        let mut first = None;
        for (i, r) in results.into_iter().enumerate() {
            let a = r.map_err(|e| format!("thread {i}: {e}"))?;
            first.get_or_insert(a);
        }
        first.unwrap_or(0)
    };
    steps_5_and_6(api, a)
}

/// Runs the PATTERN with a filled table and exits: 0 after `PASS <door>`, 1 after `FAIL <why>`.
pub fn main_with(door: &str, api: Result<Api, String>) -> ! {
    let opts = parse_opts(std::env::args().skip(1)).unwrap_or_else(|e| fail(&e));
    let api = api.unwrap_or_else(|e| fail(&e));
    match run_pattern(&api, opts) {
        Ok(()) => {
            println!(
                "PASS {door} repeat={} threads={}",
                opts.repeat, opts.threads
            );
            std::process::exit(0)
        }
        Err(e) => fail(&format!("{door}: {e}")),
    }
}

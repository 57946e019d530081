//! The simulated driver's API semantics, checked in this process (`dlopen` of `libfakecuda.so`): one test,
//! in order, since `cuInit` is process-wide. Also the `cuGetProcAddress` table against `dlsym` and the
//! library's exported symbols.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::process::Command;

use vramtrace_e2e::*;

type R = c_uint;

struct Lib(*mut c_void);

impl Lib {
    fn open() -> Lib {
        let path = CString::new(fakecuda_lib().to_str().unwrap()).unwrap();
        // SAFETY: loading the fake driver.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen libfakecuda.so");
        Lib(h)
    }

    fn addr(&self, name: &str) -> *mut c_void {
        let c = CString::new(name).unwrap();
        // SAFETY: dlsym on our handle.
        unsafe { libc::dlsym(self.0, c.as_ptr()) }
    }

    /// The exported function `name` as `T` (a function pointer type).
    fn f<T: Copy>(&self, name: &str) -> T {
        let p = self.addr(name);
        assert!(!p.is_null(), "{name} not exported");
        // SAFETY: T is that function's pointer type.
        unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) }
    }
}

type GpaV2 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_uint) -> R;
type Gpa = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> R;

fn gpa(lib: &Lib, name: &str, version: c_int, flags: u64) -> (R, *mut c_void, c_uint) {
    let f: GpaV2 = lib.f("cuGetProcAddress_v2");
    let c = CString::new(name).unwrap();
    let mut p = std::ptr::dangling_mut::<c_void>();
    let mut st = 77;
    // SAFETY: valid arguments.
    let rc = unsafe { f(c.as_ptr(), &mut p, version, flags, &mut st) };
    (rc, p, st)
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Prop {
    type_: c_uint,
    handle_types: c_uint,
    loc_type: c_uint,
    loc_id: c_int,
    win32: *mut c_void,
    flags: [u8; 8],
}

fn prop(dev: c_int) -> Prop {
    Prop {
        type_: 1,
        handle_types: 0,
        loc_type: 1,
        loc_id: dev,
        win32: std::ptr::null_mut(),
        flags: [0; 8],
    }
}

fn proc_address_table(lib: &Lib) {
    // Versioned variants.
    let cases: &[(&str, c_int, u64, &str)] = &[
        ("cuMemAlloc", 3020, 0, "cuMemAlloc_v2"),
        ("cuMemAlloc", 3010, 0, "cuMemAlloc"),
        ("cuMemAlloc", 12080, 0, "cuMemAlloc_v2"),
        ("cuMemFree", 3020, 0, "cuMemFree_v2"),
        ("cuMemFree", 2000, 0, "cuMemFree"),
        ("cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2"),
        ("cuMemGetInfo", 3000, 0, "cuMemGetInfo"),
        ("cuMemAllocPitch", 3020, 0, "cuMemAllocPitch_v2"),
        ("cuMemAllocPitch", 2000, 0, "cuMemAllocPitch"),
        ("cuDeviceTotalMem", 3020, 0, "cuDeviceTotalMem_v2"),
        ("cuDeviceTotalMem", 2000, 0, "cuDeviceTotalMem"),
        ("cuMemAllocManaged", 6000, 0, "cuMemAllocManaged"),
        ("cuMemAllocAsync", 11020, 0, "cuMemAllocAsync"),
        ("cuMemAllocAsync", 11020, 2, "cuMemAllocAsync_ptsz"),
        ("cuMemAllocAsync", 12000, 1, "cuMemAllocAsync"),
        ("cuMemFreeAsync", 11020, 2, "cuMemFreeAsync_ptsz"),
        (
            "cuMemAllocFromPoolAsync",
            11020,
            2,
            "cuMemAllocFromPoolAsync_ptsz",
        ),
        (
            "cuMemAllocFromPoolAsync",
            12000,
            0,
            "cuMemAllocFromPoolAsync",
        ),
        ("cuMemCreate", 10020, 0, "cuMemCreate"),
        (
            "cuMemRetainAllocationHandle",
            12000,
            0,
            "cuMemRetainAllocationHandle",
        ),
        ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
        ("cuGetProcAddress", 11030, 0, "cuGetProcAddress"),
        ("cuGetProcAddress", 11090, 0, "cuGetProcAddress"),
        ("cuCtxCreate", 3020, 0, "cuCtxCreate_v2"),
        ("cuCtxCreate", 12000, 0, "cuCtxCreate_v3"),
        ("cuCtxCreate", 12080, 0, "cuCtxCreate_v4"),
        (
            "cuDevicePrimaryCtxRelease",
            12000,
            0,
            "cuDevicePrimaryCtxRelease_v2",
        ),
        ("cuStreamSynchronize", 12000, 2, "cuStreamSynchronize_ptsz"),
        ("cuMemcpyHtoDAsync", 12000, 2, "cuMemcpyHtoDAsync_v2_ptsz"),
        ("cuInit", 12000, 2, "cuInit"),
    ];
    for &(base, ver, flags, exact) in cases {
        let (rc, p, st) = gpa(lib, base, ver, flags);
        assert_eq!((rc, st), (0, 0), "{base}@{ver} flags {flags}");
        assert_eq!(
            p,
            lib.addr(exact),
            "{base}@{ver} flags {flags} should be {exact}"
        );
    }
    // Not found / version not sufficient: null, CUDA_ERROR_NOT_FOUND.
    for &(base, ver, status) in &[
        ("cuNoSuchFunction", 12000, 1),
        ("cuMemAlloc_v2", 12000, 1),
        ("cuMemAllocAsync", 11010, 2),
        ("cuMemCreate", 10010, 2),
        ("cuMemAllocManaged", 5050, 2),
        ("cuGetProcAddress", 11020, 2),
    ] {
        assert_eq!(
            gpa(lib, base, ver, 0),
            (500, std::ptr::null_mut(), status),
            "{base}@{ver}"
        );
    }
    // The 4-argument function and a null status pointer.
    let f4: Gpa = lib.f("cuGetProcAddress");
    let f5: GpaV2 = lib.f("cuGetProcAddress_v2");
    let name = c"cuMemFreeAsync";
    let (mut p4, mut p5) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid arguments.
    unsafe {
        assert_eq!(f4(name.as_ptr(), &mut p4, 11020, 2), 0);
        assert_eq!(
            f5(name.as_ptr(), &mut p5, 11020, 2, std::ptr::null_mut()),
            0
        );
        assert_eq!(
            f5(std::ptr::null(), &mut p5, 11020, 2, std::ptr::null_mut()),
            1
        );
    }
    assert_eq!(p4, lib.addr("cuMemFreeAsync_ptsz"));
    assert_eq!(p5, p4);

    // Every exported function is what some lookup answers (nm lists the exports).
    let Ok(out) = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(fakecuda_lib())
        .output()
    else {
        eprintln!("nm not available: skipping the export completeness check");
        return;
    };
    let exports: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .filter(|s| s.starts_with("cu"))
        .collect();
    assert!(exports.len() > 100, "exports: {exports:?}");
    let versions = [
        2000, 2020, 3000, 3010, 3020, 4000, 4010, 5050, 6000, 7000, 8000, 9020, 10000, 10020,
        11000, 11010, 11020, 11030, 11040, 12000, 12010, 12020, 12050, 12080,
    ];
    for s in &exports {
        let mut base = s.trim_end_matches("_ptsz");
        for v in ["_v2", "_v3", "_v4"] {
            base = base.trim_end_matches(v);
        }
        let want = lib.addr(s);
        let hit = versions
            .iter()
            .any(|&v| [0, 2].iter().any(|&f| gpa(lib, base, v, f).1 == want));
        assert!(
            hit,
            "no cuGetProcAddress({base}, ...) answers the exported {s}"
        );
    }
}

#[test]
fn driver_api_semantics() {
    let lib = Lib::open();
    let null = std::ptr::null_mut::<c_void>();
    type Alloc = unsafe extern "C" fn(*mut u64, usize) -> R;
    type AllocAsync = unsafe extern "C" fn(*mut u64, usize, *mut c_void) -> R;
    type FromPool = unsafe extern "C" fn(*mut u64, usize, *mut c_void, *mut c_void) -> R;
    type Free = unsafe extern "C" fn(u64) -> R;
    type FreeAsync = unsafe extern "C" fn(u64, *mut c_void) -> R;
    type Info = unsafe extern "C" fn(*mut usize, *mut usize) -> R;
    type OutPtr = unsafe extern "C" fn(*mut *mut c_void) -> R;
    type OutPtrInt = unsafe extern "C" fn(*mut *mut c_void, c_int) -> R;
    type OutInt = unsafe extern "C" fn(*mut c_int) -> R;
    type InPtr = unsafe extern "C" fn(*mut c_void) -> R;
    let alloc: Alloc = lib.f("cuMemAlloc_v2");
    let alloc_async: AllocAsync = lib.f("cuMemAllocAsync");
    let from_pool: FromPool = lib.f("cuMemAllocFromPoolAsync");
    let free: Free = lib.f("cuMemFree_v2");
    let free_async: FreeAsync = lib.f("cuMemFreeAsync");
    let info: Info = lib.f("cuMemGetInfo_v2");
    let get_current: OutPtr = lib.f("cuCtxGetCurrent");
    let ctx_get_device: OutInt = lib.f("cuCtxGetDevice");
    let retain: OutPtrInt = lib.f("cuDevicePrimaryCtxRetain");
    let set_current: InPtr = lib.f("cuCtxSetCurrent");
    let push: InPtr = lib.f("cuCtxPushCurrent_v2");
    let pop: OutPtr = lib.f("cuCtxPopCurrent_v2");
    let device_get: unsafe extern "C" fn(*mut c_int, c_int) -> R = lib.f("cuDeviceGet");
    let attr: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> R = lib.f("cuDeviceGetAttribute");
    let create: unsafe extern "C" fn(*mut u64, usize, *const Prop, u64) -> R = lib.f("cuMemCreate");
    let release: unsafe extern "C" fn(u64) -> R = lib.f("cuMemRelease");
    let reserve: unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> R =
        lib.f("cuMemAddressReserve");
    let addr_free: unsafe extern "C" fn(u64, usize) -> R = lib.f("cuMemAddressFree");
    let map: unsafe extern "C" fn(u64, usize, usize, u64, u64) -> R = lib.f("cuMemMap");
    let unmap: unsafe extern "C" fn(u64, usize) -> R = lib.f("cuMemUnmap");
    let retain_handle: unsafe extern "C" fn(*mut u64, *mut c_void) -> R =
        lib.f("cuMemRetainAllocationHandle");
    let granularity: unsafe extern "C" fn(*mut usize, *const Prop, c_uint) -> R =
        lib.f("cuMemGetAllocationGranularity");
    let htod: unsafe extern "C" fn(u64, *const c_void, usize) -> R = lib.f("cuMemcpyHtoD_v2");
    let dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> R = lib.f("cuMemcpyDtoH_v2");
    let dtod_async: unsafe extern "C" fn(u64, u64, usize, *mut c_void) -> R =
        lib.f("cuMemcpyDtoDAsync_v2");
    let memset8: unsafe extern "C" fn(u64, u8, usize, *mut c_void) -> R = lib.f("cuMemsetD8Async");
    let managed: unsafe extern "C" fn(*mut u64, usize, c_uint) -> R = lib.f("cuMemAllocManaged");
    let range: unsafe extern "C" fn(*mut u64, *mut usize, u64) -> R =
        lib.f("cuMemGetAddressRange_v2");
    let stream_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> R =
        lib.f("cuStreamCreate");
    let stream_destroy: InPtr = lib.f("cuStreamDestroy_v2");
    let pool_create: unsafe extern "C" fn(*mut *mut c_void, *const [u8; 88]) -> R =
        lib.f("cuMemPoolCreate");
    let pool_destroy: InPtr = lib.f("cuMemPoolDestroy");
    let pool_attr: unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> R =
        lib.f("cuMemPoolGetAttribute");
    let default_pool: OutPtrInt = lib.f("cuDeviceGetDefaultMemPool");
    let export_table: unsafe extern "C" fn(*mut *const c_void, *const c_void) -> R =
        lib.f("cuGetExportTable");
    let error_name: unsafe extern "C" fn(R, *mut *const c_char) -> R = lib.f("cuGetErrorName");
    let version: OutInt = lib.f("cuDriverGetVersion");
    let init: unsafe extern "C" fn(c_uint) -> R = lib.f("cuInit");

    // SAFETY: driver calls with valid pointers, as the API says.
    unsafe {
        // Before cuInit.
        let (mut p, mut n) = (0u64, 0 as c_int);
        let mut ctx = null;
        assert_eq!(alloc(&mut p, 1024), 3, "cuMemAlloc_v2 before cuInit");
        assert_eq!(get_current(&mut ctx), 3);
        assert_eq!(device_get(&mut n, 0), 3);
        let mut t: *const c_void = 7 as *const c_void;
        assert_eq!(export_table(&mut t, null), 801, "cuGetExportTable");
        assert_eq!(t, 7 as *const c_void, "cuGetExportTable touches nothing");
        assert_eq!(version(&mut n), 0);
        assert_eq!(n, 12080);
        let mut s: *const c_char = std::ptr::null();
        assert_eq!(error_name(2, &mut s), 0);
        assert_eq!(
            CStr::from_ptr(s).to_str().unwrap(),
            "CUDA_ERROR_OUT_OF_MEMORY"
        );
        assert_eq!(error_name(12345, &mut s), 1);
        proc_address_table(&lib);

        assert_eq!(init(1), 1, "cuInit flags must be 0");
        assert_eq!(init(0), 0);
        // No current context.
        assert_eq!(get_current(&mut ctx), 0);
        assert!(ctx.is_null());
        assert_eq!(alloc(&mut p, 1024), 201, "cuMemAlloc_v2 without a context");
        assert_eq!(alloc_async(&mut p, 1024, null), 201);
        assert_eq!(ctx_get_device(&mut n), 201);
        let (mut fr, mut tot) = (0usize, 0usize);
        assert_eq!(info(&mut fr, &mut tot), 201);
        assert_eq!(free(0), 0, "cuMemFree_v2(0)");
        // Devices.
        assert_eq!(device_get(&mut n, 2), 101);
        assert_eq!(device_get(std::ptr::null_mut(), 0), 1);
        for (a, want) in [(115, 1), (75, 9), (76, 0), (102, 1)] {
            assert_eq!(attr(&mut n, a, 0), 0);
            assert_eq!(n, want, "attribute {a}");
        }
        assert_eq!(attr(&mut n, 0, 0), 1);
        // Context.
        let mut c0 = null;
        let mut c1 = null;
        assert_eq!(retain(&mut c0, 0), 0);
        assert_eq!(retain(&mut c1, 1), 0);
        assert_ne!(c0, c1);
        assert_eq!(set_current(c0), 0);
        assert_eq!(ctx_get_device(&mut n), 0);
        assert_eq!(n, 0);
        assert_eq!(set_current(5 as *mut c_void), 201, "unknown context");
        assert_eq!(alloc(std::ptr::null_mut(), 1024), 1, "null out-pointer");
        assert_eq!(alloc(&mut p, 0), 1, "zero bytes");
        assert_eq!(info(std::ptr::null_mut(), &mut tot), 1);

        // Reuse of a freed address; OOM allocates nothing; bad and double frees.
        assert_eq!(info(&mut fr, &mut tot), 0);
        assert_eq!(tot as u64, DEFAULT_DEVICE_BYTES);
        let free0 = fr;
        let mut a = 0u64;
        assert_eq!(alloc(&mut a, 3 << 20), 0);
        assert_eq!(a % 512, 0);
        assert_eq!(free(a), 0);
        let mut a2 = 0u64;
        assert_eq!(alloc(&mut a2, 3 << 20), 0);
        assert_eq!(a2, a, "freed address reused");
        assert_eq!(free(a2), 0);
        assert_eq!(free(a2), 1, "double free");
        assert_eq!(free(0xdead_0000), 1, "bogus free");
        assert_eq!(alloc(&mut p, (DEFAULT_DEVICE_BYTES + 1) as usize), 2);
        assert_eq!(info(&mut fr, &mut tot), 0);
        assert_eq!(fr, free0, "OOM allocates nothing");

        // cuMemCreate: validation, device from the location, release rules.
        let mut g = 0usize;
        assert_eq!(granularity(&mut g, &prop(0), 0), 0);
        assert_eq!(g, 2 << 20);
        let mut h = 0u64;
        assert_eq!(
            create(&mut h, 1 << 20, &prop(1), 0),
            1,
            "not a multiple of the granularity"
        );
        assert_eq!(create(&mut h, 2 << 20, &prop(7), 0), 101, "no such device");
        assert_eq!(
            create(
                &mut h,
                2 << 20,
                &Prop {
                    type_: 0,
                    ..prop(1)
                },
                0
            ),
            1,
            "invalid type"
        );
        assert_eq!(create(&mut h, 2 << 20, std::ptr::null(), 0), 1);
        assert_eq!(release(0x1234), 1, "unknown handle");
        assert_eq!(create(&mut h, 4 << 20, &prop(1), 0), 0);
        assert_eq!(info(&mut fr, &mut tot), 0);
        assert_eq!(fr, free0, "device 0 unaffected by memory on device 1");
        let dev1_free = |expect: u64| {
            let (mut f1, mut t1) = (0usize, 0usize);
            assert_eq!(push(c1), 0);
            assert_eq!(info(&mut f1, &mut t1), 0);
            let mut top = null;
            assert_eq!(pop(&mut top), 0);
            assert_eq!(top, c1);
            assert_eq!(f1 as u64, DEFAULT_DEVICE_BYTES - expect, "device 1 in use");
        };
        dev1_free(4 << 20);
        let mut r = 0u64;
        assert_eq!(
            reserve(&mut r, 3 << 20, 0, 0, 0),
            1,
            "reservation size granularity"
        );
        assert_eq!(reserve(&mut r, 8 << 20, 0, 0, 0), 0);
        assert_eq!(r % (2 << 20), 0);
        dev1_free(4 << 20);
        assert_eq!(
            map(r + (6 << 20), 4 << 20, 0, h, 0),
            1,
            "past the reservation"
        );
        assert_eq!(map(r, 4 << 20, 2 << 20, h, 0), 1, "past the handle");
        assert_eq!(map(r, 4 << 20, 0, h, 0), 0);
        assert_eq!(map(r + (2 << 20), 2 << 20, 0, h, 0), 1, "over a mapping");
        let mut h2 = 0u64;
        assert_eq!(retain_handle(&mut h2, (r + 4096) as *mut c_void), 0);
        assert_eq!(h2, h);
        assert_eq!(release(h), 0);
        assert_eq!(release(h), 0, "the retained reference");
        assert_eq!(release(h), 1, "no reference left");
        dev1_free(4 << 20); // still mapped
        assert_eq!(addr_free(r, 8 << 20), 1, "mappings remain");
        assert_eq!(unmap(r, 2 << 20), 1, "cuts a mapping");
        assert_eq!(unmap(r, 4 << 20), 0);
        dev1_free(0);
        assert_eq!(unmap(r, 4 << 20), 1, "nothing mapped");
        assert_eq!(addr_free(r, 4 << 20), 1, "size differs");
        assert_eq!(addr_free(r, 8 << 20), 0);

        // Copies round-trip through the shadow; managed memory is host memory.
        let mut d = 0u64;
        assert_eq!(alloc(&mut d, 4096), 0);
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        assert_eq!(htod(d, data.as_ptr().cast(), 4096), 0);
        let mut back = vec![0u8; 4096];
        assert_eq!(dtoh(back.as_mut_ptr().cast(), d, 4096), 0);
        assert_eq!(back, data);
        assert_eq!(memset8(d + 100, 0xab, 10, null), 0);
        assert_eq!(dtoh(back.as_mut_ptr().cast(), d, 4096), 0);
        assert_eq!(&back[100..110], &[0xab; 10]);
        assert_eq!(back[110], data[110]);
        assert_eq!(
            htod(d + 4000, data.as_ptr().cast(), 200),
            1,
            "past the allocation"
        );
        let mut m = 0u64;
        assert_eq!(managed(&mut m, 1 << 20, 1), 0);
        *(m as *mut u8).add(5) = 42;
        assert_eq!(dtod_async(d, m, 16, null), 0);
        assert_eq!(dtoh(back.as_mut_ptr().cast(), d, 16), 0);
        assert_eq!(back[5], 42);
        let (mut base, mut size) = (0u64, 0usize);
        assert_eq!(range(&mut base, &mut size, d + 17), 0);
        assert_eq!((base, size), (d, 4096));
        assert_eq!(free(m), 0);
        assert_eq!(free(d), 0);

        // Streams and pools.
        let mut st = null;
        assert_eq!(stream_create(&mut st, 1), 0);
        let mut pool = null;
        let mut props = [0u8; 88];
        props[0] = 1; // allocType PINNED
        props[8] = 1; // location.type DEVICE, id 0
        assert_eq!(pool_create(&mut pool, &props), 0);
        let mut x = 0u64;
        assert_eq!(from_pool(&mut x, 5 << 20, pool, st), 0);
        let mut used = 0u64;
        assert_eq!(pool_attr(pool, 7, (&mut used as *mut u64).cast()), 0);
        assert_eq!(used, 5 << 20, "USED_MEM_CURRENT");
        assert_eq!(free_async(x, st), 0);
        assert_eq!(pool_attr(pool, 7, (&mut used as *mut u64).cast()), 0);
        assert_eq!(used, 0);
        assert_eq!(pool_destroy(pool), 0);
        assert_eq!(pool_destroy(pool), 1);
        let mut dp = null;
        assert_eq!(default_pool(&mut dp, 0), 0);
        assert_eq!(pool_destroy(dp), 1, "the default pool stays");
        assert_eq!(alloc_async(&mut x, 0, st), 0, "zero bytes: a null pointer");
        assert_eq!(x, 0);
        assert_eq!(stream_destroy(st), 0);
        assert_eq!(stream_destroy(st), 400);
        assert_eq!(alloc_async(&mut x, 1024, st), 400, "destroyed stream");
        assert_eq!(info(&mut fr, &mut tot), 0);
        assert_eq!(fr, free0, "everything given back");
    }
}

//! Door 2, the CUDA runtime's way: `dlopen("libcuda.so.1")`, `dlsym(h, "cuGetProcAddress_v2")`, the
//! self-queries `cuGetProcAddress_v2("cuGetProcAddress")` at 12000 (5 arguments) and 11030 (4 arguments),
//! then every lookup through the pointers they returned, by base name and ABI version; then the PATTERN.
//! Also checks the versioned lookups: legacy `cuMemAlloc` below 3020, `_ptsz` with flags 2, unknown names
//! and too-low versions answered with `CUDA_ERROR_NOT_FOUND` and the right query result.

use std::ffi::{c_int, c_uint, c_void, CString};

use vramtrace_test_programs::*;

/// One lookup: (result code, pointer, symbol status).
type Answer = (CUresult, *mut c_void, c_uint);

fn query_v2(gpa: GetProcAddressV2, name: &str, version: c_int, flags: u64) -> Answer {
    let c = CString::new(name).unwrap();
    let mut p = std::ptr::null_mut();
    let mut st: c_uint = 77;
    // SAFETY: cuGetProcAddress_v2 with valid out-pointers.
    let rc = unsafe { gpa(c.as_ptr(), &mut p, version, flags, &mut st) };
    (rc, p, st)
}

fn query_v1(
    gpa: GetProcAddress,
    name: &str,
    version: c_int,
    flags: u64,
) -> (CUresult, *mut c_void) {
    let c = CString::new(name).unwrap();
    let mut p = std::ptr::null_mut();
    // SAFETY: cuGetProcAddress with valid out-pointers.
    let rc = unsafe { gpa(c.as_ptr(), &mut p, version, flags) };
    (rc, p)
}

fn found(what: &str, a: Answer) -> Result<*mut c_void, String> {
    match a {
        (0, p, 0) if !p.is_null() => Ok(p),
        (rc, p, st) => Err(format!(
            "{what}: rc {rc} ({}), pointer {p:?}, status {st}; expected a function",
            code_name(rc)
        )),
    }
}

fn not_found(what: &str, a: Answer, status: c_uint) -> Result<(), String> {
    match a {
        (CUDA_ERROR_NOT_FOUND, p, st) if p.is_null() && st == status => Ok(()),
        (rc, p, st) => Err(format!(
            "{what}: rc {rc}, pointer {p:?}, status {st}; expected CUDA_ERROR_NOT_FOUND, null, status {status}"
        )),
    }
}

fn lookups() -> Result<Api, String> {
    let h = open_libcuda();
    let first = h.sym("cuGetProcAddress_v2");
    if first.is_null() {
        return Err("dlsym(cuGetProcAddress_v2) gave null".into());
    }
    // SAFETY: the driver's cuGetProcAddress_v2.
    let first: GetProcAddressV2 =
        unsafe { std::mem::transmute::<*mut c_void, GetProcAddressV2>(first) };

    // The self-queries, as the runtime does them.
    let p12 = found(
        "cuGetProcAddress_v2(\"cuGetProcAddress\", 12000)",
        query_v2(first, "cuGetProcAddress", 12000, 0),
    )?;
    let p11 = found(
        "cuGetProcAddress_v2(\"cuGetProcAddress\", 11030)",
        query_v2(first, "cuGetProcAddress", 11030, 0),
    )?;
    if p12 == p11 {
        return Err("cuGetProcAddress at 12000 and 11030 gave the same function (expected _v2 and the 4-argument one)".into());
    }
    // SAFETY: the functions the driver returned for those versions.
    let gpa: GetProcAddressV2 =
        unsafe { std::mem::transmute::<*mut c_void, GetProcAddressV2>(p12) };
    // SAFETY: as above: the function the driver returned for version 11.
    let gpa4: GetProcAddress = unsafe { std::mem::transmute::<*mut c_void, GetProcAddress>(p11) };

    // Versioned lookups.
    let legacy = found("cuMemAlloc@2000", query_v2(gpa, "cuMemAlloc", 2000, 0))?;
    let v2 = found("cuMemAlloc@3020", query_v2(gpa, "cuMemAlloc", 3020, 0))?;
    if legacy == v2 {
        return Err("cuMemAlloc@2000 and cuMemAlloc@3020 gave the same function (expected the legacy one below 3020)".into());
    }
    let plain = found(
        "cuMemAllocAsync@11020",
        query_v2(gpa, "cuMemAllocAsync", 11020, 0),
    )?;
    let ptsz = found(
        "cuMemAllocAsync@11020 flags 2",
        query_v2(
            gpa,
            "cuMemAllocAsync",
            11020,
            CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
        ),
    )?;
    if plain == ptsz {
        return Err("cuMemAllocAsync with flags 0 and 2 gave the same function (expected the _ptsz one with 2)".into());
    }
    not_found(
        "cuNoSuchFunction@12000",
        query_v2(gpa, "cuNoSuchFunction", 12000, 0),
        1,
    )?;
    not_found(
        "cuMemAllocAsync@11010",
        query_v2(gpa, "cuMemAllocAsync", 11010, 0),
        2,
    )?;
    not_found(
        "cuMemCreate@10010",
        query_v2(gpa, "cuMemCreate", 10010, 0),
        2,
    )?;

    // The 4-argument function answers the same.
    for (name, ver, flags, want) in [
        ("cuMemAlloc", 3020, 0, v2),
        ("cuMemAllocAsync", 11020, 2, ptsz),
    ] {
        match query_v1(gpa4, name, ver, flags) {
            (0, p) if p == want => {}
            (rc, p) => return Err(format!("4-argument cuGetProcAddress({name}, {ver}, {flags}): rc {rc}, {p:?}; expected {want:?}")),
        }
    }
    let (rc, p) = query_v1(gpa4, "cuNoSuchFunction", 12000, 0);
    if rc != CUDA_ERROR_NOT_FOUND || !p.is_null() {
        return Err(format!(
            "4-argument cuGetProcAddress(cuNoSuchFunction): rc {rc}, {p:?}"
        ));
    }

    // Everything the PATTERN calls, through the self-queried cuGetProcAddress_v2.
    Api::load(|s| query_v2(gpa, s.base, s.version, s.flags).1)
}

fn main() {
    main_with("door_runtime", lookups())
}

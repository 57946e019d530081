//! What each intercepted call does around the real one: find the real function, call it with the caller's
//! arguments unchanged, record what happened, return the driver's code.
//!
//! Events are stamped just before the ring takes them (format's `ring.rs`, `Ring::try_event`).
//! Allocations are published when the driver returns, and releases before the driver is called (a release the
//! driver then refuses is taken back by a second event, flagged `UNDONE`), so that ordering events by time
//! never puts the reuse of an address before the free that released it.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use vramtrace_format::{flags, Api, NO_DEVICE};

use crate::cap::{self, Decision, Kind};
use crate::cuda::*;
use crate::driver::{self, Sym};
use crate::pools;
use crate::record;
use crate::stacks;
use crate::tls;

struct Busy;

impl Busy {
    #[inline]
    fn enter() -> Option<Busy> {
        // Set while this thread is inside a hook: a tracked call the driver makes from inside another (or the
        // shim's own threads) goes straight through, neither recorded twice nor counted twice.
        let busy = (!tls::state().busy.replace(true)).then_some(Busy)?;
        // The process's first tracked call connects (and says hello) before anything is stamped: no event of a
        // process is older than its hello (the collector's promise for processes still to come relies on it).
        record::start_now();
        Some(busy)
    }
}

impl Drop for Busy {
    #[inline]
    fn drop(&mut self) {
        tls::state().busy.set(false);
    }
}

/// The real function for `sym` as type `$t`, or the not-initialised code if there is no driver to call.
macro_rules! real {
    ($sym:expr, $t:ty) => {{
        let p = driver::real($sym);
        if p.is_null() {
            return CUDA_ERROR_NOT_INITIALIZED;
        }
        std::mem::transmute::<*mut c_void, $t>(p)
    }};
}

fn ptsz(sym: Sym) -> u8 {
    match sym {
        Sym::MemAllocAsyncPtsz | Sym::MemAllocFromPoolAsyncPtsz | Sym::MemFreeAsyncPtsz => {
            flags::PTSZ
        }
        _ => 0,
    }
}

#[inline(always)]
#[link_section = ".vramtrace.hot"]
unsafe fn returned(out: *const u64, r: CUresult) -> u64 {
    if r == CUDA_SUCCESS && !out.is_null() {
        *out
    } else {
        0
    }
}

/// A tracked lookup answered with a function the shim cannot wrap was said on stderr (once per process).
static BYPASS_SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The cap said no: record the refused request (with its call site, whatever its size), hand the collector the
/// out-of-memory record, and give the caller the driver's own out-of-memory code. The driver is never called.
#[cold]
fn refuse(api: Api, flag: u8, dev: u32, size: u64, aux: u64) -> CUresult {
    let r = CUDA_ERROR_OUT_OF_MEMORY;
    let flag = flag | flags::CAP_REFUSED;
    record::push(api, flag, dev, r, 0, size, aux, stacks::site(size, true));
    out_of_memory(api, flag, dev, size, r);
    r
}

/// Where an allocation's memory lives.
#[derive(Clone, Copy)]
enum On {
    /// The device of the calling thread's current context.
    Context,
    /// This device (`NO_DEVICE`: host memory).
    Device(u32),
}

/// An allocation of `size` bytes on the device `on` says: the cap's admission, the driver call, then the event.
/// Over the cap the driver is never called and the caller gets the driver's own out-of-memory code, so
/// frameworks react as to a real OOM (PyTorch frees its cache, retries, raises `torch.OutOfMemoryError`).
/// The context's device is asked once: before the call under a cap (admission needs it), else after it and only
/// if something records the event; after a successful call the context exists, and a process that sees one
/// device need not ask at all (`driver::context_device`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
#[link_section = ".vramtrace.hot"]
unsafe fn track_alloc(
    api: Api,
    flag: u8,
    on: On,
    size: u64,
    aux: u64,
    kind: Kind,
    out: *const u64,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let cap = cap::get();
    let early = cap.map(|_| match on {
        On::Context => driver::current_device(),
        On::Device(d) => d,
    });
    let decision = match (cap, early) {
        (Some(c), Some(d)) => c.admit(d, size),
        _ => Decision::Free,
    };
    let Some(flag) = admitted_flag(decision, flag) else {
        return refuse(api, flag, early.unwrap_or(NO_DEVICE), size, aux);
    };
    let r = call();
    let dev = match (early, on) {
        (Some(d), _) | (None, On::Device(d)) => d,
        // Nobody to tell: no driver call made for it.
        (None, On::Context) if record::live().is_none() => NO_DEVICE,
        (None, On::Context) if r == CUDA_SUCCESS => driver::context_device(),
        (None, On::Context) => driver::current_device(),
    };
    let id = returned(out, r);
    if let (Some(c), Decision::Counted | Decision::Exceeded) = (cap, decision) {
        if r == CUDA_SUCCESS {
            c.kept(kind, id, dev, size);
        } else {
            c.returned(dev, size);
        }
    }
    allocated(api, flag, dev, r, id, size, aux)
}

/// The event's flags for a request the cap let through (`None`: the cap refused it).
#[inline(always)]
fn admitted_flag(decision: Decision, flag: u8) -> Option<u8> {
    match decision {
        Decision::Refused { .. } => None,
        Decision::Exceeded => Some(flag | flags::CAP_EXCEEDED),
        Decision::Free | Decision::Counted => Some(flag),
    }
}

/// The driver answered an allocation: record it (with its call site), and an out-of-memory record if it failed
/// for lack of memory. Returns the driver's code.
#[inline(always)]
#[link_section = ".vramtrace.hot"]
fn allocated(api: Api, flag: u8, dev: u32, r: CUresult, id: u64, size: u64, aux: u64) -> CUresult {
    let stack = stacks::site(size, r != CUDA_SUCCESS);
    record::push(api, flag, dev, r, id, size, aux, stack);
    if r == CUDA_ERROR_OUT_OF_MEMORY {
        out_of_memory(api, flag, dev, size, r);
    }
    r
}

/// An allocation failed for lack of memory: gather what only this moment can tell (the driver's real free and
/// total, the cap's counts) and hand it to the collector before the program sees the error.
#[cold]
fn out_of_memory(api: Api, flag: u8, dev: u32, size: u64, result: CUresult) {
    // Nobody to tell: make no extra driver call.
    if !record::active() {
        return;
    }
    let ts_ns = record::now();
    let (mut free, mut total) = (0usize, 0usize);
    let info = driver::real(Sym::MemGetInfo);
    // On no GPU (`cuMemCreate` of host memory): the current GPU's figures would describe another memory.
    let known = dev != NO_DEVICE
        && !info.is_null()
        // SAFETY: `info` is non-null (checked just before) and is the driver's `cuMemGetInfo_v2` (the slot is
        // filled only by lookups of that exact name): `CUresult (size_t *free, size_t *total)`; both are locals.
        && unsafe {
            std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult,
            >(info)(&mut free, &mut total)
        } == CUDA_SUCCESS;
    let cap = cap::get();
    let cap_bytes = cap.and_then(|c| c.cap_of(dev));
    let capped = cap.filter(|_| cap_bytes.is_some());
    record::oom(vramtrace_format::Oom {
        pid: std::process::id(),
        tid: record::tid(),
        ts_ns,
        device: dev,
        api: api as u8,
        flags: flag,
        requested_bytes: size,
        result,
        device_free_bytes: known.then_some(free as u64),
        device_total_bytes: known.then_some(total as u64),
        cap_bytes,
        job_used_bytes: capped.map(|c| c.used(dev)),
        process_used_bytes: capped.map(|c| c.process_used(dev)),
        extra: Vec::new(),
    });
}

/// A release of what `id` names: published before the call (see the module's note), and taken back after it
/// if the driver refused it. The cap's entry for `id` is taken out before the driver frees it (see `Cap::take`),
/// and its bytes given back only once the free succeeded.
#[inline(always)]
#[link_section = ".vramtrace.hot"]
unsafe fn track_release(
    api: Api,
    flag: u8,
    kind: Option<Kind>,
    id: u64,
    size: u64,
    aux: u64,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    record::push(api, flag, NO_DEVICE, CUDA_SUCCESS, id, size, aux, 0);
    let cap = kind.and_then(|k| cap::get().map(|c| (c, k)));
    let held = cap.and_then(|(c, k)| c.take(k, id));
    let r = call();
    if let (Some((c, k)), Some(h)) = (cap, held) {
        match (r == CUDA_SUCCESS, k) {
            (true, Kind::Handle) => c.released_handle(id, h),
            (true, Kind::Ptr) => c.freed(h),
            (false, _) => c.restore(k, id, h),
        }
    }
    if r != CUDA_SUCCESS {
        undone(api, flag, id, size, aux, r);
    }
    r
}

/// The driver refused a release already published: what it released is the process's again.
#[cold]
fn undone(api: Api, flag: u8, id: u64, size: u64, aux: u64, r: CUresult) {
    record::push(api, flag | flags::UNDONE, NO_DEVICE, r, id, size, aux, 0);
}

#[link_section = ".vramtrace.hot"]
pub unsafe fn mem_alloc(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    let f = real!(
        Sym::MemAlloc,
        unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult
    );
    let Some(_busy) = Busy::enter() else {
        return f(dptr, size);
    };
    track_alloc(
        Api::MemAlloc,
        0,
        On::Context,
        size as u64,
        0,
        Kind::Ptr,
        dptr,
        || f(dptr, size),
    )
}

pub unsafe fn mem_alloc_pitch(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    let f = real!(
        Sym::MemAllocPitch,
        unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult
    );
    let Some(_busy) = Busy::enter() else {
        return f(dptr, pitch, width, height, element_size);
    };
    let dev = driver::current_device();
    // The driver picks the pitch; admit the likely size (rows padded to 512 bytes) and settle after.
    let guess = (width.div_ceil(512) as u64 * 512).saturating_mul(height as u64);
    let cap = cap::get();
    let decision = cap.map_or(Decision::Free, |c| c.admit(dev, guess));
    if let Decision::Refused { .. } = decision {
        return refuse(Api::MemAllocPitch, 0, dev, guess, 0);
    }
    let r = f(dptr, pitch, width, height, element_size);
    let p = if r == CUDA_SUCCESS && !pitch.is_null() {
        *pitch as u64
    } else {
        0
    };
    let size = p.saturating_mul(height as u64);
    let addr = returned(dptr, r);
    let mut flag = if decision == Decision::Exceeded {
        flags::CAP_EXCEEDED
    } else {
        0
    };
    if let (Some(c), Decision::Counted | Decision::Exceeded) = (cap, decision) {
        c.returned(dev, guess);
        if r == CUDA_SUCCESS {
            match c.admit(dev, size) {
                Decision::Refused { .. } => {
                    // The driver's pitch made it bigger than the cap allows: undo it, as if refused up front,
                    // and take the driver's answer back from the caller: code that frees on its error path
                    // must not free an address that is no longer its own.
                    let free = driver::real(Sym::MemFree);
                    if !free.is_null() {
                        std::mem::transmute::<
                            *mut c_void,
                            unsafe extern "C" fn(CUdeviceptr) -> CUresult,
                        >(free)(addr);
                    }
                    if !dptr.is_null() {
                        *dptr = 0;
                    }
                    *pitch = 0;
                    return refuse(Api::MemAllocPitch, 0, dev, size, p);
                }
                Decision::Exceeded => flag = flags::CAP_EXCEEDED,
                _ => {}
            }
            c.kept(Kind::Ptr, addr, dev, size);
        }
    }
    // A failed pitch allocation has no size yet: the request's.
    let stack = stacks::site(
        if r == CUDA_SUCCESS { size } else { guess },
        r != CUDA_SUCCESS,
    );
    record::push(Api::MemAllocPitch, flag, dev, r, addr, size, p, stack);
    if r == CUDA_ERROR_OUT_OF_MEMORY {
        out_of_memory(Api::MemAllocPitch, flag, dev, guess, r);
    }
    r
}

pub unsafe fn mem_alloc_managed(dptr: *mut CUdeviceptr, size: usize, flags: c_uint) -> CUresult {
    let f = real!(
        Sym::MemAllocManaged,
        unsafe extern "C" fn(*mut CUdeviceptr, usize, c_uint) -> CUresult
    );
    let Some(_busy) = Busy::enter() else {
        return f(dptr, size, flags);
    };
    track_alloc(
        Api::MemAllocManaged,
        0,
        On::Context,
        size as u64,
        flags as u64,
        Kind::Ptr,
        dptr,
        || f(dptr, size, flags),
    )
}

#[link_section = ".vramtrace.hot"]
pub unsafe fn mem_free(dptr: CUdeviceptr) -> CUresult {
    let f = real!(Sym::MemFree, unsafe extern "C" fn(CUdeviceptr) -> CUresult);
    let Some(_busy) = Busy::enter() else {
        return f(dptr);
    };
    track_release(Api::MemFree, 0, Some(Kind::Ptr), dptr, 0, 0, || f(dptr))
}

#[link_section = ".vramtrace.hot"]
pub unsafe fn mem_alloc_async(
    sym: Sym,
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> CUresult {
    let f = real!(
        sym,
        unsafe extern "C" fn(*mut CUdeviceptr, usize, CUstream) -> CUresult
    );
    let Some(_busy) = Busy::enter() else {
        return f(dptr, size, stream);
    };
    let dev = driver::current_device();
    track_pool_alloc(
        Api::MemAllocAsync,
        ptsz(sym),
        dev,
        None,
        size as u64,
        stream as u64,
        dptr,
        || f(dptr, size, stream),
    )
}

#[link_section = ".vramtrace.hot"]
pub unsafe fn mem_alloc_from_pool(
    sym: Sym,
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    let f = real!(
        sym,
        unsafe extern "C" fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult
    );
    let Some(_busy) = Busy::enter() else {
        return f(dptr, size, pool, stream);
    };
    let dev = driver::current_device();
    track_pool_alloc(
        Api::MemAllocFromPoolAsync,
        ptsz(sym),
        dev,
        Some(pool),
        size as u64,
        stream as u64,
        dptr,
        || f(dptr, size, pool, stream),
    )
}

/// A stream-ordered allocation: under a cap on `dev`, its pool is counted by its reservation (pools.rs), the
/// growth it can cause admitted first; otherwise (no cap, or a pool the driver will not describe) as any
/// allocation, by its size.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
#[link_section = ".vramtrace.hot"]
unsafe fn track_pool_alloc(
    api: Api,
    flag: u8,
    dev: u32,
    pool: Option<CUmemoryPool>,
    size: u64,
    aux: u64,
    out: *const u64,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let cap = cap::get().filter(|c| c.cap_of(dev).is_some());
    let followed = cap.and_then(|c| {
        let p = pool.or_else(|| pools::current(dev))?;
        pools::before(c, p, dev, size).map(|x| (c, x))
    });
    let Some((c, (entry, growth))) = followed else {
        return track_alloc(api, flag, On::Device(dev), size, aux, Kind::Ptr, out, call);
    };
    let mut decision = c.admit(dev, growth);
    if let Decision::Refused { .. } = decision {
        // Pools may have given memory back since they were last looked at: settle them, then ask again.
        pools::settle_all(c);
        decision = c.admit(dev, growth);
    }
    let Some(flag) = admitted_flag(decision, flag) else {
        pools::withdraw(entry);
        return refuse(api, flag, dev, size, aux);
    };
    let r = call();
    let id = returned(out, r);
    let admitted = if matches!(decision, Decision::Counted | Decision::Exceeded) {
        growth
    } else {
        0
    };
    pools::after(c, entry, dev, admitted);
    allocated(api, flag, dev, r, id, size, aux)
}

#[link_section = ".vramtrace.hot"]
pub unsafe fn mem_free_async(sym: Sym, dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    let f = real!(sym, unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult);
    let Some(_busy) = Busy::enter() else {
        return f(dptr, stream);
    };
    let capped = cap::get().is_some();
    let r = track_release(
        Api::MemFreeAsync,
        ptsz(sym),
        Some(Kind::Ptr),
        dptr,
        0,
        stream as u64,
        || {
            // Pools change under it: an estimate of their room read meanwhile is not exact.
            if capped {
                pools::free_call(false);
            }
            let r = f(dptr, stream);
            if capped {
                pools::free_call(true);
            }
            r
        },
    );
    // The pool may have given memory back (below its release threshold, it keeps it).
    if let Some(c) = cap::get() {
        pools::settle_all(c);
    }
    r
}

#[link_section = ".vramtrace.hot"]
pub unsafe fn mem_create(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    let f = real!(
        Sym::MemCreate,
        unsafe extern "C" fn(
            *mut CUmemGenericAllocationHandle,
            usize,
            *const CUmemAllocationProp,
            u64,
        ) -> CUresult
    );
    let Some(_busy) = Busy::enter() else {
        return f(handle, size, prop, flags);
    };
    // Physical memory lives where the properties say, not on the current context's device.
    let dev = match prop.as_ref() {
        Some(p) if p.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE && p.location.id >= 0 => {
            p.location.id as u32
        }
        _ => NO_DEVICE,
    };
    track_alloc(
        Api::MemCreate,
        0,
        On::Device(dev),
        size as u64,
        0,
        Kind::Handle,
        handle,
        || f(handle, size, prop, flags),
    )
}

#[link_section = ".vramtrace.hot"]
pub unsafe fn mem_release(handle: CUmemGenericAllocationHandle) -> CUresult {
    let f = real!(
        Sym::MemRelease,
        unsafe extern "C" fn(CUmemGenericAllocationHandle) -> CUresult
    );
    let Some(_busy) = Busy::enter() else {
        return f(handle);
    };
    track_release(Api::MemRelease, 0, Some(Kind::Handle), handle, 0, 0, || {
        f(handle)
    })
}

#[link_section = ".vramtrace.hot"]
pub unsafe fn mem_map(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    let f = real!(
        Sym::MemMap,
        unsafe extern "C" fn(
            CUdeviceptr,
            usize,
            usize,
            CUmemGenericAllocationHandle,
            u64,
        ) -> CUresult
    );
    let Some(_busy) = Busy::enter() else {
        return f(ptr, size, offset, handle, flags);
    };
    let r = f(ptr, size, offset, handle, flags);
    if let (CUDA_SUCCESS, Some(c)) = (r, cap::get()) {
        c.mapped(ptr, size as u64, handle);
    }
    record::push(Api::MemMap, 0, NO_DEVICE, r, ptr, size as u64, handle, 0);
    r
}

#[link_section = ".vramtrace.hot"]
pub unsafe fn mem_unmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    let f = real!(
        Sym::MemUnmap,
        unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult
    );
    let Some(_busy) = Busy::enter() else {
        return f(ptr, size);
    };
    let r = track_release(Api::MemUnmap, 0, None, ptr, size as u64, 0, || f(ptr, size));
    if let (CUDA_SUCCESS, Some(c)) = (r, cap::get()) {
        c.unmapped(ptr, size as u64);
    }
    r
}

#[link_section = ".vramtrace.hot"]
pub unsafe fn mem_address_reserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    let f = real!(
        Sym::MemAddressReserve,
        unsafe extern "C" fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, u64) -> CUresult
    );
    let Some(_busy) = Busy::enter() else {
        return f(ptr, size, alignment, addr, flags);
    };
    let r = f(ptr, size, alignment, addr, flags);
    record::push(
        Api::MemAddressReserve,
        0,
        NO_DEVICE,
        r,
        returned(ptr, r),
        size as u64,
        0,
        0,
    );
    r
}

#[link_section = ".vramtrace.hot"]
pub unsafe fn mem_address_free(ptr: CUdeviceptr, size: usize) -> CUresult {
    let f = real!(
        Sym::MemAddressFree,
        unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult
    );
    let Some(_busy) = Busy::enter() else {
        return f(ptr, size);
    };
    track_release(Api::MemAddressFree, 0, None, ptr, size as u64, 0, || {
        f(ptr, size)
    })
}

pub unsafe fn mem_get_info(free: *mut usize, total: *mut usize) -> CUresult {
    let f = real!(
        Sym::MemGetInfo,
        unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult
    );
    let Some(_busy) = Busy::enter() else {
        return f(free, total);
    };
    let dev = driver::current_device();
    let r = f(free, total);
    if r == CUDA_SUCCESS && !free.is_null() && !total.is_null() {
        // The trace keeps the driver's real figures; the caller sees the cap's.
        record::push(
            Api::MemGetInfo,
            0,
            dev,
            r,
            *total as u64,
            *free as u64,
            0,
            0,
        );
        if let Some(c) = cap::get() {
            pools::settle_all(c);
            let (vfree, vtotal) = c.virtual_info(dev, *free as u64, *total as u64);
            *free = vfree as usize;
            *total = vtotal as usize;
        }
    }
    r
}

pub unsafe fn device_total_mem(bytes: *mut usize, dev: CUdevice) -> CUresult {
    let f = real!(
        Sym::DeviceTotalMem,
        unsafe extern "C" fn(*mut usize, CUdevice) -> CUresult
    );
    let r = f(bytes, dev);
    // Device handles are ordinals in every driver we know.
    if let (CUDA_SUCCESS, false, Some(c)) = (r, bytes.is_null(), cap::get()) {
        if dev >= 0 {
            *bytes = c.virtual_info(dev as u32, 0, *bytes as u64).1 as usize;
        }
    }
    r
}

/// What a tracked function the shim cannot wrap costs under a cap, for the line that says so.
fn bypass_cost(name: &[u8]) -> &'static str {
    let is = |p: &[u8]| name.starts_with(p);
    if is(b"cuMemFree") || is(b"cuMemRelease") {
        "memory freed through it stays counted against the cap"
    } else if is(b"cuMemGetInfo") || is(b"cuDeviceTotalMem") {
        "the program sees the GPU's own figures there, not the cap's"
    } else if is(b"cuCtxCreate") {
        "a context created through it is unknown to the cap, which may count another context's teardown as \
         freeing this one's memory too"
    } else if is(b"cuCtxDestroy") || is(b"cuDevicePrimaryCtx") {
        "a context torn down through it is not seen, and what it held stays counted against the cap"
    } else if is(b"cuMemMap") || is(b"cuMemUnmap") || is(b"cuMemAddress") {
        "its address-space changes are not recorded"
    } else if is(b"cuGetProcAddress") {
        "functions found through it are not seen"
    } else {
        "memory allocated through it is not capped"
    }
}

type GetProc4 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
type GetProc5 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;

/// Both `cuGetProcAddress` flavours: the real lookup with the caller's arguments, then the answer swapped for
/// our wrapper when it is a tracked function (the self-query "cuGetProcAddress" included: the runtime does every
/// later lookup through what that returns, so without the swap nothing after it would be seen).
pub unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: Option<*mut c_int>,
    wrapper: driver::Wrapper,
) -> CUresult {
    let (sym, real) = match status {
        Some(_) => (Sym::GetProcAddressV2, driver::real(Sym::GetProcAddressV2)),
        None => (Sym::GetProcAddress, driver::real(Sym::GetProcAddress)),
    };
    if real.is_null() {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    let r = match status {
        Some(st) => {
            std::mem::transmute::<*mut c_void, GetProc5>(real)(symbol, pfn, version, flags, st)
        }
        None => std::mem::transmute::<*mut c_void, GetProc4>(real)(symbol, pfn, version, flags),
    };
    if r == CUDA_SUCCESS && !pfn.is_null() && !(*pfn).is_null() {
        driver::bind(real);
        let found = *pfn;
        let swapped = driver::swap_proc(found, wrapper);
        if swapped != found {
            *pfn = swapped;
        } else if !symbol.is_null() && driver::is_tracked_base(CStr::from_ptr(symbol)) {
            let name = CStr::from_ptr(symbol);
            // Under a cap the user must hear it, with what it costs: memory allocated through that function
            // escapes the cap; a context torn down through it keeps its memory counted.
            if cap::get().is_some() && !BYPASS_SAID.swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                let cost = bypass_cost(name.to_bytes());
                cap::warn_line(format_args!(
                    "cuGetProcAddress({name:?}, version {version}) answered a function vramtrace does not \
                     know (a legacy entry point, or a layer between the program and the driver): {cost}"
                ));
            }
            crate::debug!(
                "{:?}({name:?}, version {version}, flags {flags}) returned a function we do not recognise",
                sym.name(),
            );
        }
    }
    r
}

#[cfg(test)]
mod tests;

//! Stream-ordered pools under the cap. The GPU counts what a pool *reserves*, not what its allocations use: a
//! pool keeps freed memory (PyTorch's `cudaMallocAsync` backend sets the release threshold to the maximum), so
//! counting allocations let two processes of one job hold 6 GiB under a 4 GiB cap. Here each pool the process
//! allocates from is counted in the cap's ledger by its reservation (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`):
//!
//! - before a stream-ordered allocation, the growth it can cause (`used + size - reserved`) is admitted, so the
//!   cap refuses before the pool grows past it;
//! - after it, the ledger's count for the pool is settled to the pool's reservation (the real growth, which the
//!   driver may round up), and the admitted growth given back: counted first, then given back, so the job is
//!   never under-counted in between;
//! - after a stream-ordered free, at `cuMemGetInfo`, and before a refusal, every known pool is settled again:
//!   memory a pool gave back (release threshold, `cuMemPoolTrimTo`, a destroyed pool) comes back to the job.
//!
//! Settling reads the pool's reservation and moves its counted bytes there, applying the difference to the
//! ledger, one thread at a time per pool, so a read is never applied after a newer one.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::cap::Cap;
use crate::cuda::*;
use crate::driver::{self, Sym};

/// Pools a process can be followed through (every framework uses one or two per device).
const MAX_POOLS: usize = 64;
const RESERVED_MEM_CURRENT: c_int = 5;
const USED_MEM_CURRENT: c_int = 7;

pub struct Entry {
    /// The pool's handle; 0: free.
    pool: AtomicU64,
    dev: AtomicU32,
    /// Its bytes counted in the ledger now.
    counted: AtomicU64,
    /// A thread is settling it: one at a time (see `settle`).
    busy: AtomicBool,
}

/// Stream-ordered allocations and frees of this process in the driver now, and how many have completed: an
/// estimate of a pool's room is exact only when it was read with no other in flight and none completing
/// meanwhile (the driver's pools change under concurrent calls between the two attribute reads).
static IN_FLIGHT: AtomicU32 = AtomicU32::new(0);
static COMPLETED: AtomicU64 = AtomicU64::new(0);

static POOLS: [Entry; MAX_POOLS] = [const {
    Entry {
        pool: AtomicU64::new(0),
        dev: AtomicU32::new(0),
        counted: AtomicU64::new(0),
        busy: AtomicBool::new(false),
    }
}; MAX_POOLS];

static FORK_HANDLER: AtomicBool = AtomicBool::new(false);

/// Registers [`after_fork_in_child`] once per process image, before this file first holds any state (the first
/// pool followed, the first free in flight): the pools keep their own fork safety, as the other stateful parts
/// of the shim do.
#[inline]
fn fork_safe() {
    if !FORK_HANDLER.load(Ordering::Relaxed) && !FORK_HANDLER.swap(true, Ordering::AcqRel) {
        // SAFETY: registers a plain `extern "C"` function of this library (glibc drops the handler should the
        // library ever be unloaded); `FORK_HANDLER` makes it once per process image.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    }
}

/// In a forked child: the parent's pools are not the child's (CUDA starts afresh there), and a settle the
/// fork interrupted would hold its entry for good.
extern "C" fn after_fork_in_child() {
    for e in &POOLS {
        e.pool.store(0, Ordering::Relaxed);
        e.counted.store(0, Ordering::Relaxed);
        e.busy.store(false, Ordering::Relaxed);
    }
    IN_FLIGHT.store(0, Ordering::Relaxed);
}

/// A pool attribute of type `cuuint64_t`, if the driver answers.
fn attribute(pool: CUmemoryPool, attr: c_int) -> Option<u64> {
    let f = driver::real(Sym::MemPoolGetAttribute);
    if f.is_null() {
        return None;
    }
    // SAFETY: `f` is non-null (checked above) and is the driver's `cuMemPoolGetAttribute` (a `driver::real` slot
    // is filled only by lookups of its exact name): `CUresult (CUmemoryPool, CUmemPool_attribute, void *value)`.
    let f: unsafe extern "C" fn(CUmemoryPool, c_int, *mut c_void) -> CUresult =
        unsafe { std::mem::transmute(f) };
    let mut v: u64 = 0;
    // SAFETY: the driver's `cuMemPoolGetAttribute` (prototype above); every attribute asked for here
    // (RESERVED_MEM_CURRENT, USED_MEM_CURRENT) is a `cuuint64_t`, written into the local `v`.
    (unsafe { f(pool, attr, (&mut v as *mut u64).cast()) } == CUDA_SUCCESS).then_some(v)
}

/// The pool `cuMemAllocAsync` takes from on `dev` (its current pool).
pub fn current(dev: u32) -> Option<CUmemoryPool> {
    let f = driver::real(Sym::DeviceGetMemPool);
    if f.is_null() || dev == vramtrace_format::NO_DEVICE {
        return None;
    }
    // SAFETY: `f` is non-null (checked above) and is the driver's `cuDeviceGetMemPool` (a `driver::real` slot is
    // filled only by lookups of its exact name): `CUresult (CUmemoryPool *pool, CUdevice dev)`.
    let f: unsafe extern "C" fn(*mut CUmemoryPool, CUdevice) -> CUresult =
        unsafe { std::mem::transmute(f) };
    let mut p: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the driver's `cuDeviceGetMemPool` (prototype above); `p` is a local the call writes.
    (unsafe { f(&mut p, dev as CUdevice) } == CUDA_SUCCESS && !p.is_null()).then_some(p)
}

/// The entry following `pool` (on `dev`), claimed if new; `None` when the table is full.
fn entry(pool: CUmemoryPool, dev: u32) -> Option<&'static Entry> {
    let key = pool as u64;
    if let Some(e) = POOLS.iter().find(|e| e.pool.load(Ordering::Acquire) == key) {
        return Some(e);
    }
    for e in &POOLS {
        if e.pool
            .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            e.dev.store(dev, Ordering::Release);
            return Some(e);
        }
        if e.pool.load(Ordering::Acquire) == key {
            return Some(e);
        }
    }
    None
}

/// Makes the ledger count `e`'s pool by its reservation now (0 for a pool the driver no longer knows).
///
/// One thread at a time per pool: a reservation read, then applied. Two settlers interleaved could apply an
/// older read after a newer one (one reads before a growth, the other after it and applies first): the job
/// would be counted short by the growth until the next settle, and an allocation could pass the cap meanwhile
/// (seen: 13 x 5 MiB held under a 64 MiB cap by 4 processes x 4 threads, one run in eight). The section holds
/// one attribute query; the driver serialises its pool operations anyway.
fn settle(cap: &Cap, e: &Entry) {
    let pool = e.pool.load(Ordering::Acquire);
    if pool == 0 {
        return;
    }
    while e
        .busy
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
    }
    let reserved = attribute(pool as CUmemoryPool, RESERVED_MEM_CURRENT).unwrap_or(0);
    let dev = e.dev.load(Ordering::Acquire);
    let old = e.counted.swap(reserved, Ordering::AcqRel);
    if reserved > old {
        cap.count(dev, reserved - old);
    } else if old > reserved {
        cap.returned(dev, old - reserved);
    }
    e.busy.store(false, Ordering::Release);
}

/// Settles every pool this process allocated from (after a free, at `cuMemGetInfo`, before a refusal).
pub fn settle_all(cap: &Cap) {
    for e in &POOLS {
        if e.pool.load(Ordering::Acquire) != 0 {
            settle(cap, e);
        }
    }
}

/// A stream-ordered allocation about to be made from `pool` on `dev`: settles the pool and returns it with the
/// bytes the allocation can make it grow by (to admit before the call). `None`: the pool cannot be followed
/// (the driver does not answer, the table is full): the caller counts the allocation by its size instead.
///
/// The growth is `used + size - reserved` when those two were read with no other stream-ordered call of this
/// process in the driver and none completing in between; otherwise the allocation's whole size (a pool grows
/// by at most that). Two threads reading the pool's room while a third allocates or frees could otherwise both
/// count on room that is gone, and pass the cap (seen: 13 x 5 MiB held under a 64 MiB cap, 4 processes x 4
/// threads). Every call that returns `Some` is followed by [`after`] or [`withdraw`].
pub fn before(cap: &Cap, pool: CUmemoryPool, dev: u32, size: u64) -> Option<(&'static Entry, u64)> {
    fork_safe();
    let e = entry(pool, dev)?;
    let others = IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
    let seen = COMPLETED.load(Ordering::Acquire);
    let read = attribute(pool, USED_MEM_CURRENT)
        .and_then(|used| Some((used, attribute(pool, RESERVED_MEM_CURRENT)?)));
    let alone = others == 0
        && COMPLETED.load(Ordering::Acquire) == seen
        && IN_FLIGHT.load(Ordering::Acquire) == 1;
    let Some((used, reserved)) = read else {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
        return None;
    };
    settle(cap, e);
    let growth = if alone {
        used.saturating_add(size).saturating_sub(reserved).min(size)
    } else {
        size
    };
    Some((e, growth))
}

/// The allocation [`before`] was asked about was refused without calling the driver.
pub fn withdraw(_e: &Entry) {
    IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
}

/// After the call: the pool's real reservation counted, then the admitted growth given back (in that order,
/// so the job is never under-counted in between).
pub fn after(cap: &Cap, e: &Entry, dev: u32, admitted: u64) {
    COMPLETED.fetch_add(1, Ordering::AcqRel);
    IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
    settle(cap, e);
    if admitted > 0 {
        cap.returned(dev, admitted);
    }
}

/// A stream-ordered free is going to the driver (`done`: it came back): estimates made meanwhile are not exact.
pub fn free_call(done: bool) {
    if done {
        COMPLETED.fetch_add(1, Ordering::AcqRel);
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
    } else {
        fork_safe();
        IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
    }
}

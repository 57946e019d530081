//! Contexts torn down. Destroying a context, resetting a primary context (`cudaDeviceReset`) or releasing it for
//! the last time frees every allocation made in it, with no call per allocation for the shim to see: without
//! this, the cap would go on counting memory the GPU no longer holds (and refuse what it should grant), and the
//! trace would show it live. The driver does not say which context an allocation belongs to, so the shim counts
//! the process's contexts per device (the ones it saw created, and whether the primary one is active): once none
//! is left on a device, everything the process allocated there is gone. A context torn down while another of
//! the process lives on the same device is said once in the trace, and its allocations stay counted.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use vramtrace_format::Record;

use crate::cap;
use crate::cuda::*;
use crate::driver::{self, Sym};
use crate::ledger::MAX_DEVICES;
use crate::record;

/// The real function for `sym` as type `$t`, or the not-initialised code if there is no driver to call.
macro_rules! driver_fn {
    ($sym:expr, $t:ty) => {{
        let p = $crate::driver::real($sym);
        if p.is_null() {
            return $crate::cuda::CUDA_ERROR_NOT_INITIALIZED;
        }
        std::mem::transmute::<*mut std::ffi::c_void, $t>(p)
    }};
}
pub(crate) use driver_fn;

/// Contexts this process created and has not destroyed, by device.
static CREATED: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];
/// Which device each created context is on: (context, device + 1) pairs, 0 when free. Lock-free, so a fork in
/// any state leaves it usable (the child clears it: contexts do not survive `fork`).
const TABLE: usize = 256;
static CTX: [AtomicUsize; TABLE] = [const { AtomicUsize::new(0) }; TABLE];
static CTX_DEV: [AtomicU32; TABLE] = [const { AtomicU32::new(0) }; TABLE];
static MIXED_SAID: AtomicBool = AtomicBool::new(false);
static HANDLER: AtomicBool = AtomicBool::new(false);

extern "C" fn after_fork_in_child() {
    for c in &CREATED {
        c.store(0, Ordering::Relaxed);
    }
    for (c, d) in CTX.iter().zip(&CTX_DEV) {
        c.store(0, Ordering::Relaxed);
        d.store(0, Ordering::Relaxed);
    }
}

fn device_index(dev: CUdevice) -> Option<usize> {
    (dev >= 0 && (dev as usize) < MAX_DEVICES).then_some(dev as usize)
}

/// `cuCtxCreate_v2/_v3/_v4`: the real call, then the context counted on its device.
pub unsafe fn create(
    _sym: Sym,
    pctx: *mut CUcontext,
    dev: CUdevice,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let r = call();
    if r != CUDA_SUCCESS || pctx.is_null() {
        return r;
    }
    let Some(d) = device_index(dev) else { return r };
    if !HANDLER.swap(true, Ordering::AcqRel) {
        libc::pthread_atfork(None, None, Some(after_fork_in_child));
    }
    let ctx = *pctx as usize;
    for (c, slot_dev) in CTX.iter().zip(&CTX_DEV) {
        if c.compare_exchange(0, ctx, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            slot_dev.store(d as u32 + 1, Ordering::Release);
            break;
        }
    }
    CREATED[d].fetch_add(1, Ordering::AcqRel);
    r
}

/// The device of a context this process created (forgetting it when `take`).
fn created_device(ctx: usize, take: bool) -> Option<usize> {
    for (c, slot_dev) in CTX.iter().zip(&CTX_DEV) {
        if c.load(Ordering::Acquire) == ctx {
            let d = slot_dev.load(Ordering::Acquire).checked_sub(1)? as usize;
            if take
                && c.compare_exchange(ctx, 0, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
            {
                return None;
            }
            return Some(d);
        }
    }
    None
}

pub unsafe fn destroy(ctx: CUcontext) -> CUresult {
    let f = driver_fn!(Sym::CtxDestroy, unsafe extern "C" fn(CUcontext) -> CUresult);
    let known = created_device(ctx as usize, false);
    let r = f(ctx);
    if r == CUDA_SUCCESS {
        if let Some(d) = known {
            created_device(ctx as usize, true);
            CREATED[d].fetch_sub(1, Ordering::AcqRel);
            torn_down(d, "cuCtxDestroy");
        }
    }
    r
}

/// `cuDevicePrimaryCtxReset`, `sym` saying which of its versions the caller reached.
pub unsafe fn primary_reset(sym: Sym, dev: CUdevice) -> CUresult {
    let f = driver_fn!(sym, unsafe extern "C" fn(CUdevice) -> CUresult);
    let r = f(dev);
    if r == CUDA_SUCCESS {
        if let Some(d) = device_index(dev) {
            torn_down(d, "cuDevicePrimaryCtxReset");
        }
    }
    r
}

/// `cuDevicePrimaryCtxRelease`, `sym` saying which of its versions the caller reached.
pub unsafe fn primary_release(sym: Sym, dev: CUdevice) -> CUresult {
    let f = driver_fn!(sym, unsafe extern "C" fn(CUdevice) -> CUresult);
    let r = f(dev);
    if r == CUDA_SUCCESS {
        if let Some(d) = device_index(dev) {
            // Only the last release destroys it.
            if primary_active(d) == Some(false) {
                torn_down(d, "cuDevicePrimaryCtxRelease (its last reference)");
            }
        }
    }
    r
}

/// Whether device `d`'s primary context is active, by the driver (`None`: it cannot say).
fn primary_active(d: usize) -> Option<bool> {
    let p = driver::real(Sym::PrimaryCtxGetState);
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` is non-null (checked above) and is the driver's `cuDevicePrimaryCtxGetState` (a `driver::real`
    // slot is filled only by lookups of its exact name), whose prototype is
    // `CUresult (CUdevice, unsigned int *flags, int *active)`.
    let f: unsafe extern "C" fn(CUdevice, *mut u32, *mut i32) -> CUresult =
        unsafe { std::mem::transmute(p) };
    let (mut flags, mut active) = (0u32, 0i32);
    // SAFETY: the driver's own function with its prototype (above); both out-pointers are locals.
    (unsafe { f(d as CUdevice, &mut flags, &mut active) } == CUDA_SUCCESS).then_some(active != 0)
}

/// A context on device `d` is gone: if it was the process's last there, its allocations are too.
fn torn_down(d: usize, how: &str) {
    let others = CREATED[d].load(Ordering::Acquire) > 0 || primary_active(d) == Some(true);
    let pid = std::process::id();
    if others {
        if !MIXED_SAID.swap(true, Ordering::AcqRel) {
            if let Some(r) = record::live() {
                r.note(format!(
                    "a context on GPU {d} was torn down ({how}) while another context of this process lives on \
                     it: the allocations made in it cannot be told apart, so they stay counted"
                ));
            }
        }
        return;
    }
    let (mut allocations, mut bytes) = (0, 0);
    if let Some(c) = cap::get() {
        (allocations, bytes) = c.teardown(d as u32);
        crate::pools::settle_all(c);
    }
    crate::debug!("every context on GPU {d} is gone ({how}): {allocations} counted allocations, {bytes} bytes, freed");
    if record::live().is_some() {
        record::offer(Record::ContextGone {
            pid,
            ts_ns: record::now(),
            device: d as u32,
            how: how.to_string(),
        });
    }
}

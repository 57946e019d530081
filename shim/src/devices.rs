//! Which GPU each of this process's CUDA ordinals is: the driver's UUIDs (`cuDeviceGetUuid_v2`), read once per
//! process image when the driver answers. NVML's memory functions match NVML devices to ordinals by them
//! (nvml.rs), and the courier tells the collector (`Record::Devices`), so the metrics name GPUs as
//! `nvidia-smi -L` and dcgm-exporter do.

use std::ffi::c_int;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::cuda::{CUdevice, CUresult, CUDA_SUCCESS};
use crate::driver::{self, Sym};

/// The UUID of each CUDA ordinal, read once per process (a forked child reads its own).
struct Ordinals {
    pid: i32,
    uuids: Vec<Option<[u8; 16]>>,
}

static ORDINALS: AtomicPtr<Ordinals> = AtomicPtr::new(null_mut());

fn ordinals() -> Option<&'static Ordinals> {
    // SAFETY: getpid has no preconditions and cannot fail.
    let pid = unsafe { libc::getpid() };
    let p = ORDINALS.load(Ordering::Acquire);
    // SAFETY: a non-null ORDINALS is a leaked `Box<Ordinals>`, published with release (this load is acquire) and
    // never freed (a replaced table is leaked, below), so it is whole and lives for `'static`.
    if !p.is_null() && unsafe { (*p).pid } == pid {
        // SAFETY: as just above.
        return Some(unsafe { &*p });
    }
    let fresh = read_ordinals(pid)?;
    let fresh: *mut Ordinals = Box::into_raw(Box::new(fresh));
    // A table another thread may still be reading is never freed: at most one per process that forks.
    match ORDINALS.compare_exchange(p, fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: `fresh` is now the published table: a leaked box, never freed.
        Ok(_) => Some(unsafe { &*fresh }),
        Err(now) => {
            // SAFETY: `fresh` came from `Box::into_raw` above and was never published: this is its only owner.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: a non-null `now` is a published table (leaked box, never freed), read after an acquire.
            (!now.is_null() && unsafe { (*now).pid } == pid).then(|| unsafe { &*now })
        }
    }
}

/// `None` while the driver is not loaded or not initialised (`cuDeviceGetCount` fails): asked again next time.
fn read_ordinals(pid: i32) -> Option<Ordinals> {
    let count = driver::real(Sym::DeviceGetCount);
    let get = driver::real(Sym::DeviceGet);
    let uuid = driver::real(Sym::DeviceGetUuidV2);
    if count.is_null() || get.is_null() || uuid.is_null() {
        return None;
    }
    // SAFETY: the three are non-null (checked above) and are what the driver exports under `cuDeviceGetCount`,
    // `cuDeviceGet` and `cuDeviceGetUuid_v2` (a `driver::real` slot is filled only by lookups of its exact name),
    // with these prototypes (`CUuuid` is 16 bytes); every out-pointer is a local.
    unsafe {
        let count: unsafe extern "C" fn(*mut c_int) -> CUresult = std::mem::transmute(count);
        let get: unsafe extern "C" fn(*mut CUdevice, c_int) -> CUresult = std::mem::transmute(get);
        let uuid: unsafe extern "C" fn(*mut [u8; 16], CUdevice) -> CUresult =
            std::mem::transmute(uuid);
        let mut n: c_int = 0;
        if count(&mut n) != CUDA_SUCCESS || n < 0 {
            return None;
        }
        let uuids = (0..n)
            .map(|i| {
                let mut dev: CUdevice = 0;
                let mut u = [0u8; 16];
                (get(&mut dev, i) == CUDA_SUCCESS && uuid(&mut u, dev) == CUDA_SUCCESS).then_some(u)
            })
            .collect();
        // One device seen: every context is on it, and allocations need not ask which (`context_device`).
        // Anything else says so too, whatever an earlier read (a forked parent's) left.
        let mut only: CUdevice = 0;
        driver::set_only_device(
            if n == 1 && get(&mut only, 0) == CUDA_SUCCESS && only >= 0 {
                only as u32
            } else {
                vramtrace_format::NO_DEVICE
            },
        );
        crate::debug!("NVML devices map to CUDA ordinals by UUID ({n} ordinals)");
        Some(Ordinals { pid, uuids })
    }
}

/// Each ordinal's UUID (`None` where the driver did not say), or `None` while the driver is not loaded or not
/// initialised (asked again next time).
pub fn uuids() -> Option<&'static [Option<[u8; 16]>]> {
    ordinals().map(|o| o.uuids.as_slice())
}

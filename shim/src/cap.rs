//! The cap's policy: which devices are capped at how much, whether a request may go to the driver, what the
//! process holds (so a free gives back the right bytes on the right device), and the memory figures frameworks
//! size themselves from.
//!
//! Counted: every physical allocation the shim tracks (plain, pitch, managed, async and pool, `cuMemCreate`),
//! from the moment it is admitted until its free or release succeeds. Not counted: address reservations and
//! mappings (no physical memory), what a stream-ordered pool keeps cached after `cuMemFreeAsync` (it reuses that
//! for the next async allocation), and context, module and library memory (never passes these calls; the trace
//! measures it from the driver's free memory instead).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use vramtrace_format::cap::{Amount, CapSpec};
use vramtrace_format::NO_DEVICE;

use crate::driver::{self, Sym};
use crate::ledger::{Admit, Ledger, MAX_DEVICES};
use crate::live::Live;

/// What admission decided for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// No cap applies (uncapped device, or no device known): the request goes on, uncounted.
    Free,
    /// Counted against the cap: keep it with `kept`, or give it back with `returned`.
    Counted,
    /// Over the cap in warn mode: counted, and the request goes on.
    Exceeded,
    /// Over the cap: the driver is not called; the caller gets out-of-memory.
    Refused { cap: u64, used: u64 },
}

/// Which of the two id spaces an allocation lives in.
#[derive(Clone, Copy)]
pub enum Kind {
    /// Device pointers (cuMemAlloc*, cuMemFree*).
    Ptr,
    /// `cuMemCreate` handles.
    Handle,
}

pub struct Cap {
    ledger: Ledger,
    spec: CapSpec,
    warn: bool,
    /// Per device: 0 until resolved, `NONE` for no cap, else bytes.
    caps: [AtomicU64; MAX_DEVICES],
    ptrs: Live,
    handles: Live,
    /// Where `cuMemCreate` handles are mapped: a handle released while still mapped keeps its memory (the
    /// driver frees it at its last unmap), so it stays counted until then.
    maps: Mutex<Maps>,
}

#[derive(Default)]
struct Maps {
    /// Mapping start -> (end, handle).
    by_addr: std::collections::BTreeMap<u64, (u64, u64)>,
    /// Handle -> mappings of it.
    count: HashMap<u64, u32>,
    /// Handles released while mapped: what they still hold, (device, bytes).
    released: HashMap<u64, (u32, u64)>,
}

const NONE: u64 = u64::MAX;
/// Slots of the live tables (`live.rs`): 1 MiB for pointers, whose pages are touched only as slots on them are
/// taken; a process holding more than about 40,000 capped allocations at once keeps the rest in a locked map.
const PTR_SLOTS: usize = 1 << 16;
/// `cuMemCreate` handles: fewer, larger allocations.
const HANDLE_SLOTS: usize = 1 << 12;

#[link_section = ".vramtrace.hotdata"]
static CAP: crate::lazy::Lazy<Cap> = crate::lazy::Lazy::new();
static LEDGER_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
static HANDLER: AtomicBool = AtomicBool::new(false);

/// The cap of this process, if one is set. Built at the first tracked call, like the recorder.
#[inline]
pub fn get() -> Option<&'static Cap> {
    CAP.get_or_init(build)
}

/// The cap if this process has built it already (a tracked call came first), without building it: NVML's hooks
/// use this, so a process that only reads NVML (nvidia-smi, a GPU monitor inside the job) never starts recording.
#[inline]
pub fn peek() -> Option<&'static Cap> {
    CAP.peek()
}

/// One line on stderr whatever `VRAMTRACE_DEBUG` says: a cap the user asked for and does not get must be told.
pub(crate) fn warn_line(msg: std::fmt::Arguments) {
    let line = format!("vramtrace: {msg}\n");
    // SAFETY: `line` is a live String and the call reads `line.len()` bytes of it; a closed or odd fd 2 only
    // makes write(2) fail.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

fn build() -> Option<Cap> {
    // The recorder first: its hello brings the job's settings from the collector, which the cap follows rather
    // than this process's environment (a child that set its own VRAMTRACE_CAP, or lost VRAMTRACE_LEDGER).
    crate::record::started();
    let (cap, warn, ledger_path) = crate::settings::cap_settings();
    let text = cap.as_deref()?;
    let spec = match CapSpec::parse(text) {
        Ok(spec) => spec,
        Err(e) => {
            warn_line(format_args!(
                "VRAMTRACE_CAP={text:?} is not a valid cap ({e}); running uncapped"
            ));
            return None;
        }
    };
    if !HANDLER.swap(true, Ordering::AcqRel) {
        // SAFETY: registers a plain `extern "C"` function of this library (glibc drops the handler should the
        // library ever be unloaded); `HANDLER` makes it once per process image.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    }
    let ledger = match &ledger_path {
        Some(path) => match Ledger::open_shared(Path::new(path)) {
            Ok(l) => l,
            Err(e) => {
                warn_line(format_args!("{e}; this process is capped on its own"));
                Ledger::private()
            }
        },
        None => Ledger::private(),
    };
    LEDGER_FD.store(ledger.fd(), Ordering::Release);
    crate::debug!("cap {text:?} ({})", if warn { "warn" } else { "enforce" });
    Some(Cap {
        ledger,
        spec,
        warn,
        caps: [const { AtomicU64::new(0) }; MAX_DEVICES],
        ptrs: Live::new(PTR_SLOTS),
        handles: Live::new(HANDLE_SLOTS),
        maps: Mutex::new(Maps::default()),
    })
}

/// In a forked child: the parent's slot is the parent's. Close our copy of the lock's descriptor (so the
/// parent's death is still seen) and start afresh at the next tracked call.
extern "C" fn after_fork_in_child() {
    CAP.forget();
    let fd = LEDGER_FD.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: `fd` is this process's copy of the ledger lock's descriptor, which only the shim uses; the swap
        // to -1 above makes this the only close of it.
        unsafe { libc::close(fd) };
    }
}

/// The device's total memory as the real driver reports it.
fn physical_total(dev: u32) -> Option<u64> {
    let get = driver::real(Sym::DeviceGet);
    let total = driver::real(Sym::DeviceTotalMem);
    if get.is_null() || total.is_null() {
        return None;
    }
    // SAFETY: both are non-null (checked above) and are what the driver exports under `cuDeviceGet` and
    // `cuDeviceTotalMem_v2` (`driver::real` slots are filled only by lookups of those exact names), with these
    // prototypes (`CUresult (CUdevice*, int)`, `CUresult (size_t*, CUdevice)`); the out-pointers are locals.
    unsafe {
        let get: unsafe extern "C" fn(*mut i32, i32) -> u32 = std::mem::transmute(get);
        let total: unsafe extern "C" fn(*mut usize, i32) -> u32 = std::mem::transmute(total);
        let mut handle = 0i32;
        let mut bytes = 0usize;
        (get(&mut handle, dev as i32) == 0 && total(&mut bytes, handle) == 0)
            .then_some(bytes as u64)
    }
}

impl Cap {
    /// The cap on `dev` in bytes, or `None`.
    pub fn cap_of(&self, dev: u32) -> Option<u64> {
        let i = dev as usize;
        if i >= MAX_DEVICES {
            return None;
        }
        let mut c = self.caps[i].load(Ordering::Acquire);
        if c == 0 {
            c = match self.spec.amount(dev) {
                None => NONE,
                Some(Amount::Bytes(b)) => b,
                // A share needs the device's size; if the driver cannot say, leave the device uncapped for now.
                Some(a @ Amount::Percent(_)) => match physical_total(dev) {
                    Some(total) => a.bytes(total).max(1),
                    None => return None,
                },
            };
            self.caps[i].store(c, Ordering::Release);
        }
        (c != NONE).then_some(c)
    }

    /// Asks to hold `size` more bytes on `dev`.
    #[inline]
    pub fn admit(&self, dev: u32, size: u64) -> Decision {
        if dev == NO_DEVICE {
            return Decision::Free;
        }
        let Some(cap) = self.cap_of(dev) else {
            return Decision::Free;
        };
        match self.ledger.admit(dev as usize, size, cap, false) {
            Admit::Yes => Decision::Counted,
            Admit::No { .. } if self.warn => {
                self.ledger.admit(dev as usize, size, cap, true);
                Decision::Exceeded
            }
            Admit::No { used } => Decision::Refused { cap, used },
        }
    }

    /// The driver granted a counted request: remember it under `id` so its free gives the bytes back.
    #[inline]
    pub fn kept(&self, kind: Kind, id: u64, dev: u32, size: u64) {
        // The id was already held: its free went by a path we do not see. Give the old bytes back rather
        // than shrink the cap for the rest of the run.
        if let Some((d, s)) = self.map(kind).insert(id, dev, size) {
            self.ledger.release(d as usize, s);
        }
    }

    /// The driver refused a counted request: give its bytes back.
    #[inline]
    pub fn returned(&self, dev: u32, size: u64) {
        if (dev as usize) < MAX_DEVICES {
            self.ledger.release(dev as usize, size);
        }
    }

    /// Counts `size` bytes the device already holds (a pool grew): never refused, it has happened.
    #[inline]
    pub fn count(&self, dev: u32, size: u64) {
        if (dev as usize) < MAX_DEVICES {
            self.ledger.admit(dev as usize, size, u64::MAX, true);
        }
    }

    /// About to free `id`: take its entry out first. Once the driver has freed it, another thread may be
    /// handed the same address and record it; had our entry still been there, its removal would have taken
    /// the newcomer's bytes instead. Returns what `id` held, if it was counted.
    #[inline]
    pub fn take(&self, kind: Kind, id: u64) -> Option<(u32, u64)> {
        self.map(kind).remove(id)
    }

    /// The free of a taken entry succeeded: give its bytes back.
    #[inline]
    pub fn freed(&self, held: (u32, u64)) {
        self.ledger.release(held.0 as usize, held.1);
    }

    /// `cuMemRelease` of a taken handle succeeded: its bytes come back now, or, while the handle is still
    /// mapped, at its last unmap (the driver keeps the memory until then).
    pub fn released_handle(&self, handle: u64, held: (u32, u64)) {
        if let Ok(mut m) = self.maps.lock() {
            if m.count.get(&handle).is_some_and(|&n| n > 0) {
                m.released.insert(handle, held);
                return;
            }
        }
        self.freed(held);
    }

    /// `cuMemMap` of `handle` at `[ptr, ptr + size)` succeeded.
    pub fn mapped(&self, ptr: u64, size: u64, handle: u64) {
        if let Ok(mut m) = self.maps.lock() {
            m.by_addr.insert(ptr, (ptr.saturating_add(size), handle));
            *m.count.entry(handle).or_default() += 1;
        }
    }

    /// `cuMemUnmap` of `[ptr, ptr + size)` succeeded: a released handle unmapped for the last time gives its
    /// bytes back.
    pub fn unmapped(&self, ptr: u64, size: u64) {
        let mut back = Vec::new();
        if let Ok(mut m) = self.maps.lock() {
            let end = ptr.saturating_add(size);
            let gone: Vec<u64> = m.by_addr.range(ptr..end).map(|(a, _)| *a).collect();
            for a in gone {
                let Some((_, h)) = m.by_addr.remove(&a) else {
                    continue;
                };
                let left = m.count.get_mut(&h).map(|n| {
                    *n = n.saturating_sub(1);
                    *n
                });
                if left == Some(0) {
                    m.count.remove(&h);
                    if let Some(held) = m.released.remove(&h) {
                        back.push(held);
                    }
                }
            }
        }
        for held in back {
            self.freed(held);
        }
    }

    /// Every context of this process on `dev` is gone, and with them every pointer allocation made on it (the
    /// driver freed them; no call per allocation says so): their bytes come back. `cuMemCreate` handles are the
    /// device's and stay. Returns (allocations, bytes) given back.
    pub fn teardown(&self, dev: u32) -> (u64, u64) {
        let (n, bytes) = self.ptrs.drain_device(dev);
        if bytes > 0 && (dev as usize) < MAX_DEVICES {
            self.ledger.release(dev as usize, bytes);
        }
        (n, bytes)
    }

    /// The free of a taken entry failed: `id` is still allocated, so it still counts.
    #[inline]
    pub fn restore(&self, kind: Kind, id: u64, held: (u32, u64)) {
        self.map(kind).insert(id, held.0, held.1);
    }

    fn map(&self, kind: Kind) -> &Live {
        match kind {
            Kind::Ptr => &self.ptrs,
            Kind::Handle => &self.handles,
        }
    }

    /// The job's bytes in use on `dev`.
    pub fn used(&self, dev: u32) -> u64 {
        if (dev as usize) < MAX_DEVICES {
            self.ledger.used(dev as usize)
        } else {
            0
        }
    }

    /// This process's bytes in use on `dev`.
    pub fn process_used(&self, dev: u32) -> u64 {
        if (dev as usize) < MAX_DEVICES {
            self.ledger.own(dev as usize)
        } else {
            0
        }
    }

    /// The figures a framework should see for a capped device: total = min(cap, physical), free = min(physical
    /// free, cap - in use), saturating, never more than total. Unchanged for an uncapped device.
    pub fn virtual_info(&self, dev: u32, free: u64, total: u64) -> (u64, u64) {
        match self.cap_of(dev) {
            None => (free, total),
            Some(cap) => {
                let vtotal = cap.min(total);
                let vfree = free.min(cap.saturating_sub(self.used(dev))).min(vtotal);
                (vfree, vtotal)
            }
        }
    }
}

//! Device-wide accounting of physical memory: how much of each device is in use, and the peak.
//!
//! Without `FAKECUDA_STATE` the counters live in this process (each process sees devices of its own).
//! With it, they live in a file that every process naming the same path maps `MAP_SHARED`, so processes
//! share the devices like on a real machine. Admission is a compare-and-swap on `used`, so concurrent
//! processes never take more than a device holds together.
//!
//! File layout (little-endian u64 words, all accessed atomically; the file is created if missing and
//! extended to `FILE_SIZE` bytes):
//!
//! ```text
//! offset   0: magic  = u64::from_le_bytes(*b"FAKECUDA")
//! offset   8: layout version = 1
//! offset  16: device count  (informational: written by the first process)
//! offset  24: device 0 size (informational)
//! offset  32: reserved (4 words)
//! offset  64 + 16*d:      used[d]  bytes of device d in use now        (d < 16)
//! offset  64 + 16*d + 8:  peak[d]  highest value used[d] ever reached  (fetch_max after each admission)
//! offset 320 + 136*s:     slot s (s < 256): pid (0 = free) then 16 words: bytes that process holds per device
//! total size: 35136 bytes
//! ```
//!
//! The per-process slots give memory back when a process ends, like the real driver: at normal exit
//! (an ELF destructor) the process returns what it still holds; a process killed without running its
//! destructors is reclaimed by the next process that would otherwise be refused (its pid no longer
//! exists).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::config::{self, MAX_DEVICES};

pub const MAGIC: u64 = u64::from_le_bytes(*b"FAKECUDA");
pub const VERSION: u64 = 1;
pub const NSLOTS: usize = 256;

#[repr(C)]
pub struct DevCounters {
    pub used: AtomicU64,
    pub peak: AtomicU64,
}

#[repr(C)]
pub struct Slot {
    pub pid: AtomicU64,
    pub bytes: [AtomicU64; MAX_DEVICES],
}

#[repr(C)]
pub struct Layout {
    pub magic: AtomicU64,
    pub version: AtomicU64,
    pub devices: AtomicU64,
    pub device_bytes: AtomicU64,
    _reserved: [AtomicU64; 4],
    pub dev: [DevCounters; MAX_DEVICES],
    pub slots: [Slot; NSLOTS],
}

pub const FILE_SIZE: usize = std::mem::size_of::<Layout>();
const _: () = assert!(FILE_SIZE == 64 + 16 * 16 + 136 * 256);

impl Layout {
    const fn new() -> Self {
        Layout {
            magic: AtomicU64::new(0),
            version: AtomicU64::new(0),
            devices: AtomicU64::new(0),
            device_bytes: AtomicU64::new(0),
            _reserved: [const { AtomicU64::new(0) }; 4],
            dev: [const {
                DevCounters {
                    used: AtomicU64::new(0),
                    peak: AtomicU64::new(0),
                }
            }; MAX_DEVICES],
            slots: [const {
                Slot {
                    pid: AtomicU64::new(0),
                    bytes: [const { AtomicU64::new(0) }; MAX_DEVICES],
                }
            }; NSLOTS],
        }
    }
}

static LOCAL: Layout = Layout::new();
static SHARED: OnceLock<Option<&'static Layout>> = OnceLock::new();

/// This process's slot in the shared file.
const NO_SLOT: usize = usize::MAX;
const UNCLAIMED: usize = usize::MAX - 1;
static MY_SLOT: AtomicUsize = AtomicUsize::new(UNCLAIMED);

fn shared() -> Option<&'static Layout> {
    *SHARED.get_or_init(|| {
        let path = config::get().state_path.as_ref()?;
        let layout = map_file(path);
        if layout.is_none() {
            eprintln!(
                "fakecuda: cannot use FAKECUDA_STATE {}; accounting is process-local",
                path.display()
            );
        }
        layout
    })
}

fn map_file(path: &std::path::Path) -> Option<&'static Layout> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: plain syscalls on a descriptor we own; the mapping is never unmapped, so 'static holds.
    unsafe {
        let fd = libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
            0o666,
        );
        if fd < 0 {
            return None;
        }
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0
            || ((st.st_size as usize) < FILE_SIZE
                && libc::ftruncate(fd, FILE_SIZE as libc::off_t) != 0)
        {
            libc::close(fd);
            return None;
        }
        let p = libc::mmap(
            std::ptr::null_mut(),
            FILE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        libc::close(fd);
        if p == libc::MAP_FAILED {
            return None;
        }
        let layout = &*(p as *const Layout);
        let cfg = config::get();
        match layout
            .magic
            .compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                layout.version.store(VERSION, Ordering::Release);
                layout.devices.store(cfg.devices as u64, Ordering::Release);
                layout
                    .device_bytes
                    .store(cfg.device_bytes(0), Ordering::Release);
            }
            Err(MAGIC) => {}
            Err(_) => return None,
        }
        Some(layout)
    }
}

fn layout() -> &'static Layout {
    shared().unwrap_or(&LOCAL)
}

fn saturating_sub(a: &AtomicU64, n: u64) {
    let _ = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
        Some(v.saturating_sub(n))
    });
}

fn try_add(l: &Layout, dev: usize, bytes: u64, cap: u64) -> bool {
    let c = &l.dev[dev];
    let mut cur = c.used.load(Ordering::Acquire);
    loop {
        let new = match cur.checked_add(bytes) {
            Some(n) if n <= cap => n,
            _ => return false,
        };
        match c
            .used
            .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                c.peak.fetch_max(new, Ordering::AcqRel);
                return true;
            }
            Err(v) => cur = v,
        }
    }
}

/// Takes `bytes` of device `dev`; false (nothing taken) when the device does not have them.
pub fn reserve(dev: usize, bytes: u64) -> bool {
    let cap = config::get().device_bytes(dev);
    let Some(l) = shared() else {
        return try_add(&LOCAL, dev, bytes, cap);
    };
    let ok = try_add(l, dev, bytes, cap) || (reclaim_dead(l) > 0 && try_add(l, dev, bytes, cap));
    if ok {
        if let Some(s) = my_slot(l) {
            s.bytes[dev].fetch_add(bytes, Ordering::AcqRel);
        }
    }
    ok
}

/// Gives back `bytes` of device `dev`.
pub fn release(dev: usize, bytes: u64) {
    let l = layout();
    saturating_sub(&l.dev[dev].used, bytes);
    if std::ptr::eq(l, &LOCAL) {
        return;
    }
    if let Some(s) = my_slot(l) {
        saturating_sub(&s.bytes[dev], bytes);
    }
}

/// Bytes of device `dev` in use (all processes sharing the state, or this process).
pub fn used(dev: usize) -> u64 {
    layout().dev[dev].used.load(Ordering::Acquire)
}

fn pid() -> u64 {
    // SAFETY: plain syscall.
    unsafe { libc::getpid() as u64 }
}

fn my_slot(l: &'static Layout) -> Option<&'static Slot> {
    let i = MY_SLOT.load(Ordering::Acquire);
    if i < NSLOTS {
        return Some(&l.slots[i]);
    }
    if i == NO_SLOT {
        return None;
    }
    // One claim at a time in this process (a concurrent claimer would take our pid's slot for stale).
    static CLAIM: Mutex<()> = Mutex::new(());
    let _claim = CLAIM.lock().unwrap_or_else(|e| e.into_inner());
    let i = MY_SLOT.load(Ordering::Acquire);
    if i < NSLOTS {
        return Some(&l.slots[i]);
    }
    if i == NO_SLOT {
        return None;
    }
    let me = pid();
    // A slot still carrying our pid belongs to an earlier process that had it: give its memory back.
    for s in l.slots.iter() {
        if s.pid.load(Ordering::Acquire) == me {
            empty_slot(l, s, me);
        }
    }
    for pass in 0..2 {
        for (i, s) in l.slots.iter().enumerate() {
            if s.pid
                .compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                MY_SLOT.store(i, Ordering::Release);
                return Some(s);
            }
        }
        if pass == 0 && reclaim_dead(l) == 0 {
            break;
        }
    }
    MY_SLOT.store(NO_SLOT, Ordering::Release);
    None
}

/// Returns a slot's memory to the devices and frees the slot, if it still belongs to `owner`.
fn empty_slot(l: &Layout, s: &Slot, owner: u64) -> bool {
    // u64::MAX marks a slot being emptied, so that two processes never return it twice.
    if s.pid
        .compare_exchange(owner, u64::MAX, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return false;
    }
    for (d, b) in s.bytes.iter().enumerate() {
        let n = b.swap(0, Ordering::AcqRel);
        if n > 0 {
            saturating_sub(&l.dev[d].used, n);
        }
    }
    s.pid.store(0, Ordering::Release);
    true
}

/// Reclaims the slots of processes that no longer exist; returns how many.
fn reclaim_dead(l: &Layout) -> usize {
    let me = pid();
    let mut n = 0;
    for s in l.slots.iter() {
        let p = s.pid.load(Ordering::Acquire);
        if p == 0 || p == me || p == u64::MAX || p > i32::MAX as u64 {
            continue;
        }
        // SAFETY: signal 0 only checks for existence.
        let gone = unsafe { libc::kill(p as libc::pid_t, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone && empty_slot(l, s, p) {
            n += 1;
        }
    }
    n
}

/// At exit: the process's memory goes back to the devices.
pub fn release_process() {
    let Some(Some(l)) = SHARED.get() else {
        return;
    };
    let i = MY_SLOT.load(Ordering::Acquire);
    if i < NSLOTS {
        empty_slot(l, &l.slots[i], pid());
        MY_SLOT.store(NO_SLOT, Ordering::Release);
    }
}

/// In a forked child: it holds no device memory of its own yet.
pub fn after_fork_child() {
    MY_SLOT.store(UNCLAIMED, Ordering::Release);
    if !matches!(SHARED.get(), Some(Some(_))) {
        for c in LOCAL.dev.iter() {
            c.used.store(0, Ordering::Release);
            c.peak.store(0, Ordering::Release);
        }
    }
}

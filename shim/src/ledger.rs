//! The cap's ledger: per-device byte counts shared by every process of a job, in a file each one maps.
//!
//! Admission is a compare-and-swap on the job's count for the device, made before the driver is called and
//! undone if the driver refuses, so under any interleaving of threads and processes the counted bytes never pass
//! the cap. Each process also counts its own share in a slot of its own, so that the share can be given back
//! when the process dies.
//!
//! Liveness comes from the kernel, never from a pid in the file: a process owns its slot by holding an
//! open-file-description lock (`F_OFD_SETLK`) on one byte of the file, which the kernel drops when the process
//! dies, however it dies. Whoever later takes that lock (a process claiming a slot, or one about to be refused)
//! gives the dead owner's share back. No lock in the file is ever waited on.
//!
//! File layout (little endian, all counters 64-bit atomics; docs/CAP.md):
//!   0      magic "VTLEDGR1" (u64), then padding to 64 bytes
//!   64     job bytes in use, per device      [MAX_DEVICES]
//!   320    per slot: its bytes, per device   [MAX_SLOTS][MAX_DEVICES]
//!   slot i is owned by whoever holds the write lock on byte LOCK_BASE + i.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

pub const MAX_DEVICES: usize = 32;
pub const MAX_SLOTS: usize = 1024;
const MAGIC: u64 = u64::from_le_bytes(*b"VTLEDGR1");
/// Lock bytes sit far past the data, so they never overlap anything that is read.
const LOCK_BASE: i64 = 1 << 40;

#[repr(C)]
pub struct Shared {
    magic: AtomicU64,
    _pad: [u64; 7],
    used: [AtomicU64; MAX_DEVICES],
    slots: [[AtomicU64; MAX_DEVICES]; MAX_SLOTS],
}

pub const FILE_SIZE: usize = std::mem::size_of::<Shared>();
// `run` reserves the file's bytes before the job starts, by format's figure: the two must agree.
const _: () = assert!(FILE_SIZE == vramtrace_format::cap::LEDGER_BYTES);

/// This process's view of the ledger.
pub struct Ledger {
    shared: &'static Shared,
    /// The file, when shared (-1 for a process-local ledger).
    fd: i32,
    slot: usize,
}

/// What admission decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Counted; the caller calls the driver, then keeps or gives back the bytes.
    Yes,
    /// Would pass the cap: `used` bytes were in use.
    No { used: u64 },
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("cannot open the cap ledger {path}: {err}")]
    Open { path: String, err: std::io::Error },
    #[error("{0} is not a vramtrace cap ledger")]
    Foreign(String),
    #[error("every one of the ledger's {MAX_SLOTS} process slots is taken")]
    Full,
    #[error("cannot reserve the cap ledger {path}'s {FILE_SIZE} bytes: {err}")]
    NoSpace { path: String, err: std::io::Error },
}

/// Whether the open file is a regular file that holds a ledger, or is still empty where the magic goes.
fn is_ledger_or_empty(fd: i32) -> bool {
    // SAFETY: `stat` is integers and padding: all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a local the call writes; a bad `fd` only makes it fail.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return false;
    }
    if st.st_size == 0 {
        return true;
    }
    let mut magic = [0u8; 8];
    // SAFETY: `magic` is a local buffer of the 8 bytes the call may write.
    let n = unsafe { libc::pread(fd, magic.as_mut_ptr().cast(), 8, 0) };
    let m = u64::from_le_bytes(magic);
    n >= 0 && (m == MAGIC || m == 0) && (n == 8 || magic[..n as usize].iter().all(|b| *b == 0))
}

fn lock(fd: i32, slot: usize, kind: libc::c_short) -> bool {
    // SAFETY: `flock` is integers: all zeroes is valid (and `l_pid` must be 0 for an OFD lock).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = LOCK_BASE + slot as i64;
    fl.l_len = 1;
    // SAFETY: F_OFD_SETLK reads and writes the `flock` it is given: `fl` is a local; a bad `fd` only fails.
    unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &mut fl) == 0 }
}

impl Ledger {
    /// Maps the job's ledger at `path` (creating it if no process has yet) and claims a slot.
    pub fn open_shared(path: &Path) -> Result<Ledger, LedgerError> {
        let open_err = |err| LedgerError::Open {
            path: path.display().to_string(),
            err,
        };
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| open_err(std::io::ErrorKind::InvalidInput.into()))?;
        // Never through a symbolic link: the ledger is the job's own file in its private directory.
        // SAFETY: `c` is a NUL-terminated path that outlives every call of the closure; open(2) takes a mode with
        // O_CREAT, which is passed.
        let open = |extra| unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW | extra,
                0o600,
            )
        };
        // Two descriptions of the file: one for the mapping, one for the slot lock. A mapping keeps its file's
        // description alive, so if the lock sat on the mapped one, a forked child's inherited mapping would
        // keep a dead parent's lock held.
        let map_fd = open(libc::O_CREAT);
        if map_fd < 0 {
            return Err(open_err(std::io::Error::last_os_error()));
        }
        let closing = |e: LedgerError| {
            // SAFETY: `map_fd` was opened above and is used by nothing else; each error path closes it once and
            // returns.
            unsafe { libc::close(map_fd) };
            e
        };
        // What is there must be a ledger, or a regular file still empty (another process of the job is making
        // it): anything else is never grown or written.
        if !is_ledger_or_empty(map_fd) {
            return Err(closing(LedgerError::Foreign(path.display().to_string())));
        }
        // Reserve every byte now. A mapping over holes raises SIGBUS at the first write the filesystem cannot
        // back (a full disk), which would kill the host at its next allocation; a failure here is a clear
        // fallback instead. Reserving what another process already reserved changes nothing.
        // SAFETY: plain integer arguments on our own descriptor; no memory passed.
        let rc = unsafe { libc::posix_fallocate(map_fd, 0, FILE_SIZE as libc::off_t) };
        if rc != 0 {
            return Err(closing(LedgerError::NoSpace {
                path: path.display().to_string(),
                err: std::io::Error::from_raw_os_error(rc),
            }));
        }
        // SAFETY: a new mapping where the kernel chooses (null hint): it replaces nothing. The file holds at
        // least FILE_SIZE bytes, all reserved (posix_fallocate above), so no page of it faults.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map_fd,
                0,
            )
        };
        let err = std::io::Error::last_os_error();
        // SAFETY: `map_fd` is ours and closed once, here; a mapping keeps its file description alive without it.
        unsafe { libc::close(map_fd) };
        if p == libc::MAP_FAILED {
            return Err(open_err(err));
        }
        // SAFETY: `p` maps FILE_SIZE = size_of::<Shared>() readable, writable bytes, page-aligned; every bit
        // pattern is a valid `Shared` (atomics and integers); the mapping is never unmapped once a `Ledger` holds
        // it (only on the error paths below, before `shared` escapes), so `'static` holds. The other processes of
        // the job touch it only through the same atomics. (Anyone who may write the file could truncate it: a
        // SIGBUS here, not UB in this process's reading; the ledger lives in the job's private directory.)
        let shared: &'static Shared = unsafe { &*(p as *const Shared) };
        let _ = shared
            .magic
            .compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire);
        if shared.magic.load(Ordering::Acquire) != MAGIC {
            // SAFETY: our own mapping from above; `shared` is not used again (this returns).
            unsafe { libc::munmap(p, FILE_SIZE) };
            return Err(LedgerError::Foreign(path.display().to_string()));
        }
        let fd = crate::fds::high_fd(open(0));
        if fd < 0 {
            // SAFETY: our own mapping from above; `shared` is not used again (this returns).
            unsafe { libc::munmap(p, FILE_SIZE) };
            return Err(open_err(std::io::Error::last_os_error()));
        }
        let fail = |e| {
            // SAFETY: `fd` is the lock descriptor opened above, used by nothing else; `fail` runs once, on the
            // way out.
            unsafe { libc::close(fd) };
            e
        };
        // Start the search at a place that depends on the pid, so many processes starting at once spread out.
        let start = std::process::id() as usize % MAX_SLOTS;
        for k in 0..MAX_SLOTS {
            let slot = (start + k) % MAX_SLOTS;
            if lock(fd, slot, libc::F_WRLCK as libc::c_short) {
                let ledger = Ledger { shared, fd, slot };
                // A previous owner died without giving its share back: give it back now.
                ledger.give_back_slot(slot);
                return Ok(ledger);
            }
        }
        // SAFETY: our own mapping from above; no `Ledger` was made from it, and `shared` is not used again.
        unsafe { libc::munmap(p, FILE_SIZE) };
        Err(fail(LedgerError::Full))
    }

    /// A ledger for this process alone (the shim preloaded without `vramtrace run` and no ledger path).
    pub fn private() -> Ledger {
        // SAFETY: a fresh anonymous private mapping where the kernel chooses (null hint, no fd): it replaces
        // nothing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        let shared: &'static Shared = if p == libc::MAP_FAILED {
            // No memory for 256 KiB: fall back to a leaked heap copy (zeroed atomics are valid).
            // SAFETY: all zeroes is a valid `Shared` (atomics and integers).
            Box::leak(unsafe { Box::<Shared>::new_zeroed().assume_init() })
        } else {
            // SAFETY: `p` maps FILE_SIZE = size_of::<Shared>() zeroed bytes, page-aligned, private to this
            // process and never unmapped; zeroes are a valid `Shared`.
            unsafe { &*(p as *const Shared) }
        };
        Ledger {
            shared,
            fd: -1,
            slot: 0,
        }
    }

    /// The file descriptor (to close in a forked child, whose copy must not keep the parent's lock alive).
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// The job's bytes in use on `dev`.
    pub fn used(&self, dev: usize) -> u64 {
        self.shared.used[dev].load(Ordering::Acquire)
    }

    /// This process's bytes in use on `dev`.
    pub fn own(&self, dev: usize) -> u64 {
        self.shared.slots[self.slot][dev].load(Ordering::Acquire)
    }

    /// Counts `size` bytes on `dev` if that keeps the job within `cap`; with `force`, counts them regardless
    /// (warn mode). Dead processes' shares are given back before a refusal.
    pub fn admit(&self, dev: usize, size: u64, cap: u64, force: bool) -> Admit {
        let used = &self.shared.used[dev];
        let mut reclaimed = false;
        loop {
            let cur = used.load(Ordering::Acquire);
            let next = cur.saturating_add(size);
            if next > cap && !force {
                if !reclaimed && self.fd >= 0 && self.reclaim_dead() {
                    reclaimed = true;
                    continue;
                }
                return Admit::No { used: cur };
            }
            if used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                // Counted in the job first, then in our slot: a death between the two can only over-count,
                // never let the job past its cap.
                self.shared.slots[self.slot][dev].fetch_add(size, Ordering::AcqRel);
                return Admit::Yes;
            }
        }
    }

    /// Gives back `size` bytes on `dev`: the driver refused the request, or the memory was freed.
    pub fn release(&self, dev: usize, size: u64) {
        // Our slot first: a death between the two then leaves the job over-counted, never under.
        sub_saturating(&self.shared.slots[self.slot][dev], size);
        sub_saturating(&self.shared.used[dev], size);
    }

    /// Gives back the share of every slot whose owner has died. True if anything came back.
    pub fn reclaim_dead(&self) -> bool {
        let mut any = false;
        for slot in 0..MAX_SLOTS {
            if slot == self.slot
                || self.shared.slots[slot]
                    .iter()
                    .all(|c| c.load(Ordering::Relaxed) == 0)
            {
                continue;
            }
            // Taking the lock proves the owner is gone; then let go so the slot can be claimed again.
            if lock(self.fd, slot, libc::F_WRLCK as libc::c_short) {
                any |= self.give_back_slot(slot);
                lock(self.fd, slot, libc::F_UNLCK as libc::c_short);
            }
        }
        any
    }

    fn give_back_slot(&self, slot: usize) -> bool {
        let mut any = false;
        for dev in 0..MAX_DEVICES {
            let v = self.shared.slots[slot][dev].swap(0, Ordering::AcqRel);
            if v > 0 {
                sub_saturating(&self.shared.used[dev], v);
                any = true;
            }
        }
        any
    }
}

fn sub_saturating(a: &AtomicU64, v: u64) {
    let _ = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
        Some(cur.saturating_sub(v))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("vt-ledger-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn refuses_at_the_boundary_and_gives_back() {
        let l = Ledger::private();
        assert_eq!(l.admit(0, 60, 100, false), Admit::Yes);
        assert_eq!(l.admit(0, 40, 100, false), Admit::Yes);
        assert_eq!(l.admit(0, 1, 100, false), Admit::No { used: 100 });
        l.release(0, 40);
        assert_eq!(l.used(0), 60);
        assert_eq!(l.admit(0, 41, 100, false), Admit::No { used: 60 });
        assert_eq!(l.admit(0, 41, 100, true), Admit::Yes);
        assert_eq!(l.used(0), 101);
        assert_eq!(l.used(1), 0);
    }

    #[test]
    fn two_mappings_of_one_file_share_the_count_and_own_different_slots() {
        let path = temp("share");
        let a = Ledger::open_shared(&path).unwrap();
        let b = Ledger::open_shared(&path).unwrap();
        assert_ne!(a.slot, b.slot);
        assert_eq!(a.admit(2, 70, 100, false), Admit::Yes);
        assert_eq!(b.admit(2, 31, 100, false), Admit::No { used: 70 });
        assert_eq!(b.admit(2, 30, 100, false), Admit::Yes);
        // b is alive (its open file description holds its lock): nothing of b's can be taken.
        assert!(!a.reclaim_dead());
        assert_eq!(a.used(2), 100);
        // b "dies": the kernel drops its lock with its last descriptor, and b's 30 bytes come back.
        // SAFETY: `b`'s lock descriptor, closed once to play its death; `b` is not used again (`Ledger` has no
        // `Drop`).
        unsafe { libc::close(b.fd) };
        assert_eq!(a.admit(2, 30, 100, false), Admit::Yes);
        assert_eq!(a.used(2), 100);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn foreign_files_and_links_are_never_touched() {
        // Someone else's file: refused, and left exactly as it was (not grown, not written).
        let path = temp("foreign");
        std::fs::write(&path, b"precious data, not a ledger").unwrap();
        assert!(matches!(
            Ledger::open_shared(&path),
            Err(LedgerError::Foreign(_))
        ));
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"precious data, not a ledger"
        );
        // A symbolic link, even to a ledger: refused.
        let real = temp("real");
        Ledger::open_shared(&real).unwrap();
        let link = temp("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(Ledger::open_shared(&link).is_err());
        // A directory: refused.
        let dir = temp("dir");
        std::fs::create_dir_all(&dir).unwrap();
        assert!(Ledger::open_shared(&dir).is_err());
        for p in [&path, &real, &link] {
            let _ = std::fs::remove_file(p);
        }
        let _ = std::fs::remove_dir(&dir);
    }

    #[test]
    fn the_file_is_reserved_whole_and_the_lock_sits_high() {
        let path = temp("reserved");
        let l = Ledger::open_shared(&path).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert!(meta.len() >= FILE_SIZE as u64);
        // Every byte backed by the filesystem: no holes for a full disk to turn into SIGBUS.
        use std::os::unix::fs::MetadataExt;
        assert!(
            meta.blocks() * 512 >= FILE_SIZE as u64,
            "{} blocks",
            meta.blocks()
        );
        assert!(l.fd >= 3);
        // SAFETY: `rlimit` is two integers: all zeroes is valid.
        let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: `lim` is a local the call writes.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
        if lim.rlim_cur >= 2 * crate::fds::HIGH_FD as u64 {
            assert!(l.fd >= crate::fds::HIGH_FD, "lock descriptor {}", l.fd);
        }
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn many_threads_never_pass_the_cap() {
        let l = std::sync::Arc::new(Ledger::private());
        let peak = std::sync::Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (l, peak) = (l.clone(), peak.clone());
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        if l.admit(0, 7, 100, false) == Admit::Yes {
                            peak.fetch_max(l.used(0), Ordering::Relaxed);
                            l.release(0, 7);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(peak.load(Ordering::Relaxed) <= 100);
        assert_eq!(l.used(0), 0);
    }
}

//! What a wait needs, found ahead of it: the real wait functions (glibc's `dlsym(RTLD_NEXT)`, all four at once)
//! and the collector's address. Found at the process's first tracked call (`prepare`, from the recorder's
//! start), because a wait may run in a signal handler, where the loader's lock that `dlsym` takes could be held
//! by the very code the signal interrupted. Until then a wait is the system call itself (reap.rs).

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};

#[derive(Clone, Copy)]
pub(crate) enum Real {
    Wait4,
    Waitpid,
    Wait,
    Waitid,
}

const NAMES: [&CStr; 4] = [c"wait4", c"waitpid", c"wait", c"waitid"];
static REAL: [AtomicPtr<c_void>; 4] = [const { AtomicPtr::new(null_mut()) }; 4];

/// Finds the real functions and the collector's address while nothing is at stake (the first tracked call), so
/// that a wait in a signal handler finds them ready.
pub(crate) fn prepare() {
    resolve();
    let _ = collector_addr();
}

/// Looks up the real functions not found yet: glibc's `dlsym`, called from this library with `RTLD_NEXT`, gives
/// the next definition after the shim (libc's, or another interposer's preloaded after us). Threads racing here
/// store the same addresses. The lookup takes the loader's lock, which makes it the one step here that is not
/// async-signal-safe: only `prepare` does it, at the first tracked call, never a wait.
#[cold]
#[inline(never)]
fn resolve() {
    let Some(dlsym) = crate::driver::glibc_dlsym() else {
        return;
    };
    for f in [Real::Wait4, Real::Waitpid, Real::Wait, Real::Waitid] {
        let slot = &REAL[f as usize];
        if slot.load(Ordering::Acquire).is_null() {
            // SAFETY: `dlsym` is glibc's own (`glibc_dlsym`); the names are NUL-terminated literals, and
            // RTLD_NEXT is valid from inside this library.
            let p = unsafe { dlsym(libc::RTLD_NEXT, NAMES[f as usize].as_ptr()) };
            // Never our own export (exports.rs) in place of the real function.
            if !p.is_null() && !crate::driver::in_this_library(p) {
                slot.store(p, Ordering::Release);
            }
        }
    }
}

/// The real `f` if it was found (`prepare`, at the first tracked call), else null: the system call stands in
/// for it. Never looked up here: a wait may run in a signal handler (bash reaps in its SIGCHLD handler), where
/// the loader's lock that `dlsym` takes could be held by the very code the signal interrupted. So a process
/// that never makes a tracked call (a shell, torchrun's agent) always waits through the system call, as
/// glibc's own functions do (they are `wait4` and `waitid` underneath), less their cancellation point.
#[inline]
pub(crate) fn real(f: Real) -> *mut c_void {
    REAL[f as usize].load(Ordering::Acquire)
}

// ---- where the collector listens ---------------------------------------------------------------------------

/// `sun_path`'s size.
const PATH_ROOM: usize = 108;

/// `VRAMTRACE_SOCKET` as the first walk of the environment found it, for later reports to copy.
struct PathCache {
    state: AtomicU8,
    len: AtomicUsize,
    bytes: UnsafeCell<[u8; PATH_ROOM]>,
}

// SAFETY: `bytes` is written once, by the one caller that moved `state` from UNKNOWN to FILLING, and read only
// after `state` says PRESENT (release/acquire).
unsafe impl Sync for PathCache {}

const UNKNOWN: u8 = 0;
const FILLING: u8 = 1;
const PRESENT: u8 = 2;
const ABSENT: u8 = 3;

static CACHE: PathCache = PathCache {
    state: AtomicU8::new(UNKNOWN),
    len: AtomicUsize::new(0),
    bytes: UnsafeCell::new([0; PATH_ROOM]),
};

/// The collector's address: the shim's settings if they were read, else `VRAMTRACE_SOCKET` from the
/// environment, walked without allocating (std's `getenv` wrappers allocate) and kept for the next report.
/// `None`: not under vramtrace (unset, empty, or too long for a socket address).
pub(crate) fn collector_addr() -> Option<libc::sockaddr_un> {
    if let Some(s) = crate::settings::peek() {
        use std::os::unix::ffi::OsStrExt;
        return sockaddr(s.socket.as_ref()?.as_bytes());
    }
    match CACHE.state.load(Ordering::Acquire) {
        PRESENT => {
            let len = CACHE.len.load(Ordering::Relaxed);
            // SAFETY: written before PRESENT was stored, never again.
            let bytes = unsafe { &*CACHE.bytes.get() };
            sockaddr(bytes.get(..len)?)
        }
        ABSENT => None,
        UNKNOWN
            if CACHE
                .state
                .compare_exchange(UNKNOWN, FILLING, Ordering::AcqRel, Ordering::Acquire)
                .is_ok() =>
        {
            let found = env_socket().filter(|p| sockaddr(p).is_some());
            let done = match found {
                Some(p) => {
                    // SAFETY: only this caller writes, and nobody reads before PRESENT.
                    let bytes = unsafe { &mut *CACHE.bytes.get() };
                    if let Some(room) = bytes.get_mut(..p.len()) {
                        room.copy_from_slice(p);
                    }
                    CACHE.len.store(p.len(), Ordering::Relaxed);
                    PRESENT
                }
                None => ABSENT,
            };
            CACHE.state.store(done, Ordering::Release);
            sockaddr(found?)
        }
        // Another thread is filling the cache, or this handler interrupted the very thread that is (or a fork
        // left it half-filled): walk the environment ourselves.
        _ => sockaddr(env_socket()?),
    }
}

/// A Unix socket address for `path`; `None` when it is empty or does not fit.
fn sockaddr(path: &[u8]) -> Option<libc::sockaddr_un> {
    // SAFETY: `sockaddr_un` is integers and a byte array: all zeroes is valid (and an empty path).
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if path.is_empty() || path.len() >= a.sun_path.len() {
        return None;
    }
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in a.sun_path.iter_mut().zip(path) {
        *d = *s as c_char;
    }
    Some(a)
}

/// `VRAMTRACE_SOCKET`'s value, read straight from `environ` (the first definition, as `getenv` finds it).
fn env_socket() -> Option<&'static [u8]> {
    const KEY: &[u8] = b"VRAMTRACE_SOCKET=";
    // SAFETY: `environ` is null or a null-terminated array of NUL-terminated strings, walked up to its null.
    // Like getenv(3), this races with a `setenv`/`putenv` on another thread (which may move the array), and the
    // `'static` it returns trusts that the entry's string stays: true of the initial environment and of glibc's
    // `setenv` copies (never freed), not of a `putenv` string its owner later frees. Every caller copies the
    // value at once (`sockaddr`, the cache).
    unsafe {
        let mut p = libc::environ as *const *const c_char;
        if p.is_null() {
            return None;
        }
        loop {
            let e = *p;
            if e.is_null() {
                return None;
            }
            let entry = CStr::from_ptr(e).to_bytes();
            if let Some(v) = entry.strip_prefix(KEY) {
                return Some(v);
            }
            p = p.add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths_that_fit_a_socket_address_and_those_that_do_not() {
        let a = sockaddr(b"/tmp/vt.sock").unwrap();
        assert_eq!(a.sun_family, libc::AF_UNIX as libc::sa_family_t);
        assert_eq!(
            a.sun_path[..12]
                .iter()
                .map(|c| *c as u8)
                .collect::<Vec<_>>(),
            b"/tmp/vt.sock"
        );
        assert_eq!(a.sun_path[12], 0);
        assert!(sockaddr(b"").is_none());
        assert!(sockaddr(&[b'x'; PATH_ROOM]).is_none());
        assert!(sockaddr(&[b'x'; PATH_ROOM - 1]).is_some());
    }
}

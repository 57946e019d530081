//! When each process's connection closed, to the moment: one thread waits on every connection for its peer's
//! hang-up (epoll), and stamps the time.
//!
//! Why: a process that dies without a goodbye (killed, `_exit`) has its memory released by the driver as the
//! kernel closes its descriptors, the socket to us among them. Its receiver notices only at its next drain (it
//! sleeps on the ring up to 50 ms), and a process started right after may have allocated by then: its end, and
//! the release of what it held, belong at the hang-up, or the report sums two processes that never overlapped.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread;

use crate::names::ticks::mono_ns;

/// The hang-up time of one connection (CLOCK_MONOTONIC ns), 0 until it hung up.
pub(crate) type ClosedAt = Arc<AtomicU64>;

/// The watcher: an epoll set of the connections' sockets, and what each one's hang-up stamps.
pub(crate) struct Hangups {
    epoll: OwnedFd,
    /// Weak: a connection that ended another way (its socket closed by us) leaves nothing behind for long.
    waiting: Mutex<HashMap<u64, Weak<AtomicU64>>>,
    next: AtomicU64,
}

impl Hangups {
    /// Starts the watcher thread; None if epoll or the thread cannot be had (ends are then stamped when noticed).
    pub(crate) fn start() -> Option<Arc<Hangups>> {
        // SAFETY: integer flags only; a failure returns -1, checked below.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        let h = Arc::new(Hangups {
            // SAFETY: `fd` was just returned by epoll_create1 (checked non-negative) and nothing else owns it.
            epoll: unsafe { OwnedFd::from_raw_fd(fd) },
            waiting: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        });
        let w = h.clone();
        thread::Builder::new()
            .name("vramtrace-hangup".into())
            .spawn(move || w.watch())
            .ok()?;
        Some(h)
    }

    /// Watches `fd` (a connected socket) for its peer's hang-up. The registration goes when the socket is closed.
    pub(crate) fn watch_fd(&self, fd: RawFd) -> ClosedAt {
        let at = ClosedAt::default();
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut w) = self.waiting.lock() {
            if w.len().is_power_of_two() {
                w.retain(|_, a| a.strong_count() > 0);
            }
            w.insert(key, Arc::downgrade(&at));
        }
        let mut ev = libc::epoll_event {
            // Only the hang-up: data arriving is the receiver's business.
            events: (libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLONESHOT) as u32,
            u64: key,
        };
        let rc =
            // SAFETY: both descriptors are open (the epoll ours, `fd` the caller's), `ev` is a local event the call
            // reads.
            unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if rc != 0 {
            if let Ok(mut w) = self.waiting.lock() {
                w.remove(&key);
            }
        }
        at
    }

    fn watch(&self) {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
        loop {
            // SAFETY: `evs` is a local array of `evs.len()` events, as the call is told; the epoll descriptor is ours.
            let n = unsafe {
                libc::epoll_wait(
                    self.epoll.as_raw_fd(),
                    evs.as_mut_ptr(),
                    evs.len() as i32,
                    -1,
                )
            };
            if n < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            let now = mono_ns();
            let Ok(mut w) = self.waiting.lock() else {
                return;
            };
            for ev in &evs[..n as usize] {
                if let Some(at) = w.remove(&{ ev.u64 }).and_then(|a| a.upgrade()) {
                    at.store(now, Ordering::Release);
                }
            }
        }
    }
}

/// The time `at` stamped, if its connection hung up.
pub(crate) fn closed_at(at: &Option<ClosedAt>) -> Option<u64> {
    at.as_ref()
        .map(|a| a.load(Ordering::Acquire))
        .filter(|&t| t != 0)
}

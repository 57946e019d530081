//! One way to build shim state lazily that a `fork` in any state leaves usable.
//!
//! The shim builds its state (settings, the cap, the recorder) at the first tracked call, never in a
//! constructor. A `fork` can happen at any moment of that, from another thread: the child has only the forking
//! thread, so state that was being built when the fork happened will never be finished by anyone. `std`'s
//! `OnceLock` would leave the child blocked forever on it; a hand-rolled "starting" flag leaves it spinning.
//!
//! [`Lazy`] tags the "being built" state with the fork generation it began in. Every `fork` bumps the generation
//! in the child (a `pthread_atfork` handler registered before anything is first built), so a child that finds
//! state being built by a generation other than its own knows its builder is gone, and builds afresh. State
//! built completely before the fork is kept (settings) or forgotten (the recorder and the cap, whose threads and
//! ledger slots are the parent's) by the owner's own atfork code calling [`Lazy::forget`].
//!
//! The fast path is one acquire load.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// Bumped in every forked child (the generation a child lives in).
static FORK_GEN: AtomicU32 = AtomicU32::new(0);
static HANDLER: AtomicBool = AtomicBool::new(false);

/// Yields before a waiting first caller starts to nap.
const SPINS: u32 = 200;
const UNINIT: u64 = 0;
const STARTING: u64 = 1;
const READY: u64 = 2;
const OFF: u64 = 3;

extern "C" fn bump_in_child() {
    FORK_GEN.fetch_add(1, Ordering::AcqRel);
}

/// The fork generation of this process: 0 in the original, one more in each forked descendant.
pub fn fork_generation() -> u32 {
    FORK_GEN.load(Ordering::Acquire)
}

/// Registers the generation counter's atfork handler, once per process image (children inherit it).
fn ensure_handler() {
    if !HANDLER.swap(true, Ordering::AcqRel) {
        // SAFETY: registers a plain `extern "C"` function of this library that does one atomic add
        // (async-signal-safe, as a handler run in a forked child must be); `HANDLER` makes it once per process
        // image.
        unsafe { libc::pthread_atfork(None, None, Some(bump_in_child)) };
    }
}

/// A value built at most once per process (per fork generation when forgotten), leaked for `'static` use.
pub struct Lazy<T: 'static> {
    /// `(generation << 8) | state`.
    state: AtomicU64,
    value: AtomicPtr<T>,
}

impl<T: 'static> Default for Lazy<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: 'static> Lazy<T> {
    pub const fn new() -> Self {
        Lazy {
            state: AtomicU64::new(UNINIT),
            value: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The value if it was built, without building it.
    #[inline]
    pub fn peek(&self) -> Option<&'static T> {
        let p = self.value.load(Ordering::Acquire);
        // SAFETY: a non-null `value` is a `Box` leaked by `init_slow` and published with release (this load is
        // acquire): fully built, and never freed (`forget` leaks it), so `'static` holds. Sharing it relies on
        // `Lazy` being used for `Sync` values only: `Lazy<T>` is `Sync` for every `T` (its fields are atomics)
        // and does not ask for `T: Sync`; every `T` in the tree is `Sync`.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// The value, built by `init` the first time (`None`: nothing to build, remembered as such). Concurrent
    /// first callers wait for the one that builds (usually microseconds); a builder lost to a `fork` is
    /// replaced.
    #[inline]
    pub fn get_or_init(&self, init: impl FnOnce() -> Option<T>) -> Option<&'static T> {
        if let Some(v) = self.peek() {
            return Some(v);
        }
        if self.state.load(Ordering::Acquire) & 0xff == OFF {
            return None;
        }
        self.init_slow(init)
    }

    #[cold]
    fn init_slow(&self, init: impl FnOnce() -> Option<T>) -> Option<&'static T> {
        ensure_handler();
        let mut init = Some(init);
        let mut waits = 0u32;
        loop {
            let cur = self.state.load(Ordering::Acquire);
            let gen = fork_generation() as u64;
            let starting_here = (gen << 8) | STARTING;
            match cur & 0xff {
                READY => return self.peek(),
                OFF => return None,
                // The builder usually takes microseconds; it may wait for the collector for hundreds of ms
                // (a full backlog, a ring the kernel will not pass yet): then nap rather than spin a core.
                STARTING if cur >> 8 == gen => {
                    waits += 1;
                    if waits < SPINS {
                        std::thread::yield_now()
                    } else {
                        std::thread::sleep(std::time::Duration::from_micros(200))
                    }
                }
                // UNINIT, or STARTING in a generation before a fork: its builder is not in this process.
                _ => {
                    if self
                        .state
                        .compare_exchange(cur, starting_here, Ordering::AcqRel, Ordering::Acquire)
                        .is_err()
                    {
                        continue;
                    }
                    let built = init.take().and_then(|f| f());
                    let p = built.map_or(std::ptr::null_mut(), |v| Box::into_raw(Box::new(v)));
                    self.value.store(p, Ordering::Release);
                    let done = if p.is_null() { OFF } else { READY };
                    // A fork during `init` left a child that will see an older generation and rebuild; here
                    // the state is ours to finish.
                    self.state.store((gen << 8) | done, Ordering::Release);
                    return self.peek();
                }
            }
        }
    }

    /// Forgets the value (in a forked child: the parent's is the parent's; it is leaked, never dropped, since
    /// another thread of the parent may have been using it). The next call builds afresh. Atomic stores only:
    /// safe in an atfork handler.
    pub fn forget(&self) {
        self.value.store(std::ptr::null_mut(), Ordering::Release);
        self.state.store(UNINIT, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn builds_once_and_remembers_none() {
        static L: Lazy<u32> = Lazy::new();
        static BUILT: AtomicUsize = AtomicUsize::new(0);
        let threads: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(|| {
                    *L.get_or_init(|| {
                        BUILT.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        Some(7)
                    })
                    .unwrap()
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), 7);
        }
        assert_eq!(BUILT.load(Ordering::SeqCst), 1);
        static N: Lazy<u32> = Lazy::new();
        assert!(N.get_or_init(|| None).is_none());
        assert!(N.get_or_init(|| Some(1)).is_none(), "None is remembered");
        N.forget();
        assert_eq!(N.get_or_init(|| Some(2)), Some(&2));
    }

    #[test]
    fn first_callers_waiting_on_a_slow_builder_nap_rather_than_spin() {
        // A builder held up for 150 ms (the collector's backlog full): a caller waiting for it uses little CPU.
        static L: Lazy<u32> = Lazy::new();
        let builder = std::thread::spawn(|| {
            *L.get_or_init(|| {
                std::thread::sleep(std::time::Duration::from_millis(150));
                Some(7)
            })
            .unwrap()
        });
        while L.state.load(Ordering::Acquire) & 0xff != STARTING {
            std::thread::yield_now();
        }
        let waiter = std::thread::spawn(|| {
            let v = *L.get_or_init(|| Some(8)).unwrap();
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `ts` is a local timespec the call writes.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
            (v, ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
        });
        let (v, cpu_ns) = waiter.join().unwrap();
        assert_eq!((builder.join().unwrap(), v), (7, 7));
        // Spinning on `yield_now` for the whole wait takes most of it in CPU time (over 100 ms on an idle core).
        assert!(cpu_ns < 25_000_000, "the waiter used {cpu_ns} ns of CPU");
    }

    #[test]
    fn a_builder_of_an_earlier_generation_is_replaced() {
        static L: Lazy<u32> = Lazy::new();
        // As a child finds it after a fork that happened while its parent's thread was building.
        let gen = fork_generation() as u64;
        L.state
            .store((gen.wrapping_sub(1) << 8) | STARTING, Ordering::Release);
        assert_eq!(L.get_or_init(|| Some(5)), Some(&5));
    }
}

//! Faulting the ring's pages in ahead of its writers, off the host's threads.
//!
//! The ring is a fresh memfd: each of its pages is allocated, zeroed and mapped at the first write to it, a page
//! fault every 64 events. On the 2-core VM of the benchmarks one costs about 3.4 us, 50 ns an event; on the GPU
//! host's Xeon it dominated the shim's cost. A process that records fewer events than the ring holds (most do:
//! 262,144 by default) pays it on every event. So the courier thread (`record`) populates the ring a chunk at a
//! time with `MADV_POPULATE_WRITE`, a little ahead of the writers: the pages exist and are mapped writable by
//! the time an event lands there, and only as much of the ring as the process uses is ever allocated, rounded up
//! to the lookahead (512 KiB, doubled each time the writers outrun the courier: a process that records that
//! fast fills its ring in milliseconds anyway).
//!
//! The writers' part is one load and a compare per event ([`Prefault::wanted`]); past the threshold, one asks
//! the courier (the recorder's cold path). Where the kernel lacks `MADV_POPULATE_WRITE` (before Linux 5.14), or
//! populating fails (memory short), the threshold moves out of reach and the writers fault as before: the pages
//! come in either way, and nothing a writer wrote is ever touched (populating writes no data).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use vramtrace_format::ring::{Ring, SLOT};

/// Populated at a time: 256 KiB (4,096 slots), about 160 us of the courier's time on the VM above. At 6 M
/// events/s the writers cross one in 0.7 ms.
const CHUNK_SLOTS: u64 = 4_096;
/// How far ahead of the writers the ring is kept populated at first (so a process that records a handful of
/// events holds 512 KiB of it); they ask again at half of that. Doubled each time the courier finds the
/// writers already past what it populated (it was scheduled late: on 2 busy cores, by milliseconds).
const AHEAD_SLOTS: u64 = 2 * CHUNK_SLOTS;
/// `madvise` advice, Linux 5.14 and later (the libc crate's constant is not in every version we build with).
const MADV_POPULATE_WRITE: libc::c_int = 23;
/// The threshold once nothing is left to do.
const NEVER: u64 = u64::MAX;

/// A writer whose event lands at this position or later asks for more (`NEVER`: all done, or given up). Read by
/// every event: in the shim's hot data, not in the recorder on the heap (one recorder, so one `Prefault`, per
/// process; `Prefault::new` sets it).
#[link_section = ".vramtrace.hotdata"]
static ASK_AT: AtomicU64 = AtomicU64::new(0);

pub(crate) struct Prefault {
    /// The slots' memory (first lap positions: slot `p` at `p * SLOT` bytes).
    base: usize,
    slots: u64,
    /// Slots populated from the start, `0..done`.
    done: AtomicU64,
    /// Asked and not yet done: the writers ask once.
    asked: AtomicBool,
    /// How far ahead of the asking writer the courier populates (the courier's own).
    ahead: AtomicU64,
}

impl Prefault {
    pub(crate) fn new(ring: &Ring) -> Prefault {
        let (base, len) = ring.slot_memory();
        // The first event asks.
        ASK_AT.store(0, Ordering::Relaxed);
        Prefault {
            base: base as usize,
            slots: (len / SLOT) as u64,
            done: AtomicU64::new(0),
            asked: AtomicBool::new(false),
            ahead: AtomicU64::new(AHEAD_SLOTS),
        }
    }

    /// Whether the event just published at `pos` should ask for more: the writers' whole cost.
    #[inline(always)]
    pub(crate) fn wanted(&self, pos: u64) -> bool {
        pos >= ASK_AT.load(Ordering::Relaxed)
    }

    /// Claims the asking (one writer asks at a time). False: asked already, nothing to send.
    pub(crate) fn claim(&self) -> bool {
        // Looked at first: until the courier runs, every event past the threshold comes here, and an exchange
        // each would bounce the line between the writers.
        !self.asked.load(Ordering::Relaxed) && !self.asked.swap(true, Ordering::AcqRel)
    }

    /// The ask could not be sent now (the courier's queue is full): a later event asks again.
    pub(crate) fn unclaim(&self) {
        self.asked.store(false, Ordering::Release);
    }

    /// The ask could not be delivered: no courier to do it, ever. Writers stop asking.
    pub(crate) fn abandon(&self) {
        ASK_AT.store(NEVER, Ordering::Relaxed);
    }

    /// The courier's part: populate whole chunks until the lookahead past `pos` (or the ring's end), then set
    /// the next threshold and take new asks.
    pub(crate) fn run(&self, pos: u64) {
        let mut done = self.done.load(Ordering::Relaxed);
        let mut ahead = self.ahead.load(Ordering::Relaxed);
        if done > 0 && pos > done && done < self.slots {
            // The writers got past what was populated (not the first ask, which the writers always make
            // before the courier has run): they fault pages in themselves. Further ahead from now on.
            ahead = (ahead * 2).min(self.slots);
            self.ahead.store(ahead, Ordering::Relaxed);
        }
        let want = pos.saturating_add(ahead).min(self.slots);
        let mut failed = false;
        while done < want {
            let n = CHUNK_SLOTS.min(self.slots - done);
            let at = (self.base + done as usize * SLOT) as *mut libc::c_void;
            // SAFETY: inside the ring's mapping, which is never unmapped; populating writes no data.
            if unsafe { libc::madvise(at, n as usize * SLOT, MADV_POPULATE_WRITE) } != 0 {
                crate::debug!(
                    "cannot fault the ring in ahead ({}); its writers fault it in",
                    std::io::Error::last_os_error()
                );
                failed = true;
                break;
            }
            done += n;
        }
        self.done.store(done, Ordering::Relaxed);
        let next = if failed || done >= self.slots {
            NEVER
        } else {
            done - ahead / 2
        };
        ASK_AT.store(next, Ordering::Relaxed);
        self.asked.store(false, Ordering::Release);
    }

    /// Slots populated so far.
    #[cfg(test)]
    pub(crate) fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resident_pages(base: usize, len: usize) -> usize {
        let mut v = vec![0u8; len.div_ceil(4096)];
        // SAFETY: `v` has one byte per page of `len` bytes, as mincore writes; `base` is page-aligned (a ring's
        // slots start 4096 bytes into its mapping) and [base, base + len) is mapped by the caller.
        let r = unsafe { libc::mincore(base as *mut libc::c_void, len, v.as_mut_ptr()) };
        assert_eq!(r, 0);
        v.iter().filter(|b| **b & 1 == 1).count()
    }

    #[test]
    fn populates_a_little_ahead_of_the_writers_and_no_more() {
        let slots = 1u64 << 16; // 4 MiB
        let m = crate::transport::make_ring(slots, 1, 0).unwrap();
        // SAFETY: `m.fd` is the ring's memfd, owned by this test and not used again; the mapping stays.
        unsafe { libc::close(m.fd) };
        let p = Prefault::new(&m.ring);
        let (base, len) = m.ring.slot_memory();
        assert_eq!(resident_pages(base as usize, len), 0);
        assert!(p.wanted(0));
        assert!(p.claim());
        assert!(!p.claim(), "a second writer does not ask again");
        p.run(0);
        if p.done() == 0 {
            // A kernel before 5.14: writers fault the pages in themselves, and never ask again.
            assert!(!p.wanted(slots * 4));
            return;
        }
        assert_eq!(p.done(), AHEAD_SLOTS);
        assert_eq!(
            resident_pages(base as usize, len),
            AHEAD_SLOTS as usize * SLOT / 4096
        );
        assert!(!p.wanted(AHEAD_SLOTS / 2 - 1));
        assert!(p.wanted(AHEAD_SLOTS / 2));
        assert!(p.claim());
        p.run(AHEAD_SLOTS / 2);
        assert_eq!(p.done(), AHEAD_SLOTS + CHUNK_SLOTS);
        // A writer already past what was populated (the courier was late): twice as far ahead from now on.
        assert!(p.claim());
        p.run(AHEAD_SLOTS + CHUNK_SLOTS + 10);
        let want = AHEAD_SLOTS + CHUNK_SLOTS + 10 + 2 * AHEAD_SLOTS;
        assert!(
            p.done() >= want && p.done() < want + CHUNK_SLOTS,
            "{}",
            p.done()
        );
        assert!(!p.wanted(p.done() - AHEAD_SLOTS - 1));
        assert!(p.wanted(p.done() - AHEAD_SLOTS));
        // A writer far ahead: populated to the ring's end, then nothing more is asked.
        assert!(p.claim());
        p.run(slots - 5);
        assert_eq!(p.done(), slots);
        assert_eq!(resident_pages(base as usize, len), len / 4096);
        assert!(!p.wanted(u64::MAX - 1));
    }
}

//! The shared-memory ring that carries a process's events to the collector: the shim's threads fill fixed-size
//! slots and publish each record with one atomic store; the collector maps the same memory and drains it. An
//! event is out of the process the moment the call that made it returns, so a process that `_exit`s, is
//! SIGKILLed or crashes on its next instruction loses nothing: the collector drains its ring after it is gone.
//!
//! Layout (all little-endian, native atomics; both sides are the same machine):
//!
//! ```text
//! 0      header page (4096 bytes): magic, version, slot size, slot count, the producer's pid,
//!        then one cache line each for: head (reserved by producers), tail (released by the collector),
//!        dropped (records lost to a full ring, counted where a SIGKILL cannot take the count), and the wake
//!        word (a futex the collector sleeps on)
//! 4096   slots: `slots` x 64 bytes, a power of two
//! ```
//!
//! A record is one slot (an event) or several consecutive slots (a blob: any encoded trace record, e.g. a call
//! site, the loaded objects, a note, the Python bridge's figures, goodbye). Every slot begins with its sequence
//! word: the slot's absolute position + 1, stored (release) by the producer after the rest of the record is
//! written. The collector takes a record only when its first slot's word says so; positions never repeat, so a
//! stale slot from an earlier lap never passes for a new one. A record that would cross the ring's end is
//! preceded by a padding record to the end.
//!
//! Producers reserve with a compare-and-swap on `head`, after checking against `tail` that the room is free:
//! a full ring drops the record and counts it in `dropped` (or, in lossless mode, the caller waits). No system
//! call, no lock: the only system call is an occasional futex wake when the ring passes a quarter full while the
//! collector sleeps.
//!
//! The memory is shared with another process that may die at any instruction, so the consumer trusts nothing
//! it reads: lengths are bounded by the ring, kinds are checked, and a record a dead process left half-written
//! is skipped and counted ([`Consumer::drain`] with `dead`).

mod consumer;
pub use consumer::{Consumer, Item};

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::{Api, Event};

pub const MAGIC: u64 = u64::from_le_bytes(*b"VTRING\0\0");
/// Bumped on any change of the layout: a collector refuses a ring of another version (the shim then records
/// nothing rather than be misread).
pub const VERSION: u32 = 4;
pub const SLOT: usize = 64;
pub const HEADER: usize = 4096;
/// Bytes of a blob carried by each of its slots.
pub const BLOB_PER_SLOT: usize = SLOT - 16;
/// The default ring: 262,144 slots (16 MiB), what a process produces in about 50 ms at 5 M events/s. The
/// collector drains at least every 10 ms, and at once when a ring passes a quarter full; the rest is slack for a
/// collector that is descheduled on a busy machine (at 4 MiB, 2 of 7 runs at 5.8 M events/s on a 2-core VM
/// dropped up to 0.14% while a compiler ran beside them). Pages are allocated only as the ring fills (the shim
/// faults them in a little ahead of its writers): a process that records 1,000 events uses 512 KiB of it.
pub const DEFAULT_SLOTS: u64 = 1 << 18;
pub const MIN_SLOTS: u64 = 1 << 10;
pub const MAX_SLOTS: u64 = 1 << 24;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_SLOT_SIZE: usize = 12;
const OFF_SLOTS: usize = 16;
const OFF_PID: usize = 24;
const OFF_FLAGS: usize = 28;
/// The head word: the position of the next slot to reserve (low 48 bits). The high 16 bits are zero; a reader
/// masks them (the collector of 2026-11-22 moved a generation there when it promised).
const OFF_HEAD: usize = 64;
const POS_BITS: u32 = 48;
const POS: u64 = (1 << POS_BITS) - 1;
const OFF_TAIL: usize = 128;
const OFF_DROPPED: usize = 192;
const OFF_WAKE: usize = 256;
const OFF_SLEEPING: usize = 260;
/// Where blobs are being written: `INTENTS` pairs of words. The first is 0 (free), `CLAIMED`, or the position of
/// the first slot of a blob its writer is reserving or writing, plus one; the second, the blob's slots. A record
/// a dead process left torn at a position one of them names was a blob (the shim's own records, the bridge's),
/// not an event.
const OFF_INTENTS: usize = 384;
const INTENTS: usize = 8;
const CLAIMED: u64 = u64::MAX;

/// Header flag: the producer waits for room instead of dropping (`--lossless`).
pub const FLAG_LOSSLESS: u32 = 1;
/// Header flag: events carry the time-stamp counter's ticks, which the collector converts to CLOCK_MONOTONIC
/// ns ([`crate::ticks`]); without it, CLOCK_MONOTONIC ns. Blobs always carry ns.
pub const FLAG_TICKS: u32 = 2;

const KIND_EVENT: u8 = 1;
const KIND_BLOB: u8 = 2;
const KIND_PAD: u8 = 3;
const KIND_CONT: u8 = 4;

/// Slots that events and ordinary records leave free: the process's goodbye always has room.
const KEEP_FOR_LAST: u64 = 4;

/// The mapping's size for `slots` slots.
pub fn bytes_for(slots: u64) -> usize {
    HEADER + slots as usize * SLOT
}

/// The slot count for a requested ring size in bytes: a power of two, within bounds.
pub fn slots_for_bytes(bytes: u64) -> u64 {
    let want = (bytes.saturating_sub(HEADER as u64) / SLOT as u64).max(1);
    let p = if want.is_power_of_two() {
        want
    } else {
        want.next_power_of_two() / 2
    };
    p.clamp(MIN_SLOTS, MAX_SLOTS)
}

/// A view of a mapped ring. The mapping belongs to whoever made the view (the shim or the collector), which
/// keeps it mapped for as long as the view is used.
#[derive(Clone, Copy)]
pub struct Ring {
    base: *mut u8,
    slots: u64,
}

// SAFETY: a `Ring` is a pointer into a mapping that its maker keeps mapped while any view is used (the contract
// of `Ring::init` and `Ring::open`); every word more than one thread touches at once (head, tail, dropped, wake,
// the sequence words) is reached as an atomic, and a slot's other bytes only by the one producer that reserved
// it, then by the consumer after the slot's sequence word (acquire) says it is published.
unsafe impl Send for Ring {}
// SAFETY: as for `Send`: `&Ring` gives nothing but the atomic and reservation-guarded accesses above.
unsafe impl Sync for Ring {}

#[derive(Debug, PartialEq, Eq)]
pub enum Invalid {
    Size,
    Magic,
    Version(u32),
    Geometry,
}

impl Ring {
    /// Lays out a new ring in zeroed memory of `bytes_for(slots)` bytes.
    ///
    /// # Safety
    /// `base` must point to at least `bytes_for(slots)` writable bytes, 64-byte aligned, zeroed, that stay
    /// mapped while the ring is used.
    pub unsafe fn init(base: *mut u8, slots: u64, pid: u32, flags: u32) -> Ring {
        assert!(slots.is_power_of_two() && (MIN_SLOTS..=MAX_SLOTS).contains(&slots));
        base.add(OFF_VERSION).cast::<u32>().write(VERSION);
        base.add(OFF_SLOT_SIZE).cast::<u32>().write(SLOT as u32);
        base.add(OFF_SLOTS).cast::<u64>().write(slots);
        base.add(OFF_PID).cast::<u32>().write(pid);
        base.add(OFF_FLAGS).cast::<u32>().write(flags);
        let r = Ring { base, slots };
        // The magic last: a reader that sees it sees the rest.
        r.a64(OFF_MAGIC).store(MAGIC, Ordering::Release);
        r
    }

    /// A view of a ring another process laid out, after checking its header against the mapping's size.
    ///
    /// # Safety
    /// `base` must point to `len` readable and writable bytes, 64-byte aligned, that stay mapped while the ring
    /// is used (the other process cannot shrink them: the collector takes only sealed memory).
    pub unsafe fn open(base: *mut u8, len: usize) -> Result<Ring, Invalid> {
        if len < HEADER + MIN_SLOTS as usize * SLOT {
            return Err(Invalid::Size);
        }
        let r = Ring { base, slots: 0 };
        if r.a64(OFF_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Err(Invalid::Magic);
        }
        let version = base.add(OFF_VERSION).cast::<u32>().read_volatile();
        if version != VERSION {
            return Err(Invalid::Version(version));
        }
        let slot = base.add(OFF_SLOT_SIZE).cast::<u32>().read_volatile();
        let slots = base.add(OFF_SLOTS).cast::<u64>().read_volatile();
        if slot as usize != SLOT
            || !slots.is_power_of_two()
            || !(MIN_SLOTS..=MAX_SLOTS).contains(&slots)
            || bytes_for(slots) != len
        {
            return Err(Invalid::Geometry);
        }
        Ok(Ring { base, slots })
    }

    pub fn slots(&self) -> u64 {
        self.slots
    }

    pub fn pid(&self) -> u32 {
        // SAFETY: OFF_PID + 4 lies in the header page of the mapping (`init`/`open`'s contract) and is 4-aligned
        // (`base` is 64-aligned); it was written before the magic, which `open` loaded with acquire.
        unsafe { self.base.add(OFF_PID).cast::<u32>().read_volatile() }
    }

    pub fn lossless(&self) -> bool {
        // SAFETY: OFF_FLAGS + 4 lies in the mapped header page and is 4-aligned (as in `pid`).
        unsafe { self.base.add(OFF_FLAGS).cast::<u32>().read_volatile() & FLAG_LOSSLESS != 0 }
    }

    /// Whether its events carry counter ticks ([`FLAG_TICKS`]).
    pub fn ticks(&self) -> bool {
        // SAFETY: OFF_FLAGS + 4 lies in the mapped header page and is 4-aligned (as in `pid`).
        unsafe { self.base.add(OFF_FLAGS).cast::<u32>().read_volatile() & FLAG_TICKS != 0 }
    }

    /// Records dropped because the ring was full, since the ring was made.
    pub fn dropped(&self) -> u64 {
        self.a64(OFF_DROPPED).load(Ordering::Acquire)
    }

    /// Slots reserved and not yet released by the collector.
    pub fn used(&self) -> u64 {
        let t = self.a64(OFF_TAIL).load(Ordering::Acquire);
        self.head().wrapping_sub(t)
    }

    #[inline(always)]
    fn a64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: every caller passes a header offset (OFF_MAGIC, OFF_HEAD, OFF_TAIL, OFF_DROPPED, an intent word
        // at OFF_INTENTS + 16 * i or 8 more, with i < INTENTS), 8-aligned and
        // inside the header page; `base` is 64-aligned and stays mapped while `self` is used (`init`/`open`), and
        // these words are only ever accessed atomically by the producers and the collector.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    #[inline(always)]
    fn a32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as in `a64`, for the 4-aligned header words OFF_WAKE and OFF_SLEEPING.
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }

    #[inline(always)]
    fn slot(&self, pos: u64) -> *mut u8 {
        // SAFETY: `pos & (slots - 1)` is below `slots` (a power of two), so the offset is at most
        // `bytes_for(slots) - SLOT`: inside the mapping `init`/`open` were given.
        unsafe {
            self.base
                .add(HEADER + ((pos & (self.slots - 1)) as usize) * SLOT)
        }
    }

    #[inline(always)]
    fn seq(&self, pos: u64) -> &AtomicU64 {
        // SAFETY: a slot's first 8 bytes, inside the mapping (`slot`) and 8-aligned (64-aligned base, 4096-byte
        // header, 64-byte slots); the sequence word is only ever accessed atomically.
        unsafe { &*(self.slot(pos) as *const AtomicU64) }
    }

    // ---- producing ----

    /// Reserves `n` consecutive slots (padding to the ring's end first if they would cross it). The position of
    /// the first, or `None` when the ring has no room (nothing reserved).
    #[inline(always)]
    fn reserve(&self, n: u64, keep: u64) -> Option<u64> {
        self.reserve_announced(n, keep, |_| ())
    }

    /// [`Ring::reserve`], telling `announce` the position its reservation will start at just before each try.
    #[inline(always)]
    fn reserve_announced(&self, n: u64, keep: u64, announce: impl FnMut(u64)) -> Option<u64> {
        self.reserve_hooked(n, keep, || (), || (), announce)
    }

    /// [`Ring::reserve`], running `between` after reading the head word and before reading the tail: where a
    /// producer may be pre-empted while others reserve and the collector releases (tests make that happen).
    #[inline(always)]
    #[cfg(test)]
    fn reserve_between(&self, n: u64, keep: u64, between: impl FnMut()) -> Option<u64> {
        self.reserve_hooked(n, keep, between, || (), |_| ())
    }

    /// [`Ring::reserve_between`], also running `after_tail` once the tail is read, before the compare-and-swap:
    /// a producer pre-empted with an old view of the tail (tests make that happen).
    #[inline(always)]
    fn reserve_hooked(
        &self,
        n: u64,
        keep: u64,
        mut between: impl FnMut(),
        mut after_tail: impl FnMut(),
        mut announce: impl FnMut(u64),
    ) -> Option<u64> {
        let head = self.a64(OFF_HEAD);
        let mut w = head.load(Ordering::Relaxed);
        let mut stale = 0u32;
        loop {
            between();
            let h = w & POS;
            let t = self.a64(OFF_TAIL).load(Ordering::Acquire);
            let used = h.wrapping_sub(t);
            after_tail();
            if used > self.slots {
                // `w` is stale: others reserved, and the collector released, past it meanwhile. Over and over,
                // the words are not what a ring holds (memory overwritten): no room, rather than spin.
                stale += 1;
                if stale > 1000 {
                    return None;
                }
                w = head.load(Ordering::Relaxed);
                continue;
            }
            let idx = h & (self.slots - 1);
            let pad = if idx + n > self.slots {
                self.slots - idx
            } else {
                0
            };
            if used + pad + n + keep > self.slots {
                return None;
            }
            announce(h + pad);
            // The position stays far below 2^48 (a year at 10 M records a second): no carry into the high bits.
            match head.compare_exchange_weak(w, w + pad + n, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => {
                    if pad > 0 {
                        let s = self.slot(h);
                        // SAFETY: the compare-and-swap just made slot `h` ours (no other producer reserves it,
                        // the collector reads it only once its sequence word is stored below); bytes 8 and 12..16
                        // lie inside the 64-byte, 64-aligned slot.
                        unsafe {
                            s.add(8).write(KIND_PAD);
                            s.add(12).cast::<u32>().write(pad as u32);
                        }
                        self.seq(h).store(h + 1, Ordering::Release);
                    }
                    // At or past a quarter, every reservation looks whether the collector sleeps (one load): a
                    // producer whose view of the tail was old when it crossed would not wake a collector that
                    // went to sleep meanwhile, and nobody after it would cross again.
                    if used + pad + n >= self.slots / 4 {
                        self.wake();
                    }
                    return Some(h + pad);
                }
                Err(now) => {
                    w = now;
                    stale = 0;
                }
            }
        }
    }

    /// The position of the next slot to reserve.
    #[inline]
    fn head(&self) -> u64 {
        self.a64(OFF_HEAD).load(Ordering::Acquire) & POS
    }

    /// How far the producers have reserved: the position of the next slot to reserve.
    pub fn reserved(&self) -> u64 {
        self.head()
    }

    /// Counts a record the ring had no room for.
    #[inline]
    pub fn count_drop(&self) {
        self.a64(OFF_DROPPED).fetch_add(1, Ordering::Relaxed);
        self.wake();
    }

    /// Wakes the collector if it sleeps on this ring.
    #[inline]
    pub fn wake(&self) {
        // Sequentially consistent, like the reservation before it and the collector's flag and look at the
        // head (`Consumer::sleep_since`): one of the two sides must see the other's store. (A plain load on
        // x86-64.) The first producer to find the collector asleep clears the flag and wakes it; the others
        // find it clear: a collector stopped or descheduled while asleep would otherwise cost every
        // reservation from a quarter on, and every dropped record, a system call.
        let sleeping = self.a32(OFF_SLEEPING);
        if sleeping.load(Ordering::SeqCst) != 0 && sleeping.swap(0, Ordering::SeqCst) != 0 {
            self.a32(OFF_WAKE).fetch_add(1, Ordering::Release);
            futex_wake(self.a32(OFF_WAKE));
        }
    }

    /// Wakes the collector whether or not it said it sleeps (a record waits on the socket, or a lossless writer
    /// waits for room): a system call, for the cold paths only.
    pub fn wake_now(&self) {
        self.a32(OFF_WAKE).fetch_add(1, Ordering::Release);
        futex_wake(self.a32(OFF_WAKE));
    }

    /// Publishes one event as it is, time included. False when the ring is full (nothing written: the caller
    /// counts or waits).
    ///
    /// The producer reads its clock before it reserves, so a thread pre-empted in between publishes a time older
    /// than records after it in the ring, or older than a promise ([`Ring::promise`]) made meanwhile. The ring's
    /// order is still the events' causal order (an event is visible to the program only once it returns, after
    /// its publication). The consumer holds each event's time at no less than the one before it and the last
    /// promise, which moves a time only within the window between its stamp and its reservation.
    #[inline(always)]
    pub fn try_event(&self, e: &Event) -> bool {
        self.try_event_at(e).is_some()
    }

    /// [`Ring::try_event`], saying where: the event's absolute position in the ring (`None`: no room).
    #[inline(always)]
    pub fn try_event_at(&self, e: &Event) -> Option<u64> {
        let pos = self.reserve(1, KEEP_FOR_LAST)?;
        self.write_event(pos, e);
        Some(pos)
    }

    /// The memory of the slots: where the slot at position `p` (first lap) lies, `p * SLOT` bytes on, and how
    /// many bytes they take. For the producer's side to fault pages in ahead of its writers.
    pub fn slot_memory(&self) -> (*mut u8, usize) {
        (self.slot(0), self.slots as usize * SLOT)
    }

    /// Writes an event into the slot reserved at `pos` and publishes it.
    #[inline(always)]
    fn write_event(&self, pos: u64, e: &Event) {
        let s = self.slot(pos);
        // One slot, written in place; the sequence word last.
        // SAFETY: `pos` was reserved by this producer (`reserve`) and is not yet published, so nobody else writes
        // or reads these bytes; every field lies inside the 64-byte slot at its natural alignment (the slot is
        // 64-aligned).
        unsafe {
            s.add(8).write(KIND_EVENT);
            s.add(9).write(e.api as u8);
            s.add(10).write(e.flags);
            s.add(12).cast::<u32>().write(e.tid);
            s.add(16).cast::<u64>().write(e.ts_ns);
            s.add(24).cast::<u32>().write(e.device);
            s.add(28).cast::<u32>().write(e.result);
            s.add(32).cast::<u64>().write(e.addr);
            s.add(40).cast::<u64>().write(e.size);
            s.add(48).cast::<u64>().write(e.aux);
            s.add(56).cast::<u32>().write(e.stack);
        }
        self.seq(pos).store(pos + 1, Ordering::Release);
        // The next records' slots, fetched for writing now: a slot is written once a lap, so its line is in no
        // cache by then, and its store would wait on memory inside the next locked instruction (the next
        // reservation, or the host's own locks). Two ahead: the next event may be this one's neighbour, whose
        // line came in with it. Where several threads publish at once, the next slot may be another's, being
        // written: the prefetch then moves its line once between cores, no more than the miss it saves
        // (docs/BENCHMARKS.md, issue 27: two threads hammering one ring ran no slower with it).
        prefetch_for_write(self.slot(pos + 1));
        prefetch_for_write(self.slot(pos + 2));
    }

    /// The collector's promise for this ring's process: a time that nothing it has not yet read is older than,
    /// once the consumer holds later events at no less than it (see [`Ring::try_event`]); `None` when records are
    /// reserved and not yet read (the collector drains first, then asks). The time is read first: a record
    /// reserved after the head word is read comes after the promise in the ring, and one reserved before it makes
    /// the head differ from the tail. `clock` must read the producers' clock (CLOCK_MONOTONIC; the caller allows
    /// for the shim's error).
    pub fn promise(&self, clock: impl FnOnce() -> u64) -> Option<u64> {
        let t = clock();
        let head = self.head();
        let tail = self.a64(OFF_TAIL).load(Ordering::SeqCst);
        (head == tail).then_some(t)
    }

    /// The mapping's address and slot count, for [`Ring::from_parts`].
    pub fn parts(&self) -> (*mut u8, u64) {
        (self.base, self.slots)
    }

    /// The view whose [`Ring::parts`] these are, made again without reading the header (for a hot path that
    /// keeps the parts where it keeps its other data).
    ///
    /// # Safety
    /// `base` and `slots` must be the parts of a view made by [`Ring::init`] or [`Ring::open`] whose mapping is
    /// still mapped, and stays mapped while the new view is used.
    #[inline(always)]
    pub unsafe fn from_parts(base: *mut u8, slots: u64) -> Ring {
        Ring { base, slots }
    }

    /// The most bytes one blob may carry: a quarter of the ring.
    pub fn max_blob(&self) -> usize {
        (self.slots as usize / 4) * BLOB_PER_SLOT
    }

    /// Publishes a blob (encoded trace records). False when it does not fit now (nothing written) or ever
    /// (longer than [`Ring::max_blob`]).
    pub fn try_blob(&self, bytes: &[u8]) -> bool {
        self.blob_keeping(bytes, KEEP_FOR_LAST)
    }

    /// Publishes the process's last record (its goodbye) in room the other records leave free for it, so a ring
    /// the collector could not drain still says the process exited.
    pub fn try_last(&self, bytes: &[u8]) -> bool {
        bytes.len() <= KEEP_FOR_LAST as usize * BLOB_PER_SLOT && self.blob_keeping(bytes, 0)
    }

    fn blob_keeping(&self, bytes: &[u8], keep: u64) -> bool {
        match self.begin_blob(bytes, keep) {
            Some((pos, intent)) => {
                self.finish_blob(pos, intent, bytes);
                true
            }
            None => false,
        }
    }

    /// Reserves the slots of a blob, its first slot's position named in an intent word before each try to reserve
    /// (so a writer that dies at any point after the try that succeeds leaves its blob known as one): that
    /// position, and which word (`None`: all were taken by other writers; a blob torn then is taken for an event).
    fn begin_blob(&self, bytes: &[u8], keep: u64) -> Option<(u64, Option<usize>)> {
        if bytes.is_empty() || bytes.len() > self.max_blob() {
            return None;
        }
        let n = bytes.len().div_ceil(BLOB_PER_SLOT) as u64;
        let intent = (0..INTENTS).find(|&i| {
            self.intent(i)
                .compare_exchange(0, CLAIMED, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        });
        if let Some(i) = intent {
            self.intent_len(i).store(n, Ordering::Relaxed);
        }
        let announce = |p: u64| {
            if let Some(i) = intent {
                self.intent(i).store(p + 1, Ordering::Release);
            }
        };
        // Padding to the ring's end may cost up to n - 1 more slots than the record.
        match self.reserve_announced(n, keep, announce) {
            Some(pos) => Some((pos, intent)),
            None => {
                if let Some(i) = intent {
                    self.intent(i).store(0, Ordering::Release);
                }
                None
            }
        }
    }

    #[inline(always)]
    fn intent(&self, i: usize) -> &AtomicU64 {
        self.a64(OFF_INTENTS + 16 * i)
    }

    #[inline(always)]
    fn intent_len(&self, i: usize) -> &AtomicU64 {
        self.a64(OFF_INTENTS + 16 * i + 8)
    }

    /// The slots of the blob a writer named as starting at `pos` (see [`OFF_INTENTS`]), if one did.
    fn blob_intended_at(&self, pos: u64) -> Option<u64> {
        (0..INTENTS)
            .find(|&i| self.intent(i).load(Ordering::Acquire) == pos + 1)
            .map(|i| self.intent_len(i).load(Ordering::Relaxed))
    }

    /// Writes and publishes a blob whose slots `begin_blob` reserved at `pos`, then frees its intent word.
    fn finish_blob(&self, pos: u64, intent: Option<usize>, bytes: &[u8]) {
        for (i, chunk) in bytes.chunks(BLOB_PER_SLOT).enumerate() {
            let p = pos + i as u64;
            let s = self.slot(p);
            // SAFETY: slots pos..pos + n were reserved by this call and are not yet published; `chunk` is at most
            // BLOB_PER_SLOT (48) bytes, so 16 + 48 stays inside the 64-byte slot, and the ring's memory never
            // overlaps the caller's slice.
            unsafe {
                s.add(8).write(if i == 0 { KIND_BLOB } else { KIND_CONT });
                s.add(12).cast::<u32>().write(bytes.len() as u32);
                std::ptr::copy_nonoverlapping(chunk.as_ptr(), s.add(16), chunk.len());
            }
            if i > 0 {
                self.seq(p).store(p + 1, Ordering::Release);
            }
        }
        // The first slot last: the record is whole when it is visible.
        self.seq(pos).store(pos + 1, Ordering::Release);
        // Freed once published: a writer dying between the two leaves a word naming a record that is whole.
        if let Some(i) = intent {
            self.intent(i).store(0, Ordering::Release);
        }
    }
}

/// Asks the CPU to bring the line at `p` into this core's cache, ready to be written; never faults, never waits
/// (a hint: a CPU without the instruction runs it as a no-op).
#[inline(always)]
fn prefetch_for_write(p: *const u8) {
    // SAFETY: a prefetch reads and writes nothing, whatever the address.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!("prefetchw [{}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
    #[cfg(target_arch = "aarch64")]
    unsafe {
        std::arch::asm!("prfm pstl1keep, [{}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

/// The fields of the event in slot `s`.
///
/// # Safety
/// `s` must point to a whole 64-byte, 64-aligned slot of a mapped ring.
unsafe fn read_event(s: *const u8, api: Api) -> Event {
    Event {
        api,
        flags: s.add(10).read_volatile(),
        tid: s.add(12).cast::<u32>().read_volatile(),
        ts_ns: s.add(16).cast::<u64>().read_volatile(),
        device: s.add(24).cast::<u32>().read_volatile(),
        result: s.add(28).cast::<u32>().read_volatile(),
        addr: s.add(32).cast::<u64>().read_volatile(),
        size: s.add(40).cast::<u64>().read_volatile(),
        aux: s.add(48).cast::<u64>().read_volatile(),
        stack: s.add(56).cast::<u32>().read_volatile(),
    }
}

/// FUTEX_WAKE on a shared word (not the private variant: the sleeper is another process).
fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the word's address as a key (it reads nothing through it); `word` is a live
    // reference, 4-aligned, into the ring's shared mapping.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const AtomicU32,
            libc::FUTEX_WAKE,
            i32::MAX,
        );
    }
}

fn futex_wait(word: &AtomicU32, seen: u32, timeout: std::time::Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, 4-aligned reference into the ring's shared mapping, which the kernel reads
    // atomically; `ts` is a local timespec (a relative timeout) that outlives the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const AtomicU32,
            libc::FUTEX_WAIT,
            seen,
            &ts as *const libc::timespec,
        );
    }
}

#[cfg(test)]
mod tests;

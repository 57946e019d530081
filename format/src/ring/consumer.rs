//! The collector's side of the ring: draining what the producers published, trusting nothing a process that
//! may die at any instruction left in the shared memory.

use super::*;

/// What the collector takes out of a ring.
pub enum Item<'a> {
    Event(Event),
    /// Encoded trace records, as the shim's codec wrote them (the collector checks them before use).
    Blob(&'a [u8]),
}

/// The collector's side of one ring.
pub struct Consumer {
    ring: Ring,
    pub(super) pos: u64,
    blob: Vec<u8>,
    /// Records a process left half-written when it died, and slots skipped as unreadable.
    pub torn: u64,
    /// Set when the ring held something no shim writes: draining stopped there.
    pub corrupt: bool,
    /// Of `torn`, the records a dead process left torn that its ring's intent words name as blobs (records of the
    /// shim's own or of the bridge): no events. The words are the process's memory, which it can scribble on: at
    /// worst its own torn events are told as blobs.
    pub torn_blobs: u64,
}

impl Consumer {
    pub fn new(ring: Ring) -> Consumer {
        let pos = ring.a64(OFF_TAIL).load(Ordering::Acquire);
        Consumer {
            ring,
            pos,
            blob: Vec::new(),
            torn: 0,
            corrupt: false,
            torn_blobs: 0,
        }
    }

    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Whether the ring can have been full: its head (slots ever reserved) reached three quarters of its size. A
    /// record is refused a little short of full (the slots kept for the last records, padding to the end, a
    /// blob's length), never at a quarter; a ring that never got that far dropped nothing, so a drop count it
    /// shows then is not the shim's.
    pub fn ever_full(&self) -> bool {
        let slots = self.ring.slots();
        self.pos.max(self.ring.head()) >= slots - slots / 4
    }

    /// Takes every whole record published so far, in the ring's order, and releases their slots. With `dead`
    /// (the producing process is gone, nothing more will be written) a reserved record that was never published
    /// is skipped and counted in `torn`, and what follows it is still taken. Returns the records taken.
    pub fn drain(&mut self, dead: bool, mut take: impl FnMut(Item)) -> u64 {
        if self.corrupt || !self.head_is_sane() {
            return 0;
        }
        let ring = self.ring;
        let head = ring.head();
        let mut taken = 0u64;
        let mut since_release = 0u64;
        while self.pos < head {
            let pos = self.pos;
            if ring.seq(pos).load(Ordering::Acquire) != pos + 1 {
                if !dead {
                    break; // a producer is still writing it
                }
                self.skip_torn_run(pos, head);
                continue;
            }
            let Some(n) = self.take_published(pos, head, &mut take) else {
                self.corrupt = true;
                break;
            };
            taken += 1;
            self.pos += n;
            since_release += n;
            // Room back to the producers as we go, so a long drain never leaves them a full ring.
            if since_release >= ring.slots / 8 {
                fence(Ordering::Release);
                ring.a64(OFF_TAIL).store(self.pos, Ordering::Release);
                since_release = 0;
            }
        }
        ring.a64(OFF_TAIL).store(self.pos, Ordering::Release);
        taken
    }

    /// The drain's step past a record whose process died writing it (`pos` reserved, never published): kept
    /// apart from the drain's loop because it reads the intent words, which only a dead process's ring needs.
    /// Skips up to the next slot that starts a published record and counts what is skipped in `torn`. Those an
    /// intent word names are blobs of known length; the first one none names (an event, or what is left) ends
    /// what can be told apart, and the rest of the run counts as one record.
    #[inline]
    fn skip_torn_run(&mut self, pos: u64, head: u64) {
        let ring = self.ring;
        let mut end = pos + 1;
        while end < head && !self.starts_record(end) {
            end += 1;
        }
        let mut q = pos;
        while q < end {
            self.torn += 1;
            match ring.blob_intended_at(q) {
                Some(n) if n > 0 && q + n <= end => {
                    self.torn_blobs += 1;
                    q += n;
                }
                _ => break,
            }
        }
        self.pos = end;
    }

    /// The drain's step over the published record at `pos`: hands it to `take` (or counts it in `torn`) and
    /// returns the slots it takes, or `None` where the slot holds something no shim writes (the drain then
    /// marks the ring corrupt and stops). One function per record kind keeps the drain's loop to its bookkeeping.
    #[inline]
    fn take_published(&mut self, pos: u64, head: u64, take: &mut impl FnMut(Item)) -> Option<u64> {
        let ring = self.ring;
        let s = ring.slot(pos);
        // SAFETY: byte 8 of a slot inside the mapping (`Ring::slot`); its sequence word (acquire) says the
        // producer published it. Volatile: the other process may still scribble on it, and any byte value is
        // handled below. (A process writing a published slot while it is read is a race that Rust's memory
        // model does not define even for volatile reads; it is tolerated as shared memory with an untrusted
        // writer always is: every value read is checked before use, and the mapping cannot shrink.)
        let kind = unsafe { s.add(8).read_volatile() };
        match kind {
            KIND_EVENT => {
                // SAFETY: byte 9 of the same published slot, as above.
                let api = unsafe { s.add(9).read_volatile() };
                match Api::from_u8(api) {
                    // SAFETY: `s` is a published slot inside the mapping, 64-aligned, and `read_event` reads
                    // only its 64 bytes, each field at its natural alignment.
                    Some(api) => take(Item::Event(unsafe { read_event(s, api) })),
                    None => self.torn += 1,
                }
                Some(1)
            }
            KIND_PAD => {
                // SAFETY: bytes 12..16 of the published slot, 4-aligned, as for `kind`.
                let n = unsafe { s.add(12).cast::<u32>().read_volatile() } as u64;
                if n == 0 || (pos & (ring.slots - 1)) + n != ring.slots {
                    return None;
                }
                Some(n)
            }
            KIND_BLOB => self.take_blob(s, pos, head, take),
            _ => None,
        }
    }

    /// [`Consumer::take_published`] for a blob starting at the published slot `s` (position `pos`): checks its
    /// length against the ring, gathers its continuation slots into the consumer's reused buffer (no allocation
    /// once it has grown) and hands them to `take`; a continuation slot not published counts in `torn`.
    #[inline]
    fn take_blob(
        &mut self,
        s: *mut u8,
        pos: u64,
        head: u64,
        take: &mut impl FnMut(Item),
    ) -> Option<u64> {
        let ring = self.ring;
        // SAFETY: bytes 12..16 of the published slot, 4-aligned, as for `kind`; `len` is checked
        // against the ring's bounds before it is used.
        let len = unsafe { s.add(12).cast::<u32>().read_volatile() } as usize;
        let n = len.div_ceil(BLOB_PER_SLOT) as u64;
        if len == 0 || len > ring.max_blob() || (pos & (ring.slots - 1)) + n > ring.slots {
            return None;
        }
        if pos + n > head {
            return None;
        }
        // Continuation slots are published before the first one: all are whole now.
        self.blob.clear();
        let mut ok = true;
        for i in 0..n {
            let p = pos + i;
            let c = ring.slot(p);
            if i > 0
                && (ring.seq(p).load(Ordering::Acquire) != p + 1
                    // SAFETY: byte 8 of slot `p`, published (checked just before); `p` stays inside
                    // the mapping (`Ring::slot` masks it).
                    || unsafe { c.add(8).read_volatile() } != KIND_CONT)
            {
                ok = false;
                break;
            }
            let take_n = (len - self.blob.len()).min(BLOB_PER_SLOT);
            let mut chunk = [0u8; BLOB_PER_SLOT];
            // SAFETY: `take_n` <= BLOB_PER_SLOT, so bytes 16..16 + take_n lie inside slot `p`, which
            // is inside the mapping and published (the first slot's word for i == 0, its own
            // otherwise); `chunk` is a local array of BLOB_PER_SLOT bytes, not in the ring.
            unsafe { std::ptr::copy_nonoverlapping(c.add(16), chunk.as_mut_ptr(), take_n) };
            self.blob.extend_from_slice(&chunk[..take_n]);
        }
        if ok {
            take(Item::Blob(&self.blob));
        } else {
            self.torn += 1;
        }
        Some(n)
    }

    /// Where the drain waits: the position of a record reserved and not yet published (a writer takes
    /// nanoseconds between the two; one that takes seconds will not finish).
    pub fn waiting_at(&self) -> Option<u64> {
        let head = self.ring.head();
        (self.pos < head && self.ring.seq(self.pos).load(Ordering::Acquire) != self.pos + 1)
            .then_some(self.pos)
    }

    /// Gives up on the record at the drain's position (reserved long ago and never published: its thread will
    /// not finish it) and moves to the next published record. Counted in `torn`.
    pub fn skip_stuck(&mut self) {
        let head = self.ring.head();
        if self.pos >= head || !self.head_is_sane() {
            return;
        }
        self.torn += 1;
        self.pos += 1;
        while self.pos < head && !self.starts_record(self.pos) {
            self.pos += 1;
        }
        self.ring.a64(OFF_TAIL).store(self.pos, Ordering::Release);
    }

    /// The head word is shared memory the traced process can scribble on: producers never reserve more than a
    /// ring's worth past what the collector released, so a head further ahead (or behind) is a scribble. The
    /// ring is then taken for corrupt, its process's end still recorded, instead of walking up to 2^48 slots.
    fn head_is_sane(&mut self) -> bool {
        let head = self.ring.head();
        let sane = head >= self.pos && head - self.pos <= self.ring.slots();
        if !sane {
            self.corrupt = true;
        }
        sane
    }

    fn starts_record(&self, pos: u64) -> bool {
        let ring = self.ring;
        ring.seq(pos).load(Ordering::Acquire) == pos + 1
            && matches!(
                // SAFETY: byte 8 of slot `pos`, inside the mapping (`Ring::slot` masks the position) and
                // published (its sequence word was just checked); any byte value is handled.
                unsafe { ring.slot(pos).add(8).read_volatile() },
                KIND_EVENT | KIND_BLOB | KIND_PAD
            )
    }

    /// The collector's wake word as it is now: read before a drain and given to [`Consumer::sleep_since`], so
    /// that an explicit wake (`Ring::wake_now`: an out-of-memory record on the socket, a goodbye) made during
    /// the drain is not slept through.
    pub fn wake_seen(&self) -> u32 {
        self.ring.a32(OFF_WAKE).load(Ordering::Acquire)
    }

    /// [`Consumer::sleep_since`] from now.
    pub fn sleep(&self, timeout: std::time::Duration) {
        self.sleep_since(self.wake_seen(), timeout)
    }

    /// Sleeps until a producer wakes the collector (after `seen`, the wake word read before the last drain) or
    /// `timeout` passes (the wake word is a futex in the shared memory). Whatever was published before the sleep
    /// began is seen at the next drain.
    ///
    /// Records published since the last drain do not keep it awake unless they fill a quarter of the ring:
    /// producers wake a sleeping collector from a quarter on (`Ring::reserve`), so below that nothing waits
    /// longer than `timeout`, and at or past it nothing waits. (Draining whenever anything was published kept
    /// the collector's thread spinning right behind a busy producer, reading the head word and the slots it was
    /// writing: on the GPU host's Xeon that cost the producer about 230 ns an alloc+free pair.)
    pub fn sleep_since(&self, seen: u32, timeout: std::time::Duration) {
        let ring = self.ring;
        let word = ring.a32(OFF_WAKE);
        ring.a32(OFF_SLEEPING).store(1, Ordering::SeqCst);
        // Past a quarter already (its producers may have looked at the flag before it was set): drain now.
        // A ring the drain refuses sleeps regardless: what waits there will never be read.
        let backlog = (ring.a64(OFF_HEAD).load(Ordering::SeqCst) & POS).wrapping_sub(self.pos);
        if self.corrupt || backlog < ring.slots / 4 {
            futex_wait(word, seen, timeout);
        }
        ring.a32(OFF_SLEEPING).store(0, Ordering::Relaxed);
    }
}

//! The merge's heap of fronts: the smallest waiting entry of each source (a run, a spilled run, a record).
//!
//! Why not `BinaryHeap<Reverse<(Key, Src)>>`: the merge replaces the top once for nearly every event it hands
//! out when processes interleave finely, so the heap's cost is per event. Entries here are 32 bytes (the key's
//! fields and the source packed together, against 48), compared time first with the rest only on a tie, and the
//! top is replaced in place with one sift.

use crate::model::input::key::Key;

/// A source of entries, packed: the kind in the top two bits, the index below.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::model) enum Src {
    Run(usize),
    Spill(usize),
    Rec(usize),
}

const TAG_SHIFT: u32 = 30;
const INDEX: u32 = (1 << TAG_SHIFT) - 1;

/// One front: a key and where it is, in 32 bytes.
#[derive(Clone, Copy)]
struct Front {
    ts: u64,
    seq: u64,
    pid: u32,
    tid: u32,
    what: u8,
    src: u32,
}

impl Front {
    /// Indices above `INDEX` cannot be packed. The merge's stay far below: runs and records are reused once
    /// empty (their count is what waits at once), and a spilled run holds a bound's worth of events (a billion of
    /// them is more events than any trace).
    fn new(k: Key, src: Src) -> Front {
        let (tag, i) = match src {
            Src::Run(i) => (0, i),
            Src::Spill(i) => (1, i),
            Src::Rec(i) => (2, i),
        };
        assert!(i <= INDEX as usize, "merge source index {i} out of range");
        Front {
            ts: k.ts,
            seq: k.seq,
            pid: k.pid,
            tid: k.tid,
            what: k.what,
            src: tag << TAG_SHIFT | i as u32,
        }
    }

    fn key(&self) -> Key {
        Key {
            ts: self.ts,
            what: self.what,
            pid: self.pid,
            tid: self.tid,
            seq: self.seq,
        }
    }

    fn src(&self) -> Src {
        let i = (self.src & INDEX) as usize;
        match self.src >> TAG_SHIFT {
            0 => Src::Run(i),
            1 => Src::Spill(i),
            _ => Src::Rec(i),
        }
    }

    /// Key order (keys are unique: `seq` is).
    #[inline(always)]
    fn less(&self, o: &Front) -> bool {
        if self.ts != o.ts {
            return self.ts < o.ts;
        }
        (self.what, self.pid, self.tid, self.seq) < (o.what, o.pid, o.tid, o.seq)
    }
}

/// A binary min-heap of fronts in key order.
#[derive(Default)]
pub(in crate::model) struct Fronts {
    h: Vec<Front>,
}

impl Fronts {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.h.len()
    }

    /// The smallest front.
    #[inline]
    pub fn peek(&self) -> Option<(Key, Src)> {
        self.h.first().map(|f| (f.key(), f.src()))
    }

    /// The key below which the top's source may go on handing out: the second-smallest front's (the smaller of
    /// the top's children), or the largest key when the top is alone.
    #[inline]
    pub fn second(&self) -> Key {
        match (self.h.get(1), self.h.get(2)) {
            (Some(a), Some(b)) if b.less(a) => b.key(),
            (Some(a), _) => a.key(),
            _ => Key::MAX,
        }
    }

    pub fn push(&mut self, k: Key, src: Src) {
        let x = Front::new(k, src);
        self.h.push(x);
        let mut i = self.h.len() - 1;
        while i > 0 {
            let parent = (i - 1) / 2;
            if !x.less(&self.h[parent]) {
                break;
            }
            self.h[i] = self.h[parent];
            i = parent;
        }
        self.h[i] = x;
    }

    /// Removes the smallest front.
    pub fn pop(&mut self) {
        let Some(last) = self.h.pop() else { return };
        if !self.h.is_empty() {
            self.h[0] = last;
            self.sift_down(0);
        }
    }

    /// Gives the top a new key (its source's next entry), in place. Inlined: once per event.
    #[inline(always)]
    pub fn replace_top(&mut self, k: Key, src: Src) {
        if self.h.is_empty() {
            return;
        }
        // Carried down in registers, written once where it lands: writing it to the top and reading it back
        // (as `sift_down` does) stalls on every event, the read spanning two of the writes (no forwarding).
        self.sift_down_with(0, Front::new(k, src));
    }

    /// Keeps only the fronts whose source `keep` accepts.
    pub fn retain(&mut self, keep: impl Fn(Src) -> bool) {
        let old = std::mem::take(&mut self.h);
        for f in old {
            if keep(f.src()) {
                self.push(f.key(), f.src());
            }
        }
    }

    #[inline(always)]
    fn sift_down(&mut self, i: usize) {
        let x = self.h[i];
        self.sift_down_with(i, x);
    }

    /// Moves `x` down from the hole at `i` to its place.
    #[inline(always)]
    fn sift_down_with(&mut self, mut i: usize, x: Front) {
        let n = self.h.len();
        loop {
            let l = 2 * i + 1;
            if l >= n {
                break;
            }
            // The smaller child, without a branch on the data (times are as good as random to the predictor).
            let c = if l + 1 < n {
                l + self.h[l + 1].less(&self.h[l]) as usize
            } else {
                l
            };
            if !self.h[c].less(&x) {
                break;
            }
            self.h[i] = self.h[c];
            i = c;
        }
        self.h[i] = x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ts: u64, what: u8, pid: u32, tid: u32, seq: u64) -> Key {
        Key {
            ts,
            what,
            pid,
            tid,
            seq,
        }
    }

    #[test]
    fn a_front_is_32_bytes() {
        assert_eq!(std::mem::size_of::<Front>(), 32);
    }

    #[test]
    fn fronts_come_out_in_key_order_like_a_sort() {
        // Keys tied on time and on every field but one, pushed, popped and replaced in a scrambled order.
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut f = Fronts::default();
        let mut all = Vec::new();
        let mut seq = 0;
        for i in 0..2000usize {
            seq += 1;
            let k = key(
                next() % 50,
                (next() % 3) as u8,
                (next() % 4) as u32,
                (next() % 3) as u32,
                seq,
            );
            let src = match i % 3 {
                0 => Src::Run(i),
                1 => Src::Spill(i),
                _ => Src::Rec(i),
            };
            if i % 5 == 4 {
                // Replace the top: it is handed out now, the new key waits.
                let (top, _) = f.peek().expect("non-empty");
                all.retain(|x: &(Key, Src)| x.0 != top);
                f.replace_top(k, src);
            } else {
                f.push(k, src);
            }
            all.push((k, src));
        }
        all.sort_by_key(|x| x.0);
        let mut out = Vec::new();
        while let Some(x) = f.peek() {
            if f.len() > 1 {
                assert!(x.0 < f.second(), "the second front is the next one");
            }
            out.push(x);
            f.pop();
        }
        assert_eq!(out, all);
    }

    #[test]
    fn retain_keeps_the_order() {
        let mut f = Fronts::default();
        for i in 0..100u64 {
            let src = if i % 2 == 0 {
                Src::Run(i as usize)
            } else {
                Src::Rec(i as usize)
            };
            f.push(key(1000 - i * 7 % 101, 0, 1, 1, i + 1), src);
        }
        f.retain(|s| matches!(s, Src::Rec(_)));
        let mut last = None;
        let mut n = 0;
        while let Some((k, s)) = f.peek() {
            assert!(matches!(s, Src::Rec(_)));
            assert!(last.is_none_or(|l| l < k));
            last = Some(k);
            n += 1;
            f.pop();
        }
        assert_eq!(n, 50);
    }
}

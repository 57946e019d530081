//! One sorted run of a process's events in the merge: the batches as the trace delivered them, kept whole, each
//! with the position of its next event.
//!
//! Why not a queue of events: the merge hands out about one event per step when processes interleave finely,
//! and copying every event into a queue on arrival and out of it again cost as much as the ordering itself.
//! Here a batch is moved in as it is (no copy) and events are copied once, into the merge's output.

use std::collections::VecDeque;

use vramtrace_format::Event;

use crate::model::input::key::Key;

/// The file order (`seq`) of a batch's events: consecutive from a first one (a batch already in time order, the
/// common case), or one each (a batch that had to be sorted, or events put back in memory after a failed spill).
pub(in crate::model) enum Seqs {
    From(u64),
    Each(Vec<u64>),
}

impl Seqs {
    #[inline(always)]
    pub fn at(&self, i: usize) -> u64 {
        match self {
            Seqs::From(first) => first + i as u64,
            Seqs::Each(v) => v[i],
        }
    }
}

/// A batch, never empty while it is in a run: `ev[pos..]` wait.
struct Seg {
    ev: Vec<Event>,
    pos: usize,
    seqs: Seqs,
}

pub(in crate::model) struct Run {
    pub slot: usize,
    pub pid: u32,
    segs: VecDeque<Seg>,
    len: usize,
}

impl Run {
    pub fn new(slot: usize, pid: u32) -> Run {
        Run {
            slot,
            pid,
            segs: VecDeque::new(),
            len: 0,
        }
    }

    /// Events waiting.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The next event's key.
    #[inline]
    pub fn front_key(&self) -> Option<Key> {
        let s = self.segs.front()?;
        Some(Key::event(self.pid, s.seqs.at(s.pos), &s.ev[s.pos]))
    }

    /// The last event's (time, thread): a batch continues the run in order when its first is not older.
    pub fn back(&self) -> Option<(u64, u32)> {
        let e = self.segs.back()?.ev.last()?;
        Some((e.ts_ns, e.tid))
    }

    /// Appends events in key order after the run's last, `seqs` their file order.
    pub fn push(&mut self, ev: Vec<Event>, seqs: Seqs) {
        if ev.is_empty() {
            return;
        }
        if let Seqs::Each(v) = &seqs {
            debug_assert_eq!(v.len(), ev.len());
        }
        self.len += ev.len();
        self.segs.push_back(Seg { ev, pos: 0, seqs });
    }

    /// Hands the next events to `out` while they are below `stop` (compared by time, the whole key only on a
    /// tie) and below `limit` (`u64::MAX`: no limit; with `force` the first goes regardless), at most `max`.
    /// Returns how many went, how many of them were at or past `limit`, and the last one's key. Inlined: when
    /// processes interleave finely this runs once per event.
    #[inline(always)]
    pub fn take_below(
        &mut self,
        out: &mut Vec<Event>,
        stop: &Key,
        limit: u64,
        force: bool,
        max: usize,
    ) -> (usize, u64, Option<Key>) {
        let (mut n, mut forced, mut last) = (0usize, 0u64, None);
        while let Some(s) = self.segs.front_mut() {
            let start = s.pos;
            let mut i = start;
            while i < s.ev.len() && n < max {
                let e = &s.ev[i];
                let below = e.ts_ns < stop.ts
                    || (e.ts_ns == stop.ts && Key::event(self.pid, s.seqs.at(i), e) < *stop);
                if !below {
                    break;
                }
                let open = limit == u64::MAX || e.ts_ns < limit;
                if !(open || (force && n == 0)) {
                    break;
                }
                forced += !open as u64;
                n += 1;
                i += 1;
            }
            if i > start {
                last = Some(Key::event(self.pid, s.seqs.at(i - 1), &s.ev[i - 1]));
                if i - start == 1 {
                    // One event, the common case: no call to copy it.
                    out.push(s.ev[start]);
                } else {
                    out.extend_from_slice(&s.ev[start..i]);
                }
                self.len -= i - start;
                s.pos = i;
            }
            if i < s.ev.len() {
                break;
            }
            self.segs.pop_front();
        }
        (n, forced, last)
    }

    /// Every waiting event with its key, in order, emptying the run.
    pub fn drain(&mut self, mut each: impl FnMut(Key, Event)) {
        for s in self.segs.drain(..) {
            for i in s.pos..s.ev.len() {
                each(Key::event(self.pid, s.seqs.at(i), &s.ev[i]), s.ev[i]);
            }
        }
        self.len = 0;
    }
}

#[cfg(test)]
pub(in crate::model) mod tests {
    use super::*;
    use vramtrace_format::Api;

    /// An allocation event for the model's tests.
    pub(in crate::model) fn event(ts: u64, tid: u32, addr: u64) -> Event {
        Event {
            ts_ns: ts,
            tid,
            api: Api::MemAlloc,
            flags: 0,
            device: 0,
            result: 0,
            addr,
            size: 1,
            aux: 0,
            stack: 0,
        }
    }

    fn ev(ts: u64) -> Event {
        event(ts, 1, ts)
    }

    #[test]
    fn takes_across_batches_and_stops_where_told() {
        let mut r = Run::new(0, 7);
        r.push(vec![ev(1), ev(2)], Seqs::From(10));
        r.push(vec![ev(3), ev(4), ev(5)], Seqs::Each(vec![20, 22, 24]));
        assert_eq!(r.len(), 5);
        assert_eq!(r.back(), Some((5, 1)));
        let mut out = Vec::new();
        // Tied on time with the first event at 4: decided by the rest of the key.
        let stop = Key {
            ts: 4,
            what: 0,
            pid: 7,
            tid: 1,
            seq: 21,
        };
        let (n, forced, last) = r.take_below(&mut out, &stop, u64::MAX, false, usize::MAX);
        let last = last.unwrap();
        assert_eq!((n, forced), (3, 0));
        assert_eq!((last.ts, last.seq, last.pid), (3, 20, 7));
        assert_eq!(out.iter().map(|e| e.ts_ns).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(r.len(), 2);
        assert_eq!(r.front_key().map(|k| (k.ts, k.seq)), Some((4, 22)));
        // At most `max`; a limit stops all but a forced first one, which is counted.
        out.clear();
        assert_eq!(r.take_below(&mut out, &Key::MAX, 4, false, 5).0, 0);
        let (n, forced, _) = r.take_below(&mut out, &Key::MAX, 4, true, 5);
        assert_eq!((n, forced, out.len()), (1, 1, 1));
        let mut rest = Vec::new();
        r.drain(|k, e| rest.push((k.seq, e.ts_ns)));
        assert_eq!(rest, [(24, 5)]);
        assert!(r.is_empty() && r.front_key().is_none());
        assert!(r
            .take_below(&mut out, &Key::MAX, u64::MAX, true, 9)
            .2
            .is_none());
    }
}

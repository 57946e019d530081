//! The merge: hands the replay every timed entry of every process (events, dropped counts, out-of-memory
//! records, process ends, the bridge's records) in one total order, the [`Key`] order, whatever order the
//! trace's frames arrived in.
//!
//! The contract (docs/ARCHITECTURE.md, "Time and order"): the replay sees exactly what sorting every entry of
//! the trace by `Key` and replaying them one by one would show ([`Merge::reference`] is that plain sort, kept
//! for the tests). The streaming merge gets there without holding the trace in memory:
//!
//! - Each process's entries wait in sorted runs. A batch in time order after the process's last one is
//!   appended to its tail run; a batch older than that (a late batch) becomes a run of its own. Runs meet in one
//!   binary heap of their fronts, so a late batch costs O(b log r), never a re-sort of what waits.
//! - An entry is handed out once its time is below the `limit` the replay passes: the smallest promise of the
//!   processes still open (a promise: no later record of that process is older). Entries at the limit's own
//!   nanosecond wait (the process may still send another at that time).
//! - Memory is bounded: past `bound` waiting events, every waiting run is merged into one sorted run in a
//!   spill file (unlinked at once) and read back in small blocks when the merge reaches it. Nothing is handed
//!   out early. Only when no spill file can be made are the oldest events handed out regardless, and counted.
//! - An entry older than one already handed out (its process broke its promise) cannot be placed exactly: it
//!   is handed out next, and counted ([`Merge::late`]), so a report never misorders silently.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;

use vramtrace_format::{Api, Event};

use crate::model::input::entry::Entry;
use crate::model::input::fronts::{Fronts, Src};
use crate::model::input::run::{Run, Seqs};

pub(in crate::model) use crate::model::input::key::Key;

/// What the merge hands out.
#[derive(Clone, Debug)]
pub(in crate::model) enum Out {
    /// `.1` events of the process in slot `.0`, the next ones in the caller's buffer.
    Events(usize, usize),
    /// A timed record, whole, at its absolute time.
    Rec(Entry, u64),
    /// A place in the file (a hello): everything handed out before it was pushed before it. Never from the
    /// merge itself: [`crate::model::input::merge_link`] puts it between what the merge hands out.
    Mark(Entry),
}

/// A sorted run in the spill file: `[pos, end)` still to read, `buf` read ahead.
struct SpillRun {
    pos: u64,
    end: u64,
    buf: VecDeque<(Key, usize, Event)>,
}

/// One spilled event: slot u32, pid u32, seq u64, ts u64, tid u32, api u8, flags u8, device u32, result u32,
/// addr u64, size u64, aux u64, stack u32.
const SPILLED: usize = 66;
/// The most events handed out at once.
pub(in crate::model) const SEGMENT: usize = 4096;
/// Events read back from a spilled run at a time.
const SPILL_BLOCK: usize = 1024;

pub(in crate::model) struct Merge {
    /// The plain reference: everything collected, sorted once at the end.
    reference: Option<Vec<(Key, RefItem)>>,
    ref_next: usize,
    /// The trace is read to its end: everything may go.
    finished: bool,
    runs: Vec<Run>,
    free_runs: Vec<usize>,
    /// Per slot: the run its next in-order batch is appended to.
    tail: Vec<Option<usize>>,
    heap: Fronts,
    /// Records waiting, by slab index (the heap's `Src::Rec`). Reused once handed out, so the heap's indices
    /// stay as small as what waits, however many records a long trace holds.
    recs: Vec<Option<Entry>>,
    free_recs: Vec<usize>,
    /// Events waiting in memory.
    buffered: usize,
    bound: usize,
    seq: u64,
    /// The last entry handed out.
    last: Option<Key>,
    late: u64,
    forced: u64,
    spill: Option<File>,
    spill_len: u64,
    spill_failed: bool,
    spill_runs: Vec<SpillRun>,
}

impl Merge {
    pub fn new(bound: usize) -> Self {
        Merge {
            reference: None,
            ref_next: 0,
            finished: false,
            runs: Vec::new(),
            free_runs: Vec::new(),
            tail: Vec::new(),
            heap: Fronts::default(),
            recs: Vec::new(),
            free_recs: Vec::new(),
            buffered: 0,
            bound: bound.max(8),
            seq: 0,
            last: None,
            late: 0,
            forced: 0,
            spill: None,
            spill_len: 0,
            spill_failed: false,
            spill_runs: Vec::new(),
        }
    }

    /// The plain reference: holds everything and hands it out, sorted by [`Key`], only after [`Merge::finish`].
    pub fn reference() -> Self {
        Merge {
            reference: Some(Vec::new()),
            ..Merge::new(usize::MAX)
        }
    }

    /// Events that arrived after the merge had handed out something later (their process broke its promise),
    /// or were handed out early because memory ran past the bound and no spill file could be made.
    pub fn inexact(&self) -> u64 {
        self.late + self.forced
    }

    #[inline]
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    #[inline]
    fn check_late(&mut self, k: &Key) {
        if self.last.is_some_and(|l| *k < l) {
            self.late += 1;
        }
    }

    /// The process's tail run, when a batch whose first event is at `first` (time, thread) continues it in order.
    fn tail_for(&mut self, slot: usize, first: (u64, u32)) -> Option<usize> {
        if self.tail.len() <= slot {
            self.tail.resize(slot + 1, None);
        }
        let r = self.tail[slot]?;
        self.runs[r].back().is_none_or(|b| b <= first).then_some(r)
    }

    /// Appends events in order to run `r`; an empty run gets its heap entry back.
    fn append(&mut self, r: usize, ev: Vec<Event>, seqs: Seqs) {
        let run = &mut self.runs[r];
        let was_empty = run.is_empty();
        self.buffered += ev.len();
        run.push(ev, seqs);
        if was_empty {
            if let Some(k) = run.front_key() {
                self.heap.push(k, Src::Run(r));
            }
        }
    }

    /// Counts the events of a sorted batch older than the last entry handed out.
    fn count_late(&mut self, pid: u32, ev: &[Event], seqs: &Seqs) {
        let Some(l) = self.last else { return };
        if ev[0].ts_ns > l.ts {
            return;
        }
        for (i, e) in ev.iter().enumerate() {
            if Key::event(pid, seqs.at(i), e) >= l {
                break;
            }
            self.late += 1;
        }
    }

    /// A batch of process `pid` (slot `slot`), in the order the file holds it.
    pub fn push_events(&mut self, slot: usize, pid: u32, batch: Vec<Event>) {
        if batch.is_empty() {
            return;
        }
        let base = self.seq + 1;
        self.seq += batch.len() as u64;
        if let Some(all) = &mut self.reference {
            for (i, e) in batch.into_iter().enumerate() {
                all.push((
                    Key::event(pid, base + i as u64, &e),
                    RefItem::Event(slot, e),
                ));
            }
            return;
        }
        let (ev, seqs) = if batch.is_sorted_by_key(|e| (e.ts_ns, e.tid)) {
            // The common case: kept as it is.
            (batch, Seqs::From(base))
        } else {
            // Stable: one thread's events at the same nanosecond keep their order.
            let mut order: Vec<usize> = (0..batch.len()).collect();
            order.sort_by_key(|&i| (batch[i].ts_ns, batch[i].tid));
            let ev = order.iter().map(|&i| batch[i]).collect();
            let seqs = order.iter().map(|&i| base + i as u64).collect();
            (ev, Seqs::Each(seqs))
        };
        self.count_late(pid, &ev, &seqs);
        if let Some(r) = self.tail_for(slot, (ev[0].ts_ns, ev[0].tid)) {
            self.append(r, ev, seqs);
            return;
        }
        // A new run: the first batch of the process, or one older than its tail (a late batch). An emptied
        // tail run it replaces is free again (nothing refers to it: runs in the heap are never empty).
        if let Some(old) = self.tail[slot] {
            if self.runs[old].is_empty() {
                self.free_runs.push(old);
            }
        }
        let r = match self.free_runs.pop() {
            Some(r) => {
                let run = &mut self.runs[r];
                run.slot = slot;
                run.pid = pid;
                r
            }
            None => {
                self.runs.push(Run::new(slot, pid));
                self.runs.len() - 1
            }
        };
        self.tail[slot] = Some(r);
        self.append(r, ev, seqs);
    }

    /// A timed record of process `pid` (thread `tid`, or 0) at `ts`.
    pub fn push_record(&mut self, pid: u32, tid: u32, ts: u64, entry: Entry) {
        let k = Key {
            ts,
            what: entry.what(),
            pid,
            tid,
            seq: self.next_seq(),
        };
        if let Some(all) = &mut self.reference {
            all.push((k, RefItem::Rec(Some(entry))));
            return;
        }
        self.check_late(&k);
        let i = match self.free_recs.pop() {
            Some(i) => {
                self.recs[i] = Some(entry);
                i
            }
            None => {
                self.recs.push(Some(entry));
                self.recs.len() - 1
            }
        };
        self.heap.push(k, Src::Rec(i));
    }

    /// Whether more events wait than the bound allows; [`Merge::relieve`] then makes room.
    pub fn over_bound(&self) -> bool {
        self.buffered > self.bound
    }

    /// Makes room past the bound: spills every waiting run into one sorted run on disk. Returns false when no
    /// spill file could be made (the caller then hands out the oldest entries early: see [`Merge::force`]).
    pub fn relieve(&mut self) -> bool {
        if self.spill_failed {
            return false;
        }
        if self.spill.is_none() {
            match spill_file() {
                Some(f) => self.spill = Some(f),
                None => {
                    self.spill_failed = true;
                    return false;
                }
            }
        }
        let mut all: Vec<(Key, usize, Event)> = Vec::with_capacity(self.buffered);
        for run in &mut self.runs {
            let slot = run.slot;
            run.drain(|k, e| all.push((k, slot, e)));
        }
        all.sort_unstable_by_key(|x| x.0);
        let start = self.spill_len;
        let mut buf = Vec::with_capacity(SPILLED * 4096);
        let file = self.spill.as_ref().expect("made above");
        for chunk in all.chunks(4096) {
            buf.clear();
            for (k, slot, e) in chunk {
                encode(&mut buf, k, *slot, e);
            }
            if file.write_all_at(&buf, self.spill_len).is_err() {
                // Disk full: what was written of this run is dropped, and what is left goes back into memory
                // as one run per slot... simpler and still exact: keep everything in memory from now on.
                self.spill_failed = true;
                self.restore(all, start);
                return false;
            }
            self.spill_len += buf.len() as u64;
        }
        // The runs are gone: their heap entries with them.
        self.heap.retain(|src| !matches!(src, Src::Run(_)));
        self.free_runs = (0..self.runs.len()).collect();
        self.tail.iter_mut().for_each(|t| *t = None);
        self.buffered = 0;
        if let Some(&(k, _, _)) = all.first() {
            let i = self.spill_runs.len();
            self.spill_runs.push(SpillRun {
                pos: start,
                end: self.spill_len,
                buf: VecDeque::new(),
            });
            self.heap.push(k, Src::Spill(i));
        }
        true
    }

    /// After a failed spill: back into memory, one run per (slot, pid), in key order.
    fn restore(&mut self, all: Vec<(Key, usize, Event)>, spill_start: u64) {
        self.spill_len = spill_start;
        self.heap.retain(|src| !matches!(src, Src::Run(_)));
        for r in &mut self.runs {
            r.drain(|_, _| {});
        }
        self.free_runs = (0..self.runs.len()).collect();
        self.tail.iter_mut().for_each(|t| *t = None);
        self.buffered = 0;
        let mut by_slot: Vec<(u32, Vec<Event>, Vec<u64>)> = Vec::new();
        for (k, slot, e) in all {
            if by_slot.len() <= slot {
                by_slot.resize_with(slot + 1, Default::default);
            }
            let (pid, evs, seqs) = &mut by_slot[slot];
            *pid = k.pid;
            evs.push(e);
            seqs.push(k.seq);
        }
        for (slot, (pid, evs, seqs)) in by_slot.into_iter().enumerate() {
            if evs.is_empty() {
                continue;
            }
            let r = self.free_runs.pop().unwrap_or_else(|| {
                self.runs.push(Run::new(slot, pid));
                self.runs.len() - 1
            });
            let run = &mut self.runs[r];
            run.slot = slot;
            run.pid = pid;
            self.tail[slot] = Some(r);
            self.append(r, evs, Seqs::Each(seqs));
        }
    }

    /// The trace is read to its end: [`Merge::next`] hands out everything that waits.
    pub fn finish(&mut self) {
        self.finished = true;
    }

    /// Events waiting in memory.
    pub fn buffered(&self) -> usize {
        self.buffered
    }

    /// Records waiting (not spilled: they are few in a real trace, but a process can send millions).
    pub fn held_records(&self) -> usize {
        self.recs.len() - self.free_recs.len()
    }

    /// Hands out the next entries below `limit` (everything when `limit` is `u64::MAX` or the trace is read to
    /// its end), in key order: a record, or a run of one process's events (put in `buf`, which is cleared
    /// first) that no other waiting entry comes between. `force`: hand out regardless of the limit (counted as
    /// inexact where it is not yet reached).
    pub fn next(&mut self, limit: u64, force: bool, buf: &mut Vec<Event>) -> Option<Out> {
        buf.clear();
        if self.reference.is_some() {
            return self.next_reference(buf);
        }
        self.step(limit, force, buf)
    }

    /// Hands out, like [`Merge::next`] without `force`, as many entries as are below `limit`, appended to `outs`
    /// and `buf` until `buf` holds at least `upto` events: each in `outs`, in key order, an `Out::Events` taking
    /// the next events of `buf`. Why: when processes interleave finely, most runs are an event or two, and a
    /// call per run cost as much as the merge itself. Returns whether anything was handed out.
    pub fn next_batch(
        &mut self,
        limit: u64,
        upto: usize,
        outs: &mut Vec<Out>,
        buf: &mut Vec<Event>,
    ) -> bool {
        let before = outs.len();
        if self.reference.is_some() {
            while buf.len() < upto && outs.len() - before < upto {
                match self.next_reference(buf) {
                    Some(x) => outs.push(x),
                    None => break,
                }
            }
            return outs.len() > before;
        }
        // Records add no event: bounded by count too.
        while buf.len() < upto && outs.len() - before < upto {
            match self.step(limit, false, buf) {
                Some(x) => outs.push(x),
                None => break,
            }
        }
        outs.len() > before
    }

    /// One entry or run of events, appended to `buf`. Inlined into the batch's loop: once per event when
    /// processes interleave finely.
    #[inline(always)]
    fn step(&mut self, limit: u64, force: bool, buf: &mut Vec<Event>) -> Option<Out> {
        let limit = if self.finished { u64::MAX } else { limit };
        let open = |ts: u64| limit == u64::MAX || ts < limit;
        let first = buf.len();
        loop {
            let (k, src) = self.heap.peek()?;
            if !open(k.ts) && !force {
                return None;
            }
            match src {
                Src::Rec(i) => {
                    self.heap.pop();
                    self.last = Some(k);
                    self.free_recs.push(i);
                    let entry = self.recs[i].take().expect("a record waiting in the heap");
                    return Some(Out::Rec(entry, k.ts));
                }
                Src::Run(r) => {
                    // The top event goes: it is the smallest entry waiting. When processes interleave finely the
                    // run's next event is then behind another source's, so this is the whole step: the next
                    // front replaces the top (one sift). Only a run still on top after that looks up the
                    // runner-up and sweeps everything below it at once.
                    let (mut n, mut forced, mut last) =
                        self.runs[r].take_below(buf, &Key::MAX, limit, force, 1);
                    let slot = self.runs[r].slot;
                    let mut on_top = self.put_back(r);
                    while on_top && n < SEGMENT {
                        let stop = self.heap.second();
                        let (m, f, l) =
                            self.runs[r].take_below(buf, &stop, limit, false, SEGMENT - n);
                        if m == 0 {
                            break;
                        }
                        n += m;
                        forced += f;
                        last = l;
                        on_top = self.put_back(r);
                    }
                    self.forced += forced;
                    self.buffered -= n;
                    if let Some(last) = last {
                        self.last = Some(last);
                    }
                    if n == 0 {
                        continue;
                    }
                    return Some(Out::Events(slot, n));
                }
                Src::Spill(i) => {
                    // What may not be reached: the second-smallest entry.
                    let stop = self.heap.second();
                    let mut slot = None;
                    while let Some(&(k, s, e)) = self.spill_peek(i) {
                        let same = slot.is_none_or(|x| x == s);
                        let n = buf.len() - first;
                        if !same
                            || !((k.ts < stop.ts || k < stop) && (open(k.ts) || (force && n == 0)))
                            || n >= SEGMENT
                        {
                            break;
                        }
                        if !open(k.ts) {
                            self.forced += 1;
                        }
                        self.spill_pop(i);
                        slot = Some(s);
                        buf.push(e);
                        self.last = Some(k);
                    }
                    match self.spill_peek(i).map(|x| x.0) {
                        Some(nk) => self.heap.replace_top(nk, Src::Spill(i)),
                        None => self.heap.pop(),
                    }
                    match slot {
                        Some(s) => return Some(Out::Events(s, buf.len() - first)),
                        None => continue,
                    }
                }
            }
        }
    }

    /// Run `r`, on top, handed out its front: its next front replaces it in the heap (or the run leaves it).
    /// Whether the run is still on top.
    #[inline(always)]
    fn put_back(&mut self, r: usize) -> bool {
        match self.runs[r].front_key() {
            Some(k) => {
                self.heap.replace_top(k, Src::Run(r));
                matches!(self.heap.peek(), Some((_, Src::Run(t))) if t == r)
            }
            None => {
                self.heap.pop();
                self.retire(r);
                false
            }
        }
    }

    /// A run emptied: free it (unless it is still its process's tail, which takes the next in-order batch).
    fn retire(&mut self, r: usize) {
        let slot = self.runs[r].slot;
        if self.tail.get(slot).copied().flatten() != Some(r) {
            self.free_runs.push(r);
        }
    }

    fn spill_fill(&mut self, i: usize) {
        let run = &mut self.spill_runs[i];
        if !run.buf.is_empty() || run.pos >= run.end {
            return;
        }
        let n = (((run.end - run.pos) as usize) / SPILLED).min(SPILL_BLOCK);
        let mut raw = vec![0u8; n * SPILLED];
        let ok = self
            .spill
            .as_ref()
            .is_some_and(|f| f.read_exact_at(&mut raw, run.pos).is_ok());
        if !ok {
            // The spill file cannot be read back: those events are lost to the report (counted as inexact).
            self.forced += (run.end - run.pos) / SPILLED as u64;
            run.pos = run.end;
            return;
        }
        run.pos += raw.len() as u64;
        for rec in raw.chunks_exact(SPILLED) {
            if let Some(x) = decode(rec) {
                run.buf.push_back(x);
            }
        }
    }

    fn spill_peek(&mut self, i: usize) -> Option<&(Key, usize, Event)> {
        self.spill_fill(i);
        self.spill_runs[i].buf.front()
    }

    fn spill_pop(&mut self, i: usize) -> Option<(Key, usize, Event)> {
        self.spill_fill(i);
        self.spill_runs[i].buf.pop_front()
    }

    fn next_reference(&mut self, buf: &mut Vec<Event>) -> Option<Out> {
        if !self.finished {
            return None;
        }
        let all = self.reference.as_mut().expect("reference");
        if self.ref_next == 0 {
            all.sort_by_key(|x| x.0);
        }
        let (k, item) = all.get_mut(self.ref_next)?;
        self.ref_next += 1;
        Some(match item {
            RefItem::Event(slot, e) => {
                buf.push(*e);
                Out::Events(*slot, 1)
            }
            RefItem::Rec(entry) => Out::Rec(entry.take().expect("handed out once"), k.ts),
        })
    }
}

/// One entry the reference merge holds: an event of a slot, or a record (taken when handed out).
enum RefItem {
    Event(usize, Event),
    Rec(Option<Entry>),
}

/// A spill file nobody else can open: made in the temp directory and unlinked at once.
fn spill_file() -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::env::temp_dir();
    if let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(&dir)
    {
        return Some(f);
    }
    for n in 0..100u32 {
        let p = dir.join(format!("vramtrace-merge-{}-{n}", std::process::id()));
        if let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&p)
        {
            let _ = std::fs::remove_file(&p);
            return Some(f);
        }
    }
    None
}

fn encode(buf: &mut Vec<u8>, k: &Key, slot: usize, e: &Event) {
    buf.extend_from_slice(&(slot as u32).to_le_bytes());
    buf.extend_from_slice(&k.pid.to_le_bytes());
    buf.extend_from_slice(&k.seq.to_le_bytes());
    buf.extend_from_slice(&e.ts_ns.to_le_bytes());
    buf.extend_from_slice(&e.tid.to_le_bytes());
    buf.push(e.api as u8);
    buf.push(e.flags);
    buf.extend_from_slice(&e.device.to_le_bytes());
    buf.extend_from_slice(&e.result.to_le_bytes());
    buf.extend_from_slice(&e.addr.to_le_bytes());
    buf.extend_from_slice(&e.size.to_le_bytes());
    buf.extend_from_slice(&e.aux.to_le_bytes());
    buf.extend_from_slice(&e.stack.to_le_bytes());
}

fn decode(b: &[u8]) -> Option<(Key, usize, Event)> {
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let slot = u32_at(0) as usize;
    let pid = u32_at(4);
    let seq = u64_at(8);
    let e = Event {
        ts_ns: u64_at(16),
        tid: u32_at(24),
        api: Api::from_u8(b[28])?,
        flags: b[29],
        device: u32_at(30),
        result: u32_at(34),
        addr: u64_at(38),
        size: u64_at(46),
        aux: u64_at(54),
        stack: u32_at(62),
    };
    let k = Key::event(pid, seq, &e);
    Some((k, slot, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_back_whole_in_key_order() {
        // Pushed out of time order; at one nanosecond a drop sorts before a process's end, before a bridge record.
        let mut m = Merge::new(1 << 20);
        m.push_record(1, 0, 12, Entry::ContextGone { slot: 3, device: 7 });
        m.push_record(1, 0, 10, Entry::End { slot: 3 });
        m.push_record(
            1,
            0,
            10,
            Entry::Dropped {
                slot: 3,
                count: usize::MAX as u64,
            },
        );
        m.finish();
        let mut buf = Vec::new();
        let mut got = Vec::new();
        while let Some(x) = m.next(u64::MAX, false, &mut buf) {
            match x {
                Out::Rec(Entry::Dropped { slot, count }, ts) => got.push((ts, "drop", slot, count)),
                Out::Rec(Entry::End { slot }, ts) => got.push((ts, "end", slot, 0)),
                Out::Rec(Entry::ContextGone { slot, device }, ts) => {
                    got.push((ts, "ctx", slot, device as u64))
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            got,
            [
                (10, "drop", 3, usize::MAX as u64),
                (10, "end", 3, 0),
                (12, "ctx", 3, 7)
            ]
        );
    }

    #[test]
    fn record_slots_are_reused() {
        let mut m = Merge::new(1 << 20);
        let mut buf = Vec::new();
        for i in 0..10_000u64 {
            m.push_record(1, 0, i, Entry::Dropped { slot: 0, count: i });
            assert!(
                matches!(m.next(u64::MAX, false, &mut buf), Some(Out::Rec(Entry::Dropped { count, .. }, _)) if count == i)
            );
        }
        assert_eq!(m.recs.len(), 1, "one slot, reused");
    }

    fn ev(ts: u64, tid: u32) -> Event {
        crate::model::input::run::tests::event(ts, tid, ts)
    }

    /// Everything `m` hands out once finished: (slot, event time, thread).
    fn all_out(m: &mut Merge) -> Vec<(usize, u64, u32)> {
        m.finish();
        let (mut buf, mut got) = (Vec::new(), Vec::new());
        while let Some(x) = m.next(u64::MAX, false, &mut buf) {
            if let Out::Events(slot, n) = x {
                assert_eq!(n, buf.len());
                got.extend(buf.iter().map(|e| (slot, e.ts_ns, e.tid)));
            }
        }
        got
    }

    #[test]
    fn a_spill_that_cannot_be_written_keeps_everything_in_order_in_memory() {
        // In order, out of order within a batch, and a batch older than its process's last (a run of its own).
        let batches: Vec<(usize, u32, Vec<Event>)> = vec![
            (0, 10, vec![ev(5, 1), ev(9, 1), ev(12, 2)]),
            (1, 11, vec![ev(7, 3), ev(3, 4), ev(7, 3), ev(20, 3)]),
            (0, 10, vec![ev(14, 1), ev(30, 1)]),
            (0, 10, vec![ev(2, 2), ev(13, 2)]),
            (2, 12, vec![ev(1, 5), ev(40, 5)]),
        ];
        let mut reference = Merge::reference();
        let mut m = Merge::new(8);
        for (slot, pid, b) in &batches {
            reference.push_events(*slot, *pid, b.clone());
            m.push_events(*slot, *pid, b.clone());
        }
        assert!(m.over_bound());
        // A file open only for reading: the spill's write fails as on a full disk.
        m.spill = Some(File::open("/dev/null").unwrap());
        assert!(!m.relieve());
        assert_eq!(m.buffered(), 13);
        let want = all_out(&mut reference);
        assert_eq!(want.len(), 13);
        assert_eq!(all_out(&mut m), want);
        assert_eq!(m.inexact(), 0);
    }

    #[test]
    fn spilled_runs_come_back_in_order() {
        let mut reference = Merge::reference();
        let mut m = Merge::new(8);
        for round in 0..4u64 {
            for slot in 0..3usize {
                let b: Vec<Event> = (0..5)
                    .map(|i| ev(round * 100 + i * 7 + slot as u64, 1))
                    .collect();
                reference.push_events(slot, slot as u32, b.clone());
                m.push_events(slot, slot as u32, b);
                if m.over_bound() {
                    assert!(m.relieve());
                    assert_eq!(m.buffered(), 0);
                }
            }
        }
        assert_eq!(all_out(&mut m), all_out(&mut reference));
    }
}

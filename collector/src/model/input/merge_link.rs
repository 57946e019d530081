//! The merge on a thread of its own, between the replay's intake (records in file order) and its accounting
//! (entries in key order).
//!
//! Why: with the frames decoded on their own thread ([`crate::model::input::decode`]), the replay's thread was the bound, and
//! the merge (placing every event in key order) was about half of it. Here the intake queues what it used to
//! call on the merge (pushes and drains, in the same order, each drain with the limit of its moment) and the
//! merge thread runs them in that order: it hands out exactly what the inline merge would, and the replay
//! applies it in the same order. Records travel whole ([`Entry`]) and come back whole: nothing waits on the
//! replay's side keyed by ids.
//!
//! What the replay's side does between a push and the entries coming back (a hello, a call-site record) is done
//! earlier relative to the accounting than inline. The accounting never depends on that: the reference merge
//! (everything handed out at the end) sees every record before any entry, and the tests hold both equal.
//!
//! Without a thread to be had, the same queue runs inline, at once.

use std::collections::VecDeque;
use std::thread::Scope;

use crossbeam_channel::{bounded, Receiver, Select, Sender};
use vramtrace_format::Event;

use crate::model::input::entry::Entry;
use crate::model::input::merge::{Merge, Out, SEGMENT};

/// Records the merge holds at most before handing out the oldest early.
const MAX_HELD_RECORDS: usize = 1 << 16;

/// What the intake asks of the merge, in its order.
pub(in crate::model) enum Input {
    /// A batch of process `pid` (slot `slot`). `limit`: the replay's limit after it, for the bound's last resort
    /// (handing out the oldest early when nothing can be spilled).
    Events {
        slot: usize,
        pid: u32,
        batch: Vec<Event>,
        limit: u64,
    },
    Record {
        pid: u32,
        tid: u32,
        ts: u64,
        entry: Entry,
    },
    /// Hand out everything below this limit.
    Drain(u64),
    /// A place in the file, handed back as `Out::Mark` after everything handed out before it.
    Mark(Entry),
}

/// Entries handed out, in key order: each `Out::Events` takes the next events of `events`.
#[derive(Default)]
pub(in crate::model) struct Chunk {
    pub outs: Vec<Out>,
    pub events: Vec<Event>,
    /// The last chunk: the merge's count of entries it could not place exactly.
    pub done: Option<u64>,
}

/// Events a chunk holds before it goes; inputs' events queued before they go.
const CHUNK_EVENTS: usize = 16 << 10;
const INPUT_EVENTS: usize = 16 << 10;
const INPUT_ITEMS: usize = 512;
/// Batches in flight each way: deep enough that the merge and the replay seldom wait on each other (see
/// `decode::AHEAD`).
const IN_FLIGHT: usize = 16;

/// The merge's side: runs the inputs in order, gathers what comes out into chunks.
pub(in crate::model) struct Stage {
    merge: Merge,
    chunk: Chunk,
    buf: Vec<Event>,
    /// Chunks the replay is done with, to fill again (their buffers keep their capacity).
    spent: Option<Receiver<Chunk>>,
}

impl Stage {
    pub fn new(merge: Merge) -> Stage {
        Stage {
            merge,
            chunk: Chunk::default(),
            buf: Vec::new(),
            spent: None,
        }
    }

    /// Runs one input; full chunks go to `emit`.
    fn run(&mut self, input: Input, emit: &mut impl FnMut(Chunk)) {
        match input {
            Input::Events {
                slot,
                pid,
                batch,
                limit,
            } => {
                self.merge.push_events(slot, pid, batch);
                if self.merge.over_bound() && !self.merge.relieve() {
                    // No spill file: the oldest go out early (counted by the merge as inexact).
                    let keep = self.merge.buffered() - self.merge.buffered() / 8;
                    while self.merge.buffered() > keep {
                        match self.merge.next(limit, true, &mut self.buf) {
                            Some(x) => self.take(x, emit),
                            None => break,
                        }
                    }
                }
            }
            Input::Record {
                pid,
                tid,
                ts,
                entry,
            } => {
                self.merge.push_record(pid, tid, ts, entry);
                // Records are not spilled: past a bound the oldest go out early (counted as inexact), so a
                // process that sends millions of them (no driver event to move its front) costs bounded memory.
                if self.merge.held_records() > MAX_HELD_RECORDS {
                    let keep = MAX_HELD_RECORDS - MAX_HELD_RECORDS / 8;
                    while self.merge.held_records() > keep {
                        match self.merge.next(0, true, &mut self.buf) {
                            Some(x) => self.take(x, emit),
                            None => break,
                        }
                    }
                }
            }
            Input::Drain(limit) => self.drain(limit, emit),
            Input::Mark(entry) => {
                self.chunk.outs.push(Out::Mark(entry));
                self.flush_if_full(emit);
            }
        }
    }

    fn drain(&mut self, limit: u64, emit: &mut impl FnMut(Chunk)) {
        // Straight into the chunk: no copy between the merge and the replay but the channel's.
        while self.merge.next_batch(
            limit,
            CHUNK_EVENTS,
            &mut self.chunk.outs,
            &mut self.chunk.events,
        ) {
            self.flush_if_full(emit);
        }
    }

    /// Moves what the merge handed out early (`out`, its events in `self.buf`) into the chunk.
    fn take(&mut self, out: Out, emit: &mut impl FnMut(Chunk)) {
        self.chunk.outs.push(out);
        self.chunk.events.extend_from_slice(&self.buf);
        self.flush_if_full(emit);
    }

    fn flush_if_full(&mut self, emit: &mut impl FnMut(Chunk)) {
        if self.chunk.events.len() >= CHUNK_EVENTS || self.chunk.outs.len() >= CHUNK_EVENTS {
            self.flush(emit);
        }
    }

    fn flush(&mut self, emit: &mut impl FnMut(Chunk)) {
        if self.chunk.outs.is_empty() {
            return;
        }
        let next = match self.spent.as_ref().map(|r| r.try_recv()) {
            Some(Ok(mut c)) => {
                c.outs.clear();
                c.events.clear();
                c.done = None;
                c
            }
            // On the thread, made at its full size: grown by doubling, a chunk's events were copied about ten
            // times over.
            Some(Err(_)) => Chunk {
                outs: Vec::with_capacity(CHUNK_EVENTS),
                // A drain stops once the chunk holds CHUNK_EVENTS, after an entry of up to SEGMENT events.
                events: Vec::with_capacity(CHUNK_EVENTS + SEGMENT),
                done: None,
            },
            // Inline, a chunk goes after every input, however little it holds: made small.
            None => Chunk::default(),
        };
        emit(std::mem::replace(&mut self.chunk, next));
    }

    /// The trace is read: everything goes, then the last chunk.
    fn finish(&mut self, emit: &mut impl FnMut(Chunk)) {
        self.merge.finish();
        self.drain(u64::MAX, emit);
        self.flush(emit);
        emit(Chunk {
            done: Some(self.merge.inexact()),
            ..Chunk::default()
        });
    }
}

/// The merge's thread is gone before its last chunk: it panicked (a bug; its message is above). The replay stops
/// here rather than read the rest of the trace for nothing; the scope then ends with the panic.
#[cold]
fn gone() -> ! {
    panic!("the report's merge thread stopped");
}

/// The replay's end of the merge: inline, or a channel each way to the merge's thread.
pub(in crate::model) struct MergeLink {
    inline: Option<Stage>,
    /// Inline: chunks handed out, not yet applied.
    ready: VecDeque<Chunk>,
    pending: Vec<Input>,
    pending_events: usize,
    last_drain: Option<u64>,
    tx: Option<Sender<Vec<Input>>>,
    rx: Option<Receiver<Chunk>>,
    /// Chunks replayed, back to the thread to be filled again.
    spent: Option<Sender<Chunk>>,
}

impl MergeLink {
    pub fn inline(merge: Merge) -> MergeLink {
        MergeLink {
            inline: Some(Stage::new(merge)),
            ready: VecDeque::new(),
            pending: Vec::new(),
            pending_events: 0,
            last_drain: None,
            tx: None,
            rx: None,
            spent: None,
        }
    }

    /// Moves the merge onto a thread of `scope`; without one it stays inline. The thread ends when this link is
    /// dropped or finished: the link must be dropped inside the scope (a panic unwinding the scope's closure
    /// drops it), or the scope would wait for the thread forever.
    pub fn start_thread<'s>(&mut self, scope: &'s Scope<'s, '_>) {
        let Some(mut stage) = self.inline.take() else {
            return;
        };
        let (tx, in_rx) = bounded::<Vec<Input>>(IN_FLIGHT);
        let (out_tx, rx) = bounded::<Chunk>(IN_FLIGHT);
        let (spent_tx, spent_rx) = bounded::<Chunk>(IN_FLIGHT + 2);
        stage.spent = Some(spent_rx);
        // The stage moves to the thread once it is known to run; until then it waits here.
        let (stage_tx, stage_rx) = bounded::<Stage>(1);
        let spawned = std::thread::Builder::new()
            .name("vramtrace-merge".into())
            .spawn_scoped(scope, move || {
                let Ok(mut stage) = stage_rx.recv() else {
                    return;
                };
                // The replay gone (it panicked): stop at once, with nobody to hand anything to.
                let gone = std::cell::Cell::new(false);
                let mut emit = |c: Chunk| {
                    if out_tx.send(c).is_err() {
                        gone.set(true);
                    }
                };
                for inputs in in_rx.iter() {
                    for input in inputs {
                        stage.run(input, &mut emit);
                    }
                    stage.flush(&mut emit);
                    if gone.get() {
                        return;
                    }
                }
                // The intake's end: the sender is dropped by `finish` (or as the replay unwinds: then the first
                // chunk that cannot go ends this).
                stage.finish(&mut emit);
            });
        match spawned {
            Ok(_) => {
                let _ = stage_tx.send(stage);
                self.tx = Some(tx);
                self.rx = Some(rx);
                self.spent = Some(spent_tx);
            }
            Err(_) => self.inline = Some(stage),
        }
    }

    pub fn events(&mut self, slot: usize, pid: u32, batch: Vec<Event>, limit: u64) {
        if self.inline.is_none() {
            self.pending_events += batch.len();
        }
        self.last_drain = None;
        self.queue(Input::Events {
            slot,
            pid,
            batch,
            limit,
        });
    }

    pub fn record(&mut self, pid: u32, tid: u32, ts: u64, entry: Entry) {
        self.last_drain = None;
        self.queue(Input::Record {
            pid,
            tid,
            ts,
            entry,
        });
    }

    /// A place in the file: comes back as `Out::Mark(entry)` after everything handed out before it.
    pub fn mark(&mut self, entry: Entry) {
        self.queue(Input::Mark(entry));
    }

    /// Everything below `limit` may go. A drain right after the same one adds nothing.
    pub fn drain(&mut self, limit: u64) {
        if self.last_drain == Some(limit) {
            return;
        }
        self.last_drain = Some(limit);
        self.queue(Input::Drain(limit));
    }

    fn queue(&mut self, input: Input) {
        match &mut self.inline {
            Some(stage) => {
                let ready = &mut self.ready;
                stage.run(input, &mut |c| ready.push_back(c));
                stage.flush(&mut |c| ready.push_back(c));
            }
            None => self.pending.push(input),
        }
    }

    /// Whether the queued inputs should go now.
    pub fn full(&self) -> bool {
        self.pending_events >= INPUT_EVENTS || self.pending.len() >= INPUT_ITEMS
    }

    /// Sends the queued inputs, or, while the thread's inbox is full, takes a chunk it handed out (the caller
    /// applies it and calls again). `None`: sent (or nothing to send).
    pub fn send_or_take(&mut self) -> Option<Chunk> {
        if self.pending.is_empty() {
            return None;
        }
        let (Some(tx), Some(rx)) = (&self.tx, &self.rx) else {
            return None;
        };
        let mut sel = Select::new();
        let send = sel.send(tx);
        let recv = sel.recv(rx);
        let op = sel.select();
        match op.index() {
            i if i == send => {
                let inputs = std::mem::take(&mut self.pending);
                self.pending_events = 0;
                if op.send(tx, inputs).is_err() {
                    gone();
                }
                None
            }
            i if i == recv => match op.recv(rx) {
                Ok(c) => Some(c),
                Err(_) => gone(),
            },
            _ => unreachable!("two operations were selected from"),
        }
    }

    /// A chunk the replay is done with: its buffers are filled again.
    pub fn give_back(&mut self, c: Chunk) {
        if let Some(tx) = &self.spent {
            let _ = tx.try_send(c);
        }
    }

    /// A chunk handed out already, if any (never waits).
    pub fn try_take(&mut self) -> Option<Chunk> {
        if let Some(c) = self.ready.pop_front() {
            return Some(c);
        }
        self.rx.as_ref()?.try_recv().ok()
    }

    /// The trace is read: tells the merge (after the queued inputs, which the caller has sent with
    /// `send_or_take` until it returned `None`). Then [`MergeLink::take_until_done`] returns what is left.
    pub fn finish(&mut self) {
        match &mut self.inline {
            Some(stage) => {
                let ready = &mut self.ready;
                stage.finish(&mut |c| ready.push_back(c));
            }
            // Closing the inbox is the thread's sign.
            None => self.tx = None,
        }
    }

    /// After [`MergeLink::finish`]: the next chunk, waiting for it. `None` after the last one (or when the
    /// thread is gone).
    pub fn take_until_done(&mut self) -> Option<Chunk> {
        if let Some(c) = self.ready.pop_front() {
            return Some(c);
        }
        match self.rx.as_ref()?.recv() {
            Ok(c) => Some(c),
            Err(_) => gone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;
    use vramtrace_format::codec::{encode_header, put_events};
    use vramtrace_format::{Api, TraceHeader};

    fn header() -> TraceHeader {
        TraceHeader {
            start_unix_ns: 0,
            start_mono_ns: 0,
            command: vec!["t".into()],
            hostname: "h".into(),
            vramtrace_version: "t".into(),
            extra: vec![],
        }
    }

    use crate::model::input::run::tests::event as ev;

    /// Inputs as an intake makes them: four processes' batches (some late), records, drains with a limit that
    /// mostly grows and sometimes falls back (a newcomer).
    fn inputs() -> Vec<Input> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut now = [1000u64; 4];
        let mut out = Vec::new();
        let mut id = 0;
        for i in 0..3000u64 {
            let p = rnd(4) as usize;
            match rnd(10) {
                0 => {
                    id += 1;
                    out.push(Input::Record {
                        pid: 100 + p as u32,
                        tid: 1,
                        ts: now[p],
                        entry: Entry::Dropped { slot: p, count: id },
                    });
                }
                1 if rnd(2) == 0 => {
                    id += 1;
                    out.push(Input::Mark(Entry::ContextGone {
                        slot: p,
                        device: id as u32,
                    }));
                }
                1 | 2 => {
                    let low = *now.iter().min().unwrap();
                    out.push(Input::Drain(low.saturating_sub(rnd(3) * 50)));
                }
                _ => {
                    // Mostly in order; one in eight starts before the process's last one (a late batch).
                    let start = if rnd(8) == 0 {
                        now[p].saturating_sub(300)
                    } else {
                        now[p]
                    };
                    let n = 1 + rnd(40);
                    let batch: Vec<Event> = (0..n)
                        .map(|k| ev(start + k * (1 + rnd(30)), 1 + rnd(2) as u32, i << 8 | k))
                        .collect();
                    now[p] = now[p].max(batch.iter().map(|e| e.ts_ns).max().unwrap());
                    out.push(Input::Events {
                        slot: p,
                        pid: 100 + p as u32,
                        batch,
                        limit: *now.iter().min().unwrap(),
                    });
                }
            }
        }
        out
    }

    /// One entry handed out: (slot, kind, record's number, event).
    type Flat = (usize, u8, u64, Option<Event>);

    fn o_what(o: &Out) -> u8 {
        match o {
            Out::Rec(e, _) => e.what(),
            _ => u8::MAX,
        }
    }

    /// Everything handed out, flattened, and the count of inexact entries.
    fn flat(chunks: &[Chunk]) -> (Vec<Flat>, Option<u64>) {
        let mut v = Vec::new();
        let mut done = None;
        for c in chunks {
            let mut at = 0;
            for o in &c.outs {
                match o {
                    Out::Events(s, n) => {
                        for e in &c.events[at..at + n] {
                            v.push((*s, u8::MAX, 0, Some(*e)));
                        }
                        at += n;
                    }
                    Out::Rec(Entry::Dropped { slot, count }, _) => {
                        v.push((*slot, o_what(o), *count, None))
                    }
                    Out::Mark(Entry::ContextGone { slot, device }) => {
                        v.push((*slot, u8::MAX - 1, *device as u64, None))
                    }
                    other => panic!("not pushed: {other:?}"),
                }
            }
            if c.done.is_some() {
                done = c.done;
            }
        }
        (v, done)
    }

    fn run(link: &mut MergeLink) -> Vec<Chunk> {
        let mut got = Vec::new();
        for input in inputs() {
            match input {
                Input::Events {
                    slot,
                    pid,
                    batch,
                    limit,
                } => link.events(slot, pid, batch, limit),
                Input::Record {
                    pid,
                    tid,
                    ts,
                    entry,
                } => link.record(pid, tid, ts, entry),
                Input::Drain(l) => link.drain(l),
                Input::Mark(entry) => link.mark(entry),
            }
            if link.full() {
                while let Some(c) = link.send_or_take() {
                    got.push(c);
                }
            }
            while let Some(c) = link.try_take() {
                got.push(c);
            }
        }
        while let Some(c) = link.send_or_take() {
            got.push(c);
        }
        link.finish();
        while let Some(c) = link.take_until_done() {
            let done = c.done.is_some();
            got.push(c);
            if done {
                break;
            }
        }
        got
    }

    #[test]
    fn the_merge_thread_hands_out_what_the_inline_merge_does() {
        let inline = flat(&run(&mut MergeLink::inline(Merge::new(1 << 20))));
        // A small bound too: spilling runs on the thread as it does inline.
        for bound in [1 << 20, 64] {
            let threaded = std::thread::scope(|scope| {
                let mut link = MergeLink::inline(Merge::new(bound));
                link.start_thread(scope);
                assert!(link.tx.is_some(), "the merge runs on its thread");
                flat(&run(&mut link))
            });
            let inline_b = flat(&run(&mut MergeLink::inline(Merge::new(bound))));
            assert_eq!(threaded, inline_b, "bound {bound}");
            // The bound changes where events wait, never what is handed out.
            assert_eq!(threaded.0, inline.0, "bound {bound}");
        }
        assert!(inline.0.len() > 10_000, "{}", inline.0.len());
        // The late batches' events that the drains had passed are counted, the same either way.
        assert!(inline.1.is_some_and(|n| n > 0), "{:?}", inline.1);
    }

    #[test]
    fn a_panic_in_the_replay_is_a_panic_not_a_hang() {
        // Far more events than the channels hold, and a tap that panics at the first one it sees: the merge's
        // thread is blocked on a full channel when the replay's thread unwinds.
        struct Boom;
        impl crate::model::observe::tap::Tap for Boom {
            fn step(&mut self, _: &crate::model::observe::tap::Step) {
                panic!("a bug in the replay");
            }
        }
        let mut t = encode_header(&header());
        for i in 0..200u64 {
            let batch: Vec<Event> = (0..4096u64)
                .map(|k| ev(10 + i * 4096 + k, 1, (i * 4096 + k) << 4))
                .collect();
            put_events(&mut t, 7, &batch);
        }
        let (done_tx, done_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(move || {
                let _ = crate::model::analyze_reader_tapped(&t[..], None, &mut Boom);
            });
            let _ = done_tx.send(r.is_err());
        });
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(30)), Ok(true));
    }

    /// A process's hello read after some of its entries were replayed, and an out-of-memory snapshot between.
    fn late_hello() -> Vec<vramtrace_format::Record> {
        use vramtrace_format::{Hello, Oom, Record};
        let hello = |pid: u32, ts: u64, cmd: &str| {
            Record::Hello(Hello {
                pid,
                ppid: 1,
                ts_ns: ts,
                cmdline: vec![cmd.into()],
                hostname: "h".into(),
                rank: Some(pid),
                local_rank: None,
                slurm_procid: None,
                shim_version: "t".into(),
                extra: vec![],
            })
        };
        let alloc = |pid: u32, ts: u64, addr: u64| Record::Events {
            pid,
            events: vec![Event {
                size: 1 << 20,
                ..ev(ts, 1, addr)
            }],
        };
        vec![
            hello(8, 0, "eight"),
            alloc(7, 10, 0x1000),
            alloc(8, 11, 0x2000),
            Record::Oom(Oom {
                pid: 8,
                tid: 1,
                ts_ns: 15,
                device: 0,
                api: Api::MemAlloc as u8,
                flags: 0,
                requested_bytes: 1 << 30,
                result: 2,
                device_free_bytes: None,
                device_total_bytes: None,
                cap_bytes: None,
                job_used_bytes: None,
                process_used_bytes: None,
                extra: vec![],
            }),
            alloc(7, 20, 0x1001),
            alloc(7, 30, 0x1002),
            Record::Tick { pid: 8, ts_ns: 100 },
            hello(7, 5, "seven"),
            Record::Goodbye { pid: 7, ts_ns: 200 },
            Record::Goodbye { pid: 8, ts_ns: 200 },
        ]
    }

    fn snapshot_names(threaded: bool, reference: bool) -> Vec<(u32, bool, Vec<String>)> {
        std::thread::scope(|scope| {
            let mut st = crate::model::replay::Replay::new(0, 1 << 20, reference);
            if threaded {
                st.merge.start_thread(scope);
            }
            for r in late_hello() {
                st.on_record(r);
            }
            let a = st.finish(header(), None);
            a.ooms[0]
                .processes
                .iter()
                .map(|p| (p.pid, p.announced, p.cmdline.clone()))
                .collect()
        })
    }

    #[test]
    fn a_late_hello_names_its_process_the_same_whichever_thread_merges() {
        // Process 7 held memory at the OOM, and its hello (stamped before) was read after the OOM was replayed.
        let want = vec![
            (8, true, vec!["eight".to_string()]),
            (7, true, vec!["seven".to_string()]),
        ];
        assert_eq!(snapshot_names(false, false), want, "inline");
        assert_eq!(snapshot_names(true, false), want, "threaded");
        assert_eq!(snapshot_names(false, true), want, "the reference");
    }
}

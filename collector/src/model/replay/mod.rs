//! The replay: live sets, peaks, timelines and per-process figures, applied entry by entry in the order the
//! merge ([`crate::model::input::merge`]) hands them out.

pub(crate) mod book;
pub mod framework;
pub(crate) mod oom_snapshot;
pub(crate) mod records;
pub(crate) mod site_store;
pub(crate) mod sites;

use std::collections::HashMap;
use vramtrace_format::keys;

use vramtrace_format::{flags, Api, Effect, Event, TraceHeader, NO_DEVICE};

use crate::fasthash::FastMap;
use crate::model::analysis::*;
use crate::model::input::entry::Entry;
use crate::model::input::merge::{Merge, Out};
use crate::model::input::merge_link::{Chunk, MergeLink};
use crate::model::observe::leak::{site_ref, trim_leaks};
use crate::model::observe::steps::StepSeries;
use crate::model::observe::tap::{Change, ErrorStep, Step, Tap};
use crate::model::observe::timeline::Timeline;
use crate::model::observe::timeline::{self, TimelineBuilder};
pub(crate) use crate::model::replay::book::HOST_DEVICE;
use crate::model::replay::book::{Act, Book, Undone};
use crate::model::replay::site_store::{self as callsites, NO_SITE};
use crate::symbols::Symbolizer;

/// Aligned to 16 so that, in the address maps' (key, value) buckets, the value starts on a 16-byte boundary:
/// the map's out-of-line `remove` copies a bucket out in 16-byte pieces, and the replay's read of the value then
/// lines up with them instead of straddling two (which the CPU cannot forward from its store buffer: a stall on
/// every free).
#[derive(Clone, Copy)]
#[repr(align(16))]
struct Live {
    size: u64,
    /// Relative ns.
    ts: u64,
    tid: u32,
    /// Its call site's aggregate, or `NO_SITE`.
    site: u32,
    dev: u16,
    api: Api,
    flags: u8,
}

#[derive(Default, Clone)]
struct ProcDev {
    cur: u64,
    peak: u64,
    live_end: u64,
    allocations: u64,
    /// Its last change was a free: the next allocation starts a new cycle (the driver-level step).
    after_free: bool,
    cycles: u64,
    /// Its bytes in use at the start of each cycle (observe/steps.rs: growth in cycles, without the bridge).
    troughs: StepSeries,
}

struct Proc {
    s: ProcessStats,
    /// It has out-of-memory refusals not yet known recovered or raised (in `Replay::open_ooms`).
    open_oom: bool,
    /// The last failed allocation: (tid, bytes, call-site aggregate), so an OOM record names its request's site.
    last_failed: Option<(u32, u64, u32)>,
    cur: u64,
    /// Its figures per device it used, in the order it first used them; `dev_slot` finds a device's (by its
    /// index in the replay's `devs`). Sparse: a process that used the 100,000th device holds one entry, not
    /// 100,000.
    dev: Vec<(usize, ProcDev)>,
    dev_slot: FastMap<usize, usize>,
    /// The device its last allocation was on, and that device's index in the replay's `devs`: a process nearly
    /// always allocates on one device, and the search walks whole `Dev`s.
    dev_hint: (u32, usize),
    /// Its live allocations, and each thread's last release (the core the live metrics share: `book.rs`).
    book: Book<Live>,
    reserved: u64,
    mapped: u64,
    /// Its promise: no later record of it is older than this (absolute time).
    wm: u64,
    /// The newest time of its latest record, which becomes the promise when the next record arrives.
    pending_wm: u64,
    open: bool,
    goodbye: bool,
    /// Its connection's end (`ProcessEnd`) was read.
    end_seen: bool,
    /// Its hello was read (the intake's; what it says is applied in order with the entries: `s.announced`).
    hello_seen: bool,
    /// Its end is in the merge (at its goodbye, or at its `ProcessEnd`).
    end_queued: bool,
    /// The newest time of anything it recorded: its goodbye is never replayed before it.
    newest: u64,
    /// Its end was replayed: CUDA gave back what it held.
    released: bool,
    /// Absolute start time (hello or first sight), for telling an earlier image of the same pid apart.
    start_abs: u64,
    /// The slot this pid had before this one (exec or pid reuse).
    prev: Option<usize>,
    /// Its stacks, objects and call-site aggregates.
    cs: callsites::ProcSites,
}

impl Proc {
    fn new(pid: u32, ts: u64, rel: u64, prev: Option<usize>) -> Self {
        Proc {
            open_oom: false,
            last_failed: None,
            s: ProcessStats {
                pid,
                announced: false,
                ppid: None,
                cmdline: Vec::new(),
                hostname: None,
                rank: None,
                local_rank: None,
                slurm_procid: None,
                start_ns: rel,
                end_ns: None,
                ended: Ended::Running,
                exit: None,
                peak_bytes: 0,
                peak_time_ns: None,
                per_device: Vec::new(),
                allocations: 0,
                frees: 0,
                failed_allocations: 0,
                oom_results: 0,
                recovered_refusals: 0,
                cap_refusals: 0,
                cap_exceeded: 0,
                unmatched_frees: 0,
                lost_frees: 0,
                largest_allocation_bytes: 0,
                live_bytes_at_end: 0,
                live_allocations_at_end: 0,
                dropped_events: 0,
                address_reserved_peak_bytes: 0,
                mapped_peak_bytes: 0,
                framework: Vec::new(),
                python_bridge: false,
                lost: Vec::new(),
                untraced: None,
                context_freed_bytes: 0,
            },
            cur: 0,
            dev: Vec::new(),
            dev_slot: FastMap::default(),
            dev_hint: (0, usize::MAX),
            book: Book::default(),
            reserved: 0,
            mapped: 0,
            wm: ts,
            pending_wm: 0,
            open: true,
            goodbye: false,
            end_seen: false,
            hello_seen: false,
            end_queued: false,
            newest: 0,
            released: false,
            start_abs: ts,
            prev,
            cs: callsites::ProcSites::default(),
        }
    }

    /// Its figures on device `d` (an index in the replay's `devs`), made on first use.
    #[inline]
    fn dev(&mut self, d: usize) -> &mut ProcDev {
        // Nearly always the device of its last change.
        let i = match self.dev.last() {
            Some((last, _)) if *last == d => self.dev.len() - 1,
            _ => match self.dev_slot.get(&d) {
                Some(&i) => i,
                None => {
                    self.dev.push((d, ProcDev::default()));
                    self.dev_slot.insert(d, self.dev.len() - 1);
                    self.dev.len() - 1
                }
            },
        };
        &mut self.dev[i].1
    }

    /// Its figures on device `d`, if it used it.
    fn dev_get(&self, d: usize) -> Option<&ProcDev> {
        self.dev_slot.get(&d).map(|&i| &self.dev[i].1)
    }
}

struct Dev {
    device: u32,
    cur: u64,
    peak: u64,
    peak_t: Option<u64>,
    live_end: u64,
    allocations: u64,
    largest: u64,
    info: Option<(u64, u64)>,
    tl: TimelineBuilder,
    /// Bytes freed with `cuMemFreeAsync` per 100 ms step: (step number, bytes), a ring over the last second.
    async_freed: [(u64, u64); ASYNC_STEPS],
    /// The largest device total an out-of-memory record gave, and the cap one gave.
    oom_total: Option<u64>,
    oom_cap: Option<u64>,
    /// New peaks reached so far (call-site aggregates compare it: see `callsites`).
    peak_seq: u64,
}

/// A replay device's ordinal for the reports: `None` for memory on no GPU or on a GPU the shim could not tell.
#[inline]
fn ordinal(device: u32) -> Option<u32> {
    (device != NO_DEVICE && device != HOST_DEVICE).then_some(device)
}

/// An out-of-memory refusal waiting to be told recovered, raised or fatal.
struct OpenOom {
    slot: usize,
    tid: u32,
    /// The record's device (raw).
    device: u32,
    /// Relative ns.
    t: u64,
    requested: u64,
    cap_refused: bool,
    api: u8,
    /// Its snapshot's sequence number, when it got one.
    snap: Option<u64>,
}

/// The most open refusals held; past it, the oldest is counted an error.
pub const OPEN_OOMS_BOUND: usize = 4096;

/// The most allocations live at their process's end kept for telling what grew (16 MiB).
pub const KEPT_BOUND: usize = 1 << 19;

/// A framework out-of-memory record folds the driver's failed requests of its process for the same error made
/// this long before it (the allocator flushing its cache and retrying); its own thread's, however long before,
/// while that thread allocated nothing since.
pub const FOLD_NS: u64 = 5_000_000_000;

/// Whether an open refusal of thread `tid` at `t` is part of an error a framework raised on thread `error_tid` at
/// `error_t` (same process and device): its own thread's, whatever their age (nothing was allocated there since,
/// or it would be recovered), the process's other threads' within [`FOLD_NS`]. The one rule of the replay and of
/// the live metrics.
pub fn folds_into(tid: u32, t: u64, error_tid: u32, error_t: u64) -> bool {
    t <= error_t && (tid == error_tid || error_t - t <= FOLD_NS)
}

pub(in crate::model) struct Replay<'t> {
    start: u64,
    procs: Vec<Proc>,
    by_pid: HashMap<u32, usize>,
    devs: Vec<Dev>,
    /// Each device's index in `devs`, by its number (any u32 a trace names: never a vector by number).
    dev_ids: FastMap<u32, usize>,
    /// Slots still open (holding the merge back).
    open: Vec<usize>,
    min_wm: u64,
    wm_dirty: bool,
    /// Every timed entry waits in the merge until no open process can send anything older.
    pub(super) merge: MergeLink,
    /// With a collector that promises for processes still to come (`newcomer_ticks` in the header): how far it
    /// has promised. The merge goes no further.
    pub(super) newcomers: Option<u64>,
    /// The collector writes a process's goodbye after its last record (`goodbye_last` in the header): its end,
    /// and the release of what it held, go there. Older traces release at the connection's end.
    pub(super) goodbye_last: bool,
    /// The collector's end record was read (`Record::End`).
    pub(super) end_record: bool,
    /// Exit statuses the wrapper reaped, attached to their processes at the end.
    exits: Vec<vramtrace_format::Exit>,
    events: u64,
    dropped: u64,
    unmatched: u64,
    lost: u64,
    first_ts: Option<u64>,
    last_ts: u64,
    leaks: Vec<LiveAlloc>,
    /// Every allocation live when its process ended (or the trace did), as (device index, api, bytes, call-site
    /// aggregate, time made), up to [`KEPT_BOUND`]: what a device's growth is made of.
    kept: Vec<(u16, Api, u64, u32, u64)>,
    leak_count: u64,
    leak_bytes: u64,
    oom_records: u64,
    ooms: Vec<OomSnapshot>,
    /// Out-of-memory refusals whose outcome is not known yet: recovered when their thread next allocates on
    /// the device, raised when a framework's record of an error folds them, errors when neither comes.
    open_ooms: Vec<OpenOom>,
    /// Refusals the program recovered from (the first [`REFUSALS_LISTED`]), and all of them counted.
    refusals: Vec<Refusal>,
    refusals_recovered: u64,
    refusal_stall_ns: u64,
    /// The next snapshot's sequence number.
    oom_seq: u64,
    /// Each device's growth over the run, by device index (filled by `finish`).
    growths: Vec<Option<LeakTrend>>,
    /// Stacks, notes and call-site aggregates.
    cs: callsites::Store,
    fw: framework::FwReplay,
    /// The observers' tap (the exports, the live metrics): every change to memory and every decision, as it is
    /// applied.
    pub(in crate::model) tap: Option<Box<dyn Tap + 't>>,
    /// Each ordinal's GPU as the processes named it (`Record::Devices`): `None` once two named different ones.
    uuids: std::collections::BTreeMap<u32, Option<[u8; 16]>>,
}

impl<'t> Replay<'t> {
    /// A streaming replay holding at most about `bound` events in memory; `reference`: the plain one that sorts
    /// everything at the end (the tests' yardstick).
    pub(in crate::model) fn new(start: u64, bound: usize, reference: bool) -> Self {
        Replay {
            start,
            merge: MergeLink::inline(if reference {
                Merge::reference()
            } else {
                Merge::new(bound)
            }),
            exits: Vec::new(),
            newcomers: None,
            goodbye_last: false,
            end_record: false,
            procs: Vec::new(),
            by_pid: HashMap::new(),
            devs: Vec::new(),
            dev_ids: FastMap::default(),
            open: Vec::new(),
            min_wm: u64::MAX,
            wm_dirty: false,
            events: 0,
            dropped: 0,
            unmatched: 0,
            lost: 0,
            first_ts: None,
            last_ts: 0,
            leaks: Vec::new(),
            kept: Vec::new(),
            leak_count: 0,
            leak_bytes: 0,
            oom_records: 0,
            ooms: Vec::new(),
            growths: Vec::new(),
            open_ooms: Vec::new(),
            refusals: Vec::new(),
            refusals_recovered: 0,
            refusal_stall_ns: 0,
            oom_seq: 0,
            cs: callsites::Store::default(),
            fw: framework::FwReplay::default(),
            tap: None,
            uuids: std::collections::BTreeMap::new(),
        }
    }

    #[inline]
    /// What the trace's header promises the replay (and tells the tap). Returns whether the collector promised
    /// an end record.
    pub(in crate::model) fn configure(&mut self, header: &TraceHeader) -> bool {
        if let Some(t) = self.tap.as_mut() {
            t.start(header);
        }
        let on = |key: &str| header.extra.iter().any(|(k, v)| k == key && v == "1");
        if on(keys::header::NEWCOMER_TICKS) {
            self.newcomers = Some(header.start_mono_ns);
        }
        self.goodbye_last = on(keys::header::GOODBYE_LAST);
        on(keys::header::END_RECORD)
    }

    fn rel(&self, ts: u64) -> u64 {
        ts.saturating_sub(self.start)
    }

    fn observe(&mut self, ts: u64) {
        self.first_ts = Some(self.first_ts.map_or(ts, |f| f.min(ts)));
        self.last_ts = self.last_ts.max(ts);
    }

    // ---- processes and watermarks ----

    fn new_slot(&mut self, pid: u32, ts: u64, prev: Option<usize>) -> usize {
        let s = self.procs.len();
        let rel = self.rel(ts);
        self.procs.push(Proc::new(pid, ts, rel, prev));
        self.by_pid.insert(pid, s);
        self.open.push(s);
        if !self.wm_dirty {
            self.min_wm = self.min_wm.min(ts);
        }
        s
    }

    /// The slot a record of `pid` at time `ts` belongs to, created if the pid is new.
    fn route(&mut self, pid: u32, ts: u64) -> usize {
        let Some(mut s) = self.by_pid.get(&pid).copied() else {
            return self.new_slot(pid, ts, None);
        };
        // Records older than this image's start that an earlier, still-open image of the pid could have sent.
        while let Some(pv) = self.procs[s].prev {
            if ts < self.procs[s].start_abs && !self.procs[pv].end_seen {
                s = pv;
            } else {
                break;
            }
        }
        s
    }

    /// A batch of process `s` with times up to `ts`. Its promise moves to the newest time of the batch before
    /// this one: the records that follow a batch (an out-of-memory record after the batch holding its failure)
    /// may be older than the batch's newest event, never older than its oldest.
    fn advance(&mut self, s: usize, ts: u64) {
        let p = &mut self.procs[s];
        let promise = std::mem::replace(&mut p.pending_wm, ts);
        self.promise(s, promise);
    }

    /// A tick, goodbye or hello: nothing older than `ts` will follow, at once.
    fn promise_now(&mut self, s: usize, ts: u64) {
        self.promise(s, ts);
    }

    fn promise(&mut self, s: usize, ts: u64) {
        let p = &mut self.procs[s];
        if ts > p.wm {
            if p.open && p.wm == self.min_wm {
                self.wm_dirty = true;
            }
            p.wm = ts;
        }
    }

    fn close(&mut self, s: usize) {
        let p = &mut self.procs[s];
        if p.open {
            p.open = false;
            if p.wm == self.min_wm {
                self.wm_dirty = true;
            }
            if let Some(i) = self.open.iter().position(|&o| o == s) {
                self.open.swap_remove(i);
            }
        }
    }

    /// Events at or before this time can be replayed: no open process will send anything older.
    fn limit(&mut self) -> u64 {
        if self.wm_dirty {
            self.min_wm = self
                .open
                .iter()
                .map(|&s| self.procs[s].wm)
                .min()
                .unwrap_or(u64::MAX);
            self.wm_dirty = false;
        }
        self.min_wm.min(self.newcomers.unwrap_or(u64::MAX))
    }

    // ---- the merge ----

    /// Replays what the merge can hand out now (or, with the merge on its own thread, what it has handed out so
    /// far): everything older than every open process's promise.
    fn pump(&mut self) {
        let limit = self.limit();
        self.merge.drain(limit);
        if self.merge.full() {
            while let Some(c) = self.merge.send_or_take() {
                self.replay_chunk(c);
            }
        }
        while let Some(c) = self.merge.try_take() {
            self.replay_chunk(c);
        }
    }

    /// The trace is read (or the job is over): replays everything still in the merge, and the refusals still
    /// open are errors (nothing can recover them now). Returns the merge's count of inexact entries.
    pub(in crate::model) fn drain(&mut self) -> u64 {
        let n = self.pump_to_end();
        let end = self.rel(self.last_ts);
        self.unrecovered(|_| true, end);
        n
    }

    fn pump_to_end(&mut self) -> u64 {
        while let Some(c) = self.merge.send_or_take() {
            self.replay_chunk(c);
        }
        self.merge.finish();
        while let Some(c) = self.merge.take_until_done() {
            let done = c.done;
            self.replay_chunk(c);
            if let Some(n) = done {
                return n;
            }
        }
        0
    }

    fn replay_chunk(&mut self, mut c: Chunk) {
        let mut at = 0;
        let events = std::mem::take(&mut c.events);
        for x in c.outs.drain(..) {
            match x {
                Out::Events(s, n) => {
                    for e in &events[at..at + n] {
                        self.apply(s, e);
                    }
                    at += n;
                }
                Out::Rec(entry, ts) => self.replay_entry(entry, ts),
                Out::Mark(entry) => self.replay_entry(entry, 0),
            }
        }
        c.events = events;
        self.merge.give_back(c);
    }

    /// A record, at its time `ts` (absolute; a hello's is its own).
    fn replay_entry(&mut self, entry: Entry, ts: u64) {
        match entry {
            Entry::Hello { slot, hello } => self.hello_applied(slot, *hello),
            Entry::End { slot } => self.end_process(slot, ts),
            Entry::Oom { slot, oom } => self.snapshot(slot, &oom, ts, true),
            Entry::Framework { slot, rec } => self.on_fw(slot, *rec, ts),
            Entry::ContextGone { slot, device } => self.context_gone(slot, device, ts),
            Entry::Dropped { slot, count } => {
                let p = &mut self.procs[slot].s;
                p.dropped_events = p.dropped_events.saturating_add(count);
                self.dropped = self.dropped.saturating_add(count);
                if let Some(tap) = self.tap.as_mut() {
                    tap.dropped(slot, count);
                }
            }
        }
    }

    /// Every context of process `s` on `device` was torn down at `ts`: the driver freed its pointer allocations
    /// there (handles are the device's and stay).
    fn context_gone(&mut self, s: usize, device: u32, ts: u64) {
        let Some(&d) = self.dev_ids.get(&device) else {
            return;
        };
        let t = self.rel(ts);
        let gone = self.procs[s].book.context_gone(|l| l.dev as usize == d);
        for (addr, l) in gone {
            self.take(s, &l, t);
            self.procs[s].s.context_freed_bytes =
                self.procs[s].s.context_freed_bytes.saturating_add(l.size);
            self.tap_live(Change::Released, s, false, addr, &l, t);
        }
    }

    /// The process's connection ended at `ts`, after every event of it before then: CUDA releases the rest.
    fn end_process(&mut self, s: usize, ts: u64) {
        self.procs[s].released = true;
        let t = self.rel(ts);
        self.collect_live(s, t, true);
        self.fw.on_process_end(s, t);
        // Refusals it never recovered from, nor raised as a framework's error: each an error, decided now.
        if self.procs[s].open_oom {
            self.unrecovered(|o| o.slot == s, t);
        }
        if let Some(tap) = self.tap.as_mut() {
            tap.ended(s, t);
        }
    }

    /// The open refusals `which` picks are errors, decided at `t`.
    fn unrecovered(&mut self, which: impl Fn(&OpenOom) -> bool, t: u64) {
        let mut i = 0;
        while i < self.open_ooms.len() {
            if which(&self.open_ooms[i]) {
                let o = self.open_ooms.remove(i);
                self.procs[o.slot].open_oom = self.open_ooms.iter().any(|x| x.slot == o.slot);
                self.error(o.slot, Some(o.device), t);
            } else {
                i += 1;
            }
        }
    }

    /// One out-of-memory error of process `s` on raw device `device`, decided at `t`: the one place the
    /// count moves, so every observer counts what the report counts.
    pub(super) fn error(&mut self, s: usize, device: Option<u32>, t: u64) {
        self.oom_records += 1;
        if let Some(tap) = self.tap.as_mut() {
            tap.error(&ErrorStep {
                t_ns: t,
                slot: s,
                process: &self.procs[s].s,
                device: device.and_then(ordinal),
            });
        }
    }

    // ---- replaying one event ----

    #[inline]
    fn dev_index(&mut self, device: u32) -> usize {
        if let Some(&i) = self.dev_ids.get(&device) {
            return i;
        }
        self.dev_ids.insert(device, self.devs.len());
        // The timelines share one budget of buckets: more devices, coarser each (changes log2 times at most).
        let cap = timeline::cap_for(self.devs.len() + 1);
        if cap != timeline::cap_for(self.devs.len()) {
            for d in &mut self.devs {
                d.tl.set_cap(cap);
            }
        }
        let mut tl = TimelineBuilder::default();
        tl.set_cap(cap);
        self.devs.push(Dev {
            device,
            cur: 0,
            peak: 0,
            peak_t: None,
            live_end: 0,
            allocations: 0,
            largest: 0,
            info: None,
            tl,
            async_freed: [(u64::MAX, 0); ASYNC_STEPS],
            oom_total: None,
            oom_cap: None,
            peak_seq: 0,
        });
        self.devs.len() - 1
    }

    /// [`Replay::dev_index`] for an allocation of process `s`, through its hint.
    #[inline(always)]
    fn dev_of(&mut self, s: usize, device: u32) -> usize {
        let (hinted, i) = self.procs[s].dev_hint;
        if hinted == device && i < self.devs.len() {
            return i;
        }
        let i = self.dev_index(device);
        self.procs[s].dev_hint = (device, i);
        i
    }

    #[inline]
    fn apply(&mut self, s: usize, e: &Event) {
        let t = self.rel(e.ts_ns);
        match book::act(e) {
            Act::Alloc { handle, device } => self.alloc(s, e, handle, device, t),
            Act::Free { handle } => self.free(s, e, handle, t),
            Act::Refused { device } => self.refused(s, e, device),
            Act::Undo { handle } => self.undo_release(s, e.tid, e.addr, handle, t),
            Act::None => match e.api.effect() {
                Effect::AddressSpace => self.address_space(s, e, t),
                Effect::Info if e.result == 0 => {
                    let d = self.dev_index(e.device);
                    self.devs[d].info = Some((e.addr, e.size));
                    if let (Some(tap), Some(g)) = (self.tap.as_mut(), ordinal(e.device)) {
                        if e.addr > 0 {
                            tap.device_total(g, e.addr);
                        }
                    }
                }
                _ => {}
            },
        }
    }

    /// A successful allocation (`handle`: a `cuMemCreate`) of process `s` on `device`.
    #[inline(always)]
    fn alloc(&mut self, s: usize, e: &Event, handle: bool, device: u32, t: u64) {
        if e.flags & flags::CAP_EXCEEDED != 0 {
            self.procs[s].s.cap_exceeded += 1;
        }
        if self.procs[s].open_oom {
            self.recovered(s, e.tid, device, t);
        }
        let d = self.dev_of(s, device);
        let site = if e.stack != 0 {
            self.cs
                .site_for(&mut self.procs[s].cs, s, e.stack, d as u16)
        } else {
            NO_SITE
        };
        let live = Live {
            size: e.size,
            ts: t,
            tid: e.tid,
            site,
            dev: d as u16,
            api: e.api,
            flags: e.flags,
        };
        let p = &mut self.procs[s];
        if let Some(old) = p.book.alloc(handle, e.addr, live) {
            p.s.lost_frees += 1;
            self.lost += 1;
            self.take(s, &old, t);
            self.tap_live(Change::Free, s, handle, e.addr, &old, t);
        }
        self.give(s, d, e.size, t, site);
        if self.tap.is_some() {
            self.tap_step(
                Change::Alloc,
                s,
                d,
                handle,
                e.addr,
                e.size,
                e.stack,
                e.flags,
                t,
                false,
            );
        }
    }

    /// A successful release of a pointer or (`handle`) a handle by process `s`.
    #[inline(always)]
    fn free(&mut self, s: usize, e: &Event, handle: bool, t: u64) {
        let p = &mut self.procs[s];
        match p.book.free(e.tid, handle, e.addr) {
            Some(old) => {
                p.s.frees += 1;
                self.take(s, &old, t);
                self.tap_live(Change::Free, s, handle, e.addr, &old, t);
                if e.api == Api::MemFreeAsync {
                    self.note_async_free(old.dev as usize, t, old.size);
                }
            }
            None => {
                p.s.unmatched_frees += 1;
                self.unmatched += 1;
            }
        }
    }

    /// An allocation the driver or the cap refused.
    fn refused(&mut self, s: usize, e: &Event, device: u32) {
        if e.stack != 0 {
            let d = self.dev_index(device);
            let site = self
                .cs
                .site_for(&mut self.procs[s].cs, s, e.stack, d as u16);
            self.procs[s].last_failed = Some((e.tid, e.size, site));
        }
        let p = &mut self.procs[s].s;
        p.failed_allocations += 1;
        if e.result == CUDA_OOM {
            p.oom_results += 1;
        }
        if e.flags & flags::CAP_REFUSED != 0 {
            p.cap_refusals += 1;
        }
        if let Some(tap) = self.tap.as_mut() {
            tap.refused(s, ordinal(device), e);
        }
    }

    /// Address reservations and mappings (`cuMemAddressReserve`, `cuMemMap`...): their own figures, no
    /// allocation.
    fn address_space(&mut self, s: usize, e: &Event, t: u64) {
        let p = &mut self.procs[s];
        if e.result != 0 {
            // A refused unmap or address free, published before the driver refused it: taken back.
            if e.flags & flags::UNDONE != 0 {
                match e.api {
                    Api::MemUnmap => {
                        p.mapped = p.mapped.saturating_add(e.size);
                        p.s.mapped_peak_bytes = p.s.mapped_peak_bytes.max(p.mapped);
                    }
                    Api::MemAddressFree => {
                        p.reserved = p.reserved.saturating_add(e.size);
                        p.s.address_reserved_peak_bytes =
                            p.s.address_reserved_peak_bytes.max(p.reserved);
                    }
                    _ => {}
                }
            }
            return;
        }
        match e.api {
            Api::MemAddressReserve => {
                p.reserved = p.reserved.saturating_add(e.size);
                p.s.address_reserved_peak_bytes = p.s.address_reserved_peak_bytes.max(p.reserved);
            }
            Api::MemAddressFree => p.reserved = p.reserved.saturating_sub(e.size),
            Api::MemMap => {
                p.mapped = p.mapped.saturating_add(e.size);
                p.s.mapped_peak_bytes = p.s.mapped_peak_bytes.max(p.mapped);
            }
            Api::MemUnmap => p.mapped = p.mapped.saturating_sub(e.size),
            _ => {}
        }
        if self.tap.is_some() && matches!(e.api, Api::MemMap | Api::MemUnmap) {
            self.tap_map(s, e, t);
        }
    }

    /// Thread `tid` of process `s` allocated on `device` at `t`: its open refusals there were recovered from
    /// (the allocator flushed its cache and retried, or the program went on): findings, not errors.
    #[inline(never)]
    fn recovered(&mut self, s: usize, tid: u32, device: u32, t: u64) {
        let mut i = 0;
        while i < self.open_ooms.len() {
            let o = &self.open_ooms[i];
            if o.slot != s || o.tid != tid || o.device != device {
                i += 1;
                continue;
            }
            let o = self.open_ooms.remove(i);
            let mut site = None;
            if let Some(seq) = o.snap {
                if let Some(k) = self.ooms.iter().position(|x| x.seq == seq) {
                    site = self.ooms.remove(k).request_site;
                }
            }
            self.refusals_recovered += 1;
            let stall = t.saturating_sub(o.t);
            self.refusal_stall_ns = self.refusal_stall_ns.saturating_add(stall);
            let p = &mut self.procs[s].s;
            p.recovered_refusals += 1;
            if self.refusals.len() < REFUSALS_LISTED {
                self.refusals.push(Refusal {
                    time_ns: o.t,
                    pid: p.pid,
                    tid,
                    device: ordinal(device),
                    api: Api::from_u8(o.api),
                    requested_bytes: o.requested,
                    cap_refused: o.cap_refused,
                    recovered_after_ns: stall,
                    site,
                });
            }
        }
        self.procs[s].open_oom = self.open_ooms.iter().any(|o| o.slot == s);
    }

    /// A framework's record of an error raised at `t` by thread `tid` of process `s` on `device`: the refusals
    /// before it there (its thread's still open, whatever their age; the process's within [`FOLD_NS`]) were
    /// that error's, not recovered from.
    /// An error that names no device (a framework that did not say) folds the process's refusals on any.
    /// Returns how many it folded.
    pub(super) fn raised(&mut self, s: usize, tid: u32, device: Option<u32>, t: u64) -> usize {
        let before = self.open_ooms.len();
        self.open_ooms.retain(|o| {
            !(o.slot == s && device.is_none_or(|d| o.device == d) && folds_into(o.tid, o.t, tid, t))
        });
        self.procs[s].open_oom = self.open_ooms.iter().any(|o| o.slot == s);
        before - self.open_ooms.len()
    }

    /// Out-of-memory record `o` of process `s` reached the replay at `t` (snapshot `snap`, if it got one).
    fn open_oom(&mut self, s: usize, o: &vramtrace_format::Oom, t: u64, snap: Option<u64>) {
        if self.open_ooms.len() >= OPEN_OOMS_BOUND {
            // The oldest is an error: it is forgotten, not recovered.
            let old = self.open_ooms.remove(0);
            self.procs[old.slot].open_oom = self.open_ooms.iter().any(|x| x.slot == old.slot);
            self.error(old.slot, Some(old.device), t);
        }
        self.open_ooms.push(OpenOom {
            slot: s,
            tid: o.tid,
            device: book::oom_device(o),
            t,
            requested: o.requested_bytes,
            cap_refused: o.flags & flags::CAP_REFUSED != 0,
            api: o.api,
            snap,
        });
        self.procs[s].open_oom = true;
    }

    /// `size` bytes allocated on device `d` by process `s`. Inlined (as `take`): once per event.
    #[inline(always)]
    fn give(&mut self, s: usize, d: usize, size: u64, t: u64, site: u32) {
        let on_host = self.devs[d].device == HOST_DEVICE;
        let dv = &mut self.devs[d];
        if site != NO_SITE {
            let a = &mut self.cs.aggs[site as usize];
            a.sync(dv.peak_seq);
            a.cur = a.cur.saturating_add(size);
            a.live_count += 1;
            a.allocations += 1;
            a.bytes = a.bytes.saturating_add(size);
        }
        dv.cur = dv.cur.saturating_add(size);
        dv.allocations += 1;
        dv.largest = dv.largest.max(size);
        if dv.cur > dv.peak {
            dv.peak = dv.cur;
            dv.peak_t = Some(t);
            dv.peak_seq += 1;
        }
        dv.tl.set(t, dv.cur);
        let p = &mut self.procs[s];
        p.s.allocations += 1;
        p.s.largest_allocation_bytes = p.s.largest_allocation_bytes.max(size);
        // A process's peak is of GPU memory: host memory (`cuMemCreate` with a host location) is only its device's.
        if !on_host {
            p.cur = p.cur.saturating_add(size);
            if p.cur > p.s.peak_bytes {
                p.s.peak_bytes = p.cur;
                p.s.peak_time_ns = Some(t);
            }
        }
        let pd = p.dev(d);
        if pd.after_free {
            pd.after_free = false;
            pd.cycles += 1;
            pd.troughs.observe(pd.cycles, t, pd.cur);
        }
        pd.cur = pd.cur.saturating_add(size);
        pd.allocations += 1;
        pd.peak = pd.peak.max(pd.cur);
    }

    #[inline(always)]
    fn take(&mut self, s: usize, l: &Live, t: u64) {
        let d = l.dev as usize;
        let on_host = self.devs[d].device == HOST_DEVICE;
        let dv = &mut self.devs[d];
        if l.site != NO_SITE {
            let a = &mut self.cs.aggs[l.site as usize];
            a.sync(dv.peak_seq);
            a.cur = a.cur.saturating_sub(l.size);
            a.live_count = a.live_count.saturating_sub(1);
        }
        dv.cur = dv.cur.saturating_sub(l.size);
        dv.tl.set(t, dv.cur);
        let p = &mut self.procs[s];
        if !on_host {
            p.cur = p.cur.saturating_sub(l.size);
        }
        let pd = p.dev(d);
        pd.cur = pd.cur.saturating_sub(l.size);
        pd.after_free = true;
    }

    /// Tells the tap of a change to allocation `l` (already applied). Inlined down to the check: a report has
    /// no tap, and this is on every free's path.
    #[inline(always)]
    fn tap_live(&mut self, change: Change, s: usize, handle: bool, addr: u64, l: &Live, t: u64) {
        if self.tap.is_some() {
            self.tap_live_now(change, s, handle, addr, l, t);
        }
    }

    #[cold]
    fn tap_live_now(
        &mut self,
        change: Change,
        s: usize,
        handle: bool,
        addr: u64,
        l: &Live,
        t: u64,
    ) {
        let stack = self.site_stack(l.site);
        self.tap_step(
            change,
            s,
            l.dev as usize,
            handle,
            addr,
            l.size,
            stack,
            0,
            t,
            false,
        );
    }

    /// The stack id of call-site aggregate `site` (0: none).
    fn site_stack(&self, site: u32) -> u32 {
        if site == NO_SITE {
            0
        } else {
            self.cs.aggs[site as usize].stack
        }
    }

    /// A successful `cuMemMap`/`cuMemUnmap`: the device and call site are the mapped handle's (a map names
    /// its handle; an unmap is found by the tap from its address).
    fn tap_map(&mut self, s: usize, e: &Event, t: u64) {
        let (d, stack) = match e.api {
            Api::MemMap => match self.procs[s].book.handle(e.aux) {
                Some(l) => (Some(l.dev as usize), self.site_stack(l.site)),
                None => (None, 0),
            },
            _ => (None, 0),
        };
        let change = if e.api == Api::MemMap {
            Change::Map
        } else {
            Change::Unmap
        };
        let device = d.and_then(|d| {
            let dv = &self.devs[d];
            ordinal(dv.device)
        });
        let on_host = d.is_some_and(|d| self.devs[d].device == HOST_DEVICE);
        let (device_bytes, process_device_bytes) = match d {
            Some(d) => (
                self.devs[d].cur,
                self.procs[s].dev_get(d).map_or(0, |pd| pd.cur),
            ),
            None => (0, 0),
        };
        let step = Step {
            change,
            t_ns: t,
            slot: s,
            process: &self.procs[s].s,
            device,
            on_host,
            handle: false,
            addr: e.addr,
            size: e.size,
            stack,
            flags: e.flags,
            back: false,
            device_bytes,
            process_device_bytes,
        };
        if let Some(tap) = self.tap.as_mut() {
            tap.step(&step);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn tap_step(
        &mut self,
        change: Change,
        s: usize,
        d: usize,
        handle: bool,
        addr: u64,
        size: u64,
        stack: u32,
        flags: u8,
        t: u64,
        back: bool,
    ) {
        let dv = &self.devs[d];
        let p = &self.procs[s];
        let step = Step {
            change,
            t_ns: t,
            slot: s,
            process: &p.s,
            device: ordinal(dv.device),
            on_host: dv.device == HOST_DEVICE,
            handle,
            addr,
            size,
            stack,
            flags,
            back,
            device_bytes: dv.cur,
            process_device_bytes: p.dev_get(d).map_or(0, |pd| pd.cur),
        };
        if let Some(tap) = self.tap.as_mut() {
            tap.step(&step);
        }
    }

    /// A `cuMemFreeAsync` of `size` bytes on device index `d` at `t`.
    fn note_async_free(&mut self, d: usize, t: u64, size: u64) {
        let step = t / ASYNC_STEP_NS;
        let slot = &mut self.devs[d].async_freed[(step % ASYNC_STEPS as u64) as usize];
        if slot.0 != step {
            *slot = (step, 0);
        }
        slot.1 = slot.1.saturating_add(size);
    }

    /// Everything process `s` still holds at `t` is live at its end; with `release`, CUDA gives it back at `t`.
    fn collect_live(&mut self, s: usize, t: u64, release: bool) {
        let p = &mut self.procs[s];
        let pid = p.s.pid;
        for (addr, l, handle) in p.book.take_all().collect::<Vec<_>>() {
            if l.site != NO_SITE {
                let a = &mut self.cs.aggs[l.site as usize];
                a.live_end = a.live_end.saturating_add(l.size);
            }
            let on_host = self.devs[l.dev as usize].device == HOST_DEVICE;
            let p = &mut self.procs[s];
            // A process's figures are of GPU memory, as its peak; host memory is in its device's (and listed).
            if !on_host {
                p.s.live_bytes_at_end = p.s.live_bytes_at_end.saturating_add(l.size);
                p.s.live_allocations_at_end += 1;
            }
            let pd = p.dev(l.dev as usize);
            pd.live_end = pd.live_end.saturating_add(l.size);
            let dv = &mut self.devs[l.dev as usize];
            dv.live_end = dv.live_end.saturating_add(l.size);
            self.leak_count += 1;
            self.leak_bytes = self.leak_bytes.saturating_add(l.size);
            if self.kept.len() < KEPT_BOUND {
                self.kept.push((l.dev, l.api, l.size, l.site, l.ts));
            }
            self.leaks.push(LiveAlloc {
                pid,
                device: ordinal(dv.device),
                on_host,
                api: l.api,
                ptsz: l.flags & flags::PTSZ != 0,
                address: addr,
                bytes: l.size,
                alloc_time_ns: l.ts,
                age_ns: t.saturating_sub(l.ts),
                site: site_ref(l.site),
            });
            if self.leaks.len() >= 64 * LEAK_LIST {
                trim_leaks(&mut self.leaks);
            }
            if release {
                self.take(s, &l, t);
                self.tap_live(Change::Released, s, handle, addr, &l, t);
            }
        }
    }

    pub(super) fn finish(mut self, header: TraceHeader, sym: Option<&mut Symbolizer>) -> Analysis {
        let merge_inexact_events = self.drain();
        let end = self.rel(self.last_ts);
        for s in 0..self.procs.len() {
            let p = &mut self.procs[s];
            if !p.end_queued && p.goodbye {
                p.s.ended = Ended::Goodbye;
            }
            let at = p.s.end_ns.unwrap_or(end);
            self.collect_live(s, at, false);
        }
        trim_leaks(&mut self.leaks);
        // Each reaped status to the latest image of its pid that started before it.
        for x in std::mem::take(&mut self.exits) {
            let slot = (0..self.procs.len())
                .rev()
                .find(|&s| self.procs[s].s.pid == x.pid && self.procs[s].start_abs <= x.ts_ns);
            if let Some(s) = slot {
                self.procs[s].s.exit = Some(x.status);
            }
        }
        let mut sym = sym;
        if let Some(mut tap) = self.tap.take() {
            let (cs, procs) = (&self.cs, &self.procs);
            tap.finish(&mut |slot: usize, stack: u32| {
                cs.frames(&procs.get(slot)?.cs, stack, sym.as_deref_mut())
            });
        }
        // Each device's timeline, and its growth with what grew (before call sites are resolved: they name it).
        let timelines: Vec<Timeline> = self
            .devs
            .iter_mut()
            .map(|d| std::mem::take(&mut d.tl).finish(end))
            .collect();
        // A device whose processes lost events is not judged: a lost free looks exactly like memory kept.
        // Each process's devices once, and what was kept per device once: never every device against every
        // process or every allocation kept (a trace can name a million devices).
        let mut lossy = vec![false; self.devs.len()];
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); self.devs.len()];
        for (slot, p) in self.procs.iter().enumerate() {
            for (d, pd) in &p.dev {
                users[*d].push(slot);
                if p.s.dropped_events > 0 && pd.allocations > 0 {
                    lossy[*d] = true;
                }
            }
        }
        let mut kept_on: Vec<Vec<usize>> = vec![Vec::new(); self.devs.len()];
        for (k, kept) in self.kept.iter().enumerate() {
            if let Some(on) = kept_on.get_mut(kept.0 as usize) {
                on.push(k);
            }
        }
        self.growths = timelines
            .iter()
            .enumerate()
            .map(|(i, tl)| {
                if lossy[i] {
                    return None;
                }
                // The largest growth of one of the device's processes in its own cycles (observe/steps.rs: a
                // leak that fills the device in a second is one too), else its timeline in wall-clock windows.
                let mut g = users[i]
                    .iter()
                    .filter_map(|&slot| {
                        let p = &self.procs[slot];
                        let pd = p.dev_get(i)?;
                        pd.troughs.growth(GrowthUnit::Cycles, p.s.pid, true)
                    })
                    .max_by_key(|g| g.rise_bytes)
                    .or_else(|| crate::model::observe::growth::growth(tl, end))?;
                let kept = kept_on[i].iter().map(|&k| {
                    let k = &self.kept[k];
                    (k.1, k.2, k.3, k.4)
                });
                crate::model::observe::growth::fill_what_grew(&mut g, kept);
                Some(g)
            })
            .collect();
        let call_sites = self.call_sites(sym);
        let fw = std::mem::take(&mut self.fw);
        let (mut fw_procs, fw_devs, bridge) = fw.finish(end);
        let devs = &self.devs;
        let dev_of = |d: usize| ordinal(devs[d].device);
        let processes: Vec<ProcessStats> = self
            .procs
            .iter()
            .enumerate()
            .map(|(slot, p)| {
                let mut s = p.s.clone();
                s.framework = fw_procs.remove(&slot).unwrap_or_default();
                s.per_device = p
                    .dev
                    .iter()
                    .filter(|(_, pd)| pd.allocations > 0)
                    .map(|&(d, ref pd)| ProcessDevice {
                        device: dev_of(d),
                        on_host: devs[d].device == HOST_DEVICE,
                        peak_bytes: pd.peak,
                        live_bytes_at_end: pd.live_end,
                        allocations: pd.allocations,
                    })
                    .collect();
                s.per_device.sort_by_key(|pd| pd.device.unwrap_or(u32::MAX));
                s
            })
            .collect();
        let mut devices: Vec<DeviceStats> = self
            .devs
            .into_iter()
            .zip(timelines.into_iter().zip(std::mem::take(&mut self.growths)))
            .map(|(d, (timeline, growth))| DeviceStats {
                device: ordinal(d.device),
                on_host: d.device == HOST_DEVICE,
                peak_bytes: d.peak,
                peak_time_ns: d.peak_t,
                live_bytes_at_end: d.live_end,
                in_use_bytes_at_end: d.cur,
                allocations: d.allocations,
                largest_allocation_bytes: d.largest,
                driver_total_bytes: d.info.map(|i| i.0),
                driver_free_bytes: d.info.map(|i| i.1),
                total_bytes: d.info.map(|i| i.0).or(d.oom_total),
                cap_bytes: d.oom_cap,
                timeline,
                growth,
                framework: None,
                uuid: None,
            })
            .collect();
        for d in devices.iter_mut() {
            d.uuid = d
                .device
                .and_then(|g| self.uuids.get(&g).copied().flatten())
                .map(|u| vramtrace_format::gpu_uuid(&u));
        }
        // By number, once: never a search of every device for each (a trace can name a million).
        let mut by_number: FastMap<u32, usize> = FastMap::default();
        for (i, d) in devices.iter().enumerate() {
            if let Some(n) = d.device {
                by_number.entry(n).or_insert(i);
            }
        }
        for f in fw_devs {
            match by_number.get(&f.device).map(|&i| &mut devices[i]) {
                Some(d) => d.framework = Some(f),
                None => devices.push(DeviceStats {
                    device: Some(f.device),
                    on_host: false,
                    peak_bytes: 0,
                    peak_time_ns: None,
                    live_bytes_at_end: 0,
                    in_use_bytes_at_end: 0,
                    allocations: 0,
                    largest_allocation_bytes: 0,
                    driver_total_bytes: None,
                    driver_free_bytes: None,
                    total_bytes: None,
                    cap_bytes: None,
                    timeline: Timeline::default(),
                    growth: None,
                    framework: Some(f),
                    uuid: None,
                }),
            }
        }
        devices.sort_by_key(|d| d.device.unwrap_or(u32::MAX));
        let from_header = |key: &str, dev: Option<u32>| -> Option<u64> {
            let want = keys::header::per_device(key, dev?);
            header
                .extra
                .iter()
                .find(|(k, _)| *k == want)
                .and_then(|(_, v)| v.trim().parse().ok())
        };
        for d in &mut devices {
            d.total_bytes = d
                .total_bytes
                .or(from_header(keys::header::DEVICE_TOTAL, d.device));
            d.cap_bytes = from_header(keys::header::CAP_BYTES, d.device).or(d.cap_bytes);
        }
        let mut ooms = self.ooms;
        ooms.sort_by_key(|o| o.time_ns);
        // Who each process is, from its hello, read wherever it was in the file (a process's hello may come
        // after entries of it that were already replayed): the same whenever the snapshot was taken.
        for p in ooms.iter_mut().flat_map(|o| o.processes.iter_mut()) {
            if let Some(pr) = self.procs.get(p.slot) {
                p.announced = pr.s.announced;
                p.rank = pr.s.rank;
                p.cmdline.clone_from(&pr.s.cmdline);
            }
        }
        let first = self.first_ts.map(|f| f.saturating_sub(self.start));
        Analysis {
            header,
            format_version: 0,
            partial: false,
            stopped: None,
            frames: 0,
            unknown_frames: 0,
            bad_frames: 0,
            first_bad_frame: None,
            events: self.events,
            dropped_events: self.dropped,
            unmatched_frees: self.unmatched,
            lost_frees: self.lost,
            first_ns: first,
            end_ns: end,
            duration_ns: self.first_ts.map_or(0, |f| self.last_ts.saturating_sub(f)),
            devices,
            processes,
            live_at_end: self.leaks,
            live_at_end_count: self.leak_count,
            live_at_end_bytes: self.leak_bytes,
            oom_records: self.oom_records,
            refusals: self.refusals,
            refusals_recovered: self.refusals_recovered,
            refusal_stall_ns: self.refusal_stall_ns,
            merge_inexact_events,
            bridge,
            ooms,
            call_sites,
        }
    }
}

/// Releases the driver refused ([`book::Undone`]): the replay's side.
impl Replay<'_> {
    /// The driver refused thread `tid`'s release of `addr` in process `s`, at `t` (relative ns): what the release
    /// took out is live again, as if it had never been released.
    fn undo_release(&mut self, s: usize, tid: u32, addr: u64, handle: bool, t: u64) {
        let p = &mut self.procs[s];
        let l = match p.book.undo(tid, handle, addr) {
            Undone::Back(l) => l,
            Undone::Nothing => {
                // Nothing was live there (a double free, a wrong pointer): the unmatched free it counted was none.
                p.s.unmatched_frees = p.s.unmatched_frees.saturating_sub(1);
                self.unmatched = self.unmatched.saturating_sub(1);
                return;
            }
            Undone::Stale => return,
        };
        p.s.frees = p.s.frees.saturating_sub(1);
        self.give(s, l.dev as usize, l.size, t, l.site);
        // Back, not allocated anew: the counts of allocations stay as they were.
        let d = l.dev as usize;
        if l.site != NO_SITE {
            let a = &mut self.cs.aggs[l.site as usize];
            a.allocations = a.allocations.saturating_sub(1);
            a.bytes = a.bytes.saturating_sub(l.size);
        }
        self.devs[d].allocations = self.devs[d].allocations.saturating_sub(1);
        let p = &mut self.procs[s];
        p.s.allocations = p.s.allocations.saturating_sub(1);
        let pd = p.dev(d);
        pd.allocations = pd.allocations.saturating_sub(1);
        if self.tap.is_some() {
            // Live again, not a new allocation (the live metrics count allocations).
            let stack = self.site_stack(l.site);
            self.tap_step(Change::Alloc, s, d, handle, addr, l.size, stack, 0, t, true);
        }
    }
}

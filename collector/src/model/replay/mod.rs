//! The replay's core: records applied entry by entry in the order the merge ([`crate::model::input::merge`])
//! hands them out, with what applying the next one needs (routing, watermarks, live sets, open refusals). The
//! figures drawn from it are observers it feeds (`model/observe/`: `memory` for peaks, timelines, per-process
//! figures and call sites; the tap for the exports and the live metrics).

mod apply;
pub(crate) mod book;
mod finish;
pub(crate) mod now;
pub(crate) mod oom_snapshot;
mod outcomes;
pub(crate) mod records;
pub(crate) mod site_store;
pub(crate) mod sites;
mod tapping;

use std::collections::HashMap;
use vramtrace_format::keys;

use vramtrace_format::{flags, Api, Effect, Event, TraceHeader, NO_DEVICE};

use crate::model::analysis::*;
use crate::model::input::entry::Entry;
use crate::model::input::merge::{Merge, Out};
use crate::model::input::merge_link::{Chunk, MergeLink};
use crate::model::observe::calls::CallCounts;
use crate::model::observe::framework::FwReplay;
use crate::model::observe::leak::{site_ref, LiveAtEnd};
use crate::model::observe::memory::{self, Memory};
use crate::model::observe::tap::{Change, Step, Tap};
use crate::model::observe::timeline::Timeline;
pub(crate) use crate::model::replay::book::HOST_DEVICE;
use crate::model::replay::book::{Act, Book, Undone};
use crate::model::replay::site_store::{self as callsites, NO_SITE};
use crate::names::fasthash::FastMap;
use crate::names::symbols::Symbolizer;

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

struct Proc {
    s: ProcessStats,
    /// It has out-of-memory refusals not yet known recovered or raised (in `Replay::open_ooms`).
    open_oom: bool,
    /// The last failed allocation: (tid, bytes, call-site aggregate), so an OOM record names its request's site.
    last_failed: Option<(u32, u64, u32)>,
    /// The device its last allocation was on, and that device's index in the replay's `devs`: a process nearly
    /// always allocates on one device, and the search walks whole `Dev`s.
    dev_hint: (u32, usize),
    /// Its live allocations, and each thread's last release (the core the live metrics share: `book.rs`).
    book: Book<Live>,
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
    /// Which GPU each of its ordinals is, by its own driver (`Record::Devices`).
    uuids: std::collections::BTreeMap<u32, [u8; 16]>,
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
            dev_hint: (0, usize::MAX),
            book: Book::default(),
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
            uuids: std::collections::BTreeMap::new(),
        }
    }
}

/// A device as the records describe it (its figures are the observers': `memory`).
struct Dev {
    device: u32,
    /// (total, free) bytes the driver last reported (`cuMemGetInfo`).
    info: Option<(u64, u64)>,
    /// At that report, its free bytes plus what the job held on the device then: the room the job had there.
    room: Option<u64>,
    /// The largest device total an out-of-memory record gave, and the cap one gave.
    oom_total: Option<u64>,
    oom_cap: Option<u64>,
}

impl Dev {
    /// Its total as the records say: the driver's report, else the largest an out-of-memory record gave.
    fn total(&self) -> Option<u64> {
        self.info.map(|i| i.0).or(self.oom_total)
    }
}

/// What the trace's header says of a GPU (`cap_bytes.N`, `device_total.N`): the run's cap there, and its size
/// as the collector read it. The one rule of the report and the live metrics: the cap is the header's over an
/// out-of-memory record's, the total the records' over the header's.
#[derive(Default, Clone, Copy)]
pub(crate) struct HeaderDevice {
    cap: Option<u64>,
    total: Option<u64>,
}

impl HeaderDevice {
    /// Each GPU the header names.
    fn read(header: &TraceHeader) -> std::collections::BTreeMap<u32, HeaderDevice> {
        let mut out = std::collections::BTreeMap::<u32, HeaderDevice>::new();
        for (k, v) in &header.extra {
            let Ok(v) = v.trim().parse::<u64>() else {
                continue;
            };
            if let Some(d) = keys::header::device_of(keys::header::CAP_BYTES, k) {
                out.entry(d).or_default().cap = Some(v);
            } else if let Some(d) = keys::header::device_of(keys::header::DEVICE_TOTAL, k) {
                out.entry(d).or_default().total = Some(v);
            }
        }
        out
    }

    pub(crate) fn cap(&self, from_records: Option<u64>) -> Option<u64> {
        self.cap.or(from_records)
    }

    pub(crate) fn total(&self, from_records: Option<u64>) -> Option<u64> {
        from_records.or(self.total)
    }
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

/// A framework out-of-memory record folds the driver's failed requests of its process for the same error made
/// this long before it (the allocator flushing its cache and retrying); its own thread's, however long before,
/// while that thread allocated nothing since.
pub const FOLD_NS: u64 = 5_000_000_000;

/// A process's driver named ordinal `ordinal` GPU `uuid`: the job's name for the ordinal, which is none once two
/// processes named it differently (their own `CUDA_VISIBLE_DEVICES`). The one rule of the replay and of the
/// cap's count (`live/counted.rs`).
pub fn name_gpu(
    job: &mut std::collections::BTreeMap<u32, Option<[u8; 16]>>,
    ordinal: u32,
    uuid: [u8; 16],
) {
    let known = job.entry(ordinal).or_insert(Some(uuid));
    if *known != Some(uuid) {
        *known = None;
    }
}

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
    /// Events whose device ordinal no GPU has (counted on the unknown device).
    implausible_devices: u64,
    first_ts: Option<u64>,
    last_ts: u64,
    /// What was live at each process's end (observe/leak.rs).
    live_end: LiveAtEnd,
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
    fw: FwReplay,
    /// The figures every change to memory feeds (observe/memory.rs).
    mem: Memory,
    /// Each process's calls, counted as they are decided (observe/calls.rs).
    calls: CallCounts,
    /// The observers' tap (the exports, the live metrics): every change to memory and every decision, as it is
    /// applied.
    pub(in crate::model) tap: Option<Box<dyn Tap + 't>>,
    /// Each ordinal's GPU as the processes named it (`Record::Devices`): `None` once two named different ones.
    uuids: std::collections::BTreeMap<u32, Option<[u8; 16]>>,
    /// What the trace's header says of each GPU.
    header_devices: std::collections::BTreeMap<u32, HeaderDevice>,
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
            implausible_devices: 0,
            first_ts: None,
            last_ts: 0,
            live_end: LiveAtEnd::default(),
            ooms: Vec::new(),
            growths: Vec::new(),
            open_ooms: Vec::new(),
            refusals: Vec::new(),
            refusals_recovered: 0,
            refusal_stall_ns: 0,
            oom_seq: 0,
            cs: callsites::Store::default(),
            fw: FwReplay::default(),
            mem: Memory::default(),
            calls: CallCounts::default(),
            tap: None,
            uuids: std::collections::BTreeMap::new(),
            header_devices: std::collections::BTreeMap::new(),
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
        self.header_devices = HeaderDevice::read(header);
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
        self.mem.add_process();
        self.calls.add_process();
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
        self.unrecovered(|_| true);
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
            Entry::Sample { slot, sample } => self.on_sample(slot, &sample, ts),
            Entry::Bridge { slot, rec } => self.on_bridge(slot, &rec, ts),
            Entry::ContextGone { slot, device } => self.context_gone(slot, device, ts),
            Entry::Dropped { slot, count } => self.calls.dropped(slot, count),
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
            self.calls.context_freed(s, l.size);
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
            self.unrecovered(|o| o.slot == s);
        }
    }

    // ---- replaying one event ----
}

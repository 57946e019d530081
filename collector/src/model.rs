//! Replays a trace into live sets, peaks and timelines.
//!
//! Physical memory is what [`Api::effect`] says: `AllocPtr` allocations keyed by (process, pointer) and
//! `cuMemCreate` handles keyed by (process, handle) in a namespace of their own, given back by the matching
//! frees and releases. Address-space calls (reserve, map, unmap, address free) never count as memory. Only
//! calls that succeeded (`result == 0`) move memory; failed allocations are counted per process.
//!
//! Ordering: events of different processes interleave in the file by arrival, not by time. Each process's
//! events are queued (each batch sorted by time), and a k-way merge hands them to the replay in time order:
//! an event is replayed once no open process can still send anything older (the smallest watermark over open
//! processes: the newest time each has sent in an event, tick or goodbye). A process stops holding the merge
//! back when it says goodbye or its connection ends. At most [`MERGE_BOUND`] events wait; past that the oldest
//! are replayed regardless. Memory stays proportional to the live set plus that bound, never to the number of
//! events.
//!
//! When a process's connection ends, CUDA gives back everything it still held: the replay releases it at that
//! moment (device totals drop) and lists it as live at the end: never freed before the process ended.
//!
//! Out-of-memory records go through the same merge: an [`OomSnapshot`] is taken when the replay reaches the
//! record's time, so every event of every process up to that moment has been applied (events at the same
//! nanosecond first; a process end at the same nanosecond after). The snapshot scans the live set once; at most
//! [`MAX_OOM_SNAPSHOTS`] are taken (the first ones), the rest are counted.
//!
//! All times in an [`Analysis`] are ns relative to the trace header's `start_mono_ns`.

pub(crate) mod fasthash;
pub mod framework;
mod timeline;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use vramtrace_format::codec::{self, kind};
use vramtrace_format::{
    flags, Api, Effect, EndKind, Event, Hello, Oom, OpenError, Record, TraceHeader, TraceReader,
    NO_DEVICE,
};

use crate::callsites::{self, Agg, CallSites, DeviceSites, SiteBytes, NO_SITE, SITES_LISTED};
use crate::symbols::Symbolizer;
use fasthash::FastMap;
pub use framework::{
    BridgeProcess, BridgeSummary, DeviceFramework, Figures, FrameworkOom, KeptLine,
    ProcessFramework, SnapshotReading,
};
use timeline::TimelineBuilder;
pub use timeline::{Bucket, Timeline, FIRST_BUCKET_NS, MAX_BUCKETS};

/// How many live-at-end allocations the analysis lists (the largest).
pub const LEAK_LIST: usize = 20;
/// The most events waiting in the merge before the oldest are replayed regardless of watermarks.
pub const MERGE_BOUND: usize = 1 << 20;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_OOM: u32 = 2;
/// The most out-of-memory records given a full snapshot; the rest are counted in [`Analysis::oom_records`].
pub const MAX_OOM_SNAPSHOTS: usize = 16;
/// The largest live allocations an out-of-memory snapshot lists.
pub const OOM_TOP_LIVE: usize = 10;
/// How far back an out-of-memory snapshot's timeline reaches.
pub const OOM_WINDOW_NS: u64 = 10_000_000_000;
/// The most points of an out-of-memory snapshot's timeline (neighbouring buckets are merged past that).
pub const OOM_TIMELINE_POINTS: usize = 100;
/// "Recently" for stream-ordered frees before an out-of-memory event: the last second, in 100 ms steps.
pub const ASYNC_RECENT_NS: u64 = 1_000_000_000;
const ASYNC_STEP_NS: u64 = ASYNC_RECENT_NS / ASYNC_STEPS as u64;
const ASYNC_STEPS: usize = 10;
/// A leak trend needs at least this many minima, each no lower than the one before.
pub const LEAK_MIN_MINIMA: usize = 3;
/// ... and the last above the first by more than this share of the first (percent), and by at least 1 MiB.
pub const LEAK_MIN_RISE_PCT: u64 = 5;
/// Peaks and troughs count when the timeline moves at least this share (percent) of its range.
pub const TURN_PCT: u64 = 10;
/// Upper bounds (exclusive) of the size classes of an out-of-memory snapshot, with their names.
pub const SIZE_CLASSES: [(&str, u64); 5] = [
    ("< 1 MiB", 1 << 20),
    ("1-16 MiB", 16 << 20),
    ("16-256 MiB", 256 << 20),
    ("256 MiB-2 GiB", 2 << 30),
    (">= 2 GiB", u64::MAX),
];

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{}: {source}", path.display())]
    Open { path: PathBuf, source: OpenError },
}

/// How a process's connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The shim said goodbye: a normal exit.
    Goodbye,
    /// The connection closed without a goodbye: killed, crashed or `_exit`.
    Vanished,
    /// The connection closed in the middle of a frame.
    CutMidFrame { partial_bytes: u32 },
    /// Still running when the trace ends (no end recorded).
    Running,
}

impl Ended {
    /// The JSON name.
    pub fn key(self) -> &'static str {
        match self {
            Ended::Goodbye => "goodbye",
            Ended::Vanished => "vanished",
            Ended::CutMidFrame { .. } => "cut_mid_frame",
            Ended::Running => "running",
        }
    }
}

/// One device's totals, summed over processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceStats {
    /// Device ordinal; `None` for allocations whose device the shim could not tell.
    pub device: Option<u32>,
    /// The most bytes in use at once, all processes together.
    pub peak_bytes: u64,
    /// When `peak_bytes` was first reached.
    pub peak_time_ns: Option<u64>,
    /// Bytes never freed before their process ended (or before the trace ended, for processes still running).
    pub live_bytes_at_end: u64,
    /// Bytes held at the end of the trace by processes still running then.
    pub in_use_bytes_at_end: u64,
    /// Successful allocations (pointer allocations and `cuMemCreate`).
    pub allocations: u64,
    pub largest_allocation_bytes: u64,
    /// The latest `cuMemGetInfo` answer on this device: (total, free).
    pub driver_total_bytes: Option<u64>,
    pub driver_free_bytes: Option<u64>,
    /// The device's memory as best known: the latest `cuMemGetInfo`, else an out-of-memory record's, else the
    /// trace header's `device_total.N` (probed when a cap was given).
    pub total_bytes: Option<u64>,
    /// The cap on this device: the trace header's `cap_bytes.N`, else an out-of-memory record's.
    pub cap_bytes: Option<u64>,
    pub timeline: Timeline,
    /// The frameworks' own figures on this device (the Python bridge), when any process sent them.
    pub framework: Option<DeviceFramework>,
}

impl DeviceStats {
    /// What the job could have used on this device: the cap when there is one (and the device total, if lower),
    /// else the device total; `None` when neither is known.
    pub fn limit_bytes(&self) -> Option<u64> {
        match (self.cap_bytes, self.total_bytes) {
            (Some(c), Some(t)) => Some(c.min(t)),
            (c, t) => c.or(t),
        }
    }

    /// `limit_bytes - peak_bytes`, saturating at 0 (a peak over the cap in warn mode has no headroom).
    pub fn headroom_bytes(&self) -> Option<u64> {
        self.limit_bytes()
            .map(|l| l.saturating_sub(self.peak_bytes))
    }
}

/// One process's memory on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessDevice {
    pub device: Option<u32>,
    pub peak_bytes: u64,
    pub live_bytes_at_end: u64,
    pub allocations: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessStats {
    pub pid: u32,
    /// Whether the process sent its hello (the fields up to `slurm_procid` come from it).
    pub announced: bool,
    pub ppid: Option<u32>,
    pub cmdline: Vec<String>,
    pub hostname: Option<String>,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub slurm_procid: Option<u32>,
    /// When the process said hello (or was first seen).
    pub start_ns: u64,
    /// When its connection ended; `None` while running.
    pub end_ns: Option<u64>,
    pub ended: Ended,
    /// The most bytes it held at once, all devices together.
    pub peak_bytes: u64,
    pub peak_time_ns: Option<u64>,
    pub per_device: Vec<ProcessDevice>,
    pub allocations: u64,
    /// Frees and releases matched to a live allocation.
    pub frees: u64,
    pub failed_allocations: u64,
    /// Failed allocations whose result was `CUDA_ERROR_OUT_OF_MEMORY` (cap refusals included).
    pub oom_results: u64,
    /// Allocations vramtrace's cap refused (the driver was never called).
    pub cap_refusals: u64,
    /// Allocations that passed the cap in warn mode (let through, flagged).
    pub cap_exceeded: u64,
    pub unmatched_frees: u64,
    /// Allocations returned at an address still live in this process: the older one's free was not recorded.
    pub lost_frees: u64,
    pub largest_allocation_bytes: u64,
    /// Bytes never freed before the process ended (or the trace ended).
    pub live_bytes_at_end: u64,
    pub live_allocations_at_end: u64,
    /// Events the shim could not record (its queue was full).
    pub dropped_events: u64,
    /// The most virtual address space reserved at once (`cuMemAddressReserve`): not memory.
    pub address_reserved_peak_bytes: u64,
    /// Its framework allocator's figures per device (the Python bridge), when it sent any.
    pub framework: Vec<ProcessFramework>,
    /// The Python bridge was loaded in it (it said so in its hello).
    pub python_bridge: bool,
    /// The most bytes mapped at once (`cuMemMap`): backed by `cuMemCreate` handles, counted there.
    pub mapped_peak_bytes: u64,
}

/// An allocation never freed before its process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveAlloc {
    pub pid: u32,
    pub device: Option<u32>,
    pub api: Api,
    /// The `_ptsz` variant was called.
    pub ptsz: bool,
    /// The pointer, or for `cuMemCreate` the handle.
    pub address: u64,
    pub bytes: u64,
    pub alloc_time_ns: u64,
    /// From the allocation to the end of its process (or of the trace).
    pub age_ns: u64,
    /// Its call site: an index into [`Analysis::call_sites`]`.sites`.
    pub site: Option<usize>,
}

#[derive(Debug, Clone)]
pub struct Analysis {
    pub header: TraceHeader,
    pub format_version: u16,
    /// The trace did not end cleanly (cut short, corrupt or unreadable past some point).
    pub partial: bool,
    /// Where and why reading stopped, when `partial`.
    pub stopped: Option<String>,
    /// Whole frames read.
    pub frames: u64,
    /// Frames of kinds this build does not know (a newer writer's), skipped.
    pub unknown_frames: u64,
    pub events: u64,
    pub dropped_events: u64,
    pub unmatched_frees: u64,
    pub lost_frees: u64,
    /// First and last time seen in any record; `None` without any.
    pub first_ns: Option<u64>,
    pub end_ns: u64,
    pub duration_ns: u64,
    /// Sorted by device ordinal (unknown last).
    pub devices: Vec<DeviceStats>,
    /// In order of first appearance. A pid reused (or re-announced after exec) appears again.
    pub processes: Vec<ProcessStats>,
    /// The largest allocations never freed before their process ended, largest first, at most [`LEAK_LIST`].
    pub live_at_end: Vec<LiveAlloc>,
    pub live_at_end_count: u64,
    pub live_at_end_bytes: u64,
    /// Out-of-memory errors recorded: the driver's failed requests, with those a framework retried behind one
    /// error of its own counting once (see [`OomSnapshot::driver_ooms_folded`]).
    pub oom_records: u64,
    /// What the Python bridge attached to and said.
    pub bridge: BridgeSummary,
    /// Snapshots of the first [`MAX_OOM_SNAPSHOTS`] out-of-memory records, in time order.
    pub ooms: Vec<OomSnapshot>,
    /// Where allocations came from (traces with stacks), and the shim's notes.
    pub call_sites: CallSites,
}

/// A live allocation at the moment of an out-of-memory event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomAlloc {
    pub pid: u32,
    pub tid: u32,
    pub device: Option<u32>,
    pub api: Api,
    pub ptsz: bool,
    /// The pointer, or for `cuMemCreate` the handle.
    pub address: u64,
    pub bytes: u64,
    pub alloc_time_ns: u64,
    /// From the allocation to the out-of-memory event.
    pub age_ns: u64,
    /// Its call site: an index into [`Analysis::call_sites`]`.sites`.
    pub site: Option<usize>,
}

/// One process of the job at the moment of an out-of-memory event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomProcess {
    pub pid: u32,
    pub announced: bool,
    pub rank: Option<u32>,
    pub cmdline: Vec<String>,
    /// Live bytes on the event's device.
    pub device_live_bytes: u64,
    /// Live bytes per device (devices where it held something), by device ordinal.
    pub per_device: Vec<(Option<u32>, u64)>,
    /// Whether it allocated on the event's device before the event (or is the process that failed): it has a
    /// CUDA context there.
    pub on_device: bool,
}

/// Live allocations of one size class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeClass {
    pub label: &'static str,
    /// Sizes in `[min_bytes, max_bytes)`; `max_bytes` is `None` for the last class.
    pub min_bytes: u64,
    pub max_bytes: Option<u64>,
    pub count: u64,
    pub bytes: u64,
}

/// A low point of a device's bytes in use between two peaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Minimum {
    pub t_ns: u64,
    pub bytes: u64,
}

/// Allocations of one (api, size), made between the first and last minima of a leak trend and still live at
/// the out-of-memory event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeakGroup {
    pub api: Api,
    pub bytes_each: u64,
    pub count: u64,
    pub bytes: u64,
}

/// Bytes in use rising across repeated cycles: the minima between peaks, each no lower than the one before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakTrend {
    /// The trailing run of non-decreasing minima (at least [`LEAK_MIN_MINIMA`]).
    pub minima: Vec<Minimum>,
    /// Last minimum - first.
    pub rise_bytes: u64,
    /// Filled in out-of-memory snapshots only: the largest groups (at most 10), largest first.
    pub groups: Vec<LeakGroup>,
    /// Groups beyond those listed.
    pub more_groups: u64,
    /// Filled in out-of-memory snapshots of traces with stacks: the same allocations by call site, largest
    /// first (at most [`SITES_LISTED`]).
    pub sites: Vec<LeakSite>,
    /// Call sites beyond those listed.
    pub more_sites: u64,
}

/// Allocations of one call site made between the first and last minima of a leak trend and still live at the
/// out-of-memory event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakSite {
    /// An index into [`Analysis::call_sites`]`.sites`.
    pub site: usize,
    pub count: u64,
    pub bytes: u64,
    /// The call site in one line.
    pub label: String,
}

/// What the replay knew when it reached an out-of-memory record. Device figures are for the event's device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomSnapshot {
    /// Relative ns.
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub device: Option<u32>,
    /// The failing entry point (`None`: a number this build does not know, in `api_code`).
    pub api: Option<Api>,
    pub api_code: u8,
    pub ptsz: bool,
    /// The cap, not the device, refused it.
    pub cap_refused: bool,
    pub requested_bytes: u64,
    pub result: u32,
    /// The failing request's own call site (an index into [`Analysis::call_sites`]`.sites`), when its
    /// allocation event carried a stack.
    pub request_site: Option<usize>,
    /// From the record: the real driver's figures, the cap, and the cap's ledger.
    pub device_free_bytes: Option<u64>,
    pub device_total_bytes: Option<u64>,
    pub cap_bytes: Option<u64>,
    pub ledger_job_bytes: Option<u64>,
    pub ledger_process_bytes: Option<u64>,
    /// The job's live bytes on the device, all processes, as the trace replays them.
    pub job_live_trace_bytes: u64,
    /// The job's peak on the device up to the event, and when.
    pub job_peak_bytes: u64,
    pub job_peak_time_ns: Option<u64>,
    /// Processes of the job with a context on the device (allocated there, or the one that failed).
    pub job_processes_on_device: u64,
    /// Live processes holding memory (or the one that failed), in order of first appearance.
    pub processes: Vec<OomProcess>,
    /// Live allocations on the device.
    pub live_count: u64,
    /// The largest of them, largest first (at most [`OOM_TOP_LIVE`]).
    pub top_live: Vec<OomAlloc>,
    pub size_classes: Vec<SizeClass>,
    /// The device's bytes in use over the last [`OOM_WINDOW_NS`] (at most), up to the event.
    pub timeline: Timeline,
    /// Bytes freed with `cuMemFreeAsync` on the device in the last [`ASYNC_RECENT_NS`].
    pub async_freed_recent_bytes: u64,
    /// Minima rising across cycles on the device up to the event.
    pub leak: Option<LeakTrend>,
    /// Live bytes on the device by call site, largest first (at most [`SITES_LISTED`]); traces with stacks.
    pub by_site: Vec<SiteBytes>,
    /// Live bytes of call sites not listed, and of allocations without a call site.
    pub by_site_unlisted_bytes: u64,
    pub no_site_bytes: u64,
    /// Events the shim reported dropped before the event (all processes).
    pub dropped_events: u64,
    /// The framework's own out-of-memory record (PyTorch's observer), when the bridge sent one.
    pub framework: Option<FrameworkOom>,
    /// The failing process's framework figures on the device: the framework record's, else its last sample.
    pub framework_figures: Option<Figures>,
    /// The job's framework (allocated, reserved) on the device, all processes, at the event.
    pub framework_job: Option<(u64, u64)>,
    /// Allocated bytes (the framework's figure) rising across cycles up to the event.
    pub framework_leak: Option<LeakTrend>,
    /// Failed driver requests of the same error folded into this one (the allocator's retry after flushing
    /// its cache).
    pub driver_ooms_folded: u32,
}

impl Analysis {
    pub fn device(&self, device: u32) -> Option<&DeviceStats> {
        self.devices.iter().find(|d| d.device == Some(device))
    }

    pub fn process(&self, pid: u32) -> Option<&ProcessStats> {
        self.processes.iter().find(|p| p.pid == pid)
    }

    /// Out-of-memory records that got no snapshot.
    pub fn ooms_not_snapshotted(&self) -> u64 {
        self.oom_records.saturating_sub(self.ooms.len() as u64)
    }
}

/// Reads and replays a trace file; call sites are symbolised from the files the trace names
/// ([`Symbolizer::new`]).
pub fn analyze(path: &Path) -> Result<Analysis, ModelError> {
    let file = File::open(path).map_err(|source| ModelError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut sym = Symbolizer::new();
    let mut a = analyze_bounded(
        BufReader::with_capacity(1 << 20, file),
        MERGE_BOUND,
        Some(&mut sym),
    )
    .map_err(|e| match e {
        OpenError::Io(source) => ModelError::Read {
            path: path.to_owned(),
            source,
        },
        source => ModelError::Open {
            path: path.to_owned(),
            source,
        },
    })?;
    read_snapshots(&mut a, path);
    Ok(a)
}

/// Reads the framework snapshots kept beside the trace (`--torch-history`) for the out-of-memory events that
/// name one.
fn read_snapshots(a: &mut Analysis, trace: &Path) {
    let start_unix = a.header.start_unix_ns;
    for o in &mut a.ooms {
        let rise = o.framework_leak.as_ref().map(|l| {
            let us = |t: u64| start_unix.saturating_add(t) / 1_000;
            (us(l.minima[0].t_ns), us(l.minima[l.minima.len() - 1].t_ns))
        });
        let device = o.device;
        let Some(f) = o.framework.as_mut() else {
            continue;
        };
        let Some(recorded) = f.snapshot_path.clone() else {
            continue;
        };
        f.snapshot = Some(match crate::torch_snapshot::locate(&recorded, trace) {
            Some(p) => crate::torch_snapshot::read(&p, device, rise),
            None => SnapshotReading {
                path: recorded,
                error: Some("not found (beside the trace or where it was written)".into()),
                ..SnapshotReading::default()
            },
        });
    }
}

/// Replays a trace from any reader (buffer it: frames are read a few bytes at a time); call sites are
/// symbolised from the files the trace names ([`Symbolizer::new`]).
pub fn analyze_reader(r: impl Read) -> Result<Analysis, OpenError> {
    let mut sym = Symbolizer::new();
    analyze_bounded(r, MERGE_BOUND, Some(&mut sym))
}

/// [`analyze_reader`] with a given symboliser (its debug directories, its cache of objects), or none: native
/// frames are then `module+offset` and no file is read.
pub fn analyze_reader_with(
    r: impl Read,
    sym: Option<&mut Symbolizer>,
) -> Result<Analysis, OpenError> {
    analyze_bounded(r, MERGE_BOUND, sym)
}

fn analyze_bounded(
    r: impl Read,
    bound: usize,
    sym: Option<&mut Symbolizer>,
) -> Result<Analysis, OpenError> {
    let (mut reader, header) = TraceReader::open(r)?;
    let mut st = Replay::new(header.start_mono_ns, bound.max(8));
    let mut batch: Vec<Event> = Vec::with_capacity(1024);
    let mut unknown_frames = 0u64;
    while let Some((k, payload)) = reader.next_frame() {
        let bad = if k == kind::EVENTS || k == kind::EVENTS_STACKS {
            batch.clear();
            match codec::decode_events_of(k, payload, &mut batch) {
                Ok(pid) => {
                    st.on_events(pid, &mut batch);
                    None
                }
                Err(e) => Some(e),
            }
        } else {
            match codec::decode_record(k, payload) {
                Ok(Some(rec)) => {
                    st.on_record(rec);
                    None
                }
                Ok(None) => {
                    unknown_frames += 1;
                    None
                }
                Err(e) => Some(e),
            }
        };
        if let Some(e) = bad {
            reader.mark_corrupt(e.to_string());
            break;
        }
    }
    let stopped = reader.stop().describe(reader.frames());
    let mut a = st.finish(header, sym);
    a.format_version = reader.version;
    a.partial = stopped.is_some();
    a.stopped = stopped;
    a.frames = reader.frames();
    a.unknown_frames = unknown_frames;
    Ok(a)
}

// ---- replay ----------------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
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
}

struct Proc {
    s: ProcessStats,
    /// The last failed allocation: (tid, bytes, call-site aggregate), so an OOM record names its request's site.
    last_failed: Option<(u32, u64, u32)>,
    cur: u64,
    dev: Vec<ProcDev>,
    ptrs: FastMap<u64, Live>,
    handles: FastMap<u64, Live>,
    reserved: u64,
    mapped: u64,
    /// Events waiting for the merge, in time order.
    queue: VecDeque<Event>,
    /// The time of the merge heap's entry for the queue's front (set exactly when the queue is not empty).
    heap_ts: Option<u64>,
    /// Newest absolute time this process has sent.
    wm: u64,
    open: bool,
    goodbye: bool,
    end_seen: bool,
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
                peak_bytes: 0,
                peak_time_ns: None,
                per_device: Vec::new(),
                allocations: 0,
                frees: 0,
                failed_allocations: 0,
                oom_results: 0,
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
            },
            cur: 0,
            dev: Vec::new(),
            ptrs: FastMap::default(),
            handles: FastMap::default(),
            reserved: 0,
            mapped: 0,
            queue: VecDeque::new(),
            heap_ts: None,
            wm: ts,
            open: true,
            goodbye: false,
            end_seen: false,
            released: false,
            start_abs: ts,
            prev,
            cs: callsites::ProcSites::default(),
        }
    }

    #[inline]
    fn dev(&mut self, d: usize) -> &mut ProcDev {
        if self.dev.len() <= d {
            self.dev.resize(d + 1, ProcDev::default());
        }
        &mut self.dev[d]
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

/// Merge heap entries: (absolute time, what, slot or out-of-memory id). At the same time events come first,
/// then out-of-memory snapshots, then process ends.
const WHAT_EVENTS: u8 = 0;
const WHAT_OOM: u8 = 1;
const WHAT_END: u8 = 2;
/// A bridge record (a framework's figures or out-of-memory error), after the events of its nanosecond.
const WHAT_FW: u8 = 3;
/// A framework out-of-memory record folds the driver's failed requests for the same error made this long
/// before it (the allocator flushing its cache and retrying).
pub const FOLD_NS: u64 = 5_000_000_000;

struct Replay {
    start: u64,
    /// See [`MERGE_BOUND`].
    bound: usize,
    procs: Vec<Proc>,
    by_pid: HashMap<u32, usize>,
    devs: Vec<Dev>,
    /// Slots still open (holding the merge back).
    open: Vec<usize>,
    min_wm: u64,
    wm_dirty: bool,
    heap: BinaryHeap<Reverse<(u64, u8, usize)>>,
    buffered: usize,
    events: u64,
    dropped: u64,
    unmatched: u64,
    lost: u64,
    first_ts: Option<u64>,
    last_ts: u64,
    leaks: Vec<LiveAlloc>,
    leak_count: u64,
    leak_bytes: u64,
    /// Out-of-memory records waiting for the merge to reach their time: id -> (slot, record).
    pending_ooms: HashMap<usize, (usize, Oom)>,
    next_oom: usize,
    oom_records: u64,
    ooms: Vec<OomSnapshot>,
    /// Stacks, notes and call-site aggregates.
    cs: callsites::Store,
    /// Bridge records waiting for the merge to reach their time: id -> (slot, record).
    pending_fw: HashMap<usize, (usize, Record)>,
    next_fw: usize,
    fw: framework::FwReplay,
}

impl Replay {
    fn new(start: u64, bound: usize) -> Self {
        Replay {
            start,
            bound,
            procs: Vec::new(),
            by_pid: HashMap::new(),
            devs: Vec::new(),
            open: Vec::new(),
            min_wm: u64::MAX,
            wm_dirty: false,
            heap: BinaryHeap::new(),
            buffered: 0,
            events: 0,
            dropped: 0,
            unmatched: 0,
            lost: 0,
            first_ts: None,
            last_ts: 0,
            leaks: Vec::new(),
            leak_count: 0,
            leak_bytes: 0,
            pending_ooms: HashMap::new(),
            next_oom: 0,
            oom_records: 0,
            ooms: Vec::new(),
            cs: callsites::Store::default(),
            pending_fw: HashMap::new(),
            next_fw: 0,
            fw: framework::FwReplay::default(),
        }
    }

    #[inline]
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

    fn advance(&mut self, s: usize, ts: u64) {
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
        self.min_wm
    }

    // ---- records ----

    fn on_events(&mut self, pid: u32, batch: &mut [Event]) {
        if batch.is_empty() {
            return;
        }
        self.events += batch.len() as u64;
        if !batch.is_sorted_by_key(|e| e.ts_ns) {
            batch.sort_by_key(|e| e.ts_ns);
        }
        let (lo, hi) = (batch[0].ts_ns, batch[batch.len() - 1].ts_ns);
        self.observe(lo);
        self.observe(hi);
        let s = self.route(pid, lo);
        self.enqueue(s, batch);
        self.advance(s, hi);
        if self.buffered > self.bound {
            self.pump(u64::MAX, self.bound - self.bound / 8);
        }
        let limit = self.limit();
        self.pump(limit, 0);
    }

    fn enqueue(&mut self, s: usize, batch: &[Event]) {
        self.buffered += batch.len();
        let p = &mut self.procs[s];
        let in_order = p.queue.back().is_none_or(|b| b.ts_ns <= batch[0].ts_ns);
        if in_order {
            let was_empty = p.queue.is_empty();
            p.queue.extend(batch.iter().copied());
            if was_empty {
                p.heap_ts = Some(batch[0].ts_ns);
                self.heap.push(Reverse((batch[0].ts_ns, WHAT_EVENTS, s)));
            }
        } else {
            // A batch older than what is already waiting (threads racing to the shim's queue): merge it in.
            let mut all: Vec<Event> = p.queue.drain(..).collect();
            all.extend_from_slice(batch);
            all.sort_by_key(|e| e.ts_ns);
            p.queue.extend(all);
            let front = p.queue[0].ts_ns;
            if p.heap_ts != Some(front) {
                // The old entry goes stale; `pump` skips it.
                p.heap_ts = Some(front);
                self.heap.push(Reverse((front, WHAT_EVENTS, s)));
            }
        }
    }

    fn on_record(&mut self, rec: Record) {
        match rec {
            Record::Hello(h) => self.on_hello(h),
            Record::Events { pid, mut events } => self.on_events(pid, &mut events),
            Record::Dropped { pid, ts_ns, count } => {
                self.observe(ts_ns);
                let s = self.route(pid, ts_ns);
                let p = &mut self.procs[s].s;
                p.dropped_events = p.dropped_events.saturating_add(count);
                self.dropped = self.dropped.saturating_add(count);
            }
            Record::Tick { pid, ts_ns } => {
                self.observe(ts_ns);
                let s = self.route(pid, ts_ns);
                self.advance(s, ts_ns);
                let limit = self.limit();
                self.pump(limit, 0);
            }
            Record::Goodbye { pid, ts_ns } => {
                self.observe(ts_ns);
                let s = self.route(pid, ts_ns);
                self.advance(s, ts_ns);
                self.procs[s].goodbye = true;
                self.close(s);
                let limit = self.limit();
                self.pump(limit, 0);
            }
            Record::ProcessEnd { pid, ts_ns, kind } => {
                self.observe(ts_ns);
                let s = self.route(pid, ts_ns);
                let p = &mut self.procs[s];
                if !p.end_seen {
                    p.end_seen = true;
                    p.s.ended = match kind {
                        EndKind::Goodbye => Ended::Goodbye,
                        EndKind::Vanished => Ended::Vanished,
                        EndKind::CutMidFrame { partial_bytes } => {
                            Ended::CutMidFrame { partial_bytes }
                        }
                    };
                    p.s.end_ns = Some(ts_ns.saturating_sub(self.start));
                    self.close(s);
                    self.heap.push(Reverse((ts_ns, WHAT_END, s)));
                }
                let limit = self.limit();
                self.pump(limit, 0);
            }
            Record::Oom(o) => {
                let ts = o.ts_ns;
                self.observe(ts);
                let s = self.route(o.pid, ts);
                self.advance(s, ts);
                self.oom_records += 1;
                if self.ooms.len() + self.pending_ooms.len() < MAX_OOM_SNAPSHOTS {
                    let id = self.next_oom;
                    self.next_oom += 1;
                    self.pending_ooms.insert(id, (s, o));
                    self.heap.push(Reverse((ts, WHAT_OOM, id)));
                }
                let limit = self.limit();
                self.pump(limit, 0);
            }
            // Metadata: their times move no watermark and are no event's.
            Record::Stack(st) => {
                let s = self.route(st.pid, self.last_ts);
                self.cs.on_stack(&mut self.procs[s].cs, st);
            }
            Record::Objects(o) => {
                let s = self.route(o.pid, o.ts_ns);
                self.cs.on_objects(&mut self.procs[s].cs, o.objects);
            }
            Record::Note { pid, ts_ns, text } => {
                let t = self.rel(ts_ns);
                self.cs.on_note(pid, t, text);
            }
            // The bridge's records ride the merge like out-of-memory records: applied at their time.
            Record::FrameworkSample(ref f) => {
                let (pid, ts) = (f.pid, f.ts_ns);
                self.queue_fw(pid, ts, rec);
            }
            Record::Bridge(ref b) => {
                let (pid, ts) = (b.pid, b.ts_ns);
                self.queue_fw(pid, ts, rec);
            }
        }
    }

    fn queue_fw(&mut self, pid: u32, ts: u64, rec: Record) {
        self.observe(ts);
        let s = self.route(pid, ts);
        self.advance(s, ts);
        let id = self.next_fw;
        self.next_fw += 1;
        self.pending_fw.insert(id, (s, rec));
        self.heap.push(Reverse((ts, WHAT_FW, id)));
        let limit = self.limit();
        self.pump(limit, 0);
    }

    /// Replays bridge record `id` at `ts`.
    fn on_fw(&mut self, id: usize, ts: u64) {
        let Some((s, rec)) = self.pending_fw.remove(&id) else {
            return;
        };
        let t = self.rel(ts);
        match rec {
            Record::FrameworkSample(f) => self.fw.on_sample(s, &f, t),
            Record::Bridge(b) => {
                let (pid, tid) = (b.pid, b.tid);
                if let Some(fo) = self.fw.on_bridge(b, t) {
                    self.fold_framework_oom(s, pid, tid, ts, fo);
                }
            }
            _ => {}
        }
    }

    /// Attaches a framework's out-of-memory record to the driver's snapshot of the same error (the last
    /// failed request of that process and device within [`FOLD_NS`]; earlier ones were the allocator's
    /// retries and fold into it), or snapshots it on its own when the driver saw no failure (PyTorch's
    /// per-process memory fraction refuses before asking the driver).
    fn fold_framework_oom(&mut self, s: usize, pid: u32, tid: u32, ts: u64, fo: FrameworkOom) {
        let t = fo.time_ns;
        let same: Vec<usize> = self
            .ooms
            .iter()
            .enumerate()
            .filter(|(_, o)| {
                o.pid == pid
                    && o.device == fo.device
                    && o.framework.is_none()
                    && o.time_ns <= t
                    && t - o.time_ns <= FOLD_NS
            })
            .map(|(i, _)| i)
            .collect();
        let at = match same.last() {
            Some(&last) => {
                let folded = same.len() as u32 - 1;
                let keep = self.ooms.remove(last);
                for &i in same[..same.len() - 1].iter().rev() {
                    self.ooms.remove(i);
                }
                self.ooms.push(keep);
                let i = self.ooms.len() - 1;
                self.ooms[i].driver_ooms_folded = folded;
                // One error, however many driver requests failed behind it.
                self.oom_records = self.oom_records.saturating_sub(folded as u64);
                i
            }
            None => {
                if self.ooms.len() >= MAX_OOM_SNAPSHOTS {
                    return;
                }
                let id = self.next_oom;
                self.next_oom += 1;
                self.oom_records += 1;
                let o = Oom {
                    pid,
                    tid,
                    ts_ns: ts,
                    device: fo.device.unwrap_or(NO_DEVICE),
                    api: 0,
                    flags: 0,
                    requested_bytes: fo.requested_bytes,
                    result: CUDA_OOM,
                    device_free_bytes: fo.device_free_bytes,
                    device_total_bytes: None,
                    cap_bytes: None,
                    job_used_bytes: None,
                    process_used_bytes: None,
                    extra: Vec::new(),
                };
                self.pending_ooms.insert(id, (s, o));
                let before = self.ooms.len();
                self.snapshot(id, ts);
                if self.ooms.len() == before {
                    return;
                }
                self.ooms.len() - 1
            }
        };
        let o = &mut self.ooms[at];
        o.framework_figures = Some(fo.figures);
        if let Some(dev) = fo.device {
            o.framework_job = self.fw.job_allocated(dev);
            o.framework_leak = self.fw.leak_until(dev, t);
        }
        o.framework = Some(fo);
    }

    fn on_hello(&mut self, h: Hello) {
        self.observe(h.ts_ns);
        let s = match self.by_pid.get(&h.pid).copied() {
            Some(s) if !self.procs[s].s.announced && !self.procs[s].end_seen => s,
            // A second hello: the pid exec'd a new program, or was reused after the first one ended.
            Some(s) => self.new_slot(h.pid, h.ts_ns, Some(s)),
            None => self.new_slot(h.pid, h.ts_ns, None),
        };
        self.advance(s, h.ts_ns);
        let rel = self.rel(h.ts_ns);
        let p = &mut self.procs[s];
        p.s.announced = true;
        p.s.ppid = Some(h.ppid);
        p.s.cmdline = h.cmdline;
        p.s.hostname = Some(h.hostname);
        p.s.rank = h.rank;
        p.s.local_rank = h.local_rank;
        p.s.slurm_procid = h.slurm_procid;
        p.s.python_bridge = h
            .extra
            .iter()
            .any(|(k, v)| k == "python_bridge" && v == "1");
        p.s.start_ns = p.s.start_ns.min(rel);
    }

    // ---- the merge ----

    /// Replays waiting events in time order up to `limit`; with `keep > 0`, stops once at most `keep` wait.
    fn pump(&mut self, limit: u64, keep: usize) {
        while let Some(&Reverse((ts, what, s))) = self.heap.peek() {
            if ts > limit || (keep > 0 && self.buffered <= keep) {
                break;
            }
            self.heap.pop();
            if what == WHAT_END {
                self.end_process(s, ts);
                continue;
            }
            if what == WHAT_OOM {
                self.snapshot(s, ts);
                continue;
            }
            if what == WHAT_FW {
                self.on_fw(s, ts);
                continue;
            }
            if self.procs[s].heap_ts != Some(ts) {
                continue; // stale
            }
            self.procs[s].heap_ts = None;
            // Replay this process's run of events up to the next other entry.
            let bound = limit.min(self.heap.peek().map_or(u64::MAX, |r| r.0 .0));
            loop {
                let e = match self.procs[s].queue.front() {
                    Some(e) if e.ts_ns <= bound => *e,
                    _ => break,
                };
                self.procs[s].queue.pop_front();
                self.buffered -= 1;
                self.apply(s, &e);
                if keep > 0 && self.buffered <= keep {
                    break;
                }
            }
            if let Some(f) = self.procs[s].queue.front() {
                let f = f.ts_ns;
                self.procs[s].heap_ts = Some(f);
                self.heap.push(Reverse((f, WHAT_EVENTS, s)));
            }
        }
    }

    /// The process's connection ended at `ts`: replay whatever it still has waiting, then CUDA releases the rest.
    fn end_process(&mut self, s: usize, ts: u64) {
        while let Some(e) = self.procs[s].queue.pop_front() {
            self.buffered -= 1;
            self.apply(s, &e);
        }
        self.procs[s].heap_ts = None;
        self.procs[s].released = true;
        let t = self.rel(ts);
        self.collect_live(s, t, true);
        self.fw.on_process_end(s, t);
    }

    // ---- replaying one event ----

    #[inline]
    fn dev_index(&mut self, device: u32) -> usize {
        if let Some(i) = self.devs.iter().position(|d| d.device == device) {
            return i;
        }
        self.devs.push(Dev {
            device,
            cur: 0,
            peak: 0,
            peak_t: None,
            live_end: 0,
            allocations: 0,
            largest: 0,
            info: None,
            tl: TimelineBuilder::default(),
            async_freed: [(u64::MAX, 0); ASYNC_STEPS],
            oom_total: None,
            oom_cap: None,
            peak_seq: 0,
        });
        self.devs.len() - 1
    }

    #[inline]
    fn apply(&mut self, s: usize, e: &Event) {
        let t = self.rel(e.ts_ns);
        match e.api.effect() {
            eff @ (Effect::AllocPtr | Effect::CreateHandle) => {
                if e.result != 0 {
                    if e.stack != 0 {
                        let d = self.dev_index(e.device);
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
                    return;
                }
                if e.flags & flags::CAP_EXCEEDED != 0 {
                    self.procs[s].s.cap_exceeded += 1;
                }
                let d = self.dev_index(e.device);
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
                let map = if eff == Effect::CreateHandle {
                    &mut p.handles
                } else {
                    &mut p.ptrs
                };
                if let Some(old) = map.insert(e.addr, live) {
                    p.s.lost_frees += 1;
                    self.lost += 1;
                    self.take(s, &old, t);
                }
                self.give(s, d, e.size, t, site);
            }
            eff @ (Effect::FreePtr | Effect::ReleaseHandle) => {
                if e.result != 0 {
                    return;
                }
                let p = &mut self.procs[s];
                let map = if eff == Effect::ReleaseHandle {
                    &mut p.handles
                } else {
                    &mut p.ptrs
                };
                match map.remove(&e.addr) {
                    Some(old) => {
                        p.s.frees += 1;
                        self.take(s, &old, t);
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
            Effect::AddressSpace => {
                if e.result != 0 {
                    return;
                }
                let p = &mut self.procs[s];
                match e.api {
                    Api::MemAddressReserve => {
                        p.reserved = p.reserved.saturating_add(e.size);
                        p.s.address_reserved_peak_bytes =
                            p.s.address_reserved_peak_bytes.max(p.reserved);
                    }
                    Api::MemAddressFree => p.reserved = p.reserved.saturating_sub(e.size),
                    Api::MemMap => {
                        p.mapped = p.mapped.saturating_add(e.size);
                        p.s.mapped_peak_bytes = p.s.mapped_peak_bytes.max(p.mapped);
                    }
                    Api::MemUnmap => p.mapped = p.mapped.saturating_sub(e.size),
                    _ => {}
                }
            }
            Effect::Info => {
                if e.result == 0 {
                    let d = self.dev_index(e.device);
                    self.devs[d].info = Some((e.addr, e.size));
                }
            }
        }
    }

    #[inline]
    fn give(&mut self, s: usize, d: usize, size: u64, t: u64, site: u32) {
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
        p.cur = p.cur.saturating_add(size);
        p.s.allocations += 1;
        p.s.largest_allocation_bytes = p.s.largest_allocation_bytes.max(size);
        if p.cur > p.s.peak_bytes {
            p.s.peak_bytes = p.cur;
            p.s.peak_time_ns = Some(t);
        }
        let pd = p.dev(d);
        pd.cur = pd.cur.saturating_add(size);
        pd.allocations += 1;
        pd.peak = pd.peak.max(pd.cur);
    }

    #[inline]
    fn take(&mut self, s: usize, l: &Live, t: u64) {
        let d = l.dev as usize;
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
        p.cur = p.cur.saturating_sub(l.size);
        let pd = p.dev(d);
        pd.cur = pd.cur.saturating_sub(l.size);
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

    /// The replay reached out-of-memory record `id` (at absolute time `ts`): everything up to then is applied.
    fn snapshot(&mut self, id: usize, ts: u64) {
        let Some((s, o)) = self.pending_ooms.remove(&id) else {
            return;
        };
        let t = self.rel(ts);
        let d = self.devs.iter().position(|x| x.device == o.device);
        let device = (o.device != NO_DEVICE).then_some(o.device);
        if let Some(d) = d {
            let dv = &mut self.devs[d];
            if let Some(total) = o.device_total_bytes {
                dv.oom_total = Some(dv.oom_total.map_or(total, |x| x.max(total)));
            }
            if o.cap_bytes.is_some() {
                dv.oom_cap = o.cap_bytes;
            }
        }
        let (job_live, job_peak, job_peak_t, async_recent) = match d {
            Some(d) => {
                let dv = &self.devs[d];
                let now = t / ASYNC_STEP_NS;
                let recent = dv
                    .async_freed
                    .iter()
                    .filter(|(step, _)| *step <= now && now - *step < ASYNC_STEPS as u64)
                    .fold(0u64, |a, (_, b)| a.saturating_add(*b));
                (dv.cur, dv.peak, dv.peak_t, recent)
            }
            None => (0, 0, None, 0),
        };
        let full = d
            .map(|d| self.devs[d].tl.clone().finish(t))
            .unwrap_or_default();
        let mut leak = leak_trend(&full);
        let timeline = window(&full, t.saturating_sub(OOM_WINDOW_NS), OOM_TIMELINE_POINTS);
        drop(full);

        // Processes.
        let devs = &self.devs;
        let dev_of = |i: usize| (devs[i].device != NO_DEVICE).then_some(devs[i].device);
        let mut processes = Vec::new();
        let mut on_device = 0u64;
        for (i, p) in self.procs.iter().enumerate() {
            if p.released {
                continue;
            }
            let used =
                i == s || d.is_some_and(|d| p.dev.get(d).is_some_and(|pd| pd.allocations > 0));
            on_device += used as u64;
            let mut per_device: Vec<(Option<u32>, u64)> = p
                .dev
                .iter()
                .enumerate()
                .filter(|(_, pd)| pd.cur > 0)
                .map(|(di, pd)| (dev_of(di), pd.cur))
                .collect();
            if per_device.is_empty() && i != s {
                continue;
            }
            per_device.sort_by_key(|(dv, _)| dv.unwrap_or(u32::MAX));
            processes.push(OomProcess {
                pid: p.s.pid,
                announced: p.s.announced,
                rank: p.s.rank,
                cmdline: p.s.cmdline.clone(),
                device_live_bytes: d.and_then(|d| p.dev.get(d)).map_or(0, |pd| pd.cur),
                per_device,
                on_device: used,
            });
        }

        // One pass over the live set of the device.
        let mut classes: Vec<SizeClass> = SIZE_CLASSES
            .iter()
            .enumerate()
            .map(|(i, &(label, max))| SizeClass {
                label,
                min_bytes: if i == 0 { 0 } else { SIZE_CLASSES[i - 1].1 },
                max_bytes: (max != u64::MAX).then_some(max),
                count: 0,
                bytes: 0,
            })
            .collect();
        let mut top: Vec<OomAlloc> = Vec::new();
        // The smallest size still in the top list after the last trim: anything smaller cannot get in.
        let mut floor = 0u64;
        let mut live_count = 0u64;
        let span = leak
            .as_ref()
            .map(|l| (l.minima[0].t_ns, l.minima[l.minima.len() - 1].t_ns));
        let mut groups: HashMap<(Api, u64), u64> = HashMap::new();
        let mut site_groups: HashMap<u32, (u64, u64)> = HashMap::new();
        if let Some(d) = d {
            for p in self.procs.iter().filter(|p| !p.released) {
                for (&addr, l) in p.ptrs.iter().chain(p.handles.iter()) {
                    if l.dev as usize != d {
                        continue;
                    }
                    live_count += 1;
                    let c = SIZE_CLASSES
                        .iter()
                        .position(|&(_, max)| l.size < max)
                        .unwrap_or(SIZE_CLASSES.len() - 1);
                    classes[c].count += 1;
                    classes[c].bytes = classes[c].bytes.saturating_add(l.size);
                    if let Some((from, to)) = span {
                        if l.ts > from && l.ts <= to {
                            *groups.entry((l.api, l.size)).or_default() += 1;
                            if l.site != NO_SITE {
                                let g = site_groups.entry(l.site).or_default();
                                g.0 += 1;
                                g.1 = g.1.saturating_add(l.size);
                            }
                        }
                    }
                    if l.size < floor {
                        continue;
                    }
                    top.push(OomAlloc {
                        pid: p.s.pid,
                        tid: l.tid,
                        device,
                        api: l.api,
                        ptsz: l.flags & flags::PTSZ != 0,
                        address: addr,
                        bytes: l.size,
                        alloc_time_ns: l.ts,
                        age_ns: t.saturating_sub(l.ts),
                        site: site_ref(l.site),
                    });
                    if top.len() >= 8 * OOM_TOP_LIVE {
                        trim_top(&mut top);
                        floor = top[top.len() - 1].bytes;
                    }
                }
            }
        }
        trim_top(&mut top);
        if let Some(l) = leak.as_mut() {
            let mut g: Vec<LeakGroup> = groups
                .into_iter()
                .map(|((api, size), count)| LeakGroup {
                    api,
                    bytes_each: size,
                    count,
                    bytes: size.saturating_mul(count),
                })
                .collect();
            g.sort_unstable_by(|a, b| {
                b.bytes
                    .cmp(&a.bytes)
                    .then(b.count.cmp(&a.count))
                    .then(a.api.cmp(&b.api))
                    .then(a.bytes_each.cmp(&b.bytes_each))
            });
            l.more_groups = g.len().saturating_sub(10) as u64;
            g.truncate(10);
            l.groups = g;
            // By call site: indices are aggregates until `finish` turns them into sites.
            let mut g: Vec<LeakSite> = site_groups
                .into_iter()
                .map(|(site, (count, bytes))| LeakSite {
                    site: site as usize,
                    count,
                    bytes,
                    label: String::new(),
                })
                .collect();
            g.sort_unstable_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.cmp(&b.site)));
            l.more_sites = g.len().saturating_sub(SITES_LISTED) as u64;
            g.truncate(SITES_LISTED);
            l.sites = g;
        }
        // Live bytes by call site on the device.
        let (mut by_site, mut site_total) = (Vec::new(), 0u64);
        if let Some(d) = d {
            for (i, a) in self.cs.aggs.iter().enumerate() {
                if a.dev as usize == d && a.cur > 0 {
                    site_total = site_total.saturating_add(a.cur);
                    by_site.push(SiteBytes {
                        site: i,
                        count: a.live_count,
                        bytes: a.cur,
                    });
                }
            }
        }
        by_site.sort_unstable_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.cmp(&b.site)));
        by_site.truncate(SITES_LISTED);
        let listed = by_site.iter().fold(0u64, |x, b| x.saturating_add(b.bytes));
        // The request's own site: the process's last failed allocation, made by the same thread for as much.
        let request_site = match self.procs[s].last_failed {
            Some((tid, size, site)) if tid == o.tid && size == o.requested_bytes => site_ref(site),
            _ => None,
        };
        self.ooms.push(OomSnapshot {
            time_ns: t,
            pid: o.pid,
            tid: o.tid,
            device,
            api: Api::from_u8(o.api),
            api_code: o.api,
            ptsz: o.flags & flags::PTSZ != 0,
            cap_refused: o.flags & flags::CAP_REFUSED != 0,
            requested_bytes: o.requested_bytes,
            result: o.result,
            request_site,
            device_free_bytes: o.device_free_bytes,
            device_total_bytes: o.device_total_bytes,
            cap_bytes: o.cap_bytes,
            ledger_job_bytes: o.job_used_bytes,
            ledger_process_bytes: o.process_used_bytes,
            job_live_trace_bytes: job_live,
            job_peak_bytes: job_peak,
            job_peak_time_ns: job_peak_t,
            job_processes_on_device: on_device,
            processes,
            live_count,
            top_live: top,
            size_classes: classes,
            timeline,
            async_freed_recent_bytes: async_recent,
            leak,
            by_site,
            by_site_unlisted_bytes: site_total.saturating_sub(listed),
            no_site_bytes: job_live.saturating_sub(site_total),
            dropped_events: self.dropped,
            framework: None,
            framework_figures: (o.device != NO_DEVICE)
                .then(|| self.fw.figures(s, o.device))
                .flatten(),
            framework_job: (o.device != NO_DEVICE)
                .then(|| self.fw.job_allocated(o.device))
                .flatten(),
            framework_leak: (o.device != NO_DEVICE)
                .then(|| self.fw.leak_until(o.device, t))
                .flatten(),
            driver_ooms_folded: 0,
        });
    }

    /// Everything process `s` still holds at `t` is live at its end; with `release`, CUDA gives it back at `t`.
    fn collect_live(&mut self, s: usize, t: u64, release: bool) {
        let p = &mut self.procs[s];
        let pid = p.s.pid;
        let ptrs = std::mem::take(&mut p.ptrs);
        let handles = std::mem::take(&mut p.handles);
        for (addr, l) in ptrs.into_iter().chain(handles) {
            if l.site != NO_SITE {
                let a = &mut self.cs.aggs[l.site as usize];
                a.live_end = a.live_end.saturating_add(l.size);
            }
            let p = &mut self.procs[s];
            p.s.live_bytes_at_end = p.s.live_bytes_at_end.saturating_add(l.size);
            p.s.live_allocations_at_end += 1;
            let pd = p.dev(l.dev as usize);
            pd.live_end = pd.live_end.saturating_add(l.size);
            let dv = &mut self.devs[l.dev as usize];
            dv.live_end = dv.live_end.saturating_add(l.size);
            self.leak_count += 1;
            self.leak_bytes = self.leak_bytes.saturating_add(l.size);
            self.leaks.push(LiveAlloc {
                pid,
                device: (dv.device != NO_DEVICE).then_some(dv.device),
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
            }
        }
    }

    fn finish(mut self, header: TraceHeader, sym: Option<&mut Symbolizer>) -> Analysis {
        self.pump(u64::MAX, 0);
        let end = self.rel(self.last_ts);
        for s in 0..self.procs.len() {
            let p = &mut self.procs[s];
            if !p.end_seen && p.goodbye {
                p.s.ended = Ended::Goodbye;
            }
            let at = p.s.end_ns.unwrap_or(end);
            self.collect_live(s, at, false);
        }
        trim_leaks(&mut self.leaks);
        let call_sites = self.call_sites(sym);
        let fw = std::mem::take(&mut self.fw);
        let (mut fw_procs, fw_devs, bridge) = fw.finish(end);
        let devs = &self.devs;
        let dev_of = |d: usize| (devs[d].device != NO_DEVICE).then_some(devs[d].device);
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
                    .enumerate()
                    .filter(|(_, pd)| pd.allocations > 0)
                    .map(|(d, pd)| ProcessDevice {
                        device: dev_of(d),
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
            .map(|d| DeviceStats {
                device: (d.device != NO_DEVICE).then_some(d.device),
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
                timeline: d.tl.finish(end),
                framework: None,
            })
            .collect();
        for f in fw_devs {
            match devices.iter_mut().find(|d| d.device == Some(f.device)) {
                Some(d) => d.framework = Some(f),
                None => devices.push(DeviceStats {
                    device: Some(f.device),
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
                    framework: Some(f),
                }),
            }
        }
        devices.sort_by_key(|d| d.device.unwrap_or(u32::MAX));
        let from_header = |key: &str, dev: Option<u32>| -> Option<u64> {
            let want = format!("{key}.{}", dev?);
            header
                .extra
                .iter()
                .find(|(k, _)| *k == want)
                .and_then(|(_, v)| v.trim().parse().ok())
        };
        for d in &mut devices {
            d.total_bytes = d.total_bytes.or(from_header("device_total", d.device));
            d.cap_bytes = from_header("cap_bytes", d.device).or(d.cap_bytes);
        }
        let mut ooms = self.ooms;
        ooms.sort_by_key(|o| o.time_ns);
        let first = self.first_ts.map(|f| f.saturating_sub(self.start));
        Analysis {
            header,
            format_version: 0,
            partial: false,
            stopped: None,
            frames: 0,
            unknown_frames: 0,
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
            bridge,
            ooms,
            call_sites,
        }
    }

    /// The call sites the reports show, symbolised, with every site reference (aggregate indices until now)
    /// turned into an index of `CallSites::sites`.
    fn call_sites(&mut self, mut sym: Option<&mut Symbolizer>) -> CallSites {
        let notes = self.cs.notes();
        if !self.cs.any {
            return CallSites {
                notes,
                ..CallSites::default()
            };
        }
        let devs = &self.devs;
        let aggs = &mut self.cs.aggs;
        for a in aggs.iter_mut() {
            a.sync(devs[a.dev as usize].peak_seq);
        }
        let aggs = &self.cs.aggs;
        let mut rm = Remap::default();

        // Each device's peak.
        let mut per_dev: Vec<Vec<usize>> = vec![Vec::new(); devs.len()];
        for (i, a) in aggs.iter().enumerate() {
            if a.at_peak > 0 {
                per_dev[a.dev as usize].push(i);
            }
        }
        let mut at_peak = Vec::new();
        for (d, mut list) in per_dev.into_iter().enumerate() {
            let dv = &devs[d];
            if dv.peak == 0 {
                continue;
            }
            let total = list
                .iter()
                .fold(0u64, |x, &i| x.saturating_add(aggs[i].at_peak));
            list.sort_unstable_by(|&a, &b| aggs[b].at_peak.cmp(&aggs[a].at_peak).then(a.cmp(&b)));
            list.truncate(SITES_LISTED);
            let sites: Vec<SiteBytes> = list
                .iter()
                .map(|&i| SiteBytes {
                    site: rm.get(aggs, i),
                    count: 0,
                    bytes: aggs[i].at_peak,
                })
                .collect();
            let listed = sites.iter().fold(0u64, |x, b| x.saturating_add(b.bytes));
            at_peak.push(DeviceSites {
                device: (dv.device != NO_DEVICE).then_some(dv.device),
                peak_bytes: dv.peak,
                sites,
                unlisted_bytes: total.saturating_sub(listed),
                no_site_bytes: dv.peak.saturating_sub(total),
            });
        }
        at_peak.sort_by_key(|d| d.device.unwrap_or(u32::MAX));

        // Bytes allocated, all devices together.
        let mut allocated: HashMap<(u32, u32), u64> = HashMap::new();
        for a in aggs {
            let x = allocated.entry((a.slot, a.stack)).or_default();
            *x = x.saturating_add(a.bytes);
        }
        let mut allocated: Vec<((u32, u32), u64)> = allocated.into_iter().collect();
        allocated.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        allocated.truncate(SITES_LISTED);
        let by_allocated: Vec<usize> = allocated
            .iter()
            .filter(|(_, b)| *b > 0)
            .map(|&(k, _)| rm.key(k))
            .collect();

        // What the other lists name.
        for l in &mut self.leaks {
            l.site = l.site.map(|i| rm.get(aggs, i));
        }
        for o in &mut self.ooms {
            for l in &mut o.top_live {
                l.site = l.site.map(|i| rm.get(aggs, i));
            }
            o.request_site = o.request_site.map(|i| rm.get(aggs, i));
            for b in &mut o.by_site {
                b.site = rm.get(aggs, b.site);
            }
            if let Some(l) = &mut o.leak {
                for g in &mut l.sites {
                    g.site = rm.get(aggs, g.site);
                }
            }
        }

        // The sites, with their figures and frames.
        let mut sites: Vec<callsites::Site> = rm
            .order
            .iter()
            .map(|&(slot, stack)| {
                let p = &self.procs[slot as usize];
                callsites::Site {
                    pid: p.s.pid,
                    stack,
                    frames: Vec::new(),
                    site: None,
                    missing: true,
                    allocations: 0,
                    allocated_bytes: 0,
                    live_bytes_at_end: 0,
                    per_device: Vec::new(),
                    extra: Vec::new(),
                }
            })
            .collect();
        for a in aggs {
            let Some(&i) = rm.keys.get(&(a.slot, a.stack)) else {
                continue;
            };
            let s = &mut sites[i];
            s.allocations += a.allocations;
            s.allocated_bytes = s.allocated_bytes.saturating_add(a.bytes);
            s.live_bytes_at_end = s.live_bytes_at_end.saturating_add(a.live_end);
            let dv = &devs[a.dev as usize];
            s.per_device.push(callsites::SiteDevice {
                device: (dv.device != NO_DEVICE).then_some(dv.device),
                allocations: a.allocations,
                allocated_bytes: a.bytes,
                peak_bytes: a.at_peak,
                live_bytes_at_end: a.live_end,
            });
        }
        for (i, &(slot, stack)) in rm.order.iter().enumerate() {
            let s = &mut sites[i];
            s.per_device.sort_by_key(|d| d.device.unwrap_or(u32::MAX));
            let p = &self.procs[slot as usize];
            if let Some(frames) = self.cs.frames(&p.cs, stack, sym.as_deref_mut()) {
                s.site = callsites::choose_site(&frames);
                s.frames = frames;
                s.missing = false;
            }
        }
        callsites::distinguish(&mut sites);
        for o in &mut self.ooms {
            if let Some(l) = &mut o.leak {
                for g in &mut l.sites {
                    g.label = sites[g.site].label();
                }
            }
        }
        CallSites {
            present: true,
            stacks: self.cs.stacks_seen,
            stacks_not_kept: self.cs.stacks_not_kept,
            sites,
            at_peak,
            by_allocated,
            notes,
        }
    }
}

/// Site references: (process slot, stack id) -> index in `CallSites::sites`, in order of first reference.
#[derive(Default)]
struct Remap {
    keys: HashMap<(u32, u32), usize>,
    order: Vec<(u32, u32)>,
}

impl Remap {
    fn key(&mut self, k: (u32, u32)) -> usize {
        let n = self.order.len();
        let i = *self.keys.entry(k).or_insert(n);
        if i == n {
            self.order.push(k);
        }
        i
    }

    fn get(&mut self, aggs: &[Agg], agg: usize) -> usize {
        let a = &aggs[agg];
        self.key((a.slot, a.stack))
    }
}

/// Keeps the largest [`OOM_TOP_LIVE`], largest first, then oldest, then by pid and address.
fn trim_top(v: &mut Vec<OomAlloc>) {
    v.sort_unstable_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(a.alloc_time_ns.cmp(&b.alloc_time_ns))
            .then(a.pid.cmp(&b.pid))
            .then(a.address.cmp(&b.address))
    });
    v.truncate(OOM_TOP_LIVE);
}

/// The part of `tl` from `from` on, with neighbouring buckets merged until at most `points` remain.
fn window(tl: &Timeline, from: u64, points: usize) -> Timeline {
    let w = tl.bucket_ns;
    let kept: Vec<Bucket> = tl
        .buckets
        .iter()
        .filter(|b| b.t_ns.saturating_add(w) > from)
        .copied()
        .collect();
    let k = kept.len().div_ceil(points.max(1)).max(1);
    Timeline {
        bucket_ns: w.saturating_mul(k as u64),
        buckets: kept
            .chunks(k)
            .map(|c| Bucket {
                t_ns: c[0].t_ns,
                max_bytes: c.iter().map(|b| b.max_bytes).max().unwrap_or(0),
                last_bytes: c[c.len() - 1].last_bytes,
            })
            .collect(),
    }
}

/// The low points between peaks of a timeline, in time order. Peaks and troughs are the turns of a zigzag that
/// ignores moves smaller than [`TURN_PCT`] % of the timeline's range: a trough is the lowest point after a peak
/// once the bytes rose again by that much. Each bucket is read as its highest value, then its value at its end
/// (the time of the latter is the bucket's end).
pub fn minima(tl: &Timeline) -> Vec<Minimum> {
    let w = tl.bucket_ns;
    let samples = tl.buckets.iter().flat_map(|b| {
        [
            Minimum {
                t_ns: b.t_ns,
                bytes: b.max_bytes,
            },
            Minimum {
                t_ns: b.t_ns.saturating_add(w),
                bytes: b.last_bytes,
            },
        ]
    });
    let (lo, hi) = samples.clone().fold((u64::MAX, 0), |(lo, hi), m| {
        (lo.min(m.bytes), hi.max(m.bytes))
    });
    let mut out = Vec::new();
    if hi <= lo {
        return out;
    }
    let h = ((hi - lo) / 100 * TURN_PCT).max(1);
    // None: no direction yet (tracking both ends); Some(true): rising (candidate peak); Some(false): falling
    // (candidate trough, after a peak).
    let mut rising: Option<bool> = None;
    let (mut min0, mut max0) = (u64::MAX, 0u64);
    let mut cand = Minimum { t_ns: 0, bytes: 0 };
    for m in samples {
        match rising {
            None => {
                min0 = min0.min(m.bytes);
                max0 = max0.max(m.bytes);
                if m.bytes >= min0.saturating_add(h) {
                    rising = Some(true);
                    cand = m;
                } else if m.bytes.saturating_add(h) <= max0 {
                    // It started high and fell: the start was a peak.
                    rising = Some(false);
                    cand = m;
                }
            }
            Some(true) => {
                if m.bytes >= cand.bytes {
                    cand = m;
                } else if cand.bytes - m.bytes >= h {
                    rising = Some(false);
                    cand = m;
                }
            }
            Some(false) => {
                if m.bytes < cand.bytes {
                    cand = m;
                } else if m.bytes - cand.bytes >= h {
                    out.push(cand);
                    rising = Some(true);
                    cand = m;
                }
            }
        }
    }
    out
}

/// A leak trend in a timeline: the trailing run of [`minima`] in which each is no lower than the one before,
/// at least [`LEAK_MIN_MINIMA`] long, the last above the first by more than [`LEAK_MIN_RISE_PCT`] % of the first
/// and by at least 1 MiB. `groups` is left empty (out-of-memory snapshots fill it).
pub fn leak_trend(tl: &Timeline) -> Option<LeakTrend> {
    let m = minima(tl);
    let mut start = m.len().checked_sub(1)?;
    while start > 0 && m[start - 1].bytes <= m[start].bytes {
        start -= 1;
    }
    let run = &m[start..];
    if run.len() < LEAK_MIN_MINIMA {
        return None;
    }
    let (first, last) = (run[0].bytes, run[run.len() - 1].bytes);
    let rise = last - first;
    if rise < 1 << 20 || rise as u128 * 100 <= first as u128 * LEAK_MIN_RISE_PCT as u128 {
        return None;
    }
    Some(LeakTrend {
        minima: run.to_vec(),
        rise_bytes: rise,
        groups: Vec::new(),
        more_groups: 0,
        sites: Vec::new(),
        more_sites: 0,
    })
}

/// An aggregate index as a site reference (turned into an index of `CallSites::sites` by `finish`).
#[inline]
fn site_ref(site: u32) -> Option<usize> {
    (site != NO_SITE).then_some(site as usize)
}

/// Keeps the largest [`LEAK_LIST`], in a stable order: largest first, then oldest, then by pid and address.
fn trim_leaks(v: &mut Vec<LiveAlloc>) {
    v.sort_unstable_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(a.alloc_time_ns.cmp(&b.alloc_time_ns))
            .then(a.pid.cmp(&b.pid))
            .then(a.address.cmp(&b.address))
    });
    v.truncate(LEAK_LIST);
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramtrace_format::codec::{encode_header, put_record};

    fn ev(ts_ms: u64, api: Api, addr: u64, size: u64) -> Event {
        Event {
            ts_ns: 1_000_000_000 + ts_ms * 1_000_000,
            tid: 1,
            api,
            flags: 0,
            device: 0,
            result: 0,
            addr,
            size,
            aux: 0,
            stack: 0,
        }
    }

    #[test]
    fn past_the_bound_the_oldest_events_are_replayed_in_order() {
        let header = TraceHeader {
            start_unix_ns: 0,
            start_mono_ns: 1_000_000_000,
            command: vec![],
            hostname: String::new(),
            vramtrace_version: String::new(),
            extra: vec![],
        };
        let mut t = encode_header(&header);
        // Process 1 never sends anything after its hello, so only the bound lets events through; two
        // other processes interleave by batch.
        put_record(
            &mut t,
            &Record::Hello(Hello {
                pid: 1,
                ppid: 0,
                ts_ns: 1_000_000_000,
                cmdline: vec![],
                hostname: String::new(),
                rank: None,
                local_rank: None,
                slurm_procid: None,
                shim_version: String::new(),
                extra: vec![],
            }),
        );
        for i in 0..500u64 {
            let pid = 2 + (i % 2) as u32;
            let base = i * 10;
            let events = vec![
                ev(base, Api::MemAlloc, 0x1000, (1 + i % 7) << 20),
                ev(base + 4, Api::MemFree, 0x1000, 0),
            ];
            put_record(&mut t, &Record::Events { pid, events });
        }
        let unbounded = analyze_bounded(&t[..], usize::MAX, None).unwrap();
        for bound in [8, 9, 50, 333] {
            let a = analyze_bounded(&t[..], bound, None).unwrap();
            assert_eq!(a.devices, unbounded.devices, "bound {bound}");
            assert_eq!(a.processes, unbounded.processes, "bound {bound}");
        }
        assert_eq!(unbounded.devices[0].peak_bytes, 7 << 20);
        assert_eq!(unbounded.unmatched_frees + unbounded.lost_frees, 0);
    }
}

//! The answer a replay gives (`Analysis`): per device, per process and per out-of-memory error, the figures
//! the reporters show, and the limits on what it keeps.

use vramtrace_format::{Api, ExitStatus, TraceHeader};

use crate::callsites::{CallSites, SiteBytes};
use crate::model::analysis::timeline::Timeline;
pub mod bridge;
pub mod framework;
pub mod growth;
pub mod holders;
pub mod timeline;

pub use growth::{GrowthUnit, LeakGroup, LeakSite, LeakTrend, Minimum, StepNeed, StepSource};

use crate::model::analysis::framework::{
    BridgeSummary, DeviceFramework, Figures, FrameworkOom, ProcessFramework,
};

/// How many live-at-end allocations the analysis lists (the largest).
pub const LEAK_LIST: usize = 20;
/// The most events waiting in the merge's memory; past it, waiting runs are spilled to a temporary file.
pub const MERGE_BOUND: usize = 1 << 20;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_OOM: u32 = 2;
/// The most recovered refusals listed one by one ([`Analysis::refusals`]); all are counted.
pub const REFUSALS_LISTED: usize = 64;
/// The most out-of-memory records given a full snapshot; the rest are counted in [`Analysis::oom_records`].
pub const MAX_OOM_SNAPSHOTS: usize = 16;

/// Device ordinals at or past this are no GPU a host has (the shim records what the driver's context says): a
/// forged one would cost a device's state each, so its events count on the unknown device instead, and samples
/// naming one are dropped; both are counted (`implausible_devices`).
pub const MAX_DEVICE_ORDINAL: u32 = 1024;
/// The largest live allocations an out-of-memory snapshot lists.
pub const OOM_TOP_LIVE: usize = 10;
/// How far back an out-of-memory snapshot's timeline reaches.
pub const OOM_WINDOW_NS: u64 = 10_000_000_000;
/// The most points of an out-of-memory snapshot's timeline (neighbouring buckets are merged past that).
pub const OOM_TIMELINE_POINTS: usize = 100;
/// "Recently" for stream-ordered frees before an out-of-memory event: the last second, in 100 ms steps.
pub const ASYNC_RECENT_NS: u64 = 1_000_000_000;
pub(crate) const ASYNC_STEP_NS: u64 = ASYNC_RECENT_NS / ASYNC_STEPS as u64;
pub(crate) const ASYNC_STEPS: usize = 10;
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
    /// Device ordinal; `None` for allocations on no GPU the shim could tell.
    pub device: Option<u32>,
    /// On no GPU at all: `device` is `None` and every allocation was a `cuMemCreate` with a host location
    /// (NCCL's host buffers). Not GPU memory: left out of the job's sums of device peaks.
    pub on_host: bool,
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
    /// At the driver's last report, its free bytes plus what the job held on the device then: what the job could
    /// have held there, with the CUDA contexts and other processes as they were (`fit`'s limit by default).
    pub room_bytes: Option<u64>,
    /// The device's memory as best known: the latest `cuMemGetInfo`, else an out-of-memory record's, else the
    /// trace header's `device_total.N` (probed when a cap was given).
    pub total_bytes: Option<u64>,
    /// The cap on this device: the trace header's `cap_bytes.N`, else an out-of-memory record's.
    pub cap_bytes: Option<u64>,
    pub timeline: Timeline,
    /// Bytes in use growing step after step up to the end of the run ([`growth::growth`]), with what grew
    /// (allocations made during the rise and live when their process ended).
    pub growth: Option<LeakTrend>,
    /// The frameworks' own figures on this device (the Python bridge), when any process sent them.
    pub framework: Option<DeviceFramework>,
    /// The GPU's UUID as NVIDIA's tools write it (`GPU-...`), by the driver's word in the job's processes
    /// (`Record::Devices`); `None` when none said, or they named different GPUs at this ordinal (processes
    /// with different `CUDA_VISIBLE_DEVICES`).
    pub uuid: Option<String>,
}

impl ProcessStats {
    /// It exited 0, or (not reaped by vramtrace) said goodbye: not killed, not failed, not cut off.
    pub fn ended_cleanly(&self) -> bool {
        match self.exit {
            Some(x) => x == vramtrace_format::ExitStatus::Code(0),
            None => self.ended == Ended::Goodbye,
        }
    }
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
    /// Memory on the host (`cuMemCreate` with a host location), not a GPU's (see [`DeviceStats::on_host`]).
    pub on_host: bool,
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
    /// How it really ended (its exit code or signal), when `vramtrace run` reaped it: the command, and every
    /// descendant orphaned to it. `None`: its own parent reaped it, or it was still running.
    pub exit: Option<ExitStatus>,
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
    /// Of its out-of-memory refusals, those it recovered from (see [`Analysis::refusals`]).
    pub recovered_refusals: u64,
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
    /// Events the shim could not record (its ring was full).
    pub dropped_events: u64,
    /// What was lost, by cause (the collector says why beside each count it writes), largest first.
    pub lost: Vec<(vramtrace_format::LossCause, u64)>,
    /// The process could not be traced (it said why in its hello): none of its events are in the trace.
    pub untraced: Option<String>,
    /// Bytes the driver freed when the process tore down its last context on a device (`cudaDeviceReset`,
    /// `cuCtxDestroy`): allocations that no free released.
    pub context_freed_bytes: u64,
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
    /// Memory on the host (`cuMemCreate` with a host location), not a GPU's.
    pub on_host: bool,
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
    /// It stopped only for want of the end record `run` writes last (the job still running, or `run` killed).
    pub no_end_record: bool,
    /// Whole frames read.
    pub frames: u64,
    /// Frames of kinds this build does not know (a newer writer's), skipped.
    pub unknown_frames: u64,
    /// Whole frames that did not decode (written by a faulty or hostile process), skipped: the rest was read.
    /// The first one's byte offset and why.
    pub bad_frames: u64,
    pub first_bad_frame: Option<(u64, String)>,
    pub events: u64,
    pub dropped_events: u64,
    pub unmatched_frees: u64,
    /// Events and samples that named a device ordinal past [`MAX_DEVICE_ORDINAL`] (a forged trace).
    pub implausible_devices: u64,
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
    /// Events the merge could not put in exact time order: they arrived after it had replayed something later
    /// (their process broke its promise of order), or, with no temporary file for spilling, memory ran past the
    /// bound. 0 in a trace whose processes keep their order.
    pub merge_inexact_events: u64,
    /// Out-of-memory errors: refusals the program did not recover from (it raised, or died, or never allocated
    /// on that device from that thread again), with those a framework retried behind one error of its own
    /// counting once (see [`OomSnapshot::driver_ooms_folded`]).
    pub oom_records: u64,
    /// Refusals the program recovered from: the same thread allocated on the same device afterwards (PyTorch
    /// flushed its cache and retried, or the program went on). The first [`REFUSALS_LISTED`], in time order.
    pub refusals: Vec<Refusal>,
    pub refusals_recovered: u64,
    /// From each recovered refusal to its thread's next allocation there, summed: what recovering cost (a
    /// cache flush synchronises the device).
    pub refusal_stall_ns: u64,
    /// What the Python bridge attached to and said.
    pub bridge: BridgeSummary,
    /// Snapshots of the first [`MAX_OOM_SNAPSHOTS`] out-of-memory records, in time order.
    pub ooms: Vec<OomSnapshot>,
    /// Where allocations came from (traces with stacks), and the shim's notes.
    pub call_sites: CallSites,
}

/// An out-of-memory refusal the program recovered from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Relative ns.
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub device: Option<u32>,
    pub api: Option<Api>,
    pub requested_bytes: u64,
    /// The cap refused it, not the device.
    pub cap_refused: bool,
    /// From the refusal to the thread's next allocation on the device.
    pub recovered_after_ns: u64,
    /// The request's call site (an index into [`Analysis::call_sites`]`.sites`), when it had one.
    pub site: Option<usize>,
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
    /// The replay's slot for it, to name it at the end from its hello wherever in the file that was.
    pub(crate) slot: usize,
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

/// What the replay knew when it reached an out-of-memory record. Device figures are for the event's device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomSnapshot {
    /// Relative ns.
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub device: Option<u32>,
    /// The request was for memory on the host (`cuMemCreate` with a host location), not on a GPU: the device
    /// figures below are `None`.
    pub on_host: bool,
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
    /// What kept the failing process's tensors alive at the error (the bridge's walk, from PyTorch's observer).
    pub holders: Option<holders::Holders>,
    /// The failing process counted enough of its own steps to say whether it grew (then a graph kept across
    /// iterations is not read as a growth by itself: gradient accumulation keeps one legitimately).
    pub steps_counted: bool,
    /// The process's steps each needed more than the last up to the error (PyTorch's peak rising at their
    /// boundaries), whatever they kept.
    pub step_need: Option<StepNeed>,
    /// Failed driver requests of the same error folded into this one (the allocator's retry after flushing
    /// its cache).
    pub driver_ooms_folded: u32,
    /// The replay's number for it (a refusal found recovered later removes its snapshot by it).
    pub(crate) seq: u64,
}

impl OomSnapshot {
    /// The driver's growth up to the error, as evidence of memory kept. Not where this process's own steps were
    /// counted and their boundaries kept nothing (its framework floor did not rise): a rise the driver saw in it
    /// is then inside a step, its cache growing for that step's own need (a request longer than the others).
    /// Another process's rise still counts.
    pub fn driver_leak(&self) -> Option<&LeakTrend> {
        let steps_kept_nothing = self.steps_counted && self.framework_leak.is_none();
        self.leak
            .as_ref()
            .filter(|l| !(steps_kept_nothing && l.pid == Some(self.pid)))
    }
}

impl Analysis {
    /// The error the one screen shows whole: the one the largest batch was drawn for (`vramtrace oom` attaches it
    /// to the last error whose replay fails where the run did), else the last error of a process that did not exit
    /// 0 (a process gets past earlier ones: cuDNN's smaller workspace, a caught exception; the last is what ended
    /// it), else the first (the program got past every one: where its trouble began).
    pub fn main_error(&self) -> Option<usize> {
        let died = |pid: u32| self.process(pid).is_some_and(|p| !p.ended_cleanly());
        self.ooms
            .iter()
            .rposition(|s| s.framework.as_ref().is_some_and(|f| f.batch.is_some()))
            .or_else(|| self.ooms.iter().rposition(|s| died(s.pid)))
            .or(if self.ooms.is_empty() { None } else { Some(0) })
    }

    pub fn device(&self, device: u32) -> Option<&DeviceStats> {
        self.devices.iter().find(|d| d.device == Some(device))
    }

    /// Each device's index in `devices`, by (device, on the host): for a reporter that looks up every device
    /// (a trace can name a million: never a search of all of them for each).
    pub fn device_index(&self) -> crate::names::fasthash::FastMap<(Option<u32>, bool), usize> {
        let mut m = crate::names::fasthash::FastMap::default();
        for (i, d) in self.devices.iter().enumerate() {
            m.entry((d.device, d.on_host)).or_insert(i);
        }
        m
    }

    pub fn process(&self, pid: u32) -> Option<&ProcessStats> {
        self.processes.iter().find(|p| p.pid == pid)
    }

    /// Whether process `pid` ran a caching allocator the bridge saw (PyTorch): its driver allocations are
    /// segments of the cache, made by whichever request first needed one, not owned by the tensors in them.
    pub fn caching_allocator(&self, pid: u32) -> bool {
        self.processes.iter().any(|p| {
            p.pid == pid
                && p.framework
                    .iter()
                    .any(|f| f.framework == vramtrace_format::Framework::Torch)
        })
    }

    /// Out-of-memory records that got no snapshot.
    pub fn ooms_not_snapshotted(&self) -> u64 {
        self.oom_records.saturating_sub(self.ooms.len() as u64)
    }
}

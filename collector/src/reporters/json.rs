//! The documented JSON report (docs/JSON-SCHEMA.md, schema version [`SCHEMA_VERSION`]): typed structs, built
//! from the analysis, that serde writes in the schema's order ([`print`] lays them out). Sizes are integer
//! bytes, times integer ns relative to the trace start; `null` is "not known". The parts `oom --json` shares
//! are in [`shared`], [`trends`] and [`framework`].

pub mod framework;
pub mod holders;
pub mod print;
pub mod shared;
pub mod trends;

use serde::Serialize;

use self::framework::Bridge;
use self::shared::{cut_bytes, timeline, Bucket, CallSiteFields, Exit, Trace};
use self::trends::{refusals, Leak, Refusal};
use crate::model::{Analysis, DeviceStats, LiveAlloc, ProcessStats};

/// Bumped when a field changes meaning or goes away; new fields do not bump it.
pub const SCHEMA_VERSION: u64 = 1;

/// The report as pretty-printed JSON, ending with a newline.
pub fn render(a: &Analysis) -> String {
    let mut out = print::pretty(&Report::of(a));
    out.push('\n');
    out
}

/// The whole report.
#[derive(Serialize)]
pub struct Report<'a> {
    version: u64,
    trace: Trace<'a>,
    partial: bool,
    stopped: Option<&'a str>,
    frames: u64,
    unknown_frames: u64,
    bad_frames: u64,
    events: u64,
    dropped_events: u64,
    merge_inexact_events: u64,
    unmatched_frees: u64,
    implausible_devices: u64,
    lost_frees: u64,
    first_event_ns: Option<u64>,
    end_ns: u64,
    duration_ns: u64,
    live_at_end_count: u64,
    live_at_end_bytes: u64,
    oom_records: u64,
    refusals_recovered: u64,
    refusal_stall_ns: u64,
    refusals: Vec<Refusal>,
    devices: Vec<Device<'a>>,
    processes: Vec<Process<'a>>,
    bridge: Bridge<'a>,
    live_at_end: Vec<Live>,
    #[serde(flatten)]
    call_site_fields: CallSiteFields<'a>,
    /// With call sites only: indexes into `call_sites`, most bytes allocated first.
    #[serde(skip_serializing_if = "Option::is_none")]
    call_sites_by_allocated: Option<&'a [usize]>,
}

impl<'a> Report<'a> {
    pub fn of(a: &'a Analysis) -> Self {
        let cs = a.call_sites.present;
        Report {
            version: SCHEMA_VERSION,
            trace: Trace::of(a),
            partial: a.partial,
            stopped: a.stopped.as_deref(),
            frames: a.frames,
            unknown_frames: a.unknown_frames,
            bad_frames: a.bad_frames,
            events: a.events,
            dropped_events: a.dropped_events,
            merge_inexact_events: a.merge_inexact_events,
            unmatched_frees: a.unmatched_frees,
            implausible_devices: a.implausible_devices,
            lost_frees: a.lost_frees,
            first_event_ns: a.first_ns,
            end_ns: a.end_ns,
            duration_ns: a.duration_ns,
            live_at_end_count: a.live_at_end_count,
            live_at_end_bytes: a.live_at_end_bytes,
            oom_records: a.oom_records,
            refusals_recovered: a.refusals_recovered,
            refusal_stall_ns: a.refusal_stall_ns,
            refusals: refusals(a),
            devices: devices(a),
            processes: a.processes.iter().map(Process::of).collect(),
            bridge: Bridge::of(a),
            live_at_end: a.live_at_end.iter().map(|l| Live::of(l, cs)).collect(),
            call_site_fields: CallSiteFields::of(a),
            call_sites_by_allocated: cs.then_some(a.call_sites.by_allocated.as_slice()),
        }
    }
}

/// The devices of `a`, as the report lists them.
pub fn devices(a: &Analysis) -> Vec<Device<'_>> {
    a.devices.iter().map(|d| Device::of(a, d)).collect()
}

/// One device. `call_sites_at_peak` only where the trace has stacks.
#[derive(Serialize)]
pub struct Device<'a> {
    device: Option<u32>,
    on_host: bool,
    /// The trace's host: traces of several nodes merge (`report A B`), and a device is its host's.
    host: &'a str,
    /// The GPU as NVIDIA's tools name it (`GPU-...`), when the processes' drivers said and agreed.
    uuid: Option<&'a str>,
    peak_bytes: u64,
    /// Shifted onto the job's clock when several traces merge (verbs/fleet.rs).
    pub peak_time_ns: Option<u64>,
    live_bytes_at_end: u64,
    in_use_bytes_at_end: u64,
    allocations: u64,
    largest_allocation_bytes: u64,
    driver_total_bytes: Option<u64>,
    driver_free_bytes: Option<u64>,
    total_bytes: Option<u64>,
    cap_bytes: Option<u64>,
    headroom_bytes: Option<u64>,
    growth: Option<Leak<'a>>,
    timeline_bucket_ns: u64,
    timeline: Vec<Bucket>,
    framework: Option<framework::Device<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    call_sites_at_peak: Option<Option<AtPeak>>,
}

/// What was live at the device's peak, by call site.
#[derive(Serialize)]
struct AtPeak {
    sites: Vec<SiteBytes>,
    unlisted_bytes: u64,
    no_site_bytes: u64,
    tensor_lines: Vec<TensorLines>,
}

/// A PyTorch process's tensors at the peak, by line (`callsites::TensorLines`).
#[derive(Serialize)]
struct TensorLines {
    pid: u32,
    history_taken_at: String,
    lines: Vec<TensorLine>,
    unlisted_bytes: u64,
    no_line_bytes: u64,
    before_history_bytes: u64,
    allocated_bytes: u64,
    reserved_bytes: u64,
    outside_cache_bytes: u64,
}

#[derive(Serialize)]
struct TensorLine {
    line: String,
    bytes: u64,
    tensors: u64,
}

#[derive(Serialize)]
struct SiteBytes {
    call_site: usize,
    bytes: u64,
}

impl<'a> Device<'a> {
    fn of(a: &'a Analysis, d: &'a DeviceStats) -> Self {
        let cs = a.call_sites.present;
        Device {
            device: d.device,
            on_host: d.on_host,
            host: &a.header.hostname,
            uuid: d.uuid.as_deref(),
            peak_bytes: d.peak_bytes,
            peak_time_ns: d.peak_time_ns,
            live_bytes_at_end: d.live_bytes_at_end,
            in_use_bytes_at_end: d.in_use_bytes_at_end,
            allocations: d.allocations,
            largest_allocation_bytes: d.largest_allocation_bytes,
            driver_total_bytes: d.driver_total_bytes,
            driver_free_bytes: d.driver_free_bytes,
            total_bytes: d.total_bytes,
            cap_bytes: d.cap_bytes,
            headroom_bytes: d.headroom_bytes(),
            growth: d.growth.as_ref().map(|l| Leak::of(l, cs)),
            timeline_bucket_ns: d.timeline.bucket_ns,
            timeline: timeline(&d.timeline),
            framework: d.framework.as_ref().map(framework::Device::of),
            call_sites_at_peak: cs.then(|| {
                a.call_sites
                    .at_peak_of(d.device, d.on_host)
                    .map(|p| AtPeak {
                        sites: p
                            .sites
                            .iter()
                            .map(|b| SiteBytes {
                                call_site: b.site,
                                bytes: b.bytes,
                            })
                            .collect(),
                        unlisted_bytes: p.unlisted_bytes,
                        no_site_bytes: p.no_site_bytes,
                        tensor_lines: p
                            .tensor_lines
                            .iter()
                            .map(|t| TensorLines {
                                pid: t.pid,
                                history_taken_at: t.taken_at.clone(),
                                lines: t
                                    .lines
                                    .iter()
                                    .map(|l| TensorLine {
                                        line: l.line.clone(),
                                        bytes: l.bytes,
                                        tensors: l.tensors,
                                    })
                                    .collect(),
                                unlisted_bytes: t.unlisted_bytes,
                                no_line_bytes: t.no_line_bytes,
                                before_history_bytes: t.before_history_bytes,
                                allocated_bytes: t.allocated_bytes,
                                reserved_bytes: t.reserved_bytes,
                                outside_cache_bytes: p.outside_cache(t.pid),
                            })
                            .collect(),
                    })
            }),
        }
    }
}

/// One process.
#[derive(Serialize)]
pub struct Process<'a> {
    pid: u32,
    announced: bool,
    ppid: Option<u32>,
    cmdline: &'a [String],
    /// Always here in a trace's report (`Some`); several traces of one job leave out a `null` one and put
    /// their trace's host last instead (verbs/fleet.rs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<Option<&'a str>>,
    rank: Option<u32>,
    local_rank: Option<u32>,
    slurm_procid: Option<u32>,
    /// These three are shifted onto the job's clock when several traces merge (verbs/fleet.rs).
    pub start_ns: u64,
    pub end_ns: Option<u64>,
    ended: &'static str,
    exit: Option<Exit>,
    cut_bytes: Option<u64>,
    peak_bytes: u64,
    pub peak_time_ns: Option<u64>,
    per_device: Vec<ProcessDevice>,
    allocations: u64,
    frees: u64,
    failed_allocations: u64,
    oom_results: u64,
    cap_refusals: u64,
    unmatched_frees: u64,
    lost_frees: u64,
    largest_allocation_bytes: u64,
    live_bytes_at_end: u64,
    live_allocations_at_end: u64,
    dropped_events: u64,
    lost: Vec<Lost>,
    untraced: Option<&'a str>,
    context_freed_bytes: u64,
    address_reserved_peak_bytes: u64,
    mapped_peak_bytes: u64,
    python_bridge: bool,
    framework: Vec<framework::Process>,
}

#[derive(Serialize)]
struct ProcessDevice {
    device: Option<u32>,
    on_host: bool,
    peak_bytes: u64,
    live_bytes_at_end: u64,
    allocations: u64,
}

/// Records lost for one cause, and why.
#[derive(Serialize)]
struct Lost {
    cause: &'static str,
    records: u64,
    why: &'static str,
}

impl<'a> Process<'a> {
    pub fn of(p: &'a ProcessStats) -> Self {
        Process {
            pid: p.pid,
            announced: p.announced,
            ppid: p.ppid,
            cmdline: &p.cmdline,
            hostname: Some(p.hostname.as_deref()),
            rank: p.rank,
            local_rank: p.local_rank,
            slurm_procid: p.slurm_procid,
            start_ns: p.start_ns,
            end_ns: p.end_ns,
            ended: p.ended.key(),
            exit: Exit::of(p.exit),
            cut_bytes: cut_bytes(p),
            peak_bytes: p.peak_bytes,
            peak_time_ns: p.peak_time_ns,
            per_device: p
                .per_device
                .iter()
                .map(|d| ProcessDevice {
                    device: d.device,
                    on_host: d.on_host,
                    peak_bytes: d.peak_bytes,
                    live_bytes_at_end: d.live_bytes_at_end,
                    allocations: d.allocations,
                })
                .collect(),
            allocations: p.allocations,
            frees: p.frees,
            failed_allocations: p.failed_allocations,
            oom_results: p.oom_results,
            cap_refusals: p.cap_refusals,
            unmatched_frees: p.unmatched_frees,
            lost_frees: p.lost_frees,
            largest_allocation_bytes: p.largest_allocation_bytes,
            live_bytes_at_end: p.live_bytes_at_end,
            live_allocations_at_end: p.live_allocations_at_end,
            dropped_events: p.dropped_events,
            lost: p
                .lost
                .iter()
                .map(|&(cause, n)| Lost {
                    cause: cause.name(),
                    records: n,
                    why: cause.describe(),
                })
                .collect(),
            untraced: p.untraced.as_deref(),
            context_freed_bytes: p.context_freed_bytes,
            address_reserved_peak_bytes: p.address_reserved_peak_bytes,
            mapped_peak_bytes: p.mapped_peak_bytes,
            python_bridge: p.python_bridge,
            framework: framework::process(&p.framework),
        }
    }
}

/// An allocation live at the end. `call_site` only where the trace has stacks.
#[derive(Serialize)]
struct Live {
    pid: u32,
    device: Option<u32>,
    on_host: bool,
    api: &'static str,
    ptsz: bool,
    address: u64,
    bytes: u64,
    alloc_time_ns: u64,
    age_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    call_site: Option<Option<usize>>,
}

impl Live {
    fn of(l: &LiveAlloc, call_sites: bool) -> Self {
        Live {
            pid: l.pid,
            device: l.device,
            on_host: l.on_host,
            api: l.api.name(),
            ptsz: l.ptsz,
            address: l.address,
            bytes: l.bytes,
            alloc_time_ns: l.alloc_time_ns,
            age_ns: l.age_ns,
            call_site: call_sites.then_some(l.site),
        }
    }
}

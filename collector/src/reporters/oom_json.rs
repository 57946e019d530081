//! The documented JSON of `vramtrace oom --json` (docs/JSON-SCHEMA.md, "`vramtrace oom --json`", schema version
//! [`OOM_SCHEMA_VERSION`]). Same conventions as the report's JSON (reporters/json.rs), whose parts it shares:
//! integer bytes, integer ns relative to the trace start, `null` for "not known".

use serde::Serialize;

use crate::model::diagnose::{diagnose, Diagnosis, Finding};
use crate::model::framework::FrameworkOom;
use crate::model::{Analysis, DeviceStats, OomAlloc, OomSnapshot, ProcessStats};
use crate::reporters::json::framework::Kept;
use crate::reporters::json::print;
use crate::reporters::json::shared::{
    cut_bytes, site_label, timeline, Bucket, CallSiteFields, Exit, Trace,
};
use crate::reporters::json::trends::{refusals, Leak, Refusal};
use crate::reporters::oom_text::api_label;
use crate::reporters::prose;

/// Bumped when a field changes meaning or goes away; new fields do not bump it.
pub const OOM_SCHEMA_VERSION: u64 = 1;

/// The message when the trace holds no out-of-memory record.
pub const NO_OOM: &str = "no out-of-memory event was recorded";

/// Pretty-printed, ending with a newline.
pub fn render(a: &Analysis) -> String {
    let ds = diagnoses(a);
    let mut out = print::pretty(&Oom::of(a, &ds));
    out.push('\n');
    out
}

/// The diagnosis of each of `a`'s out-of-memory snapshots, which [`Oom::of`] reads.
pub fn diagnoses(a: &Analysis) -> Vec<Diagnosis> {
    a.ooms.iter().map(|s| diagnose(a, s)).collect()
}

/// The whole post-mortem.
#[derive(Serialize)]
pub struct Oom<'a> {
    version: u64,
    kind: &'static str,
    trace: Trace<'a>,
    partial: bool,
    stopped: Option<&'a str>,
    end_ns: u64,
    oom_recorded: bool,
    message: Option<&'static str>,
    oom_records: u64,
    refusals_recovered: u64,
    refusal_stall_ns: u64,
    refusals: Vec<Refusal>,
    oom_not_analysed: u64,
    oom_results: u64,
    ooms: Vec<Event<'a>>,
    processes: Vec<Process<'a>>,
    devices: Vec<Device<'a>>,
    #[serde(flatten)]
    call_site_fields: CallSiteFields<'a>,
}

impl<'a> Oom<'a> {
    /// `ds`: [`diagnoses`] of `a`.
    pub fn of(a: &'a Analysis, ds: &'a [Diagnosis]) -> Self {
        Oom {
            version: OOM_SCHEMA_VERSION,
            kind: "oom",
            trace: Trace::of(a),
            partial: a.partial,
            stopped: a.stopped.as_deref(),
            end_ns: a.end_ns,
            oom_recorded: a.oom_records > 0,
            message: (a.oom_records == 0).then_some(NO_OOM),
            oom_records: a.oom_records,
            refusals_recovered: a.refusals_recovered,
            refusal_stall_ns: a.refusal_stall_ns,
            refusals: refusals(a),
            oom_not_analysed: a.ooms_not_snapshotted(),
            oom_results: a.processes.iter().map(|p| p.oom_results).sum(),
            ooms: a
                .ooms
                .iter()
                .zip(ds)
                .map(|(s, d)| Event::of(a, s, d))
                .collect(),
            processes: a.processes.iter().map(Process::of).collect(),
            devices: a.devices.iter().map(|d| Device::of(a, d)).collect(),
            call_site_fields: CallSiteFields::of(a),
        }
    }
}

/// How a process ended and what it left.
#[derive(Serialize)]
struct Process<'a> {
    pid: u32,
    rank: Option<u32>,
    cmdline: &'a [String],
    ended: &'static str,
    exit: Option<Exit>,
    end_ns: Option<u64>,
    cut_bytes: Option<u64>,
    peak_bytes: u64,
    live_at_end_bytes: u64,
    live_at_end: Vec<LiveOn>,
    oom_results: u64,
    cap_refusals: u64,
}

/// Bytes live on one device.
#[derive(Serialize)]
struct LiveOn {
    device: Option<u32>,
    on_host: bool,
    bytes: u64,
}

impl<'a> Process<'a> {
    fn of(p: &'a ProcessStats) -> Self {
        Process {
            pid: p.pid,
            rank: p.rank,
            cmdline: &p.cmdline,
            ended: p.ended.key(),
            exit: Exit::of(p.exit),
            end_ns: p.end_ns,
            cut_bytes: cut_bytes(p),
            peak_bytes: p.peak_bytes,
            live_at_end_bytes: p.live_bytes_at_end,
            live_at_end: p
                .per_device
                .iter()
                .filter(|d| d.live_bytes_at_end > 0)
                .map(|d| LiveOn {
                    device: d.device,
                    on_host: d.on_host,
                    bytes: d.live_bytes_at_end,
                })
                .collect(),
            oom_results: p.oom_results,
            cap_refusals: p.cap_refusals,
        }
    }
}

/// A device's peak and what the job could have had.
#[derive(Serialize)]
struct Device<'a> {
    device: Option<u32>,
    on_host: bool,
    peak_bytes: u64,
    peak_time_ns: Option<u64>,
    total_bytes: Option<u64>,
    cap_bytes: Option<u64>,
    limit_bytes: Option<u64>,
    headroom_bytes: Option<u64>,
    live_bytes_at_end: u64,
    leak_trend: Option<Leak<'a>>,
}

impl<'a> Device<'a> {
    fn of(a: &Analysis, d: &'a DeviceStats) -> Self {
        Device {
            device: d.device,
            on_host: d.on_host,
            peak_bytes: d.peak_bytes,
            peak_time_ns: d.peak_time_ns,
            total_bytes: d.total_bytes,
            cap_bytes: d.cap_bytes,
            limit_bytes: d.limit_bytes(),
            headroom_bytes: d.headroom_bytes(),
            live_bytes_at_end: d.live_bytes_at_end,
            leak_trend: d.growth.as_ref().map(|l| Leak::of(l, a.call_sites.present)),
        }
    }
}

/// One out-of-memory error: what failed, the cause and its figures, what was live, findings and advice. The
/// call-site fields only where the trace has stacks.
#[derive(Serialize)]
struct Event<'a> {
    time_ns: u64,
    pid: u32,
    tid: u32,
    device: Option<u32>,
    on_host: bool,
    api: String,
    ptsz: bool,
    cap_refused: bool,
    requested_bytes: u64,
    result: u32,
    /// The failing request's own call site (an index into `call_sites`), and its one-line label.
    #[serde(skip_serializing_if = "Option::is_none")]
    request_call_site: Option<Option<usize>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_site: Option<Option<String>>,
    view: &'static str,
    framework: Option<Framework<'a>>,
    driver_ooms_folded: u32,
    cause: &'static str,
    cause_rule: &'static str,
    cause_reason: String,
    growth: Option<Leak<'a>>,
    growth_line: Option<GrowthLine<'a>>,
    /// What kept the process's tensors alive at the error (the bridge's walk), when it ran.
    holders: Option<crate::reporters::json::holders::HoldersJson<'a>>,
    device_free_bytes: Option<u64>,
    device_total_bytes: Option<u64>,
    cap_bytes: Option<u64>,
    job_live_bytes: u64,
    job_live_source: &'static str,
    job_live_trace_bytes: u64,
    ledger_job_bytes: Option<u64>,
    ledger_process_bytes: Option<u64>,
    shortfall_bytes: Option<u64>,
    outside_job_bytes: Option<u64>,
    context_estimate_bytes: u64,
    outside_excess_bytes: Option<u64>,
    job_processes_on_device: u64,
    async_freed_recent_bytes: u64,
    job_peak_bytes: u64,
    job_peak_time_ns: Option<u64>,
    needed_bytes: u64,
    available_bytes: Option<u64>,
    short_of_fitting_bytes: Option<u64>,
    suggested_cap_bytes: u64,
    dropped_events: u64,
    live_count: u64,
    processes: Vec<EventProcess<'a>>,
    top_live: Vec<TopLive>,
    size_classes: Vec<SizeClass>,
    timeline_bucket_ns: u64,
    timeline: Vec<Bucket>,
    findings: Vec<FindingJson<'a>>,
    advice: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    live_by_call_site: Option<Vec<SiteLive>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    live_by_call_site_unlisted_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    live_no_site_bytes: Option<u64>,
}

/// Where the growth came from.
#[derive(Serialize)]
struct GrowthLine<'a> {
    label: &'a str,
    source: &'static str,
    kind: &'static str,
    bytes: u64,
    count: u64,
    during_rise: bool,
}

/// A process of the job at the error.
#[derive(Serialize)]
struct EventProcess<'a> {
    pid: u32,
    rank: Option<u32>,
    cmdline: &'a [String],
    device_live_bytes: u64,
    on_device: bool,
    live: Vec<DeviceBytes>,
}

#[derive(Serialize)]
struct DeviceBytes {
    device: Option<u32>,
    bytes: u64,
}

/// One of the largest allocations live at the error.
#[derive(Serialize)]
struct TopLive {
    pid: u32,
    tid: u32,
    device: Option<u32>,
    api: &'static str,
    ptsz: bool,
    address: u64,
    bytes: u64,
    alloc_time_ns: u64,
    age_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    call_site: Option<Option<usize>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    site: Option<Option<String>>,
}

#[derive(Serialize)]
struct SizeClass {
    label: &'static str,
    min_bytes: u64,
    max_bytes: Option<u64>,
    count: u64,
    bytes: u64,
}

/// Live bytes of one call site.
#[derive(Serialize)]
struct SiteLive {
    call_site: usize,
    count: u64,
    bytes: u64,
}

impl<'a> Event<'a> {
    fn of(a: &'a Analysis, s: &'a OomSnapshot, d: &'a Diagnosis) -> Self {
        let cs = a.call_sites.present;
        Event {
            time_ns: s.time_ns,
            pid: s.pid,
            tid: s.tid,
            device: s.device,
            on_host: s.on_host,
            api: api_label(s.api, s.api_code, false),
            ptsz: s.ptsz,
            cap_refused: s.cap_refused,
            requested_bytes: s.requested_bytes,
            result: s.result,
            request_call_site: cs.then_some(s.request_site),
            request_site: cs.then(|| site_label(a, s.request_site)),
            view: d.view.key(),
            framework: Framework::of(s),
            driver_ooms_folded: s.driver_ooms_folded,
            cause: d.cause.key(),
            cause_rule: d.rule.key(),
            cause_reason: prose::reason(d),
            growth: d.growth.as_ref().map(|l| Leak::of(l, cs)),
            holders: s
                .holders
                .as_ref()
                .map(crate::reporters::json::holders::HoldersJson::of),
            growth_line: d.growth_line.as_ref().map(|g| GrowthLine {
                label: &g.label,
                source: g.source.key(),
                kind: g.kind.key(),
                bytes: g.bytes,
                count: g.count,
                during_rise: g.during_rise,
            }),
            device_free_bytes: s.device_free_bytes,
            device_total_bytes: s.device_total_bytes,
            cap_bytes: d.cap_bytes,
            job_live_bytes: d.job_live_bytes,
            job_live_source: d.job_live_source.key(),
            job_live_trace_bytes: s.job_live_trace_bytes,
            ledger_job_bytes: s.ledger_job_bytes,
            ledger_process_bytes: s.ledger_process_bytes,
            shortfall_bytes: d.shortfall_bytes,
            outside_job_bytes: d.outside_job_bytes,
            context_estimate_bytes: d.context_estimate_bytes,
            outside_excess_bytes: d.outside_excess_bytes,
            job_processes_on_device: s.job_processes_on_device,
            async_freed_recent_bytes: s.async_freed_recent_bytes,
            job_peak_bytes: s.job_peak_bytes,
            job_peak_time_ns: s.job_peak_time_ns,
            needed_bytes: d.needed_bytes,
            available_bytes: d.available_bytes,
            short_of_fitting_bytes: d.short_of_fitting_bytes,
            suggested_cap_bytes: d.suggested_cap_bytes,
            dropped_events: s.dropped_events,
            live_count: s.live_count,
            processes: s
                .processes
                .iter()
                .map(|p| EventProcess {
                    pid: p.pid,
                    rank: p.rank,
                    cmdline: &p.cmdline,
                    device_live_bytes: p.device_live_bytes,
                    on_device: p.on_device,
                    live: p
                        .per_device
                        .iter()
                        .map(|&(device, bytes)| DeviceBytes { device, bytes })
                        .collect(),
                })
                .collect(),
            top_live: s.top_live.iter().map(|l| TopLive::of(a, l)).collect(),
            size_classes: s
                .size_classes
                .iter()
                .map(|c| SizeClass {
                    label: c.label,
                    min_bytes: c.min_bytes,
                    max_bytes: c.max_bytes,
                    count: c.count,
                    bytes: c.bytes,
                })
                .collect(),
            timeline_bucket_ns: s.timeline.bucket_ns,
            timeline: timeline(&s.timeline),
            findings: d.findings.iter().map(|f| FindingJson::of(f, cs)).collect(),
            advice: prose::advice(d),
            live_by_call_site: cs.then(|| {
                s.by_site
                    .iter()
                    .map(|b| SiteLive {
                        call_site: b.site,
                        count: b.count,
                        bytes: b.bytes,
                    })
                    .collect()
            }),
            live_by_call_site_unlisted_bytes: cs.then_some(s.by_site_unlisted_bytes),
            live_no_site_bytes: cs.then_some(s.no_site_bytes),
        }
    }
}

impl TopLive {
    fn of(a: &Analysis, l: &OomAlloc) -> Self {
        let cs = a.call_sites.present;
        TopLive {
            pid: l.pid,
            tid: l.tid,
            device: l.device,
            api: l.api.name(),
            ptsz: l.ptsz,
            address: l.address,
            bytes: l.bytes,
            alloc_time_ns: l.alloc_time_ns,
            age_ns: l.age_ns,
            call_site: cs.then_some(l.site),
            site: cs.then(|| site_label(a, l.site)),
        }
    }
}

/// The framework's own record of the error: its observer's (`source: observer`), else the process's last sample
/// of its figures (`source: sample`); `null` without the Python bridge.
#[derive(Serialize)]
#[serde(tag = "source", rename_all = "lowercase")]
enum Framework<'a> {
    Sample {
        allocated_bytes: u64,
        reserved_bytes: u64,
        inactive_split_bytes: u64,
        alloc_retries: u64,
    },
    Observer(Box<Observer<'a>>),
}

#[derive(Serialize)]
struct Observer<'a> {
    framework: &'static str,
    thread: Option<&'a str>,
    requested_bytes: u64,
    allowed_or_total_bytes: Option<u64>,
    device_free_bytes: Option<u64>,
    allocated_bytes: u64,
    reserved_bytes: u64,
    active_bytes: u64,
    inactive_split_bytes: u64,
    requested_current_bytes: u64,
    alloc_retries: u64,
    num_ooms: u64,
    backend: Option<&'a str>,
    alloc_conf: Option<&'a str>,
    expandable_segments: Option<bool>,
    max_split_size_bytes: Option<u64>,
    segments: Option<u64>,
    largest_free_block_bytes: Option<u64>,
    free_in_live_segments_bytes: Option<u64>,
    snapshot: Option<&'a str>,
    /// What the snapshot it kept says, once read.
    #[serde(skip_serializing_if = "Option::is_none")]
    kept: Option<Vec<Kept<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    snapshot_error: Option<Option<&'a str>>,
    /// The largest batch, from a run beside it at another batch (`vramtrace oom`, docs/OOM.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    batch: Option<BatchJson<'a>>,
}

/// What a run beside this one at another value of a knob says (docs/JSON-SCHEMA.md, "batch").
#[derive(Serialize)]
struct BatchJson<'a> {
    knob: &'a str,
    value: u64,
    beside: Vec<BesideJson<'a>>,
    limit_bytes: u64,
    /// Why no value is advised (then every figure below is null).
    withheld: Option<&'a str>,
    largest: Option<u64>,
    next_refused_at: Option<&'a str>,
    better_conf: Option<&'a str>,
    better_largest: Option<u64>,
    accumulation_steps: Option<u64>,
    accumulation_value: Option<u64>,
    guessed_requests: Option<u64>,
    filled_from_step: Option<u64>,
    filled_from_kin: Option<u64>,
    filled_in_proportion: Option<u64>,
    own_requests: Option<u64>,
}

#[derive(Serialize)]
struct BesideJson<'a> {
    path: &'a str,
    value: u64,
}

impl<'a> BatchJson<'a> {
    fn of(b: &'a crate::model::BatchAdvice) -> Self {
        let f = b.outcome.as_ref().ok();
        BatchJson {
            knob: &b.knob,
            value: b.value,
            beside: b
                .beside
                .iter()
                .map(|(p, v)| BesideJson { path: p, value: *v })
                .collect(),
            limit_bytes: b.limit,
            withheld: b.outcome.as_ref().err().map(String::as_str),
            largest: f.and_then(|f| f.largest),
            next_refused_at: f.and_then(|f| f.next_refused_at.as_deref()),
            better_conf: f.and_then(|f| f.better.as_ref()).map(|x| x.0.as_str()),
            better_largest: f.and_then(|f| f.better.as_ref()).map(|x| x.1),
            accumulation_steps: f.and_then(|f| f.accumulate).map(|x| x.0),
            accumulation_value: f.and_then(|f| f.accumulate).map(|x| x.1),
            guessed_requests: f.map(|f| f.guessed),
            filled_from_step: f.map(|f| f.filled_from_step),
            filled_from_kin: f.map(|f| f.filled_from_kin),
            filled_in_proportion: f.map(|f| f.filled_in_proportion),
            own_requests: f.map(|f| f.own_requests),
        }
    }
}

impl<'a> Framework<'a> {
    fn of(s: &'a OomSnapshot) -> Option<Self> {
        let Some(o) = &s.framework else {
            return s.framework_figures.map(|f| Framework::Sample {
                allocated_bytes: f.allocated,
                reserved_bytes: f.reserved,
                inactive_split_bytes: f.inactive_split,
                alloc_retries: f.alloc_retries,
            });
        };
        Some(Framework::Observer(Box::new(Observer::of(o))))
    }
}

impl<'a> Observer<'a> {
    fn of(o: &'a FrameworkOom) -> Self {
        let f = o.figures;
        Observer {
            framework: o.framework.name(),
            thread: o.thread.as_deref(),
            requested_bytes: o.requested_bytes,
            allowed_or_total_bytes: o.allowed_or_total_bytes,
            device_free_bytes: o.device_free_bytes,
            allocated_bytes: f.allocated,
            reserved_bytes: f.reserved,
            active_bytes: f.active,
            inactive_split_bytes: f.inactive_split,
            requested_current_bytes: f.requested,
            alloc_retries: f.alloc_retries,
            num_ooms: f.ooms,
            backend: o.backend.as_deref(),
            alloc_conf: o.alloc_conf.as_deref(),
            expandable_segments: o.expandable_segments,
            max_split_size_bytes: o.max_split_size,
            segments: o.segments,
            largest_free_block_bytes: o.largest_free_block,
            free_in_live_segments_bytes: o.free_in_live_segments,
            snapshot: o.snapshot_path.as_deref(),
            kept: o.snapshot.as_ref().map(|r| Kept::list(&r.kept)),
            snapshot_error: o.snapshot.as_ref().map(|r| r.error.as_deref()),
            batch: o.batch.as_ref().map(BatchJson::of),
        }
    }
}

/// A finding: its `kind` and `text`, then its own figures.
#[derive(Serialize)]
struct FindingJson<'a> {
    kind: &'static str,
    text: String,
    #[serde(flatten)]
    figures: Figures<'a>,
}

/// A finding's own figures, by kind (docs/JSON-SCHEMA.md, "findings").
#[derive(Serialize)]
#[serde(untagged)]
enum Figures<'a> {
    Fit {
        needed_bytes: u64,
        available_bytes: u64,
        short_bytes: u64,
        limited_by: &'static str,
    },
    Growth(Leak<'a>),
    PoolCache {
        freed_bytes: u64,
        shortfall_bytes: Option<u64>,
    },
    LedgerDiffers {
        ledger_bytes: u64,
        trace_bytes: u64,
    },
    Count {
        count: u64,
    },
    None,
    Framework {
        allocated_bytes: u64,
        reserved_bytes: u64,
        inactive_split_bytes: u64,
        largest_free_block_bytes: Option<u64>,
        free_in_live_segments_bytes: Option<u64>,
        alloc_retries: u64,
        settings: String,
    },
    StepNeed {
        unit: &'static str,
        /// `rising`: the latest iterations each needed more; `outgrew`: the one at the error needed far more
        /// than any before it (`first_*`: the most before it; `last_peak_bytes`: what it held and asked).
        shape: &'static str,
        first_step: u64,
        first_peak_bytes: u64,
        last_step: u64,
        last_peak_bytes: u64,
    },
    Thread {
        thread: &'a str,
    },
    Ranks {
        pid: u32,
        rank: u32,
        bytes: u64,
        peers: u64,
        peers_median_bytes: u64,
        peers_max_bytes: u64,
    },
}

impl<'a> FindingJson<'a> {
    fn of(f: &'a Finding, call_sites: bool) -> Self {
        let figures = match f {
            &Finding::Fit {
                needed_bytes,
                available_bytes,
                short_bytes,
                limited_by,
            } => Figures::Fit {
                needed_bytes,
                available_bytes,
                short_bytes,
                limited_by,
            },
            Finding::LeakTrend(l) => Figures::Growth(Leak::of(l, call_sites)),
            // The framework's allocated bytes have no call sites of their own.
            Finding::AllocatedLeakTrend(l) => Figures::Growth(Leak::of(l, false)),
            &Finding::PoolCache {
                freed_bytes,
                shortfall_bytes,
            } => Figures::PoolCache {
                freed_bytes,
                shortfall_bytes,
            },
            &Finding::LedgerDiffers {
                ledger_bytes,
                trace_bytes,
            } => Figures::LedgerDiffers {
                ledger_bytes,
                trace_bytes,
            },
            &Finding::DroppedEvents { count } | &Finding::AllocRetries { count } => {
                Figures::Count { count }
            }
            Finding::NoDriverFigures => Figures::None,
            Finding::FrameworkFigures {
                allocated_bytes,
                reserved_bytes,
                inactive_split_bytes,
                largest_free_block_bytes,
                free_in_live_segments_bytes,
                alloc_retries,
                settings,
            } => Figures::Framework {
                allocated_bytes: *allocated_bytes,
                reserved_bytes: *reserved_bytes,
                inactive_split_bytes: *inactive_split_bytes,
                largest_free_block_bytes: *largest_free_block_bytes,
                free_in_live_segments_bytes: *free_in_live_segments_bytes,
                alloc_retries: *alloc_retries,
                settings: prose::settings(settings.as_ref()),
            },
            Finding::BackwardThread { thread } => Figures::Thread { thread },
            Finding::StepNeedRises(n) => Figures::StepNeed {
                unit: n.unit.key(),
                shape: if n.outgrew { "outgrew" } else { "rising" },
                first_step: n.first_step,
                first_peak_bytes: n.first_peak,
                last_step: n.last_step,
                last_peak_bytes: n.last_peak,
            },
            &Finding::RankAsymmetry {
                pid,
                rank,
                bytes,
                peers,
                peers_median_bytes,
                peers_max_bytes,
            } => Figures::Ranks {
                pid,
                rank,
                bytes,
                peers,
                peers_median_bytes,
                peers_max_bytes,
            },
        };
        FindingJson {
            kind: f.key(),
            text: prose::finding(f),
            figures,
        }
    }
}

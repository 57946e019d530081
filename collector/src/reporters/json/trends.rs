//! The JSON of what both `report --json` and `oom --json` show: the refusals a program recovered from, and a
//! growth's trend (docs/JSON-SCHEMA.md).

use serde::Serialize;

use crate::model::{Analysis, LeakTrend};

/// A refusal the program recovered from (docs/JSON-SCHEMA.md, "Refusals").
#[derive(Serialize)]
pub struct Refusal {
    time_ns: u64,
    pid: u32,
    tid: u32,
    device: Option<u32>,
    api: Option<&'static str>,
    requested_bytes: u64,
    cap_refused: bool,
    recovered_after_ns: u64,
    call_site: Option<usize>,
}

/// The refusals a program recovered from.
pub fn refusals(a: &Analysis) -> Vec<Refusal> {
    a.refusals
        .iter()
        .map(|r| Refusal {
            time_ns: r.time_ns,
            pid: r.pid,
            tid: r.tid,
            device: r.device,
            api: r.api.map(|x| x.name()),
            requested_bytes: r.requested_bytes,
            cap_refused: r.cap_refused,
            recovered_after_ns: r.recovered_after_ns,
            call_site: r.site,
        })
        .collect()
}

/// A growth's trend. `sites` and `more_sites` only where the trace has stacks.
#[derive(Serialize)]
pub struct Leak<'a> {
    minima: Vec<Minimum>,
    rise_bytes: u64,
    steps: Option<u64>,
    /// What `steps` counts: `optimizer_steps`, `dataloader_batches` (the program's own, from the bridge),
    /// `driver_cycles` (one process's rises between its frees) or `time_windows` (the timeline's cycles).
    unit: &'static str,
    /// `rise_bytes / steps`: what a step kept.
    per_step_bytes: Option<u64>,
    /// The process whose floor grew, when it was read per process.
    pid: Option<u32>,
    groups: Vec<Group>,
    more_groups: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    sites: Option<Vec<LeakSite<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    more_sites: Option<u64>,
}

#[derive(Serialize)]
struct Minimum {
    t_ns: u64,
    bytes: u64,
}

#[derive(Serialize)]
struct Group {
    api: &'static str,
    bytes_each: u64,
    count: u64,
    bytes: u64,
}

#[derive(Serialize)]
struct LeakSite<'a> {
    call_site: usize,
    label: &'a str,
    count: u64,
    bytes: u64,
}

impl<'a> Leak<'a> {
    /// `call_sites`: the trace has stacks (the trend's `sites` are listed).
    pub fn of(l: &'a LeakTrend, call_sites: bool) -> Self {
        Leak {
            minima: l
                .minima
                .iter()
                .map(|m| Minimum {
                    t_ns: m.t_ns,
                    bytes: m.bytes,
                })
                .collect(),
            rise_bytes: l.rise_bytes,
            steps: l.steps,
            unit: l.unit.key(),
            per_step_bytes: l.steps.filter(|&n| n > 0).map(|n| l.rise_bytes / n),
            pid: l.pid,
            groups: l
                .groups
                .iter()
                .map(|g| Group {
                    api: g.api.name(),
                    bytes_each: g.bytes_each,
                    count: g.count,
                    bytes: g.bytes,
                })
                .collect(),
            more_groups: l.more_groups,
            sites: call_sites.then(|| {
                l.sites
                    .iter()
                    .map(|g| LeakSite {
                        call_site: g.site,
                        label: &g.label,
                        count: g.count,
                        bytes: g.bytes,
                    })
                    .collect()
            }),
            more_sites: call_sites.then_some(l.more_sites),
        }
    }
}

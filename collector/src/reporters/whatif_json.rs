//! `vramtrace whatif --json` (docs/JSON-SCHEMA.md, "whatif"): one object per trace, sizes in bytes, times in ns
//! from the trace's start, `null` for "not known" or "not asked".

use serde::Serialize;

use super::json::print;
use crate::whatif::answer::WhatIf;
use crate::whatif::answered::Answered;
use crate::whatif::sim::Failure;

pub const SCHEMA_VERSION: u64 = 1;

#[derive(Serialize)]
struct Doc<'a> {
    version: u64,
    traces: Vec<Trace<'a>>,
}

#[derive(Serialize)]
pub(crate) struct DeviceBytes {
    device: u32,
    bytes: u64,
}

#[derive(Serialize)]
struct Trace<'a> {
    path: String,
    /// No history: the driver-level peaks only.
    has_history: bool,
    driver_peaks: Vec<DeviceBytes>,
    run_cap: Vec<DeviceBytes>,
    limit: Option<LimitJ<'a>>,
    histories: Vec<HistoryJ<'a>>,
    without_history: &'a [u32],
    configs: Vec<ConfigJ<'a>>,
    best: Option<Best<'a>>,
    /// What must be read first (docs/WHATIF.md): `{kind ("growth" or "history_incomplete"), text}`; with one,
    /// `best` is null and no setting is said to fit.
    caveat: Option<CaveatJ>,
    notes: &'a [String],
}

#[derive(Serialize)]
struct CaveatJ {
    kind: &'static str,
    text: String,
    per_step_bytes: Option<u64>,
}

#[derive(Serialize)]
struct LimitJ<'a> {
    what: &'a str,
    devices: Vec<DeviceBytes>,
}

#[derive(Serialize)]
struct HistoryJ<'a> {
    pid: u32,
    device: u32,
    source: &'a str,
    taken_at: &'a str,
    entries: u64,
    complete: bool,
    start_ns: u64,
    assumed_live: u64,
    assumed_live_bytes: u64,
    recorded_conf: String,
    recorded_reserved_peak: u64,
    modelled_reserved_peak: u64,
    outside_bytes: u64,
    notes: &'a [String],
}

#[derive(Serialize)]
struct ConfigJ<'a> {
    label: &'a str,
    conf: &'a str,
    as_run: bool,
    memory_fraction: Option<f64>,
    approximate: bool,
    peak: u64,
    smallest_cap: u64,
    /// True only where `verdict` is `fits`: the rows and the caveat say one thing.
    fits: Option<bool>,
    verdict: Option<&'static str>,
    devices: Vec<DeviceJ>,
    processes: Vec<ProcessJ>,
    first_failure: Option<FailureJ<'a>>,
    passes_run_ooms: u64,
}

#[derive(Serialize)]
struct DeviceJ {
    device: u32,
    peak: u64,
    allocated_peak: u64,
    smallest_cap: u64,
    fits: Option<bool>,
}

#[derive(Serialize)]
struct ProcessJ {
    pid: u32,
    device: u32,
    reserved_peak: u64,
    retries: u64,
    failures: u64,
}

#[derive(Serialize)]
struct FailureJ<'a> {
    pid: u32,
    device: u32,
    time_ns: u64,
    time_unix_us: u64,
    size: u64,
    site: Option<&'a str>,
    job_bytes: u64,
    the_runs_own: bool,
}

#[derive(Serialize)]
struct Best<'a> {
    label: &'a str,
    conf: &'a str,
    smallest_cap: u64,
    saves_bytes: u64,
    /// Its row's verdict under the limit (`fits`, or `serves_history` where the history ends at the error:
    /// what came after is not known); null without a limit.
    verdict: Option<&'static str>,
}

pub(crate) fn per_device(m: &std::collections::BTreeMap<u32, u64>) -> Vec<DeviceBytes> {
    m.iter()
        .map(|(&device, &bytes)| DeviceBytes { device, bytes })
        .collect()
}

fn failure<'a>(w: &'a WhatIf, f: &Failure, start_us: u64) -> FailureJ<'a> {
    let h = &w.histories[f.history];
    FailureJ {
        pid: h.pid,
        device: h.device,
        time_ns: f.t_us.saturating_sub(start_us) * 1_000,
        time_unix_us: f.t_us,
        size: f.size,
        site: h.site(f.site),
        job_bytes: f.job_bytes,
        the_runs_own: f.the_runs_own,
    }
}

fn trace(a: &Answered) -> Trace<'_> {
    let l = &a.loaded;
    let start = l.start_unix_us;
    let mut t = Trace {
        path: a.file.display().to_string(),
        has_history: a.whatif.is_some(),
        driver_peaks: per_device(&l.driver_peak),
        run_cap: per_device(&l.run_cap),
        limit: None,
        histories: Vec::new(),
        without_history: &l.without_history,
        configs: Vec::new(),
        best: None,
        caveat: None,
        notes: &l.notes,
    };
    let Some(w) = &a.whatif else {
        return t;
    };
    t.limit = w.limit.as_ref().map(|x| LimitJ {
        what: &x.what,
        devices: per_device(&x.bytes),
    });
    t.histories = w
        .histories
        .iter()
        .zip(&w.checks)
        .zip(&w.outside)
        .map(|((h, c), &outside)| HistoryJ {
            pid: h.pid,
            device: h.device,
            source: &h.source,
            taken_at: &h.taken_at,
            entries: h.entries.len() as u64,
            complete: h.complete(),
            start_ns: h.start_us().saturating_sub(start) * 1_000,
            assumed_live: h.assumed_live,
            assumed_live_bytes: h.assumed_live_bytes,
            recorded_conf: h.recorded.conf(),
            recorded_reserved_peak: c.recorded_peak,
            modelled_reserved_peak: c.modelled_peak,
            outside_bytes: outside,
            notes: &h.notes,
        })
        .collect();
    let caveat = crate::whatif::caveat::caveat(w, &a.loaded);
    t.configs = w
        .configs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            (
                i,
                c,
                crate::whatif::caveat::verdict(w, &a.loaded, caveat.as_ref(), i),
            )
        })
        .map(|(i, c, v)| ConfigJ {
            label: &c.label,
            conf: &c.conf,
            as_run: c.settings.is_none(),
            memory_fraction: c.settings.as_ref().and_then(|s| s.memory_fraction),
            approximate: c.approximate,
            peak: w.peak(i),
            smallest_cap: w.needs(i),
            fits: v.map(|v| v.fits()),
            verdict: v.map(|v| v.key()),
            devices: c
                .devices
                .iter()
                .map(|d| DeviceJ {
                    device: d.device,
                    peak: d.peak,
                    allocated_peak: d.allocated_peak,
                    smallest_cap: d.smallest_limit,
                    fits: d.fits,
                })
                .collect(),
            processes: c
                .processes
                .iter()
                .zip(&w.histories)
                .map(|(p, h)| ProcessJ {
                    pid: h.pid,
                    device: h.device,
                    reserved_peak: p.reserved_peak,
                    retries: p.retries,
                    failures: p.failures,
                })
                .collect(),
            first_failure: c.first_failure.as_ref().map(|f| failure(w, f, start)),
            passes_run_ooms: c.passes_run_ooms,
        })
        .collect();
    t.caveat = caveat.as_ref().map(|c| CaveatJ {
        kind: c.key(),
        text: c.text(),
        per_step_bytes: match c {
            crate::whatif::caveat::Caveat::Growth(g) => g.per_step_bytes,
            _ => None,
        },
    });
    t.best = w.best.filter(|_| caveat.is_none()).map(|b| Best {
        label: &w.configs[b].label,
        conf: &w.configs[b].conf,
        smallest_cap: w.needs(b),
        saves_bytes: w.needs(0).saturating_sub(w.needs(b)),
        verdict: crate::whatif::caveat::verdict(w, &a.loaded, caveat.as_ref(), b).map(|v| v.key()),
    });
    t
}

pub fn render(answered: &[Answered]) -> String {
    let doc = Doc {
        version: SCHEMA_VERSION,
        traces: answered.iter().map(trace).collect(),
    };
    let mut out = print::pretty(&doc);
    out.push('\n');
    out
}

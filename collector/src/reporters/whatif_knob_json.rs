//! `vramtrace whatif --knob NAME ... --json` (docs/JSON-SCHEMA.md, "whatif --knob"): the runs matched, the fits,
//! and per configuration the peaks at the values asked and the largest value that fits the limit. Sizes in
//! bytes; `null` for "not known" or "not asked".

use serde::Serialize;

use super::json::print;
use super::whatif_json::{per_device, DeviceBytes};
use crate::whatif::batch::answer::{AtAnswer, Beyond, Largest, Peaks};
use crate::whatif::batch::answered::KnobAnswered;
use crate::whatif::sim::Failure;

pub const SCHEMA_VERSION: u64 = 1;

#[derive(Serialize)]
struct Doc<'a> {
    version: u64,
    knob: &'a str,
    runs: Vec<RunJ>,
    fits: Vec<FitJ>,
    limit: Option<LimitJ<'a>>,
    configs: Vec<ConfigJ<'a>>,
    best: Option<BestJ<'a>>,
    address_spread: Option<SpreadJ>,
    notes: &'a [String],
}

/// Each run replayed with another's segment addresses: how far its reserve moved (percent of its own).
#[derive(Serialize)]
struct SpreadJ {
    low_pct: f64,
    high_pct: f64,
    pairs: u32,
}

#[derive(Serialize)]
struct RunJ {
    path: String,
    value: u64,
    histories: Vec<HistoryJ>,
}

#[derive(Serialize)]
struct HistoryJ {
    pid: u32,
    device: u32,
    requests: u64,
    setup_requests: u64,
    step_requests: u64,
    steps: u64,
    /// The requests this run made that the others did not (its code path's own: kernels chosen by size), and
    /// what they asked; 0 where every run asked the same lines.
    own_requests: u64,
    own_bytes: u64,
    /// Where the runs' code paths differ (in the first run only): the lines asked a different number of times,
    /// with their count per run.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    lines_differing: Vec<LineCountsJ>,
    /// The run that ran out of memory: the requests it made (the refused one last), and how the rest were sized.
    #[serde(skip_serializing_if = "Option::is_none")]
    failed: Option<FailedJ>,
}

#[derive(Serialize)]
struct LineCountsJ {
    line: String,
    counts: Vec<u64>,
}

#[derive(Serialize)]
struct FailedJ {
    requests_made: u64,
    filled_from_step: u64,
    filled_from_kin: u64,
    filled_in_proportion: u64,
}

#[derive(Serialize)]
struct FitJ {
    shape: &'static str,
    requests: u64,
    bytes_asked_in_largest_run: u64,
    ambiguous: u64,
}

#[derive(Serialize)]
struct LimitJ<'a> {
    what: &'a str,
    devices: Vec<DeviceBytes>,
}

#[derive(Serialize)]
struct OutsideJ {
    side: &'static str,
    by: u64,
    far: bool,
}

#[derive(Serialize)]
struct PeaksJ {
    peak: u64,
    allocated_peak: u64,
    reserved_peaks: Vec<u64>,
    allocated_peaks: Vec<u64>,
}

#[derive(Serialize)]
struct AtJ {
    value: u64,
    outside_runs: Option<OutsideJ>,
    predicted: PeaksJ,
    alternative: Option<PeaksJ>,
    fits: Option<bool>,
    first_failure: Option<FailureJ>,
    clamped_requests: u64,
}

#[derive(Serialize)]
struct FailureJ {
    pid: u32,
    device: u32,
    size: u64,
    site: String,
    place: String,
    job_bytes: u64,
}

#[derive(Serialize)]
struct LargestJ {
    value: Option<u64>,
    outside_runs: Option<OutsideJ>,
    at_least: bool,
    next_failure: Option<FailureJ>,
    alternative_value: Option<Option<u64>>,
    refused_below: Vec<u64>,
    replays: u32,
}

#[derive(Serialize)]
struct ConfigJ<'a> {
    label: &'a str,
    conf: &'a str,
    as_run: bool,
    approximate: bool,
    at: Vec<AtJ>,
    largest: Option<LargestJ>,
}

#[derive(Serialize)]
struct BestJ<'a> {
    label: &'a str,
    conf: &'a str,
    value: Option<u64>,
}

fn outside(values: &[u64], b: Beyond) -> Option<OutsideJ> {
    let (side, by) = match b {
        Beyond::Inside => return None,
        Beyond::Below(by) => ("below", by),
        Beyond::Above(by) => ("above", by),
    };
    Some(OutsideJ {
        side,
        by,
        far: b.far(values),
    })
}

fn peaks(p: &Peaks) -> PeaksJ {
    PeaksJ {
        peak: p.peak,
        allocated_peak: p.allocated_peak,
        reserved_peaks: p.reserved.clone(),
        allocated_peaks: p.allocated.clone(),
    }
}

fn failure(a: &KnobAnswered, value: u64, f: &Failure) -> FailureJ {
    let (pid, device, site, place) = a.job.place(value, f);
    FailureJ {
        pid,
        device,
        size: f.size,
        site,
        place,
        job_bytes: f.job_bytes,
    }
}

fn at(a: &KnobAnswered, x: &AtAnswer) -> AtJ {
    AtJ {
        value: x.value,
        outside_runs: outside(&a.job.aligned.values, x.beyond),
        predicted: peaks(&x.fitted),
        alternative: x.alternative.as_ref().map(peaks),
        fits: x.fits,
        first_failure: x.first_failure.as_ref().map(|f| failure(a, x.value, f)),
        clamped_requests: x.clamped,
    }
}

fn largest(a: &KnobAnswered, l: &Largest) -> LargestJ {
    let values = &a.job.aligned.values;
    LargestJ {
        value: l.value,
        outside_runs: l.beyond(values).and_then(|b| outside(values, b)),
        at_least: l.at_least,
        next_failure: l
            .next_failure
            .as_ref()
            .map(|f| failure(a, l.value.map_or(1, |v| v + 1), f)),
        alternative_value: l.alternative,
        refused_below: l.refused_below.clone(),
        replays: l.replays,
    }
}

pub fn render(a: &KnobAnswered) -> String {
    let mut out = print::pretty(&doc(a));
    out.push('\n');
    out
}

/// The document as a value, for `fit --json`, which carries it whole.
pub fn value(a: &KnobAnswered) -> serde_json::Value {
    serde_json::to_value(doc(a)).unwrap_or(serde_json::Value::Null)
}

fn doc(a: &KnobAnswered) -> Doc<'_> {
    let j = &a.job.aligned;
    let w = &a.answer;
    Doc {
        version: SCHEMA_VERSION,
        knob: &a.knob,
        runs: j
            .runs
            .iter()
            .enumerate()
            .map(|(r, run)| RunJ {
                path: run.label.clone(),
                value: run.value,
                histories: run
                    .histories
                    .iter()
                    .zip(&j.slots)
                    .map(|(h, s)| HistoryJ {
                        pid: h.pid,
                        device: h.device,
                        requests: s.requests() as u64,
                        setup_requests: s.steps[r].setup as u64,
                        step_requests: s.steps[r].period as u64,
                        steps: s.steps[r].count as u64,
                        own_requests: s.own[r].len() as u64,
                        own_bytes: s.own_bytes(r, h),
                        lines_differing: s
                            .paths
                            .iter()
                            .filter(|_| r == 0)
                            .flat_map(|m| &m.lines)
                            .map(|(line, counts)| LineCountsJ {
                                line: line.clone(),
                                counts: counts.clone(),
                            })
                            .collect(),
                        failed: (j.failed == Some(r)).then(|| FailedJ {
                            requests_made: s.at[r].len() as u64,
                            filled_from_step: s.filled.from_step,
                            filled_from_kin: s.filled.from_kin,
                            filled_in_proportion: s.filled.in_proportion,
                        }),
                    })
                    .collect(),
            })
            .collect(),
        fits: w
            .shapes
            .iter()
            .map(|c| FitJ {
                shape: c.shape.name(),
                requests: c.requests,
                bytes_asked_in_largest_run: c.bytes,
                ambiguous: c.ambiguous,
            })
            .collect(),
        limit: w.limit.as_ref().map(|l| LimitJ {
            what: &l.what,
            devices: per_device(&l.bytes),
        }),
        configs: w
            .configs
            .iter()
            .map(|c| ConfigJ {
                label: &c.label,
                conf: &c.conf,
                as_run: c.settings.is_none(),
                approximate: c.approximate,
                at: c.at.iter().map(|x| at(a, x)).collect(),
                largest: c.largest.as_ref().map(|l| largest(a, l)),
            })
            .collect(),
        best: w.best.map(|b| {
            let c = &w.configs[b];
            BestJ {
                label: &c.label,
                conf: &c.conf,
                value: c.largest.as_ref().and_then(|l| l.value),
            }
        }),
        address_spread: a.addresses.map(|s| SpreadJ {
            low_pct: (s.low * 1e4).round() / 100.0,
            high_pct: (s.high * 1e4).round() / 100.0,
            pairs: s.pairs,
        }),
        notes: &a.notes,
    }
}

//! `vramtrace fit --json` (docs/JSON-SCHEMA.md, "fit"): the answer as run and per setting, the runs made and why,
//! the accumulation, the verification, and the knob's what-if document whole (`whatif`).

use serde::Serialize;

use super::json::print;
use crate::fit::runs::Ending;
use crate::fit::{as_run, Fitted};
use crate::names::units::shown_path;

pub const SCHEMA_VERSION: u64 = 1;

#[derive(Serialize)]
struct Doc<'a> {
    version: u64,
    knob: &'a str,
    command: String,
    dir: String,
    steps: u64,
    seconds: f64,
    runs: Vec<RunJ>,
    used: &'a [u64],
    limit: Option<LimitJ<'a>>,
    largest: Option<LargestJ>,
    settings: Vec<SettingJ<'a>>,
    accumulation: Option<AccJ>,
    verify: Vec<VerifyJ>,
    verified: Option<VerifiedJ>,
    notes: Vec<&'a str>,
    whatif: serde_json::Value,
}

#[derive(Serialize)]
struct RunJ {
    value: u64,
    role: &'static str,
    trace: String,
    ending: &'static str,
    exit_code: Option<i32>,
    steps: u64,
    seconds: f64,
    caught_out_of_memory: u64,
}

#[derive(Serialize)]
struct LimitJ<'a> {
    what: &'a str,
    /// `whatif`'s flags for it.
    flags: &'a [String],
    devices: Vec<super::whatif_json::DeviceBytes>,
}

#[derive(Serialize)]
struct LargestJ {
    value: Option<u64>,
    at_least: bool,
    /// The least and most the alternative fits allow (equal when no fit is ambiguous).
    range: Option<[u64; 2]>,
    /// The first request refused one value up (at 1 when nothing fits).
    next_failure: Option<FailJ>,
}

#[derive(Serialize)]
struct FailJ {
    value: u64,
    size: u64,
    site: String,
    place: String,
    pid: u32,
    device: u32,
}

#[derive(Serialize)]
struct SettingJ<'a> {
    label: &'a str,
    conf: &'a str,
    as_run: bool,
    approximate: bool,
    largest: Option<u64>,
    at_least: bool,
}

#[derive(Serialize)]
struct AccJ {
    target: u64,
    steps: u64,
    micro: u64,
}

#[derive(Serialize)]
struct VerifiedJ {
    fits: Option<u64>,
    fails: Option<u64>,
    largest: Option<u64>,
}

#[derive(Serialize)]
struct VerifyJ {
    value: u64,
    fitted: bool,
    predicted: bool,
    trace: String,
}

fn ending(e: &Ending) -> (&'static str, Option<i32>) {
    match e {
        Ending::Stopped => ("stopped", None),
        Ending::Finished => ("finished", None),
        Ending::OutOfMemory => ("out_of_memory", None),
        Ending::Failed(c) => ("failed", Some(*c)),
        Ending::Bound { .. } => ("bound", None),
    }
}

pub fn render(f: &Fitted) -> String {
    let a = &f.answered;
    let doc = Doc {
        version: SCHEMA_VERSION,
        knob: &f.knob,
        command: f.template.shown(),
        dir: shown_path(&f.dir),
        steps: f.steps,
        seconds: (f.seconds * 1000.0).round() / 1000.0,
        runs: f
            .runs
            .iter()
            .map(|r| {
                let (ending, exit_code) = ending(&r.ran.ending);
                RunJ {
                    value: r.ran.value,
                    role: r.role.name(),
                    trace: shown_path(&r.ran.trace),
                    ending,
                    exit_code,
                    steps: r.ran.steps,
                    seconds: (r.ran.seconds * 1000.0).round() / 1000.0,
                    caught_out_of_memory: r.ran.caught_ooms,
                }
            })
            .collect(),
        used: &f.used,
        limit: a.answer.limit.as_ref().map(|l| LimitJ {
            what: &f.limit_label,
            flags: &f.limit_flags,
            devices: super::whatif_json::per_device(&l.bytes),
        }),
        largest: as_run(a).map(|l| LargestJ {
            value: l.value,
            at_least: l.at_least,
            range: l.value.map(|v| {
                let alt = l.alternative.map_or(v, |x| x.unwrap_or(0));
                [v.min(alt), v.max(alt)]
            }),
            next_failure: l.next_failure.as_ref().map(|x| {
                let value = l.value.map_or(1, |v| v + 1);
                let (pid, device, site, place) = a.job.place(value, x);
                FailJ {
                    value,
                    size: x.size,
                    site,
                    place,
                    pid,
                    device,
                }
            }),
        }),
        settings: a
            .answer
            .configs
            .iter()
            .map(|c| SettingJ {
                label: &c.label,
                conf: &c.conf,
                as_run: c.settings.is_none(),
                approximate: c.approximate,
                largest: c.largest.as_ref().and_then(|l| l.value),
                at_least: c.largest.as_ref().is_some_and(|l| l.at_least),
            })
            .collect(),
        accumulation: f.accumulation.map(|x| AccJ {
            target: x.target,
            steps: x.steps,
            micro: x.micro,
        }),
        verify: f
            .verify
            .iter()
            .map(|v| VerifyJ {
                value: v.value,
                fitted: v.fitted,
                predicted: v.predicted,
                trace: shown_path(&v.trace),
            })
            .collect(),
        verified: f.verified.map(|b| VerifiedJ {
            fits: b.fits,
            fails: b.fails,
            largest: b.pinned(),
        }),
        notes: f.story.iter().map(String::as_str).collect(),
        whatif: crate::reporters::whatif_knob_json::value(a),
    };
    let mut out = print::pretty(&doc);
    out.push('\n');
    out
}

//! The histories of a traced job: for each process, the best snapshot the bridge kept beside the trace (the one
//! at exit has the whole ring; else its latest out-of-memory one), and from the trace itself what the what-if
//! needs around them: each device's memory, the run's cap, and what each process held outside PyTorch.

use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;

use super::history::{from_snapshot, History};
use crate::inputs::pickle::Doc;
use crate::inputs::torch_snapshot;
use crate::model::Analysis;

/// What a trace gives the what-if.
#[derive(Debug, Default)]
pub struct Loaded {
    pub histories: Vec<History>,
    /// Per history: bytes its process held on the device outside PyTorch's allocator, at most (its driver-level
    /// peak less PyTorch's own reserve peak; an upper bound).
    pub outside: Vec<u64>,
    pub device_total: BTreeMap<u32, u64>,
    /// The cap the run had, per device.
    pub run_cap: BTreeMap<u32, u64>,
    /// Per device, the job's driver-level peak (the fallback answer when there is no history).
    pub driver_peak: BTreeMap<u32, u64>,
    /// Processes that allocated on a GPU with no history to replay; per device, what they held at most.
    pub without_history: Vec<u32>,
    pub others: BTreeMap<u32, u64>,
    pub notes: Vec<String>,
    pub start_unix_us: u64,
    /// Per device, the out-of-memory errors the run raised there (refusals it recovered from are not).
    pub run_failed: BTreeMap<u32, u64>,
    /// The run's memory grew step after step (an error's cause, else a device's growth over the run): what a
    /// step kept and what a step is, when steps were counted.
    pub growth: Option<RunGrowth>,
}

/// The run's growth, as the what-if says it: no setting fits a job that keeps memory each step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunGrowth {
    pub rise_bytes: u64,
    /// `rise / steps` where steps were counted (the program's, or a process's cycles).
    pub per_step_bytes: Option<u64>,
    pub noun: &'static str,
}

/// The default device memory when the trace does not say (an 80 GiB card): only expandable segments' address
/// space and memory fractions depend on it.
pub const UNKNOWN_TOTAL: u64 = 80 << 30;

pub fn load(a: &Analysis, trace: &Path) -> Loaded {
    let mut l = Loaded {
        start_unix_us: a.header.start_unix_ns / 1_000,
        ..Loaded::default()
    };
    for d in &a.devices {
        let (Some(dev), false) = (d.device, d.on_host) else {
            continue;
        };
        if let Some(t) = d.total_bytes.or(d.driver_total_bytes) {
            l.device_total.insert(dev, t);
        }
        if let Some(c) = d.cap_bytes {
            l.run_cap.insert(dev, c);
        }
        l.driver_peak.insert(dev, d.peak_bytes);
    }
    for o in &a.ooms {
        if let Some(d) = o.device {
            *l.run_failed.entry(d).or_default() += 1;
        }
    }
    l.growth = run_growth(a);
    l.histories = histories(
        a,
        trace,
        &mut |p| Rc::new(torch_snapshot::load(p)),
        &mut l.notes,
    );
    for h in &mut l.histories {
        l.device_total.entry(h.device).or_insert(UNKNOWN_TOTAL);
    }
    for h in &l.histories {
        let driver = a
            .processes
            .iter()
            .find(|p| p.pid == h.pid)
            .and_then(|p| {
                p.per_device
                    .iter()
                    .find(|x| x.device == Some(h.device) && !x.on_host)
            })
            .map_or(0, |x| x.peak_bytes);
        l.outside
            .push(driver.saturating_sub(h.recorded_reserved_peak));
    }
    for p in &a.processes {
        let on_gpu = p.per_device.iter().any(|x| !x.on_host && x.peak_bytes > 0);
        if on_gpu && !l.histories.iter().any(|h| h.pid == p.pid) {
            l.without_history.push(p.pid);
            for x in p.per_device.iter().filter(|x| !x.on_host) {
                if let Some(d) = x.device {
                    let o = l.others.entry(d).or_default();
                    *o = o.saturating_add(x.peak_bytes);
                }
            }
        }
    }
    l
}

/// Each process's PyTorch history, from the best snapshot it kept beside the trace (the one at exit has the
/// whole ring; else its latest out-of-memory one); `loaded` reads a snapshot (callers that read them for other
/// figures too pass one that keeps it). Why a process's could not be read goes to `notes`.
pub fn histories(
    a: &Analysis,
    trace: &Path,
    loaded: &mut impl FnMut(&Path) -> Rc<Result<Doc, String>>,
    notes: &mut Vec<String>,
) -> Vec<History> {
    let mut tries: BTreeMap<u32, Vec<(String, &str)>> = BTreeMap::new();
    for (pid, p) in &a.bridge.exit_snapshots {
        tries.entry(*pid).or_default().push((p.clone(), "exit"));
    }
    for o in a.ooms.iter().rev() {
        if let Some(p) = o.framework.as_ref().and_then(|f| f.snapshot_path.as_ref()) {
            tries
                .entry(o.pid)
                .or_default()
                .push((p.clone(), "out of memory"));
        }
    }
    let mut out = Vec::new();
    for (pid, candidates) in &tries {
        let mut why = Vec::new();
        let mut got = false;
        for (recorded, at) in candidates {
            let Some(path) = torch_snapshot::locate(recorded, trace) else {
                why.push(format!("{recorded}: not found beside the trace"));
                continue;
            };
            match loaded(&path).as_ref() {
                Ok(v) => {
                    let hs = from_snapshot(v, *pid, &path.display().to_string(), at, notes);
                    got = !hs.is_empty();
                    out.extend(hs);
                    break;
                }
                Err(e) => why.push(format!("{}: {e}", path.display())),
            }
        }
        if !got && !why.is_empty() && why.len() == candidates.len() {
            notes.push(format!(
                "pid {pid}: no PyTorch history could be read ({})",
                why.join("; ")
            ));
        }
    }
    out
}

/// The run's growth: the cause of one of its errors, else the largest growth of a device over the run.
fn run_growth(a: &Analysis) -> Option<RunGrowth> {
    let of = |g: &crate::model::LeakTrend| RunGrowth {
        rise_bytes: g.rise_bytes,
        per_step_bytes: (g.unit != crate::model::GrowthUnit::Time)
            .then(|| g.steps.filter(|&n| n > 0).map(|n| g.rise_bytes / n))
            .flatten(),
        noun: g.unit.noun(),
    };
    let at_error = a
        .ooms
        .iter()
        .map(|s| crate::model::diagnose::diagnose(a, s))
        .filter(|d| d.cause == crate::model::diagnose::Cause::Growth)
        .filter_map(|d| d.growth.as_ref().map(of))
        .max_by_key(|g| g.rise_bytes);
    at_error.or_else(|| {
        a.devices
            .iter()
            .flat_map(|d| {
                [
                    d.growth.as_ref(),
                    d.framework.as_ref().and_then(|f| f.leak.as_ref()),
                ]
            })
            .flatten()
            .map(of)
            .max_by_key(|g| g.rise_bytes)
    })
}

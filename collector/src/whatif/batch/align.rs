//! Runs of one program at different values of a knob, matched request for request: the k-th request of a
//! process in one run is the k-th in another when every run asks from the same lines in the same order. Each
//! run's requests are also told apart into a setup and a repeating cycle (the steps), found from the lines
//! alone, so a difference can be placed ("before the steps repeat", "in repeat 3 of 24").

use std::collections::HashMap;
use std::fmt;

use super::fit::{eval, fit, in_proportion, Fit};
use super::paths;
pub use super::steps::{steps, Steps};
use crate::whatif::history::{History, Op, MAX_SIZE, NO_SITE};

/// One run: the knob's value and the histories of its processes (one per process and device).
#[derive(Clone, Debug)]
pub struct KnobRun {
    pub value: u64,
    /// Where it came from (the trace), for messages.
    pub label: String,
    pub histories: Vec<History>,
    /// The command it ran (empty: unknown). Runs whose commands differ beyond numbers are other programs: their
    /// lines must match one for one.
    pub command: Vec<String>,
}

/// One process's requests across the runs.
#[derive(Clone, Debug)]
pub struct Slot {
    /// Per run, the index in its history's entries of each request (in a run that failed, of those it made
    /// before its failure, then the failed one's).
    pub at: Vec<Vec<u32>>,
    /// Request `k`'s size in run `r`: `sizes[k * runs + r]`. In a run that failed, past what it asked the sizes
    /// are filled (`filled`).
    pub sizes: Vec<u64>,
    pub fits: Vec<Fit>,
    /// Per run (a run that failed has its reference run's).
    pub steps: Vec<Steps>,
    /// In a run that failed: how the requests past its failure were sized (from the same request of an earlier
    /// step, from a request it made of the same size in the reference run, or in proportion to the knob: an upper
    /// bound for a size that grows at most in proportion, constant, `c·x`, `a + b·x`; not for a square).
    pub filled: Filled,
    /// Per run, the entries of its own requests: those the other runs did not make, where the runs' code paths
    /// differ by a few ([`paths`]; kernels chosen by size). Empty where every run asked the same lines.
    pub own: Vec<Vec<u32>>,
    /// Where the runs' lines differ (then `at` holds the requests every run made).
    pub paths: Option<Mismatch>,
}

/// How the requests a failed run never made were sized ([`Slot::filled`], `fill`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Filled {
    pub from_step: u64,
    pub from_kin: u64,
    pub in_proportion: u64,
}

impl Slot {
    pub fn requests(&self) -> usize {
        self.fits.len()
    }

    /// What run `r`'s own requests asked (`h`: its history of this slot).
    pub fn own_bytes(&self, r: usize, h: &History) -> u64 {
        self.own[r]
            .iter()
            .filter_map(|&e| match h.entries.get(e as usize)?.op {
                Op::Alloc { size, .. } => Some(size),
                _ => None,
            })
            .fold(0u64, u64::saturating_add)
    }
}

/// The runs matched, sorted by the knob's value.
#[derive(Clone, Debug)]
pub struct Aligned {
    pub values: Vec<u64>,
    pub runs: Vec<KnobRun>,
    pub slots: Vec<Slot>,
    /// The run that ran out of memory (at most one), matched up to its failure.
    pub failed: Option<usize>,
}

impl Aligned {
    /// The run that finished nearest `value` (the larger on a tie): the template of a history synthesized there.
    pub fn nearest(&self, value: u64) -> usize {
        (0..self.values.len())
            .filter(|&r| Some(r) != self.failed)
            .min_by_key(|&r| {
                (
                    self.values[r].abs_diff(value),
                    std::cmp::Reverse(self.values[r]),
                )
            })
            .unwrap_or(0)
    }

    /// The run on the other side of `value` from run `t` nearest it (the one that failed too: its own requests
    /// before its failure are known), else the nearest other run: whose code path the alternative adds where the
    /// runs' paths differ. `None` where `t` ran at `value`.
    pub fn other(&self, value: u64, t: usize) -> Option<usize> {
        if self.values[t] == value {
            return None; // a run at the value: its path is the program's there
        }
        let side = |r: usize| (self.values[r] > value) != (self.values[t] > value);
        let by = |r: &usize| {
            (
                self.values[*r].abs_diff(value),
                std::cmp::Reverse(self.values[*r]),
            )
        };
        let rest = (0..self.values.len()).filter(|&r| r != t);
        rest.clone()
            .filter(|&r| side(r) && self.values[r] != value)
            .min_by_key(by)
            .or_else(|| rest.min_by_key(by))
    }

    /// The largest run that finished: the template for the settings as run.
    pub fn reference(&self) -> usize {
        (0..self.values.len())
            .rev()
            .find(|&r| Some(r) != self.failed)
            .unwrap_or(0)
    }
}

/// Where a history's first out-of-memory error is, if it has one.
pub fn failure(h: &History) -> Option<usize> {
    h.entries
        .iter()
        .position(|e| matches!(e.op, Op::Oom { .. }))
}

/// Why the runs cannot be extrapolated from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KnobError {
    /// Two or three runs are needed; this many were given.
    Runs(usize),
    /// Two runs at one value.
    SameValue(u64),
    /// A run with no history to match.
    NoHistory { value: u64 },
    /// The runs hold different numbers of processes' histories: (value, histories).
    Processes(Vec<(u64, usize)>),
    /// Slot `slot` (in device order) is on different GPUs in different runs: (value, device) per run.
    Devices {
        slot: usize,
        devices: Vec<(u64, u32)>,
    },
    /// A history that began after its process's first allocation (the ring wrapped): its setup is unknown.
    Incomplete { value: u64, pid: u32, device: u32 },
    /// More than one run ran out of memory: one is matched up to its failure, the others need a run that
    /// finished. (value, pid, device) of the second.
    Failed { value: u64, pid: u32, device: u32 },
    /// The runs asked from different lines or in a different order.
    Mismatch(Mismatch),
}

/// Where the runs' requests part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Of the first run (by value): which process.
    pub pid: u32,
    pub device: u32,
    /// Per run: (value, requests).
    pub requests: Vec<(u64, usize)>,
    /// The first request that differs: its index, where it falls in the first run, and each run's line there
    /// (`None`: the run had no more requests).
    pub first: Option<Diverge>,
    /// Lines asked a different number of times, most different first (at most [`MAX_LINES`]): the line and
    /// its count per run.
    pub lines: Vec<(String, Vec<u64>)>,
    /// The runs' commands differ in more than numbers (so no difference is taken for a kernel's choice).
    pub other_commands: bool,
}

/// The first request that differs: its index, where it falls in the first run, and per run (value, line).
pub type Diverge = (usize, String, Vec<(u64, Option<String>)>);

/// How many differing lines a mismatch names.
pub const MAX_LINES: usize = 10;

impl fmt::Display for KnobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KnobError::Runs(n) => write!(f, "give two or three runs (FILE=VALUE), not {n}"),
            KnobError::SameValue(v) => write!(f, "two runs at the same value {v}: give runs at different values"),
            KnobError::NoHistory { value } => write!(
                f,
                "the run at {value} has no PyTorch history: trace it with `vramtrace run --torch-history 4000000`"
            ),
            KnobError::Processes(v) => write!(
                f,
                "the runs hold different numbers of process histories ({}): run the same job",
                v.iter().map(|(x, n)| format!("{n} at {x}")).collect::<Vec<_>>().join(", ")
            ),
            KnobError::Devices { slot, devices } => write!(
                f,
                "the runs' process {} is on different GPUs ({}): run each on the same GPUs, so that the limit and \
                 the device's memory are the same in every run",
                slot + 1,
                devices
                    .iter()
                    .map(|(x, d)| format!("GPU {d} at {x}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            KnobError::Incomplete { value, pid, device } => write!(
                f,
                "the run at {value} (pid {pid} GPU {device}) kept only the end of its history: its setup is unknown; \
                 rerun with a larger --torch-history"
            ),
            KnobError::Failed { value, pid, device } => write!(
                f,
                "the run at {value} (pid {pid} GPU {device}) ran out of memory too: one run that failed is matched \
                 up to its failure, the others must have finished"
            ),
            KnobError::Mismatch(m) => m.fmt(f),
        }
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the runs take different code paths (pid {} GPU {}), so no size can be extrapolated: requests {}",
            self.pid,
            self.device,
            self.requests
                .iter()
                .map(|(x, n)| format!("{} at {x}", crate::names::units::count(*n as u64)))
                .collect::<Vec<_>>()
                .join(", ")
        )?;
        if let Some((k, place, sites)) = &self.first {
            write!(f, "; request {} ({place}) differs:", k + 1)?;
            for (x, s) in sites {
                write!(f, " at {x} {}", s.as_deref().unwrap_or("(none)"))?;
                f.write_str(";")?;
            }
        }
        if !self.lines.is_empty() {
            f.write_str(" lines asked a different number of times:")?;
            for (line, counts) in &self.lines {
                let c: Vec<String> = counts.iter().map(|c| c.to_string()).collect();
                write!(f, " {line} ({});", c.join(" / "))?;
            }
        }
        if self.other_commands {
            f.write_str(" and the runs' commands differ in more than a number: other programs")?;
        }
        Ok(())
    }
}

impl std::error::Error for KnobError {}

/// The label of a request's line.
pub fn site_label(h: &History, site: u32) -> String {
    if site == NO_SITE {
        return "(no Python frame: autograd's backward thread)".to_string();
    }
    h.site(site).unwrap_or("?").to_string()
}

/// Matches the runs' requests and fits each one's size. One run may have run out of memory: it is matched up
/// to its failure, and the requests it never made are filled ([`Slot::filled`]).
pub fn align(mut runs: Vec<KnobRun>) -> Result<Aligned, KnobError> {
    if !(2..=3).contains(&runs.len()) {
        return Err(KnobError::Runs(runs.len()));
    }
    runs.sort_by_key(|r| r.value);
    if let Some(w) = runs.windows(2).find(|w| w[0].value == w[1].value) {
        return Err(KnobError::SameValue(w[0].value));
    }
    let mut failed: Option<usize> = None;
    for (i, r) in runs.iter_mut().enumerate() {
        if r.histories.is_empty() {
            return Err(KnobError::NoHistory { value: r.value });
        }
        r.histories.sort_by_key(|h| h.device);
        for h in &r.histories {
            let (value, pid, device) = (r.value, h.pid, h.device);
            if !h.complete() {
                return Err(KnobError::Incomplete { value, pid, device });
            }
            if failure(h).is_some() {
                if failed.is_some_and(|f| f != i) {
                    return Err(KnobError::Failed { value, pid, device });
                }
                failed = Some(i);
            }
        }
    }
    let n = runs[0].histories.len();
    if runs.iter().any(|r| r.histories.len() != n) {
        return Err(KnobError::Processes(
            runs.iter().map(|r| (r.value, r.histories.len())).collect(),
        ));
    }
    // Each slot on one GPU in every run: the limit, the device's memory and the synthesized history's device
    // are all read by device number.
    for i in 0..n {
        let d = runs[0].histories[i].device;
        if runs.iter().any(|r| r.histories[i].device != d) {
            return Err(KnobError::Devices {
                slot: i,
                devices: runs
                    .iter()
                    .map(|r| (r.value, r.histories[i].device))
                    .collect(),
            });
        }
    }
    let values: Vec<u64> = runs.iter().map(|r| r.value).collect();
    let commands: Vec<&[String]> = runs.iter().map(|r| &r.command[..]).collect();
    let tolerate = super::beside::alike(&commands) != Some(false);
    let slots = (0..n)
        .map(|i| {
            let hs: Vec<&History> = runs.iter().map(|r| &r.histories[i]).collect();
            slot(&values, &hs, failed, tolerate)
        })
        .collect::<Result<_, _>>()?;
    Ok(Aligned {
        values,
        runs,
        slots,
        failed,
    })
}

/// A history's requests: their lines (ids shared across the runs through `ids`) and their entries' indices. In a
/// history that failed, those before the failure and then the failed request.
fn requests(
    h: &History,
    ids: &mut HashMap<String, u32>,
    names: &mut Vec<String>,
) -> (Vec<u32>, Vec<u32>) {
    let local: Vec<u32> = (0..h.sites.len() as u32)
        .map(|s| {
            let label = site_label(h, s);
            *ids.entry(label.clone()).or_insert_with(|| {
                names.push(label);
                names.len() as u32 - 1
            })
        })
        .collect();
    let end = failure(h).map_or(h.entries.len(), |f| f + 1);
    let mut l = Vec::new();
    let mut a = Vec::new();
    for (i, e) in h.entries[..end].iter().enumerate() {
        if let Op::Alloc { .. } | Op::Oom { .. } = e.op {
            l.push(local.get(e.site as usize).copied().unwrap_or(NO_SITE));
            a.push(i as u32);
        }
    }
    (l, a)
}

fn slot(
    values: &[u64],
    hs: &[&History],
    failed: Option<usize>,
    tolerate: bool,
) -> Result<Slot, KnobError> {
    // Lines named alike in every run (each history interns its own).
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut names: Vec<String> = Vec::new();
    let (mut lines, at): (Vec<Vec<u32>>, Vec<Vec<u32>>) =
        hs.iter().map(|h| requests(h, &mut ids, &mut names)).unzip();
    // The runs that finished ask the same lines in the same order; the one that failed asked the start of them.
    let done: Vec<usize> = (0..hs.len()).filter(|&r| Some(r) != failed).collect();
    let reference = done[done.len() - 1];
    let same = done.windows(2).all(|w| lines[w[0]] == lines[w[1]])
        && failed.is_none_or(|f| lines[reference].starts_with(&lines[f]));
    let (at, own, paths) = if same {
        (at, vec![Vec::new(); hs.len()], None)
    } else {
        let steps: Vec<Steps> = lines.iter().map(|l| steps(l)).collect();
        let mut m = mismatch(values, hs, &lines, &names, &steps[0]);
        m.other_commands = !tolerate;
        let matched = tolerate
            .then(|| common(values, hs, &lines, &at, reference, failed))
            .flatten();
        let Some((common_lines, at, own)) = matched else {
            return Err(KnobError::Mismatch(m));
        };
        lines = common_lines;
        (at, own, Some(m))
    };
    let ref_steps = steps(&lines[reference]);
    let runs = hs.len();
    let requests = lines[reference].len();
    let mut sizes = vec![0u64; requests * runs];
    for (r, h) in hs.iter().enumerate() {
        for (k, &i) in at[r].iter().enumerate() {
            if let Op::Alloc { size, .. } | Op::Oom { size, .. } = h.entries[i as usize].op {
                sizes[k * runs + r] = size;
            }
        }
    }
    let mut filled = Filled::default();
    if let Some(f) = failed {
        // The run that finished nearest the failed one sizes what it never asked.
        let c = *done
            .iter()
            .min_by_key(|&&r| (values[r].abs_diff(values[f]), std::cmp::Reverse(values[r])))
            .unwrap_or(&reference);
        filled = if done.len() >= 2 {
            // Two runs that finished fit each request the failed one never made: its size there is theirs.
            let xs: Vec<u64> = done.iter().map(|&r| values[r]).collect();
            for k in at[f].len()..requests {
                let ss: Vec<u64> = done.iter().map(|&r| sizes[k * runs + r]).collect();
                let v = eval(fit(&xs, &ss).shape, &xs, &ss, values[f]);
                sizes[k * runs + f] = v.clamp(0, MAX_SIZE as i128) as u64;
            }
            Filled::default()
        } else {
            fill(
                values,
                &mut sizes,
                runs,
                (f, c),
                at[f].len(),
                &ref_steps,
                &lines[reference],
            )
        };
        lines[f] = lines[reference].clone();
    }
    let mut fits: Vec<Fit> = sizes.chunks(runs).map(|s| fit(values, s)).collect();
    // Only from runs that all finished: a failed run's sizes past its failure are themselves fits.
    if failed.is_none() {
        super::fit::switched(values, &sizes, &ref_steps, &mut fits);
        super::fit::capped(values, &sizes, &ref_steps, &lines[reference], &mut fits);
    }
    let steps = (0..runs)
        .map(|r| {
            if r == reference || Some(r) == failed {
                ref_steps
            } else {
                steps(&lines[r])
            }
        })
        .collect();
    Ok(Slot {
        at,
        sizes,
        fits,
        steps,
        filled,
        own,
        paths,
    })
}

/// Runs whose lines differ by a few requests ([`paths`]): the requests every run made (each run's lines and
/// entries of those, the one that failed up to its failure), and each run's own requests (entries). `None` where
/// they differ past [`paths::max_edits`], where a run asks from a line that no request every run made asks
/// from, or where a run keeps one of its own requests to its end: the same lines asking a few more transient
/// buffers is a library choosing its kernels by size; a line of one run's alone is the program taking another
/// branch, and memory kept is the program's state.
#[allow(clippy::type_complexity)]
fn common(
    values: &[u64],
    hs: &[&History],
    lines: &[Vec<u32>],
    at: &[Vec<u32>],
    reference: usize,
    failed: Option<usize>,
) -> Option<(Vec<Vec<u32>>, Vec<Vec<u32>>, Vec<Vec<u32>>)> {
    const NONE: u32 = u32::MAX;
    let n = lines[reference].len();
    let max_d = paths::max_edits(n);
    let mut keep = vec![true; n];
    let mut map: Vec<Vec<u32>> = Vec::with_capacity(lines.len());
    for r in 0..lines.len() {
        if r == reference {
            map.push((0..n as u32).collect());
            continue;
        }
        let prefix = Some(r) == failed;
        let pairs = paths::matches(&lines[reference], &lines[r], max_d, prefix)?;
        let size = |r: usize| -> Vec<u64> {
            at[r]
                .iter()
                .map(|&e| match hs[r].entries[e as usize].op {
                    Op::Alloc { size, .. } | Op::Oom { size, .. } => size,
                    _ => 0,
                })
                .collect()
        };
        let ratio = values[r] as f64 / values[reference].max(1) as f64;
        let pairs = paths::refine(
            (&lines[reference], &lines[r]),
            (&size(reference), &size(r)),
            ratio,
            pairs,
        );
        let mut m = vec![NONE; n];
        for &(i, j) in &pairs {
            m[i as usize] = j;
        }
        // The run that failed never asked what follows its last match: not an edit, it is filled.
        let end = if prefix {
            pairs.last().map_or(0, |p| p.0 as usize + 1)
        } else {
            n
        };
        for i in 0..end {
            keep[i] &= m[i] != NONE;
        }
        map.push(m);
    }
    let kept: Vec<usize> = (0..n).filter(|&i| keep[i]).collect();
    // A step: the cycle of the requests every run made (without one, an eighth of them).
    let step = match steps(
        &kept
            .iter()
            .map(|&i| lines[reference][i])
            .collect::<Vec<_>>(),
    )
    .period
    {
        0 => max_d,
        p => p,
    };
    // (Lines are ids, and NO_SITE among them: a set, not a table.)
    let shared: std::collections::HashSet<u32> =
        kept.iter().map(|&i| lines[reference][i]).collect();
    let mut out_lines = Vec::with_capacity(lines.len());
    let mut out_at: Vec<Vec<u32>> = Vec::with_capacity(lines.len());
    let mut own: Vec<Vec<u32>> = Vec::with_capacity(lines.len());
    for (r, m) in map.iter().enumerate() {
        let js: Vec<u32> = kept
            .iter()
            .map(|&i| m[i])
            .take_while(|&j| j != NONE)
            .collect();
        out_lines.push(js.iter().map(|&j| lines[r][j as usize]).collect());
        let mut used = vec![false; lines[r].len()];
        for &j in &js {
            used[j as usize] = true;
        }
        out_at.push(js.iter().map(|&j| at[r][j as usize]).collect());
        let mine: Vec<usize> = (0..lines[r].len()).filter(|&j| !used[j]).collect();
        // A line only one run asks from is the program's own branch, not a kernel's choice: not matched.
        if mine.iter().any(|&j| !shared.contains(&lines[r][j])) {
            return None;
        }
        let mine: Vec<u32> = mine
            .iter()
            .map(|&j| at[r][j])
            .filter(|&e| matches!(hs[r].entries[e as usize].op, Op::Alloc { .. }))
            .collect();
        // A kernel's buffers are given back within the step that asked them: a request of one run's own held
        // longer is the program's state (a frozen layer's optimizer state in one run and not the other), not
        // matched. A run that failed may not yet have given back what it asked in its last step.
        let kept_from = if Some(r) == failed {
            // The entry of its request a step before its last.
            at[r]
                .get(at[r].len().saturating_sub(step))
                .map_or(0, |&e| e as usize)
        } else {
            usize::MAX
        };
        if !transient(
            hs[r],
            &mine,
            out_at.last().map_or(&[][..], |v| v),
            step,
            kept_from,
        ) {
            return None;
        }
        own.push(mine);
    }
    Some((out_lines, out_at, own))
}

/// Whether every request at `own` (entries of `h`, whose requests every run made are at `common`) is freed
/// within `span` of those requests after it; those at or past entry `kept_from` may be held to the end.
fn transient(h: &History, own: &[u32], common: &[u32], span: usize, kept_from: usize) -> bool {
    let first = own.first().map_or(h.entries.len(), |&e| e as usize);
    let frees: HashMap<u64, usize> = h.entries[first..]
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e.op {
            Op::Free { id } => Some((id, first + i)),
            _ => None,
        })
        .collect();
    own.iter().all(|&e| {
        let Op::Alloc { id, .. } = h.entries[e as usize].op else {
            return true;
        };
        match frees.get(&id) {
            Some(&f) => {
                let asked = common.partition_point(|&i| i < e);
                common.partition_point(|&i| (i as usize) < f) - asked <= span
            }
            None => e as usize >= kept_from,
        }
    })
}

/// Sizes the requests `known..` that run `f` (failed) never made, from run `c` (finished), best evidence first:
/// - the same request of the latest step `f` did make, in the ratio `f` asked it there (steps repeat their
///   requests; a step's sizes may differ from another's, with sequence lengths drawn per step);
/// - else its kin: a request `f` did make that asked the same size in `c`, from the same line first (the same
///   tensor a step later), else from any line (a gradient is its parameter's size, an activation's gradient the
///   activation's), at the most `f` asked for any of them: a guess, which sizes that collide at `c`'s value
///   (a weight and an activation of one size) can mislead either way;
/// - else `c`'s size in proportion to the knob where `f`'s value is the larger (an upper bound for a size that
///   grows at most in proportion), and as `c` asked where it is the smaller.
fn fill(
    values: &[u64],
    sizes: &mut [u64],
    runs: usize,
    (f, c): (usize, usize),
    known: usize,
    st: &Steps,
    lines: &[u32],
) -> Filled {
    let mut filled = Filled::default();
    let requests = sizes.len() / runs;
    // Kin: by line and size first (the same tensor's next request), then by size alone.
    let mut kin: HashMap<(u32, u64), u64> = HashMap::new();
    let mut kin_size: HashMap<u64, u64> = HashMap::new();
    for k in 0..known.min(requests) {
        let (sc, sf) = (sizes[k * runs + c], sizes[k * runs + f]);
        let e = kin.entry((lines[k], sc)).or_default();
        *e = (*e).max(sf);
        let e = kin_size.entry(sc).or_default();
        *e = (*e).max(sf);
    }
    for k in known..requests {
        let sc = sizes[k * runs + c];
        // The latest request before `known` at the same place in the step cycle.
        let analog = (st.period > 0 && k >= st.setup + st.period)
            .then(|| {
                let back = (k + 1 - known).div_ceil(st.period) * st.period;
                k.checked_sub(back).filter(|&a| a >= st.setup)
            })
            .flatten();
        let s = if let Some(a) = analog {
            filled.from_step += 1;
            let (ac, af) = (sizes[a * runs + c], sizes[a * runs + f]);
            if ac == sc || ac == 0 {
                af
            } else {
                let v = (sc as u128).saturating_mul(af as u128) / ac as u128;
                v.min(MAX_SIZE as u128) as u64
            }
        } else if let Some(&s) = kin.get(&(lines[k], sc)).or_else(|| kin_size.get(&sc)) {
            filled.from_kin += 1;
            s
        } else {
            filled.in_proportion += 1;
            in_proportion(sc, values[c], values[f])
        };
        sizes[k * runs + f] = s;
    }
    filled
}

fn mismatch(
    values: &[u64],
    hs: &[&History],
    lines: &[Vec<u32>],
    names: &[String],
    steps: &Steps,
) -> Mismatch {
    let name = |id: u32| {
        names
            .get(id as usize)
            .cloned()
            .unwrap_or_else(|| site_label(hs[0], NO_SITE))
    };
    let longest = lines.iter().map(Vec::len).max().unwrap_or(0);
    let first = (0..longest)
        .find(|&k| lines.iter().any(|l| l.get(k) != lines[0].get(k)))
        .map(|k| {
            let sites = values
                .iter()
                .zip(lines)
                .map(|(&x, l)| (x, l.get(k).map(|&id| name(id))))
                .collect();
            (k, steps.place(k), sites)
        });
    let mut counts: HashMap<u32, Vec<u64>> = HashMap::new();
    for (r, l) in lines.iter().enumerate() {
        for &id in l {
            counts.entry(id).or_insert_with(|| vec![0; lines.len()])[r] += 1;
        }
    }
    let mut differ: Vec<(u64, String, Vec<u64>)> = counts
        .into_iter()
        .filter(|(_, c)| c.windows(2).any(|w| w[0] != w[1]))
        .map(|(id, c)| {
            let spread = c.iter().max().unwrap_or(&0) - c.iter().min().unwrap_or(&0);
            (spread, name(id), c)
        })
        .collect();
    differ.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    differ.truncate(MAX_LINES);
    Mismatch {
        pid: hs[0].pid,
        device: hs[0].device,
        requests: values
            .iter()
            .zip(lines)
            .map(|(&x, l)| (x, l.len()))
            .collect(),
        first,
        lines: differ.into_iter().map(|(_, s, c)| (s, c)).collect(),
        other_commands: false,
    }
}

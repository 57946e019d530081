//! The answers of a what-if on the knob, per allocator configuration: the peaks at given values (with the range
//! the ambiguous fits leave), and the largest value whose replay fits the limit, found by bisection over the
//! model (each tried value replayed; the answer fits and the next one up is refused).

use std::collections::BTreeMap;

use super::align::Aligned;
use super::fit::Shape;
use super::synth::{self, Which};
use crate::whatif::answer::{describe, parallel, run_conf, to_try, Limit};
use crate::whatif::settings::Settings;
use crate::whatif::sim::{Failure, Job, Replayed};

/// How far past the runs' largest value the search for the largest that fits goes (a factor).
pub const SEARCH_FACTOR: u64 = 16;

/// The runs, matched and fitted, with what the job holds beside them (from the traces).
pub struct KnobJob {
    pub aligned: Aligned,
    /// Per process (slot): bytes held outside PyTorch's allocator, at most over the runs.
    pub outside: Vec<u64>,
    pub device_total: BTreeMap<u32, u64>,
    pub others: BTreeMap<u32, u64>,
    /// How far past the largest run the search for the largest value goes: [`SEARCH_FACTOR`] times it, or more
    /// where the caller will run the program nearer the answer anyway (`fit`).
    pub search_factor: u64,
}

/// Where a value lies against the runs'.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Beyond {
    Inside,
    /// Below the smallest run, by this much.
    Below(u64),
    /// Above the largest run, by this much.
    Above(u64),
}

impl Beyond {
    pub fn of(values: &[u64], x: u64) -> Beyond {
        let (lo, hi) = (values[0], values[values.len() - 1]);
        if x < lo {
            Beyond::Below(lo - x)
        } else if x > hi {
            Beyond::Above(x - hi)
        } else {
            Beyond::Inside
        }
    }

    /// More than twice the largest run, or under half the smallest: a guess more than an extrapolation.
    pub fn far(self, values: &[u64]) -> bool {
        let (lo, hi) = (values[0], values[values.len() - 1]);
        match self {
            Beyond::Inside => false,
            Beyond::Below(by) => lo.saturating_sub(by).saturating_mul(2) < lo,
            Beyond::Above(by) => hi.saturating_add(by) > hi.saturating_mul(2),
        }
    }
}

/// The peaks of one replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peaks {
    /// The job's most bytes at once on a device (reserves with what is held outside them), largest over devices.
    pub peak: u64,
    pub allocated_peak: u64,
    /// Per process: PyTorch's reserve at its most (what `max_memory_reserved()` reports) and its allocated peak.
    pub reserved: Vec<u64>,
    pub allocated: Vec<u64>,
}

impl Peaks {
    fn of(r: &Replayed) -> Peaks {
        Peaks {
            peak: r.device_peak.values().copied().max().unwrap_or(0),
            allocated_peak: r.device_allocated_peak.values().copied().max().unwrap_or(0),
            reserved: r.outcomes.iter().map(|o| o.reserved_peak).collect(),
            allocated: r.outcomes.iter().map(|o| o.allocated_peak).collect(),
        }
    }
}

/// The answer at one value.
#[derive(Clone, Debug)]
pub struct AtAnswer {
    pub value: u64,
    pub beyond: Beyond,
    pub fitted: Peaks,
    /// With every ambiguous fit replaced by its alternative (absent when none is ambiguous).
    pub alternative: Option<Peaks>,
    /// Under the limit: whether every request got through, and the first that did not.
    pub fits: Option<bool>,
    pub first_failure: Option<Failure>,
    /// Requests whose fit fell below zero there (taken as zero).
    pub clamped: u64,
}

/// The largest value that fits the limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Largest {
    /// `None`: not even 1 fits.
    pub value: Option<u64>,
    /// It fitted up to where the search stopped ([`SEARCH_FACTOR`] times the largest run): a lower bound.
    pub at_least: bool,
    /// The first request refused at `value + 1` (or at 1 when nothing fits).
    pub next_failure: Option<Failure>,
    /// The same search with the ambiguous fits' alternatives (absent when none is ambiguous).
    pub alternative: Option<Option<u64>>,
    /// Values below the answer found refused (the `--at` values asked: the bisection itself only sees refusals
    /// above its answer): fitting is not monotone in the knob (a tensor that crosses 10 MiB gets a segment of its
    /// own), so a smaller value is not always safer.
    pub refused_below: Vec<u64>,
    pub replays: u32,
}

impl Largest {
    pub fn beyond(&self, values: &[u64]) -> Option<Beyond> {
        self.value.map(|v| Beyond::of(values, v))
    }
}

#[derive(Clone, Debug)]
pub struct KnobConfig {
    /// `None`: as run.
    pub settings: Option<Settings>,
    pub label: String,
    pub conf: String,
    pub approximate: bool,
    pub at: Vec<AtAnswer>,
    pub largest: Option<Largest>,
}

/// How many requests took each shape, and their bytes in the largest run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeCount {
    pub shape: Shape,
    pub requests: u64,
    pub bytes: u64,
    pub ambiguous: u64,
}

pub struct KnobAnswer {
    pub limit: Option<Limit>,
    pub configs: Vec<KnobConfig>,
    pub shapes: Vec<ShapeCount>,
    /// The configuration that fits the largest value (under a limit), when it is not "as run".
    pub best: Option<usize>,
}

impl KnobJob {
    /// Replays the job at `value` under `settings` (`None`: as run), against `limits` (empty: none).
    fn replay(
        &self,
        value: u64,
        which: Which,
        settings: Option<&Settings>,
        limits: &BTreeMap<u32, u64>,
        stop_at_failure: bool,
    ) -> (Replayed, u64) {
        let s = synth::at(&self.aligned, value, which);
        let job = Job::new(
            &s.histories,
            self.outside.clone(),
            self.device_total.clone(),
            self.others.clone(),
        );
        let pick = |i: usize| match settings {
            Some(x) => x.clone(),
            None => s.histories[i].recorded.clone(),
        };
        let devices: Vec<u32> = job.devices().into_iter().collect();
        let watch = stop_at_failure.then_some(&devices[..]);
        (job.replay_until(&pick, limits, watch), s.clamped)
    }

    /// Where a refused request of the history synthesized at `value` falls: the process, its line and where in
    /// the run's setup or step cycle.
    pub fn place(&self, value: u64, f: &Failure) -> (u32, u32, String, String) {
        let a = &self.aligned;
        let t = a.nearest(value);
        let h = &a.runs[t].histories[f.history];
        let slot = &a.slots[f.history];
        let k = slot.at[t].partition_point(|&i| (i as usize) < f.entry);
        (
            h.pid,
            h.device,
            super::align::site_label(h, f.site),
            slot.steps[t].place(k),
        )
    }

    /// Any fit ambiguous, or the runs' code paths differing (so an alternative replay bounds the answers).
    pub fn ambiguous(&self) -> bool {
        self.aligned
            .slots
            .iter()
            .any(|s| s.paths.is_some() || s.fits.iter().any(|f| f.alternative.is_some()))
    }

    /// Requests of the step cycle whose size changes from one repeat of the step to another within the
    /// reference run and whose fit across the runs is not in proportion to the knob (an ambiguous shape), and the
    /// step cycle's requests in all: shapes that follow each batch's data (sequence lengths padded to the longest a
    /// batch holds), which another value of the knob regroups.
    pub fn data_steps(&self) -> (u64, u64) {
        let a = &self.aligned;
        let (r, runs) = (a.reference(), a.values.len());
        let mut varying = 0u64;
        let mut all = 0u64;
        for slot in &a.slots {
            let st = slot.steps[r];
            if st.period == 0 || st.count < 2 {
                continue;
            }
            all += (st.period * st.count) as u64;
            let size = |k: usize| slot.sizes[k * runs + r];
            for j in 0..st.period {
                let ks = (0..st.count).map(|i| st.setup + i * st.period + j);
                let first = size(st.setup + j);
                if ks.clone().any(|k| size(k) != first) {
                    varying += ks.filter(|&k| slot.fits[k].alternative.is_some()).count() as u64;
                }
            }
        }
        (varying, all)
    }

    pub fn shapes(&self) -> Vec<ShapeCount> {
        let runs = self.aligned.values.len();
        let reference = self.aligned.reference();
        let mut out: Vec<ShapeCount> = Vec::new();
        for slot in &self.aligned.slots {
            for (k, f) in slot.fits.iter().enumerate() {
                let i = match out.iter().position(|c| c.shape == f.shape) {
                    Some(i) => i,
                    None => {
                        out.push(ShapeCount {
                            shape: f.shape,
                            requests: 0,
                            bytes: 0,
                            ambiguous: 0,
                        });
                        out.len() - 1
                    }
                };
                let c = &mut out[i];
                c.requests += 1;
                c.bytes = c.bytes.saturating_add(slot.sizes[k * runs + reference]);
                c.ambiguous += u64::from(f.alternative.is_some());
            }
        }
        out.sort_by_key(|c| c.shape as u8);
        out
    }

    fn at(&self, value: u64, settings: Option<&Settings>, limit: Option<&Limit>) -> AtAnswer {
        let none = BTreeMap::new();
        let (fitted, clamped) = self.replay(value, Which::Fitted, settings, &none, false);
        let alternative = self.ambiguous().then(|| {
            Peaks::of(
                &self
                    .replay(value, Which::Alternative, settings, &none, false)
                    .0,
            )
        });
        // Under the limit only whether it fits and where it first fails are read: a replay whose unlimited peak
        // stays within the limit on every device is the same replay (nothing refused, the same choices), and one
        // that does not stops at its first refusal.
        let limited = limit.map(|l| {
            let within = fitted
                .device_peak
                .iter()
                .all(|(d, &p)| l.bytes.get(d).is_none_or(|&x| p <= x));
            if within {
                Replayed::default()
            } else {
                self.replay(value, Which::Fitted, settings, &l.bytes, true)
                    .0
            }
        });
        AtAnswer {
            value,
            beyond: Beyond::of(&self.aligned.values, value),
            fitted: Peaks::of(&fitted),
            alternative,
            fits: limited.as_ref().map(|r| r.failures == 0),
            first_failure: limited.and_then(|r| r.first_failure),
            clamped,
        }
    }

    /// The largest value (at least 1) whose replay under `limits` refuses nothing: from `hint` (another
    /// configuration's answer, which this one is usually near), galloping up or down from it; without one,
    /// doubling from the largest run; then bisection. The answer's fit and its next value's refusal are both
    /// replays. Bisection assumes a larger value never fits where a smaller one does not, which the allocator does
    /// not promise (see [`Largest::refused_below`]): the answer fits and its next value does not, but a larger
    /// pocket that fits may be missed.
    pub fn largest(
        &self,
        which: Which,
        settings: Option<&Settings>,
        limits: &BTreeMap<u32, u64>,
        hint: Option<u64>,
    ) -> Largest {
        let mut replays = 0u32;
        let mut refusal: BTreeMap<u64, Option<Failure>> = BTreeMap::new();
        let mut fits = |x: u64| {
            replays += 1;
            let r = self.replay(x, which, settings, limits, true).0;
            let ok = r.failures == 0;
            if !ok {
                refusal.insert(x, r.first_failure);
            }
            ok
        };
        let values = &self.aligned.values;
        let top = values[values.len() - 1];
        let end = top
            .saturating_mul(self.search_factor.max(2))
            .max(top.saturating_add(1));
        // lo fits (0: nothing known to), hi is refused (None: nothing known to be).
        let (mut lo, mut hi) = (0u64, None);
        match hint.filter(|&h| (1..end).contains(&h)) {
            Some(h) if fits(h) => {
                lo = h;
                let mut step = 1u64;
                while hi.is_none() && lo < end {
                    let x = lo.saturating_add(step).min(end);
                    if fits(x) {
                        lo = x;
                        step = step.saturating_mul(2);
                    } else {
                        hi = Some(x);
                    }
                }
            }
            Some(h) => {
                hi = Some(h);
                let mut step = 1u64;
                while let Some(x) = hi.and_then(|h| h.checked_sub(step)).filter(|&x| x > 0) {
                    if fits(x) {
                        lo = x;
                        break;
                    }
                    hi = Some(x);
                    step = step.saturating_mul(2);
                }
            }
            None if fits(top) => {
                lo = top;
                let mut x = top;
                while hi.is_none() && x < end {
                    x = x.saturating_mul(2).min(end);
                    if fits(x) {
                        lo = x;
                    } else {
                        hi = Some(x);
                    }
                }
            }
            None => {
                hi = Some(top);
                if fits(values[0]) {
                    lo = values[0];
                } else {
                    hi = Some(values[0]);
                }
            }
        }
        let Some(mut h) = hi else {
            return Largest {
                value: Some(lo),
                at_least: true,
                next_failure: None,
                alternative: None,
                refused_below: refusal.keys().copied().filter(|&x| x < lo).collect(),
                replays,
            };
        };
        while h - lo > 1 {
            let mid = lo + (h - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                h = mid;
            }
        }
        Largest {
            value: (lo > 0).then_some(lo),
            at_least: false,
            refused_below: refusal.keys().copied().filter(|&x| x < lo).collect(),
            next_failure: refusal.remove(&h).flatten(),
            alternative: None,
            replays,
        }
    }
}

/// The what-if on the knob: each configuration (as run first) at each of `at`, and under `limit` its largest
/// value.
pub fn answer(job: &KnobJob, configs: &[Settings], at: &[u64], limit: Option<Limit>) -> KnobAnswer {
    let template = &job.aligned.runs[job.aligned.reference()].histories;
    let tried = to_try(template, configs);
    let conf = run_conf(template);
    let ambiguous = job.ambiguous();
    // First, at once: the search as run, and every configuration's answers at the values asked. Then each other
    // configuration's search starts from the answer as run (settings move it by a few values, so galloping from
    // it takes two or three replays where doubling and bisection take six), and each alternative from its own.
    enum Part {
        Largest(Option<Largest>),
        At(Vec<AtAnswer>),
    }
    let mut first = parallel(tried.len() + 1, |i| {
        if i == 0 {
            Part::Largest(
                limit
                    .as_ref()
                    .map(|l| job.largest(Which::Fitted, tried[0].as_ref(), &l.bytes, None)),
            )
        } else {
            let s = tried[i - 1].as_ref();
            Part::At(at.iter().map(|&x| job.at(x, s, limit.as_ref())).collect())
        }
    })
    .into_iter();
    let as_run = match first.next() {
        Some(Part::Largest(l)) => l,
        _ => None,
    };
    let ats: Vec<Vec<AtAnswer>> = first
        .map(|p| match p {
            Part::At(a) => a,
            Part::Largest(_) => Vec::new(),
        })
        .collect();
    let hint = as_run.as_ref().and_then(|g| g.value);
    let searches = parallel(tried.len(), |i| {
        let s = tried[i].as_ref();
        limit.as_ref().map(|l| {
            let mut g = match (&as_run, i) {
                (Some(g), 0) => g.clone(),
                _ => job.largest(Which::Fitted, s, &l.bytes, hint),
            };
            if ambiguous {
                g.alternative = Some(job.largest(Which::Alternative, s, &l.bytes, g.value).value);
            }
            // The search only ever sees refusals above its answer; the `--at` values it was asked about show
            // where a smaller value fails.
            let below = ats[i]
                .iter()
                .filter(|a| a.fits == Some(false) && g.value.is_some_and(|v| a.value < v))
                .map(|a| a.value);
            g.refused_below.extend(below);
            g.refused_below.sort_unstable();
            g.refused_below.dedup();
            g
        })
    });
    let answers = ats.into_iter().zip(searches);
    let configs: Vec<KnobConfig> = tried
        .iter()
        .zip(answers)
        .map(|(t, (at, largest))| {
            let (label, conf, approximate) = describe(t.as_ref(), template, &conf);
            KnobConfig {
                settings: t.clone(),
                label,
                conf,
                approximate,
                at,
                largest,
            }
        })
        .collect();
    let reach = |c: &KnobConfig| {
        c.largest
            .as_ref()
            .and_then(|l| l.value)
            .filter(|_| !c.approximate)
    };
    let best = (0..configs.len())
        .filter(|&c| reach(&configs[c]).is_some())
        .max_by_key(|&c| (reach(&configs[c]), std::cmp::Reverse(c)))
        .filter(|&c| c != 0 && reach(&configs[c]) > reach(&configs[0]));
    KnobAnswer {
        limit,
        configs,
        shapes: job.shapes(),
        best,
    }
}

//! `vramtrace fit`: the largest value of a program's knob (its batch size, its sequence length) that fits a
//! limit, from short runs it makes itself. Each run is the program under `vramtrace run` with its whole PyTorch
//! history, stopped by the bridge after a few of its steps (`runs.rs`); two runs at small values give the
//! knob's what-if (`whatif/batch/`), which names the largest value that fits, per allocator setting. Where the
//! runs take different code paths, another pair is tried; where the answer lies far past the runs, one more
//! run nearer it makes the answer an interpolation rather than a long extrapolation.

pub mod command;
pub mod runs;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::whatif::args::WhatifArgs;
use crate::whatif::batch::align::KnobError;
use crate::whatif::batch::answer::Largest;
use crate::whatif::batch::answered::{answered_searching, KnobAnswered, KnobFailure};
use command::Template;
use runs::{Ending, Progress, Ran, Spec};

/// The values of the first pair when `--from` does not say: small enough to fit beside most models, large
/// enough that a kernel's choice by size is usually the one larger values make.
pub const DEFAULT_FROM: (u64, u64) = (8, 16);

/// Runs past the first pair that look for a pair whose code paths agree.
const OTHER_PAIRS: usize = 2;
/// Runs nearer the answer, at most: the first where the answer is past twice the runs, the second only where it
/// is still past four times them.
const NEARER_RUNS: usize = 2;
/// How far past the runs the search goes: a value far past them is only where the next run goes, not the answer.
const SEARCH_FACTOR: u64 = 1024;

/// What `fit` is asked.
pub struct FitArgs {
    pub command: Vec<std::ffi::OsString>,
    pub knob: Option<String>,
    pub from: Option<(u64, u64)>,
    pub steps: u64,
    pub bound: Duration,
    pub cap: Option<String>,
    pub device_memory: Option<String>,
    pub alloc_conf: Vec<String>,
    pub target: Option<u64>,
    pub verify: bool,
    pub dir: PathBuf,
    pub exe: PathBuf,
}

/// Why a run was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    First,
    /// The first pair's paths differed, or a run failed: another value.
    OtherPair,
    /// Nearer the answer.
    Nearer,
    /// `--verify`: at the answer, and one past it.
    Verify,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::First => "first",
            Role::OtherPair => "other_pair",
            Role::Nearer => "nearer",
            Role::Verify => "verify",
        }
    }
}

pub struct RunDone {
    pub ran: Ran,
    pub role: Role,
}

/// A verification run: the value, whether it ran its steps without an out-of-memory error, and whether the
/// answer said it would.
pub struct Verified {
    pub value: u64,
    pub fitted: bool,
    pub predicted: bool,
    pub trace: PathBuf,
}

/// The effective batch kept with gradient accumulation: `steps` micro-batches of `micro`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accumulation {
    pub target: u64,
    pub steps: u64,
    pub micro: u64,
}

pub struct Fitted {
    pub knob: String,
    /// The limit as `whatif` takes it (`--cap SPEC`), for the command that gives more.
    pub limit_flags: Vec<String>,
    /// What the limit is, in words.
    pub limit_label: String,
    pub template: Template,
    pub dir: PathBuf,
    pub steps: u64,
    pub runs: Vec<RunDone>,
    /// The values the answer comes from.
    pub used: Vec<u64>,
    pub answered: KnobAnswered,
    /// What fit did beyond the first pair, and why.
    pub story: Vec<String>,
    pub accumulation: Option<Accumulation>,
    pub verify: Vec<Verified>,
    /// What `--verify`'s runs found: the largest value that ran and the smallest that ran out of memory.
    pub verified: Option<Bounds>,
    pub seconds: f64,
}

/// The largest value a run fitted and the smallest one that ran out of memory (`None`: no run did).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub fits: Option<u64>,
    pub fails: Option<u64>,
}

impl Bounds {
    /// The largest value that fits, pinned: the next one up failed.
    pub fn pinned(self) -> Option<u64> {
        match (self.fits, self.fails) {
            (Some(a), Some(b)) if b == a + 1 => Some(a),
            _ => None,
        }
    }
}

/// Why `fit` gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum FitError {
    /// Nothing could be run, or the command line is wrong (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The program is not one `fit` can size (exit 2).
    #[error("{0}")]
    Refused(String),
    /// A run failed (exit 1).
    #[error("{0}")]
    Failed(String),
}

struct Fitter<'a> {
    args: &'a FitArgs,
    template: Template,
    knob: String,
    runs: Vec<RunDone>,
    progress: &'a mut dyn Progress,
}

impl Fitter<'_> {
    fn trace(&self, value: u64, verify: bool) -> PathBuf {
        let name = if verify {
            format!("verify-{}-{value}.vtrace", self.knob)
        } else {
            format!("{}-{value}.vtrace", self.knob)
        };
        self.args.dir.join(name)
    }

    /// The run at `value`, made once (a verification run is a run of its own, under the limit).
    fn at(&mut self, value: u64, role: Role, cap: Option<String>) -> Result<&Ran, FitError> {
        let verify = role == Role::Verify;
        if let Some(i) = self
            .runs
            .iter()
            .position(|r| r.ran.value == value && (r.role == Role::Verify) == verify)
        {
            return Ok(&self.runs[i].ran);
        }
        let spec = Spec {
            value,
            command: self.template.at(value),
            out: self.trace(value, verify),
            steps: self.args.steps,
            bound: self.args.bound,
            cap,
        };
        let ran = runs::run(&self.args.exe, &spec, self.progress).map_err(|e| {
            FitError::Usage(format!("cannot start `{}`: {e}", self.args.exe.display()))
        })?;
        self.check(&ran)?;
        self.runs.push(RunDone { ran, role });
        Ok(&self.runs.last().expect("pushed").ran)
    }

    /// A run `fit` cannot use says why, in one line.
    fn check(&self, r: &Ran) -> Result<(), FitError> {
        let k = &self.knob;
        let v = r.value;
        let trace = crate::names::units::shown_path(&r.trace);
        if let Some(why) = &r.unreadable {
            return Err(FitError::Failed(format!(
                "the run at {k} {v} left no readable trace ({why}): `vramtrace run` could not start the program"
            )));
        }
        if !r.torch {
            return Err(FitError::Refused(format!(
                "the program at {k} {v} never used PyTorch on a GPU (no PyTorch allocator attached in any \
                 process): fit needs PyTorch's allocation history and its steps; a C, JAX or CuPy program can be \
                 traced and capped with `vramtrace run` (trace: {trace})"
            )));
        }
        match r.ending {
            Ending::Stopped | Ending::Finished | Ending::OutOfMemory => Ok(()),
            Ending::Failed(code) => {
                let last = r.last_lines(3);
                Err(FitError::Failed(format!(
                    "the program failed at {k} {v} (exit {code}) before {} steps, and not out of memory{}; its \
                     output: {}",
                    self.args.steps,
                    if last.is_empty() {
                        String::new()
                    } else {
                        format!(": \"{}\"", last.join(" / "))
                    },
                    crate::names::units::shown_path(&r.log)
                )))
            }
            Ending::Bound { .. } if r.steps == 0 => Err(FitError::Refused(format!(
                "the program at {k} {v} made no step in {} (no optimizer step or DataLoader batch was seen), so \
                 it was stopped: fit ends each run after --steps of its steps, counted as PyTorch optimizers step \
                 or DataLoaders give batches; a loop without either ends only when the program does (or at \
                 --bound)",
                secs(self.args.bound)
            ))),
            Ending::Bound { .. } => Err(FitError::Refused(format!(
                "the program at {k} {v} made {} of {} steps in {}, so it was stopped: give a longer --bound or \
                 fewer --steps",
                r.steps,
                self.args.steps,
                secs(self.args.bound)
            ))),
        }
    }

    fn ended_oom(&self, value: u64) -> bool {
        self.runs.iter().any(|r| {
            r.ran.value == value && r.role != Role::Verify && r.ran.ending == Ending::OutOfMemory
        })
    }

    fn answer(&self, values: &[u64]) -> Result<KnobAnswered, KnobFailure> {
        let files = values
            .iter()
            .map(|&v| {
                let t = self
                    .runs
                    .iter()
                    .find(|r| r.ran.value == v && r.role != Role::Verify)
                    .map(|r| r.ran.trace.clone())
                    .unwrap_or_else(|| self.trace(v, false));
                PathBuf::from(format!("{}={v}", t.display()))
            })
            .collect();
        let (cap, device_memory) = self.limit();
        let w = WhatifArgs {
            files,
            knob: Some(self.knob.clone()),
            at: Vec::new(),
            cap,
            device_memory,
            alloc_conf: self.args.alloc_conf.clone(),
            json: false,
        };
        answered_searching(&w, &self.knob, SEARCH_FACTOR)
    }
}

impl Fitter<'_> {
    /// The limit as `whatif` takes it: the user's, else this GPU as the runs found it (the least room any run
    /// had on each GPU: the driver's free memory beside the job, so the CUDA context and other processes are
    /// left out as they were), else the whole GPU less a context's allowance.
    fn limit(&self) -> (Option<String>, Option<String>) {
        if self.args.cap.is_some() || self.args.device_memory.is_some() {
            return (self.args.cap.clone(), self.args.device_memory.clone());
        }
        let room = self.room();
        if room.is_empty() {
            (None, Some("100%".to_string()))
        } else {
            (Some(cap_spec(&room)), None)
        }
    }

    fn room(&self) -> std::collections::BTreeMap<u32, u64> {
        let mut room = std::collections::BTreeMap::new();
        for r in self.runs.iter().filter(|r| r.role != Role::Verify) {
            for (&d, &b) in &r.ran.room {
                let e = room.entry(d).or_insert(b);
                *e = (*e).min(b);
            }
        }
        room
    }
}

fn secs(d: Duration) -> String {
    format!("{} s", d.as_secs())
}

/// The largest value as run.
pub fn as_run(a: &KnobAnswered) -> Option<&Largest> {
    a.answer
        .configs
        .iter()
        .find(|c| c.settings.is_none())
        .and_then(|c| c.largest.as_ref())
}

/// Runs the program as `fit` needs and answers.
pub fn fit(args: &FitArgs, progress: &mut dyn Progress) -> Result<Fitted, FitError> {
    let started = Instant::now();
    let template = Template::parse(&args.command).map_err(|e| FitError::Usage(e.to_string()))?;
    let knob = args.knob.clone().unwrap_or_else(|| template.knob.clone());
    let mut f = Fitter {
        args,
        template,
        knob,
        runs: Vec::new(),
        progress,
    };
    let k = f.knob.clone();
    let mut story = Vec::new();
    let (mut used, mut answered) = one_path(&mut f, &mut story)?;
    refuse_constant(&answered, &used, &k, args.steps)?;
    nearer(&mut f, &mut used, &mut answered, &mut story)?;
    let accumulation = args.target.and_then(|t| {
        as_run(&answered)
            .and_then(|l| l.value)
            .map(|m| accumulate(t, m))
    });
    let mut verify = Vec::new();
    let mut verified = None;
    if args.verify {
        if let Some(v) = as_run(&answered).and_then(|l| l.value) {
            let cap = answered.answer.limit.as_ref().and_then(|l| {
                (args.cap.is_some() || args.device_memory.is_some()).then(|| cap_spec(&l.bytes))
            });
            verified = Some(verify_by_runs(&mut f, v, cap, &mut verify)?);
        }
    }
    // The runs' answer, where they pinned one the replay missed, is the one to accumulate to.
    let accumulation = match verified.and_then(|b| b.pinned()) {
        Some(w) => args.target.map(|t| accumulate(t, w)),
        None => accumulation,
    };
    used.sort_unstable();
    let (limit_flags, limit_label) = limit_words(&f, args);
    Ok(Fitted {
        knob: k,
        limit_flags,
        limit_label,
        template: f.template,
        dir: args.dir.clone(),
        steps: args.steps,
        runs: f.runs,
        used,
        answered,
        story,
        accumulation,
        verify,
        verified,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The first pair of runs, and the answer from a pair that takes one code path: a smaller first value while it
/// runs out of memory on its own, another pair where the paths differ (the larger first: the values asked are
/// usually larger). The values answered from, and the answer; refused where no pair agrees.
fn one_path(f: &mut Fitter, story: &mut Vec<String>) -> Result<(Vec<u64>, KnobAnswered), FitError> {
    let args = f.args;
    let k = f.knob.clone();
    let (mut a, mut b) = args.from.unwrap_or(DEFAULT_FROM);
    // The first pair; a smaller one while the smaller value itself runs out of memory.
    loop {
        f.at(
            a,
            if f.runs.is_empty() {
                Role::First
            } else {
                Role::OtherPair
            },
            None,
        )?;
        if !f.ended_oom(a) {
            break;
        }
        if a == 1 {
            return Err(FitError::Failed(format!(
                "the program ran out of memory at {k} 1, with nothing else limiting it: nothing fits this GPU \
                 (vramtrace oom {} says why)",
                crate::names::units::shown_path(&f.trace(1, false))
            )));
        }
        story.push(format!(
            "{k} {a} ran out of memory on its own: trying {}",
            a / 2
        ));
        (a, b) = ((a / 2).max(1), a);
    }
    f.at(b, Role::First, None)?;
    let mut used = vec![a, b];
    let mut answer = f.answer(&used);
    // Another pair where the paths differ: the larger pair first (the values asked are usually larger).
    let mut tried = 0;
    let mut first_mismatch: Option<String> = None;
    while let Err(KnobFailure::Runs { why, .. }) = &answer {
        let KnobError::Mismatch(m) = why.as_ref() else {
            break;
        };
        first_mismatch.get_or_insert_with(|| m.to_string());
        if tried >= OTHER_PAIRS {
            break;
        }
        tried += 1;
        let (lo, hi) = (used[0], used[1]);
        let next = if tried == 1 && !f.ended_oom(hi) {
            (hi, hi.saturating_mul(2))
        } else if lo >= 2 {
            ((lo / 2).max(1), lo)
        } else {
            break;
        };
        for v in [next.0, next.1] {
            f.at(v, Role::OtherPair, None)?;
        }
        story.push(format!(
            "the runs at {k} {lo} and {hi} take different code paths (a kernel chosen by size): answered from {} \
             and {}",
            next.0, next.1
        ));
        used = vec![next.0, next.1];
        answer = f.answer(&used);
    }
    let answered = match answer {
        Ok(x) => x,
        Err(KnobFailure::Runs { why, .. }) if matches!(*why, KnobError::Mismatch(_)) => {
            let values: Vec<String> = f.runs.iter().map(|r| r.ran.value.to_string()).collect();
            return Err(FitError::Refused(format!(
                "no pair of runs takes one code path ({k} {}): {}; give --from two values near the ones you run \
                 with, where the program's kernels are the same",
                values.join(", "),
                first_mismatch.unwrap_or_default()
            )));
        }
        Err(e) => return Err(FitError::Refused(e.to_string())),
    };
    Ok((used, answered))
}

/// Runs whose every request is the same size at both values tell nothing of the knob: `{}` is not what the
/// program sizes its work by, or the runs ended before its work began.
fn refuse_constant(
    answered: &KnobAnswered,
    used: &[u64],
    k: &str,
    steps: u64,
) -> Result<(), FitError> {
    if answered
        .answer
        .shapes
        .iter()
        .all(|c| c.shape == crate::whatif::batch::fit::Shape::Constant)
    {
        return Err(FitError::Refused(format!(
            "the runs at {k} {} asked the same sizes, request for request: the {k} changed nothing the program \
             allocated before it was stopped ({} steps); put {{}} where the program's batch or length goes, or \
             give more --steps if its work begins later",
            used.iter().map(u64::to_string).collect::<Vec<_>>().join(" and "),
            steps
        )));
    }
    Ok(())
}

/// Nearer the answer: a run at three quarters of it replaces a long extrapolation by a short one; where the
/// larger values take another code path, a second run there makes a pair on it.
fn nearer(
    f: &mut Fitter,
    used: &mut Vec<u64>,
    answered: &mut KnobAnswered,
    story: &mut Vec<String>,
) -> Result<(), FitError> {
    let k = f.knob.clone();
    for i in 0..NEARER_RUNS {
        let top = *used.iter().max().expect("two values");
        let Some(l) = as_run(answered) else { break };
        let Some(v) = l.value else { break };
        if !(l.at_least || v > top.saturating_mul(2 << i)) {
            break;
        }
        let near = nice(v.saturating_mul(3) / 4).max(top + 1);
        if f.ended_oom(top) {
            break;
        }
        f.at(near, Role::Nearer, None)?;
        // Three runs where they agree (a size's shape is then seen, not assumed), else the two nearest.
        let below = used.iter().copied().filter(|&x| x < top).max();
        let mut tries: Vec<Vec<u64>> = below.map(|x| vec![x, top, near]).into_iter().collect();
        tries.push(vec![top, near]);
        let mut got = None;
        for t in tries {
            if let Ok(x) = f.answer(&t) {
                got = Some((t, x));
                break;
            }
        }
        match got {
            Some((t, x)) => {
                story.push(format!(
                    "{} {v} was {} the runs: one more run at {near}, to answer from nearer",
                    if l.at_least { "at least" } else { "the answer" },
                    if l.at_least { "far past" } else { "well past" }
                ));
                *used = t;
                *answered = x;
            }
            None => {
                // The larger values take another path (a kernel chosen by size): a second run on it, below the
                // first, makes a pair there, which is where the answer lies.
                let second = nice(near.saturating_mul(2) / 3).max(top + 1);
                let mut nearer = near.to_string();
                if second < near && !f.ended_oom(near) {
                    f.at(second, Role::Nearer, None)?;
                    nearer = format!("{second} and {near}");
                    if let Ok(x) = f.answer(&[second, near]) {
                        story.push(format!(
                            "the runs at {k} {near} and {second} take another code path than the first pair's (a \
                             kernel chosen by size): the answer is from them, on the larger values' path"
                        ));
                        *used = vec![second, near];
                        *answered = x;
                        continue;
                    }
                }
                story.push(format!(
                    "{} at {k} {nearer}, nearer the answer, took another code path: the answer is \
                     from {} alone",
                    if nearer.contains(" and ") {
                        "runs"
                    } else {
                        "a run"
                    },
                    used.iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(" and ")
                ));
                break;
            }
        }
    }
    Ok(())
}

/// The limit the answer is for, as flags for a command and in words.
fn limit_words(f: &Fitter, args: &FitArgs) -> (Vec<String>, String) {
    match f.limit() {
        (Some(c), _) if args.cap.is_none() => (
            vec!["--cap".to_string(), c],
            "this GPU as the runs found it: its free memory beside the job, CUDA contexts and other processes \
             left out"
                .to_string(),
        ),
        (Some(c), _) => (vec!["--cap".to_string(), c.clone()], format!("--cap {c}")),
        (None, Some(d)) if args.device_memory.is_none() => (
            vec!["--device-memory".to_string(), d],
            "this GPU's memory, less 512 MiB per process for its CUDA context (the runs did not read its free \
             memory)"
                .to_string(),
        ),
        (None, Some(d)) => (
            vec!["--device-memory".to_string(), d.clone()],
            format!("--device-memory {d}, less 512 MiB per process for its CUDA context"),
        ),
        (None, None) => (Vec::new(), String::new()),
    }
}

/// Runs a verification search may make past the answer and the one after it, where they contradict the replay:
/// doubling from 2% reaches an answer 30% off in four, halving the gap then pins 600 in six more. On the H200 an
/// LSTM whose replay was 20% low ran out at 8, two runs short.
const VERIFY_SEARCH_RUNS: usize = 12;

/// `--verify`: the answer and the one past it, run under the limit; where either contradicts the replay, more
/// runs (at most [`VERIFY_SEARCH_RUNS`]) look for the value that fits with the next one failing: galloping from
/// the answer by 2% and doubling, then halving the gap. Every run is listed, with what the replay said of it.
fn verify_by_runs(
    f: &mut Fitter<'_>,
    v: u64,
    cap: Option<String>,
    out: &mut Vec<Verified>,
) -> Result<Bounds, FitError> {
    let mut b = Bounds {
        fits: None,
        fails: None,
    };
    let mut try_at = |f: &mut Fitter<'_>, x: u64, b: &mut Bounds| -> Result<bool, FitError> {
        let r = f.at(x, Role::Verify, cap.clone())?;
        let fitted = r.ending != Ending::OutOfMemory;
        out.push(Verified {
            value: x,
            fitted,
            predicted: x <= v,
            trace: r.trace.clone(),
        });
        if fitted {
            b.fits = Some(b.fits.map_or(x, |y| y.max(x)));
        } else {
            b.fails = Some(b.fails.map_or(x, |y| y.min(x)));
        }
        Ok(fitted)
    };
    if try_at(f, v, &mut b)? && !try_at(f, v + 1, &mut b)? {
        return Ok(b);
    }
    let mut left = VERIFY_SEARCH_RUNS;
    let mut step = (v / 50).max(1);
    // Gallop away from the answer until the other side is found.
    while left > 0 && (b.fits.is_none() || b.fails.is_none()) {
        let x = match (b.fits, b.fails) {
            (Some(lo), None) => lo.saturating_add(step),
            (None, Some(hi)) if hi > 1 => hi.saturating_sub(step).max(1),
            _ => break,
        };
        left -= 1;
        try_at(f, x, &mut b)?;
        step = step.saturating_mul(2);
    }
    // Then halve the gap.
    while left > 0 {
        let (Some(lo), Some(hi)) = (b.fits, b.fails) else {
            break;
        };
        if hi <= lo + 1 {
            break;
        }
        left -= 1;
        try_at(f, lo + (hi - lo) / 2, &mut b)?;
    }
    Ok(b)
}

/// A round value at or below `v`: two significant binary digits past 16 (12, 16, 24, 32, 48, ...), so that
/// runs land on sizes programs are tried at.
pub fn nice(v: u64) -> u64 {
    if v <= 16 {
        return v.max(1);
    }
    let top = 63 - v.leading_zeros();
    let unit = 1u64 << (top - 1);
    v / unit * unit
}

/// `--cap` for a limit per device, in bytes.
fn cap_spec(bytes: &std::collections::BTreeMap<u32, u64>) -> String {
    bytes
        .iter()
        .map(|(d, &b)| match b {
            b if b > 0 && b % (1 << 30) == 0 => format!("{d}={}GiB", b >> 30),
            b if b > 0 && b % (1 << 20) == 0 => format!("{d}={}MiB", b >> 20),
            b => format!("{d}={b}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `target` as `steps` micro-batches of `micro` at most `largest`: the fewest steps that divide it exactly, else
/// the fewest steps (the effective batch then rounded up to `steps × micro`).
pub fn accumulate(target: u64, largest: u64) -> Accumulation {
    if largest == 0 || target <= largest {
        return Accumulation {
            target,
            steps: 1,
            micro: target,
        };
    }
    let least = target.div_ceil(largest);
    let exact = (least..=target.min(least.saturating_mul(4)))
        .find(|&k| target.is_multiple_of(k) && target / k <= largest);
    match exact {
        Some(k) => Accumulation {
            target,
            steps: k,
            micro: target / k,
        },
        None => Accumulation {
            target,
            steps: least,
            micro: target.div_ceil(least),
        },
    }
}

/// The folder for the runs' traces: new, the user's alone.
pub fn make_dir(dir: &Path) -> Result<(), FitError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => FitError::Usage(format!(
                "{}: already exists (fit writes its runs into a new folder: give another --dir)",
                crate::names::units::shown_path(dir)
            )),
            _ => FitError::Usage(format!(
                "{}: {}",
                crate::names::units::shown_path(dir),
                crate::files::untrusted_file::said(&e)
            )),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearer_runs_land_on_round_values() {
        assert_eq!(nice(137), 128);
        assert_eq!(nice(200), 192);
        assert_eq!(nice(24), 24);
        assert_eq!(nice(25), 24);
        assert_eq!(nice(16), 16);
        assert_eq!(nice(0), 1);
        assert_eq!(nice(1000), 768);
    }

    #[test]
    fn accumulation_keeps_the_effective_batch() {
        assert_eq!(
            accumulate(32, 13),
            Accumulation {
                target: 32,
                steps: 4,
                micro: 8
            }
        );
        assert_eq!(
            accumulate(32, 40),
            Accumulation {
                target: 32,
                steps: 1,
                micro: 32
            }
        );
        assert_eq!(
            accumulate(256, 183),
            Accumulation {
                target: 256,
                steps: 2,
                micro: 128
            }
        );
        // 97 is prime: no exact split below 97 steps; the fewest steps, rounded up.
        assert_eq!(
            accumulate(97, 50),
            Accumulation {
                target: 97,
                steps: 2,
                micro: 49
            }
        );
        assert_eq!(
            accumulate(10, 3),
            Accumulation {
                target: 10,
                steps: 5,
                micro: 2
            }
        );
    }
}

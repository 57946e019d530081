//! The knob's what-if answered from the command line's runs (`FILE=VALUE`): the runs read, matched and
//! replayed, with the notes its answer needs, as `whatif --knob` and `fit` hand it to their reporters
//! (`reporters/whatif_knob_{text,json}.rs`). Here, below the verbs, so that neither the reporters nor `fit` need
//! the verb that prints it.

use std::path::{Path, PathBuf};

use crate::whatif::args::{configs, limit_for, WhatifArgs};
use crate::whatif::batch::align::KnobError;
use crate::whatif::batch::{align, answer, KnobAnswer, KnobJob, KnobRun};
use crate::whatif::from_trace::{load, Loaded};

/// What the verb hands its reporters.
pub struct KnobAnswered {
    pub knob: String,
    pub files: Vec<(PathBuf, u64)>,
    pub job: KnobJob,
    pub answer: KnobAnswer,
    /// How much the runs' reserves move with each other's segment addresses.
    pub addresses: Option<crate::whatif::batch::addresses::Spread>,
    pub notes: Vec<String>,
}

pub use crate::whatif::batch::beside::MAX_VALUE;

/// `FILE=VALUE`, the value a positive integer up to [`MAX_VALUE`].
pub fn parse_run(arg: &Path) -> Result<(PathBuf, u64), String> {
    let s = arg.to_string_lossy();
    let (file, value) = s.rsplit_once('=').ok_or_else(|| {
        format!("{s}: with --knob, give each run as FILE=VALUE (the knob's value in it), e.g. run8.vtrace=8")
    })?;
    match value.parse::<u64>() {
        Ok(v) if v > 0 && v <= MAX_VALUE => Ok((PathBuf::from(file), v)),
        Ok(v) if v > 0 => Err(format!(
            "{s}: {v} is past the largest value taken ({MAX_VALUE})"
        )),
        _ => Err(format!(
            "{s}: {value:?} is not a positive whole number (the knob's value in that run)"
        )),
    }
}

fn read(file: &Path) -> Result<Loaded, String> {
    let a =
        crate::whatif::trace_file::analyze(file).map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(load(&a, file))
}

/// Why the what-if on the knob gave no answer: its arguments or inputs, or runs it cannot extrapolate from
/// (`fit` tries other values on those).
#[derive(Debug)]
pub enum KnobFailure {
    Args(String),
    Runs { knob: String, why: Box<KnobError> },
}

impl From<String> for KnobFailure {
    fn from(s: String) -> Self {
        KnobFailure::Args(s)
    }
}

impl std::fmt::Display for KnobFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KnobFailure::Args(s) => f.write_str(s),
            KnobFailure::Runs { knob, why } => write!(f, "--knob {knob}: {why}"),
        }
    }
}

pub fn answered(args: &WhatifArgs, knob: &str) -> Result<KnobAnswered, KnobFailure> {
    answered_searching(args, knob, crate::whatif::batch::answer::SEARCH_FACTOR)
}

/// [`answered`], the largest value searched up to `search_factor` times the largest run.
pub fn answered_searching(
    args: &WhatifArgs,
    knob: &str,
    search_factor: u64,
) -> Result<KnobAnswered, KnobFailure> {
    let configs = configs(&args.alloc_conf)?;
    if let Some(v) = args.at.iter().find(|&&v| v > MAX_VALUE) {
        return Err(format!("--at {v}: past the largest value taken ({MAX_VALUE})").into());
    }
    let files: Vec<(PathBuf, u64)> = args
        .files
        .iter()
        .map(|f| parse_run(f))
        .collect::<Result<_, _>>()?;
    // One trace is one run: given at two values it would answer from a run that never ran at the other.
    for (i, (a, va)) in files.iter().enumerate() {
        for (b, vb) in &files[i + 1..] {
            let same = match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
                (Ok(x), Ok(y)) => x == y,
                _ => a == b,
            };
            if same {
                return Err(format!(
                    "{}: one trace given at two values ({va} and {vb}): give each run's own trace",
                    crate::names::units::shown_path(a)
                )
                .into());
            }
        }
    }
    let mut loaded: Vec<(u64, Loaded)> = Vec::new();
    let mut runs = Vec::new();
    let mut notes = Vec::new();
    // The runs' traces and snapshots are read at once, one thread each (two or three): each read is mostly the
    // snapshot's pickle, a second or more for a long history.
    let read_all: Vec<Result<Loaded, String>> = std::thread::scope(|sc| {
        let handles: Vec<_> = files
            .iter()
            .map(|(file, _)| sc.spawn(move || read(file)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a run's read failed".to_string()))
            })
            .collect()
    });
    for ((file, value), l) in files.iter().zip(read_all) {
        let mut l = l?;
        notes.extend(
            l.notes
                .iter()
                .map(|n| format!("{} ({knob} {value}): {n}", file.display())),
        );
        // The histories in device order, each with what its process held outside PyTorch.
        let mut hs: Vec<_> = std::mem::take(&mut l.histories)
            .into_iter()
            .zip(l.outside.iter().copied())
            .collect();
        hs.sort_by_key(|(h, _)| h.device);
        l.outside = hs.iter().map(|(_, o)| *o).collect();
        runs.push(KnobRun {
            value: *value,
            label: file.display().to_string(),
            histories: hs.into_iter().map(|(h, _)| h).collect(),
            command: crate::whatif::batch::beside::command(file).unwrap_or_default(),
        });
        loaded.push((*value, l));
    }
    let aligned = align(runs).map_err(|why| KnobFailure::Runs {
        knob: knob.to_string(),
        why: Box::new(why),
    })?;
    loaded.sort_by_key(|(v, _)| *v);
    let slots = aligned.slots.len();
    let outside = (0..slots)
        .map(|i| {
            loaded
                .iter()
                .filter_map(|(_, l)| l.outside.get(i).copied())
                .max()
                .unwrap_or(0)
        })
        .collect();
    // The largest run's trace says what the device holds and what the limit is.
    let (_, top) = loaded
        .last()
        .ok_or_else(|| KnobFailure::Args("no runs".to_string()))?;
    // Every run has its processes on the same GPUs (`align` checks): one device per process, for the limit and
    // for `--device-memory`'s allowance per process (the top run's histories were taken into the runs above).
    let processes: Vec<u32> = aligned.runs[0].histories.iter().map(|h| h.device).collect();
    let limit = limit_for(args, top, &processes)?;
    let job = KnobJob {
        aligned,
        outside,
        device_total: top.device_total.clone(),
        others: top.others.clone(),
        search_factor,
    };
    let answer = answer(&job, &configs, &args.at, limit);
    if let Some(n) = guessed(&answer.shapes, knob) {
        notes.push(n);
    }
    if let Some(n) = data_steps(&job, knob) {
        notes.push(n);
    }
    let spread = crate::whatif::batch::addresses::spread(&job);
    if let Some(n) = addresses(spread) {
        notes.push(n);
    }
    Ok(KnobAnswered {
        knob: knob.to_string(),
        files,
        job,
        answer,
        addresses: spread,
        notes,
    })
}

/// Where the driver put the runs' segments moves their reserve (`addresses`): a prediction of the reserve as run
/// borrows a run's addresses, so it is no surer than that. Measured under the settings as run; other settings of
/// the caching allocator's own segments borrow the addresses alike.
fn addresses(s: Option<crate::whatif::batch::addresses::Spread>) -> Option<String> {
    let s = s.filter(|s| s.matters())?;
    Some(format!(
        "where the driver put the segments moves the reserve: each run replayed with another run's segment \
         addresses reserved {:+.1}% to {:+.1}% of its own (PyTorch takes the lowest address among free blocks \
         of one size), and a prediction can only borrow a run's addresses: a reserve predicted as run is \
         uncertain by about that much, whatever the sizes (expandable_segments does not depend on it)",
        s.low * 100.0,
        s.high * 100.0
    ))
}

/// The warning an answer needs when some requests fit more than one shape: the runs do not tell how those sizes
/// follow the knob, so the range the alternatives give is no bound. On an H200 (docs/GPU-RESULTS.md, issue 39)
/// a convolutional network's affine requests from batches 16 and 32 put the reserved peak at 48 19% low, its
/// allocated peak right: their sizes were not a line in the batch (a third run fitted 216 of them with a
/// square).
fn guessed(shapes: &[crate::whatif::batch::answer::ShapeCount], knob: &str) -> Option<String> {
    let (n, bytes) = shapes
        .iter()
        .filter(|c| c.ambiguous > 0)
        .fold((0u64, 0u64), |(n, b), c| {
            (n + c.ambiguous, b.saturating_add(c.bytes))
        });
    (n > 0).then(|| {
        format!(
            "{} requests (of shapes asking up to {} in the largest run) fit more than one shape: how their \
             sizes follow the {knob} is a guess, and the range shown assumes they all lean one way, so it is no \
             bound; a run at a third value of the {knob} tells their shape (convolution workspaces, which \
             cuDNN sizes per algorithm and shape, are the usual case)",
            crate::names::units::count(n),
            crate::names::units::bytes(bytes)
        )
    })
}

/// The warning an answer needs when the steps' sizes follow the data each batch holds: a tenth or more of the
/// step cycle's requests change size from step to step within a run and not in proportion to the knob between
/// the runs. On an H200 (docs/GPU-RESULTS.md, "Issue 39 on unseen workloads") GPT-2 fine-tuned on batches padded
/// to their longest reserved 11.65 GiB at 12 where two runs at 4 and 8 predicted 8.16 (its allocated peak within
/// 1%, and within 1% under expandable segments).
fn data_steps(job: &crate::whatif::batch::answer::KnobJob, knob: &str) -> Option<String> {
    let (varying, all) = job.data_steps();
    (varying > 0 && varying.saturating_mul(10) >= all).then(|| {
        format!(
            "{} of the step cycle's {} requests change size from step to step and not in proportion to the \
             {knob} between the runs: the program's shapes follow the data each step holds (sequence lengths \
             padded to the longest of a batch), which another {knob} regroups, so its steps there are a guess; the \
             reserve under the defaults, which fragments with sizes that change each step, is the least certain \
             figure (expandable_segments:True keeps it near the allocated peak, which the runs tell better)",
            crate::names::units::count(varying),
            crate::names::units::count(all)
        )
    })
}

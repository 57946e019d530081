//! `vramtrace oom`'s runs beside the failed one (issue 39): a run of the same program at another batch, given
//! (`--beside FILE[=VALUE]`) or found in the trace's folder (a trace whose command differs only in one number),
//! read and handed to the knob's what-if with the failed process's history: the advice then names the largest
//! batch that fits where this one failed, and the gradient accumulation that keeps its batch.
//!
//! Exit 2 with one line for what the user gave wrong (a value that is not a whole number, a run that is not a
//! trace, values the commands do not tell); a run found by looking, or one that cannot be matched, gives a line
//! in the advice saying why no batch is named.

use std::path::{Path, PathBuf};

use crate::model::{Analysis, BatchAdvice};
use crate::whatif::batch::beside::{self, knob_between, Beside, MAX_VALUE};
use crate::whatif::batch::postmortem::{advise, Failed};
use crate::whatif::from_trace::{load, UNKNOWN_TOTAL};
use crate::whatif::history::History;

/// How many runs beside the failed one are used (with it, the three the knob's fits take at most).
const MAX_BESIDE: usize = 2;

#[derive(clap::Args, Debug, Default, Clone, PartialEq, Eq)]
pub struct BesideArgs {
    /// A run of the same program at another batch (or another value of one knob), to name the largest that fits:
    /// FILE, or FILE=VALUE where the commands do not tell the value. At most two. Without it, the traces in the
    /// same folder whose command differs from this one's only in one number are used.
    #[arg(long, value_name = "FILE[=VALUE]")]
    pub beside: Vec<PathBuf>,
    /// The knob's value in the run that failed, where its command does not tell.
    #[arg(long, value_name = "VALUE")]
    pub value: Option<u64>,
    /// What the advice calls the knob (by default the flag the commands differ in, such as --batch-size).
    #[arg(long, value_name = "NAME")]
    pub knob: Option<String>,
    /// Do not look in the trace's folder for runs at another batch.
    #[arg(long)]
    pub no_beside: bool,
}

impl BesideArgs {
    pub fn is_default(&self) -> bool {
        *self == BesideArgs::default()
    }
}

/// `FILE` or `FILE=VALUE` (as `whatif --knob` takes a run); a file whose own name holds `=` is taken whole when it
/// exists.
fn parse(arg: &Path) -> Result<(PathBuf, Option<u64>), String> {
    if arg.to_string_lossy().contains('=') && !arg.exists() {
        let (file, v) =
            crate::whatif::batch::answered::parse_run(arg).map_err(|e| format!("--beside {e}"))?;
        return Ok((file, Some(v)));
    }
    Ok((arg.to_path_buf(), None))
}

/// The runs to use: those given (their values from the commands, or from `=VALUE` and `--value` where the
/// commands do not tell), else those found.
fn runs(file: &Path, command: &[String], args: &BesideArgs) -> Result<Vec<Beside>, String> {
    if args.beside.is_empty() {
        return Ok(beside::discover(file, command, MAX_BESIDE));
    }
    let mut out: Vec<Beside> = Vec::new();
    for arg in &args.beside {
        let (path, given) = parse(arg)?;
        let shown = crate::names::units::printable(&path.display().to_string());
        let other = beside::command(&path)
            .ok_or_else(|| format!("--beside {shown}: not a trace that can be read"))?;
        let (knob, this, value) = match (knob_between(command, &other), given, args.value) {
            (Some((_, _, v)), Some(g), _) if g != v => {
                return Err(format!(
                    "--beside {shown}={g}: its command says {v}, not {g} (leave =VALUE out where the commands tell)"
                ))
            }
            (Some((_, t, _)), _, Some(tv)) if tv != t => {
                return Err(format!(
                    "--value {tv}: this run's command says {t}, not {tv} (leave --value out where the commands tell)"
                ))
            }
            (Some((k, t, v)), _, _) => (k, t, v),
            (None, Some(v), Some(t)) => (String::new(), t, v),
            (None, _, _) => {
                return Err(format!(
                    "--beside {shown}: its command and this one's do not differ in one number, so the values are \
                     not known: give --beside FILE=VALUE and --value VALUE (this run's)"
                ))
            }
        };
        if value == this {
            return Err(format!(
                "--beside {shown}: at the same value as this run ({value}): give a run at another"
            ));
        }
        // Every run beside differs from this one in the same argument, at the same value here.
        if let Some(o) = out.first() {
            if o.knob != knob || o.this != this {
                return Err(format!(
                    "--beside {shown}: it differs from this run in {}, another run given in {}: give runs that \
                     differ from it in one knob",
                    describe(&knob, this),
                    describe(&o.knob, o.this)
                ));
            }
        }
        out.push(Beside {
            path,
            knob,
            this,
            value,
        });
    }
    Ok(out)
}

fn describe(knob: &str, this: u64) -> String {
    if knob.is_empty() {
        format!("a value given by hand ({this} here)")
    } else {
        format!("{} ({this} here)", crate::names::units::printable(knob))
    }
}

/// The history of `pid` on `device` among a run's, and its place among that device's (by pid).
fn place(hs: &[History], pid: Option<u32>, device: u32, index: usize) -> Option<(History, usize)> {
    let mut on: Vec<&History> = hs.iter().filter(|h| h.device == device).collect();
    on.sort_by_key(|h| h.pid);
    let i = match pid {
        Some(p) => on.iter().position(|h| h.pid == p)?,
        None => index,
    };
    on.get(i).map(|h| ((*h).clone(), i))
}

/// Names the largest batch for the last out-of-memory error whose history, replayed, fails where the run did,
/// from the runs beside it: fills its `framework.batch`.
pub fn attach(a: &mut Analysis, file: &Path, args: &BesideArgs) -> Result<(), String> {
    // What the user gave is checked whether or not there is an error to advise on.
    if args.beside.len() > MAX_BESIDE {
        return Err(format!(
            "--beside: at most {MAX_BESIDE} runs (with the failed one, the three the fits take)"
        ));
    }
    if let Some(v) = args.value.filter(|v| !(1..=MAX_VALUE).contains(v)) {
        return Err(format!(
            "--value {v}: not a whole number from 1 to {MAX_VALUE}"
        ));
    }
    // Every run given is read now, whatever this trace holds: a missing file, a FIFO or a device is refused even
    // where there is no error to advise on.
    for b in &args.beside {
        let (path, _) = parse(b)?;
        beside::read_command(&path).map_err(|why| format!("--beside {}: {why}", path.display()))?;
    }
    if args.no_beside && !args.beside.is_empty() {
        return Err("--no-beside and --beside: give one or the other".into());
    }
    if args.value.is_some() && args.beside.is_empty() {
        return Err(
            "--value is the failed run's value for the runs given with --beside: give them too"
                .into(),
        );
    }
    if args.beside.is_empty() && args.no_beside {
        return Ok(());
    }
    // The last error whose own replay fails where the run failed: a run may recover from refusals before the one
    // that ends it (cuDNN tries an algorithm with a smaller workspace when one is refused).
    let reproduced = |o: &crate::model::OomSnapshot| {
        o.device.is_some()
            && o.framework
                .as_ref()
                .and_then(|f| f.replay.as_ref())
                .is_some_and(|r| r.reproduced)
    };
    let Some(i) = a.ooms.iter().rposition(reproduced) else {
        return Ok(());
    };
    let o = &a.ooms[i];
    let (pid, device) = (o.pid, o.device.unwrap_or(0));
    let limit = o
        .framework
        .as_ref()
        .and_then(|f| f.replay.as_ref())
        .map_or(0, |r| r.limit);
    let runs = runs(file, &a.header.command, args)?;
    if runs.is_empty() {
        return Ok(());
    }
    let knob = args
        .knob
        .clone()
        .or_else(|| runs.iter().map(|r| r.knob.clone()).find(|k| !k.is_empty()))
        .unwrap_or_else(|| "batch".to_string());
    let value = runs[0].this;
    let mut loaded = load(a, file);
    // `load` gives every device with a history its memory (a stand-in where the trace does not say).
    let device_total = loaded
        .device_total
        .get(&device)
        .copied()
        .unwrap_or(UNKNOWN_TOTAL);
    let failed = place(&std::mem::take(&mut loaded.histories), Some(pid), device, 0);
    let result = match failed {
        None => Err(format!(
            "this run's PyTorch history of pid {pid} on GPU {device} could not be read again"
        )),
        Some((h, idx)) => read_beside(&runs, device, idx).map(|b| (h, b)),
    };
    let beside_list: Vec<(String, u64)> = runs
        .iter()
        .map(|r| (r.path.display().to_string(), r.value))
        .collect();
    let out =
        match result {
            Ok((history, beside)) => advise(Failed {
                knob: &knob,
                value,
                history,
                beside,
                limit,
                device_total,
                // What each run ran: two programs are not matched by a few requests' difference.
                commands: std::iter::once(a.header.command.clone())
                    .chain(runs.iter().map(|r| {
                        crate::whatif::batch::beside::command(&r.path).unwrap_or_default()
                    }))
                    .collect(),
            }),
            Err(why) => BatchAdvice {
                knob: knob.clone(),
                value,
                beside: beside_list,
                limit,
                outcome: Err(why),
            },
        };
    if let Some(f) = a.ooms[i].framework.as_mut() {
        f.batch = Some(out);
    }
    Ok(())
}

/// Each run's history of the process at `index` among those on `device`.
fn read_beside(
    runs: &[Beside],
    device: u32,
    index: usize,
) -> Result<Vec<(String, u64, History)>, String> {
    runs.iter()
        .map(|r| {
            let label = r.path.display().to_string();
            let a = crate::whatif::trace_file::analyze(&r.path).map_err(|e| format!("{label}: {e}"))?;
            let l = load(&a, &r.path);
            let (h, _) = place(&l.histories, None, device, index).ok_or_else(|| {
                format!("{label} has no PyTorch history on GPU {device} (trace it with --torch-history)")
            })?;
            Ok((label, r.value, h))
        })
        .collect()
}

//! `vramtrace fit [--knob NAME] [--from A,B] [--steps N] [--cap SPEC | --device-memory SPEC] [--alloc-conf
//! CONF]... [--target V] [--verify] [--json] -- CMD ARGS...`: the largest value of the knob (where CMD has `{}`)
//! that fits the limit, from short runs of CMD made here (`fit/`). Progress on stderr; the answer on stdout.
//!
//! Exit 0: answered (and, with --verify, the runs agreed); 1: a run failed, or --verify contradicted the answer;
//! 2: bad usage, or a program fit cannot size (not PyTorch, never steps, no pair of runs on one code path).

use std::ffi::OsString;
use std::io::{self, IsTerminal};
use std::path::PathBuf;
use std::time::Duration;

use crate::fit::runs::{Ending, Progress, Ran};
use crate::fit::{self, FitArgs, FitError};
use crate::process::exit::{self, Code};
use crate::reporters::{fit_json, fit_text};

#[derive(clap::Args, Debug)]
pub struct FitCliArgs {
    /// The knob's name in the answer (default: read from CMD, `batch` from `--batch {}`).
    #[arg(long)]
    pub knob: Option<String>,
    /// The two values of the first runs (default 8,16).
    #[arg(long, value_name = "A,B", value_parser = parse_pair)]
    pub from: Option<(u64, u64)>,
    /// Stop each run after this many of the program's steps (optimizer steps, else DataLoader batches).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(3..=1000))]
    pub steps: u64,
    /// Stop a run that has not ended after this many seconds (a program that never steps), and say why.
    #[arg(long, value_name = "SECONDS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub bound: u64,
    /// Answer for this job-wide cap (the syntax of `run --cap`) instead of this GPU.
    #[arg(long, value_name = "SPEC", conflicts_with = "device_memory")]
    pub cap: Option<String>,
    /// Answer for a GPU of this much memory (a size, or a share of this one), less 512 MiB per process for its
    /// CUDA context.
    #[arg(long, value_name = "SPEC")]
    pub device_memory: Option<String>,
    /// A PYTORCH_CUDA_ALLOC_CONF to answer for too (repeat for several); default: a grid of the usual advice.
    #[arg(long = "alloc-conf", value_name = "CONF")]
    pub alloc_conf: Vec<String>,
    /// The batch to keep with gradient accumulation when it does not fit (k steps of m).
    #[arg(long, value_name = "VALUE", value_parser = clap::value_parser!(u64).range(1..))]
    pub target: Option<u64>,
    /// Run the program once more at the answer and once at one past it, under the limit, and say whether they
    /// fitted as predicted.
    #[arg(long)]
    pub verify: bool,
    /// Where the runs' traces go: a new folder (default: vramtrace-fit-<program>-<pid>).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Print the documented JSON (docs/JSON-SCHEMA.md) instead of text.
    #[arg(long)]
    pub json: bool,
    /// The command, after `--`, with `{}` where the knob's value goes: `-- python train.py --batch {}`.
    #[arg(last = true, required = true, value_parser = clap::value_parser!(OsString))]
    pub command: Vec<OsString>,
}

fn parse_pair(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("{s:?}: give two values, A,B (8,16)"))?;
    let v = |x: &str| {
        x.trim()
            .parse::<u64>()
            .ok()
            .filter(|&v| v > 0 && v <= crate::whatif::batch::beside::MAX_VALUE)
            .ok_or_else(|| format!("{x:?} is not a positive whole number"))
    };
    let (a, b) = (v(a)?, v(b)?);
    if a == b {
        return Err(format!("{s}: two different values"));
    }
    Ok((a.min(b), a.max(b)))
}

/// Progress on stderr: a line that redraws itself on a terminal, a line per run elsewhere (CI logs).
struct Stderr {
    tty: bool,
    knob: String,
    steps: u64,
    runs: u32,
    current: Option<u64>,
}

impl Progress for Stderr {
    fn update(&mut self, value: u64, steps: u64, elapsed: Duration) {
        if self.current != Some(value) {
            self.current = Some(value);
            self.runs += 1;
            if !self.tty {
                crate::note!("fit: run {}, {} {value}: started", self.runs, self.knob);
            }
        }
        if self.tty {
            let n = self.steps.max(1);
            let done = (steps.min(n) * 20 / n) as usize;
            exit::write_err(format_args!(
                "\r\x1b[Kfit: run {} at {} {value} [{}{}] step {}/{} {:.0} s",
                self.runs,
                self.knob,
                "#".repeat(done),
                " ".repeat(20 - done),
                steps.min(n),
                n,
                elapsed.as_secs_f64()
            ));
        }
    }

    fn done(&mut self, r: &Ran) {
        self.current = None;
        let how = match r.ending {
            Ending::Stopped if r.caught_ooms > 0 => format!(
                "stopped after {} steps ({} out-of-memory errors raised and caught on the way)",
                r.steps, r.caught_ooms
            ),
            Ending::Stopped => format!("stopped after {} steps", r.steps),
            Ending::Finished => "ended by itself".to_string(),
            Ending::OutOfMemory => "ran out of memory".to_string(),
            Ending::Failed(c) => format!("failed (exit {c})"),
            Ending::Bound { .. } => format!("stopped by --bound after {} steps", r.steps),
        };
        if self.tty {
            exit::write_err(format_args!("\r\x1b[K"));
        }
        crate::note!(
            "fit: run {}, {} {}: {how} in {:.1} s",
            self.runs,
            self.knob,
            r.value,
            r.seconds
        );
    }
}

pub fn main(cli: FitCliArgs) -> Code {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            return exit::fail(
                exit::FAILURE,
                format_args!("cannot find vramtrace itself: {e}"),
            )
        }
    };
    let template = match fit::command::Template::parse(&cli.command) {
        Ok(t) => t,
        Err(e) => return exit::fail(exit::USAGE, e),
    };
    let knob = cli.knob.clone().unwrap_or_else(|| template.knob.clone());
    let dir = cli.dir.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "vramtrace-fit-{}-{}",
            sanitize(&template.program()),
            std::process::id()
        ))
    });
    if let Err(e) = fit::make_dir(&dir) {
        return exit::fail(exit::USAGE, e);
    }
    let args = FitArgs {
        command: cli.command,
        knob: cli.knob,
        from: cli.from,
        steps: cli.steps,
        bound: Duration::from_secs(cli.bound),
        cap: cli.cap,
        device_memory: cli.device_memory,
        alloc_conf: cli.alloc_conf,
        target: cli.target,
        verify: cli.verify,
        dir,
        exe,
    };
    // Settings that do not parse are refused before anything runs.
    if let Err(e) = crate::whatif::args::configs(&args.alloc_conf) {
        return exit::fail(exit::USAGE, e);
    }
    for (flag, spec) in [
        ("--cap", &args.cap),
        ("--device-memory", &args.device_memory),
    ] {
        if let Some(s) = spec {
            if let Err(e) = vramtrace_format::cap::CapSpec::parse(s) {
                return exit::fail(exit::USAGE, format_args!("{flag} {s}: {e}"));
            }
        }
    }
    let mut progress = Stderr {
        tty: io::stderr().is_terminal(),
        knob,
        steps: args.steps,
        runs: 0,
        current: None,
    };
    let fitted = match fit::fit(&args, &mut progress) {
        Ok(f) => f,
        Err(e) => {
            let code = match e {
                FitError::Usage(_) | FitError::Refused(_) => exit::USAGE,
                FitError::Failed(_) => exit::FAILURE,
            };
            return exit::fail(code, e);
        }
    };
    let text = if cli.json {
        fit_json::render(&fitted)
    } else {
        fit_text::render(&fitted)
    };
    exit::write_out(format_args!("{text}"));
    // Verified: the runs pinned the answer (the replay's, or the one they found instead).
    if fitted.verified.is_some_and(|b| b.pinned().is_none()) {
        exit::FAILURE
    } else {
        exit::OK
    }
}

/// A program's name as a folder name: letters, digits, `.`, `-` and `_` only.
fn sanitize(s: &str) -> String {
    let t: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    if t.is_empty() || t.starts_with('.') {
        format!("p{t}")
    } else {
        t
    }
}

//! The text outputs, byte for byte, against goldens under tests/golden/ (`*.txt`): `report`, `oom` and
//! `oom --full` of every trace in tests/fixtures/ and tests/fixtures/gpu/ and of those tests/common/traces.rs
//! builds (one for each rule of the diagnosis and each branch of its advice), and the lines `vramtrace run`
//! prints at its end about an out-of-memory error (`verbs::oom::summary`, for one trace).
//!
//! These pin every sentence the reports say, so that moving the words (the diagnosis decides, the reporters
//! speak) is seen to change none. When a change is intended, regenerate them and review the diff:
//!
//! ```text
//! VRAMTRACE_BLESS=1 cargo test -p vramtrace --test text_golden
//! ```
//!
//! As for the JSON goldens, the traces' paths are relative to a fixed working directory, no object file is read
//! (`VRAMTRACE_SYMBOLS=off`), and nothing read varies between runs. The summary has no call sites.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::cli::{text, TempDir};
use common::golden::{self, Outcome};

/// `report`, `oom` and `oom --full` of `traces` (one name for them all), run in `cwd`.
fn cli_outcomes(name: &str, traces: &[String], cwd: &Path) -> Vec<Outcome> {
    [
        ("report", &["report"][..]),
        ("oom", &["oom"][..]),
        ("oom-full", &["oom", "--full"][..]),
    ]
    .into_iter()
    .map(|(label, verb)| {
        let mut args: Vec<String> = verb.iter().map(|s| s.to_string()).collect();
        args.extend(traces.iter().cloned());
        let what = format!("`vramtrace {}`", args.join(" "));
        let out = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
            .args(&args)
            .current_dir(cwd)
            .env("RUST_BACKTRACE", "1")
            // As for the JSON goldens: this machine's object files must not decide the output.
            .env("VRAMTRACE_SYMBOLS", "off")
            .output()
            .unwrap();
        let got = if out.status.success() {
            Ok(text(&out.stdout))
        } else {
            Err(format!(
                "{what} exited {:?}: {}",
                out.status.code(),
                text(&out.stderr)
            ))
        };
        Outcome {
            golden: format!("{name}.{label}.txt"),
            what,
            got,
        }
    })
    .collect()
}

/// `vramtrace run`'s closing lines about the trace's out-of-memory error, when it has one.
fn summary_outcome(name: &str, trace: &Path) -> Option<Outcome> {
    let a = match vramtrace_collector::whatif::trace_file::analyze(trace) {
        Ok(a) => a,
        Err(e) => {
            return Some(Outcome {
                golden: format!("{name}.summary.txt"),
                what: "the run's summary".into(),
                got: Err(format!("{}: {e}", trace.display())),
            })
        }
    };
    let s = vramtrace_collector::verbs::oom::summary(&a)?;
    Some(Outcome {
        golden: format!("{name}.summary.txt"),
        what: format!("the run's summary of {}", trace.display()),
        got: Ok(s),
    })
}

#[test]
fn text_outputs_match_the_goldens() {
    let synthetic = TempDir::new("text-golden");
    let root = golden::manifest_dir();
    let mut runs: Vec<(String, Vec<String>, PathBuf)> = golden::fixtures()
        .into_iter()
        .map(|(name, f)| (name, vec![f], root.clone()))
        .collect();
    for (name, traces) in common::traces::write_synthetic(&synthetic) {
        runs.push((name, traces, synthetic.0.clone()));
    }
    let mut outcomes = Vec::new();
    for (name, traces, cwd) in &runs {
        outcomes.extend(cli_outcomes(name, traces, cwd));
        if let [one] = &traces[..] {
            outcomes.extend(summary_outcome(name, &cwd.join(one)));
        }
    }
    golden::check("text", "text_golden", ".txt", outcomes);
}

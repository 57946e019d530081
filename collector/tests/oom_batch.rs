//! `vramtrace oom`'s largest batch (issue 39) against runs recorded on a GPU (collector/tests/fixtures/whatif/
//! oom_batch/, from scripts/gpu/oom_batch.sh on an H200, 2026-11-28; docs/GPU-RESULTS.md): per workload a run at
//! small batch that finished and a run at a large one that ran out of memory under a cap, side by side. The post-mortem finds
//! the run beside the failed one by its command, and the batch it advises is one the GPU ran under that cap and
//! saw fit (and, where the GPU ran it, the next one up fail).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

mod common;
use common::cli::{unpack_run, TempDir};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/whatif/oom_batch")
}

fn gpu() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("gpu_results.json")).unwrap())
        .unwrap()
}

fn oom(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .arg("oom")
        .args(args)
        .output()
        .unwrap()
}

/// The `framework.batch` of `vramtrace oom --json ARGS` (`null` where no error has one).
fn batch(args: &[&str]) -> Value {
    let out = oom(&[&["--json"], args].concat());
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    // On the last error whose replay reproduced the failure (a run may recover from refusals before it).
    v["ooms"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .map(|e| e["framework"]["batch"].clone())
        .find(|b| !b.is_null())
        .unwrap_or(Value::Null)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn the_advised_batch_is_one_the_gpu_saw_fit_and_the_run_beside_is_found_by_its_command() {
    let real = gpu();
    for (case, r) in real["cases"].as_object().unwrap() {
        let dir = TempDir::new("oom-batch");
        let (a, f) = (r["small"].as_u64().unwrap(), r["failed"].as_u64().unwrap());
        let small = unpack_run(&fixtures(), &dir, &format!("{case}.b{a}"));
        let failed = unpack_run(&fixtures(), &dir, &format!("{case}.b{f}"));
        let b = batch(&[s(&failed)]);
        assert_eq!(
            b["knob"], "--batch",
            "{case}: the flag the commands differ in"
        );
        assert_eq!(b["value"], f);
        assert_eq!(b["beside"][0]["value"], a);
        assert_eq!(b["beside"][0]["path"], s(&small));
        assert!(b["withheld"].is_null(), "{case}: {b}");
        let ran = &r["ran_under_the_cap"];
        let l = b["largest"].as_u64().unwrap();
        assert_eq!(
            ran[l.to_string()],
            true,
            "{case}: advised {l}, which the GPU ran and saw fit"
        );
        // The next one up failed on the GPU, except for the convolutional network, where cuDNN falls back to
        // an algorithm with a smaller workspace when one is refused and the model does not: there the answer errs
        // low (44 advised, 45 fitted).
        if let Some(next) = ran[(l + 1).to_string()].as_bool() {
            assert_eq!(next, case == "conv", "{case}: {} on the GPU", l + 1);
        }
        // The unseen GPT-2 asks a few more requests at 12 than at 4 (its embedding backward sorts past 3,072
        // indices): matched, and the advice fits with both paths.
        assert_eq!(
            b["own_requests"].as_u64().unwrap() > 0,
            case == "padded",
            "{case}: {b}"
        );
        // Gradient accumulation keeps the failed batch with a value the GPU saw fit.
        let (k, m) = (
            b["accumulation_steps"].as_u64().unwrap(),
            b["accumulation_value"].as_u64().unwrap(),
        );
        assert_eq!(k * m, f, "{case}");
        assert!(m <= l);
        assert_eq!(ran[m.to_string()], true, "{case}: {m} a step");
        // The same run given by hand, and the text's sentence.
        assert_eq!(batch(&["--beside", s(&small), s(&failed)])["largest"], l);
        let text = String::from_utf8(oom(&[s(&failed)]).stdout).unwrap();
        assert!(
            text.contains(&format!("--batch {l} fits where {f} failed"))
                && text.contains("gradient accumulation"),
            "{text}"
        );
        // Not looking: no batch.
        assert!(batch(&["--no-beside", s(&failed)]).is_null());
    }
}

#[test]
fn a_second_run_that_finished_makes_the_answer_exact() {
    // The train run at 8 from whatif_batch.sh's fixtures (the same H200 and day), beside the two here: with two
    // runs that finished, the requests the failed one never made are fitted, not bounded.
    let dir = TempDir::new("oom-batch-3");
    let small = unpack_run(&fixtures(), &dir, "train.b4");
    let failed = unpack_run(&fixtures(), &dir, "train.b12");
    let other = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/whatif/batch");
    let eight = unpack_run(&other, &dir, "train.b8");
    let b = batch(&[s(&failed)]);
    assert_eq!(
        b["beside"].as_array().unwrap().len(),
        2,
        "both runs beside it are found: {b}"
    );
    // The GPU saw 9 fit and 10 fail under this cap: the answer lies at or below the largest seen to fit, and
    // never at a batch seen to fail. (It is 8: the limit is what the allocator could have had where the run
    // failed, which counts the 134 MiB held outside PyTorch then.)
    let real = gpu();
    let t = &real["cases"]["train"];
    let l = b["largest"].as_u64().unwrap();
    assert!((1..=9).contains(&l), "{b}");
    let _ = small;
    for seen in [&t["ran_under_the_cap"], &t["ran_under_the_cap_earlier"]] {
        for (x, fit) in seen.as_object().unwrap() {
            let x: u64 = x.parse().unwrap();
            assert!(
                fit.as_bool().unwrap() || x > l,
                "{x} failed on the GPU; advised {l}"
            );
        }
    }
    assert_eq!(
        b["filled_in_proportion"].as_u64().unwrap() + b["filled_from_kin"].as_u64().unwrap(),
        0
    );
    let _ = eight;
}

#[test]
fn what_the_user_gives_wrong_is_one_line_and_exit_2() {
    let dir = TempDir::new("oom-batch-bad");
    let small = unpack_run(&fixtures(), &dir, "train.b4");
    let failed = unpack_run(&fixtures(), &dir, "train.b12");
    let not_a_trace = dir.0.join("notes.txt");
    std::fs::write(&not_a_trace, "hello").unwrap();
    for args in [
        vec!["--beside".to_string(), format!("{}=abc", s(&small))],
        vec!["--beside".to_string(), format!("{}=0", s(&small))],
        vec!["--beside".to_string(), format!("{}=12", s(&small))],
        vec!["--beside".to_string(), s(&not_a_trace).to_string()],
        vec![
            "--beside".into(),
            s(&small).into(),
            "--beside".into(),
            s(&small).into(),
            "--beside".into(),
            s(&small).into(),
        ],
    ] {
        let a: Vec<&str> = args
            .iter()
            .map(String::as_str)
            .chain([s(&failed)])
            .collect();
        let out = oom(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(out.stdout.is_empty());
    }
    // Several traces merged take no --beside.
    let out = oom(&["--beside", s(&small), s(&failed), s(&small)]);
    assert_eq!(out.status.code(), Some(2));
}

/// A copy of trace `src` at `dst` whose header records `command` instead (its records and the snapshots they
/// name unchanged): another run of the program, as far as the commands say.
fn with_command(src: &Path, dst: &Path, command: &[String]) {
    let bytes = std::fs::read(src).unwrap();
    let (r, mut h) = vramtrace_format::TraceReader::open(&bytes[..]).unwrap();
    let at = r.offset() as usize;
    h.command = command.to_vec();
    let mut out = vramtrace_format::codec::encode_header(&h);
    out.extend_from_slice(&bytes[at..]);
    std::fs::write(dst, out).unwrap();
}

fn command_of(p: &Path) -> Vec<String> {
    let bytes = std::fs::read(p).unwrap();
    vramtrace_format::TraceReader::open(&bytes[..])
        .unwrap()
        .1
        .command
}

#[test]
fn only_a_batch_like_knob_is_taken_unasked_and_runs_given_must_agree() {
    let dir = TempDir::new("oom-batch-knobs");
    let small = unpack_run(&fixtures(), &dir, "train.b4");
    let failed = unpack_run(&fixtures(), &dir, "train.b12");
    // The run at 4 moved out of the folder's reach as itself, and beside the failed one as a run that differs
    // from it in --steps alone (its history is the run at 4's).
    let steps = dir.0.join("steps7.vtrace");
    let mut cmd = command_of(&failed);
    let i = cmd.iter().position(|a| a == "--steps").unwrap() + 1;
    cmd[i] = "7".into();
    with_command(&small, &steps, &cmd);
    std::fs::rename(&small, dir.0.join("b4.vtrace.moved")).unwrap();
    assert!(
        batch(&[s(&failed)]).is_null(),
        "a run that differs in --steps is not a batch"
    );
    let moved = dir.0.join("b4.vtrace.moved");
    std::fs::rename(&moved, &small).unwrap();
    // Found: only the run at 4.
    let b = batch(&[s(&failed)]);
    assert_eq!(b["beside"].as_array().unwrap().len(), 1, "{b}");
    assert_eq!(b["beside"][0]["path"], s(&small));
    // Given by hand, they must differ from it in one knob, and the values must be the commands'.
    for args in [
        vec!["--beside", s(&small), "--beside", s(&steps)],
        vec!["--beside", s(&small), "--value", "5"],
        vec!["--no-beside", "--beside", s(&small)],
        vec!["--value", "12"],
    ] {
        let out = oom(&[&args[..], &[s(&failed)]].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    let bad = format!("{}=5", s(&small));
    assert_eq!(
        oom(&["--beside", &bad, s(&failed)]).status.code(),
        Some(2),
        "its command says 4"
    );
}

#[test]
fn a_run_beside_is_named_without_its_control_characters() {
    let dir = TempDir::new("oom-batch-esc");
    let small = unpack_run(&fixtures(), &dir, "train.b4");
    let failed = unpack_run(&fixtures(), &dir, "train.b12");
    let odd = dir.0.join("x\u{1b}[31mRED\u{7}.vtrace");
    std::fs::rename(&small, &odd).unwrap();
    let out = oom(&[s(&failed)]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("fits where 12 failed"), "{text}");
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text:?}"
    );
}

#[test]
fn another_users_trace_in_the_folder_is_not_read() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return; // Only root can give a file to another user here.
    }
    let dir = TempDir::new("oom-batch-owner");
    let small = unpack_run(&fixtures(), &dir, "train.b4");
    let failed = unpack_run(&fixtures(), &dir, "train.b12");
    let c = std::ffi::CString::new(s(&small)).unwrap();
    // SAFETY: a valid NUL-terminated path; nobody's uid and gid.
    assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
    assert!(
        batch(&[s(&failed)]).is_null(),
        "a trace owned by nobody is not taken"
    );
}

//! `vramtrace fit` end to end on the simulated driver, with the stand-in torch (bridge/tests/faketorch), whose
//! allocator records PyTorch's history: the runs it makes (stopped after their steps by the bridge, with no
//! flag of the program's), the answer against the sizes the program asks (64 MiB of weights and 3 MiB a sample
//! each step, so under a cap of C MiB the largest batch is (C - 64) / 3), its refusals, and its JSON.

use std::path::{Path, PathBuf};
use std::process::Command;

use vramtrace_e2e::traced::vramtrace;
use vramtrace_e2e::{fake_torch, FakeCuda};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The simulated driver (one 16 GiB GPU) with the stand-in torch where PyTorch lives in an installation.
fn fake() -> FakeCuda {
    let fake = FakeCuda::new().env("FAKECUDA_DEVICES", "1");
    let site = fake_torch(&fake);
    fake.env("PYTHONPATH", &site)
}

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `vramtrace fit ARGS --dir <tmp>/runs -- python3 fit_batch.py --batch {} PROG...`.
fn fit(fake: &FakeCuda, args: &[&str], prog: &[&str]) -> (Out, PathBuf) {
    let dir = fake.dir().join("runs");
    let mut c: Command = fake.command(vramtrace());
    c.arg("fit")
        .args(args)
        .arg("--dir")
        .arg(&dir)
        .arg("--")
        .arg("python3")
        .arg(repo().join("tests/e2e/py/fit_batch.py"))
        .args(["--batch", "{}"])
        .args(prog);
    let o = c.output().expect("vramtrace fit");
    (
        Out {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        },
        dir,
    )
}

fn json(o: &Out) -> serde_json::Value {
    serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}\n{}", o.stdout, o.stderr))
}

/// Under a cap of 1 GiB: 64 MiB + 3 MiB × 320 is exactly 1 GiB, so 320 fits and 321 does not, and `--verify`
/// finds both on the driver; each run stopped after its 4 steps, the program asking for no stop.
#[test]
fn the_largest_batch_under_a_cap_is_found_and_verified() {
    let fake = fake();
    let (o, dir) = fit(
        &fake,
        &[
            "--cap",
            "1GiB",
            "--steps",
            "4",
            "--verify",
            "--json",
            "--target",
            "512",
            "--alloc-conf",
            "expandable_segments:True",
        ],
        &[],
    );
    assert_eq!(o.code, Some(0), "{}\n{}", o.stdout, o.stderr);
    let j = json(&o);
    assert_eq!(j["knob"], "batch");
    assert_eq!(j["largest"]["value"], 320, "{}", o.stdout);
    assert_eq!(j["largest"]["at_least"], false);
    let next = &j["largest"]["next_failure"];
    assert_eq!(next["value"], 321);
    assert_eq!(next["size"].as_u64(), Some(321 << 20), "{next}");
    assert!(
        next["site"].as_str().unwrap().contains("fit_batch.py:"),
        "{next}"
    );
    // Every run the answer used was stopped by the bridge after its steps.
    let runs = j["runs"].as_array().unwrap();
    for r in runs.iter().filter(|r| r["role"] != "verify") {
        assert_eq!(r["ending"], "stopped", "{r}");
        assert_eq!(r["steps"], 4, "{r}");
        assert!(Path::new(r["trace"].as_str().unwrap()).exists() || dir.exists());
    }
    assert_eq!(runs[0]["value"], 8);
    assert_eq!(runs[1]["value"], 16);
    // The answer, far past 16, came with one run nearer it.
    assert!(runs.iter().any(|r| r["role"] == "nearer"), "{}", o.stdout);
    // What --verify found on the driver: 320 ran, 321 ran out of memory under the cap.
    let v = j["verify"].as_array().unwrap();
    assert_eq!(v.len(), 2);
    assert_eq!(
        (v[0]["value"].as_u64(), v[0]["fitted"].as_bool()),
        (Some(320), Some(true))
    );
    assert_eq!(
        (v[1]["value"].as_u64(), v[1]["fitted"].as_bool()),
        (Some(321), Some(false))
    );
    // 512 kept as 2 steps of 256.
    assert_eq!(j["accumulation"]["steps"], 2);
    assert_eq!(j["accumulation"]["micro"], 256);
    // The as-run setting and the one asked.
    let s = j["settings"].as_array().unwrap();
    assert_eq!(s.len(), 2);
    assert_eq!(s[0]["as_run"], true);
    assert_eq!(j["whatif"]["knob"], "batch");
    // The program's output went to logs beside the traces, not into fit's screen.
    assert!(!o.stderr.contains("Traceback"), "{}", o.stderr);
    assert!(std::fs::read_dir(&dir).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".log")));
}

/// A run that does its steps fits, though out-of-memory errors were raised and caught on the way (cuDNN meets
/// one for each workspace the cap refuses, and goes on with its next algorithm): on the H200, fit counted such
/// runs at 305 to 314 as out of memory and answered 304 where 313 ran (issue 48).
#[test]
fn a_run_that_did_its_steps_fits_though_errors_were_caught_on_the_way() {
    let fake = fake();
    let (o, _) = fit(
        &fake,
        &["--cap", "1GiB", "--steps", "3", "--verify", "--json"],
        &["--mode", "cudnn"],
    );
    assert_eq!(o.code, Some(0), "{}\n{}", o.stdout, o.stderr);
    let j = json(&o);
    assert_eq!(j["largest"]["value"], 320, "{}", o.stdout);
    let v = j["verify"].as_array().unwrap();
    assert_eq!(
        (v[0]["value"].as_u64(), v[0]["fitted"].as_bool()),
        (Some(320), Some(true)),
        "{}",
        o.stdout
    );
    assert_eq!(v[1]["fitted"], false, "{}", o.stdout);
    let at = j["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == "verify" && r["value"] == 320)
        .unwrap();
    assert_eq!(at["ending"], "stopped", "{at}");
    assert!(at["caught_out_of_memory"].as_u64().unwrap() >= 3, "{at}");
}

/// The text says the answer first, with the request refused one past it, and the runs it came from; `--verify`
/// confirms both on the driver. (512 MiB: 64 of weights, a 2 MiB segment for the parameter, 3 MiB a sample.)
#[test]
fn the_text_answer_leads_and_fits_one_screen() {
    let fake = fake();
    let (o, _) = fit(&fake, &["--cap", "512MiB", "--steps", "3", "--verify"], &[]);
    assert_eq!(o.code, Some(0), "{}\n{}", o.stdout, o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    let answer = lines
        .iter()
        .position(|l| l.starts_with("BATCH 148 fits"))
        .unwrap_or_else(|| panic!("{}", o.stdout));
    assert!(answer <= 5, "{}", o.stdout);
    assert!(
        o.stdout.contains("at 149: 149.00 MiB refused"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout
            .contains("Verified: batch 148 fitted and 149 ran out of memory, as predicted."),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("Runs: batch 8"), "{}", o.stdout);
    assert!(
        lines.len() <= 25 && lines.iter().all(|l| l.chars().count() <= 100),
        "{}",
        o.stdout
    );
    // Progress went to stderr, a line per run's start and end (not a terminal).
    assert!(
        o.stderr
            .contains("fit: run 1, batch 8: stopped after 3 steps"),
        "{}",
        o.stderr
    );
}

/// Where the first pair's code paths differ (past a batch of 12 the program asks a workspace from a line of its
/// own), fit takes a pair on one path and says so; the answer counts the workspace: (1024 - 64 - 16) / 3 = 314.
#[test]
fn runs_on_different_code_paths_are_replaced_by_a_pair_that_agrees() {
    let fake = fake();
    let (o, _) = fit(
        &fake,
        &["--cap", "1GiB", "--steps", "3", "--json"],
        &["--mode", "paths"],
    );
    assert_eq!(o.code, Some(0), "{}\n{}", o.stdout, o.stderr);
    let j = json(&o);
    assert_eq!(j["largest"]["value"], 314, "{}", o.stdout);
    let used: Vec<u64> = j["used"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(!used.contains(&8), "8 is on the other path: {used:?}");
    let notes = j["notes"].to_string();
    assert!(notes.contains("different code paths"), "{notes}");
}

/// A loop with no optimizer counts its DataLoader's batches as steps, and is stopped after them too.
#[test]
fn a_loop_over_batches_is_stopped_after_its_batches() {
    let fake = fake();
    let (o, _) = fit(
        &fake,
        &["--cap", "1GiB", "--steps", "3", "--json", "--from", "4,8"],
        &["--mode", "loader"],
    );
    assert_eq!(o.code, Some(0), "{}\n{}", o.stdout, o.stderr);
    let j = json(&o);
    assert_eq!(j["largest"]["value"], 320, "{}", o.stdout);
    assert_eq!(j["runs"][0]["value"], 4);
    assert_eq!(j["runs"][0]["steps"], 3);
    assert_eq!(j["runs"][0]["ending"], "stopped");
}

/// A program that never steps is stopped by the bound and told why, exit 2; one that is not PyTorch is refused
/// before any answer; a command without `{}` is refused before anything runs.
#[test]
fn programs_fit_cannot_size_are_refused_in_one_line() {
    let fake = fake();
    let (o, _) = fit(&fake, &["--bound", "3"], &["--mode", "nostep"]);
    assert_eq!(o.code, Some(2), "{}\n{}", o.stdout, o.stderr);
    let last = o.stderr.lines().last().unwrap();
    assert!(
        last.starts_with("vramtrace: ") && last.contains("made no step in 3 s"),
        "{}",
        o.stderr
    );
    assert!(o.stdout.is_empty());

    let fake = self::fake();
    let dir = fake.dir().join("echo");
    let r = fake
        .command(vramtrace())
        .args(["fit", "--dir"])
        .arg(&dir)
        .args(["--", "/bin/echo", "--batch", "{}"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{err}");
    assert!(
        err.lines().last().unwrap().contains("never used PyTorch"),
        "{err}"
    );

    let r = fake
        .command(vramtrace())
        .args(["fit", "--", "python3", "train.py", "--batch", "8"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no argument of the command holds {}"), "{err}");
}

/// The loop closed: a batch too large for its cap fails; its post-mortem advises the `vramtrace fit` command for
/// this job (its own command with `{}` for its batch, the cap, the batch to keep), and that command, run as
/// written, names the batch that fits and the accumulation that keeps 400.
#[test]
fn the_post_mortem_names_the_fit_command_that_answers_it() {
    let fake = fake();
    let prog = repo().join("tests/e2e/py/fit_batch.py");
    let prog_s = prog.display().to_string();
    let (r, trace) = fake.traced(
        "b400",
        &["--cap", "1GiB"],
        "python3",
        &[prog_s.as_str(), "--batch", "400"],
    );
    assert_ne!(r.status.code(), Some(0), "{}", r.stderr);
    let out = fake
        .command(vramtrace())
        .args(["oom", "--json"])
        .arg(&trace)
        .output()
        .unwrap();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let advice: Vec<&str> = j["ooms"][0]["advice"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let want = format!("vramtrace fit --cap 1GiB --target 400 -- python3 {prog_s} --batch {{}}");
    let first = advice[0];
    assert!(first.ends_with(&want), "{advice:#?}");
    // The text screen says it too, before the smaller batch and the larger cap.
    let text = fake
        .command(vramtrace())
        .arg("oom")
        .arg(&trace)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    let (fit, cap) = (
        text.find("vramtrace fit --cap").unwrap(),
        text.find("A cap of at least").unwrap(),
    );
    assert!(fit < cap, "{text}");
    // Run it as advised (its words after `vramtrace`; --dir and --json added).
    let words: Vec<&str> = want.split(' ').skip(2).collect();
    let split = words.iter().position(|w| *w == "--").unwrap();
    let dir = fake.dir().join("advised");
    let o = fake
        .command(vramtrace())
        .arg("fit")
        .args(&words[..split])
        .arg("--dir")
        .arg(&dir)
        .args(["--json", "--steps", "3"])
        .args(&words[split..])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let f: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(f["largest"]["value"], 320, "{stdout}");
    assert_eq!(f["accumulation"]["steps"], 2);
    assert_eq!(f["accumulation"]["micro"], 200);
}

/// Where the program does past the runs what the runs cannot show (a 100 MiB buffer past a batch of 250), the
/// replay's answer is wrong, and `--verify` says so and finds the right one by running: (1024 - 64 - 100) / 3
/// is 286, and 287's requests round up to 288 MiB.
#[test]
fn verify_finds_the_answer_by_runs_where_the_replay_is_wrong() {
    let fake = fake();
    let (o, _) = fit(
        &fake,
        &[
            "--cap", "1GiB", "--steps", "3", "--verify", "--json", "--target", "1000",
        ],
        &["--mode", "late"],
    );
    assert_eq!(o.code, Some(0), "{}\n{}", o.stdout, o.stderr);
    let j = json(&o);
    assert_eq!(j["largest"]["value"], 320, "the replay's");
    assert_eq!(j["verified"]["largest"], 286, "{}", o.stdout);
    assert_eq!(j["verified"]["fails"], 287);
    // Every verification run is listed, with what the replay said of it.
    let v = j["verify"].as_array().unwrap();
    assert!(v.len() <= 10, "{v:?}");
    assert!(v
        .iter()
        .any(|x| x["value"] == 320 && x["fitted"] == false && x["predicted"] == true));
    // The accumulation follows the runs' answer: 1000 in 4 steps of 250.
    assert_eq!(j["accumulation"]["micro"], 250);
}

/// Where the larger values take a path the first pair does not (a workspace past a batch of 100), the run
/// nearer the answer is paired with a second on its path, and the answer comes from them: (1024 - 64 - 16) / 3.
#[test]
fn a_path_only_larger_values_take_is_answered_from_a_pair_on_it() {
    let fake = fake();
    let (o, _) = fit(
        &fake,
        &["--cap", "1GiB", "--steps", "3", "--json"],
        &["--mode", "paths100"],
    );
    assert_eq!(o.code, Some(0), "{}\n{}", o.stdout, o.stderr);
    let j = json(&o);
    assert_eq!(j["largest"]["value"], 314, "{}", o.stdout);
    let used: Vec<u64> = j["used"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(used.iter().all(|&v| v > 100), "{used:?}");
    assert!(
        j["notes"].to_string().contains("another code path"),
        "{}",
        j["notes"]
    );
}

/// Runs whose every request is the same at both values (`{}` is not what the program sizes its work by, or the
/// runs stopped before its work began) are refused in one line, never answered at the search's ceiling (an
/// H200 run stopped inside `.cuda()` once answered "8,589,934,592 or more").
#[test]
fn runs_the_knob_changes_nothing_in_are_refused() {
    let fake = fake();
    let prog = fake.dir().join("const.py");
    std::fs::write(
        &prog,
        "import torch\ntorch.cuda.init()\nw = torch.empty_cuda(64 << 20)\nopt = torch.optim.SGD([])\n\
         while True:\n    a = torch.empty_cuda(8 << 20)\n    del a\n    opt.step()\n",
    )
    .unwrap();
    let r = fake
        .command(vramtrace())
        .args(["fit", "--cap", "1GiB", "--steps", "3", "--dir"])
        .arg(fake.dir().join("runs"))
        .arg("--")
        .arg("python3")
        .arg(&prog)
        .args(["--batch", "{}"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{err}");
    assert!(
        err.lines().last().unwrap().contains("asked the same sizes"),
        "{err}"
    );
    assert!(r.stdout.is_empty());
}

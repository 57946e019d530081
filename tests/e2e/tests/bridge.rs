//! The Python bridge end to end: real Python processes under `vramtrace run`, on the simulated driver, with the
//! stand-in torch of bridge/tests/faketorch (PyTorch's lazy initialisation, observer and stats semantics over a
//! toy caching allocator whose segments come from the driver). Checks what the driver saw, what the trace
//! holds, and what `vramtrace oom`/`report` conclude.

use std::path::{Path, PathBuf};
use std::process::Command;

use vramtrace_e2e::traced::{read_trace, vramtrace, BridgeBody};
use vramtrace_e2e::{fake_torch, FakeCuda, MIB};
use vramtrace_format::{Api, Framework};

const GIB: u64 = 1 << 30;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn script(name: &str) -> PathBuf {
    repo().join("tests/e2e/py").join(name)
}

fn json(verb: &str, trace: &Path) -> serde_json::Value {
    let out = Command::new(vramtrace())
        .args([verb, "--json"])
        .arg(trace)
        .output()
        .expect("vramtrace");
    assert!(
        out.status.success(),
        "{verb}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn text(verb: &str, trace: &Path) -> String {
    let out = Command::new(vramtrace())
        .arg(verb)
        .arg(trace)
        .output()
        .expect("vramtrace");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn cache_fragmentation_is_named_from_pytorchs_own_figures() {
    let fake = FakeCuda::new().env("FAKECUDA_DEVICES", "1");
    let site = fake_torch(&fake);
    let fake = fake.env("PYTHONPATH", &site);
    let (r, trace) = fake.traced(
        "frag",
        &["--torch-history=1000"],
        "python3",
        &[script("bridge_frag.py")],
    );
    assert_eq!(r.status.code(), Some(3), "{}", r.stderr);

    // The driver: one 10 GiB segment, then the request and the allocator's retry, both refused.
    let log = fake.log();
    let failed: Vec<_> = log
        .iter()
        .filter(|l| l.func.starts_with("cuMemAlloc") && l.rc != 0)
        .collect();
    assert_eq!(failed.len(), 2, "{log:?}");
    assert!(failed.iter().all(|l| l.size == 8 * GIB));

    // The trace: the bridge attached, sampled, and its OOM record came after the driver's, acknowledged.
    let t = read_trace(&trace);
    let pid = t.pids()[0];
    let attach: Vec<_> = t
        .bridge
        .iter()
        .filter(|(_, b)| b.what == "attach")
        .collect();
    assert_eq!(attach.len(), 1);
    assert_eq!(attach[0].1.pid, pid);
    assert_eq!(attach[0].1.text("torch").as_deref(), Some("0.0-fake"));
    let reserved_seen = t
        .samples
        .iter()
        .map(|(_, s)| (s.framework, s.reserved))
        .max_by_key(|x| x.1)
        .unwrap();
    assert_eq!(reserved_seen, (Framework::Torch, 10 * GIB));
    let (at, oom) = t
        .bridge
        .iter()
        .find(|(_, b)| b.what == "oom")
        .expect("a bridge oom record");
    assert!(oom.ack, "the OOM record waits for the collector");
    assert_eq!(oom.num("requested"), Some(8 * GIB));
    assert_eq!(oom.num("allocated"), Some(5 * GIB));
    assert_eq!(oom.num("reserved"), Some(10 * GIB));
    assert_eq!(oom.num("largest_free_block"), Some(GIB));
    assert_eq!(oom.num("free_in_live_segments"), Some(5 * GIB));
    assert_eq!(t.ooms.len(), 2);
    let driver_oom_records: Vec<usize> = t.event_records[&pid].clone();
    assert!(
        driver_oom_records.iter().all(|&i| i < *at),
        "the bridge's record follows the driver's events"
    );

    // The diagnosis.
    let j = json("oom", &trace);
    assert_eq!(
        j["oom_records"].as_u64().unwrap(),
        1,
        "the retry folds into one error"
    );
    let o = &j["ooms"][0];
    assert_eq!(o["cause"].as_str().unwrap(), "fragmentation_cache");
    assert_eq!(o["view"].as_str().unwrap(), "driver+pytorch");
    assert_eq!(o["driver_ooms_folded"].as_u64().unwrap(), 1);
    let f = &o["framework"];
    assert_eq!(f["allocated_bytes"].as_u64().unwrap(), 5 * GIB);
    assert_eq!(f["reserved_bytes"].as_u64().unwrap(), 10 * GIB);
    assert_eq!(f["largest_free_block_bytes"].as_u64().unwrap(), GIB);
    // --torch-history: the snapshot kept beside the trace names the line that keeps the tensors.
    let snap = PathBuf::from(f["snapshot"].as_str().unwrap());
    assert!(snap.is_file(), "{}", snap.display());
    assert_eq!(snap.parent(), trace.parent());
    let bytes = std::fs::read(&snap).unwrap();
    assert_eq!(&bytes[..2], &[0x80, 4], "pickle protocol 4");
    let kept = &f["kept"][0];
    assert!(
        kept["label"]
            .as_str()
            .unwrap()
            .contains("bridge_frag.py:14"),
        "{}",
        kept["label"].as_str().unwrap()
    );
    assert_eq!(kept["bytes"].as_u64().unwrap(), 5 * GIB);
    assert_eq!(kept["count"].as_u64().unwrap(), 5);
    let txt = text("oom", &trace);
    assert!(txt.contains("CAUSE: fragmentation_cache"), "{txt}");
    assert!(txt.contains("expandable_segments:True"), "{txt}");
    assert!(!txt.contains("Shed at least"), "{txt}");
}

#[test]
fn forked_and_spawned_children_attach_on_their_own() {
    let fake = FakeCuda::new().env("FAKECUDA_DEVICES", "1");
    let site = fake_torch(&fake);
    let fake = fake.env("PYTHONPATH", &site);
    let (r, trace) = fake.traced("children", &[], "python3", &[script("bridge_children.py")]);
    r.assert_success("bridge_children.py");
    let line = r
        .stdout
        .lines()
        .find(|l| l.starts_with("children"))
        .unwrap();
    let kids: Vec<u32> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(kids.len(), 2);
    let t = read_trace(&trace);
    for kid in &kids {
        assert!(
            t.bridge
                .iter()
                .any(|(_, b)| b.what == "attach" && b.pid == *kid),
            "child {kid} attached: {:?}",
            t.bridge
        );
        let allocs: Vec<_> = t.events[kid]
            .iter()
            .filter(|e| e.api == Api::MemAlloc && e.ok())
            .collect();
        assert_eq!(allocs.len(), 1);
        assert_eq!(allocs[0].size, 64 * MIB);
        assert!(
            t.samples
                .iter()
                .any(|(_, s)| s.pid == *kid && s.reserved == 64 * MIB),
            "child {kid} sampled"
        );
    }
    let j = json("report", &trace);
    let procs = &j["processes"];
    for i in 0..procs.as_array().unwrap().len() {
        let p = &procs[i];
        if kids.contains(&(p["pid"].as_u64().unwrap() as u32)) {
            assert!(p["python_bridge"].as_bool().unwrap());
        }
    }
}

#[test]
fn a_child_forked_after_cuda_init_does_not_report_its_parents_figures() {
    let fake = FakeCuda::new().env("FAKECUDA_DEVICES", "1");
    let site = fake_torch(&fake);
    let fake = fake.env("PYTHONPATH", &site);
    let (r, trace) = fake.traced(
        "forked",
        &[],
        "python3",
        &[script("bridge_fork_after_init.py")],
    );
    r.assert_success("bridge_fork_after_init.py");
    let child: u32 = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("child "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let t = read_trace(&trace);
    assert!(
        t.samples.iter().all(|(_, s)| s.pid != child),
        "{:?}",
        t.samples
    );
    assert!(
        t.bridge.iter().all(|(_, b)| b.pid != child),
        "{:?}",
        t.bridge
    );
    // The parent's own figures are there, once.
    let parent = t.pids()[0];
    assert_ne!(parent, child);
    assert!(t
        .samples
        .iter()
        .any(|(_, s)| s.pid == parent && s.reserved == 256 * MIB));
    let j = json("report", &trace);
    let dev = &j["devices"][0]["framework"];
    assert_eq!(dev["peak_reserved_bytes"].as_u64(), Some(256 * MIB));
}

#[test]
fn python_processes_without_the_bridge_are_named() {
    let fake = FakeCuda::new().env("FAKECUDA_DEVICES", "1");
    // With the bridge: loaded, so nothing to say.
    let (r, trace) = fake.traced("plain", &[], "python3", &[script("bridge_plain.py")]);
    r.assert_success("bridge_plain.py");
    let j = json("report", &trace);
    assert!(j["processes"][0]["python_bridge"].as_bool().unwrap());
    assert!(!text("report", &trace).contains("without the bridge"));
    // python -I ignores PYTHONPATH: the report says the bridge did not run there.
    let (r, trace) = fake.traced(
        "isolated",
        &[],
        "python3",
        &["-I".into(), script("bridge_plain.py")],
    );
    r.assert_success("python -I");
    let j = json("report", &trace);
    assert!(!j["processes"][0]["python_bridge"].as_bool().unwrap());
    let txt = text("report", &trace);
    assert!(txt.contains("without the bridge"), "{txt}");
    // --python-agent off: said once, and nothing of the bridge in the trace.
    let (r, trace) = fake.traced(
        "off",
        &["--python-agent", "off"],
        "python3",
        &[script("bridge_plain.py")],
    );
    r.assert_success("--python-agent off");
    let t = read_trace(&trace);
    assert!(t.bridge.is_empty() && t.samples.is_empty());
    assert!(
        !t.hellos[0].extra.iter().any(|(k, _)| k == "python_bridge"),
        "{:?}",
        t.hellos[0].extra
    );
    assert!(text("report", &trace).contains("off for this run"));
}

#[test]
fn torch_history_needs_the_bridge() {
    let out = Command::new(vramtrace())
        .args([
            "run",
            "--python-agent",
            "off",
            "--torch-history",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--torch-history"), "{err}");
}

/// The stand-in torch on PYTHONPATH, and `bridge_keep_steps.py MIB STEPS MS MODE` under `vramtrace run ARGS`:
/// its result, the trace, and the steps the program kept before its error (its stderr says).
fn keep_steps(
    name: &str,
    args: &[&str],
    prog: &[&str],
) -> (FakeCuda, vramtrace_e2e::RunResult, PathBuf) {
    let fake = FakeCuda::new().env("FAKECUDA_DEVICES", "1");
    let site = fake_torch(&fake);
    let fake = fake.env("PYTHONPATH", &site);
    let mut a: Vec<String> = vec![script("bridge_keep_steps.py").display().to_string()];
    a.extend(prog.iter().map(|s| s.to_string()));
    let (r, trace) = fake.traced(name, args, "python3", &a);
    (fake, r, trace)
}

/// Issue 35: outputs kept in a list under a cap that fills in under a second are growth counted in the
/// program's own steps, at the step's exact figure, and the list is named as what holds them: in the cause,
/// HELD BY and the advice, never a cap or an allocator setting.
#[test]
fn outputs_kept_under_a_tight_cap_are_growth_in_steps_held_by_their_list() {
    let (fake, r, trace) = keep_steps("keep", &["--cap", "2GiB"], &["128", "100", "30", "keep"]);
    assert_eq!(r.status.code(), Some(3), "{}", r.stderr);
    let kept: u64 = r
        .stderr
        .split("OOM after ")
        .nth(1)
        .and_then(|x| x.split_whitespace().next())
        .and_then(|x| x.parse().ok())
        .expect("the program's count");
    // What the driver gave never passed the cap: the shim refused the cache's last request itself.
    let (mut live, mut peak) = (std::collections::HashMap::new(), 0u64);
    for l in fake.log().iter().filter(|l| l.rc == 0) {
        if l.func.starts_with("cuMemAlloc") {
            live.insert(l.addr, l.size);
        } else if l.func.starts_with("cuMemFree") {
            live.remove(&l.addr);
        }
        peak = peak.max(live.values().sum());
    }
    assert!((2 * GIB - 256 * MIB..=2 * GIB).contains(&peak), "{peak}");
    // The trace: the optimizer's steps, read at their boundaries.
    let t = read_trace(&trace);
    let readings: Vec<u64> = t
        .bridge
        .iter()
        .filter(|(_, b)| b.what == "steps")
        .filter_map(|(_, b)| b.num("allocated"))
        .collect();
    // Read as often as their cost allows (half a percent of the program's time): several in 14 steps.
    assert!(readings.len() >= 4, "{readings:?}");
    let j = json("oom", &trace);
    let e = &j["ooms"][0];
    assert_eq!(e["cause"], "growth", "{}", text("oom", &trace));
    assert_eq!(e["growth"]["unit"], "optimizer_steps");
    assert_eq!(e["growth"]["per_step_bytes"].as_u64(), Some(128 * MIB));
    assert!(e["growth"]["steps"].as_u64().unwrap() + 2 >= kept, "{kept}");
    let h = &e["holders"]["holders"][0];
    assert_eq!(
        (h["kind"].as_str(), h["name"].as_str()),
        (Some("variable"), Some("kept"))
    );
    assert_eq!(h["scope"], "global of __main__");
    assert_eq!(h["tensors"].as_u64(), Some(kept));
    assert_eq!(h["bytes"].as_u64(), Some(kept * 128 * MIB));
    let advice: Vec<&str> = e["advice"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    // Named as the program names it: its bytes and scope are HELD BY's.
    assert!(
        advice[0].starts_with("`kept`: store what you need"),
        "{advice:?}"
    );
    assert!(advice
        .iter()
        .all(|a| !a.contains("--cap") && !a.contains("PYTORCH_CUDA_ALLOC_CONF")));
    let screen = text("oom", &trace);
    assert!(
        screen.contains("HELD BY (what kept the tensors alive at the error"),
        "{screen}"
    );
}

/// A running total of losses kept with their graphs: the graph behind the variable is named, with the
/// iterations it spans, and the advice says no_grad.
#[test]
fn a_running_total_that_keeps_its_graphs_is_named_by_its_variable() {
    let (_fake, r, trace) = keep_steps("graph", &["--cap", "2GiB"], &["128", "100", "30", "graph"]);
    assert_eq!(r.status.code(), Some(3), "{}", r.stderr);
    let j = json("oom", &trace);
    let e = &j["ooms"][0];
    assert_eq!(e["cause"], "growth");
    let h = &e["holders"]["holders"][0];
    assert_eq!(
        (h["kind"].as_str(), h["name"].as_str()),
        (Some("graph"), Some("total"))
    );
    assert!(h["batches"].as_u64().unwrap() >= 10, "{h}");
    assert!(e["advice"][0].as_str().unwrap().contains("torch.no_grad()"));
}

/// Without an error: the report names the growth per step, and the bridge's walk at exit names the list. A
/// steady loop of the same program is not growth.
#[test]
fn report_names_growth_in_steps_and_its_holder_at_exit_and_not_a_steady_loop() {
    let (_fake, r, trace) = keep_steps("free", &[], &["32", "40", "20", "keep"]);
    assert!(r.success(), "{}", r.stderr);
    let j = json("report", &trace);
    let leak = &j["devices"][0]["framework"]["allocated_leak"];
    assert_eq!(leak["unit"], "optimizer_steps", "{j}");
    assert_eq!(leak["per_step_bytes"].as_u64(), Some(32 * MIB));
    let walk = &j["bridge"]["walks"][0];
    assert_eq!(walk["at"], "exit");
    assert_eq!(walk["holders"][0]["name"], "kept");
    assert_eq!(walk["holders"][0]["tensors"].as_u64(), Some(40));
    assert!(text("report", &trace).contains("held at exit by kept (list, global of __main__)"));

    let (_fake, r, trace) = keep_steps("steady", &[], &["32", "60", "20", "steady"]);
    assert!(r.success(), "{}", r.stderr);
    let j = json("report", &trace);
    assert!(
        j["devices"][0]["framework"]["allocated_leak"].is_null(),
        "{j}"
    );
    assert!(j["devices"][0]["growth"].is_null(), "{j}");
    assert_eq!(j["bridge"]["walks"].as_array().map(Vec::len), Some(0));
}

/// A program on the driver alone (no bridge) keeping 32 MiB a round fills a 1 GiB cap in half a second: growth
/// by the driver-level rule (cycles of its allocations), at the round's figure; 30 rounds without an error are
/// growth in the report.
#[test]
fn a_driver_program_keeping_memory_each_round_is_growth_in_cycles() {
    let fake = FakeCuda::new().env("FAKECUDA_DEVICES", "1");
    let prog = script("driver_keep_loop.py").display().to_string();
    let (r, trace) = fake.traced("cycles", &["--cap", "1GiB"], "python3", &[&prog, "1000"]);
    assert_eq!(r.status.code(), Some(1), "{}", r.stderr);
    let j = json("oom", &trace);
    let e = &j["ooms"][0];
    assert_eq!(e["cause"], "growth", "{}", text("oom", &trace));
    assert_eq!(e["growth"]["unit"], "driver_cycles");
    assert_eq!(e["growth"]["per_step_bytes"].as_u64(), Some(32 * MIB));
    assert!(!text("oom", &trace).contains("--cap 1.25GiB"));

    let (r, trace) = fake.traced("cycles_free", &[], "python3", &[&prog, "30"]);
    assert!(r.success(), "{}", r.stderr);
    let j = json("report", &trace);
    let g = &j["devices"][0]["growth"];
    assert_eq!(g["per_step_bytes"].as_u64(), Some(32 * MIB), "{j}");
}

/// Losses kept as tensors (512 bytes a step): no growth verdict, a small growth in the report, named with the
/// list the walk found at exit.
#[test]
fn a_few_bytes_kept_each_step_is_a_small_growth_named_with_its_holder() {
    let (_fake, r, trace) = keep_steps("small", &[], &["0", "45", "15", "small"]);
    assert!(r.success(), "{}", r.stderr);
    let j = json("report", &trace);
    let f = &j["devices"][0]["framework"];
    assert!(f["allocated_leak"].is_null(), "{f}");
    assert_eq!(
        f["small_growth"]["per_step_bytes"].as_u64(),
        Some(512),
        "{f}"
    );
    assert!(f["small_growth"]["steps"].as_u64().unwrap() >= 32);
    let t = text("report", &trace)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(t.contains("Small growth"), "{t}");
    assert!(
        t.contains("held at exit by kept (list, global of __main__)"),
        "{t}"
    );
}

/// bridge_peaks.py `mode` under `vramtrace run` on one simulated GPU with the fake torch and `env`: the run, its
/// trace, and PyTorch's max_memory_allocated() and max_memory_reserved() as the program printed them.
fn peaks_run(
    mode: &str,
    env: &[(&str, &str)],
) -> (FakeCuda, vramtrace_e2e::RunResult, PathBuf, [u64; 2]) {
    let fake = FakeCuda::new().env("FAKECUDA_DEVICES", "1");
    let site = fake_torch(&fake);
    let fake = env
        .iter()
        .fold(fake.env("PYTHONPATH", &site), |f, (k, v)| f.env(k, v));
    let prog = [script("bridge_peaks.py").display().to_string(), mode.into()];
    let (r, trace) = fake.traced(&format!("peaks_{mode}"), &[], "python3", &prog);
    r.assert_success(mode);
    let said: Vec<u64> = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("PEAK "))
        .expect("the program's PEAK line")
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    (fake, r, trace, [said[0], said[1]])
}

/// Issue 53: a GPT-2 run's report said an allocated peak of 2.72 GiB where PyTorch's max_memory_allocated() said
/// 8.09: the samples missed the activations, which live between two of them. The bridge sends PyTorch's own peak
/// counters, and the report's figures are PyTorch's, also when the program resets its counters before the sampler
/// looks again.
#[test]
fn the_reports_peaks_are_pytorchs_own_between_samples_and_across_a_reset() {
    for mode in ["plain", "reset"] {
        let (_fake, _, trace, said) = peaks_run(mode, &[]);
        assert_eq!(said, [512 * MIB, 512 * MIB], "{mode}");
        let j = json("report", &trace);
        let d = &j["devices"][0]["framework"];
        assert_eq!(d["peak_allocated_bytes"].as_u64(), Some(said[0]), "{mode}");
        assert_eq!(d["peak_reserved_bytes"].as_u64(), Some(said[1]), "{mode}");
        assert!(d["peak_allocated_time_ns"].is_u64(), "{mode}");
        let p = &j["processes"][0]["framework"][0];
        assert_eq!(p["peak_allocated_bytes"].as_u64(), Some(said[0]), "{mode}");
        assert_eq!(
            p["last"]["allocated_bytes"].as_u64(),
            Some(64 * MIB),
            "{mode}"
        );
        let txt = text("report", &trace);
        assert!(
            txt.contains("allocated peak 512.00 MiB at "),
            "{mode}: {txt}"
        );
    }
}

/// PYTORCH_NO_CUDA_MEMORY_CACHING=1: PyTorch keeps no figures (its stats are zeros, as it prints them); the
/// report shows none of its allocator and says why, and the driver's figures are its tensors.
#[test]
fn caching_off_shows_no_allocator_figures_and_says_why() {
    let (_fake, _, trace, said) = peaks_run("plain", &[("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")]);
    assert_eq!(said, [0, 0]);
    let j = json("report", &trace);
    assert!(
        j["bridge"]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m.to_string().contains("PYTORCH_NO_CUDA_MEMORY_CACHING=1")),
        "{}",
        j["bridge"]
    );
    assert!(j["devices"][0]["framework"].is_null());
    // The driver saw every tensor: the activations are the device's peak.
    assert_eq!(j["devices"][0]["peak_bytes"].as_u64(), Some(512 * MIB));
    let txt = text("report", &trace);
    assert!(txt.contains("caching allocator is off"), "{txt}");
    assert!(!txt.contains("PyTorch's allocator ("), "{txt}");
}

//! The Python bridge end to end: real Python processes under `vramtrace run`, on the simulated driver, with the
//! stand-in torch of bridge/tests/faketorch (PyTorch's lazy initialisation, observer and stats semantics over a
//! toy caching allocator whose segments come from the driver). Checks what the driver saw, what the trace
//! holds, and what `vramtrace oom`/`report` conclude.

use std::path::{Path, PathBuf};
use std::process::Command;

use vramtrace_e2e::traced::{read_trace, vramtrace};
use vramtrace_e2e::{FakeCuda, MIB};
use vramtrace_format::{Api, Framework};

const GIB: u64 = 1 << 30;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn script(name: &str) -> PathBuf {
    repo().join("tests/e2e/py").join(name)
}

/// The fake torch under `<dir>/site-packages/torch`, where PyTorch lives in a real installation (so its frames
/// are library frames, as PyTorch's are). Returns the directory to put on PYTHONPATH.
fn fake_torch(fake: &FakeCuda) -> PathBuf {
    let site = fake.dir().join("site-packages");
    let dst = site.join("torch");
    std::fs::create_dir_all(&dst).unwrap();
    let src = repo().join("bridge/tests/faketorch/torch");
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        if e.file_name().to_string_lossy().ends_with(".py") {
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
    }
    site
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
    assert_eq!(attach[0].1.field("torch"), Some("0.0-fake"));
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

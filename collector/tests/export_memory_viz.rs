//! `vramtrace export --format memory-viz`: the pickle is read back by python3's own pickle and checked as
//! PyTorch's memory_viz would read it (tests/memory_viz_check.py: its opcodes, integers in 64-bit signed,
//! blocks tiling their segments, and "Allocator State History" replaying the trace backwards from the final
//! segments without disagreement), for a synthetic trace and for the GPU fixtures.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::cli::{assert_usage_error, text, TempDir};
use common::*;
use vramtrace_collector::model::Analysis;
use vramtrace_collector::whatif::trace_file::analyze;

fn export(trace: &Path, out: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .arg("export")
        .arg(trace)
        .args(["--format", "memory-viz", "--out"])
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

/// The checker's JSON summary (it fails the test on any disagreement).
fn check(pickle: &Path) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/memory_viz_check.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(pickle)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

/// A figure from the checker's JSON, by a Python expression over it (`d`).
fn figure(summary: &str, expr: &str) -> String {
    common::cli::python_check(summary.as_bytes(), &format!("print({expr})"))
        .trim()
        .to_string()
}

fn exported(dir: &TempDir, trace: &Path, extra: &[&str]) -> (Analysis, String) {
    let out = dir.0.join("out.pickle");
    let _ = std::fs::remove_file(&out);
    let o = export(trace, &out, extra);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    (analyze(trace).unwrap(), check(&out))
}

#[test]
fn a_synthetic_trace_replays_backwards_from_its_segments() {
    let dir = TempDir::new("mv-synthetic");
    let t = dir.file("t.vtrace", &export_trace());
    let (a, s) = exported(&dir, &t, &[]);
    // Device 0: pointer allocations only, so its segments' peak is the report's.
    assert_eq!(
        figure(&s, "d['devices']['0']['peak_segment_bytes']"),
        a.device(0).unwrap().peak_bytes.to_string()
    );
    // Process 11 still runs at the end, holding the 8 MiB block; 12's memory went with it.
    assert_eq!(figure(&s, "d['segments']"), "1");
    assert_eq!(
        figure(&s, "d['devices']['0']['final_segment_bytes']"),
        (8 * MIB).to_string()
    );
    assert_eq!(
        figure(&s, "d['devices']['0']['initial_segment_bytes']"),
        "0"
    );
    assert_eq!(
        figure(&s, "d['devices']['0']['ooms']"),
        format!("[{{'device_free': {}, 'size': {}}}]", 3 * GIB, 80 * GIB)
    );
    // The mapping is drawn on device 1 (its handle's), mapped and unmapped.
    assert_eq!(
        figure(&s, "d['devices']['1']['actions']"),
        "['alloc', 'free_completed', 'oom', 'segment_alloc', 'segment_free', 'segment_map', 'segment_unmap']"
    );
    // The clash of addresses and the handle are said.
    let notes = figure(&s, "'\\n'.join(d['notes'])");
    assert!(notes.contains("2 allocations were at addresses"), "{notes}");
    assert!(notes.contains("1 cuMemCreate handles"), "{notes}");
}

#[test]
fn call_sites_are_the_frames() {
    let dir = TempDir::new("mv-frames");
    let t = dir.file("t.vtrace", &export_trace());
    let out = dir.0.join("f.pickle");
    assert_eq!(export(&t, &out, &[]).status.code(), Some(0));
    let got = Command::new("python3")
        .args([
            "-c",
            "import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); \
             e=[x for x in d['device_traces'][0] if x['action']=='alloc'][0]; \
             print(e['frames'], e['size'], e['time_us'])",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(
        text(&got.stdout).trim(),
        format!(
            "[{{'filename': 'train.py', 'line': 42, 'name': 'step'}}, {{'filename': 'train.py', 'line': 7, \
             'name': '<module>'}}] {} {}",
            2 * GIB,
            header().start_unix_ns / 1000 + 1000
        )
    );
}

#[test]
fn the_gpu_fixtures_export_consistently() {
    let dir = TempDir::new("mv-gpu");
    for name in [
        "keep.vtrace",
        "frag.vtrace",
        "backward.vtrace",
        "huge.vtrace",
    ] {
        let (a, s) = exported(&dir, &fixture(name), &[]);
        let d = a.device(0).unwrap();
        assert_eq!(
            figure(&s, "d['devices']['0']['peak_segment_bytes']"),
            d.peak_bytes.to_string(),
            "{name}"
        );
        // Every out-of-memory request the driver saw, with its free bytes.
        let ooms = figure(&s, "len(d['devices']['0']['ooms'])");
        assert_ne!(ooms, "0", "{name}");
        assert_eq!(
            figure(&s, "d['devices']['0']['ooms'][0]['size']"),
            a.ooms[0].requested_bytes.to_string(),
            "{name}"
        );
    }
}

#[test]
fn a_long_trace_keeps_its_last_events_and_says_so() {
    let dir = TempDir::new("mv-cap");
    let (_, s) = exported(&dir, &fixture("keep.vtrace"), &["--max-events", "25"]);
    assert_eq!(figure(&s, "d['devices']['0']['events']"), "25");
    let notes = figure(&s, "'\\n'.join(d['notes'])");
    assert!(notes.contains("the last 25 of 418 events"), "{notes}");
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let dir = TempDir::new("mv-bad");
    let out = dir.0.join("o.pickle");
    let o = export(&dir.0.join("missing.vtrace"), &out, &[]);
    assert_usage_error(&o, "missing.vtrace");
    assert!(!out.exists(), "nothing half-written is left");
    let junk = dir.file("junk.vtrace", b"not a trace at all");
    assert_usage_error(&export(&junk, &out, &[]), "junk.vtrace");
    assert!(!out.exists());
    std::fs::write(&out, b"keep me").unwrap();
    let t = dir.file("t.vtrace", &export_trace());
    assert_usage_error(&export(&t, &out, &[]), "--force");
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
    assert_eq!(export(&t, &out, &["--force"]).status.code(), Some(0));
}

#[test]
fn pytorchs_own_tensor_history_rides_beside_the_driver_view() {
    // keep.vtrace ran with --torch-history: the bridge kept PyTorch's snapshot beside it at the OOM. The export
    // carries PyTorch's own events and segments for that process and GPU as a device after the real ones.
    let dir = TempDir::new("mv-torch");
    let (_, s) = exported(&dir, &fixture("keep.vtrace"), &[]);
    assert_eq!(figure(&s, "d['devices']['1']['torch']"), "True");
    let raw = fixture("keep.vtrace.torch-507-oom1.pickle");
    let want = common::cli::python_check(
        b"{}",
        &format!(
            "import pickle; r = pickle.load(open({:?}, 'rb')); \
             print(len(r['device_traces'][0]), len(r['segments']), sum(s['total_size'] for s in r['segments']))",
            raw.display().to_string()
        ),
    );
    let got = figure(
        &s,
        "f\"{d['devices']['1']['events']} {d['devices']['1']['segments']} {d['devices']['1']['segment_bytes']}\"",
    );
    assert_eq!(got, want.trim());
    let notes = figure(&s, "'\\n'.join(d['notes'])");
    assert!(
        notes.contains("device 1: pid 507 GPU 0: PyTorch's own allocator history"),
        "{notes}"
    );
    // Without the snapshot beside it, the export says so and keeps the driver view alone.
    let alone = dir.file(
        "alone.vtrace",
        &std::fs::read(fixture("keep.vtrace")).unwrap(),
    );
    let out = dir.0.join("alone.pickle");
    let o = export(&alone, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let s = check(&out);
    assert_eq!(figure(&s, "len(d['devices'])"), "1");
    assert!(
        text(&o.stderr).contains("no PyTorch snapshot could be read"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn several_traces_of_one_job_are_one_snapshot_each_hosts_devices_apart() {
    let dir = TempDir::new("mv-hosts");
    // node-b started 2.5 s after node-a: given first, its devices still come second, on node-a's clock.
    let (a, b) = two_node_traces(&dir);
    let out = dir.0.join("job.pickle");
    let o = export_several(&[&b, &a], "memory-viz", &out);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let s = check(&out);
    // Each host's GPU 0 is a device of its own, replaying to its own peak.
    assert_eq!(
        figure(
            &s,
            "[d['devices'][k]['peak_segment_bytes'] for k in ('0', '1')]"
        ),
        format!("[{}, {}]", 12 * MIB, 6 * MIB)
    );
    assert_eq!(
        figure(
            &s,
            "[(h['host'], h['first_device'], h['devices'], h['offset_ns']) for h in d['hosts']]"
        ),
        "[('node-a', 0, 1, 0), ('node-b', 1, 1, 2500000000)]"
    );
    // Times on the job's clock: node-b's first event 2.5 s after node-a's (both 10 ms into their traces).
    assert_eq!(
        figure(&s, "d['first_time_us'][1] - d['first_time_us'][0]"),
        "2500000"
    );
    assert_refused_together(&dir, &a, "memory-viz");
}

/// Hostile input (issue 25): one forged allocation near 2^64 bytes, and another at an address it overlaps.
/// The export ends, in bounded time, with a pickle Python reads.
#[test]
fn a_forged_allocation_near_two_to_the_sixty_four_bytes_ends_the_export() {
    let dir = TempDir::new("mv-forged");
    let recs = vec![
        hello(100, 0),
        events(
            100,
            vec![
                alloc(1, 0, 0x1000, u64::MAX - 4095),
                alloc(2, 0, 0x2000, u64::MAX / 2),
                alloc(3, 0, 0x1000, 4096),
                alloc(4, 0, u64::MAX - 10, 1 << 20),
            ],
        ),
        end(100, 10, vramtrace_format::EndKind::Goodbye),
    ];
    let t = dir.file("t.vtrace", &trace(&recs));
    let out = dir.0.join("o.pickle");
    let start = std::time::Instant::now();
    let o = export(&t, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(start.elapsed().as_secs() < 30, "{:?}", start.elapsed());
    let s = check(&out);
    assert!(!s.is_empty());
}

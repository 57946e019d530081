//! `vramtrace export --format memory-viz`: the pickle is read back by python3's own pickle and checked as
//! PyTorch's memory_viz would read it (tests/memory_viz_check.py: its opcodes, integers in 64-bit signed,
//! blocks tiling their segments, and "Allocator State History" replaying the trace backwards from the final
//! segments without disagreement), for a synthetic trace and for the GPU fixtures.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::cli::{assert_usage_error, text, TempDir};
use common::*;
use vramtrace_collector::model::{analyze, Analysis};
use vramtrace_format::{flags, Api, EndKind, Oom, Record, NO_DEVICE};

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

fn oom(pid: u32, ms: u64, device: u32, requested: u64, free: u64, cap_refused: bool) -> Record {
    Record::Oom(Oom {
        pid,
        tid: 1,
        ts_ns: START + ms * MS,
        device,
        api: Api::MemAlloc as u8,
        flags: if cap_refused { flags::CAP_REFUSED } else { 0 },
        requested_bytes: requested,
        result: 2,
        device_free_bytes: Some(free),
        device_total_bytes: Some(80 * GIB),
        cap_bytes: None,
        job_used_bytes: None,
        process_used_bytes: None,
        extra: vec![],
    })
}

/// Two processes on two devices: call sites, a lost free, the same address in both processes at once, an
/// address past 2^63, a process ending with memory held, a cuMemCreate handle mapped and unmapped, an OOM.
fn synthetic() -> Vec<u8> {
    let mut create = ev(5, Api::MemCreate, 1, 7, 64 * MIB);
    create.stack = 2;
    let mut map = ev(6, Api::MemMap, NO_DEVICE, 0x7f00_0000_0000, 64 * MIB);
    map.aux = 7;
    let unmap = ev(30, Api::MemUnmap, NO_DEVICE, 0x7f00_0000_0000, 64 * MIB);
    let release = ev(31, Api::MemRelease, NO_DEVICE, 7, 0);
    trace(&[
        hello(11, 0),
        hello(12, 0),
        stack(
            11,
            1,
            vec![],
            vec![py("train.py", "step", 42), py("train.py", "<module>", 7)],
        ),
        stack(11, 2, vec![], vec![py("model.py", "grow", 9)]),
        events(
            11,
            vec![
                with_stack(alloc(1, 0, 0xa000_0000, 2 * GIB), 1),
                alloc(2, 0, 0x3_0000_0000, 4 * MIB),
                // The same pointer again: its free was not recorded.
                alloc(3, 0, 0x3_0000_0000, 8 * MIB),
                create,
                map,
                free(20, 0xa000_0000),
                unmap,
                release,
            ],
        ),
        // Process 12 holds the same address as 11 at the same time (each process has its own), and one past
        // 2^63 that must still be written as a 64-bit signed integer.
        events(
            12,
            vec![
                alloc(4, 0, 0xa000_0000, GIB),
                alloc(8, 1, 0x8000_0000_0000_1000, 32 * MIB),
            ],
        ),
        oom(11, 25, 0, 80 * GIB, 3 * GIB, false),
        tick(11, 40),
        end(12, 50, EndKind::Vanished),
        tick(11, 60),
    ])
}

#[test]
fn a_synthetic_trace_replays_backwards_from_its_segments() {
    let dir = TempDir::new("mv-synthetic");
    let t = dir.file("t.vtrace", &synthetic());
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
        "['alloc', 'free_completed', 'segment_alloc', 'segment_free', 'segment_map', 'segment_unmap']"
    );
    // The clash of addresses and the handle are said.
    let notes = figure(&s, "'\\n'.join(d['notes'])");
    assert!(notes.contains("2 allocations were at addresses"), "{notes}");
    assert!(notes.contains("1 cuMemCreate handles"), "{notes}");
}

#[test]
fn call_sites_are_the_frames() {
    let dir = TempDir::new("mv-frames");
    let t = dir.file("t.vtrace", &synthetic());
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

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gpu")
        .join(name)
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
    let t = dir.file("t.vtrace", &synthetic());
    assert_usage_error(&export(&t, &out, &[]), "--force");
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
    assert_eq!(export(&t, &out, &["--force"]).status.code(), Some(0));
}

//! `vramtrace export --format perfetto`: the trace is decoded by tests/perfetto_check.py, a protobuf
//! wire-format walker with Perfetto's field numbers (independent of the exporter's prost structs), and its
//! counters must peak at the report's figures, per device for the job and per process per device.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::cli::{assert_usage_error, python_check, text, TempDir};
use common::*;
use vramtrace_collector::model::Analysis;
use vramtrace_collector::reporters::perfetto::{device_track, process_device_track, process_track};
use vramtrace_collector::whatif::trace_file::analyze;

fn export(trace: &Path, out: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .arg("export")
        .arg(trace)
        .args(["--format", "perfetto", "--force", "--out"])
        .arg(out)
        .output()
        .unwrap()
}

/// The decoded trace's summary (JSON); the decoder fails the test on anything malformed.
fn decoded(dir: &TempDir, trace: &Path) -> (Analysis, String) {
    let out = dir.0.join("out.pftrace");
    let o = export(trace, &out);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/perfetto_check.py");
    let d = Command::new("python3")
        .arg(script)
        .arg(&out)
        .output()
        .expect("python3");
    assert!(d.status.success(), "{}", text(&d.stderr));
    if let Ok(protos) = std::env::var("VRAMTRACE_PERFETTO_PROTOS") {
        decode_with_perfettos_protos(&protos, &out);
    }
    (analyze(trace).unwrap(), text(&d.stdout))
}

/// With Perfetto's own protos (a checkout of google/perfetto in VRAMTRACE_PERFETTO_PROTOS) and `protoc`:
/// `protoc --decode perfetto.protos.Trace` reads it with no field it does not know.
fn decode_with_perfettos_protos(root: &str, file: &Path) {
    let o = Command::new("protoc")
        .args(["--decode", "perfetto.protos.Trace", "-I", root])
        .arg(format!("{root}/protos/perfetto/trace/trace.proto"))
        .stdin(std::fs::File::open(file).unwrap())
        .output()
        .expect("protoc");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let t = text(&o.stdout);
    assert!(t.contains("track_descriptor {"), "{t}");
    assert!(
        !t.lines()
            .any(|l| l.trim_start().starts_with(char::is_numeric)),
        "fields protoc does not know: {t}"
    );
}

fn q(summary: &str, expr: &str) -> String {
    python_check(summary.as_bytes(), &format!("print({expr})"))
        .trim()
        .to_string()
}

/// Every device's job counter and every process's counter per device peak at the report's figures.
fn assert_peaks(a: &Analysis, s: &str, what: &str) {
    for d in &a.devices {
        assert_eq!(
            q(
                s,
                &format!(
                    "d['counters'].get('{}', {{'max': 0}})['max']",
                    device_track(d.device)
                )
            ),
            d.peak_bytes.to_string(),
            "{what}: {:?}",
            d.device
        );
    }
    for (slot, p) in a.processes.iter().enumerate() {
        for pd in &p.per_device {
            let t = process_device_track(slot, pd.device);
            assert_eq!(
                q(s, &format!("d['counters']['{t}']['max']")),
                pd.peak_bytes.to_string(),
                "{what}: pid {} {:?}",
                p.pid,
                pd.device
            );
        }
    }
}

#[test]
fn counters_peak_at_the_reports_figures_and_instants_name_their_sites() {
    let dir = TempDir::new("pf-synthetic");
    let t = dir.file("t.vtrace", &export_trace());
    let (a, s) = decoded(&dir, &t);
    assert_peaks(&a, &s, "synthetic");
    // Process 12 ended holding memory: its counter comes back to 0 there; 11 still holds 8 MiB + the handle.
    let p12 = process_device_track(1, Some(0));
    assert_eq!(q(&s, &format!("d['counters']['{p12}']['last']")), "0");
    // The process tracks are named by rank and command, with pid and command line.
    let p11 = process_track(0);
    assert_eq!(
        q(&s, &format!("d['tracks']['{p11}']['process_name']")),
        "rank 1: worker11 --x (pid 11)"
    );
    assert_eq!(
        q(&s, &format!("d['tracks']['{p11}']['cmdline']")),
        "['/usr/bin/worker11', '--x']"
    );
    // Instants: the OOM with the driver's free bytes, the cap refusal, the allocation with its call site.
    let names = q(&s, "sorted(i['name'] for i in d['instants'])");
    assert_eq!(
        names,
        "['alloc 2.00 GiB', 'alloc 64.00 MiB', 'cap refused 16.00 GiB', 'out of memory: 80.00 GiB requested']"
    );
    assert_eq!(
        q(
            &s,
            "[i['annotations']['device_free_bytes'] for i in d['instants'] if i['name'].startswith('out')]"
        ),
        format!("[{}]", 3 * GIB)
    );
    assert_eq!(
        q(
            &s,
            "[i['annotations']['call_site'] for i in d['instants'] if i['name'] == 'alloc 2.00 GiB']"
        ),
        "['train.py:42 in step']"
    );
}

#[test]
fn the_gpu_fixtures_peak_at_the_reports_figures() {
    let dir = TempDir::new("pf-gpu");
    for name in [
        "keep.vtrace",
        "frag.vtrace",
        "backward.vtrace",
        "huge.vtrace",
    ] {
        let (a, s) = decoded(&dir, &fixture(name));
        assert_peaks(&a, &s, name);
        // Each out-of-memory request the driver (or the cap) refused, with the request's size.
        let ooms = q(
            &s,
            "[i['annotations']['bytes'] for i in d['instants'] if i['categories'] == ['oom']][:1]",
        );
        assert_eq!(ooms, format!("[{}]", a.ooms[0].requested_bytes), "{name}");
    }
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let dir = TempDir::new("pf-bad");
    let out = dir.0.join("o.pftrace");
    let junk = dir.file("junk.vtrace", b"not a trace at all");
    assert_usage_error(&export(&junk, &out), "junk.vtrace");
    assert!(!out.exists(), "nothing half-written is left");
}

#[test]
fn several_traces_of_one_job_go_into_one_file_each_host_apart_on_one_clock() {
    let dir = TempDir::new("pf-hosts");
    // node-b started 2.5 s after node-a (wall clock); their monotonic clocks have nothing in common.
    let (a, b) = two_node_traces(&dir);
    let out = dir.0.join("job.pftrace");
    let o = export_several(&[&b, &a], "perfetto", &out);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let d = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/perfetto_check.py"))
        .arg(&out)
        .output()
        .unwrap();
    assert!(d.status.success(), "{}", text(&d.stderr));
    let s = text(&d.stdout);
    // One job counter per host's GPU, named by host, peaking at that trace's own peak.
    let peaks = q(
        &s,
        "sorted((t['name'], d['counters'][u]['max']) for u, t in d['tracks'].items() if '(job)' in t['name'])",
    );
    assert_eq!(
        peaks,
        format!(
            "[('node-a: GPU 0 bytes in use (job)', {}), ('node-b: GPU 0 bytes in use (job)', {})]",
            8 * MIB + 4 * MIB,
            4 * MIB + 2 * MIB
        )
    );
    // Both processes have tracks of their own (the same pid on two hosts).
    assert_eq!(
        q(&s, "sum(1 for t in d['tracks'].values() if t['pid'] == 21)"),
        "2"
    );
    // Clocks aligned by the wall-clock starts: node-b's first value 2.5 s after node-a's.
    let gap = q(
        &s,
        "(lambda f: f['node-b'] - f['node-a'])({t['name'].split(':')[0]: d['counters'][u]['first_ts'] \
         for u, t in d['tracks'].items() if '(job)' in t['name']})",
    );
    assert_eq!(gap, "2500000000");
    // Traces of different jobs are refused, and nothing is written.
    assert_refused_together(&dir, &a, "perfetto");
}

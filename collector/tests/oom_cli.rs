//! `vramtrace oom` through the real binary: exit codes, one-line errors, a trace without an out-of-memory event,
//! a truncated trace whose event is whole, and the JSON (parsed by python3).

mod common;

use common::cli::*;

use std::path::Path;
use std::process::{Command, Output};

use common::*;
use vramtrace_format::codec::encode_header;
use vramtrace_format::{flags, Api, EndKind, Event, Oom, Record};

fn oom(file: &Path, json: bool) -> Output {
    vramtrace("oom", file, json)
}

fn refused(ms: u64, size: u64, flag: u8) -> Event {
    let mut e = failed(alloc(ms, 0, 0, size), 2);
    e.flags |= flag;
    e
}

/// Two processes on GPU 0; pid 11 is refused 4 GiB with 3 GiB free of 24 GiB, then SIGKILLed.
fn pressure() -> Vec<Record> {
    vec![
        hello(11, 0),
        hello(12, 0),
        events(
            11,
            vec![
                alloc(10, 0, 0xa000, 12 * GIB),
                ptsz(ev(11, Api::MemAllocAsync, 0, 0xb000, 512 * MIB)),
                alloc(12, 0, 0xc000, 3 * MIB),
                refused(100, 4 * GIB, 0),
            ],
        ),
        events(
            12,
            vec![alloc(20, 0, 0xa000, 6 * GIB), alloc(21, 1, 0xd000, GIB)],
        ),
        tick(12, 200),
        Record::Oom(Oom {
            pid: 11,
            tid: 77,
            ts_ns: START + 100 * MS,
            device: 0,
            api: Api::MemAlloc as u8,
            flags: 0,
            requested_bytes: 4 * GIB,
            result: 2,
            device_free_bytes: Some(3 * GIB),
            device_total_bytes: Some(24 * GIB),
            cap_bytes: None,
            job_used_bytes: None,
            process_used_bytes: None,
            extra: vec![],
        }),
        end(11, 101, EndKind::Vanished),
        events(12, vec![free(300, 0xa000)]),
        end(12, 400, EndKind::Goodbye),
    ]
}

#[test]
fn bad_files_are_one_line_and_exit_2() {
    let d = TempDir::new("errors");
    assert_usage_error(&oom(&d.0.join("missing.vtrace"), false), "cannot read");
    assert_usage_error(&oom(&d.file("empty.vtrace", b""), true), "empty");
    assert_usage_error(
        &oom(&d.file("junk.vtrace", b"this is not a trace at all"), false),
        "not a vramtrace trace",
    );
    let mut newer = encode_header(&header());
    newer[8..10].copy_from_slice(&(vramtrace_format::VERSION + 1).to_le_bytes());
    assert_usage_error(&oom(&d.file("newer.vtrace", &newer), true), "newer");
}

#[test]
fn a_trace_without_an_oom_says_so_and_exits_0() {
    let d = TempDir::new("none");
    let f = d.file(
        "t.vtrace",
        &trace(&[
            hello(11, 0),
            events(11, vec![alloc(10, 0, 0xa000, GIB)]),
            end(11, 50, EndKind::Vanished),
        ]),
    );
    let out = oom(&f, false);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.starts_with("vramtrace oom: "), "{s}");
    assert!(s.contains("No out-of-memory error was recorded."), "{s}");
    assert!(s.contains("vanished"), "{s}");
    let out = oom(&f, true);
    assert_eq!(out.status.code(), Some(0));
    let checked = python_check(
        &out.stdout,
        r#"
assert d["version"] == 1 and d["kind"] == "oom"
assert d["oom_recorded"] is False and d["ooms"] == [] and d["oom_records"] == 0
assert d["message"] == "no out-of-memory event was recorded"
p, = d["processes"]
assert p["pid"] == 11 and p["ended"] == "vanished" and p["end_ns"] == 50 * 10**6
assert p["live_at_end_bytes"] == 1 << 30 and p["live_at_end"] == [{"device": 0, "on_host": False, "bytes": 1 << 30}]
g, = d["devices"]
assert g["peak_bytes"] == 1 << 30 and g["total_bytes"] is None and g["headroom_bytes"] is None
print("ok")
"#,
    );
    assert_eq!(checked.trim(), "ok");
    // Nothing at all in the trace: still exit 0.
    let f = d.file("empty-trace.vtrace", &encode_header(&header()));
    let out = oom(&f, false);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("No out-of-memory error was recorded."));
}

#[test]
fn a_truncated_trace_whose_oom_is_whole_is_reported_with_where_it_stops() {
    let d = TempDir::new("cut");
    let full = trace(&pressure());
    // The last frame (pid 12's goodbye end) is cut in the middle.
    let f = d.file("cut.vtrace", &full[..full.len() - 3]);
    let out = oom(&f, false);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.contains("PARTIAL TRACE: the trace is cut short"), "{s}");
    assert!(
        s.contains("the out-of-memory records below are whole"),
        "{s}"
    );
    assert!(s.contains("OUT OF MEMORY on GPU 0 at 0.100 s"), "{s}");
    assert!(s.contains("CAUSE: pressure"), "{s}");
    let out = oom(&f, true);
    let checked = python_check(
        &out.stdout,
        r#"
assert d["partial"] is True and d["stopped"].startswith("the trace is cut short")
assert d["ooms"][0]["cause"] == "pressure"
print("ok")
"#,
    );
    assert_eq!(checked.trim(), "ok");
}

#[test]
fn the_json_parses_and_has_the_documented_fields() {
    let d = TempDir::new("json");
    let f = d.file("t.vtrace", &trace(&pressure()));
    let out = oom(&f, true);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let checked = python_check(
        &out.stdout,
        r#"
G = 1 << 30
M = 1 << 20
assert d["version"] == 1 and d["kind"] == "oom" and d["oom_recorded"] is True and d["message"] is None
assert d["oom_records"] == 1 and d["oom_not_analysed"] == 0 and d["oom_results"] == 1
o, = d["ooms"]
for k in ["time_ns", "pid", "tid", "device", "api", "requested_bytes", "cause", "cause_rule", "cause_reason",
          "device_free_bytes", "device_total_bytes", "job_live_bytes", "job_live_source", "cap_bytes",
          "shortfall_bytes", "outside_job_bytes", "context_estimate_bytes", "outside_excess_bytes",
          "job_processes_on_device", "async_freed_recent_bytes", "needed_bytes", "available_bytes",
          "short_of_fitting_bytes", "suggested_cap_bytes", "top_live", "advice", "processes", "size_classes",
          "timeline", "timeline_bucket_ns", "findings"]:
    assert k in o, k
assert o["time_ns"] == 100 * 10**6 and o["pid"] == 11 and o["tid"] == 77 and o["device"] == 0
assert o["api"] == "cuMemAlloc_v2" and o["requested_bytes"] == 4 * G and o["cap_bytes"] is None
assert o["device_free_bytes"] == 3 * G and o["device_total_bytes"] == 24 * G
job = 18 * G + 512 * M + 3 * M
assert o["job_live_bytes"] == job and o["job_live_source"] == "trace" and o["ledger_job_bytes"] is None
assert o["job_processes_on_device"] == 2 and o["context_estimate_bytes"] == 1000 * M
outside = 24 * G - 3 * G - job
assert o["outside_job_bytes"] == outside and o["outside_excess_bytes"] == outside - 1000 * M
assert o["shortfall_bytes"] == G
assert o["cause"] == "pressure" and o["cause_rule"] == "job_fills_device"
assert o["needed_bytes"] == job + 4 * G and o["available_bytes"] == job + 3 * G
assert o["short_of_fitting_bytes"] == G
assert o["suggested_cap_bytes"] == 22 * G + 768 * M
assert o["advice"][0].startswith("Shed at least 1.00 GiB on GPU 0"), o["advice"][0]
assert [l["bytes"] for l in o["top_live"]] == [12 * G, 6 * G, 512 * M, 3 * M]
t = o["top_live"][2]
assert t == {"pid": 11, "tid": 1, "device": 0, "api": "cuMemAllocAsync", "ptsz": True, "address": 0xb000,
             "bytes": 512 * M, "alloc_time_ns": 11 * 10**6, "age_ns": 89 * 10**6}, t
ps = {p["pid"]: p for p in o["processes"]}
assert ps[11]["device_live_bytes"] == 12 * G + 515 * M and ps[11]["on_device"] is True
assert ps[12]["live"] == [{"device": 0, "bytes": 6 * G}, {"device": 1, "bytes": G}]
assert ps[12]["cmdline"] == ["/usr/bin/worker12", "--x"] and ps[12]["rank"] == 2
sc = o["size_classes"]
assert [c["label"] for c in sc] == ["< 1 MiB", "1-16 MiB", "16-256 MiB", "256 MiB-2 GiB", ">= 2 GiB"]
assert [(c["count"], c["bytes"]) for c in sc] == [(0, 0), (1, 3 * M), (0, 0), (1, 512 * M), (2, 18 * G)]
assert sc[4]["max_bytes"] is None and sc[1]["min_bytes"] == M and sc[1]["max_bytes"] == 16 * M
assert o["timeline"][-1]["last_bytes"] == job
assert all(set(b) == {"t_ns", "max_bytes", "last_bytes"} for b in o["timeline"])
fit, = [f for f in o["findings"] if f["kind"] == "fit"]
assert fit["short_bytes"] == G and fit["limited_by"] == "device" and fit["text"]
ends = {p["pid"]: p["ended"] for p in d["processes"]}
assert ends == {11: "vanished", 12: "goodbye"}
g0 = d["devices"][0]
assert g0["total_bytes"] == 24 * G and g0["headroom_bytes"] == 24 * G - job and g0["leak_trend"] is None
print("ok")
"#,
    );
    assert_eq!(checked.trim(), "ok");
    // And the text, through the binary: one screen by default, every section with --full.
    let out = oom(&f, false);
    assert_eq!(out.status.code(), Some(0));
    let s = text(&out.stdout);
    assert!(s.contains("CAUSE: pressure"), "{s}");
    assert!(!s.contains("LARGEST LIVE ALLOCATIONS"), "{s}");
    assert!(s.contains("vramtrace oom --full"), "{s}");
    let out = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .args(["oom", "--full"])
        .arg(&f)
        .output()
        .unwrap();
    let full = text(&out.stdout);
    assert!(full.contains("LARGEST LIVE ALLOCATIONS"), "{full}");
    assert!(full.contains("cuMemAllocAsync_ptsz"), "{full}");
    assert!(full.starts_with(s.lines().next().unwrap()), "{full}");
    assert!(s.contains("thread 77"), "{s}");
    for line in s.lines() {
        assert!(line.chars().count() <= 100, "too wide: {line}");
    }
    // A cap refusal names the cap in the JSON.
    let mut recs = pressure();
    for r in &mut recs {
        if let Record::Oom(o) = r {
            o.flags = flags::CAP_REFUSED;
            o.cap_bytes = Some(20 * GIB);
            o.job_used_bytes = Some(18 * GIB);
        }
    }
    let f = d.file("cap.vtrace", &trace(&recs));
    let out = oom(&f, true);
    let checked = python_check(
        &out.stdout,
        r#"
o = d["ooms"][0]
assert o["cause"] == "cap" and o["cause_rule"] == "cap_refused" and o["cap_refused"] is True
assert o["cap_bytes"] == 20 << 30 and o["job_live_bytes"] == 18 << 30 and o["job_live_source"] == "ledger"
assert any("--cap-mode warn" in a for a in o["advice"])
assert any(f["kind"] == "ledger_differs" for f in o["findings"])
print("ok")
"#,
    );
    assert_eq!(checked.trim(), "ok");
}

/// A failed `cuMemCreate` with a host location (pinned host memory ran out): the shim records it on no device,
/// and shims before 2026-11-22 attached the current GPU's free and total to it. The post-mortem says host
/// memory, never a GPU's cause from a GPU's figures (here they would read as 78 GiB held outside the job).
#[test]
fn a_host_memory_oom_is_host_memory_not_a_gpu_cause() {
    use vramtrace_format::NO_DEVICE;
    let d = TempDir::new("host-oom");
    let mut failed = common::ev(20, Api::MemCreate, NO_DEVICE, 0, 4 * GIB);
    failed.result = 2;
    let mut rec = common::oom(11, 21, NO_DEVICE, 4 * GIB, GIB, false);
    if let Record::Oom(o) = &mut rec {
        o.api = Api::MemCreate as u8;
    }
    let f = d.file(
        "t.vtrace",
        &trace(&[
            hello(11, 0),
            events(11, vec![alloc(10, 0, 0xa000, GIB), failed]),
            rec,
            end(11, 30, EndKind::Goodbye),
        ]),
    );
    let out = oom(&f, true);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    python_check(
        &out.stdout,
        r#"
(o,) = d["ooms"]
assert o["on_host"] is True and o["device"] is None, o
assert o["cause"] == "host_memory" and o["cause_rule"] == "host_memory", (o["cause"], o["cause_rule"])
assert o["device_free_bytes"] is None and o["device_total_bytes"] is None, o
"#,
    );
    let t = text(&oom(&f, false).stdout);
    assert!(t.contains("on host memory"), "{t}");
    assert!(t.contains("pinned host memory ran out"), "{t}");
    assert!(!t.contains("outside the job"), "{t}");
    assert!(!t.contains("could not say how much memory was free"), "{t}");
    assert!(
        t.contains("FIGURES: none; the driver reports no free or total for host memory"),
        "{t}"
    );
}

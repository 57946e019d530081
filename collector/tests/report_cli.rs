//! `vramtrace report` through the real binary: exit codes, one-line errors, the text report and the JSON.

mod common;

use common::cli::*;

use std::path::Path;
use std::process::Output;

use common::*;
use vramtrace_collector::model::analyze_reader;
use vramtrace_collector::verbs::report::summary;
use vramtrace_format::codec::encode_header;
use vramtrace_format::{EndKind, Record};

fn report(file: &Path, json: bool) -> Output {
    vramtrace("report", file, json)
}

fn sample() -> Vec<Record> {
    vec![
        hello(11, 0),
        hello(12, 0),
        events(
            11,
            vec![
                ev(1, vramtrace_format::Api::MemGetInfo, 0, 80 * GIB, 79 * GIB),
                alloc(10, 0, 0xa000, 6 * GIB),
                alloc(11, 0, 0xb000, 512 * MIB),
            ],
        ),
        events(12, vec![alloc(30, 1, 0xa000, GIB), free(35, 0xdead)]),
        events(11, vec![free(20, 0xa000)]),
        end(11, 50, EndKind::Goodbye),
        events(12, vec![alloc(60, 1, 0xc000, 3 * MIB)]),
        Record::Dropped {
            pid: 12,
            ts_ns: START + 61 * MS,
            count: 5,
        },
        tick(12, 1500),
    ]
}

#[test]
fn unreadable_inputs_are_one_line_and_exit_2() {
    let d = TempDir::new("errors");
    assert_usage_error(&report(&d.0.join("missing.vtrace"), false), "cannot read");
    assert_usage_error(&report(&d.0.join("missing.vtrace"), true), "no such file");
    assert_usage_error(&report(&d.file("empty.vtrace", b""), false), "empty");
    assert_usage_error(
        &report(&d.file("junk.vtrace", b"this is not a trace at all"), true),
        "not a vramtrace trace",
    );
    let mut newer = encode_header(&header());
    newer[8..10].copy_from_slice(&(vramtrace_format::VERSION + 1).to_le_bytes());
    assert_usage_error(&report(&d.file("newer.vtrace", &newer), false), "newer");
    let hdr = encode_header(&header());
    assert_usage_error(
        &report(&d.file("header.vtrace", &hdr[..hdr.len() - 3]), false),
        "header",
    );
    let dir = d.0.join("adir");
    std::fs::create_dir_all(&dir).unwrap();
    assert_usage_error(&report(&dir, false), "is a directory");
}

#[test]
fn text_report_has_devices_processes_leaks_and_warnings() {
    let d = TempDir::new("text");
    let f = d.file("t.vtrace", &trace(&sample()));
    let out = report(&f, false);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.starts_with("vramtrace report: "), "{s}");
    assert!(!s.contains("PARTIAL"));
    assert!(
        s.contains("GPU 0  peak 6.50 GiB (6,979,321,856 bytes) at 0.011 s"),
        "{s}"
    );
    assert!(
        s.contains("GPU 1  peak 1.00 GiB (1,076,887,552 bytes) at 0.060 s"),
        "{s}"
    );
    // Control characters in the command are shown escaped, not printed.
    assert!(
        s.contains(r#"command   python train.py --say "hi"\n"#),
        "{s}"
    );
    assert!(
        s.contains("the driver last reported 79.00 GiB free of 80.00 GiB"),
        "{s}"
    );
    assert!(s.contains("worker11 --x"), "{s}");
    assert!(s.contains("still running"), "{s}");
    assert!(s.contains("LIVE AT END: 3 allocations (1.50 GiB)"), "{s}");
    assert!(s.contains("5 events were dropped"), "{s}");
    assert!(s.contains("1 free named no live allocation"), "{s}");
    assert!(s.contains('█'), "{s}");
    for line in s.lines() {
        assert!(line.chars().count() <= 100, "too wide: {line}");
    }
}

#[test]
fn json_report_parses_and_has_the_schema_fields() {
    let d = TempDir::new("json");
    let f = d.file("t.vtrace", &trace(&sample()));
    let out = report(&f, true);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let checked = python_check(
        &out.stdout,
        r#"
assert d["version"] == 1
t = d["trace"]
assert t["command"] == ["python", "train.py", "--say \"hi\"\n"], t
assert t["hostname"] == "node7" and t["start_unix_ns"] == 1700000000000000000 and t["format_version"] == vramtrace_format_version
assert d["partial"] is False and d["stopped"] is None
assert d["events"] == 7 and d["dropped_events"] == 5 and d["unmatched_frees"] == 1
assert d["duration_ns"] == 1500 * 10**6
g0, g1 = d["devices"]
assert g0["device"] == 0 and g0["peak_bytes"] == 6979321856 and g0["peak_time_ns"] == 11 * 10**6
assert g0["driver_total_bytes"] == 80 << 30 and g0["driver_free_bytes"] == 79 << 30
assert g1["driver_total_bytes"] is None
assert g0["live_bytes_at_end"] == 512 << 20 and g0["allocations"] == 2
assert g0["largest_allocation_bytes"] == 6 << 30
assert max(b["max_bytes"] for b in g0["timeline"]) == 6979321856
assert all(set(b) == {"t_ns", "max_bytes", "last_bytes"} for b in g0["timeline"])
p11, p12 = d["processes"]
for p in d["processes"]:
    for k in ["pid", "ppid", "cmdline", "rank", "local_rank", "peak_bytes", "peak_time_ns", "per_device",
              "allocations", "frees", "failed_allocations", "oom_results", "cap_refusals",
              "largest_allocation_bytes", "live_bytes_at_end", "dropped_events", "ended"]:
        assert k in p, k
assert p11["pid"] == 11 and p11["ended"] == "goodbye" and p11["end_ns"] == 50 * 10**6
assert p11["per_device"] == [{"device": 0, "on_host": False, "peak_bytes": 6979321856, "live_bytes_at_end": 512 << 20, "allocations": 2}]
assert p12["ended"] == "running" and p12["dropped_events"] == 5 and p12["unmatched_frees"] == 1
assert p12["rank"] == 2 and p12["cmdline"] == ["/usr/bin/worker12", "--x"]
live = d["live_at_end"]
assert [l["bytes"] for l in live] == [1 << 30, 512 << 20, 3 << 20]
assert live[0] == {"pid": 12, "device": 1, "on_host": False, "api": "cuMemAlloc_v2", "ptsz": False, "address": 0xa000,
                   "bytes": 1 << 30, "alloc_time_ns": 30 * 10**6, "age_ns": 1470 * 10**6}
assert live[1]["age_ns"] == 39 * 10**6
print("ok")
"#,
    );
    assert_eq!(checked.trim(), "ok");
}

#[test]
fn a_cut_trace_is_reported_with_the_note_and_exit_0() {
    let d = TempDir::new("cut");
    let full = trace(&sample());
    let f = d.file("cut.vtrace", &full[..full.len() - 4]);
    let out = report(&f, false);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(
        s.starts_with("PARTIAL TRACE: the trace is cut short"),
        "{s}"
    );
    assert!(s.contains("GPU 0  peak 6.50 GiB"), "{s}");
    let out = report(&f, true);
    assert_eq!(out.status.code(), Some(0));
    let checked = python_check(
        &out.stdout,
        r#"
assert d["partial"] is True
assert d["stopped"].startswith("the trace is cut short"), d["stopped"]
assert d["devices"][0]["peak_bytes"] == 6979321856
print("ok")
"#,
    );
    assert_eq!(checked.trim(), "ok");
}

#[test]
fn an_empty_trace_reports_nothing_allocated() {
    let d = TempDir::new("none");
    let f = d.file("none.vtrace", &encode_header(&header()));
    let out = report(&f, false);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("No GPU memory was allocated"));
    let out = report(&f, true);
    let checked = python_check(
        &out.stdout,
        "assert d['devices'] == [] and d['processes'] == [] and d['live_at_end'] == []\nprint('ok')",
    );
    assert_eq!(checked.trim(), "ok");
}

#[test]
fn summary_names_peaks_processes_and_leaks() {
    let a = analyze_reader(&trace(&sample())[..]).unwrap();
    let s = summary(&a);
    assert_eq!(
        s,
        "GPU 0 peak 6.50 GiB at 0.011 s (2 allocations)\n\
         GPU 1 peak 1.00 GiB at 0.060 s (2 allocations)\n\
         2 processes traced, 7 events, 5 dropped\n\
         live at end (never freed before the process ended): 1.50 GiB in 3 allocations\n"
    );
}

/// What the Python bridge could not do (a snapshot it could not write: in a sticky shared folder another user
/// took its name) is in the run's summary, not only in `report --json`; a program's words there, and in a
/// process's command line, never reach the terminal raw (U+202E would reverse what follows).
#[test]
fn summary_says_what_the_bridge_could_not_do_and_escapes_the_programs_words() {
    let mut recs = sample();
    recs.push(Record::Bridge(vramtrace_format::Bridge {
        pid: 11,
        tid: 1,
        ts_ns: common::START + 20 * common::MS,
        what: "note".into(),
        device: vramtrace_format::NO_DEVICE,
        ack: false,
        doc: serde_json::json!({
            "text": "could not write the allocation history to /tmp/t.torch-11-oom.pickle: \
                     PermissionError(1, 'Operation not permitted') \u{202e}evil"
        })
        .to_string(),
    }));
    let a = analyze_reader(&trace(&recs)[..]).unwrap();
    let s = summary(&a);
    let line = s
        .lines()
        .find(|l| l.contains("the Python bridge"))
        .unwrap_or_else(|| panic!("{s}"));
    assert!(
        line.starts_with("pid 11: the Python bridge: could not write the allocation history"),
        "{line}"
    );
    assert!(!s.contains('\u{202e}'), "{s}");
}

/// NCCL makes pinned host buffers with `cuMemCreate` and a host location: the shim records them on no device.
/// The report calls them host memory, not an unknown GPU, and leaves them out of the job's sums of GPU peaks;
/// memory on no known device that is not all `cuMemCreate` stays an unknown GPU's.
#[test]
fn host_memory_from_cu_mem_create_is_no_gpu_and_not_summed() {
    use vramtrace_format::{Api, NO_DEVICE};
    let dir = TempDir::new("host-memory");
    let mut a = node_trace(
        "node-a",
        1_700_000_000_000_000_000,
        5_000_000_000,
        "42",
        8 * MIB,
    );
    let shift = |mut e: vramtrace_format::Event| {
        e.ts_ns = e.ts_ns - START + 5_000_000_000;
        e
    };
    // With its call site: the section of call sites at each device's peak names it too.
    vramtrace_format::codec::put_record(
        &mut a,
        &stack(21, 1, vec![], vec![py("train.py", "main", 22)]),
    );
    vramtrace_format::codec::put_record(
        &mut a,
        &events(
            21,
            vec![shift(with_stack(
                ev(15, Api::MemCreate, NO_DEVICE, 0x77, 2 * MIB),
                1,
            ))],
        ),
    );
    // A host request that failed, its record carrying a GPU's free and total as shims before 2026-11-22 did.
    let mut failed = shift(ev(25, Api::MemCreate, NO_DEVICE, 0, 64 * MIB));
    failed.result = 2;
    vramtrace_format::codec::put_record(&mut a, &events(21, vec![failed]));
    let mut rec = oom(21, 25, NO_DEVICE, 64 * MIB, 3 * GIB, false);
    if let Record::Oom(o) = &mut rec {
        o.api = Api::MemCreate as u8;
        o.ts_ns = o.ts_ns - START + 5_000_000_000;
    }
    vramtrace_format::codec::put_record(&mut a, &rec);
    // node-b as the fleet tests have it; node-a here is theirs plus the host memory.
    let (_, b) = two_node_traces(&dir);
    let a = dir.file("a-host.vtrace", &a);

    // The exports show GPU memory: the host memory is in no GPU's track or series, and none is named GPU ?.
    for format in ["perfetto", "html"] {
        let out = dir.0.join(format!("a-host.{format}"));
        let o = export_several(&[&a], format, &out);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        let bytes = std::fs::read(&out).unwrap();
        let has = |s: &[u8]| bytes.windows(s.len()).any(|w| w == s);
        assert!(has(b"GPU 0"), "{format}");
        let at = bytes.windows(5).position(|w| w == b"GPU ?");
        assert!(
            at.is_none(),
            "{format}: host memory was exported as an unknown GPU: {}",
            String::from_utf8_lossy(
                &bytes
                    [at.unwrap_or(0).saturating_sub(300)..(at.unwrap_or(0) + 100).min(bytes.len())]
            )
        );
    }

    let text = String::from_utf8(report(&a, false).stdout).unwrap();
    assert!(text.contains("host memory  peak 2.00 MiB"), "{text}");
    // The process's figures are of GPU memory: peak 12 MiB (not 14), live at end 4 MiB (not 6).
    assert!(text.contains("12.00 MiB     4.00 MiB"), "{text}");
    assert!(
        text.contains("on no GPU: cuMemCreate with a host location"),
        "{text}"
    );
    assert!(!text.contains("GPU ?"), "{text}");

    python_check(
        &report(&a, true).stdout,
        r#"
host = [x for x in d["devices"] if x["device"] is None]
assert len(host) == 1 and host[0]["on_host"] is True and host[0]["peak_bytes"] == 2 << 20, d["devices"]
assert all(x["on_host"] is False for x in d["devices"] if x["device"] is not None)
"#,
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .args(["report", "--json"])
        .arg(&a)
        .arg(&b)
        .output()
        .unwrap();
    // node-a: 8 MiB then 4 more at once (12); node-b: 4 + 2 (6). The 2 MiB on the host are in neither.
    python_check(
        &out.stdout,
        r#"
j = d["job"]
assert j["device_peaks_sum_bytes"] == 18 << 20, j
assert [h["peak_bytes_sum"] for h in j["hosts"]] == [12 << 20, 6 << 20], j["hosts"]
"#,
    );

    // On no known device but not a cuMemCreate (an allocation of a thread without a context): an unknown GPU,
    // kept apart from host memory in the same trace. A process holding only host memory has no GPU figures.
    let mut c = node_trace(
        "node-c",
        1_700_000_000_000_000_000,
        5_000_000_000,
        "42",
        8 * MIB,
    );
    for r in [
        stack(21, 1, vec![], vec![py("train.py", "step", 40)]),
        stack(21, 2, vec![], vec![py("nccl.py", "init", 7)]),
        events(
            21,
            vec![
                shift(with_stack(
                    ev(15, Api::MemAllocAsync, NO_DEVICE, 0x7700, 8 * MIB),
                    1,
                )),
                shift(with_stack(
                    ev(16, Api::MemCreate, NO_DEVICE, 0x78, 2 * MIB),
                    2,
                )),
            ],
        ),
        {
            let mut h = hello(22, 0);
            if let Record::Hello(x) = &mut h {
                x.ts_ns = x.ts_ns - START + 5_000_000_000;
            }
            h
        },
        events(
            22,
            vec![shift(ev(17, Api::MemCreate, NO_DEVICE, 0x79, 2 * MIB))],
        ),
    ] {
        vramtrace_format::codec::put_record(&mut c, &r);
    }
    let c = dir.file("c.vtrace", &c);
    let text = String::from_utf8(report(&c, false).stdout).unwrap();
    assert!(text.contains("GPU ?  peak 8.00 MiB"), "{text}");
    assert!(text.contains("host memory  peak 4.00 MiB"), "{text}");
    // The call sites at each peak: each under its own name, with its own site.
    let at_peak = &text[text
        .find("CALL SITES AT EACH DEVICE'S PEAK")
        .expect("section")..];
    let unknown = at_peak.find("  GPU ?  peak 8.00 MiB at").expect(&text);
    let host = at_peak
        .find("  host memory  peak 4.00 MiB at")
        .expect(&text);
    let (first, second) = if unknown < host {
        (unknown, host)
    } else {
        (host, unknown)
    };
    let part = |at: usize| &at_peak[at..if at == first { second } else { at_peak.len() }];
    assert!(part(unknown).contains("train.py:40 in step"), "{text}");
    assert!(!part(unknown).contains("nccl.py"), "{text}");
    assert!(part(host).contains("nccl.py:7 in init"), "{text}");
    python_check(
        &report(&c, true).stdout,
        r#"
none = sorted((x["on_host"], x["peak_bytes"]) for x in d["devices"] if x["device"] is None)
assert none == [(False, 8 << 20), (True, 4 << 20)], none
p22 = [p for p in d["processes"] if p["pid"] == 22][0]
assert p22["peak_bytes"] == 0 and p22["live_bytes_at_end"] == 0, p22
assert [(x["device"], x["on_host"]) for x in p22["per_device"]] == [(None, True)], p22["per_device"]
hosts = [l for l in d["live_at_end"] if l["on_host"]]
assert sorted(l["pid"] for l in hosts) == [21, 22], d["live_at_end"]
"#,
    );
}

#[test]
fn several_traces_say_which_one_is_partial() {
    // The job's totals are of what its traces hold: a trace cut short says so in the job's summary, not only in
    // its own part.
    let dir = TempDir::new("fleet-partial");
    let (a, b) = two_node_traces(&dir);
    let bytes = std::fs::read(&b).unwrap();
    std::fs::write(&b, &bytes[..bytes.len() - 3]).unwrap();
    let run = |json: bool| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_vramtrace"));
        c.arg("report").arg(&a).arg(&b);
        if json {
            c.arg("--json");
        }
        c.output().unwrap()
    };
    let out = run(true);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    python_check(
        &out.stdout,
        r#"
job = d["job"]
assert job["partial"] is True, job
assert job["hosts"][0]["partial"] is None, job["hosts"]
assert "cut short" in job["hosts"][1]["partial"], job["hosts"]
"#,
    );
    let t = text(&run(false).stdout);
    let summary = t.split("\n==").next().unwrap();
    assert!(
        summary.contains("node-b") && summary.contains("    PARTIAL: "),
        "{summary}"
    );
}

#[test]
fn records_a_process_died_writing_are_told_by_what_they_were() {
    use vramtrace_format::LossCause;
    let lost = |pid: u32, ms: u64, count: u64, cause: LossCause| Record::Lost {
        pid,
        ts_ns: START + ms * MS,
        count,
        cause,
    };
    // Process 11 died writing a record of the shim's own (its GPUs' names): no event is missing. Process 12 died
    // writing two events.
    let records = vec![
        hello(11, 0),
        hello(12, 0),
        events(11, vec![alloc(10, 0, 0xa000, 64 * MIB)]),
        events(12, vec![alloc(11, 0, 0xb000, 32 * MIB)]),
        lost(11, 20, 1, LossCause::DiedMidNonEvent),
        Record::Dropped {
            pid: 12,
            ts_ns: START + 21 * MS,
            count: 2,
        },
        lost(12, 21, 2, LossCause::DiedMidRecord),
        end(11, 30, EndKind::Vanished),
        end(12, 30, EndKind::Vanished),
    ];
    let d = TempDir::new("torn");
    let f = d.file("t.vtrace", &trace(&records));
    let s = text(&report(&f, false).stdout);
    assert!(
        s.contains("2 events were lost (a process ended while writing them)"),
        "{s}"
    );
    assert!(!s.contains("queue was full"), "{s}");
    python_check(
        &report(&f, true).stdout,
        r#"
assert d["dropped_events"] == 2, d["dropped_events"]
p = {x["pid"]: x for x in d["processes"]}
assert p[11]["dropped_events"] == 0, p[11]
assert [(l["cause"], l["records"]) for l in p[11]["lost"]] == [("died_mid_non_event", 1)], p[11]["lost"]
assert [(l["cause"], l["records"]) for l in p[12]["lost"]] == [("died_mid_record", 2)], p[12]["lost"]
"#,
    );

    // Only the shim's own record torn: nothing to warn about.
    let f = d.file(
        "u.vtrace",
        &trace(&[
            hello(11, 0),
            events(11, vec![alloc(10, 0, 0xa000, 64 * MIB)]),
            lost(11, 20, 1, LossCause::DiedMidNonEvent),
            end(11, 30, EndKind::Vanished),
        ]),
    );
    let s = text(&report(&f, false).stdout);
    assert!(
        !s.contains("events were lost") && !s.contains("event was lost"),
        "{s}"
    );
}

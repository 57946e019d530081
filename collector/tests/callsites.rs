//! Call sites on traces built in memory: exact figures per site (live at each device's peak, allocated, live at
//! the end), the site chosen (Python first, library frames skipped), out-of-memory grouping and the sites that
//! grew, notes, and version-1 traces or traces without stacks reported exactly as before.

mod common;

use common::*;
use vramtrace_collector::callsites::{self, Frame, FrameKind, Site};
use vramtrace_collector::model::{analyze_reader, analyze_reader_with, Analysis};
use vramtrace_collector::reporters::prose;
use vramtrace_collector::{
    reporters::{json, oom_json, oom_text, text},
    verbs::oom,
};
use vramtrace_format::{EndKind, Oom, Record};

fn run(records: &[Record]) -> Analysis {
    analyze_reader(&trace(records)[..]).unwrap()
}

fn site_of(a: &Analysis, pid: u32, stack: u32) -> &Site {
    a.call_sites
        .sites
        .iter()
        .find(|s| s.pid == pid && s.stack == stack)
        .unwrap_or_else(|| panic!("no site for pid {pid} stack {stack}"))
}

const TRAIN: &str = "/home/u/proj/train.py";
const TORCH: &str = "/opt/env/lib/python3.12/site-packages/torch/nn/modules/module.py";

/// Process 100's objects: `libapp.so` (at 0x7000_0000) and the CUDA runtime (at 0x7100_0000), neither on disk.
fn app_objects() -> Record {
    objects(
        100,
        1,
        vec![
            object(
                "/nonexistent/libapp.so",
                0x7000_0000,
                (0x7000_1000, 0x7000_9000),
                &[7; 20],
            ),
            object(
                "/nonexistent/libcudart.so.12",
                0x7100_0000,
                (0x7100_1000, 0x7100_9000),
                &[],
            ),
        ],
    )
}

/// Process 100: stack 1 (train.py build_model), stack 2 (torch frames over train.py step), stack 3 (native
/// only, in a library that is not there), and allocations without a stack. GPU 0's peak is 13 MiB at 80 ms;
/// GPU 1 gets stack 1 only.
fn sample() -> Vec<Record> {
    vec![
        hello(100, 0),
        app_objects(),
        stack(
            100,
            1,
            vec![0x7100_1234],
            vec![py(TRAIN, "build_model", 10), py(TRAIN, "main", 50)],
        ),
        stack(
            100,
            2,
            vec![],
            vec![
                py(TORCH, "_apply", 900),
                py("/usr/lib/python3.12/functools.py", "wrapper", 3),
                py(TRAIN, "step", 20),
                py(TRAIN, "main", 60),
            ],
        ),
        stack(100, 3, vec![0x7100_1234, 0x7000_2345, 0xdead_0000], vec![]),
        events(
            100,
            vec![
                with_stack(alloc(10, 0, 0xa, 4 * MIB), 1),
                with_stack(alloc(15, 1, 0x1a, 2 * MIB), 1),
                with_stack(alloc(20, 0, 0xb, 2 * MIB), 2),
                with_stack(alloc(30, 0, 0xc, MIB), 1),
                free(40, 0xb),
                with_stack(alloc(50, 0, 0xd, MIB), 3),
                alloc(60, 0, 0xe, 3 * MIB),
                free(70, 0xa),
                with_stack(alloc(80, 0, 0xf, 8 * MIB), 2),
                free(85, 0x1a),
                free(90, 0xf),
                with_stack(alloc(95, 0, 0x10, 2 * MIB), 2),
            ],
        ),
        end(100, 100, EndKind::Goodbye),
    ]
}

#[test]
fn figures_per_site_are_exact() {
    let a = run(&sample());
    let cs = &a.call_sites;
    assert!(cs.present);
    assert_eq!(cs.stacks, 3);
    assert_eq!(a.device(0).unwrap().peak_bytes, 13 * MIB);
    let g0 = cs.at_peak_of(Some(0), false).unwrap();
    let at: Vec<(u32, u64)> = g0
        .sites
        .iter()
        .map(|b| (cs.sites[b.site].stack, b.bytes))
        .collect();
    // At 80 ms: stack 2's 8 MiB, stack 1's 1 MiB (its 4 MiB was freed at 70: it held 5 MiB at the earlier
    // peak of 9 MiB, not at this one), stack 3's 1 MiB, and 3 MiB without a stack.
    assert_eq!(at, vec![(2, 8 * MIB), (1, MIB), (3, MIB)]);
    assert_eq!((g0.unlisted_bytes, g0.no_site_bytes), (0, 3 * MIB));
    let g1 = cs.at_peak_of(Some(1), false).unwrap();
    assert_eq!(g1.sites.len(), 1);
    assert_eq!(
        (cs.sites[g1.sites[0].site].stack, g1.sites[0].bytes),
        (1, 2 * MIB)
    );

    let by: Vec<(u32, u64)> = cs
        .by_allocated
        .iter()
        .map(|&i| (cs.sites[i].stack, cs.sites[i].allocated_bytes))
        .collect();
    assert_eq!(by, vec![(2, 12 * MIB), (1, 7 * MIB), (3, MIB)]);

    let s1 = site_of(&a, 100, 1);
    assert_eq!((s1.allocations, s1.live_bytes_at_end), (3, MIB));
    let per: Vec<(Option<u32>, u64, u64, u64)> = s1
        .per_device
        .iter()
        .map(|d| {
            (
                d.device,
                d.allocated_bytes,
                d.peak_bytes,
                d.live_bytes_at_end,
            )
        })
        .collect();
    assert_eq!(
        per,
        vec![(Some(0), 5 * MIB, MIB, MIB), (Some(1), 2 * MIB, 2 * MIB, 0)]
    );
    assert_eq!(site_of(&a, 100, 2).live_bytes_at_end, 2 * MIB);
    assert_eq!(site_of(&a, 100, 3).live_bytes_at_end, MIB);
    // Live at the end: each row names its site; the one without a stack none.
    let rows: Vec<(u64, Option<u32>)> = a
        .live_at_end
        .iter()
        .map(|l| (l.bytes, l.site.map(|i| cs.sites[i].stack)))
        .collect();
    assert_eq!(
        rows,
        vec![
            (3 * MIB, None),
            (2 * MIB, Some(2)),
            (MIB, Some(1)),
            (MIB, Some(3))
        ]
    );
}

#[test]
fn python_frames_come_first_and_the_site_skips_library_frames() {
    let a = run(&sample());
    let s1 = site_of(&a, 100, 1);
    let kinds: Vec<FrameKind> = s1.frames.iter().map(|f| f.kind).collect();
    assert_eq!(
        kinds,
        vec![FrameKind::Python, FrameKind::Python, FrameKind::Native]
    );
    assert_eq!(s1.site, Some(0));
    assert_eq!(s1.label(), "proj/train.py:10 in build_model");
    let s2 = site_of(&a, 100, 2);
    assert_eq!(
        s2.site,
        Some(2),
        "torch and the standard library are skipped"
    );
    assert_eq!(s2.label(), "proj/train.py:20 in step");
    assert_eq!(s2.frames.len(), 4, "library frames stay in the full stack");
    assert_eq!(
        s2.short(2),
        vec!["proj/train.py:20 in step", "<- proj/train.py:60 in main"]
    );
    // Native only: the CUDA runtime is skipped; a missing file is module+offset; anonymous memory an address.
    let s3 = site_of(&a, 100, 3);
    assert_eq!(s3.site, Some(1));
    assert_eq!(s3.label(), "libapp.so+0x2345");
    let f = &s3.frames[1];
    assert_eq!(f.module.as_deref(), Some("/nonexistent/libapp.so"));
    assert_eq!((f.offset, f.address), (Some(0x2345), Some(0x7000_2345)));
    assert_eq!(f.note.as_deref(), Some("file not found"));
    assert_eq!(s3.frames[2].label(), "0xdead0000");
    assert!(s3.frames[2].module.is_none());

    let text = text::render(&a, None);
    assert!(
        text.contains(
            "CALL SITES AT EACH DEVICE'S PEAK (bytes live then, by where they were allocated)"
        ),
        "{text}"
    );
    assert!(
        text.contains("    8.00 MiB   62%  proj/train.py:20 in step\n"),
        "{text}"
    );
    assert!(text.contains("<- proj/train.py:60 in main"), "{text}");
    assert!(
        text.contains(
            "3.00 MiB   23%  (no call site: below --stack-min-bytes, 1.00 MiB unless set)"
        ),
        "{text}"
    );
    assert!(text.contains("CALL SITES BY BYTES ALLOCATED"), "{text}");
    assert!(text.contains("libapp.so+0x2345"), "{text}");
    for line in text.lines() {
        assert!(line.chars().count() <= 100, "too wide: {line}");
    }
}

#[test]
fn the_json_carries_the_frames() {
    let a = run(&sample());
    let j = json::render(&a);
    assert!(j.contains("\"call_sites\": ["), "{j}");
    assert!(j.contains("\"call_sites_by_allocated\": ["), "{j}");
    assert!(
        j.contains(
            "{\"kind\": \"python\", \"function\": \"build_model\", \"file\": \"/home/u/proj/train.py\", \
             \"line\": 10, \"module\": null, \"offset\": null, \"address\": null, \"inlined\": false, \
             \"note\": null}"
        ),
        "{j}"
    );
    assert!(j.contains("\"call_sites_at_peak\": {"), "{j}");
    assert!(j.contains("\"call_site\": "), "{j}");
    assert!(j.contains("\"notes\": []"), "{j}");
}

#[test]
fn without_a_symbolizer_no_file_is_read() {
    let a = analyze_reader_with(&trace(&sample())[..], None).unwrap();
    let f = &site_of(&a, 100, 3).frames[1];
    assert_eq!(f.note, None);
    assert_eq!(f.label(), "libapp.so+0x2345");
}

/// An out-of-memory event after a leak by one call site: 10 cycles of a 4 GiB activation (stack 2) over 1 GiB
/// of weights (stack 1), each leaving 64 MiB (stack 3) live; then 8 GiB is refused.
fn leaking() -> Vec<Record> {
    let mut evs = vec![with_stack(alloc(1, 0, 0x1000, GIB), 1)];
    let cycles = 10;
    for k in 0..=cycles {
        let t = 100 * k;
        evs.push(with_stack(alloc(t + 10, 0, 0x2000, 4 * GIB), 2));
        evs.push(with_stack(
            alloc(t + 20, 0, 0x10_0000 + k * 0x1000, 64 * MIB),
            3,
        ));
        if k < cycles {
            evs.push(free(t + 60, 0x2000));
        }
    }
    let at = 100 * cycles + 30;
    let mut refused = failed(alloc(at, 0, 0, 8 * GIB), 2);
    refused.stack = 2;
    refused.tid = 101;
    evs.push(refused);
    vec![
        hello(100, 0),
        stack(100, 1, vec![], vec![py(TRAIN, "load_weights", 5)]),
        stack(100, 2, vec![], vec![py(TRAIN, "forward", 30)]),
        stack(100, 3, vec![], vec![py(TRAIN, "log_metrics", 77)]),
        events(100, evs),
        Record::Oom(Oom {
            pid: 100,
            tid: 101,
            ts_ns: START + at * MS,
            device: 0,
            api: 1,
            flags: 0,
            requested_bytes: 8 * GIB,
            result: 2,
            device_free_bytes: Some(GIB),
            device_total_bytes: Some(8 * GIB),
            cap_bytes: None,
            job_used_bytes: None,
            process_used_bytes: None,
            extra: vec![],
        }),
        end(100, at + 1, EndKind::Vanished),
    ]
}

#[test]
fn an_oom_groups_live_bytes_by_site_and_names_the_sites_that_grew() {
    let a = run(&leaking());
    assert_eq!(a.ooms.len(), 1);
    let s = &a.ooms[0];
    let cs = &a.call_sites;
    let by: Vec<(String, u64, u64)> = s
        .by_site
        .iter()
        .map(|b| (cs.sites[b.site].label(), b.count, b.bytes))
        .collect();
    assert_eq!(
        by,
        vec![
            ("proj/train.py:30 in forward".to_string(), 1, 4 * GIB),
            ("proj/train.py:5 in load_weights".to_string(), 1, GIB),
            (
                "proj/train.py:77 in log_metrics".to_string(),
                11,
                11 * 64 * MIB
            ),
        ]
    );
    assert_eq!((s.by_site_unlisted_bytes, s.no_site_bytes), (0, 0));
    // The failing request names its own site (its event's stack), though a failed allocation is never live.
    assert_eq!(
        cs.sites[s.request_site.expect("the request's site")].label(),
        "proj/train.py:30 in forward"
    );
    // The largest live allocation is the activation, from forward().
    assert_eq!(s.top_live[0].bytes, 4 * GIB);
    assert_eq!(
        cs.sites[s.top_live[0].site.unwrap()].label(),
        "proj/train.py:30 in forward"
    );
    // What grew between the first and last minima: 9 of log_metrics' allocations.
    let l = s.leak.as_ref().expect("a leak trend");
    assert_eq!(l.sites.len(), 1);
    assert_eq!(
        (
            l.sites[0].label.as_str(),
            l.sites[0].count,
            l.sites[0].bytes
        ),
        ("proj/train.py:77 in log_metrics", 9, 9 * 64 * MIB)
    );
    let d = oom::diagnose(&a, s);
    assert!(d.findings.iter().any(|f| prose::finding(f)
        .contains("Their call sites: proj/train.py:77 in log_metrics (576.00 MiB in 9).")));
    let text = oom_text::render(&a, None);
    assert!(text.contains("LIVE BY CALL SITE ON GPU 0"), "{text}");
    assert!(
        text.contains("    704.00 MiB       11 live  proj/train.py:77 in log_metrics"),
        "{text}"
    );
    assert!(
        text.contains("                 at proj/train.py:30 in forward"),
        "{text}"
    );
    for line in text.lines() {
        assert!(line.chars().count() <= 100, "too wide: {line}");
    }
    let j = oom_json::render(&a);
    assert!(j.contains("\"live_by_call_site\": ["), "{j}");
    assert!(
        j.contains("\"site\": \"proj/train.py:30 in forward\""),
        "{j}"
    );
    assert!(
        j.contains("\"label\": \"proj/train.py:77 in log_metrics\""),
        "{j}"
    );
}

#[test]
fn notes_are_shown_once() {
    let mut recs = sample();
    recs.insert(1, note(100, 2, "Python 3.14: native stacks only"));
    recs.insert(1, hello(200, 0));
    recs.insert(2, note(200, 3, "Python 3.14: native stacks only"));
    recs.insert(2, note(200, 3, "Python 3.14: native stacks only"));
    let a = run(&recs);
    assert_eq!(a.call_sites.notes.len(), 1);
    assert_eq!(a.call_sites.notes[0].processes, 2);
    let text = text::render(&a, None);
    assert_eq!(
        text.matches("Python 3.14: native stacks only").count(),
        1,
        "{text}"
    );
    assert!(
        text.contains("NOTES\n- pid 200 and 1 more: Python 3.14: native stacks only"),
        "{text}"
    );
    let text = oom_text::render(&a, None);
    assert_eq!(
        text.matches("Python 3.14: native stacks only").count(),
        1,
        "{text}"
    );
    let j = json::render(&a);
    assert!(
        j.contains("\"text\": \"Python 3.14: native stacks only\""),
        "{j}"
    );
}

/// The same records without stacks, objects or notes.
fn stripped(recs: &[Record]) -> Vec<Record> {
    recs.iter()
        .filter(|r| {
            !matches!(
                r,
                Record::Stack(_) | Record::Objects(_) | Record::Note { .. }
            )
        })
        .map(|r| match r {
            Record::Events { pid, events } => Record::Events {
                pid: *pid,
                events: events.iter().map(|e| with_stack(*e, 0)).collect(),
            },
            r => r.clone(),
        })
        .collect()
}

#[test]
fn traces_without_stacks_and_version_1_traces_are_reported_as_before() {
    for recs in [stripped(&sample()), stripped(&leaking())] {
        let v2 = analyze_reader(&trace(&recs)[..]).unwrap();
        let v1 = analyze_reader(&trace_v1(&recs)[..]).unwrap();
        assert!(!v1.partial, "{:?}", v1.stopped);
        assert_eq!(
            (v1.format_version, v2.format_version),
            (1, vramtrace_format::VERSION)
        );
        assert!(!v1.call_sites.present && !v2.call_sites.present);
        assert_eq!(v1.devices, v2.devices);
        assert_eq!(v1.processes, v2.processes);
        assert_eq!(v1.live_at_end, v2.live_at_end);
        assert_eq!(v1.ooms, v2.ooms);
        for a in [&v1, &v2] {
            let text = text::render(a, None) + &oom_text::render(a, None);
            assert!(!text.contains("CALL SITE"), "{text}");
            assert!(!text.contains("NOTES"), "{text}");
            let json = json::render(a) + &oom_json::render(a);
            for key in [
                "call_site",
                "notes",
                "stacks",
                "\"site\"",
                "live_by_call_site",
                "\"sites\"",
            ] {
                assert!(!json.contains(key), "{key} in {json}");
            }
        }
        // The text differs only in the trace format line.
        let t1 = text::render(&v1, None).replace(
            "(trace format 1)",
            &format!("(trace format {})", vramtrace_format::VERSION),
        );
        assert_eq!(t1, text::render(&v2, None));
    }
}

#[test]
fn bad_call_site_input_is_never_an_error() {
    let recs = vec![
        hello(100, 0),
        // A stack for a process never seen, one with id 0, a duplicate, odd objects.
        stack(555, 1, vec![1, 2, 3], vec![]),
        stack(100, 0, vec![0x1000], vec![]),
        objects(
            100,
            1,
            vec![
                object("", 0x1000, (0x1000, 0x2000), &[]),
                object("[vdso]", 0x9000, (0x9000, 0x9100), &[]),
                object("/x/inverted.so", 0x5000, (0x6000, 0x5000), &[1]),
                object("/proc/self/status", 0x20_0000, (0x20_0000, 0x30_0000), &[]),
            ],
        ),
        stack(
            100,
            1,
            vec![0x1800, 0x9050, 0x5800, 0x20_0100, 0],
            vec![py("", "", 0)],
        ),
        stack(100, 1, vec![0x7777], vec![]),
        note(100, 1, ""),
        events(
            100,
            vec![
                with_stack(alloc(10, 0, 0xa, MIB), 1),
                // A stack id never sent.
                with_stack(alloc(11, 0, 0xb, 2 * MIB), 7),
                with_stack(free(12, 0xa), 3),
            ],
        ),
    ];
    let a = run(&recs);
    let s1 = site_of(&a, 100, 1);
    let labels: Vec<String> = s1.frames.iter().map(|f| f.label()).collect();
    assert_eq!(
        labels,
        vec![
            "?",
            "(main program)+0x800",
            "[vdso]+0x50",
            "0x5800",
            "status+0x100",
            "0x0"
        ]
    );
    let s7 = site_of(&a, 100, 7);
    assert!(s7.missing && s7.frames.is_empty() && s7.site.is_none());
    assert_eq!(s7.label(), "stack 7 (frames not recorded)");
    let text = text::render(&a, None) + &oom_text::render(&a, None);
    assert!(text.contains("stack 7 (frames not recorded)"), "{text}");
    let _ = json::render(&a) + &oom_json::render(&a);
    // Cut anywhere, never a panic.
    let t = trace(&recs);
    let start = vramtrace_format::codec::encode_header(&header()).len();
    for cut in (start..t.len()).step_by(7) {
        let a = analyze_reader(&t[..cut]).unwrap();
        let _ = text::render(&a, None) + &json::render(&a) + &oom_text::render(&a, None);
    }
}

/// Two native stacks whose innermost own frame is the same (one helper, `libapp.so+0x2345`) called from two
/// places, and a third from a Python line that two stacks share, told apart by a caller further out.
fn same_frame_two_callers() -> Vec<Record> {
    let layer_from_main = |line| {
        vec![
            py(TRAIN, "alloc", 5),
            py(TRAIN, "layer", 9),
            py(TRAIN, "main", line),
        ]
    };
    vec![
        hello(100, 0),
        app_objects(),
        stack(100, 1, vec![0x7100_1234, 0x7000_2345, 0x7000_3000], vec![]),
        stack(100, 2, vec![0x7100_1234, 0x7000_2345, 0x7000_4000], vec![]),
        // alloc() <- layer() <- main(), from two lines of main.
        stack(100, 3, vec![], layer_from_main(70)),
        stack(100, 4, vec![], layer_from_main(71)),
        events(
            100,
            vec![
                with_stack(alloc(10, 0, 0xa, 4 * MIB), 1),
                with_stack(alloc(20, 0, 0xb, 2 * MIB), 2),
                with_stack(alloc(30, 0, 0xc, 3 * MIB), 3),
                with_stack(alloc(40, 0, 0xd, MIB), 4),
            ],
        ),
        end(100, 100, EndKind::Goodbye),
    ]
}

#[test]
fn sites_that_would_read_the_same_get_labels_that_differ() {
    let a = run(&same_frame_two_callers());
    let labels: Vec<String> = (1..=4).map(|i| site_of(&a, 100, i).label()).collect();
    assert_eq!(
        labels,
        vec![
            // A helper its immediate callers tell apart: the caller is the site, the helper what it came
            // through.
            "libapp.so+0x3000 via libapp.so+0x2345",
            "libapp.so+0x4000 via libapp.so+0x2345",
            // Told apart only further out: the site stays near the allocation.
            "proj/train.py:5 in alloc <- … <- proj/train.py:70 in main",
            "proj/train.py:5 in alloc <- … <- proj/train.py:71 in main",
        ]
    );
    assert_eq!(site_of(&a, 100, 1).site, Some(2));
    assert_eq!(site_of(&a, 100, 3).site, Some(0));
    // Every list of the report shows four different sites, one row per line of code: the helper they came
    // through (`via`) is the JSON's, not a row's.
    let text = text::render(&a, None);
    assert!(!text.contains("via libapp.so+0x2345"), "{text}");
    for needle in [
        "libapp.so+0x3000\n",
        "libapp.so+0x4000\n",
        "<- proj/train.py:70 in main\n",
        "<- proj/train.py:71 in main\n",
    ] {
        assert!(text.contains(needle), "{needle} in {text}");
    }
    for list in text.split("\n\n").filter(|l| l.contains("CALL SITES")) {
        let blocks = site_blocks(list);
        assert_eq!(blocks.len(), 4, "{list}");
        let distinct: std::collections::BTreeSet<&String> = blocks.iter().collect();
        assert_eq!(distinct.len(), 4, "{list}");
    }
    let j = json::render(&a);
    for l in &labels {
        assert!(j.contains(&format!("\"label\": \"{l}\"")), "{l} in {j}");
    }
}

/// The rows of a text list of call sites: each site's lines (its figures left out) joined.
fn site_blocks(list: &str) -> Vec<String> {
    let mut blocks: Vec<String> = Vec::new();
    for line in list.lines().skip(1) {
        let Some(i) = line.find("  libapp").or_else(|| line.find("  proj/")) else {
            if let (Some(b), Some(i)) = (blocks.last_mut(), line.find("<- ")) {
                b.push_str(&line[i..]);
            }
            continue;
        };
        blocks.push(line[i..].trim().to_string());
    }
    blocks
}

/// A native frame as symbolisation gives it.
fn symbolised(function: &str, file: &str, line: u32) -> Frame {
    Frame {
        kind: FrameKind::Native,
        function: Some(function.to_string()),
        file: Some(file.to_string()),
        line: Some(line),
        module: Some("/work/target/release/app".to_string()),
        offset: Some(0x1000),
        address: Some(0x5555_0000_1000),
        inlined: false,
        note: None,
    }
}

#[test]
fn long_labels_are_cut_where_they_do_not_differ() {
    // Two sites in one long-named function of one file, on two lines: every row keeps its line.
    let mut a = run(&same_frame_two_callers());
    let long = "my_training_framework::engine::distributed::sharded::ShardedOptimizerState::materialise_buffers";
    let file =
        "/home/user/projects/my_training_framework/src/engine/distributed/sharded/optimizer.rs";
    for (stack, line) in [(1, 4410), (2, 4417)] {
        let s = a
            .call_sites
            .sites
            .iter_mut()
            .find(|s| s.stack == stack)
            .unwrap();
        s.frames = vec![
            symbolised(long, file, line),
            symbolised("app::main", "/home/user/app/src/main.rs", 3),
        ];
        s.site = callsites::choose_site(&s.frames);
        s.extra.clear();
    }
    callsites::distinguish(&mut a.call_sites.sites);
    let text = text::render(&a, None);
    for line in text.lines() {
        assert!(line.chars().count() <= 100, "too wide: {line}");
    }
    let lists: Vec<&str> = text
        .split("\n\n")
        .filter(|l| l.contains("CALL SITES"))
        .collect();
    assert_eq!(lists.len(), 2, "{text}");
    for list in lists {
        for want in ["sharded/optimizer.rs:4410\n", "sharded/optimizer.rs:4417\n"] {
            assert!(list.contains(want), "{want} in {list}");
        }
    }
    let text = oom_text::render(&a, None) + &text;
    assert!(!text.contains("optimizer.rs:44…"), "{text}");
}

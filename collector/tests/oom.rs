//! Out-of-memory snapshots and their diagnosis, on traces built in memory: each cause with its exact figures,
//! the merge's ordering, a process killed right after, leak trends, the post-mortem without an event.

mod common;

use common::traces::{oom_at, refused, training};
use common::*;
use vramtrace_collector::model::diagnose::{Advice, CapAdvice, CapReason, Reason, Rule};
use vramtrace_collector::model::{analyze_reader, Analysis, OomSnapshot, MAX_OOM_SNAPSHOTS};
use vramtrace_collector::reporters::prose;
use vramtrace_collector::reporters::{oom_text, text};
use vramtrace_collector::verbs::oom::{
    self, diagnose, Cause, Diagnosis, Finding, CONTEXT_ESTIMATE_BYTES,
};
use vramtrace_format::codec::encode_header;
use vramtrace_format::{flags, Api, EndKind, Record};

fn run(records: &[Record]) -> Analysis {
    analyze_reader(&trace(records)[..]).unwrap()
}

fn only(a: &Analysis) -> (&OomSnapshot, Diagnosis) {
    assert_eq!(a.oom_records, 1);
    assert_eq!(a.ooms.len(), 1);
    let s = &a.ooms[0];
    (s, diagnose(a, s))
}

fn has_finding(d: &Diagnosis, key: &str) -> bool {
    d.findings.iter().any(|f| f.key() == key)
}

#[test]
fn cap_refused_names_the_cap_and_the_cap_that_would_have_fitted() {
    let mut o = oom_at(100, 30, 0, GIB, Some(70 * GIB), Some(80 * GIB));
    o.flags = flags::CAP_REFUSED;
    o.cap_bytes = Some(8 * GIB);
    o.job_used_bytes = Some(7 * GIB + 512 * MIB);
    o.process_used_bytes = Some(7 * GIB + 512 * MIB);
    let a = run_with(
        capped_header(8 * GIB, 80 * GIB),
        &[
            hello(100, 0),
            events(
                100,
                vec![
                    alloc(10, 0, 0xa000, 6 * GIB),
                    alloc(20, 0, 0xb000, GIB + 512 * MIB),
                    refused(30, 0, GIB, flags::CAP_REFUSED),
                ],
            ),
            Record::Oom(o),
            end(100, 40, EndKind::Vanished),
        ],
    );
    let (s, d) = only(&a);
    assert!(s.cap_refused);
    assert_eq!(s.time_ns, 30 * MS);
    assert_eq!(s.job_live_trace_bytes, 7 * GIB + 512 * MIB);
    assert_eq!(d.cause, Cause::Cap);
    assert_eq!(d.rule, Rule::CapRefused);
    assert_eq!(d.job_live_source.key(), "ledger");
    assert_eq!(d.job_live_bytes, 7 * GIB + 512 * MIB);
    assert_eq!(d.cap_bytes, Some(8 * GIB));
    assert_eq!(d.needed_bytes, 8 * GIB + 512 * MIB);
    assert_eq!(d.available_bytes, Some(8 * GIB));
    assert_eq!(d.short_of_fitting_bytes, Some(512 * MIB));
    assert_eq!(d.suggested_cap_bytes, 8 * GIB + 512 * MIB);
    // The diagnosis is data: the rule's figures and the advice's, which the reporters put in words.
    assert_eq!(
        d.reason,
        Reason::Cap(CapReason::CapRefused {
            job_bytes: 7 * GIB + 512 * MIB,
            cap: Some(8 * GIB),
            requested: GIB,
        })
    );
    assert_eq!(
        d.advice[..2],
        [
            Advice::Cap(CapAdvice::CapWouldFit {
                cap: 8 * GIB + 512 * MIB,
                needed: 8 * GIB + 512 * MIB,
                device: None,
            }),
            Advice::Cap(CapAdvice::CapModeWarn),
        ]
    );
    assert!(
        prose::advice(&d)[0].contains("--cap 8.5GiB"),
        "{:?}",
        prose::advice(&d)
    );
    assert!(prose::advice(&d)
        .iter()
        .any(|x| x.contains("--cap-mode warn")));
    assert!(
        prose::reason(&d).contains("7.50 GiB (by the cap's ledger) of its 8.00 GiB cap"),
        "{}",
        prose::reason(&d)
    );
    assert!(!has_finding(&d, "ledger_differs"));
    // The device section has the cap and the device total from the header.
    let dv = a.device(0).unwrap();
    assert_eq!(
        (dv.cap_bytes, dv.total_bytes),
        (Some(8 * GIB), Some(80 * GIB))
    );
    assert_eq!(dv.headroom_bytes(), Some(512 * MIB));
    let report = text::render(&a, None);
    assert!(
        report
            .contains("headroom 512.00 MiB: peak 7.50 GiB of the 8.00 GiB cap (device 80.00 GiB)"),
        "{report}"
    );
}

#[test]
fn over_the_cap_in_warn_mode_is_the_cap_too_and_a_rounded_cap_is_suggested() {
    let mut o = oom_at(100, 30, 0, 3 * GIB, Some(GIB), Some(12 * GIB));
    o.cap_bytes = Some(8 * GIB);
    o.job_used_bytes = Some(9 * GIB);
    let a = run(&[
        hello(100, 0),
        events(
            100,
            vec![alloc(10, 0, 0xa000, 9 * GIB), refused(30, 0, 3 * GIB, 0)],
        ),
        Record::Oom(o),
    ]);
    let (_, d) = only(&a);
    assert_eq!((d.cause, d.rule), (Cause::Cap, Rule::OverCap));
    assert_eq!(d.needed_bytes, 12 * GIB);
    assert_eq!(d.suggested_cap_bytes, 12 * GIB);
    // The cap came from the record: the device section knows it too.
    assert_eq!(a.device(0).unwrap().cap_bytes, Some(8 * GIB));
    // 10.1 GiB rounds up to the next quarter.
    assert_eq!(oom::cap_spec(10 * GIB + 300 * MIB), "10.29GiB");
    assert_eq!(oom::cap_spec(8 * GIB), "8GiB");
}

#[test]
fn pressure_when_the_job_fills_the_device() {
    let a = run(&[
        hello(100, 0),
        events(
            100,
            vec![
                alloc(10, 0, 0xa000, 40 * GIB),
                alloc(20, 0, 0xb000, 38 * GIB),
                alloc(21, 0, 0xc000, 3 * MIB),
                free(22, 0xc000),
                refused(30, 0, 2 * GIB, 0),
            ],
        ),
        Record::Oom(oom_at(
            100,
            30,
            0,
            2 * GIB,
            Some(GIB + 512 * MIB),
            Some(80 * GIB),
        )),
        end(100, 31, EndKind::Goodbye),
    ]);
    let (s, d) = only(&a);
    assert_eq!(s.job_live_trace_bytes, 78 * GIB);
    assert_eq!(s.job_processes_on_device, 1);
    assert_eq!(d.cause, Cause::Pressure);
    assert_eq!(d.rule, Rule::JobFillsDevice);
    assert_eq!(d.job_live_source.key(), "trace");
    assert_eq!(d.shortfall_bytes, Some(512 * MIB));
    assert_eq!(d.outside_job_bytes, Some(512 * MIB));
    assert_eq!(d.context_estimate_bytes, CONTEXT_ESTIMATE_BYTES);
    assert_eq!(d.outside_excess_bytes, Some(12 * MIB));
    assert_eq!(d.needed_bytes, 80 * GIB);
    assert_eq!(d.available_bytes, Some(79 * GIB + 512 * MIB));
    assert_eq!(d.short_of_fitting_bytes, Some(512 * MIB));
    assert!(
        prose::advice(&d)[0].starts_with(
            "Shed at least 512.00 MiB on GPU 0 (536,870,912 bytes, 0.6% of the 80.00 GiB"
        ),
        "{}",
        prose::advice(&d)[0]
    );
    for lever in [
        "gradient accumulation",
        "checkpointing",
        "bf16",
        "Offload optimizer",
        "FSDP",
    ] {
        assert!(
            prose::advice(&d).iter().any(|x| x.contains(lever)),
            "{lever}"
        );
    }
    assert!(matches!(
        d.findings[0],
        Finding::Fit {
            short_bytes,
            limited_by: "device",
            ..
        } if short_bytes == 512 * MIB
    ));
    // The snapshot: processes, the largest allocations, size classes, the timeline up to the event.
    assert_eq!(s.processes.len(), 1);
    assert_eq!(s.processes[0].device_live_bytes, 78 * GIB);
    assert_eq!(s.processes[0].rank, Some(0));
    assert_eq!(s.live_count, 2);
    let top: Vec<(u64, u64, u32)> = s
        .top_live
        .iter()
        .map(|l| (l.bytes, l.age_ns, l.tid))
        .collect();
    assert_eq!(top, vec![(40 * GIB, 20 * MS, 1), (38 * GIB, 10 * MS, 1)]);
    assert_eq!(s.top_live[0].address, 0xa000);
    let classes: Vec<(u64, u64)> = s.size_classes.iter().map(|c| (c.count, c.bytes)).collect();
    assert_eq!(classes, vec![(0, 0), (0, 0), (0, 0), (0, 0), (2, 78 * GIB)]);
    let last = s.timeline.buckets.last().unwrap();
    assert_eq!(last.last_bytes, 78 * GIB);
    assert!(s
        .timeline
        .buckets
        .iter()
        .all(|b| b.max_bytes <= 78 * GIB + 3 * MIB));
    assert!(oom::summary(&a).unwrap().contains("cause: pressure: "));
}

#[test]
fn fragmentation_when_the_driver_had_the_bytes_free() {
    let a = run(&[
        hello(100, 0),
        events(
            100,
            vec![alloc(10, 0, 0xa000, 60 * GIB), refused(30, 0, 4 * GIB, 0)],
        ),
        Record::Oom(oom_at(100, 30, 0, 4 * GIB, Some(10 * GIB), Some(80 * GIB))),
    ]);
    let (_, d) = only(&a);
    assert_eq!(
        (d.cause, d.rule),
        (Cause::Fragmentation, Rule::FreeAtLeastRequest)
    );
    assert_eq!(d.shortfall_bytes, Some(0));
    assert!(
        prose::reason(&d).contains("10.00 GiB free, at least the 4.00 GiB"),
        "{}",
        prose::reason(&d)
    );
    assert!(prose::advice(&d)[0].contains("expandable_segments:True"));
    assert!(prose::advice(&d)
        .iter()
        .any(|x| x.contains("cuMemPoolTrimTo")));
    assert!(prose::advice(&d).iter().any(|x| x.contains("empty_cache")));
}

#[test]
fn fragmentation_when_the_pool_kept_what_was_freed_async_just_before() {
    let mut async_alloc = ev(10, Api::MemAllocAsync, 0, 0xd000, 2 * GIB);
    async_alloc.aux = 7;
    let mut evs = vec![
        alloc(5, 0, 0xa000, 50 * GIB),
        async_alloc,
        // Freed 2 s before the event: no longer "recent".
        ev(20, Api::MemFreeAsync, 0, 0xd000, 0),
        ev(2100, Api::MemAllocAsync, 0, 0xe000, GIB),
        ev(2150, Api::MemAllocAsync, 0, 0xf000, 512 * MIB),
        ev(2500, Api::MemFreeAsync, 0, 0xe000, 0),
        ev(2900, Api::MemFreeAsync, 0, 0xf000, 0),
    ];
    evs.push(refused(3000, 0, 2 * GIB, 0));
    let a = run(&[
        hello(100, 0),
        events(100, evs),
        Record::Oom(oom_at(100, 3000, 0, 2 * GIB, Some(GIB), Some(80 * GIB))),
    ]);
    let (s, d) = only(&a);
    assert_eq!(s.async_freed_recent_bytes, GIB + 512 * MIB);
    assert_eq!(s.job_live_trace_bytes, 50 * GIB);
    // Memory outside the job is large (the pool's cache looks like it), but the pool rule comes first.
    assert_eq!(d.outside_job_bytes, Some(29 * GIB));
    assert_eq!(
        (d.cause, d.rule),
        (Cause::Fragmentation, Rule::PoolCachedAsyncFrees)
    );
    assert!(
        prose::reason(&d).contains("freed 1.50 GiB with cuMemFreeAsync"),
        "{}",
        prose::reason(&d)
    );
    assert!(!has_finding(&d, "pool_cache"));
}

#[test]
fn external_when_something_else_holds_the_device() {
    let a = run(&[
        hello(100, 0),
        events(
            100,
            vec![alloc(10, 0, 0xa000, 2 * GIB), refused(30, 0, 4 * GIB, 0)],
        ),
        Record::Oom(oom_at(100, 30, 0, 4 * GIB, Some(GIB), Some(80 * GIB))),
    ]);
    let (_, d) = only(&a);
    assert_eq!((d.cause, d.rule), (Cause::External, Rule::OutsideExcess));
    assert_eq!(d.outside_job_bytes, Some(77 * GIB));
    assert_eq!(d.outside_excess_bytes, Some(77 * GIB - 500 * MIB));
    assert_eq!(d.shortfall_bytes, Some(3 * GIB));
    assert!(
        prose::advice(&d)[0].contains("pids are unknown"),
        "{}",
        prose::advice(&d)[0]
    );
    assert!(prose::advice(&d)
        .iter()
        .any(|x| x.contains("nvidia-smi --query-compute-apps=pid,used_memory --format=csv")));
    assert!(prose::advice(&d)
        .iter()
        .any(|x| x.contains("stop the other process")));
}

#[test]
fn without_the_drivers_figures_the_cause_is_decided_from_what_is_known() {
    let mut h = header();
    h.extra = vec![("device_total.0".into(), (16 * GIB).to_string())];
    let recs = |req: u64| {
        vec![
            hello(100, 0),
            events(
                100,
                vec![alloc(10, 0, 0xa000, 10 * GIB), refused(30, 0, req, 0)],
            ),
            Record::Oom(oom_at(100, 30, 0, req, None, None)),
        ]
    };
    let a = run_with(h.clone(), &recs(2 * GIB));
    let (_, d) = only(&a);
    assert_eq!(
        (d.cause, d.rule),
        (Cause::External, Rule::NoDriverFiguresFitsTotal)
    );
    assert_eq!(d.total_bytes, Some(16 * GIB));
    assert!(has_finding(&d, "no_driver_figures"));
    let a = run_with(h, &recs(6 * GIB));
    let (_, d) = only(&a);
    assert_eq!((d.cause, d.rule), (Cause::Pressure, Rule::NoDriverFigures));
    // Nothing known at all: pressure, and it says so.
    let a = run(&recs(GIB));
    let (_, d) = only(&a);
    assert_eq!((d.cause, d.rule), (Cause::Pressure, Rule::NoDriverFigures));
    assert!(prose::reason(&d).starts_with("neither the driver's free memory"));
    assert_eq!(d.available_bytes, None);
    assert!(!has_finding(&d, "fit"));
}

#[test]
fn an_oom_right_before_a_kill_is_still_reported_with_what_was_live() {
    let a = run(&[
        hello(100, 0),
        events(
            100,
            vec![
                alloc(10, 0, 0xa000, 30 * GIB),
                alloc(11, 0, 0xb000, 30 * GIB),
                refused(50, 0, 30 * GIB, 0),
            ],
        ),
        Record::Oom(oom_at(100, 50, 0, 30 * GIB, Some(18 * GIB), Some(80 * GIB))),
        // SIGKILLed in the same millisecond: CUDA gives everything back at that moment.
        end(100, 50, EndKind::Vanished),
    ]);
    let (s, d) = only(&a);
    assert_eq!(s.job_live_trace_bytes, 60 * GIB);
    assert_eq!(s.processes.len(), 1);
    assert_eq!(d.cause, Cause::Pressure);
    let p = a.process(100).unwrap();
    assert_eq!(p.ended, vramtrace_collector::model::Ended::Vanished);
    assert_eq!(p.live_bytes_at_end, 60 * GIB);
    let text = oom_text::render(&a, None);
    assert!(text.contains("OUT OF MEMORY on GPU 0 at 0.050 s"), "{text}");
    assert!(text.contains("vanished"), "{text}");
}

#[test]
fn two_processes_of_the_job_are_merged_in_time_before_the_snapshot() {
    let a = run(&[
        hello(100, 0),
        hello(200, 0),
        events(
            100,
            vec![alloc(10, 0, 0xa000, 30 * GIB), refused(50, 0, 8 * GIB, 0)],
        ),
        // Process 200 is still open with an older watermark: the snapshot waits for it.
        Record::Oom(oom_at(100, 50, 0, 8 * GIB, Some(9 * GIB), Some(80 * GIB))),
        events(
            200,
            vec![
                alloc(20, 0, 0xa000, 40 * GIB),
                alloc(25, 1, 0xb000, 5 * GIB),
                free(60, 0xa000),
            ],
        ),
        tick(200, 100),
    ]);
    let (s, d) = only(&a);
    assert_eq!(s.job_live_trace_bytes, 70 * GIB);
    assert_eq!(s.job_processes_on_device, 2);
    assert_eq!(d.context_estimate_bytes, 2 * CONTEXT_ESTIMATE_BYTES);
    let procs: Vec<(u32, u64, usize)> = s
        .processes
        .iter()
        .map(|p| (p.pid, p.device_live_bytes, p.per_device.len()))
        .collect();
    assert_eq!(procs, vec![(100, 30 * GIB, 1), (200, 40 * GIB, 2)]);
    assert_eq!(s.processes[1].per_device[1], (Some(1), 5 * GIB));
    // free 9 GiB >= 8 GiB asked for.
    assert_eq!(d.cause, Cause::Fragmentation);
    let pids: Vec<u32> = s.top_live.iter().map(|l| l.pid).collect();
    assert_eq!(pids, vec![200, 100]);
    // The free at 60 ms came after the event: the device ends lower.
    assert_eq!(a.device(0).unwrap().in_use_bytes_at_end, 30 * GIB);
}

#[test]
fn growth_is_found_from_the_rising_floor_with_what_grew() {
    let a = run(&training(10, true));
    let (s, d) = only(&a);
    let l = s.leak.as_ref().expect("growth");
    // The floor at each window's end rose with each kept 64 MiB, from after the first kept buffer.
    assert!(l.minima.windows(2).all(|w| w[1].bytes >= w[0].bytes));
    assert_eq!(l.minima[0].bytes, GIB + 64 * MIB);
    assert_eq!(l.minima[l.minima.len() - 1].bytes, GIB + 10 * 64 * MIB);
    assert_eq!(l.rise_bytes, 9 * 64 * MIB);
    // Nine cycles between its start and the error: 64 MiB a step.
    assert_eq!(l.steps, Some(9));
    assert_eq!(l.groups.len(), 1);
    let g = l.groups[0];
    assert_eq!(
        (g.api, g.bytes_each, g.count, g.bytes),
        (Api::MemAlloc, 64 * MIB, 9, 9 * 64 * MIB)
    );
    assert!(has_finding(&d, "leak_trend"));
    // 576 MiB of growth cannot explain a 7 GiB shortfall: pressure, with the growth beside it.
    assert_eq!(d.cause, Cause::Pressure);
    assert!(prose::advice(&d)
        .iter()
        .any(|x| x.contains("rose cycle over cycle")));
    assert!(d
        .findings
        .iter()
        .any(|f| prose::finding(f).contains("still live: 9 x 64.00 MiB cuMemAlloc_v2.")));
    // The whole run's report sees it on the device too.
    assert!(a.device(0).unwrap().growth.is_some());
}

#[test]
fn a_steady_workload_has_no_growth() {
    let a = run(&training(10, false));
    let (s, d) = only(&a);
    assert!(s.leak.is_none());
    assert!(!has_finding(&d, "leak_trend"));
    assert!(a.device(0).unwrap().growth.is_none());
    assert_eq!(vramtrace_collector::model::minima(&s.timeline).len(), 10);
    // Two steps are not a trend either.
    let a = run(&training(2, true));
    assert!(a.ooms[0].leak.is_none());
}

#[test]
fn only_the_first_ooms_get_a_snapshot_and_the_rest_are_counted() {
    let mut recs = vec![hello(100, 0), events(100, vec![alloc(1, 0, 0xa000, GIB)])];
    for i in 0..20u64 {
        recs.push(events(100, vec![refused(10 + i, 0, 2 * GIB, 0)]));
        recs.push(Record::Oom(oom_at(
            100,
            10 + i,
            0,
            2 * GIB,
            Some(GIB),
            Some(2 * GIB),
        )));
    }
    let a = run(&recs);
    assert_eq!(a.oom_records, 20);
    assert_eq!(a.ooms.len(), MAX_OOM_SNAPSHOTS);
    assert_eq!(a.ooms_not_snapshotted(), 4);
    assert_eq!(a.process(100).unwrap().oom_results, 20);
    let text = oom_text::render(&a, None);
    assert!(
        text.contains("4 more out-of-memory events were recorded after these"),
        "{text}"
    );
    let s = oom::summary(&a).unwrap();
    assert!(
        s.ends_with("19 more out-of-memory errors after it\n"),
        "{s}"
    );
}

#[test]
fn without_an_oom_the_post_mortem_says_how_each_process_ended() {
    let a = run(&[
        hello(100, 0),
        hello(200, 0),
        events(
            100,
            vec![
                ev(1, Api::MemGetInfo, 0, 80 * GIB, 79 * GIB),
                alloc(10, 0, 0xa000, 6 * GIB),
                alloc(11, 0, 0xb000, GIB),
            ],
        ),
        events(200, vec![alloc(12, 0, 0xc000, 2 * GIB)]),
        events(100, vec![free(20, 0xa000)]),
        end(100, 50, EndKind::Vanished),
    ]);
    assert!(oom::summary(&a).is_none());
    let text = oom_text::render(&a, None);
    assert!(
        text.contains("No out-of-memory error was recorded."),
        "{text}"
    );
    assert!(text.contains("1 process ended without a goodbye"), "{text}");
    assert!(text.contains("HOW EACH PROCESS ENDED"), "{text}");
    assert!(text.contains("vanished"), "{text}");
    assert!(text.contains("still running"), "{text}");
    assert!(
        text.contains("GPU 0 peak 9.00 GiB at 0.012 s; headroom 71.00 GiB: peak 9.00 GiB of the device's 80.00 GiB"),
        "{text}"
    );
    for line in text.lines() {
        assert!(line.chars().count() <= 100, "too wide: {line}");
    }
    assert_eq!(oom::render(&a, false), text);
}

#[test]
fn every_text_line_fits_and_the_report_has_every_section() {
    let a = run(&training(10, true));
    let text = oom::render(&a, false);
    for want in [
        "CAUSE: pressure",
        "FIGURES ON GPU 0",
        "PROCESSES AT THE EVENT",
        "LARGEST LIVE ALLOCATIONS (13 live on GPU 0)",
        "LIVE BY SIZE",
        "GPU 0 BEFORE THE EVENT",
        "FINDINGS",
        "ADVICE",
        "HOW EACH PROCESS ENDED",
        "DEVICES: PEAK AND HEADROOM",
    ] {
        assert!(text.contains(want), "{want} in\n{text}");
    }
    for line in text.lines() {
        assert!(line.chars().count() <= 100, "too wide: {line}");
    }
}

#[test]
fn damaged_oom_traces_never_panic_the_reports() {
    let mut recs = training(3, true);
    let mut o = oom_at(100, 500, 0, GIB, None, Some(8 * GIB));
    o.flags = flags::CAP_REFUSED | flags::PTSZ;
    o.api = 99;
    o.cap_bytes = Some(GIB);
    o.job_used_bytes = Some(6 * GIB);
    recs.insert(2, Record::Oom(o));
    let full = trace(&recs);
    let check = |t: &[u8]| {
        if let Ok(a) = analyze_reader(t) {
            let _ = oom::render(&a, false);
            let _ = oom::render(&a, true);
            let _ = oom::summary(&a);
            let _ = text::render(&a, None);
        }
    };
    for cut in 0..=full.len() {
        check(&full[..cut]);
    }
    let start = encode_header(&header()).len();
    for i in start..full.len() {
        for x in [0x01u8, 0x80, 0xff] {
            let mut t = full.clone();
            t[i] ^= x;
            check(&t);
        }
    }
    let a = analyze_reader(&full[..]).unwrap();
    assert_eq!(a.oom_records, 2);
    let text = oom::render(&a, false);
    assert!(
        text.contains("api 99_") || text.contains("api 99"),
        "{text}"
    );
}

/// PyTorch under torch.cuda.set_per_process_memory_fraction refuses a request past its share before asking the
/// driver: its own limit, not the device's (no driver record precedes its error).
#[test]
fn pytorch_over_its_memory_fraction_is_its_own_limit() {
    use common::traces::torch_oom_with;
    let mut h = header();
    h.extra = vec![("device_total.0".into(), (80 * GIB).to_string())];
    let with_limit = |l: u64| {
        vec![
            hello(100, 0),
            events(100, vec![alloc(10, 0, 0xa000, 7 * GIB)]),
            torch_oom_with(
                100,
                20,
                2 * GIB,
                7 * GIB,
                7 * GIB,
                &[("allowed_or_total", &l.to_string())],
            ),
            end(100, 30, EndKind::Goodbye),
        ]
    };
    let a = run_with(h.clone(), &with_limit(8 * GIB));
    let (s, d) = only(&a);
    assert!(s.api.is_none());
    assert_eq!(d.cause, Cause::FrameworkLimit, "{}", prose::reason(&d));
    assert_eq!(
        d.reason,
        Reason::FrameworkLimit {
            framework: vramtrace_format::Framework::Torch,
            limit: 8 * GIB,
            in_use: 7 * GIB,
            requested: 2 * GIB,
            largest_free_block: None,
        }
    );
    assert!(
        prose::reason(&d).contains("torch.cuda.set_per_process_memory_fraction"),
        "{}",
        prose::reason(&d)
    );
    let advice = prose::advice(&d);
    assert!(advice[0].starts_with("Raise the share"), "{advice:?}");
    assert!(
        advice.iter().any(|x| x.contains("gradient accumulation")),
        "{advice:?}"
    );
    // PyTorch's observer says the device's total where no fraction is set: no limit of its own then.
    let a = run_with(h, &with_limit(80 * GIB));
    assert_ne!(only(&a).1.cause, Cause::FrameworkLimit);
}

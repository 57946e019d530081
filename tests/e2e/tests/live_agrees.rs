//! The live metrics and the report read one trace alike (issue 37): the live figures are an observer of the
//! report's own replay, fed frame by frame as the collector appends them, and once the job is over they must
//! say exactly what `vramtrace report` says. Every fixture trace the repository keeps, and 1,000 generated
//! ones (`fuzz::valid_trace`: every record kind, out-of-order times, refusals recovered from and not, framework
//! errors, context teardowns, drops and losses, goodbyes), fed in chunks of random size with scrapes between.
//! Compared: per GPU the bytes in use, the peak and the allocations; for the job the errors, the refusals,
//! the cap's refusals, the allocations and the drops; per running process and GPU the bytes and the peak.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use vramtrace_collector::live::{JobLabels, Live};
use vramtrace_collector::model::Analysis;
use vramtrace_e2e::fuzz::{self, Rng, Shape};
use vramtrace_format::codec::{self, HEADER_PREFIX};
use vramtrace_format::{Record, TraceReader};

/// Every way the two readings differ, as lines (empty: they agree).
fn disagreements(trace: &[u8], rng: &mut Rng) -> Vec<String> {
    let report = vramtrace_collector::model::analyze_reader_with(trace, None).expect("a trace");
    let (_, header) = TraceReader::open(trace).expect("a header");
    let prefix: [u8; HEADER_PREFIX] = trace[..HEADER_PREFIX].try_into().unwrap();
    let (_, body) = codec::decode_header_prefix(&prefix).unwrap();
    let start = HEADER_PREFIX + body as usize;

    let live = Live::new(
        JobLabels::default(),
        &header,
        None,
        0,
        Arc::new(AtomicU64::new(0)),
        false,
    );
    // Whole frames, as the writer appends them, a random number at a time, with a scrape between.
    let frames: Vec<&[u8]> = fuzz::frame_spans(trace, start)
        .into_iter()
        .map(|(a, b)| &trace[a..b])
        .collect();
    let mut oom_records = 0u64;
    let mut i = 0;
    while i < frames.len() {
        let n = 1 + rng.below(8) as usize;
        let chunk: Vec<u8> = frames[i..(i + n).min(frames.len())].concat();
        for (k, payload) in codec::frames(&chunk) {
            if let Ok(Some(Record::Oom(_))) = codec::decode_record(k, payload) {
                oom_records += 1;
            }
        }
        live.feed(&chunk);
        if rng.below(4) == 0 {
            let _ = live.render();
        }
        i += n;
    }
    live.finish();
    compare(&report, &live.figures(), oom_records)
}

fn compare(a: &Analysis, f: &vramtrace_collector::live::Figures, oom_records: u64) -> Vec<String> {
    let mut out = Vec::new();
    let mut same = |what: String, live: u64, report: u64| {
        if live != report {
            out.push(format!("{what}: live {live}, report {report}"));
        }
    };
    same("errors".into(), f.errors(), a.oom_records);
    same("refusals".into(), f.refusals(), oom_records);
    same(
        "cap refusals".into(),
        f.cap_refusals(),
        a.processes.iter().map(|p| p.cap_refusals).sum(),
    );
    same(
        "allocations".into(),
        f.allocations(),
        a.processes.iter().map(|p| p.allocations).sum(),
    );
    same("dropped".into(), f.dropped(), a.dropped_events);
    for d in a.devices.iter().filter(|d| !d.on_host) {
        let Some(g) = d.device else { continue };
        let l = f.gpus().get(&g).copied().unwrap_or_default();
        same(format!("GPU {g} in use"), l.used, d.in_use_bytes_at_end);
        same(format!("GPU {g} peak"), l.peak, d.peak_bytes);
        same(format!("GPU {g} allocations"), l.allocations, d.allocations);
    }
    for g in f.gpus().keys() {
        if a.device(*g).is_none() {
            same(
                format!("GPU {g} peak (no such GPU in the report)"),
                f.gpus()[g].peak,
                0,
            );
        }
    }
    // Processes still running at the trace's end: their bytes now are their bytes at the end.
    let running: Vec<_> = a.processes.iter().filter(|p| p.end_ns.is_none()).collect();
    let live = f.process_gpus();
    for p in &running {
        if running.iter().filter(|q| q.pid == p.pid).count() > 1 {
            continue;
        }
        for pd in p.per_device.iter().filter(|pd| !pd.on_host) {
            let Some(g) = pd.device else { continue };
            let l = live.iter().find(|l| l.0 == p.pid && l.1 == g);
            let (used, peak) = l.map_or((0, 0), |l| (l.2, l.3));
            same(
                format!("pid {} GPU {g} live", p.pid),
                used,
                pd.live_bytes_at_end,
            );
            same(format!("pid {} GPU {g} peak", p.pid), peak, pd.peak_bytes);
        }
    }
    out
}

fn fixtures(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            fixtures(&p, out);
        } else if p.extension().is_some_and(|x| x == "vtrace") {
            out.push(p);
        }
    }
}

#[test]
fn every_fixture_trace_reads_alike_live_and_in_the_report() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut paths = Vec::new();
    for d in ["collector/tests/fixtures", "docs", "examples"] {
        fixtures(&root.join(d), &mut paths);
    }
    assert!(paths.len() >= 10, "fixtures found: {paths:?}");
    let mut rng = Rng::new(37);
    let mut bad = Vec::new();
    for p in &paths {
        let t = std::fs::read(p).unwrap();
        for d in disagreements(&t, &mut rng) {
            bad.push(format!("{}: {d}", p.display()));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn a_thousand_generated_traces_read_alike_live_and_in_the_report() {
    let mut bad = Vec::new();
    let mut errors = 0u64;
    for case in 0..1000u64 {
        let mut rng = Rng::new(0x5eed_0037 ^ case.wrapping_mul(0x9e37_79b9));
        let mut shape = Shape::draw(&mut rng);
        // Thousands of processes or a million devices say nothing more here, and cost minutes.
        shape.large = false;
        let records = 1 + rng.below(300) as usize;
        let t = fuzz::valid_trace(&mut rng, records, shape);
        errors += vramtrace_collector::model::analyze_reader_with(&t[..], None)
            .unwrap()
            .oom_records;
        for d in disagreements(&t, &mut rng) {
            bad.push(format!("case {case}: {d}"));
        }
        if bad.len() > 40 {
            break;
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    // The comparison saw errors to count.
    assert!(errors > 100, "only {errors} errors in 1,000 traces");
}

//! How fast `vramtrace export` writes a large trace, and in how much memory.
//!
//! `cargo bench -p vramtrace --bench export` (plain std timing, no harness). The trace is the ingest
//! benchmark's (benches/ingest.rs: 8 ranks on their own GPUs, caching-allocator-like traffic, VMM, failures),
//! written to a file; then `report`'s replay alone, the Perfetto, memory_viz and HTML exports are timed on
//! it, each with its peak RSS (VmHWM, reset before it) and the size of what it wrote.
//!
//! Targets (issue 11): a 10 M-event trace exported to Perfetto in at most 3 s; to HTML in at most 2 s and 5 MB. `VRAMTRACE_BENCH_EVENTS` changes
//! the number of events (default 10 M; 200 k under `cargo test --benches`).

#[allow(dead_code)]
#[path = "ingest.rs"]
mod ingest;

use std::path::{Path, PathBuf};
use std::time::Instant;

use vramtrace_collector::verbs::export::{export, ExportArgs, Format};
use vramtrace_collector::whatif::trace_file::analyze;

/// Runs `f`, returning its time in seconds and the peak RSS above the RSS before it (MB), when readable.
fn measure(f: impl FnOnce()) -> (f64, Option<f64>) {
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let base = ingest::status_kb("VmRSS:");
    let t = Instant::now();
    f();
    let s = t.elapsed().as_secs_f64();
    let peak = match (reset, ingest::status_kb("VmHWM:"), base) {
        (true, Some(h), Some(b)) => Some(h.saturating_sub(b) as f64 / 1024.0),
        _ => None,
    };
    (s, peak)
}

fn export_to(trace: &Path, format: Format, out: &Path) {
    let args = ExportArgs {
        trace: vec![trace.to_path_buf()],
        format,
        out: out.to_path_buf(),
        force: true,
        max_events: vramtrace_collector::reporters::memory_viz::MAX_EVENTS,
    };
    export(&args).expect("export");
}

fn main() {
    let n = ingest::bench_events();
    eprintln!("vramtrace export benchmark: generating {n} events...");
    // Cargo's scratch folder, or the system's where the executable was carried elsewhere (bench.sh).
    let dir = Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR")))
        .filter(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let trace = dir.join(format!("export-{}.vtrace", std::process::id()));
    std::fs::write(&trace, ingest::generate(n, 8, false, false, false)).expect("write the trace");
    let pf = dir.join(format!("export-{}.pftrace", std::process::id()));
    let mv = dir.join(format!("export-{}.pickle", std::process::id()));
    let html = dir.join(format!("export-{}.html", std::process::id()));

    let mut events = 0;
    let rows = [
        (
            "replay only (report)",
            measure(|| events = analyze(&trace).expect("analyze").events),
            None,
        ),
        (
            "perfetto",
            measure(|| export_to(&trace, Format::Perfetto, &pf)),
            Some(&pf),
        ),
        (
            "perfetto to /dev/null",
            measure(|| export_to(&trace, Format::Perfetto, Path::new("/dev/null"))),
            None,
        ),
        (
            "memory-viz",
            measure(|| export_to(&trace, Format::MemoryViz, &mv)),
            Some(&mv),
        ),
        (
            "html",
            measure(|| export_to(&trace, Format::Html, &html)),
            Some(&html),
        ),
    ];
    println!();
    println!(
        "{:<22} {:>12} {:>8} {:>12} {:>12} {:>10}",
        "export", "events", "s", "M events/s", "+RSS MB", "out MB"
    );
    for (name, (s, rss), out) in rows {
        let size = out.and_then(|p| std::fs::metadata(p).ok()).map(|m| m.len());
        println!(
            "{:<22} {:>12} {:>8.3} {:>12.2} {:>12} {:>10}",
            name,
            events,
            s,
            events as f64 / s / 1e6,
            rss.map_or("n/a".into(), |r| format!("{r:.0}")),
            size.map_or("-".into(), |b| format!("{:.2}", b as f64 / 1e6)),
        );
    }
    println!("\ntargets: perfetto <= 3 s, html <= 2 s and 5 MB, for 10 M events");
    for p in [&trace, &pf, &mv, &html] {
        let _ = std::fs::remove_file(p);
    }
}

//! `fuzz_trace [CASES] [SEED] [FIRST]`: the trace-format fuzzer's long run (`vramtrace_e2e::fuzz`), cases FIRST
//! (0) to FIRST + CASES of SEED; prints its counts for docs/FUZZING.md and exits 1 if any case failed (panicked,
//! took more than 20 s or more than 1 GiB): each failure is printed with its seed and case number (`fuzz_trace
//! 1 SEED CASE` runs it again) and kept in the temp dir it names.

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("CASES, SEED and FIRST are numbers"))
        .collect();
    let cases = args.first().copied().unwrap_or(20_000);
    let seed = args.get(1).copied().unwrap_or(1);
    let first = args.get(2).copied().unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("vramtrace-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    // The panics are counted; each place that panicked is said once on stderr.
    let seen = std::sync::Mutex::new(std::collections::HashSet::new());
    std::panic::set_hook(Box::new(move |info| {
        let at = info.location().map(|l| l.to_string()).unwrap_or_default();
        if seen.lock().is_ok_and(|mut s| s.insert(at.clone())) {
            eprintln!(
                "panicked at {at}: {}",
                std::backtrace::Backtrace::force_capture()
            );
        }
    }));
    let start = std::time::Instant::now();
    let limits = vramtrace_e2e::fuzz::Limits::default();
    let c = vramtrace_e2e::fuzz::run_cases(seed, first, cases, 10, &dir, limits);
    println!(
        "seed {seed}: {} cases in {:.1} s ({} large, {} with devices spread wide)",
        c.cases,
        start.elapsed().as_secs_f64(),
        c.large,
        c.many_devices
    );
    println!(
        "replayed {} (partial answers; {} undecodable frames skipped and counted), refused as a trace {}, \
         exported {} x 3 formats",
        c.replayed, c.bad_frames, c.refused, c.exported
    );
    println!("slowest case {:.1} ms", c.slowest.as_secs_f64() * 1e3);
    for (m, n) in vramtrace_e2e::fuzz::MUTATIONS.iter().zip(c.by_mutation) {
        println!("  {m}: {n}");
    }
    let failures = c.failures();
    println!("failures: {}", failures.len());
    for f in failures.iter().take(20) {
        println!("  {f}");
    }
    if failures.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("cases kept in {}", dir.display());
        std::process::exit(1);
    }
}

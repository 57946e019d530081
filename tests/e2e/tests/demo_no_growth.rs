//! The demo keeps nothing across its steps (weights, then an optimizer's state made once): 50 runs of it on the
//! simulated driver, each timed as the machine makes it, must never be called growth (issue 24: the old rule
//! called it a "leak trend" in 2 of 6 runs), neither over the run nor in its post-mortem.

use std::process::Command;

use vramtrace_e2e::traced::vramtrace;
use vramtrace_e2e::TempDir;

#[test]
fn fifty_demo_runs_show_no_growth() {
    let dir = TempDir::new("demo-steady");
    for i in 0..50 {
        let trace = dir.path().join(format!("demo{i}.vtrace"));
        let out = Command::new(vramtrace())
            .args(["demo", "--simulated", "--out"])
            .arg(&trace)
            .output()
            .expect("vramtrace demo");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let a = vramtrace_collector::whatif::trace_file::analyze(&trace).unwrap();
        if stdout.to_lowercase().contains("growth") {
            // Keep what a failure needs to be understood: the trace, and the device's shape.
            let keep = std::env::temp_dir().join(format!("vramtrace-demo-growth-{i}.vtrace"));
            let _ = std::fs::copy(&trace, &keep);
            let d = a.device(0);
            panic!(
                "run {i}: growth (trace kept at {}; dropped {}, unmatched frees {}, lost frees {}, growth {:?}):\n{stdout}",
                keep.display(),
                a.dropped_events,
                a.unmatched_frees,
                a.lost_frees,
                d.and_then(|d| d.growth.as_ref())
            );
        }
        let d = a.device(0).expect("GPU 0");
        assert!(d.peak_bytes > 0);
        assert_eq!(d.growth, None, "run {i}");
        assert_eq!(a.oom_records, 0);
    }
}

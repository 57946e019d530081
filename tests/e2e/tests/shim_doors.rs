//! The shim against the simulated driver, through every door programs use: each test runs a real program under
//! `vramtrace run` and checks the trace against the driver's own log, call for call, and the report's figures
//! against what the program did.

use vramtrace_e2e::traced::{assert_trace_matches_log, read_trace};
use vramtrace_e2e::*;
use vramtrace_format::{flags, Api};

/// The PATTERN's peaks (tests/programs/PATTERN.md): A..G live together on device 0, H (cuMemCreate) on device 1.
const PATTERN_PEAK_DEV0: u64 = MIB + 102_400 + 2 * MIB + 3 * MIB + 4 * MIB + 5 * MIB + 6 * MIB;
const PATTERN_PEAK_DEV1: u64 = 2 * MIB;
const PATTERN_LEAK: u64 = 7 * MIB;

fn door(name: &str, program: std::path::PathBuf, args: &[&str]) {
    let fc = FakeCuda::new();
    let (run, path) = fc.traced(name, &[], &program, args);
    run.assert_success(name);
    assert!(run.stdout.contains("PASS"), "{name}: {}", run.stdout);
    let trace = read_trace(&path);
    assert!(trace.stop.is_clean(), "{name}: {:?}", trace.stop);
    assert_eq!(trace.dropped, 0);
    let pid = *trace.pids().first().expect("events");
    assert_eq!(trace.pids().len(), 1);
    let log: Vec<LogLine> = fc.log().into_iter().filter(|l| l.pid == pid).collect();
    let n = assert_trace_matches_log(&log, &trace.events[&pid], trace.ooms.len());
    assert!(n >= 20, "{name}: only {n} calls");
    // Every tracked entry point of the pattern shows up, _ptsz variants included.
    let evs = &trace.events[&pid];
    for api in [
        Api::MemAlloc,
        Api::MemAllocPitch,
        Api::MemAllocManaged,
        Api::MemFree,
        Api::MemAllocAsync,
        Api::MemAllocFromPoolAsync,
        Api::MemFreeAsync,
        Api::MemCreate,
        Api::MemRelease,
        Api::MemMap,
        Api::MemUnmap,
        Api::MemAddressReserve,
        Api::MemAddressFree,
        Api::MemGetInfo,
    ] {
        assert!(evs.iter().any(|e| e.api == api), "{name}: no {api:?}");
    }
    for api in [
        Api::MemAllocAsync,
        Api::MemAllocFromPoolAsync,
        Api::MemFreeAsync,
    ] {
        assert!(
            evs.iter()
                .any(|e| e.api == api && e.flags & flags::PTSZ != 0),
            "{name}: no {api:?}_ptsz"
        );
    }
    // The out-of-memory of step 5 reached the collector as a whole record, with the driver's real figures.
    assert_eq!(trace.ooms.len(), 1, "{name}");
    let oom = &trace.ooms[0];
    assert_eq!((oom.pid, oom.device, oom.result), (pid, 0, 2));
    assert_eq!(oom.requested_bytes, DEFAULT_DEVICE_BYTES + MIB);
    assert_eq!(oom.device_total_bytes, Some(DEFAULT_DEVICE_BYTES));
    assert!(oom.device_free_bytes.unwrap() <= DEFAULT_DEVICE_BYTES);
    assert_eq!(oom.cap_bytes, None);
    // The report's figures are the program's.
    let a = vramtrace_collector::whatif::trace_file::analyze(&path).unwrap();
    assert_eq!(a.device(0).unwrap().peak_bytes, PATTERN_PEAK_DEV0, "{name}");
    assert_eq!(a.device(1).unwrap().peak_bytes, PATTERN_PEAK_DEV1, "{name}");
    let p = a.process(pid).unwrap();
    assert_eq!(p.live_bytes_at_end, PATTERN_LEAK, "{name}");
    assert_eq!(p.oom_results, 1, "{name}");
    assert_eq!(a.events as usize, evs.len());
    let hello = trace.hellos.iter().find(|h| h.pid == pid).expect("hello");
    assert!(
        hello.cmdline[0].ends_with(program.file_name().unwrap().to_str().unwrap()),
        "{hello:?}"
    );
    assert!(
        trace.goodbyes.contains(&pid),
        "{name}: the exit flush said goodbye"
    );
}

#[test]
fn door_linked_with_lcuda() {
    door("linked", door_linked(), &[]);
}

#[test]
fn door_dlsym_exact_names() {
    door("dlsym", program("door_dlsym"), &[]);
}

#[test]
fn door_runtime_get_proc_address() {
    door("runtime", program("door_runtime"), &[]);
}

#[test]
fn many_threads_every_call_recorded() {
    let fc = FakeCuda::new();
    let (run, path) = fc.traced(
        "threads",
        &[],
        program("door_dlsym"),
        &["--threads", "8", "--repeat", "40"],
    );
    run.assert_success("threads");
    let trace = read_trace(&path);
    let pid = trace.pids()[0];
    let log: Vec<LogLine> = fc.log().into_iter().filter(|l| l.pid == pid).collect();
    assert_eq!(trace.dropped, 0);
    // One OOM: its cuMemGetInfo_v2 is the shim's own.
    assert_eq!(
        trace.events[&pid].len() + 1,
        vramtrace_e2e::traced::events_for(&log)
    );
    let a = vramtrace_collector::whatif::trace_file::analyze(&path).unwrap();
    assert_eq!(a.process(pid).unwrap().live_bytes_at_end, PATTERN_LEAK);
    assert_eq!(a.device(1).unwrap().live_bytes_at_end, 0);
}

#[test]
fn cudarc_workload_peak_is_exact() {
    for mode in [&["--small"][..], &["--small", "--sync-alloc"][..]] {
        let fc = FakeCuda::new();
        let (run, path) = fc.traced("workload", &[], artifact("vramtrace-workload"), mode);
        run.assert_success("workload");
        let expected: u64 = run
            .stdout
            .split_whitespace()
            .find_map(|w| w.strip_prefix("peak_expected_bytes="))
            .and_then(|v| v.parse().ok())
            .expect("the workload prints its peak");
        let trace = read_trace(&path);
        let pid = trace.pids()[0];
        let log: Vec<LogLine> = fc.log().into_iter().filter(|l| l.pid == pid).collect();
        assert_trace_matches_log(&log, &trace.events[&pid], 0);
        let want_api = if mode.len() == 2 {
            Api::MemAlloc
        } else {
            Api::MemAllocAsync
        };
        assert!(
            trace.events[&pid].iter().any(|e| e.api == want_api),
            "{mode:?}"
        );
        let a = vramtrace_collector::whatif::trace_file::analyze(&path).unwrap();
        assert_eq!(a.device(0).unwrap().peak_bytes, expected, "{mode:?}");
        assert_eq!(a.device(0).unwrap().live_bytes_at_end, 0);
    }
}

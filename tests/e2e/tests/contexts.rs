//! Contexts torn down: `cuDevicePrimaryCtxReset` (`cudaDeviceReset`), the last `cuDevicePrimaryCtxRelease` and
//! `cuCtxDestroy` free every allocation made in the context, with no free the shim sees. The cap gives those
//! bytes back (it would refuse what the GPU has room for otherwise), and the trace shows them freed, not live.

use vramtrace_e2e::traced::{read_trace, vramtrace};
use vramtrace_e2e::*;

/// `probe` under `vramtrace run` with `extra` arguments, its trace at `<name>.vtrace`.
fn traced_probe(fc: &FakeCuda, name: &str, extra: &[&str]) -> (Probe, std::path::PathBuf) {
    let path = fc.dir().join(format!("{name}.vtrace"));
    let mut c = fc.command(vramtrace());
    c.args(["run", "--python-agent", "off"])
        .args(extra)
        .arg("--out")
        .arg(&path)
        .arg("--")
        .arg(program("probe"));
    (Probe::start(c), path)
}

fn capped_probe(fc: &FakeCuda, name: &str) -> (Probe, std::path::PathBuf) {
    traced_probe(fc, name, &["--cap", "8MiB"])
}

#[test]
fn a_primary_context_reset_gives_its_allocations_back_to_the_cap_and_the_trace() {
    let fc = FakeCuda::new().with_state();
    let (mut p, path) = capped_probe(&fc, "reset");
    assert_eq!(p.cmd2("alloc 6291456").0, 0);
    // cudaDeviceReset: the driver frees the 6 MiB; nothing calls cuMemFree.
    assert_eq!(p.cmd("ctxreset 0").trim(), "0");
    assert_eq!(fc.state()[0].used, 0, "the simulated driver freed it");
    assert_eq!(p.cmd("device 0").trim(), "0");
    // Under an 8 MiB cap, 6 MiB more fits: the GPU holds nothing of ours.
    assert_eq!(
        p.cmd2("alloc 6291456").0,
        0,
        "the cap still counted the reset context's 6 MiB"
    );
    assert_eq!(p.cmd2("alloc 4194304").0, 2, "and it still caps");
    p.finish();
    let t = read_trace(&path);
    assert_eq!(t.contexts_gone.len(), 1, "{:?}", t.contexts_gone);
    let a = vramtrace_collector::whatif::trace_file::analyze(&path).unwrap();
    let dev = a.device(0).unwrap();
    assert_eq!(dev.peak_bytes, 6 << 20, "never 12 MiB at once");
    let proc_ = &a.processes[0];
    assert_eq!(proc_.context_freed_bytes, 6 << 20);
    // What was live at the end is the second allocation only.
    assert_eq!(proc_.live_bytes_at_end, 6 << 20);
}

#[test]
fn the_last_context_destroyed_frees_it_and_a_context_beside_another_is_said() {
    let fc = FakeCuda::new().with_state();
    let (mut p, path) = capped_probe(&fc, "destroy");
    // Release the probe's primary context: then a created context is the only one on device 0.
    assert_eq!(p.cmd("ctxrelease 0").trim(), "0");
    let created = p.cmd("ctxcreate 0");
    let ctx = created.split_whitespace().nth(1).unwrap().to_string();
    assert_eq!(p.cmd2("alloc 6291456").0, 0);
    assert_eq!(p.cmd(&format!("ctxdestroy {ctx}")).trim(), "0");
    assert_eq!(fc.state()[0].used, 0);
    let again = p.cmd("ctxcreate 0");
    assert!(again.starts_with("0 "), "{again}");
    assert_eq!(p.cmd2("alloc 6291456").0, 0, "room again after the destroy");
    // Now a second context beside it: destroying one cannot say which allocations were whose.
    let beside = p.cmd("ctxcreate 0");
    let beside = beside.split_whitespace().nth(1).unwrap().to_string();
    assert_eq!(p.cmd(&format!("ctxdestroy {beside}")).trim(), "0");
    p.finish();
    let t = read_trace(&path);
    assert_eq!(t.contexts_gone.len(), 2, "{:?}", t.contexts_gone);
    assert!(
        t.notes
            .iter()
            .any(|(_, n)| n.contains("while another context of this process lives on it")),
        "{:?}",
        t.notes
    );
    let a = vramtrace_collector::whatif::trace_file::analyze(&path).unwrap();
    assert_eq!(a.device(0).unwrap().peak_bytes, 6 << 20);
    assert_eq!(a.processes[0].context_freed_bytes, 6 << 20);
}

/// PyTorch 2.11 asks `cuGetProcAddress` for `cuDevicePrimaryCtxRelease` at version 7000 and gets the legacy
/// function, not `_v2`. The shim wraps the legacy release and reset too: a teardown through them gives the
/// context's memory back to the cap and the trace, and nothing is said on the program's stderr.
#[test]
fn the_legacy_primary_context_functions_that_old_versions_get_are_seen_too() {
    for cmd in ["ctxrelease7", "ctxreset7"] {
        let fc = FakeCuda::new().with_state();
        let release = format!("{cmd} 0");
        let (r, path) = fc.traced(
            cmd,
            &["--python-agent", "off", "--cap", "8MiB"],
            program("probe"),
            &[
                "alloc 6291456",
                release.as_str(),
                "device 0",
                "alloc 6291456",
                "alloc 4194304",
            ],
        );
        let answers: Vec<&str> = r.stdout.lines().skip(1).collect();
        assert_eq!(answers.len(), 5, "{cmd}: {}", r.stdout);
        assert!(answers[0].starts_with("0 "), "{cmd}: {answers:?}");
        assert_eq!(
            answers[1], "0",
            "{cmd}: the legacy function ran: {answers:?}"
        );
        assert!(
            answers[3].starts_with("0 "),
            "{cmd}: the cap still counted the torn-down context's 6 MiB: {answers:?}"
        );
        assert!(
            answers[4].starts_with("2 "),
            "{cmd}: and it still caps: {answers:?}"
        );
        assert!(
            !r.stderr.contains("does not know"),
            "{cmd}: the shim said it could not wrap the function:\n{}",
            r.stderr
        );
        assert_eq!(read_trace(&path).contexts_gone.len(), 1, "{cmd}");
        let a = vramtrace_collector::whatif::trace_file::analyze(&path).unwrap();
        assert_eq!(
            a.device(0).unwrap().peak_bytes,
            6 << 20,
            "{cmd}: never 12 MiB at once"
        );
        assert_eq!(a.processes[0].context_freed_bytes, 6 << 20, "{cmd}");
    }
}

/// The `cuCtxGetDevice` calls the driver answered (`FAKECUDA_LOG_QUERIES`).
fn queries(fc: &FakeCuda) -> usize {
    fc.log()
        .iter()
        .filter(|l| l.func == "cuCtxGetDevice")
        .count()
}

/// Waits (30 s at most: a CI machine may starve the courier) until the shim has read the devices: the driver
/// was asked the UUID of its last ordinal.
fn devices_read(fc: &FakeCuda, last: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !fc
        .log()
        .iter()
        .any(|l| l.func == "cuDeviceGetUuid_v2" && l.aux == last)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the shim never read the devices"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn query_log(devices: &str) -> FakeCuda {
    FakeCuda::new()
        .env("FAKECUDA_DEVICES", devices)
        .env("FAKECUDA_LOG_QUERIES", "1")
}

#[test]
fn a_process_that_sees_one_device_has_its_allocations_on_it_without_asking_the_driver_each_time() {
    let fc = query_log("1");
    let (mut p, path) = traced_probe(&fc, "one", &[]);
    // Until the shim has read the devices (its courier does, once the driver answers), an allocation asks.
    let (rc, first) = p.cmd2("alloc 1048576");
    assert_eq!(rc, 0);
    let mut ptrs = vec![first];
    devices_read(&fc, 0);
    let before = queries(&fc);
    for _ in 0..50 {
        let (rc, ptr) = p.cmd2("alloc 2097152");
        assert_eq!(rc, 0);
        ptrs.push(ptr);
    }
    assert_eq!(queries(&fc), before, "an allocation asked for the device");
    // A failed allocation still asks (it may have failed for want of a context).
    assert_eq!(p.cmd2("alloc 1099511627776").0, 2, "out of memory");
    assert_eq!(queries(&fc), before + 1, "the failed allocation asked");
    for ptr in &ptrs {
        assert_eq!(p.cmd(&format!("free {ptr:#x}")).trim(), "0");
    }
    p.finish();
    let t = read_trace(&path);
    let allocs: Vec<_> = t
        .all_events()
        .into_iter()
        .filter(|e| e.api == vramtrace_format::Api::MemAlloc && e.result == 0)
        .collect();
    assert_eq!(allocs.len(), ptrs.len());
    assert!(
        allocs.iter().all(|e| e.device == 0),
        "{:?}",
        allocs.iter().map(|e| e.device).collect::<Vec<_>>()
    );
    let a = vramtrace_collector::whatif::trace_file::analyze(&path).unwrap();
    assert_eq!(a.device(0).unwrap().peak_bytes, (1 << 20) + 50 * (2 << 20));
}

#[test]
fn a_process_that_sees_two_devices_asks_which_for_each_allocation() {
    let fc = query_log("2");
    let (mut p, path) = traced_probe(&fc, "two", &[]);
    assert_eq!(p.cmd2("alloc 1048576").0, 0);
    // Once the shim has read the devices too: two, so it goes on asking.
    devices_read(&fc, 1);
    let before = queries(&fc);
    for i in 0..20 {
        assert_eq!(p.cmd("device 1").trim(), "0");
        assert_eq!(p.cmd2("alloc 1048576").0, 0, "alloc {i} on device 1");
        assert_eq!(p.cmd("device 0").trim(), "0");
        assert_eq!(p.cmd2("alloc 2097152").0, 0, "alloc {i} on device 0");
    }
    assert_eq!(queries(&fc) - before, 40, "one question an allocation");
    p.finish();
    let t = read_trace(&path);
    let on = |d: u32| {
        t.all_events()
            .into_iter()
            .filter(|e| e.api == vramtrace_format::Api::MemAlloc && e.device == d)
            .map(|e| e.size)
            .sum::<u64>()
    };
    assert_eq!(on(1), 20 << 20);
    assert_eq!(on(0), (1 << 20) + (40 << 20));
}

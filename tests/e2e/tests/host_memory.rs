//! Pinned host memory from `cuMemCreate` with a host location (NCCL makes its host buffers so): the shim
//! records it on no device and outside every GPU's cap; the report calls it host memory, apart from the GPUs;
//! a failed one is a host-memory out-of-memory error, carrying no GPU's figures.

use vramtrace_collector::model::diagnose;
use vramtrace_e2e::traced::{assert_trace_matches_log, read_trace};
use vramtrace_e2e::*;
use vramtrace_format::{Api, NO_DEVICE};

#[test]
fn host_memory_is_apart_from_the_gpus_and_its_oom_is_the_hosts() {
    let fc = FakeCuda::new()
        .with_state()
        .env("FAKECUDA_HOST_BYTES", "8MiB");
    let (r, path) = fc.traced(
        "host",
        &["--python-agent", "off", "--cap", "6MiB"],
        program("probe"),
        &["alloc 4194304", "createhost 4194304", "createhost 8388608"],
    );
    let answers: Vec<&str> = r.stdout.lines().skip(1).collect();
    assert_eq!(answers.len(), 3, "{}\n{}", r.stdout, r.stderr);
    assert!(answers[0].starts_with("0 "), "{answers:?}");
    // 4 MiB on GPU 0 and 4 MiB on the host under a 6 MiB cap: the host's are not the GPU's.
    assert!(
        answers[1].starts_with("0 "),
        "the GPU's cap counted host memory: {answers:?}"
    );
    assert!(
        answers[2].starts_with("2 "),
        "past the host's 8 MiB: {answers:?}"
    );

    // The shim's records: the host allocation and its failure on no device; the failure's record carries no
    // GPU's free and total.
    let t = read_trace(&path);
    // Every call the driver answered, as the shim recorded it (host memory's device included).
    let pid = *t.pids().first().expect("events");
    let log: Vec<LogLine> = fc.log().into_iter().filter(|l| l.pid == pid).collect();
    assert_trace_matches_log(&log, &t.events[&pid], t.ooms.len());
    let evs = t.events.values().flatten().collect::<Vec<_>>();
    let creates: Vec<_> = evs.iter().filter(|e| e.api == Api::MemCreate).collect();
    assert_eq!(creates.len(), 2, "{creates:?}");
    assert!(creates.iter().all(|e| e.device == NO_DEVICE), "{creates:?}");
    assert_eq!(t.ooms.len(), 1, "{:?}", t.ooms);
    let o = &t.ooms[0];
    assert_eq!((o.device, o.api), (NO_DEVICE, Api::MemCreate as u8));
    assert_eq!(
        (o.device_free_bytes, o.device_total_bytes),
        (None, None),
        "a GPU's figures on a host memory failure"
    );

    let a = vramtrace_collector::whatif::trace_file::analyze(&path).unwrap();
    let gpu = a.device(0).unwrap();
    assert_eq!(gpu.peak_bytes, 4 << 20);
    let host: Vec<_> = a.devices.iter().filter(|d| d.on_host).collect();
    assert_eq!(host.len(), 1, "{:?}", a.devices);
    assert_eq!((host[0].device, host[0].peak_bytes), (None, 4 << 20));
    assert_eq!(
        a.processes[0].peak_bytes,
        4 << 20,
        "a process's peak is of GPU memory"
    );
    assert_eq!(a.ooms.len(), 1);
    assert!(a.ooms[0].on_host);
    let d = diagnose::diagnose(&a, &a.ooms[0]);
    assert_eq!(d.cause, diagnose::Cause::HostMemory, "{:?}", d.reason);
}

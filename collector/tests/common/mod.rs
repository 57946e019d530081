//! Builds traces in memory for the tests.
#![allow(dead_code)]

pub mod cli;
pub mod diagnosis;
pub mod golden;
pub mod rng;
pub mod traces;

use vramtrace_format::codec::{encode_header, put_frame, put_record, put_varint};
use vramtrace_format::{
    flags, Api, EndKind, Event, Hello, Object, Objects, Oom, PyFrame, Record, Stack, TraceHeader,
    NO_DEVICE,
};

pub const START: u64 = 1_000_000_000;
pub const MS: u64 = 1_000_000;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

pub fn header() -> TraceHeader {
    TraceHeader {
        start_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: START,
        command: vec!["python".into(), "train.py".into(), "--say \"hi\"\n".into()],
        hostname: "node7".into(),
        vramtrace_version: "test".into(),
        // As today's collector writes it: a process's goodbye comes after its last record.
        extra: vec![("goodbye_last".into(), "1".into())],
    }
}

/// A trace of a collector before `goodbye_last`: the shim wrote the goodbye itself, at `exit`.
pub fn trace_goodbye_anywhere(records: &[Record]) -> Vec<u8> {
    let mut h = header();
    h.extra.clear();
    let mut t = encode_header(&h);
    for r in records {
        put_record(&mut t, r);
    }
    t
}

/// An event at `ms` milliseconds after the trace start.
pub fn ev(ms: u64, api: Api, device: u32, addr: u64, size: u64) -> Event {
    Event {
        ts_ns: START + ms * MS,
        tid: 1,
        api,
        flags: 0,
        device,
        result: 0,
        addr,
        size,
        aux: 0,
        stack: 0,
    }
}

pub fn alloc(ms: u64, device: u32, addr: u64, size: u64) -> Event {
    ev(ms, Api::MemAlloc, device, addr, size)
}

pub fn free(ms: u64, addr: u64) -> Event {
    ev(ms, Api::MemFree, NO_DEVICE, addr, 0)
}

pub fn failed(mut e: Event, result: u32) -> Event {
    e.result = result;
    e.addr = 0;
    e
}

pub fn ptsz(mut e: Event) -> Event {
    e.flags |= flags::PTSZ;
    e
}

pub fn hello(pid: u32, ms: u64) -> Record {
    Record::Hello(Hello {
        pid,
        ppid: 1,
        ts_ns: START + ms * MS,
        cmdline: vec![format!("/usr/bin/worker{pid}"), "--x".into()],
        hostname: "node7".into(),
        rank: Some(pid % 10),
        local_rank: Some(0),
        slurm_procid: None,
        shim_version: "test".into(),
        extra: vec![],
    })
}

pub fn events(pid: u32, evs: Vec<Event>) -> Record {
    Record::Events { pid, events: evs }
}

pub fn end(pid: u32, ms: u64, kind: EndKind) -> Record {
    Record::ProcessEnd {
        pid,
        ts_ns: START + ms * MS,
        kind,
    }
}

/// The goodbye of `pid` at `ms`, as the collector writes it.
pub fn goodbye(pid: u32, ms: u64) -> Record {
    Record::Goodbye {
        pid,
        ts_ns: START + ms * MS,
    }
}

pub fn tick(pid: u32, ms: u64) -> Record {
    Record::Tick {
        pid,
        ts_ns: START + ms * MS,
    }
}

pub fn trace(records: &[Record]) -> Vec<u8> {
    let mut t = encode_header(&header());
    for r in records {
        put_record(&mut t, r);
    }
    t
}

/// `e` allocated at call site `stack`.
pub fn with_stack(mut e: Event, stack: u32) -> Event {
    e.stack = stack;
    e
}

/// A Python frame.
pub fn py(file: &str, function: &str, line: u32) -> PyFrame {
    PyFrame {
        file: file.into(),
        function: function.into(),
        line,
    }
}

pub fn stack(pid: u32, id: u32, native: Vec<u64>, python: Vec<PyFrame>) -> Record {
    Record::Stack(Stack {
        pid,
        id,
        native,
        python,
    })
}

/// An object at `path` loaded with `bias`, its code at `text`.
pub fn object(path: &str, bias: u64, text: (u64, u64), build_id: &[u8]) -> Object {
    Object {
        path: path.into(),
        bias,
        text: vec![text],
        build_id: build_id.to_vec(),
    }
}

pub fn objects(pid: u32, ms: u64, objects: Vec<Object>) -> Record {
    Record::Objects(Objects {
        pid,
        ts_ns: START + ms * MS,
        objects,
    })
}

pub fn note(pid: u32, ms: u64, text: &str) -> Record {
    Record::Note {
        pid,
        ts_ns: START + ms * MS,
        text: text.into(),
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// The trace as a version-1 writer wrote it: version 1 in the header, events in frames of kind 2 (no stack
/// ids). Only records a version-1 writer knew.
pub fn trace_v1(records: &[Record]) -> Vec<u8> {
    let mut h = header();
    h.extra.clear();
    let mut t = encode_header(&h);
    t[8..10].copy_from_slice(&1u16.to_le_bytes());
    for r in records {
        match r {
            Record::Events { pid, events } => put_frame(&mut t, 2, |out| {
                put_varint(out, *pid as u64);
                put_varint(out, events.len() as u64);
                let (mut ts, mut tid, mut addr, mut aux) = (0u64, 0u32, 0u64, 0u64);
                for e in events {
                    put_varint(out, zigzag(e.ts_ns.wrapping_sub(ts) as i64));
                    put_varint(out, zigzag(e.tid.wrapping_sub(tid) as i32 as i64));
                    out.push(e.api as u8);
                    out.push(e.flags);
                    put_varint(out, e.device.wrapping_add(1) as u64);
                    put_varint(out, e.result as u64);
                    put_varint(out, zigzag(e.addr.wrapping_sub(addr) as i64));
                    put_varint(out, e.size);
                    put_varint(out, zigzag(e.aux.wrapping_sub(aux) as i64));
                    ts = e.ts_ns;
                    tid = e.tid;
                    addr = e.addr;
                    aux = e.aux;
                }
            }),
            Record::Stack(_) | Record::Objects(_) | Record::Note { .. } => {}
            r => put_record(&mut t, r),
        }
    }
    t
}

/// A GPU fixture recorded on an H100 (docs/GPU-RESULTS.md).
pub fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gpu")
        .join(name)
}

pub fn oom(pid: u32, ms: u64, device: u32, requested: u64, free: u64, cap_refused: bool) -> Record {
    Record::Oom(Oom {
        pid,
        tid: 1,
        ts_ns: START + ms * MS,
        device,
        api: Api::MemAlloc as u8,
        flags: if cap_refused { flags::CAP_REFUSED } else { 0 },
        requested_bytes: requested,
        result: 2,
        device_free_bytes: Some(free),
        device_total_bytes: Some(80 * GIB),
        cap_bytes: None,
        job_used_bytes: None,
        process_used_bytes: None,
        extra: vec![],
    })
}

/// For the exports: two processes on two devices: call sites, a lost free, the same address in both processes at once, an
/// address past 2^63, a process ending with memory held, a cuMemCreate handle mapped and unmapped, an OOM
/// and a cap refusal.
pub fn export_trace() -> Vec<u8> {
    let mut create = ev(5, Api::MemCreate, 1, 7, 64 * MIB);
    create.stack = 2;
    let mut map = ev(6, Api::MemMap, NO_DEVICE, 0x7f00_0000_0000, 64 * MIB);
    map.aux = 7;
    let unmap = ev(30, Api::MemUnmap, NO_DEVICE, 0x7f00_0000_0000, 64 * MIB);
    let release = ev(31, Api::MemRelease, NO_DEVICE, 7, 0);
    trace(&[
        hello(11, 0),
        hello(12, 0),
        stack(
            11,
            1,
            vec![],
            vec![py("train.py", "step", 42), py("train.py", "<module>", 7)],
        ),
        stack(11, 2, vec![], vec![py("model.py", "grow", 9)]),
        events(
            11,
            vec![
                with_stack(alloc(1, 0, 0xa000_0000, 2 * GIB), 1),
                alloc(2, 0, 0x3_0000_0000, 4 * MIB),
                // The same pointer again: its free was not recorded.
                alloc(3, 0, 0x3_0000_0000, 8 * MIB),
                create,
                map,
                free(20, 0xa000_0000),
                unmap,
                release,
            ],
        ),
        // Process 12 holds the same address as 11 at the same time (each process has its own), and one past
        // 2^63 that must still be written as a 64-bit signed integer.
        events(
            12,
            vec![
                alloc(4, 0, 0xa000_0000, GIB),
                alloc(8, 1, 0x8000_0000_0000_1000, 32 * MIB),
            ],
        ),
        oom(11, 25, 0, 80 * GIB, 3 * GIB, false),
        oom(12, 9, 1, 16 * GIB, 40 * GIB, true),
        tick(11, 40),
        end(12, 50, EndKind::Vanished),
        tick(11, 60),
    ])
}

/// A trace of one node of a job: its own hostname, clock and wall-clock start.
#[allow(dead_code)]
pub fn node_trace(
    host: &str,
    start_unix_ns: u64,
    start_mono_ns: u64,
    job: &str,
    bytes: u64,
) -> Vec<u8> {
    let mut h = header();
    h.hostname = host.into();
    h.start_unix_ns = start_unix_ns;
    h.start_mono_ns = start_mono_ns;
    h.extra = vec![("job".into(), job.into())];
    let mut t = vramtrace_format::codec::encode_header(&h);
    // Events are stamped on this node's clock: `ev` counts from the common header's start, so shift them.
    let shift = |mut e: vramtrace_format::Event| {
        e.ts_ns = e.ts_ns - START + start_mono_ns;
        e
    };
    let mut hello = hello(21, 0);
    if let vramtrace_format::Record::Hello(hh) = &mut hello {
        hh.ts_ns = hh.ts_ns - START + start_mono_ns;
        hh.hostname = host.into();
    }
    for r in [
        hello,
        events(
            21,
            vec![
                shift(alloc(10, 0, 0x1000, bytes)),
                shift(alloc(20, 0, 0x9000_0000, bytes / 2)),
                shift(free(30, 0x1000)),
            ],
        ),
    ] {
        vramtrace_format::codec::put_record(&mut t, &r);
    }
    t
}

/// Two nodes' traces of job 42 in `dir`: node-a (8 MiB then 4 MiB live at its peak) and node-b, started 2.5 s
/// later by the wall clock (4 + 2 MiB), each on a monotonic clock of its own.
pub fn two_node_traces(dir: &cli::TempDir) -> (std::path::PathBuf, std::path::PathBuf) {
    let a = dir.file(
        "a.vtrace",
        &node_trace(
            "node-a",
            1_700_000_000_000_000_000,
            5_000_000_000,
            "42",
            8 * MIB,
        ),
    );
    let b = dir.file(
        "b.vtrace",
        &node_trace(
            "node-b",
            1_700_000_002_500_000_000,
            900_000_000_000,
            "42",
            4 * MIB,
        ),
    );
    (a, b)
}

/// `vramtrace export TRACES --format FORMAT --out OUT`.
pub fn export_several(
    traces: &[&std::path::Path],
    format: &str,
    out: &std::path::Path,
) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .arg("export")
        .args(traces)
        .args(["--format", format, "--out"])
        .arg(out)
        .output()
        .unwrap()
}

/// A trace of another job (43) beside `a`, or `a` twice, is refused in one line, and nothing is written.
pub fn assert_refused_together(dir: &cli::TempDir, a: &std::path::Path, format: &str) {
    let c = dir.file(
        "c.vtrace",
        &node_trace(
            "node-c",
            1_700_000_001_000_000_000,
            7_000_000_000,
            "43",
            MIB,
        ),
    );
    let out = dir.0.join(format!("mixed.{format}"));
    cli::assert_usage_error(&export_several(&[a, &c], format, &out), "different jobs");
    assert!(!out.exists());
    // Twice the same trace would count everything in it twice: refused, even with --force.
    let copy = dir.0.join("copy.vtrace");
    std::fs::copy(a, &copy).unwrap();
    cli::assert_usage_error(&export_several(&[a, &copy], format, &out), "same trace");
    assert!(!out.exists());
}

/// A trace of `records` under `header`, replayed.
pub fn run_with(header: TraceHeader, records: &[Record]) -> vramtrace_collector::model::Analysis {
    let mut t = encode_header(&header);
    for r in records {
        put_record(&mut t, r);
    }
    vramtrace_collector::model::analyze_reader(&t[..]).unwrap()
}

/// The header of a job capped at `cap` bytes on GPU 0, a device of `total` bytes.
pub fn capped_header(cap: u64, total: u64) -> TraceHeader {
    let mut h = header();
    h.extra = vec![
        ("cap".into(), "x".into()),
        ("cap_mode".into(), "enforce".into()),
        ("device_total.0".into(), total.to_string()),
        ("cap_bytes.0".into(), cap.to_string()),
    ];
    h
}

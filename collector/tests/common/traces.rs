//! Traces built in memory for the golden tests (tests/json_golden.rs, tests/text_golden.rs) and the diagnosis
//! tests: what the fixtures lack (every string escape, call sites, growth, exit statuses, a process never
//! announced, a trace cut short, several traces of one job); `diagnosis.rs` adds one for each rule of the
//! diagnosis and each branch of its advice.

use super::cli::TempDir;
use super::*;
use vramtrace_format::codec::{encode_header, put_record};
use vramtrace_format::{
    Api, Bridge, EndKind, Exit, ExitStatus, Framework, FrameworkSample, LossCause, Oom, Record,
};

/// A string with every character JSON escapes (and DEL, which the reports escape too), a quote and a backslash,
/// and some it must not (non-ASCII, U+2028, `<`, `/`).
pub const ODD: &str = "q\"b\\s/n\nr\rt\tb\u{8}f\u{c}c\u{1}\u{1f}d\u{7f}é\u{2028}</script>";

/// `pid`'s out-of-memory record at `ms` on GPU 0 asking `requested` bytes (`common::oom`'s figures).
pub fn oom_of(pid: u32, ms: u64, requested: u64) -> Oom {
    match oom(pid, ms, 0, requested, 0, false) {
        Record::Oom(o) => o,
        _ => unreachable!("common::oom makes an out-of-memory record"),
    }
}

/// An out-of-memory record of `pid` at `ms` on `device` for `req` bytes, with the driver's free and total.
pub fn oom_at(
    pid: u32,
    ms: u64,
    device: u32,
    req: u64,
    free: Option<u64>,
    total: Option<u64>,
) -> Oom {
    Oom {
        pid,
        tid: pid + 1,
        ts_ns: START + ms * MS,
        device,
        api: Api::MemAlloc as u8,
        flags: 0,
        requested_bytes: req,
        result: 2,
        device_free_bytes: free,
        device_total_bytes: total,
        cap_bytes: None,
        job_used_bytes: None,
        process_used_bytes: None,
        extra: vec![],
    }
}

/// The failing allocation as the shim records it: result 2, no address.
pub fn refused(ms: u64, device: u32, size: u64, flag: u8) -> Event {
    let mut e = failed(alloc(ms, device, 0, size), 2);
    e.flags |= flag;
    e
}

/// The out-of-memory record of thread 1 of `pid` on device 0 (refused by the cap when `cap` is given).
pub fn oom_rec(pid: u32, ms: u64, req: u64, free: u64, total: u64, cap: Option<u64>) -> Record {
    Record::Oom(Oom {
        pid,
        tid: 1,
        ts_ns: START + ms * MS,
        device: 0,
        api: Api::MemAlloc as u8,
        flags: if cap.is_some() {
            vramtrace_format::flags::CAP_REFUSED
        } else {
            0
        },
        requested_bytes: req,
        result: 2,
        device_free_bytes: Some(free),
        device_total_bytes: Some(total),
        cap_bytes: cap,
        job_used_bytes: None,
        process_used_bytes: None,
        extra: vec![],
    })
}

/// PyTorch's own record of an error it raised (the bridge's `oom`), with `more` fields beside its figures.
pub fn torch_oom_with(
    pid: u32,
    ms: u64,
    req: u64,
    allocated: u64,
    reserved: u64,
    more: &[(&str, &str)],
) -> Record {
    let mut doc = serde_json::json!({
        "requested": req,
        "allowed_or_total": 80 * GIB,
        "device_free": 0,
        "allocated": allocated,
        "reserved": reserved,
        "alloc_retries": 1,
    });
    // `more` as text: the reader takes a count written as text as its number.
    for (k, v) in more {
        doc[*k] = serde_json::Value::String(v.to_string());
    }
    Record::Bridge(Bridge {
        pid,
        tid: 1,
        ts_ns: START + ms * MS,
        what: "oom".into(),
        device: 0,
        ack: true,
        doc: doc.to_string(),
    })
}

/// PyTorch's own record of an error it raised (the bridge's `oom`).
pub fn torch_oom(pid: u32, ms: u64, req: u64, allocated: u64, reserved: u64) -> Record {
    torch_oom_with(pid, ms, req, allocated, reserved, &[])
}

/// The bridge's sample of PyTorch's figures for `pid` on device 0 at `ms`.
pub fn torch_sample(pid: u32, ms: u64, allocated: u64) -> Record {
    Record::FrameworkSample(FrameworkSample {
        pid,
        ts_ns: START + ms * MS,
        framework: Framework::Torch,
        device: 0,
        allocated,
        reserved: allocated + 512 * MIB,
        active: allocated,
        inactive_split: 0,
        requested: allocated,
        alloc_retries: 0,
        ooms: 0,
    })
}

/// `cycles` training steps of 100 ms on GPU 0 over a persistent 1 GiB: a 4 GiB activation freed after 50 ms,
/// and with `leak`, a 64 MiB allocation each step never freed. Then one more step fails asking for 8 GiB.
pub fn training(cycles: u64, leak: bool) -> Vec<Record> {
    let mut evs = vec![alloc(1, 0, 0x1000, GIB)];
    for k in 0..=cycles {
        let t = 100 * k;
        evs.push(alloc(t + 10, 0, 0x2000, 4 * GIB));
        if leak {
            evs.push(alloc(t + 20, 0, 0x10_0000 + k * 0x1000, 64 * MIB));
        }
        if k < cycles {
            evs.push(free(t + 60, 0x2000));
        }
    }
    let at = 100 * cycles + 30;
    evs.push(refused(at, 0, 8 * GIB, 0));
    vec![
        hello(100, 0),
        events(100, evs),
        Record::Oom(oom_at(100, at, 0, 8 * GIB, Some(GIB), Some(8 * GIB))),
        end(100, at + 1, EndKind::Vanished),
    ]
}

/// A loop that keeps a `kept`-byte buffer per step beside a 256 MiB temporary, from `base` live bytes, until the
/// allocation of step `fail_at` is refused (with the cap `cap`, else by a device of `total`).
pub fn keeping_loop(base: u64, kept: u64, steps: u64, cap: Option<u64>, total: u64) -> Vec<Record> {
    let mut evs = vec![alloc(1, 0, 0x1000, base)];
    let mut live = base;
    let mut t = 10;
    let mut fail = None;
    for k in 0..steps {
        let limit = cap.unwrap_or(total);
        if live + 256 * MIB + kept > limit {
            fail = Some(t);
            break;
        }
        evs.push(alloc(t, 0, 0x2000, 256 * MIB));
        if kept > 0 {
            evs.push(alloc(t + 3, 0, 0x10_0000 + k * 0x1000, kept));
        }
        evs.push(free(t + 6, 0x2000));
        live += kept;
        t += 10;
    }
    let mut recs = vec![hello(100, 0)];
    if let Some(at) = fail {
        // The step's temporary and its kept buffer, asked for at once: more than the limit leaves.
        let req = 256 * MIB + kept;
        let flag = if cap.is_some() {
            vramtrace_format::flags::CAP_REFUSED
        } else {
            0
        };
        evs.push(refused(at, 0, req, flag));
        recs.push(events(100, evs));
        recs.push(oom_rec(
            100,
            at,
            req,
            total.saturating_sub(live),
            total,
            cap,
        ));
        recs.push(end(100, at + 1, EndKind::Vanished));
    } else {
        recs.push(events(100, evs));
        recs.push(end(100, t + 5, EndKind::Vanished));
    }
    recs
}

/// Strings of every kind, a process never announced, a dropped batch and its cause, exits by code and by
/// signal, an out-of-memory error without the driver's figures, and the trace cut in the middle of a frame.
pub fn odd_trace() -> Vec<u8> {
    let mut h = header();
    h.command = vec!["python".into(), ODD.into(), String::new()];
    h.hostname = format!("host {ODD}");
    let mut hi = hello(11, 0);
    if let Record::Hello(x) = &mut hi {
        x.cmdline.push(ODD.into());
        x.hostname = ODD.into();
    }
    let mut t = encode_header(&h);
    let mut refused = failed(alloc(30, 0, 0, 6 * GIB), 2);
    refused.stack = 1;
    let records = [
        hi,
        hello(12, 0),
        stack(
            11,
            1,
            vec![],
            vec![py(ODD, ODD, 3), py("train.py", "<module>", 0)],
        ),
        note(11, 2, ODD),
        events(
            11,
            vec![with_stack(alloc(10, 0, 0xa000, 10 * GIB), 1), refused],
        ),
        Record::Oom(Oom {
            device_free_bytes: None,
            device_total_bytes: None,
            ..oom_of(11, 30, 6 * GIB)
        }),
        // Never announced: no hello, no host.
        events(13, vec![alloc(12, 1, 0xb000, 3 * MIB)]),
        events(12, vec![ptsz(alloc(14, 1, 0xc000, MIB))]),
        Record::Dropped {
            pid: 12,
            ts_ns: START + 15 * MS,
            count: 7,
        },
        Record::Lost {
            pid: 12,
            ts_ns: START + 15 * MS,
            count: 7,
            cause: LossCause::RingFull,
        },
        end(12, 40, EndKind::Vanished),
        Record::Exit(Exit {
            pid: 12,
            ts_ns: START + 41 * MS,
            status: ExitStatus::Signal {
                signal: 9,
                core: true,
            },
        }),
        goodbye(11, 45),
        Record::Exit(Exit {
            pid: 11,
            ts_ns: START + 46 * MS,
            status: ExitStatus::Code(3),
        }),
        events(13, vec![alloc(50, 1, 0xd000, MIB)]),
    ];
    for r in &records {
        put_record(&mut t, r);
    }
    // The last frame cut short: the trace is partial.
    t.truncate(t.len() - 3);
    t
}

/// Training steps over a persistent 1 GiB, each keeping 64 MiB from one of two call sites (`sites`: their
/// Python frames), then an out-of-memory error asking `req` bytes with `free` of the device's 8 GiB free:
/// growth with its sites and figures.
pub fn growth_trace_at(sites: [Vec<PyFrame>; 2], req: u64, free_bytes: u64) -> Vec<u8> {
    let mut evs = vec![alloc(1, 0, 0x1000, GIB)];
    for k in 0..=10u64 {
        let t = 100 * k;
        evs.push(alloc(t + 10, 0, 0x2000, 4 * GIB));
        let site = 1 + (k % 2) as u32;
        evs.push(with_stack(
            alloc(t + 20, 0, 0x10_0000 + k * 0x1000, 64 * MIB),
            site,
        ));
        if k < 10 {
            evs.push(free(t + 60, 0x2000));
        }
    }
    let at = 1030;
    evs.push(failed(alloc(at, 0, 0, req), 2));
    let mut o = oom_of(100, at, req);
    o.device_free_bytes = Some(free_bytes);
    o.device_total_bytes = Some(8 * GIB);
    let [one, two] = sites;
    trace(&[
        hello(100, 0),
        stack(100, 1, vec![], one),
        stack(100, 2, vec![], two),
        events(100, evs),
        Record::Oom(o),
        end(100, at + 1, EndKind::Vanished),
    ])
}

/// Training steps over a persistent 1 GiB, each keeping 64 MiB from one of two call sites, then an
/// out-of-memory error: growth with its sites and figures.
pub fn growth_trace() -> Vec<u8> {
    growth_trace_at(
        [
            vec![py("model.py", "keep", 12)],
            vec![py("model.py", "keep_more", 20)],
        ],
        8 * GIB,
        GIB,
    )
}

/// A node's trace of job 42 with a second process that never announced itself (no host of its own).
pub fn node(host: &str, start_unix_ns: u64, start_mono_ns: u64, bytes: u64) -> Vec<u8> {
    let mut t = node_trace(host, start_unix_ns, start_mono_ns, "42", bytes);
    let mut e = alloc(25, 1, 0x5000, bytes / 4);
    e.ts_ns = e.ts_ns - START + start_mono_ns;
    put_record(&mut t, &events(77, vec![e]));
    t
}

/// A job capped at 6 GiB and a job name with a quote and a newline: refused by the cap once and recovered from;
/// refused again just after an async free (the pool's cache, beside the cause), the shim's ledger far from what
/// the trace saw live, and the process gone.
pub fn capped_trace() -> Vec<u8> {
    let mut capped = capped_header(6 * GIB, 80 * GIB);
    capped.extra.push(("job".into(), "odd \"job\"\n".into()));
    let mut t = encode_header(&capped);
    let mut capped_oom = oom_of(11, 15, 2 * GIB);
    capped_oom.flags = vramtrace_format::flags::CAP_REFUSED;
    capped_oom.device_free_bytes = Some(70 * GIB);
    capped_oom.job_used_bytes = Some(GIB);
    let mut async_alloc = ev(2, Api::MemAllocAsync, 0, 0xd000, 512 * MIB);
    async_alloc.aux = 7;
    let mut refused = failed(alloc(15, 0, 0, 2 * GIB), 2);
    refused.flags |= vramtrace_format::flags::CAP_REFUSED;
    for r in [
        hello(11, 0),
        events(11, vec![alloc(1, 0, 0xa000, 5 * GIB), async_alloc]),
        events(11, vec![failed(alloc(3, 0, 0, 2 * GIB), 2)]),
        oom(11, 3, 0, 2 * GIB, 70 * GIB, true),
        events(
            11,
            vec![
                alloc(4, 0, 0xb000, 512 * MIB),
                ev(14, Api::MemFreeAsync, 0, 0xd000, 0),
                refused,
            ],
        ),
        // The bridge's samples of PyTorch's figures, no record of its own of the error.
        Record::FrameworkSample(FrameworkSample {
            pid: 11,
            ts_ns: START + 14 * MS,
            framework: Framework::Torch,
            device: 0,
            allocated: 5 * GIB,
            reserved: 5 * GIB + 512 * MIB,
            active: 5 * GIB,
            inactive_split: 3 * MIB,
            requested: 5 * GIB - 1,
            alloc_retries: 2,
            ooms: 1,
        }),
        Record::Oom(capped_oom),
        end(11, 16, EndKind::Vanished),
    ] {
        put_record(&mut t, &r);
    }
    t
}

/// Writes every trace built here and in diagnosis.rs into `dir`; returns each golden's name with the traces
/// it reads (relative to `dir`, in the order given on the command line).
pub fn write_synthetic(dir: &TempDir) -> Vec<(String, Vec<String>)> {
    dir.file("export.vtrace", &export_trace());
    dir.file("odd.vtrace", &odd_trace());
    dir.file("growth.vtrace", &growth_trace());
    dir.file("capped.vtrace", &capped_trace());
    dir.file(
        "node-a.vtrace",
        &node("node-a", 1_700_000_000_000_000_000, 5_000_000_000, 8 * MIB),
    );
    dir.file(
        "node-b.vtrace",
        &node(
            "node-b",
            1_700_000_002_500_000_000,
            900_000_000_000,
            4 * MIB,
        ),
    );
    let mut v: Vec<(String, Vec<String>)> = ["export", "odd", "growth", "capped"]
        .into_iter()
        .map(|n| (format!("synthetic_{n}"), vec![format!("{n}.vtrace")]))
        .collect();
    // Several traces of one job (the fleet's JSON), given in the other order than their starts.
    v.push((
        "synthetic_job".into(),
        vec!["node-b.vtrace".into(), "node-a.vtrace".into()],
    ));
    for (n, t) in super::diagnosis::diagnosis_traces() {
        let file = format!("diag_{n}.vtrace");
        dir.file(&file, &t);
        v.push((format!("diag_{n}"), vec![file]));
    }
    v
}

//! A structure-aware fuzzer over the trace format: it writes traces that the collector could have written
//! (every record kind, plausible and extreme values), then breaks them the ways files break and attackers break
//! them (bits flipped, cut short, a frame's length changed, frames dropped, repeated, swapped, replaced with
//! noise, unknown kinds, a bad header), and puts each through everything that reads a trace: the replay, the
//! text and JSON reports, the post-mortems, and (every `export_every`-th case) the three exports. Every case
//! must end, without a panic, within `case_limit`. The counts it gives are in docs/FUZZING.md.
//!
//! Deterministic: a seed gives the same cases on every machine.

use std::io::Cursor;
use std::path::Path;
use std::time::{Duration, Instant};

use vramtrace_collector::model;
use vramtrace_collector::reporters::{json, oom_json, oom_text, text};
use vramtrace_collector::verbs::export::{self, ExportArgs, Format};
use vramtrace_format::codec;
use vramtrace_format::*;

/// xorshift64*: small, fast, the same everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn word(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.word() % n
        }
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
    /// Mostly plausible, sometimes extreme.
    fn size(&mut self) -> u64 {
        match self.below(20) {
            0 => u64::MAX,
            1 => 0,
            2 => u64::MAX - self.below(1 << 20),
            3 => 1 << self.below(64),
            _ => (1 + self.below(512)) << 20,
        }
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
}

/// A trace the collector could have written: a header and `records` records of every kind.
pub fn valid_trace(rng: &mut Rng, records: usize) -> Vec<u8> {
    let mut out = codec::encode_header(&TraceHeader {
        start_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: 1_000,
        command: vec!["python".into(), "train.py".into()],
        hostname: "node".into(),
        vramtrace_version: "fuzz".into(),
        extra: vec![],
    });
    let pids: Vec<u32> = (0..1 + rng.below(4)).map(|i| 100 + i as u32).collect();
    let mut ts = 1_000u64;
    let mut live: Vec<(u32, u64, u64)> = Vec::new();
    for &pid in &pids {
        codec::put_record(
            &mut out,
            &Record::Hello(Hello {
                pid,
                ppid: if pid == 100 { 1 } else { 100 },
                ts_ns: ts,
                cmdline: vec!["python".into(), format!("worker{pid}.py")],
                hostname: "node".into(),
                rank: Some(pid - 100),
                local_rank: Some(pid - 100),
                slurm_procid: None,
                shim_version: "fuzz".into(),
                extra: vec![],
            }),
        );
    }
    for _ in 0..records {
        ts = if rng.chance(30) {
            ts.saturating_sub(rng.below(1_000_000))
        } else {
            ts.saturating_add(rng.below(10_000_000))
        };
        let pid = *rng.pick(&pids);
        let device = if rng.chance(15) {
            NO_DEVICE
        } else {
            rng.below(3) as u32
        };
        let rec = match rng.below(17) {
            0..=5 => {
                let n = 1 + rng.below(40);
                let mut events = Vec::new();
                for _ in 0..n {
                    ts += rng.below(100_000);
                    let free = !live.is_empty() && rng.chance(2);
                    let (api, addr, size) = if free {
                        let i = rng.below(live.len() as u64) as usize;
                        let (_, a, s) = live.swap_remove(i);
                        (
                            *rng.pick(&[Api::MemFree, Api::MemFreeAsync, Api::MemRelease]),
                            a,
                            s,
                        )
                    } else {
                        let a = 0x7f00_0000_0000 + (rng.below(1 << 20) << 21);
                        let s = rng.size();
                        live.push((pid, a, s));
                        (*rng.pick(&Api::ALL), a, s)
                    };
                    events.push(Event {
                        ts_ns: ts,
                        tid: pid + rng.below(3) as u32,
                        api,
                        flags: rng.below(16) as u8,
                        device,
                        result: if rng.chance(12) { 2 } else { 0 },
                        addr,
                        size,
                        aux: if rng.chance(4) { rng.word() } else { 0 },
                        stack: rng.below(6) as u32,
                    });
                }
                Record::Events { pid, events }
            }
            6 => Record::Stack(Stack {
                pid,
                id: rng.below(6) as u32,
                native: (0..rng.below(8)).map(|_| rng.word()).collect(),
                python: (0..rng.below(4))
                    .map(|i| PyFrame {
                        file: format!("model{i}.py"),
                        function: "forward".into(),
                        line: rng.below(500) as u32,
                    })
                    .collect(),
            }),
            7 => Record::Objects(Objects {
                pid,
                ts_ns: ts,
                objects: vec![Object {
                    path: "/nonexistent/libtorch_cuda.so".into(),
                    bias: rng.word(),
                    text: vec![(rng.word(), rng.word())],
                    build_id: vec![1, 2, 3],
                }],
            }),
            8 => Record::Oom(Oom {
                pid,
                tid: pid,
                ts_ns: ts,
                device,
                api: rng.below(20) as u8,
                flags: rng.below(16) as u8,
                requested_bytes: rng.size(),
                result: 2,
                device_free_bytes: rng.chance(2).then(|| rng.size()),
                device_total_bytes: rng.chance(2).then(|| rng.size()),
                cap_bytes: rng.chance(3).then(|| rng.size()),
                job_used_bytes: rng.chance(3).then(|| rng.size()),
                process_used_bytes: rng.chance(3).then(|| rng.size()),
                extra: vec![],
            }),
            9 => Record::FrameworkSample(FrameworkSample {
                pid,
                ts_ns: ts,
                framework: if rng.chance(2) {
                    Framework::Torch
                } else {
                    Framework::Jax
                },
                device,
                allocated: rng.size(),
                reserved: rng.size(),
                active: rng.size(),
                inactive_split: rng.size(),
                requested: rng.size(),
                alloc_retries: rng.below(5),
                ooms: rng.below(3),
            }),
            10 => {
                let what = rng.pick(&["attach", "oom", "snapshot", "note", "exit", "history"]);
                Record::Bridge(Bridge {
                    pid,
                    tid: pid,
                    ts_ns: ts,
                    what: what.to_string(),
                    device,
                    ack: rng.chance(2),
                    fields: vec![
                        ("requested".into(), rng.size().to_string()),
                        ("path".into(), "/nonexistent/snap.pickle".into()),
                        ("reason".into(), "flush".into()),
                    ],
                })
            }
            11 => Record::Note {
                pid,
                ts_ns: ts,
                text: "a note".into(),
            },
            12 => Record::ContextGone {
                pid,
                ts_ns: ts,
                device,
                how: "cuCtxDestroy".into(),
            },
            13 => Record::Dropped {
                pid,
                ts_ns: ts,
                count: rng.size(),
            },
            14 => Record::Lost {
                pid,
                ts_ns: ts,
                count: rng.below(1000),
                cause: *rng.pick(&[
                    LossCause::RingFull,
                    LossCause::CollectorStalled,
                    LossCause::DiedMidRecord,
                    LossCause::Refused,
                    LossCause::DiedMidNonEvent,
                ]),
            },
            15 => Record::Tick { pid, ts_ns: ts },
            _ => Record::Goodbye { pid, ts_ns: ts },
        };
        codec::put_record(&mut out, &rec);
    }
    for &pid in &pids {
        ts += 1000;
        codec::put_record(
            &mut out,
            &Record::ProcessEnd {
                pid,
                ts_ns: ts,
                kind: EndKind::Vanished,
            },
        );
        codec::put_record(
            &mut out,
            &Record::Exit(Exit {
                pid,
                ts_ns: ts,
                status: if rng.chance(3) {
                    ExitStatus::Signal {
                        signal: 9,
                        core: false,
                    }
                } else {
                    ExitStatus::Code(rng.below(3) as i32)
                },
            }),
        );
    }
    codec::put_record(&mut out, &Record::End { ts_ns: ts + 1 });
    out
}

/// Where the frames of `t` begin and end, after its header (`start`).
fn frame_spans(t: &[u8], start: usize) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut pos = start;
    while pos + 5 <= t.len() {
        let len = u32::from_le_bytes(t[pos..pos + 4].try_into().unwrap()) as usize;
        if len == 0 || pos + 4 + len > t.len() {
            break;
        }
        spans.push((pos, pos + 4 + len));
        pos += 4 + len;
    }
    spans
}

/// The kinds of damage done to a trace.
pub const MUTATIONS: [&str; 10] = [
    "bits flipped",
    "cut short",
    "a frame's length changed",
    "a frame dropped",
    "a frame repeated",
    "two frames swapped",
    "a payload replaced with noise",
    "a frame of an unknown kind",
    "the header damaged",
    "varints overlong",
];

/// Breaks `t` (whose frames start at `start`) in one of the ways of [`MUTATIONS`]; which one.
pub fn mutate(rng: &mut Rng, t: &mut Vec<u8>, start: usize) -> usize {
    if t.len() <= start {
        // Nothing after the header is left: a frame of noise.
        t.extend((0..1 + rng.below(16)).map(|_| rng.word() as u8));
        return 7;
    }
    let spans = frame_spans(t, start);
    let m = rng.below(MUTATIONS.len() as u64) as usize;
    let one = |rng: &mut Rng| spans[rng.below(spans.len() as u64) as usize];
    match m {
        0 => {
            for _ in 0..1 + rng.below(8) {
                let i = start + rng.below((t.len() - start) as u64) as usize;
                t[i] ^= 1 << rng.below(8);
            }
        }
        1 => t.truncate(start + rng.below((t.len() - start) as u64) as usize),
        2 if !spans.is_empty() => {
            let (s, e) = one(rng);
            let len = (e - s - 4) as u32;
            let new = match rng.below(5) {
                0 => 0,
                1 => u32::MAX,
                2 => len.saturating_add(1 + rng.below(16) as u32),
                3 => len.saturating_sub(1 + rng.below(16) as u32).max(1),
                _ => (64 << 20) + 1,
            };
            t[s..s + 4].copy_from_slice(&new.to_le_bytes());
        }
        3 if !spans.is_empty() => {
            let (s, e) = one(rng);
            t.drain(s..e);
        }
        4 if !spans.is_empty() => {
            let (s, e) = one(rng);
            let f = t[s..e].to_vec();
            for _ in 0..1 + rng.below(3) {
                t.splice(e..e, f.iter().copied());
            }
        }
        5 if spans.len() >= 2 => {
            let (a, b) = (one(rng), one(rng));
            let (a, b) = if a.0 <= b.0 { (a, b) } else { (b, a) };
            if a.1 <= b.0 {
                let fa = t[a.0..a.1].to_vec();
                let fb = t[b.0..b.1].to_vec();
                t.splice(b.0..b.1, fa);
                t.splice(a.0..a.1, fb);
            }
        }
        6 if !spans.is_empty() => {
            let (s, e) = one(rng);
            for b in &mut t[s + 5..e] {
                *b = rng.word() as u8;
            }
        }
        7 => {
            let at = spans
                .get(rng.below(spans.len() as u64 + 1) as usize)
                .map_or(t.len(), |s| s.0);
            let n = rng.below(64) as usize;
            let mut f = ((n + 1) as u32).to_le_bytes().to_vec();
            f.push(18 + rng.below(200) as u8);
            f.extend((0..n).map(|_| rng.word() as u8));
            t.splice(at..at, f);
        }
        8 => {
            let i = rng.below(start as u64) as usize;
            t[i] = rng.word() as u8;
        }
        9 if !spans.is_empty() => {
            // An events payload's varints made endless.
            let (s, e) = one(rng);
            let i = s + 5 + rng.below((e - s - 5).max(1) as u64) as usize;
            for b in t.iter_mut().take(e).skip(i) {
                *b |= 0x80;
            }
        }
        _ => {
            let i = start + rng.below((t.len() - start) as u64) as usize;
            t[i] ^= 0xff;
        }
    }
    m
}

/// What the cases came to.
#[derive(Debug, Default)]
pub struct Counts {
    pub cases: u64,
    /// Replayed (a partial answer at most).
    pub replayed: u64,
    /// Refused as a trace, with one line.
    pub refused: u64,
    /// Frames that did not decode, skipped and counted by the replay.
    pub bad_frames: u64,
    pub exported: u64,
    /// Per mutation: cases.
    pub by_mutation: [u64; MUTATIONS.len()],
    pub slowest: Duration,
    pub panics: Vec<(u64, String)>,
}

/// Runs `cases` cases from `seed`. Panics are caught and counted (with their case number), never hidden.
pub fn run(seed: u64, cases: u64, export_every: u64, dir: &Path) -> Counts {
    let mut c = Counts::default();
    let trace_path = dir.join("case.vtrace");
    for case in 0..cases {
        let mut rng = Rng::new(seed ^ case.wrapping_mul(0x1000_0000_01B3));
        let records = 1 + rng.below(120) as usize;
        let mut t = valid_trace(&mut rng, records);
        let start = codec::encode_header(&TraceHeader {
            start_unix_ns: 1_700_000_000_000_000_000,
            start_mono_ns: 1_000,
            command: vec!["python".into(), "train.py".into()],
            hostname: "node".into(),
            vramtrace_version: "fuzz".into(),
            extra: vec![],
        })
        .len();
        for _ in 0..1 + rng.below(3) {
            let at = start.min(t.len());
            let m = mutate(&mut rng, &mut t, at);
            c.by_mutation[m] += 1;
        }
        let export = export_every > 0 && case % export_every == 0;
        let began = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            read_everything(&t, export.then_some(trace_path.as_path()), dir)
        }));
        c.slowest = c.slowest.max(began.elapsed());
        c.cases += 1;
        match outcome {
            Ok(Some(bad)) => {
                c.replayed += 1;
                c.bad_frames += bad;
                c.exported += u64::from(export);
            }
            Ok(None) => c.refused += 1,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                let _ = std::fs::write(dir.join(format!("panic-{case}.vtrace")), &t);
                c.panics.push((case, msg));
            }
        }
    }
    c
}

/// Everything that reads a trace, on `t`: the bad frames counted, or `None` when it is refused as a trace.
fn read_everything(t: &[u8], export_to: Option<&Path>, dir: &Path) -> Option<u64> {
    let mut a = model::analyze_reader_with(Cursor::new(t), None).ok()?;
    let bad = a.bad_frames;
    let _ = text::render(&a, None);
    let _ = json::render(&a);
    let _ = oom_text::render(&a, None);
    let _ = oom_text::render_short(&a, None);
    let _ = oom_json::render(&a);
    model::read_snapshots(&mut a, Path::new("/nonexistent.vtrace"));
    if let Some(p) = export_to {
        std::fs::write(p, t).ok()?;
        for format in [Format::Html, Format::Perfetto, Format::MemoryViz] {
            let args = ExportArgs {
                trace: vec![p.to_path_buf()],
                format,
                out: dir.join("case.out"),
                force: true,
                max_events: 100_000,
            };
            let _ = export::export(&args);
        }
    }
    Some(bad)
}

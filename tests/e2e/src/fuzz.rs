//! A structure-aware fuzzer over the trace format: it writes traces that the collector could have written
//! (every record kind, plausible and extreme values), then breaks them the ways files break and attackers break
//! them (bits flipped, cut short, a frame's length changed, frames dropped, repeated, swapped, replaced with
//! noise, unknown kinds, a bad header), and puts each through everything that reads a trace: the replay, the
//! text and JSON reports, the post-mortems, and (every `export_every`-th case) the three exports.
//!
//! Each case draws a [`Shape`]: for each of devices, processes, stack ids, addresses and times, whether it uses
//! a few plausible values, the extremes (0, 1, 2^31, 2^32 - 1, 2^64 - 1, ...) or a new value nearly every time
//! (a trace naming thousands of devices); one case in 40 is large (tens of thousands of events), so that a
//! reader whose cost grows faster than its input shows it. Each case runs in a child process of its own
//! ([`Limits`]): one that panics, takes longer than its time or asks for more memory than its share (an
//! abort) is a failure, kept with its seed and number, and the run goes on. The counts it gives are in
//! docs/FUZZING.md.
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
            4 => *self.pick(&EXTREMES),
            _ => (1 + self.below(512)) << 20,
        }
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
}

/// The values at the edges of the fields' ranges.
const EXTREMES: [u64; 9] = [
    0,
    1,
    2,
    1 << 31,
    (1 << 32) - 2,
    (1 << 32) - 1,
    1 << 63,
    u64::MAX - 1,
    u64::MAX,
];

/// How a case draws the values of one field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// A few plausible values.
    Few,
    /// The edges of its range ([`EXTREMES`]), and a few plausible ones.
    Extremes,
    /// A new value nearly every time.
    Many,
}

/// How a case draws devices, processes, stack ids, addresses and times, and whether it is large.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub device: Spread,
    pub pid: Spread,
    pub stack: Spread,
    pub addr: Spread,
    pub time: Spread,
    pub large: bool,
}

impl Shape {
    /// Each field plausible half the time, at its edges or spread wide a quarter each; one case in 40 large.
    pub fn draw(rng: &mut Rng) -> Shape {
        let mut spread = || match rng.below(4) {
            0 => Spread::Extremes,
            1 => Spread::Many,
            _ => Spread::Few,
        };
        let (device, pid, stack, addr, time) = (spread(), spread(), spread(), spread(), spread());
        Shape {
            device,
            pid,
            stack,
            addr,
            time,
            large: rng.chance(40),
        }
    }
}

impl Rng {
    /// A value of a field: `few` (plausible) for [`Spread::Few`], an edge or `few` for [`Spread::Extremes`],
    /// anything for [`Spread::Many`].
    fn spread(&mut self, s: Spread, few: u64) -> u64 {
        match s {
            Spread::Few => few,
            Spread::Extremes if self.chance(2) => *self.pick(&EXTREMES),
            Spread::Extremes => few,
            Spread::Many => self.word(),
        }
    }
}

/// The header of every case.
fn header() -> TraceHeader {
    TraceHeader {
        start_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: 1_000,
        command: vec!["python".into(), "train.py".into()],
        hostname: "node".into(),
        vramtrace_version: "fuzz".into(),
        extra: vec![],
    }
}

/// A trace the collector could have written: a header and `records` records of every kind, its values drawn
/// as `shape` says.
pub fn valid_trace(rng: &mut Rng, records: usize, shape: Shape) -> Vec<u8> {
    let mut out = codec::encode_header(&header());
    let processes = match shape.pid {
        Spread::Many => 1 + rng.below(if shape.large { 5_000 } else { 300 }),
        _ => 1 + rng.below(4),
    };
    let pids: Vec<u32> = (0..processes)
        .map(|i| rng.spread(shape.pid, 100 + i) as u32)
        .collect();
    let events_per_record = if shape.large { 400 } else { 40 };
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
                rank: Some(pid.wrapping_sub(100)),
                local_rank: Some(pid.wrapping_sub(100)),
                slurm_procid: None,
                shim_version: "fuzz".into(),
                extra: vec![],
            }),
        );
    }
    for _ in 0..records {
        let next = if rng.chance(30) {
            ts.saturating_sub(rng.below(1_000_000))
        } else {
            ts.saturating_add(rng.below(10_000_000))
        };
        ts = rng.spread(shape.time, next);
        let pid = *rng.pick(&pids);
        let device = if rng.chance(15) {
            NO_DEVICE
        } else {
            let few = rng.below(3);
            rng.spread(shape.device, few) as u32
        };
        let rec = match rng.below(17) {
            0..=5 => {
                let n = 1 + rng.below(events_per_record);
                let mut events = Vec::new();
                for _ in 0..n {
                    let next = ts.saturating_add(rng.below(100_000));
                    ts = rng.spread(shape.time, next);
                    // A device per event when they are spread wide (the record's otherwise).
                    let device = match shape.device {
                        Spread::Many if !rng.chance(4) => rng.word() as u32,
                        _ => device,
                    };
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
                        let few = 0x7f00_0000_0000 + (rng.below(1 << 20) << 21);
                        let a = rng.spread(shape.addr, few);
                        let s = rng.size();
                        live.push((pid, a, s));
                        (*rng.pick(&Api::ALL), a, s)
                    };
                    events.push(Event {
                        ts_ns: ts,
                        tid: pid.wrapping_add(rng.below(3) as u32),
                        api,
                        flags: rng.below(16) as u8,
                        device,
                        result: if rng.chance(12) { 2 } else { 0 },
                        addr,
                        size,
                        aux: if rng.chance(4) { rng.word() } else { 0 },
                        stack: {
                            let few = rng.below(6);
                            rng.spread(shape.stack, few) as u32
                        },
                    });
                }
                Record::Events { pid, events }
            }
            6 => Record::Stack(Stack {
                pid,
                id: {
                    let few = rng.below(6);
                    rng.spread(shape.stack, few) as u32
                },
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
                let what = rng.pick(&[
                    "attach", "oom", "snapshot", "note", "exit", "history", "holders", "steps",
                ]);
                Record::Bridge(Bridge {
                    pid,
                    tid: pid,
                    ts_ns: ts,
                    what: what.to_string(),
                    device,
                    ack: rng.chance(2),
                    // A body of the schema's keys, some of the wrong type; now and then no JSON at all.
                    doc: if rng.chance(4) {
                        "{\"requested\": [".repeat(rng.below(64) as usize + 1)
                    } else {
                        format!(
                            r#"{{"requested":{},"path":"/nonexistent/snap.pickle","reason":"flush","at":"oom","oom":{},"holders":[{{"kind":"graph","bytes":{},"nodes":"x"}},{}],"problems":[1,"p"]}}"#,
                            rng.size(),
                            rng.below(3),
                            rng.size(),
                            rng.below(9)
                        )
                    },
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
        ts = ts.saturating_add(1000);
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
    codec::put_record(
        &mut out,
        &Record::End {
            ts_ns: ts.saturating_add(1),
        },
    );
    out
}

/// Where the frames of `t` begin and end, after its header (`start`).
pub fn frame_spans(t: &[u8], start: usize) -> Vec<(usize, usize)> {
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

/// What each case may take: past `time` it is killed, and it may map `memory` bytes more than the runner holds
/// (past that, an allocation fails and it aborts). Either is a failure, said with the case's seed and number.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub time: Duration,
    pub memory: u64,
    /// The whole run stops starting cases after this long (the cases done are counted).
    pub budget: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            time: Duration::from_secs(20),
            memory: 1 << 30,
            budget: None,
        }
    }
}

/// What the cases came to.
#[derive(Debug, Default)]
pub struct Counts {
    pub seed: u64,
    pub cases: u64,
    /// Replayed (a partial answer at most).
    pub replayed: u64,
    /// Refused as a trace, with one line.
    pub refused: u64,
    /// Frames that did not decode, skipped and counted by the replay.
    pub bad_frames: u64,
    pub exported: u64,
    /// Large cases (tens of thousands of events), and cases with devices spread wide.
    pub large: u64,
    pub many_devices: u64,
    /// Per mutation: cases.
    pub by_mutation: [u64; MUTATIONS.len()],
    pub slowest: Duration,
    /// (case, what): a panic with its message.
    pub panics: Vec<(u64, String)>,
    /// (case, what): killed past its time, or dead of a signal (an abort: past its memory).
    pub killed: Vec<(u64, String)>,
}

impl Counts {
    /// Every failure, one line each, with what reproduces it (`fuzz_trace 1 SEED CASE`).
    pub fn failures(&self) -> Vec<String> {
        self.panics
            .iter()
            .map(|(c, m)| (c, format!("panicked: {m}")))
            .chain(self.killed.iter().map(|(c, m)| (c, m.clone())))
            .map(|(c, m)| format!("seed {} case {c}: {m}", self.seed))
            .collect()
    }
}

/// How a case ended, as its child process said.
enum Outcome {
    Read(u64),
    Refused,
    Panicked(String),
    Killed(String),
}

/// Runs `cases` cases from `seed`, starting at case `first`, each in a child process within `limits`.
/// Failures are counted (with their case number) and the case is kept in `dir`, never hidden.
pub fn run_cases(
    seed: u64,
    first: u64,
    cases: u64,
    export_every: u64,
    dir: &Path,
    limits: Limits,
) -> Counts {
    let mut c = Counts {
        seed,
        ..Counts::default()
    };
    let trace_path = dir.join("case.vtrace");
    let started = Instant::now();
    for case in first..first.saturating_add(cases) {
        if limits.budget.is_some_and(|b| started.elapsed() >= b) {
            break;
        }
        let (t, shape, mutations) = case_trace(seed, case);
        for m in mutations {
            c.by_mutation[m] += 1;
        }
        c.large += u64::from(shape.large);
        c.many_devices += u64::from(shape.device == Spread::Many);
        let export = export_every > 0 && case % export_every == 0;
        let began = Instant::now();
        let outcome = isolated(limits, || {
            read_everything(&t, export.then_some(trace_path.as_path()), dir)
        });
        c.slowest = c.slowest.max(began.elapsed());
        c.cases += 1;
        match outcome {
            Outcome::Read(bad) => {
                c.replayed += 1;
                c.bad_frames += bad;
                c.exported += u64::from(export);
            }
            Outcome::Refused => c.refused += 1,
            Outcome::Panicked(msg) => {
                let _ = std::fs::write(dir.join(format!("panic-{seed}-{case}.vtrace")), &t);
                c.panics.push((case, msg));
            }
            Outcome::Killed(why) => {
                let _ = std::fs::write(dir.join(format!("killed-{seed}-{case}.vtrace")), &t);
                c.killed.push((case, why));
            }
        }
    }
    c
}

/// [`run_cases`] from case 0, within the default [`Limits`].
pub fn run(seed: u64, cases: u64, export_every: u64, dir: &Path) -> Counts {
    run_cases(seed, 0, cases, export_every, dir, Limits::default())
}

/// Case `case` of `seed`: its trace, its shape and the mutations done to it.
pub fn case_trace(seed: u64, case: u64) -> (Vec<u8>, Shape, Vec<usize>) {
    let mut rng = Rng::new(seed ^ case.wrapping_mul(0x1000_0000_01B3));
    let shape = Shape::draw(&mut rng);
    let records = if shape.large {
        200 + rng.below(400) as usize
    } else {
        1 + rng.below(120) as usize
    };
    let mut t = valid_trace(&mut rng, records, shape);
    let start = codec::encode_header(&header()).len();
    let mut mutations = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let at = start.min(t.len());
        mutations.push(mutate(&mut rng, &mut t, at));
    }
    (t, shape, mutations)
}

/// `f` run in a child process: its address space `limits.memory` over this one's, killed past `limits.time`.
/// The child says how it ended on a pipe; a child that dies without saying was killed (its signal says why).
fn isolated(limits: Limits, f: impl FnOnce() -> Option<u64>) -> Outcome {
    use std::io::{Read, Write};
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Outcome::Killed(format!("no pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the descriptors are fresh and owned here, each by one File.
    let (mut from_child, to_parent) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    let mapped_now = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096);
    // SAFETY: the child only runs `f` (the collector's readers, which start threads of their own) and leaves
    // with `_exit`, never returning into the parent's code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Outcome::Killed(format!("no fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        drop(from_child);
        let mut to_parent = to_parent;
        let room = mapped_now.saturating_add(limits.memory);
        let lim = libc::rlimit {
            rlim_cur: room,
            rlim_max: room,
        };
        // SAFETY: plain system calls on this process.
        unsafe {
            libc::setrlimit(libc::RLIMIT_AS, &lim);
            libc::alarm(limits.time.as_secs().max(1) as u32);
        }
        let said = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(Some(bad)) => format!("R{bad}"),
            Ok(None) => "X".to_string(),
            Err(p) => format!(
                "P{}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            ),
        };
        let _ = to_parent.write_all(said.as_bytes());
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(0) }
    }
    drop(to_parent);
    let mut said = String::new();
    let _ = from_child.read_to_string(&mut said);
    let mut status = 0;
    // SAFETY: waits for the child just made.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if let Some(bad) = said.strip_prefix('R') {
        return Outcome::Read(bad.parse().unwrap_or(0));
    }
    if said == "X" {
        return Outcome::Refused;
    }
    if let Some(msg) = said.strip_prefix('P') {
        return Outcome::Panicked(msg.to_string());
    }
    let sig = libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status));
    Outcome::Killed(match sig {
        Some(libc::SIGALRM) => format!("took more than {} s", limits.time.as_secs().max(1)),
        Some(libc::SIGABRT) => format!(
            "aborted (an allocation past its {} MiB, or a stack overflow)",
            limits.memory >> 20
        ),
        Some(s) => format!("died of signal {s}"),
        None => format!("ended without a word (status {status:#x})"),
    })
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
    vramtrace_collector::whatif::trace_file::read_snapshots(
        &mut a,
        Path::new("/nonexistent.vtrace"),
    );
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

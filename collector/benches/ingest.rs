//! How fast `vramtrace report` replays a large trace, and in how much memory.
//!
//! `cargo bench -p vramtrace --bench ingest` (plain std timing, no harness). It generates a realistic trace in
//! memory: ranks on their own GPUs, caching-allocator-like alloc/free traffic with address reuse, a few threads
//! and streams each, some cuMemCreate/cuMemMap, memory-info queries and failed allocations, sent in batches of
//! up to 1024 events in roughly arrival order (so processes' batches overlap in time), with ticks. Then it
//! times the replay from memory and from a file, and reads the replay's peak RSS (VmHWM, reset before it).
//!
//! The "stacks" scenario gives each rank 200 call sites (stack records of 24 native and 8 Python frames, and
//! its loaded objects) and every allocation one of them, so the replay also keeps each site's figures (live,
//! allocated, live at each peak) and the report picks and labels the top ones.
//!
//! The "late" scenarios send every other batch of a process after the next one (threads racing to the shim's
//! queue), and "silent" adds a process that never sends after its hello: the merge then holds everything back
//! and spills sorted runs to a temporary file past its bound (`MERGE_BOUND`).
//!
//! Targets: >= 5 M events/s on one core, <= 24 bytes per event, 10 M events in <= 2 s and <= 500 MB.
//! `VRAMTRACE_BENCH_EVENTS` changes the number of events (default 10 M).

use std::hint::black_box;
use std::time::Instant;

use vramtrace_collector::model::{analyze_reader, Analysis};
use vramtrace_collector::whatif::trace_file::analyze;
use vramtrace_format::codec::{encode_header, put_events, put_record};
use vramtrace_format::{
    Api, EndKind, Event, Hello, Object, Objects, PyFrame, Record, Stack, TraceHeader, NO_DEVICE,
};

/// Call sites per rank in the stacks scenario.
const STACKS: u64 = 200;

const START: u64 = 5_000_000_000;

#[path = "../tests/common/rng.rs"]
mod rng;
use rng::Rng;

struct Proc {
    pid: u32,
    device: u32,
    now: u64,
    rng: Rng,
    /// Live buffers: (address, is a handle).
    live: Vec<(u64, bool)>,
    /// Freed addresses by size class, reused first (a caching allocator's free lists).
    free_lists: Vec<Vec<u64>>,
    bump: u64,
    next_handle: u64,
    /// Give allocations one of [`STACKS`] call sites.
    stacks: bool,
}

impl Proc {
    fn new(pid: u32, device: u32) -> Proc {
        Proc {
            pid,
            device,
            now: START + 1_000_000 + pid as u64 * 1000,
            rng: Rng(0x9e37_79b9_7f4a_7c15 ^ (pid as u64) << 17),
            live: Vec::new(),
            free_lists: vec![Vec::new(); 20],
            bump: 0x7f00_0000_0000 + ((pid as u64) << 36),
            next_handle: 1,
            stacks: false,
        }
    }

    fn event(&mut self, api: Api, device: u32, addr: u64, size: u64) -> Event {
        self.now += 1_000 + self.rng.below(20_000);
        let tid = 1000 + self.rng.below(3) as u32;
        Event {
            ts_ns: self.now,
            tid,
            api,
            flags: 0,
            device,
            result: 0,
            addr,
            size,
            // Streams: one per thread.
            aux: if matches!(api, Api::MemAllocAsync | Api::MemFreeAsync) {
                0x5600_0000_0000 + tid as u64 * 0x100
            } else {
                0
            },
            stack: if self.stacks
                && matches!(
                    api.effect(),
                    vramtrace_format::Effect::AllocPtr | vramtrace_format::Effect::CreateHandle
                ) {
                1 + self.rng.below(STACKS) as u32
            } else {
                0
            },
        }
    }

    /// Appends the next step of traffic (one or a few events).
    fn step(&mut self, out: &mut Vec<Event>) {
        let r = self.rng.below(10_000);
        let want_free = !self.live.is_empty() && (self.live.len() > 400 || self.rng.below(2) == 0);
        if r < 10 {
            // Driver memory query.
            let e = self.event(Api::MemGetInfo, self.device, 80 << 30, 20 << 30);
            out.push(e);
        } else if r < 15 {
            // A failed allocation.
            let mut e = self.event(Api::MemAlloc, self.device, 0, 90 << 30);
            e.result = 2;
            out.push(e);
        } else if r < 60 && !want_free {
            // Virtual memory management: reserve, create, map; released later like any buffer.
            let size = 2 << 20;
            let va = self.bump;
            self.bump += size;
            let h = self.next_handle;
            self.next_handle += 1;
            out.push(self.event(Api::MemAddressReserve, self.device, va, size));
            out.push(self.event(Api::MemCreate, self.device, h, size));
            let mut m = self.event(Api::MemMap, self.device, va, size);
            m.aux = h;
            out.push(m);
            self.live.push((h, true));
        } else if want_free {
            let i = self.rng.below(self.live.len() as u64) as usize;
            let (addr, handle) = self.live.swap_remove(i);
            if handle {
                let e = self.event(Api::MemRelease, NO_DEVICE, addr, 0);
                out.push(e);
            } else {
                let api = if addr & 1 == 0 {
                    Api::MemFreeAsync
                } else {
                    Api::MemFree
                };
                let e = self.event(api, NO_DEVICE, addr & !1, 0);
                out.push(e);
                let class = ((addr >> 1) & 31) as usize;
                self.free_lists[class.min(19)].push(addr);
            }
        } else {
            // Sizes: 512 B to 512 MiB, mostly small.
            let class = (self.rng.below(20) * self.rng.below(20) / 19) as usize;
            let size = 512u64 << class;
            let size = size + self.rng.below(size);
            let addr = match self.free_lists[class].pop() {
                Some(a) => a,
                None => {
                    let a = self.bump | (class as u64) << 1;
                    self.bump += (size + (2 << 20)) & !((2 << 20) - 1);
                    // Low bit set: freed with cuMemFree, else cuMemFreeAsync.
                    if self.rng.below(4) == 0 {
                        a | 1
                    } else {
                        a
                    }
                }
            };
            let api = if addr & 1 == 0 {
                Api::MemAllocAsync
            } else {
                Api::MemAlloc
            };
            let mut e = self.event(api, self.device, addr & !1, size);
            if self.rng.below(8) == 0 {
                e.flags = vramtrace_format::flags::PTSZ;
            }
            out.push(e);
            self.live.push((addr, false));
        }
    }
}

/// A rank's loaded objects and its [`STACKS`] call sites.
fn call_sites(out: &mut Vec<u8>, pid: u32) {
    let lib = |i: u64| 0x7e00_0000_0000 + i * 0x1000_0000;
    let objects = (0..40u64)
        .map(|i| Object {
            path: format!("/opt/env/lib/libbench{i}.so"),
            bias: lib(i),
            text: vec![(lib(i) + 0x1000, lib(i) + 0x80_0000)],
            build_id: vec![i as u8; 20],
        })
        .collect();
    put_record(
        out,
        &Record::Objects(Objects {
            pid,
            ts_ns: START + 2_000,
            objects,
        }),
    );
    for id in 1..=STACKS {
        let native = (0..24u64)
            .map(|k| lib((id + k) % 40) + 0x1000 + id * 0x100 + k * 8)
            .collect();
        let python = (0..8u64)
            .map(|k| PyFrame {
                file: format!("/home/u/proj/module{}.py", (id + k) % 17),
                function: format!("function_{}", (id * 7 + k) % 53),
                line: (10 + id + k) as u32,
            })
            .collect();
        put_record(
            out,
            &Record::Stack(Stack {
                pid,
                id: id as u32,
                native,
                python,
            }),
        );
    }
}

/// A trace of `n_events` events of `procs` ranks (also the export benchmark's, benches/export.rs).
pub fn generate(n_events: u64, procs: u32, silent: bool, stacks: bool, late: bool) -> Vec<u8> {
    let header = TraceHeader {
        start_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: START,
        command: vec![
            "torchrun".into(),
            "--nproc-per-node=8".into(),
            "train.py".into(),
        ],
        hostname: "bench".into(),
        vramtrace_version: "bench".into(),
        extra: vec![],
    };
    let mut out = encode_header(&header);
    out.reserve((n_events * 14) as usize);
    let mut ps: Vec<Proc> = (0..procs).map(|i| Proc::new(10_000 + i, i)).collect();
    let hello = |pid: u32, rank: u32| {
        Record::Hello(Hello {
            pid,
            ppid: 9_999,
            ts_ns: START + 1_000,
            cmdline: vec!["python".into(), "train.py".into()],
            hostname: "bench".into(),
            rank: Some(rank),
            local_rank: Some(rank),
            slurm_procid: None,
            shim_version: "bench".into(),
            extra: vec![],
        })
    };
    for (i, p) in ps.iter_mut().enumerate() {
        put_record(&mut out, &hello(p.pid, i as u32));
        if stacks {
            p.stacks = true;
            call_sites(&mut out, p.pid);
        }
    }
    if silent {
        // A process that says hello and then nothing: the merge waits on it until its bound.
        put_record(&mut out, &hello(99_999, 99));
    }
    let mut rng = Rng(42);
    let mut batch = Vec::with_capacity(1100);
    // `late`: every other batch of a process waits and arrives after the next one (threads racing to the
    // shim's queue): half the batches are older than what their process sent before.
    let mut held: Vec<Option<Vec<Event>>> = vec![None; ps.len()];
    let mut written = 0u64;
    let mut batches = 0u64;
    while written < n_events {
        // The process furthest behind sends next, as the collector would receive them.
        let (pi, p) = ps
            .iter_mut()
            .enumerate()
            .min_by_key(|(_, p)| p.now)
            .expect("at least one process");
        batch.clear();
        let want = 1 + rng.below(1024) as usize;
        while batch.len() < want {
            p.step(&mut batch);
        }
        batch.truncate(1024);
        if late {
            match held[pi].take() {
                None => held[pi] = Some(batch.clone()),
                Some(old) => {
                    put_events(&mut out, p.pid, &batch);
                    put_events(&mut out, p.pid, &old);
                }
            }
        } else {
            put_events(&mut out, p.pid, &batch);
        }
        written += batch.len() as u64;
        batches += 1;
        if batches & 15 == 0 {
            put_record(
                &mut out,
                &Record::Tick {
                    pid: p.pid,
                    ts_ns: p.now,
                },
            );
        }
        if batches & 4095 == 0 {
            put_record(
                &mut out,
                &Record::Dropped {
                    pid: p.pid,
                    ts_ns: p.now,
                    count: 3,
                },
            );
        }
    }
    for (pi, p) in ps.iter().enumerate() {
        if let Some(old) = held[pi].take() {
            put_events(&mut out, p.pid, &old);
        }
        put_record(
            &mut out,
            &Record::Goodbye {
                pid: p.pid,
                ts_ns: p.now + 1,
            },
        );
        put_record(
            &mut out,
            &Record::ProcessEnd {
                pid: p.pid,
                ts_ns: p.now + 2,
                kind: EndKind::Goodbye,
            },
        );
    }
    out
}

/// A `/proc/self/status` figure in kB (VmRSS, VmHWM).
pub fn status_kb(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Resets VmHWM to the current RSS (Linux: writing 5 to clear_refs).
fn reset_hwm() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

struct Row {
    name: String,
    events: u64,
    bytes: usize,
    mem_s: f64,
    file_s: f64,
    /// `vramtrace report FILE` as a user runs it (the process, the replay, the text), best of two.
    report_s: Option<f64>,
    rss_kb: Option<u64>,
    base_kb: Option<u64>,
}

fn scenario(name: &str, n: u64, procs: u32, silent: bool, stacks: bool, late: bool) -> Row {
    let t = Instant::now();
    let trace = generate(n, procs, silent, stacks, late);
    let gen_s = t.elapsed().as_secs_f64();
    let bytes = trace.len();

    // From memory: best of two.
    let mut mem_s = f64::MAX;
    let mut a: Option<Analysis> = None;
    for _ in 0..2 {
        let t = Instant::now();
        let got = analyze_reader(&trace[..]).expect("analyze");
        mem_s = mem_s.min(t.elapsed().as_secs_f64());
        a = Some(black_box(got));
    }
    let a = a.unwrap();
    assert!(!a.partial);

    // From a file, with the trace out of this process's memory, and the peak RSS of just that.
    // Cargo's scratch folder, or the system's where the executable was carried elsewhere (bench.sh).
    let dir = Some(std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")))
        .filter(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let path = dir.join(format!("ingest-{}-{name}.vtrace", std::process::id()));
    std::fs::write(&path, &trace).expect("write the trace");
    drop(trace);
    let reset = reset_hwm();
    let base_kb = status_kb("VmRSS:");
    let t = Instant::now();
    let b = analyze(&path).expect("analyze file");
    let file_s = t.elapsed().as_secs_f64();
    let rss_kb = if reset { status_kb("VmHWM:") } else { None };
    let report_s = report_end_to_end(&path);
    let _ = std::fs::remove_file(&path);
    assert_eq!(a.events, b.events);
    assert_eq!(a.devices, b.devices);
    assert_eq!(a.call_sites, b.call_sites);
    assert_eq!(b.call_sites.present, stacks);
    eprintln!(
        "  [{name}] generated in {gen_s:.2} s: {} processes, peak on GPU 0 {} bytes, {} live at end, \
         {} lost / {} unmatched frees, {} stacks, {} call sites listed",
        b.processes.len(),
        b.devices.first().map_or(0, |d| d.peak_bytes),
        b.live_at_end_count,
        b.lost_frees,
        b.unmatched_frees,
        b.call_sites.stacks,
        b.call_sites.sites.len()
    );
    Row {
        name: name.to_string(),
        events: b.events,
        bytes,
        mem_s,
        file_s,
        report_s,
        rss_kb,
        base_kb,
    }
}

/// The `vramtrace` executable: `VRAMTRACE_BIN`, else beside this benchmark (bench.sh's carried binaries), else
/// the one cargo built with it.
fn vramtrace_bin() -> Option<std::path::PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.join("vramtrace")));
    std::env::var_os("VRAMTRACE_BIN")
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain(beside)
        .chain(Some(std::path::PathBuf::from(env!(
            "CARGO_BIN_EXE_vramtrace"
        ))))
        .find(|p| p.is_file())
}

/// Seconds `vramtrace report path` takes, start to exit, its text to /dev/null: best of two.
fn report_end_to_end(path: &std::path::Path) -> Option<f64> {
    let bin = vramtrace_bin()?;
    let mut best = f64::MAX;
    for _ in 0..2 {
        let t = Instant::now();
        let ok = std::process::Command::new(&bin)
            .arg("report")
            .arg(path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?
            .success();
        if !ok {
            return None;
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    Some(best)
}

/// How many events a scenario has: `VRAMTRACE_BENCH_EVENTS`, else 10 M under `cargo bench` (which passes
/// `--bench`) and 200 k under `cargo test --benches`. Says when the build is not optimised.
pub fn bench_events() -> u64 {
    let quick = !std::env::args().any(|a| a == "--bench");
    if cfg!(debug_assertions) {
        eprintln!("(debug build: the numbers mean nothing; use cargo bench)");
    }
    std::env::var("VRAMTRACE_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 200_000 } else { 10_000_000 })
}

fn main() {
    let n = bench_events();
    eprintln!("vramtrace ingest benchmark: generating {n} events per scenario...");
    // `VRAMTRACE_BENCH_ONLY=NAME`: that scenario alone (for a profiler).
    let only = std::env::var("VRAMTRACE_BENCH_ONLY").ok();
    let all: [(&str, bool, bool, bool); 6] = [
        ("8 ranks", false, false, false),
        ("8 ranks + 1 silent", true, false, false),
        ("8 ranks, 200 stacks", false, true, false),
        ("+ 1 silent, stacks", true, true, false),
        ("8 ranks, late batches", false, false, true),
        ("+ 1 silent, late", true, false, true),
    ];
    let rows: Vec<Row> = all
        .iter()
        .filter(|(name, ..)| only.as_deref().is_none_or(|o| o == *name))
        .map(|&(name, silent, stacks, late)| scenario(name, n, 8, silent, stacks, late))
        .collect();
    println!();
    println!(
        "{:<20} {:>12} {:>10} {:>10} {:>12} {:>10} {:>12} {:>10}",
        "scenario", "events", "B/event", "mem s", "M events/s", "file s", "peak RSS MB", "report s"
    );
    for r in &rows {
        let rss = match (r.rss_kb, r.base_kb) {
            (Some(h), Some(b)) => format!("{:.0} (+{:.0})", mb(h), mb(h.saturating_sub(b))),
            _ => "n/a".into(),
        };
        let report = r.report_s.map_or("n/a".into(), |s| format!("{s:.3}"));
        println!(
            "{:<20} {:>12} {:>10.2} {:>10.3} {:>12.2} {:>10.3} {:>12} {:>10}",
            r.name,
            r.events,
            r.bytes as f64 / r.events as f64,
            r.mem_s,
            r.events as f64 / r.mem_s / 1e6,
            r.file_s,
            rss,
            report
        );
    }
    println!();
    println!(
        "targets: >= 5 M events/s, <= 24 B/event, 10 M events in <= 2 s and <= 500 MB peak RSS \
         (peak RSS: VmHWM during the file replay, reset before it; + is above the RSS before it); \
         report s: `vramtrace report FILE` end to end, 10 M events in <= 1.2 s on 2 cores, <= 0.6 s on 16 (issue 27)"
    );
}

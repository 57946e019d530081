//! How fast `vramtrace whatif` answers on a long run's history (issue 28: a million history entries, twelve
//! configurations, at most 5 s on CI's 2 cores).
//!
//! `cargo bench -p vramtrace --bench whatif` (plain std timing, no harness). A training-like history is made up:
//! parameters kept for the whole run, then steps whose batch (so every activation's size) varies, activations
//! freed in reverse in the backward pass, gradients and a few odd-sized workspaces, until it has N entries
//! (`VRAMTRACE_BENCH_ENTRIES`, default 1 M; 100 k under `cargo test --benches`). Timed:
//! - the snapshot read: the history written as the pickle PyTorch's snapshot is, then loaded and turned into
//!   entries, as `whatif` does;
//! - the answers with the default grid and no limit (twelve configurations: each one's peak and the smallest cap
//!   it fits, found by bisection);
//! - the same under a cap between the allocated peak and the defaults' peak (each configuration's first
//!   refusal too);
//! - the knob's what-if (issue 39): the history as the run at batch 8 and, every size doubled, as the run at 16;
//!   matched and fitted, then answered at 24 and, under twice that cap, the largest batch per configuration
//!   (each value the search tries is a replay of the whole history).

use std::collections::BTreeMap;
use std::time::Instant;

use serde_pickle::{HashableValue, SerOptions, Value};
use vramtrace_collector::whatif::answer::{answer, Limit};
use vramtrace_collector::whatif::batch::answer::{answer as knob_answer, KnobJob};
use vramtrace_collector::whatif::batch::{align, KnobRun};
use vramtrace_collector::whatif::history::{from_snapshot, History};
use vramtrace_collector::whatif::history::{Entry, Op};
use vramtrace_collector::whatif::settings::default_grid;

const MIB: u64 = 1 << 20;

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

fn s(x: &str) -> Value {
    Value::String(x.into())
}

fn entry(action: &str, addr: u64, size: u64, t: u64) -> Value {
    Value::Dict(BTreeMap::from([
        (HashableValue::String("action".into()), s(action)),
        (
            HashableValue::String("addr".into()),
            Value::I64(addr as i64),
        ),
        (
            HashableValue::String("size".into()),
            Value::I64(size as i64),
        ),
        (HashableValue::String("stream".into()), Value::I64(0)),
        (
            HashableValue::String("time_us".into()),
            Value::I64(t as i64),
        ),
        (
            HashableValue::String("frames".into()),
            Value::List(if action == "alloc" {
                vec![Value::Dict(BTreeMap::from([
                    (
                        HashableValue::String("filename".into()),
                        s("/home/u/train.py"),
                    ),
                    (
                        HashableValue::String("line".into()),
                        Value::I64(40 + (size % 7) as i64),
                    ),
                    (HashableValue::String("name".into()), s("forward")),
                ]))]
            } else {
                vec![]
            }),
        ),
    ]))
}

/// A snapshot whose device 0 history has about `n` entries (allocations and completed frees; addresses are
/// unique per live tensor, which is all the reader needs of them).
fn snapshot(n: usize) -> Value {
    let mut r = Lcg(7);
    let mut trace = Vec::with_capacity(n + 64);
    let mut t = 1_800_000_000_000_000u64;
    let mut next_addr = 1u64 << 40;
    let mut addr = || {
        next_addr += 1 << 21;
        next_addr
    };
    let mut tick = || {
        t += 3;
        t
    };
    for _ in 0..40 {
        let (a, size) = (addr(), r.range(1, 64) * MIB);
        trace.push(entry("alloc", a, size, tick()));
    }
    while trace.len() < n {
        let batch = r.range(4, 16);
        let mut acts = Vec::new();
        for _ in 0..r.range(30, 60) {
            let size = batch * r.range(64, 4096) * 1024 + r.range(0, 511);
            let a = addr();
            trace.push(entry("alloc", a, size, tick()));
            acts.push((a, size));
            if r.range(0, 4) == 0 {
                // A short-lived temporary.
                let (b, tmp) = (addr(), r.range(1, 3000) * 1024);
                trace.push(entry("alloc", b, tmp, tick()));
                trace.push(entry("free_completed", b, tmp, tick()));
            }
        }
        while let Some((a, size)) = acts.pop() {
            let (g, gs) = (addr(), size / 2 + 512);
            trace.push(entry("alloc", g, gs, tick()));
            trace.push(entry("free_completed", a, size, tick()));
            trace.push(entry("free_completed", g, gs, tick()));
        }
    }
    Value::Dict(BTreeMap::from([
        (
            HashableValue::String("segments".into()),
            Value::List(vec![]),
        ),
        (
            HashableValue::String("device_traces".into()),
            Value::List(vec![Value::List(trace)]),
        ),
    ]))
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::var("VRAMTRACE_BENCH_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 100_000 } else { 1_000_000 });
    if cfg!(debug_assertions) {
        eprintln!("(debug build: the numbers mean nothing; use cargo bench)");
    }
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    eprintln!("vramtrace whatif benchmark: {n} history entries, {cores} cores");
    let snap = snapshot(n);
    let bytes = serde_pickle::value_to_vec(&snap, SerOptions::new()).unwrap();
    drop(snap);
    let dir = std::env::temp_dir().join(format!("vramtrace-bench-whatif-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("snap.pickle");
    std::fs::write(&path, &bytes).unwrap();

    let t = Instant::now();
    let v = vramtrace_collector::inputs::torch_snapshot::load(&path).unwrap();
    let load_s = t.elapsed().as_secs_f64();
    eprintln!("pickle loaded in {load_s:.3} s");
    let mut notes = Vec::new();
    let histories: Vec<History> = from_snapshot(&v, 1, "bench", "exit", &mut notes);
    drop(v);
    let read_s = t.elapsed().as_secs_f64();
    let entries = histories[0].entries.len();
    // The same file as `report` and `export` read it (torch_snapshot::read): the other snapshot path.
    let t = Instant::now();
    let reading = vramtrace_collector::inputs::torch_snapshot::read(&path, Some(0), None);
    let report_s = t.elapsed().as_secs_f64();
    assert!(reading.error.is_none(), "{:?}", reading.error);
    eprintln!("pickle read as report does in {report_s:.3} s");

    let grid = default_grid();
    let configs = grid.len() + 1;
    let t = Instant::now();
    let free = answer(
        histories.clone(),
        vec![0],
        BTreeMap::from([(0, 80 << 30)]),
        BTreeMap::new(),
        &grid,
        None,
    );
    let free_s = t.elapsed().as_secs_f64();
    let d = &free.configs[0].devices[0];
    let cap = (d.allocated_peak + d.peak) / 2;
    let t = Instant::now();
    let capped = answer(
        histories,
        vec![0],
        BTreeMap::from([(0, 80 << 30)]),
        BTreeMap::new(),
        &grid,
        Some(Limit {
            bytes: BTreeMap::from([(0, cap)]),
            what: "bench".into(),
        }),
    );
    let cap_s = t.elapsed().as_secs_f64();

    // The knob's what-if end to end, as `whatif --knob` does it: both runs' snapshots read at once (one thread
    // each; the run at 16 is the same file with every size doubled), matched and fitted, then answered.
    let t = Instant::now();
    let read_run = |value: u64, k: u64| {
        let v = vramtrace_collector::inputs::torch_snapshot::load(&path).unwrap();
        let mut notes = Vec::new();
        let mut hs = from_snapshot(&v, 1, "bench", "exit", &mut notes);
        for e in &mut hs[0].entries {
            if let Op::Alloc { size, .. } = &mut e.op {
                *size *= k;
            }
        }
        KnobRun {
            value,
            label: format!("b{value}"),
            histories: hs,
            command: Vec::new(),
        }
    };
    let (r8, r16) = std::thread::scope(|sc| {
        let a = sc.spawn(|| read_run(8, 1));
        let b = sc.spawn(|| read_run(16, 2));
        (a.join().unwrap(), b.join().unwrap())
    });
    let knob_read_s = t.elapsed().as_secs_f64();
    let t_align = Instant::now();
    let job = KnobJob {
        aligned: align(vec![r8, r16]).unwrap(),
        outside: vec![0],
        device_total: BTreeMap::from([(0, 80 << 30)]),
        others: BTreeMap::new(),
        search_factor: vramtrace_collector::whatif::batch::answer::SEARCH_FACTOR,
    };
    let align_s = t_align.elapsed().as_secs_f64();
    let t_answer = Instant::now();
    let knob = knob_answer(
        &job,
        &grid,
        &[24],
        Some(Limit {
            bytes: BTreeMap::from([(0, 2 * cap)]),
            what: "bench".into(),
        }),
    );
    let knob_s = t_answer.elapsed().as_secs_f64();
    // The verb also replays each run with the other's segment addresses (four replays for two runs). The
    // benchmark's snapshot records no segment addresses, so each run is given some (the replays' cost is the
    // model's; the addresses only order segments).
    let mut job = job;
    for (r, run) in job.aligned.runs.iter_mut().enumerate() {
        let base: u64 = 0x7f00_0000_0000;
        run.histories[0].segment_addresses = (0..64u64)
            .map(|i| {
                (
                    20 << 20,
                    if r == 0 {
                        base - i * (32 << 20)
                    } else {
                        base + i * (32 << 20)
                    },
                )
            })
            .collect();
    }
    let t_spread = Instant::now();
    let spread = vramtrace_collector::whatif::batch::addresses::spread(&job);
    let spread_s = t_spread.elapsed().as_secs_f64();
    let e2e_s = t.elapsed().as_secs_f64();
    // Runs whose kernels differ by size: the run at 16 asks a transient buffer more from the line before it every
    // so many requests (2,000 in all, near the bound of 3,000 edits), as a sort path past a size does.
    let aligned = job.aligned;
    let mut runs = aligned.runs;
    let requests = aligned.slots[0].requests();
    let every = (requests / 2_000).max(1);
    let mut extra = 0usize;
    {
        let h = &mut runs[1].histories[0];
        let mut id = u64::MAX / 2;
        let mut out = Vec::with_capacity(h.entries.len() + 4_000);
        let mut k = 0usize;
        for e in h.entries.drain(..) {
            out.push(e);
            if let Op::Alloc { size, stream, .. } = e.op {
                k += 1;
                if k.is_multiple_of(every) && extra < 2_000 {
                    id += 1;
                    extra += 1;
                    out.push(Entry {
                        op: Op::Alloc { id, size, stream },
                        ..e
                    });
                    out.push(Entry {
                        op: Op::Free { id },
                        ..e
                    });
                }
            }
        }
        h.entries = out;
    }
    let t = Instant::now();
    let paths = align(runs).unwrap();
    let paths_s = t.elapsed().as_secs_f64();
    assert_eq!(paths.slots[0].own[1].len(), extra);
    drop(paths);
    let _ = std::fs::remove_dir_all(&dir);

    println!();
    println!(
        "{:>10} {:>8} {:>12} {:>10} {:>10} {:>12} {:>12} {:>10}",
        "entries", "configs", "pickle MB", "read s", "report s", "answers s", "+cap s", "total s"
    );
    println!(
        "{:>10} {:>8} {:>12.1} {:>10.3} {:>10.3} {:>12.3} {:>12.3} {:>10.3}",
        entries,
        configs,
        bytes.len() as f64 / 1e6,
        read_s,
        report_s,
        free_s,
        cap_s,
        read_s + cap_s
    );
    println!(
        "\ntarget (issue 28): 1 M entries, 12 configurations, <= 5 s on 2 cores (read + answers under a cap). \
         The defaults' peak {:.2} GiB, the best {:?}; under the cap, {} of {} configurations fit.",
        free.peak(0) as f64 / (1u64 << 30) as f64,
        free.best.map(|b| free.configs[b].label.clone()),
        capped.configs.iter().filter(|c| c.fits == Some(true)).count(),
        capped.configs.len()
    );
    let largest: Vec<String> = knob
        .configs
        .iter()
        .map(|c| {
            c.largest.as_ref().map_or("-".into(), |l| {
                format!("{} ({} replays)", l.value.unwrap_or(0), l.replays)
            })
        })
        .collect();
    println!(
        "\nknob (issue 39): both snapshots read at once in {knob_read_s:.3} s; {} requests matched in {align_s:.3} s; \
         answered at 24 and the largest batch under {:.2} GiB for {} configurations in {knob_s:.3} s (largest: {}). \
         The address spread in {spread_s:.3} s ({spread:?}). End to end: {e2e_s:.3} s. Target: within the what-if's \
         bounds above (5 s).",
        entries / 2,
        (2 * cap) as f64 / (1u64 << 30) as f64,
        knob.configs.len(),
        largest.join(", ")
    );
    println!(
        "knob, kernels differing by size: {requests} requests against {} ({extra} the larger run's own) matched in \
         {paths_s:.3} s (one for one: {align_s:.3} s).",
        requests + extra
    );
}

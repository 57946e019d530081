//! The floor under the shim's cost per event on this machine (issue 9's per-pair targets): what reading the
//! clock and publishing one slot in the ring cost by themselves, outside any hook. A traced alloc+free pair
//! records two events, so twice the last row is the least any pair can add here, before the hooks' own work.
//!
//! `cargo bench -p vramtrace-shim --bench floor` (plain std timing, no harness). Medians of 9 runs of 2 M calls.
//! The ring is the shim's default size (16 MiB, larger than the caches, as in a real job), drained by a thread
//! that wakes every millisecond the way the collector's receiver does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vramtrace_format::ring::{self, Consumer, Ring};
use vramtrace_format::{ticks, Api, Event};

const CALLS: u64 = 2_000_000;
const RUNS: usize = 9;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// ns per call of `f`, median of `RUNS` runs.
fn time(mut f: impl FnMut(u64)) -> f64 {
    median(
        (0..RUNS)
            .map(|_| {
                let t0 = Instant::now();
                for i in 0..CALLS {
                    f(i);
                }
                t0.elapsed().as_nanos() as f64 / CALLS as f64
            })
            .collect(),
    )
}

fn main() {
    // As the shim stamps: the counter where the kernel keeps time with it (the collector converts), else
    // CLOCK_MONOTONIC.
    let tsc_on = ticks::usable();
    let stamp = || {
        if tsc_on {
            ticks::read()
        } else {
            ticks::monotonic()
        }
    };
    let stop = Arc::new(AtomicBool::new(false));

    let slots = ring::slots_for_bytes(16 << 20);
    let layout = std::alloc::Layout::from_size_align(ring::bytes_for(slots), 4096).unwrap();
    // SAFETY: `layout` has a non-zero size (a ring's bytes); the result is checked for null below.
    let mem = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!mem.is_null());
    // SAFETY: `mem` is a zeroed, 4096-aligned allocation of `bytes_for(slots)` bytes, kept until the drainer
    // is joined and freed after.
    let r = unsafe { Ring::init(mem, slots, 1, 0) };
    let drainer = {
        let stop = stop.clone();
        let mut c = Consumer::new(r);
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += c.drain(false, |_| {});
                c.sleep(Duration::from_millis(1));
            }
            n
        })
    };
    let ev = |ts: u64, i: u64| Event {
        ts_ns: ts,
        tid: 7,
        api: Api::MemAlloc,
        flags: 0,
        device: 0,
        result: 0,
        addr: 0x7f00_0000_0000 + (i << 21),
        size: 1 << 20,
        aux: 0,
        stack: 0,
    };
    let mut sink = 0u64;
    let mut full = 0u64;
    let mono = time(|_| sink = sink.wrapping_add(ticks::monotonic()));
    let tsc = time(|_| sink = sink.wrapping_add(stamp()));
    let publish = time(|i| {
        if !r.try_event(&ev(i, i)) {
            full += 1;
        }
    });
    // As the shim publishes: the clock read just before the ring reserves (record.rs `push`).
    let both = time(|i| {
        let mut e = ev(0, i);
        e.ts_ns = stamp();
        if !r.try_event(&e) {
            full += 1;
        }
    });
    stop.store(true, Ordering::Relaxed);
    r.wake_now();
    let drained = drainer.join().unwrap();
    // SAFETY: `mem` came from `alloc_zeroed` with this `layout`; the drainer that used the ring is joined.
    unsafe { std::alloc::dealloc(mem, layout) };

    println!(
        "## The floor under recording one event (ns per call, median of {RUNS} runs of {CALLS})"
    );
    println!("| step | ns |");
    println!("|---|---|");
    println!("| CLOCK_MONOTONIC (the vDSO) | {mono:.1} |");
    println!(
        "| the shim's stamp (the time-stamp counter{}) | {tsc:.1} |",
        if !tsc_on {
            ", not usable here: CLOCK_MONOTONIC"
        } else {
            ""
        }
    );
    println!(
        "| publishing one event in a 16 MiB ring (reserve, 64-byte slot, publish) | {publish:.1} |"
    );
    println!("| the clock and the ring together | {both:.1} |");
    println!();
    println!(
        "an alloc+free pair records two events: at least {:.0} ns a pair on this machine before the hooks' own \
         work ({} events drained, {full} found the ring full)",
        2.0 * both,
        drained
    );
    std::hint::black_box(sink);
}

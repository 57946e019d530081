//! What `vramtrace run --metrics` costs the collector, and how fast a scrape answers (issue 12: at most 1% of the
//! collector's ingest rate; a scrape of a 256-process job in at most 50 ms).
//!
//! `cargo bench -p vramtrace --bench metrics` (plain std timing, no harness).
//!
//! 1. Ingest: the receivers' whole stage, as `receive.rs` runs it for every ring: drain the shared-memory ring
//!    (the shim's slots), encode the events into frames of 4096, append the frames to the trace through a
//!    `TraceWriter`. Eight processes' rings (caching-allocator-like traffic) are filled, untimed, then drained
//!    in turn, timed; rounds until the events are all through. Events/s without metrics, and with a `Live`
//!    reading the same file behind the writer on its own thread (as `--metrics` runs it). Runs alternate;
//!    medians of 7. Then the writer's step alone (the page cache's speed, far above any ring's), and the live
//!    reader's own rate (it must keep up).
//! 2. Scrape: a job of 256 processes on 8 GPUs (2 each, 64 live buffers per process), served on loopback:
//!    200 `GET /metrics` (OpenMetrics), median, 99th percentile and worst, with the body's size.
//!
//! `VRAMTRACE_BENCH_EVENTS` changes the number of events of part 1 (default 4 M).

use std::sync::Arc;
use std::time::{Duration, Instant};

use vramtrace_collector::live::{self, JobLabels, Live};
use vramtrace_collector::receive::TraceWriter;
use vramtrace_format::codec::{encode_header, put_events, put_record};
use vramtrace_format::ring::{self, Consumer, Item, Ring};
use vramtrace_format::{Api, Event, Hello, Record, TraceHeader, NO_DEVICE};

fn header() -> TraceHeader {
    TraceHeader {
        start_unix_ns: 0,
        start_mono_ns: 0,
        command: vec!["bench".into()],
        hostname: "bench".into(),
        vramtrace_version: "bench".into(),
        extra: vec![],
    }
}

fn hello(pid: u32, rank: u32) -> Record {
    Record::Hello(Hello {
        pid,
        ppid: 1,
        ts_ns: 1,
        cmdline: vec!["python".into(), "train.py".into()],
        hostname: "bench".into(),
        rank: Some(rank),
        local_rank: Some(rank % 8),
        slurm_procid: None,
        shim_version: "bench".into(),
        extra: vec![],
    })
}

/// A small deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// `total` events of `procs` processes' caching-allocator-like traffic (allocations of 64 KiB to 4 MiB, frees of
/// a random live one, at most 2000 live), one run of up to 4096 events per process in turn: (pid, events).
fn traffic(procs: u32, total: usize) -> Vec<(u32, Vec<Event>)> {
    let mut out = Vec::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut live: Vec<Vec<u64>> = vec![Vec::new(); procs as usize];
    let mut next = vec![0u64; procs as usize];
    let mut now = 1_000u64;
    let mut made = 0usize;
    while made < total {
        for p in 0..procs {
            let mut batch = Vec::with_capacity(4096);
            for _ in 0..4096 {
                now += 500;
                let l = &mut live[p as usize];
                let free = !l.is_empty() && (l.len() > 2000 || rng.below(2) == 0);
                let e = if free {
                    let i = rng.below(l.len() as u64) as usize;
                    let addr = l.swap_remove(i);
                    Event {
                        ts_ns: now,
                        tid: 1,
                        api: Api::MemFree,
                        flags: 0,
                        device: NO_DEVICE,
                        result: 0,
                        addr,
                        size: 0,
                        aux: 0,
                        stack: 0,
                    }
                } else {
                    next[p as usize] += 1;
                    let addr = ((p as u64 + 1) << 40) + (next[p as usize] % 8192) * (2 << 20);
                    l.push(addr);
                    Event {
                        ts_ns: now,
                        tid: 1,
                        api: Api::MemAlloc,
                        flags: 0,
                        device: p % 8,
                        result: 0,
                        addr,
                        size: (1 + rng.below(64)) << 16,
                        aux: 0,
                        stack: 0,
                    }
                };
                batch.push(e);
            }
            made += batch.len();
            out.push((100 + p, batch));
        }
    }
    out
}

/// The processes' hellos, then their traffic as frames.
fn frames(procs: u32, traffic: &[(u32, Vec<Event>)]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for p in 0..procs {
        let mut b = Vec::new();
        put_record(&mut b, &hello(100 + p, p));
        out.push(b);
    }
    for (pid, batch) in traffic {
        let mut b = Vec::new();
        put_events(&mut b, *pid, batch);
        out.push(b);
    }
    out
}

/// A process's ring, in memory of its own (the shim's is a shared mapping; the layout is the same).
struct OwnedRing {
    mem: *mut u8,
    layout: std::alloc::Layout,
    ring: Ring,
}

impl OwnedRing {
    fn new(slots: u64, pid: u32) -> OwnedRing {
        let layout = std::alloc::Layout::from_size_align(ring::bytes_for(slots), 4096).unwrap();
        // SAFETY: `layout` has a non-zero size (a ring's bytes); the result is checked for null below.
        let mem = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!mem.is_null());
        // SAFETY: `mem` is a zeroed, 4096-aligned allocation of `bytes_for(slots)` bytes, owned with the ring
        // and freed only when it is dropped.
        let ring = unsafe { Ring::init(mem, slots, pid, 0) };
        OwnedRing { mem, layout, ring }
    }
}

impl Drop for OwnedRing {
    fn drop(&mut self) {
        // SAFETY: `mem` came from `alloc_zeroed` with this `layout`, freed once, here, with the ring's owner.
        unsafe { std::alloc::dealloc(self.mem, self.layout) };
    }
}

/// Slots per ring: 4 MiB a ring, as `VRAMTRACE_RING_BYTES` could make it; each round fills a ring to 60,000.
const RING_SLOTS: u64 = 1 << 16;
const PER_ROUND: usize = 60_000;

/// The receivers' stage for every event of `traffic` (one ring per process; rings filled, untimed, then
/// drained in turn, timed), with a live reader behind the writer when `metrics`: events/s, and (with metrics)
/// how long a scrape took right after the last write.
fn ingest(
    procs: u32,
    traffic: &[(u32, Vec<Event>)],
    metrics: bool,
    dir: &std::path::Path,
) -> (f64, Option<Duration>) {
    let path = dir.join("bench.vtrace");
    let mut file = std::fs::File::create(&path).unwrap();
    let head = encode_header(&header());
    std::io::Write::write_all(&mut file, &head).unwrap();
    let mut w = TraceWriter::new(file, head.len() as u64);
    let reader = metrics.then(|| {
        let live = Live::new(
            JobLabels::default(),
            &header(),
            std::fs::File::open(&path).ok(),
            head.len() as u64,
            w.written.clone(),
            false,
        );
        let t = live.spawn(None);
        (live, t)
    });
    for p in 0..procs {
        let mut b = Vec::new();
        put_record(&mut b, &hello(100 + p, p));
        w.write(100 + p, &b);
    }
    let rings: Vec<OwnedRing> = (0..procs)
        .map(|p| OwnedRing::new(RING_SLOTS, 100 + p))
        .collect();
    let mut consumers: Vec<Consumer> = rings.iter().map(|r| Consumer::new(r.ring)).collect();
    // Each process's events in order, and how far each has been put in its ring.
    let mut per: Vec<Vec<Event>> = vec![Vec::new(); procs as usize];
    for (pid, batch) in traffic {
        per[(pid - 100) as usize].extend_from_slice(batch);
    }
    let mut at = vec![0usize; procs as usize];
    let (mut batch, mut out) = (Vec::with_capacity(4096), Vec::with_capacity(1 << 20));
    let mut timed = Duration::ZERO;
    while at.iter().zip(&per).any(|(a, p)| *a < p.len()) {
        for (i, r) in rings.iter().enumerate() {
            let end = (at[i] + PER_ROUND).min(per[i].len());
            for e in &per[i][at[i]..end] {
                assert!(r.ring.try_event(e), "the ring holds a round");
            }
            at[i] = end;
        }
        let t0 = Instant::now();
        for (i, c) in consumers.iter_mut().enumerate() {
            let pid = 100 + i as u32;
            c.drain(false, |item| {
                if let Item::Event(e) = item {
                    batch.push(e);
                    if batch.len() >= 4096 {
                        put_events(&mut out, pid, &batch);
                        batch.clear();
                    }
                }
            });
            if !batch.is_empty() {
                put_events(&mut out, pid, &batch);
                batch.clear();
            }
            w.write(pid, &out);
            out.clear();
        }
        timed += t0.elapsed();
    }
    let events: u64 = per.iter().map(|p| p.len() as u64).sum();
    let mut lag = None;
    if let Some((live, t)) = reader {
        // A scrape the moment ingest ends reads whatever the reader had not caught up with: how stale the
        // metrics were, in the time it takes to catch up.
        let t1 = Instant::now();
        let body = live.render();
        lag = Some(t1.elapsed());
        assert!(body.contains("vramtrace_allocations_total"));
        live.stop();
        if let Some(t) = t {
            t.thread().unpark();
            t.join().unwrap();
        }
    }
    (events as f64 / timed.as_secs_f64(), lag)
}

/// The writer's step alone, frames already made: events/s (bounded by the page cache, not by any ring).
fn write_only(frames: &[Vec<u8>], events: usize, dir: &std::path::Path) -> f64 {
    let path = dir.join("bench-w.vtrace");
    let mut file = std::fs::File::create(&path).unwrap();
    let head = encode_header(&header());
    std::io::Write::write_all(&mut file, &head).unwrap();
    let mut w = TraceWriter::new(file, head.len() as u64);
    let t0 = Instant::now();
    for f in frames {
        w.write(0, f);
    }
    events as f64 / t0.elapsed().as_secs_f64()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let total: usize = std::env::var("VRAMTRACE_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4_000_000);
    let tr = traffic(8, total);
    let fr = frames(8, &tr);
    let events: usize = tr.iter().map(|(_, b)| b.len()).sum();
    let bytes: usize = fr.iter().map(Vec::len).sum();
    let dir = std::env::temp_dir().join(format!("vramtrace-bench-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    println!(
        "## Ingest with and without --metrics ({events} events, {} MB of frames, 8 processes)",
        bytes >> 20
    );
    println!("(rings drained into frames and written, as the receivers do)");
    let (mut off, mut on, mut lags) = (Vec::new(), Vec::new(), Vec::new());
    ingest(8, &tr, false, &dir); // warm the page cache and the allocator
    for _ in 0..7 {
        off.push(ingest(8, &tr, false, &dir).0 / 1e6);
        let (rate, lag) = ingest(8, &tr, true, &dir);
        on.push(rate / 1e6);
        lags.extend(lag.map(|l| l.as_secs_f64() * 1e3));
    }
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!("without metrics: M events/s {}", fmt(&off));
    println!("with metrics:    M events/s {}", fmt(&on));
    let (m_off, m_on) = (median(&mut off), median(&mut on));
    println!(
        "median: {m_off:.1} vs {m_on:.1} M events/s: metrics cost {:.2}% of the ingest rate (target <= 1%)",
        (m_off - m_on) / m_off * 100.0
    );
    lags.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "a scrape right after the last write (the reader catching up first): median {:.1} ms, worst {:.1} ms",
        lags[lags.len() / 2],
        lags[lags.len() - 1]
    );
    let mut w: Vec<f64> = (0..5)
        .map(|_| write_only(&fr, events, &dir) / 1e6)
        .collect();
    println!(
        "the writer's step alone (frames already made): {:.1} M events/s (median of 5)",
        median(&mut w)
    );
    // The live reader's own rate, alone on a core: it must outrun the ingest.
    let all: Vec<u8> = fr.concat();
    let mut rates = Vec::new();
    for _ in 0..5 {
        let st = Live::new(
            JobLabels::default(),
            &header(),
            None,
            0,
            Arc::new(0u64.into()),
            false,
        );
        let t0 = Instant::now();
        st.feed(&all);
        st.finish();
        rates.push(events as f64 / t0.elapsed().as_secs_f64() / 1e6);
    }
    println!(
        "the live reader alone: {:.1} M events/s (median of 5)",
        median(&mut rates)
    );

    println!();
    println!(
        "## A scrape of a 256-process job (8 GPUs, 2 per process, 64 live buffers each), 200 GETs"
    );
    let live = Live::new(
        JobLabels {
            job: "bench".into(),
            host: "node-0001".into(),
            uuids: vec![],
            pids: true,
        },
        &header(),
        None,
        0,
        Arc::new(0u64.into()),
        false,
    );
    let mut b = Vec::new();
    for p in 0..256u32 {
        put_record(&mut b, &hello(1000 + p, p));
        let evs: Vec<Event> = (0..64u64)
            .map(|i| Event {
                ts_ns: 1 + i,
                tid: 1,
                api: Api::MemAlloc,
                flags: 0,
                device: (p + i as u32 % 2) % 8,
                result: 0,
                addr: ((p as u64 + 1) << 40) + i * (4 << 20),
                size: 4 << 20,
                aux: 0,
                stack: 0,
            })
            .collect();
        put_events(&mut b, 1000 + p, &evs);
    }
    // Every process's promise, as the collector's ticks: the replay applies what came before.
    for p in 0..256u32 {
        put_record(
            &mut b,
            &Record::Tick {
                pid: 1000 + p,
                ts_ns: 1000,
            },
        );
    }
    live.feed(&b);
    assert_eq!(
        live.status().processes.len(),
        256 * 2,
        "the job is replayed"
    );
    let server = live::serve("127.0.0.1:0".parse().unwrap(), live.clone()).unwrap();
    let addr = server.addr.to_string();
    let mut times = Vec::new();
    let mut size = 0;
    for _ in 0..200 {
        let t0 = Instant::now();
        let (code, _, body) = live::http::get_with(
            &addr,
            "/metrics",
            Some("application/openmetrics-text;version=1.0.0"),
            Duration::from_secs(5),
        )
        .unwrap();
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        assert_eq!(code, 200);
        size = body.len();
        assert_eq!(
            body.lines()
                .filter(|l| l.starts_with("vramtrace_memory_used_bytes{"))
                .count(),
            512
        );
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "scrape: median {:.2} ms, p99 {:.2} ms, worst {:.2} ms (target <= 50 ms); body {} KB, 512 process series",
        times[100],
        times[197],
        times[199],
        size >> 10
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

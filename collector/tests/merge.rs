//! The merge's contract, by property: whatever order the frames of many processes and threads arrive in, the
//! analysis equals the plain reference replay (every entry of the trace sorted by time, then replayed), at any
//! memory bound (small bounds spill sorted runs to a temporary file), and nothing is counted inexact. A frame
//! that truly arrives after the merge passed its time is counted, never placed silently.

mod common;

use common::rng::Rng;
use common::*;
use vramtrace_collector::model::{analyze_bounded, analyze_reference, Analysis};
use vramtrace_format::{Api, EndKind, Event, Oom, Record, NO_DEVICE};

/// A record of one process and the oldest time it carries (what it could hold the merge to).
struct Rec {
    r: Record,
    min_ts: u64,
}

/// How one process sends.
#[derive(Clone, Copy, PartialEq)]
enum Order {
    /// In time order: every record keeps the promise of the ones before it.
    InOrder,
    /// Threads race to the queue: pushed in time order plus a random delay, so later batches can hold events
    /// older than earlier ones (late batches within the process).
    Racing,
}

/// The events of one process: threads allocating, freeing, failing, querying, on up to three devices, with
/// times that collide often (within the process and across processes).
fn process_events(rng: &mut Rng, pid: u32, threads: u32, n: usize) -> Vec<(Event, bool)> {
    let mut out = Vec::with_capacity(n);
    let mut t = START + rng.below(50) * 1000;
    let mut live: Vec<(u64, bool)> = Vec::new();
    let mut free_addrs: Vec<u64> = Vec::new();
    let mut bump = 0x7f00_0000_0000u64 + (pid as u64) * 0x1_0000_0000;
    for _ in 0..n {
        // Often the same microsecond as the one before: ties across threads and processes.
        t += rng.below(3) * 1000;
        let tid = pid * 100 + rng.below(threads as u64) as u32;
        let dev = rng.below(3) as u32;
        let roll = rng.below(100);
        let mut oom = false;
        let e = if roll < 45 || live.is_empty() {
            let handle = rng.chance(15);
            let addr = match free_addrs.pop() {
                Some(a) if rng.chance(70) => a,
                Some(a) => {
                    free_addrs.push(a);
                    bump += 0x10_0000;
                    bump
                }
                None => {
                    bump += 0x10_0000;
                    bump
                }
            };
            live.push((addr, handle));
            let api = if handle {
                Api::MemCreate
            } else if rng.chance(20) {
                Api::MemAllocAsync
            } else {
                Api::MemAlloc
            };
            Event {
                ts_ns: t,
                tid,
                api,
                flags: 0,
                device: dev,
                result: 0,
                addr,
                size: (1 + rng.below(64)) << 20,
                aux: 0,
                stack: 0,
            }
        } else if roll < 85 {
            let (addr, handle) = live.swap_remove(rng.below(live.len() as u64) as usize);
            free_addrs.push(addr);
            let api = if handle {
                Api::MemRelease
            } else if rng.chance(20) {
                Api::MemFreeAsync
            } else {
                Api::MemFree
            };
            Event {
                ts_ns: t,
                tid,
                api,
                flags: 0,
                device: NO_DEVICE,
                result: 0,
                addr,
                size: 0,
                aux: 0,
                stack: 0,
            }
        } else if roll < 93 {
            oom = rng.chance(50);
            Event {
                ts_ns: t,
                tid,
                api: Api::MemAlloc,
                flags: 0,
                device: dev,
                result: 2,
                addr: 0,
                size: (64 + rng.below(64)) << 20,
                aux: 0,
                stack: 0,
            }
        } else {
            Event {
                ts_ns: t,
                tid,
                api: Api::MemGetInfo,
                flags: 0,
                device: dev,
                result: 0,
                addr: 80 << 30,
                size: (rng.below(80) + 1) << 30,
                aux: 0,
                stack: 0,
            }
        };
        out.push((e, oom));
    }
    out
}

/// One process's records in the order it sends them: hello, batches (with out-of-memory records after the
/// batch holding the failure, dropped counts, honest ticks), and how it ends.
fn process_records(rng: &mut Rng, pid: u32, threads: u32, n: usize, order: Order) -> Vec<Rec> {
    let evs = process_events(rng, pid, threads, n);
    // Push order: each thread's events keep their order; racing threads are delayed at random.
    let mut keyed: Vec<(u64, usize)> = Vec::with_capacity(evs.len());
    let mut last_of_thread: std::collections::HashMap<u32, u64> = Default::default();
    for (i, (e, _)) in evs.iter().enumerate() {
        let delay = match order {
            Order::InOrder => 0,
            Order::Racing => rng.below(8) * 1000,
        };
        let k = last_of_thread.entry(e.tid).or_insert(0);
        *k = (*k).max(e.ts_ns + delay);
        keyed.push((*k, i));
    }
    keyed.sort_by_key(|x| x.0);
    let pushed: Vec<(Event, bool)> = keyed.iter().map(|&(_, i)| evs[i]).collect();
    let first = pushed.iter().map(|x| x.0.ts_ns).min().unwrap_or(START);
    let mut recs = vec![Rec {
        r: hello_at(pid, first),
        min_ts: first,
    }];
    let mut i = 0;
    while i < pushed.len() {
        let len = (1 + rng.below(12) as usize).min(pushed.len() - i);
        let batch: Vec<Event> = pushed[i..i + len].iter().map(|x| x.0).collect();
        let min_ts = batch.iter().map(|e| e.ts_ns).min().unwrap();
        recs.push(Rec {
            r: Record::Events {
                pid,
                events: batch.clone(),
            },
            min_ts,
        });
        for (e, oom) in &pushed[i..i + len] {
            if *oom {
                recs.push(Rec {
                    r: Record::Oom(Oom {
                        pid,
                        tid: e.tid,
                        ts_ns: e.ts_ns,
                        device: e.device,
                        api: e.api as u8,
                        flags: 0,
                        requested_bytes: e.size,
                        result: 2,
                        device_free_bytes: Some(1 << 20),
                        device_total_bytes: Some(80 << 30),
                        cap_bytes: None,
                        job_used_bytes: None,
                        process_used_bytes: None,
                        extra: vec![],
                    }),
                    min_ts: e.ts_ns,
                });
            }
        }
        i += len;
        let rest = pushed[i..].iter().map(|x| x.0.ts_ns).min();
        if rng.chance(5) {
            let ts = rest.unwrap_or(batch[len - 1].ts_ns);
            recs.push(Rec {
                r: Record::Dropped {
                    pid,
                    ts_ns: ts,
                    count: 1 + rng.below(3),
                },
                min_ts: ts,
            });
        }
        // A tick promises what is true: nothing later is older.
        if rng.chance(15) {
            if let Some(ts) = rest {
                recs.push(Rec {
                    r: Record::Tick { pid, ts_ns: ts },
                    min_ts: ts,
                });
            }
        }
    }
    let last = pushed.iter().map(|x| x.0.ts_ns).max().unwrap_or(first);
    match rng.below(10) {
        0 => {} // still running when the trace ends
        1 | 2 => recs.push(Rec {
            r: Record::ProcessEnd {
                pid,
                ts_ns: last + 2000,
                kind: EndKind::Vanished,
            },
            min_ts: last + 2000,
        }),
        _ => {
            recs.push(Rec {
                r: Record::Goodbye {
                    pid,
                    ts_ns: last + 1000,
                },
                min_ts: last + 1000,
            });
            recs.push(Rec {
                r: Record::ProcessEnd {
                    pid,
                    ts_ns: last + 2000,
                    kind: EndKind::Goodbye,
                },
                min_ts: last + 2000,
            });
        }
    }
    recs
}

/// The newest time in `recs`.
fn newest(recs: &[Record]) -> u64 {
    recs.iter()
        .map(|r| match r {
            Record::Events { events, .. } => events.iter().map(|e| e.ts_ns).max().unwrap(),
            Record::ProcessEnd { ts_ns, .. }
            | Record::Goodbye { ts_ns, .. }
            | Record::Tick { ts_ns, .. }
            | Record::Dropped { ts_ns, .. } => *ts_ns,
            Record::Oom(o) => o.ts_ns,
            _ => START,
        })
        .max()
        .unwrap_or(START)
}

fn hello_at(pid: u32, ts: u64) -> Record {
    let mut h = hello(pid, 0);
    if let Record::Hello(x) = &mut h {
        x.ts_ns = ts;
    }
    h
}

/// A job of `procs` processes of `threads` threads, its frames interleaved at random across processes (each
/// process's own frames in its order). With racing processes an anchor process (pid 1, open from the start
/// to the end) ticks only as far as is true for the whole job: nothing pending anywhere is older than its tick
/// (the collector's role with racing threads).
fn job(seed: u64, procs: u32, threads: u32, order: Order) -> Vec<Record> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut queues: Vec<std::collections::VecDeque<Rec>> = (0..procs)
        .map(|p| {
            let n = 20 + rng.below(120) as usize;
            process_records(&mut rng, 10 + p, threads, n, order).into()
        })
        .collect();
    let mut out = Vec::new();
    let anchor = order == Order::Racing;
    if anchor {
        out.push(hello_at(1, START));
    }
    // Hellos first: a process is known before any other can carry the merge past its start.
    for q in &mut queues {
        out.push(q.pop_front().unwrap().r);
    }
    let mut anchor_tick = START;
    loop {
        let open: Vec<usize> = (0..queues.len())
            .filter(|&i| !queues[i].is_empty())
            .collect();
        if open.is_empty() {
            break;
        }
        let q = open[rng.below(open.len() as u64) as usize];
        let mut r = queues[q].pop_front().unwrap().r;
        // The collector stamps a process's end when it writes it: after everything written before.
        if let Record::ProcessEnd { ts_ns, .. } = &mut r {
            *ts_ns = (*ts_ns).max(newest(&out) + 1);
        }
        out.push(r);
        if anchor && rng.chance(10) {
            let pending = queues
                .iter()
                .flat_map(|q| q.iter().map(|r| r.min_ts))
                .min()
                .unwrap_or(u64::MAX);
            if pending != u64::MAX && pending > anchor_tick {
                anchor_tick = pending;
                out.push(Record::Tick {
                    pid: 1,
                    ts_ns: pending,
                });
            }
        }
    }
    if anchor {
        // After everything, the processes still running included.
        let end = newest(&out) + 5000;
        out.push(Record::Goodbye { pid: 1, ts_ns: end });
        out.push(Record::ProcessEnd {
            pid: 1,
            ts_ns: end + 1,
            kind: EndKind::Goodbye,
        });
    }
    out
}

fn assert_exact(records: &[Record], what: &str) -> Analysis {
    let t = trace(records);
    let reference = analyze_reference(&t[..]).unwrap();
    assert_eq!(reference.merge_inexact_events, 0);
    let want = format!("{reference:#?}");
    for bound in [usize::MAX, 1000, 64, 8] {
        let a = analyze_bounded(&t[..], bound, None).unwrap();
        assert_eq!(a.merge_inexact_events, 0, "{what}, bound {bound}");
        let got = format!("{a:#?}");
        if got != want {
            let line = want
                .lines()
                .zip(got.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            let ctx = |s: &str| {
                s.lines()
                    .skip(line.saturating_sub(8))
                    .take(12)
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            panic!(
                "{what}, bound {bound}: differs from the reference at line {line}:\nreference:\n{}\nmerge:\n{}",
                ctx(&want),
                ctx(&got)
            );
        }
    }
    reference
}

#[test]
fn processes_in_order_interleaved_at_random_replay_exactly() {
    for seed in 0..40 {
        let procs = 2 + (seed % 15) as u32;
        let threads = 1 + (seed % 8) as u32;
        let recs = job(seed, procs, threads, Order::InOrder);
        let a = assert_exact(&recs, &format!("seed {seed}"));
        assert!(a.events > 0 && !a.devices.is_empty());
    }
}

#[test]
fn racing_threads_and_late_batches_replay_exactly() {
    let mut late_batches = 0;
    for seed in 100..130 {
        let procs = 2 + (seed % 15) as u32;
        let threads = 2 + (seed % 7) as u32;
        let recs = job(seed, procs, threads, Order::Racing);
        // The job has batches older than one its process sent before: what re-sorted a queue before.
        let mut newest: std::collections::HashMap<u32, u64> = Default::default();
        for r in &recs {
            if let Record::Events { pid, events } = r {
                let lo = events.iter().map(|e| e.ts_ns).min().unwrap();
                let hi = events.iter().map(|e| e.ts_ns).max().unwrap();
                let n = newest.entry(*pid).or_insert(0);
                late_batches += usize::from(lo < *n);
                *n = (*n).max(hi);
            }
        }
        assert_exact(&recs, &format!("seed {seed}"));
    }
    assert!(late_batches > 100, "only {late_batches} late batches");
}

#[test]
fn sixteen_processes_of_eight_racing_threads_replay_exactly() {
    for seed in 200..203 {
        let recs = job(seed, 16, 8, Order::Racing);
        let a = assert_exact(&recs, &format!("seed {seed}"));
        assert_eq!(a.processes.len(), 17);
    }
}

#[test]
fn a_silent_process_holds_the_merge_back_without_holding_memory() {
    // Process 1 says hello and nothing more until the end: nothing can be replayed before then. With a bound
    // of 8 events the waiting runs go to the spill file again and again; the result is still exact.
    let mut recs = vec![hello(1, 0), hello(2, 0), hello(3, 0)];
    for i in 0..500u64 {
        let pid = 2 + (i % 2) as u32;
        let base = i * 10;
        recs.push(events(
            pid,
            vec![
                alloc(base + 1, 0, 0x1000 * pid as u64, (1 + i % 7) << 20),
                free(base + 4, 0x1000 * pid as u64),
            ],
        ));
    }
    recs.push(end(1, 6000, EndKind::Goodbye));
    let a = assert_exact(&recs, "silent process");
    assert_eq!(a.devices[0].peak_bytes, 7 << 20);
    assert_eq!(a.unmatched_frees + a.lost_frees, 0);
}

#[test]
fn a_batch_older_than_what_was_replayed_is_counted_not_hidden() {
    // A batch's newest time becomes its process's promise when the next batch arrives: process 2 promises
    // 20 ms, process 3 30 ms, and the merge replays what is older than 20 ms. Then process 2 sends two events
    // at 5 and 6 ms: too late to place; they are replayed and counted.
    let recs = vec![
        hello(2, 0),
        hello(3, 0),
        events(2, vec![alloc(10, 0, 0xa, MIB), alloc(20, 0, 0xb, MIB)]),
        events(2, vec![alloc(21, 0, 0xe, MIB)]),
        events(3, vec![alloc(30, 0, 0xc, MIB)]),
        events(3, vec![alloc(31, 0, 0xf, MIB)]),
        events(2, vec![alloc(5, 0, 0xd, MIB), free(6, 0xd)]),
        end(2, 40, EndKind::Goodbye),
        end(3, 40, EndKind::Goodbye),
    ];
    let t = trace(&recs);
    let a = analyze_bounded(&t[..], usize::MAX, None).unwrap();
    assert_eq!(a.merge_inexact_events, 2);
    assert_eq!(a.events, 7);
    assert_eq!(a.device(0).unwrap().peak_bytes, 5 * MIB);
    // In order, the same trace counts nothing.
    let mut fixed = recs.clone();
    let late = fixed.remove(6);
    fixed.insert(2, late);
    let b = analyze_bounded(&trace(&fixed)[..], usize::MAX, None).unwrap();
    assert_eq!(b.merge_inexact_events, 0);
}

#[test]
fn processes_still_to_come_hold_the_merge_to_the_collectors_promise() {
    // Process 2 runs ahead to 40 ms; process 3 connects late, but its first events are at 10 ms. With the
    // collector's ticks of pid 0 (up to 5 ms before process 3's hello), nothing of 3 is late; without them
    // (an older trace) the merge had already passed 10 ms.
    let recs = |with_ticks: bool| {
        let mut h = header();
        if with_ticks {
            h.extra.push(("newcomer_ticks".into(), "1".into()));
        }
        let mut t = vramtrace_format::codec::encode_header(&h);
        let mut put = |r: &Record| vramtrace_format::codec::put_record(&mut t, r);
        put(&hello(2, 0));
        put(&tick(0, 5));
        put(&events(2, vec![alloc(20, 0, 0xa, MIB)]));
        put(&events(2, vec![alloc(30, 0, 0xb, MIB)]));
        put(&events(2, vec![alloc(40, 0, 0xc, MIB)]));
        put(&hello(3, 9));
        put(&events(3, vec![alloc(10, 0, 0xd, MIB), free(11, 0xd)]));
        put(&tick(0, 50));
        put(&end(2, 60, EndKind::Goodbye));
        put(&end(3, 60, EndKind::Goodbye));
        t
    };
    let a = analyze_bounded(&recs(true)[..], usize::MAX, None).unwrap();
    assert_eq!(a.merge_inexact_events, 0);
    assert_eq!(a.processes.len(), 2, "a tick of pid 0 is no process");
    let old = analyze_bounded(&recs(false)[..], usize::MAX, None).unwrap();
    assert_eq!(old.merge_inexact_events, 2);
}

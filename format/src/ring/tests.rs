use super::*;
use std::alloc::{alloc_zeroed, dealloc, Layout};

struct Mem(*mut u8, Layout);
impl Mem {
    fn new(slots: u64) -> Mem {
        let l = Layout::from_size_align(bytes_for(slots), 4096).unwrap();
        // SAFETY: `l` has a non-zero size (`bytes_for` is at least HEADER). A null return (allocation
        // failure) is not checked: the first write through it faults, in a test only.
        Mem(unsafe { alloc_zeroed(l) }, l)
    }
}
impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `alloc_zeroed` with this very layout and is freed once, here.
        unsafe { dealloc(self.0, self.1) }
    }
}

fn ev(tid: u32, n: u64) -> Event {
    Event {
        ts_ns: n,
        tid,
        api: Api::MemAlloc,
        flags: 3,
        device: 1,
        result: 0,
        addr: 0x1000 + n,
        size: n * 7,
        aux: u64::MAX - n,
        stack: tid,
    }
}

#[test]
fn events_and_blobs_come_out_whole_in_order_across_the_wrap() {
    let m = Mem::new(MIN_SLOTS);
    // SAFETY: `m` is zeroed, 4096-aligned memory of `bytes_for(MIN_SLOTS)` bytes, dropped after the ring's
    // last use.
    let r = unsafe { Ring::init(m.0, MIN_SLOTS, 7, 0) };
    // SAFETY: the same memory as `r`'s, viewed again.
    let mut c = Consumer::new(unsafe { Ring::open(m.0, bytes_for(MIN_SLOTS)).unwrap() });
    let mut got = Vec::new();
    let mut n = 0u64;
    for round in 0..50u64 {
        for _ in 0..37 {
            n += 1;
            assert!(r.try_event(&ev(1, n)));
        }
        let blob: Vec<u8> = (0..(round * 97 % 3000 + 1)).map(|i| i as u8).collect();
        assert!(r.try_blob(&blob));
        c.drain(false, |it| match it {
            Item::Event(e) => got.push(Ok(e)),
            Item::Blob(b) => got.push(Err(b.to_vec())),
        });
    }
    let events: Vec<u64> = got
        .iter()
        .filter_map(|g| g.as_ref().ok().map(|e| e.ts_ns))
        .collect();
    assert_eq!(events, (1..=n).collect::<Vec<_>>());
    assert!(got
        .iter()
        .filter_map(|g| g.as_ref().ok())
        .all(|e| *e == ev(1, e.ts_ns)));
    let blobs: Vec<&Vec<u8>> = got.iter().filter_map(|g| g.as_ref().err()).collect();
    assert_eq!(blobs.len(), 50);
    for (round, b) in blobs.iter().enumerate() {
        assert_eq!(b.len() as u64, round as u64 * 97 % 3000 + 1);
        assert!(b.iter().enumerate().all(|(i, x)| *x == i as u8));
    }
    assert_eq!(c.torn, 0);
    assert!(!c.corrupt);
}

#[test]
fn the_collector_sleeps_past_a_small_backlog_and_is_woken_at_a_quarter() {
    use std::time::{Duration, Instant};
    let m = Mem::new(MIN_SLOTS);
    // SAFETY: `m` is zeroed, 4096-aligned memory of `bytes_for(MIN_SLOTS)` bytes, dropped after the ring's
    // last use.
    let r = unsafe { Ring::init(m.0, MIN_SLOTS, 7, 0) };
    let mut c = Consumer::new(r);
    let quarter = MIN_SLOTS / 4;
    // A few records published since the drain: it sleeps its nap out (a busy producer is drained in
    // batches, not chased).
    for i in 0..10 {
        assert!(r.try_event(&ev(1, i)));
    }
    let t = Instant::now();
    c.sleep(Duration::from_millis(150));
    assert!(
        t.elapsed() >= Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    // An explicit wake after the wake word was read (here, as during a drain): the sleep ends at once.
    let seen = c.wake_seen();
    r.wake_now();
    let t = Instant::now();
    c.sleep_since(seen, Duration::from_secs(20));
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    // A quarter or more waiting, published while it was awake: it does not sleep.
    for i in 10..quarter {
        assert!(r.try_event(&ev(1, i)));
    }
    let t = Instant::now();
    c.sleep(Duration::from_secs(20));
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(c.drain(false, |_| {}), quarter);
    // Asleep with a small backlog: the producer that passes a quarter wakes it.
    for i in 0..quarter - 1 {
        assert!(r.try_event(&ev(1, i)));
    }
    let addr = m.0 as usize;
    let producer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        // SAFETY: `addr` is `m`, a ring of MIN_SLOTS laid out above; this thread is joined before `m` is
        // dropped.
        let r = unsafe { Ring::open(addr as *mut u8, bytes_for(MIN_SLOTS)).unwrap() };
        assert!(r.try_event(&ev(2, 0)));
    });
    let t = Instant::now();
    c.sleep(Duration::from_secs(20));
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    producer.join().unwrap();
    assert_eq!(c.drain(false, |_| {}), quarter);
}

#[test]
fn a_producer_with_an_old_view_of_the_tail_still_wakes_a_collector_asleep_past_a_quarter() {
    // The producer reads the tail, is pre-empted, the collector drains (moving the tail) and goes to sleep
    // with less than a quarter waiting; the producer's reservation then lands at a quarter or more by its
    // old view, without crossing by it. It must still wake the collector (found in review).
    use std::time::{Duration, Instant};
    let m = Mem::new(MIN_SLOTS);
    // SAFETY: `m` is zeroed, 4096-aligned memory of `bytes_for(MIN_SLOTS)` bytes, dropped after the ring's
    // last use.
    let r = unsafe { Ring::init(m.0, MIN_SLOTS, 7, 0) };
    let mut c = Consumer::new(r);
    let quarter = MIN_SLOTS / 4;
    for i in 0..45 {
        assert!(r.try_event(&ev(1, i)));
    }
    let addr = m.0 as usize;
    let (tx, rx) = std::sync::mpsc::channel();
    let mut producer = None;
    let mut first = true;
    // The drain has read head = 45; meanwhile quarter - 1 more are published and a producer reads the tail
    // (still 0) and stops before its compare-and-swap.
    c.drain(false, |_| {
        if first {
            first = false;
            for i in 0..quarter - 1 {
                assert!(r.try_event(&ev(1, 100 + i)));
            }
            let tx = tx.clone();
            producer = Some(std::thread::spawn(move || {
                // SAFETY: `addr` is `m`, a ring of MIN_SLOTS laid out above; this thread is joined before `m`
                // is dropped.
                let r = unsafe { Ring::open(addr as *mut u8, bytes_for(MIN_SLOTS)).unwrap() };
                let mut once = true;
                let pause = || {
                    if once {
                        once = false;
                        tx.send(()).unwrap();
                        std::thread::sleep(Duration::from_millis(300));
                    }
                };
                let pos = r
                    .reserve_hooked(1, KEEP_FOR_LAST, || (), pause, |_| ())
                    .unwrap();
                r.write_event(pos, &ev(2, 0));
            }));
            rx.recv().unwrap();
        }
    });
    assert_eq!(c.pos, 45);
    let t = Instant::now();
    c.sleep(Duration::from_secs(20));
    let slept = t.elapsed();
    producer.unwrap().join().unwrap();
    assert!(
        slept < Duration::from_secs(10),
        "slept {slept:?} past a quarter"
    );
    assert_eq!(c.drain(false, |_| {}), quarter);
}

#[test]
fn a_sleeping_collector_is_woken_once_however_many_producers_find_it_asleep() {
    let m = Mem::new(MIN_SLOTS);
    // SAFETY: `m` is zeroed, 4096-aligned memory of `bytes_for(MIN_SLOTS)` bytes, dropped after the ring's
    // last use.
    let r = unsafe { Ring::init(m.0, MIN_SLOTS, 7, 0) };
    let c = Consumer::new(r);
    // As the collector leaves it when it goes to sleep (and stays, if it is stopped there).
    r.a32(OFF_SLEEPING).store(1, Ordering::SeqCst);
    let seen = c.wake_seen();
    for _ in 0..100 {
        r.wake();
        r.count_drop();
    }
    assert_eq!(c.wake_seen(), seen.wrapping_add(1));
    assert_eq!(r.dropped(), 100);
}

#[test]
fn a_full_ring_refuses_and_counts_and_frees_room_when_drained() {
    let m = Mem::new(MIN_SLOTS);
    // SAFETY: `m` is zeroed, 4096-aligned memory of `bytes_for(MIN_SLOTS)` bytes, dropped after the ring's
    // last use.
    let r = unsafe { Ring::init(m.0, MIN_SLOTS, 7, 0) };
    let mut c = Consumer::new(r);
    let mut ok = 0;
    for i in 0..MIN_SLOTS + 10 {
        if r.try_event(&ev(1, i)) {
            ok += 1;
        } else {
            r.count_drop();
        }
    }
    assert_eq!(ok, MIN_SLOTS - KEEP_FOR_LAST);
    assert_eq!(r.dropped(), 10 + KEEP_FOR_LAST);
    assert!(!r.try_blob(&[1; 100]));
    // The goodbye still fits.
    assert!(r.try_last(&[2; 100]));
    assert!(!r.try_last(&[2; 100]));
    assert_eq!(c.drain(false, |_| {}), MIN_SLOTS - KEEP_FOR_LAST + 1);
    assert!(r.try_event(&ev(1, 0)));
    assert!(r.try_blob(&vec![0; r.max_blob()]));
    assert!(!r.try_blob(&vec![0; r.max_blob() + 1]));
}

/// Issue 25: the traced process scribbles the head word far ahead: the collector's drain (of a process
/// alive or dead) takes the ring for corrupt at once instead of walking up to 2^48 slots.
#[test]
fn a_scribbled_head_is_corrupt_not_a_spin() {
    let m = Mem::new(MIN_SLOTS);
    // SAFETY: `m` is zeroed, 4096-aligned memory of `bytes_for(MIN_SLOTS)` bytes, dropped after the ring's
    // last use.
    let r = unsafe { Ring::init(m.0, MIN_SLOTS, 7, 0) };
    let mut c = Consumer::new(r);
    assert!(r.try_event(&ev(1, 1)));
    assert_eq!(c.drain(false, |_| {}), 1);
    r.a64(OFF_HEAD).store(1 << 47, Ordering::Release);
    let t = std::time::Instant::now();
    assert_eq!(c.drain(true, |_| {}), 0);
    c.skip_stuck();
    assert!(c.corrupt);
    assert!(
        t.elapsed() < std::time::Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
}

#[test]
fn a_record_left_half_written_by_a_dead_process_is_skipped_and_counted() {
    let m = Mem::new(MIN_SLOTS);
    // SAFETY: `m` is zeroed, 4096-aligned memory of `bytes_for(MIN_SLOTS)` bytes, dropped after the ring's
    // last use.
    let r = unsafe { Ring::init(m.0, MIN_SLOTS, 7, 0) };
    let mut c = Consumer::new(r);
    assert!(r.try_event(&ev(1, 1)));
    // A thread reserved three slots for a blob and died before publishing them.
    assert!(r.reserve(3, 0).is_some());
    assert!(r.try_event(&ev(2, 2)));
    let mut got = Vec::new();
    c.drain(false, |it| {
        if let Item::Event(e) = it {
            got.push(e.ts_ns)
        }
    });
    assert_eq!(
        got,
        vec![1],
        "alive: the drain waits at the unpublished record"
    );
    c.drain(true, |it| {
        if let Item::Event(e) = it {
            got.push(e.ts_ns)
        }
    });
    assert_eq!(got, vec![1, 2]);
    assert_eq!(c.torn, 1);
    assert_eq!(c.torn_blobs, 0, "a bare reservation is no blob");
}

#[test]
fn a_blob_a_dead_process_was_writing_is_counted_as_one() {
    let m = Mem::new(MIN_SLOTS);
    // SAFETY: `m` is zeroed, 4096-aligned memory of `bytes_for(MIN_SLOTS)` bytes, dropped after the ring's
    // last use.
    let r = unsafe { Ring::init(m.0, MIN_SLOTS, 7, 0) };
    let mut c = Consumer::new(r);
    assert!(r.try_blob(&[1; 100]));
    assert!(
        (0..INTENTS).all(|i| r.intent(i).load(Ordering::Relaxed) == 0),
        "published: its intent word is free again"
    );
    // A thread reserved a blob of three slots and died writing it; another died reserving an event; a third
    // thread's event came after.
    assert!(r.begin_blob(&[2; 130], KEEP_FOR_LAST).is_some());
    assert!(r.reserve(1, KEEP_FOR_LAST).is_some());
    assert!(r.try_event(&ev(2, 2)));
    let (mut blobs, mut events) = (0, 0);
    c.drain(true, |it| match it {
        Item::Blob(_) => blobs += 1,
        Item::Event(_) => events += 1,
    });
    assert_eq!((blobs, events, c.torn), (1, 1, 2));
    assert_eq!(c.torn_blobs, 1, "one of the two torn records was a blob");
}

#[test]
fn every_blob_writer_that_dies_past_its_reservation_names_its_blob() {
    let m = Mem::new(MIN_SLOTS);
    // SAFETY: `m` is zeroed, 4096-aligned memory of `bytes_for(MIN_SLOTS)` bytes, dropped after the ring's
    // last use.
    let r = unsafe { Ring::init(m.0, MIN_SLOTS, 7, 0) };
    // Nine writers mid-blob at once: eight have intent words, the ninth none (its blob is taken for an event).
    for _ in 0..9 {
        assert!(r.begin_blob(&[3; 10], KEEP_FOR_LAST).is_some());
    }
    let mut c = Consumer::new(r);
    c.drain(true, |_| ());
    assert_eq!((c.torn, c.torn_blobs), (9, 8));
    // A blob that found no room frees its word.
    let m2 = Mem::new(MIN_SLOTS);
    // SAFETY: as above.
    let r2 = unsafe { Ring::init(m2.0, MIN_SLOTS, 8, 0) };
    assert!(r2.begin_blob(&[4; 48 * 200], MIN_SLOTS).is_none());
    assert!((0..INTENTS).all(|i| r2.intent(i).load(Ordering::Relaxed) == 0));
}

#[test]
fn a_record_a_live_thread_never_finishes_can_be_skipped() {
    let m = Mem::new(MIN_SLOTS);
    // SAFETY: `m` is zeroed, 4096-aligned memory of `bytes_for(MIN_SLOTS)` bytes, dropped after the ring's
    // last use.
    let r = unsafe { Ring::init(m.0, MIN_SLOTS, 7, 0) };
    let mut c = Consumer::new(r);
    assert_eq!(c.waiting_at(), None);
    assert!(r.reserve(2, 0).is_some());
    assert!(r.try_event(&ev(2, 2)));
    assert_eq!(c.waiting_at(), Some(0));
    c.skip_stuck();
    let mut got = Vec::new();
    c.drain(false, |it| {
        if let Item::Event(e) = it {
            got.push(e.ts_ns)
        }
    });
    assert_eq!((got, c.torn), (vec![2], 1));
}

#[test]
fn garbage_in_the_ring_stops_the_drain_without_reading_out_of_bounds() {
    let m = Mem::new(MIN_SLOTS);
    // SAFETY: `m` is zeroed, 4096-aligned memory of `bytes_for(MIN_SLOTS)` bytes, dropped after the ring's
    // last use.
    let r = unsafe { Ring::init(m.0, MIN_SLOTS, 7, 0) };
    let mut c = Consumer::new(r);
    assert!(r.try_blob(&[9; 200]));
    // Another writer scribbles a huge length over the blob's first slot.
    // SAFETY: bytes 12..16 of the first slot of `m`'s mapping, 4-aligned; no other thread uses the ring.
    unsafe { m.0.add(HEADER + 12).cast::<u32>().write(u32::MAX) };
    assert_eq!(c.drain(true, |_| panic!("nothing whole")), 0);
    assert!(c.corrupt);
    // Refused for good, and the collector's look at it sleeps its time (it once spun on the garbage).
    assert_eq!(c.drain(false, |_| panic!("refused")), 0);
    let t0 = std::time::Instant::now();
    c.sleep(std::time::Duration::from_millis(30));
    assert!(t0.elapsed() >= std::time::Duration::from_millis(20));
    // SAFETY: `m` holds more than 100 bytes (a length this short is refused before anything is read).
    assert_eq!(unsafe { Ring::open(m.0, 100) }.err(), Some(Invalid::Size));
    // SAFETY: the header's version word, inside `m`'s mapping and 4-aligned; no other thread uses it.
    unsafe { m.0.add(OFF_VERSION).cast::<u32>().write(99) };
    assert_eq!(
        // SAFETY: `m` is `bytes_for(MIN_SLOTS)` bytes, 4096-aligned, alive until the test ends.
        unsafe { Ring::open(m.0, bytes_for(MIN_SLOTS)) }.err(),
        Some(Invalid::Version(99))
    );
}

#[test]
fn many_threads_lose_nothing_and_keep_each_threads_order() {
    let slots = 1 << 12;
    let m = Mem::new(slots);
    // SAFETY: `m` is zeroed, 4096-aligned memory of `bytes_for(slots)` bytes; the threads using `r` end with
    // the scope, before `m` is dropped.
    let r = unsafe { Ring::init(m.0, slots, 7, 0) };
    let per = 50_000u64;
    let threads = 6u32;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut c = Consumer::new(r);
    std::thread::scope(|s| {
        for t in 0..threads {
            let done = done.clone();
            s.spawn(move || {
                for i in 0..per {
                    let e = ev(t, i);
                    while !r.try_event(&e) {
                        std::hint::spin_loop();
                    }
                    if i % 1000 == 0 {
                        let b = [t as u8; 130];
                        while !r.try_blob(&b) {
                            std::hint::spin_loop();
                        }
                    }
                }
                done.fetch_add(1, Ordering::Release);
            });
        }
        let mut next = vec![0u64; threads as usize];
        let mut blobs = 0;
        loop {
            let finished = done.load(Ordering::Acquire) == threads;
            c.drain(false, |it| match it {
                Item::Event(e) => {
                    assert_eq!(
                        e.ts_ns, next[e.tid as usize],
                        "thread {} out of order",
                        e.tid
                    );
                    assert_eq!(e, ev(e.tid, e.ts_ns));
                    next[e.tid as usize] += 1;
                }
                Item::Blob(b) => {
                    assert_eq!(b.len(), 130);
                    assert!(b.iter().all(|x| *x == b[0]));
                    blobs += 1;
                }
            });
            if finished && r.used() == 0 {
                break;
            }
        }
        assert!(next.iter().all(|n| *n == per));
        assert_eq!(blobs, threads as u64 * per / 1000);
    });
}

/// A clock every thread reads: CLOCK_MONOTONIC in ns.
fn mono() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a local timespec the call writes.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

#[test]
fn held_at_their_rings_last_time_and_promise_events_come_out_in_time_order_within_their_window() {
    // More threads than cores, so that some are pre-empted between reading the clock and reserving: such a
    // stamp comes out after newer ones, or after a promise newer than it. The consumer holds each time at
    // no less than the one before it and the last promise, as the collector does: what comes out is then
    // in time order, never older than a promise made before it was read, and never moved past the moment
    // its producer published it. The writers pause now and then, so that the ring empties and the
    // collector can promise.
    let m = Mem::new(1 << 16);
    // SAFETY: `m` is zeroed, 4096-aligned memory of `bytes_for(1 << 16)` bytes, dropped after the ring's last
    // use.
    let r = unsafe { Ring::init(m.0, 1 << 16, 7, 0) };
    // SAFETY: the same memory as `r`'s, viewed again.
    let mut c = Consumer::new(unsafe { Ring::open(m.0, bytes_for(1 << 16)).unwrap() });
    let threads = 8u32;
    let per = 50_000u64;
    let done = AtomicU64::new(0);
    // Each event's publication time, by writer and index (read after its reservation succeeded).
    let published: Vec<Vec<AtomicU64>> = (0..threads)
        .map(|_| (0..per).map(|_| AtomicU64::new(0)).collect())
        .collect();
    std::thread::scope(|sc| {
        for t in 0..threads {
            let (r, done, published) = (&r, &done, &published);
            sc.spawn(move || {
                for i in 0..per {
                    let mut e = ev(t, i);
                    e.ts_ns = mono();
                    // The publication time is stored before the event is: the consumer reads it after.
                    while !r.try_event(&e) {
                        std::hint::spin_loop();
                        e.ts_ns = mono();
                    }
                    published[t as usize][i as usize].store(mono(), Ordering::Release);
                    if i % 2000 == 0 {
                        std::thread::sleep(std::time::Duration::from_micros(50));
                    }
                }
                done.fetch_add(1, Ordering::Release);
            });
        }
        let (mut last, mut events, mut promises, mut promised) = (0u64, 0u64, 0u64, 0u64);
        let (mut held, mut past, mut held_back) = (0u64, 0u64, Vec::new());
        loop {
            let finished = done.load(Ordering::Acquire) == threads as u64;
            c.drain(false, |it| {
                let Item::Event(e) = it else { unreachable!() };
                events += 1;
                let ts = e.ts_ns.max(last).max(promised);
                held += (ts != e.ts_ns) as u64;
                last = ts;
                held_back.push((e.tid, e.addr, ts));
            });
            if let Some(t) = r.promise(mono) {
                promises += 1;
                promised = promised.max(t);
            }
            if finished && r.used() == 0 {
                break;
            }
        }
        // Checked once every writer is done: a held time is never later than its event's publication
        // (stored right after it, so read here, not in the drain).
        for (t, addr, ts) in held_back {
            let i = addr - 0x1000;
            let at = published[t as usize][i as usize].load(Ordering::Acquire);
            past += (ts > at) as u64;
        }
        assert_eq!(events, threads as u64 * per);
        assert_eq!(past, 0, "times held past their event's publication");
        assert!(promises > 0);
        // Not asserted (it depends on the scheduler), but shown: how often a time had to be held.
        eprintln!("{held} of {events} times held");
    });
}

#[test]
fn a_producer_holding_a_stale_head_never_finds_a_roomy_ring_full() {
    // A producer pre-empted between reading the head and the tail, while other threads reserved and the
    // collector released past it, once read the room left as negative and dropped its event as if the ring
    // were full. The clock is read between the two: there the others run.
    let m = Mem::new(MIN_SLOTS);
    // SAFETY: `m` is zeroed, 4096-aligned memory of `bytes_for(MIN_SLOTS)` bytes, dropped after the ring's
    // last use.
    let r = unsafe { Ring::init(m.0, MIN_SLOTS, 7, 0) };
    // SAFETY: the same memory as `r`'s, viewed again.
    let mut c = Consumer::new(unsafe { Ring::open(m.0, bytes_for(MIN_SLOTS)).unwrap() });
    let mut meanwhile = true;
    let reserved = r.reserve_between(1, KEEP_FOR_LAST, || {
        if std::mem::take(&mut meanwhile) {
            for i in 0..10 {
                assert!(r.try_event(&ev(2, i)));
            }
            assert_eq!(c.drain(false, |_| {}), 10);
        }
    });
    let pos = reserved.expect("refused by a nearly empty ring");
    let mut e = ev(1, 0);
    e.ts_ns = 77;
    r.write_event(pos, &e);
    let mut got = Vec::new();
    c.drain(false, |it| {
        if let Item::Event(e) = it {
            got.push((e.tid, e.ts_ns));
        }
    });
    assert_eq!(got, [(1, 77)]);
}

#[test]
fn a_tail_past_the_head_is_no_room_not_a_spin() {
    // Words no ring holds (the memory overwritten, or written by another layout): the writer must give up.
    let m = Mem::new(MIN_SLOTS);
    // SAFETY: `m` is zeroed, 4096-aligned memory of `bytes_for(MIN_SLOTS)` bytes, dropped after the ring's
    // last use.
    let r = unsafe { Ring::init(m.0, MIN_SLOTS, 7, 0) };
    r.a64(OFF_TAIL).store(1 << 40, Ordering::Release);
    assert!(!r.try_event(&ev(1, 1)));
    assert!(!r.try_blob(&[1, 2, 3]));
}

//! The replay's numbers, exactly, on traces built in memory.

mod common;

use common::*;
use vramtrace_collector::model::{analyze_reader, Analysis, Ended};
use vramtrace_format::codec::{kind, put_frame, put_record};
use vramtrace_format::{flags, Api, EndKind, Record, NO_DEVICE};

fn run(records: &[Record]) -> Analysis {
    analyze_reader(&trace(records)[..]).unwrap()
}

#[test]
fn batches_arriving_out_of_time_order_make_no_false_peak() {
    // Process 1 holds 6 GiB from 10 to 20 ms, process 2 from 30 to 40 ms: never both at once. The file has
    // process 2's batch between process 1's alloc and its free, so replaying by arrival would see 12 GiB.
    let a = run(&[
        hello(1, 0),
        hello(2, 0),
        events(1, vec![alloc(10, 0, 0xa000, 6 * GIB)]),
        events(2, vec![alloc(30, 0, 0xb000, 6 * GIB), free(40, 0xb000)]),
        events(1, vec![free(20, 0xa000)]),
        end(1, 50, EndKind::Goodbye),
        end(2, 50, EndKind::Goodbye),
    ]);
    assert!(!a.partial);
    assert_eq!(a.events, 4);
    assert_eq!(a.devices.len(), 1);
    let d = &a.devices[0];
    assert_eq!(d.device, Some(0));
    assert_eq!(d.peak_bytes, 6 * GIB);
    assert_eq!(d.peak_time_ns, Some(10 * MS));
    assert_eq!(d.allocations, 2);
    assert_eq!(d.live_bytes_at_end, 0);
    assert_eq!(d.in_use_bytes_at_end, 0);
    assert!(d.timeline.buckets.iter().all(|b| b.max_bytes <= 6 * GIB));
    let p1 = a.process(1).unwrap();
    assert_eq!((p1.peak_bytes, p1.peak_time_ns), (6 * GIB, Some(10 * MS)));
    assert_eq!((p1.allocations, p1.frees, p1.unmatched_frees), (1, 1, 0));
    let p2 = a.process(2).unwrap();
    assert_eq!((p2.peak_bytes, p2.peak_time_ns), (6 * GIB, Some(30 * MS)));
    assert_eq!(p1.ended, Ended::Goodbye);
    assert_eq!(a.duration_ns, 50 * MS);
    assert_eq!(a.end_ns, 50 * MS);
}

#[test]
fn a_process_that_said_goodbye_releases_its_memory_then_not_when_its_close_was_noticed() {
    // `a; b` in a shell: process 1 leaks 8 GiB and says goodbye at 10 ms; process 2 starts after it exited and
    // allocates 7 GiB at 12 ms; the collector noticed process 1's connection close only at 15 ms. Never both.
    let a = run(&[
        hello(1, 0),
        events(1, vec![alloc(5, 0, 0xa000, 8 * GIB)]),
        goodbye(1, 10),
        hello(2, 11),
        events(2, vec![alloc(12, 0, 0xb000, 7 * GIB)]),
        end(1, 15, EndKind::Goodbye),
        end(2, 20, EndKind::Vanished),
    ]);
    let d = a.device(0).unwrap();
    assert_eq!((d.peak_bytes, d.peak_time_ns), (8 * GIB, Some(5 * MS)));
    assert_eq!(d.in_use_bytes_at_end, 0);
    let p1 = a.process(1).unwrap();
    assert_eq!((p1.ended, p1.end_ns), (Ended::Goodbye, Some(10 * MS)));
    assert_eq!(p1.live_bytes_at_end, 8 * GIB);
    let p2 = a.process(2).unwrap();
    assert_eq!((p2.ended, p2.end_ns), (Ended::Vanished, Some(20 * MS)));
}

#[test]
fn a_goodbye_older_than_a_tick_of_its_process_is_released_after_that_tick() {
    // Process 1's shim said goodbye at 10 ms, but it lived on (its CUDA teardown) and the collector promised for
    // it up to 30 ms: its end goes no earlier than that promise, in order, so process 2's 7 GiB at 20 ms sums.
    let a = run(&[
        hello(1, 0),
        hello(2, 0),
        events(1, vec![alloc(5, 0, 0xa000, 8 * GIB)]),
        tick(1, 30),
        events(2, vec![alloc(20, 0, 0xb000, 7 * GIB)]),
        tick(2, 40),
        goodbye(1, 10),
        end(1, 32, EndKind::Goodbye),
        end(2, 50, EndKind::Vanished),
    ]);
    assert_eq!(a.merge_inexact_events, 0);
    let d = a.device(0).unwrap();
    assert_eq!((d.peak_bytes, d.peak_time_ns), (15 * GIB, Some(20 * MS)));
    assert_eq!(a.process(1).unwrap().end_ns, Some(30 * MS));
}

#[test]
fn a_context_torn_down_after_the_goodbye_frees_before_the_end() {
    // The shim's goodbye (10 ms) runs before CUDA's own exit handler, which destroys the context at 12 ms: its
    // allocations are freed by that teardown, then the process ends.
    let a = run(&[
        hello(1, 0),
        events(1, vec![alloc(5, 0, 0xa000, 8 * GIB)]),
        Record::ContextGone {
            pid: 1,
            ts_ns: START + 12 * MS,
            device: 0,
            how: "cuDevicePrimaryCtxRelease".into(),
        },
        goodbye(1, 10),
        end(1, 15, EndKind::Goodbye),
    ]);
    let p = a.process(1).unwrap();
    assert_eq!((p.context_freed_bytes, p.live_bytes_at_end), (8 * GIB, 0));
    // A nanosecond after the teardown, its last record.
    assert_eq!(p.end_ns, Some(12 * MS + 1));
}

#[test]
fn a_reused_pid_after_a_goodbye_keeps_its_own_end() {
    // Pid 1 says goodbye at 10 ms; the pid is reused by a process that says hello at 12 ms; the first one's
    // connection end (11 ms) is written after the new hello, and belongs to the first.
    let a = run(&[
        hello(1, 0),
        events(1, vec![alloc(5, 0, 0xa000, 8 * GIB)]),
        goodbye(1, 10),
        hello(1, 12),
        events(1, vec![alloc(13, 0, 0xb000, 7 * GIB)]),
        end(1, 11, EndKind::Goodbye),
        events(1, vec![free(14, 0xb000), alloc(15, 0, 0xc000, GIB)]),
        end(1, 20, EndKind::Vanished),
    ]);
    assert_eq!(a.merge_inexact_events, 0);
    assert_eq!(a.processes.len(), 2);
    let (old, new) = (&a.processes[0], &a.processes[1]);
    assert_eq!((old.ended, old.end_ns), (Ended::Goodbye, Some(10 * MS)));
    assert_eq!((new.ended, new.end_ns), (Ended::Vanished, Some(20 * MS)));
    assert_eq!((new.unmatched_frees, new.live_bytes_at_end), (0, GIB));
    let d = a.device(0).unwrap();
    assert_eq!((d.peak_bytes, d.in_use_bytes_at_end), (8 * GIB, 0));
}

#[test]
fn a_trace_of_an_older_collector_releases_at_the_connection_end() {
    // Before `goodbye_last`, the shim wrote its goodbye at `exit` and a later exit handler could still free.
    let a = analyze_reader(
        &trace_goodbye_anywhere(&[
            hello(1, 0),
            events(1, vec![alloc(5, 0, 0xa000, 8 * GIB)]),
            goodbye(1, 10),
            events(1, vec![free(11, 0xa000), alloc(12, 0, 0xd000, GIB)]),
            end(1, 15, EndKind::Goodbye),
        ])[..],
    )
    .unwrap();
    let p = a.process(1).unwrap();
    assert_eq!((p.unmatched_frees, p.live_bytes_at_end), (0, GIB));
    assert_eq!((p.ended, p.end_ns), (Ended::Goodbye, Some(15 * MS)));
    assert_eq!(a.device(0).unwrap().in_use_bytes_at_end, 0);
}

#[test]
fn overlapping_processes_do_sum_per_device() {
    let a = run(&[
        events(1, vec![alloc(10, 0, 0xa000, 3 * GIB)]),
        events(
            2,
            vec![alloc(12, 0, 0xa000, 2 * GIB), alloc(13, 1, 0xc000, GIB)],
        ),
        events(1, vec![free(20, 0xa000)]),
        events(2, vec![free(30, 0xa000)]),
    ]);
    assert_eq!(a.device(0).unwrap().peak_bytes, 5 * GIB);
    assert_eq!(a.device(0).unwrap().peak_time_ns, Some(12 * MS));
    assert_eq!(a.device(1).unwrap().peak_bytes, GIB);
    let p2 = a.process(2).unwrap();
    assert_eq!(p2.peak_bytes, 3 * GIB);
    assert_eq!(p2.per_device.len(), 2);
    assert_eq!(p2.per_device[1].device, Some(1));
    assert_eq!(p2.per_device[1].live_bytes_at_end, GIB);
    // Never announced, still listed, and still running when the trace ends.
    assert!(!p2.announced);
    assert_eq!(p2.ended, Ended::Running);
    assert_eq!(a.device(1).unwrap().in_use_bytes_at_end, GIB);
}

#[test]
fn frees_match_allocations_across_batches_and_addresses_are_reused() {
    let a = run(&[
        hello(7, 0),
        events(
            7,
            vec![alloc(1, 0, 0x1000, MIB), alloc(2, 0, 0x2000, 4 * MIB)],
        ),
        events(7, vec![free(3, 0x1000), alloc(4, 0, 0x1000, 2 * MIB)]),
        events(7, vec![free(5, 0x1000), free(6, 0x2000)]),
        end(7, 10, EndKind::Goodbye),
    ]);
    let p = a.process(7).unwrap();
    assert_eq!(
        (p.allocations, p.frees, p.unmatched_frees, p.lost_frees),
        (3, 3, 0, 0)
    );
    assert_eq!(p.peak_bytes, 6 * MIB);
    assert_eq!(p.largest_allocation_bytes, 4 * MIB);
    assert_eq!(p.live_bytes_at_end, 0);
    assert_eq!(a.live_at_end_count, 0);
    assert_eq!(a.device(0).unwrap().peak_bytes, 6 * MIB);
    assert_eq!(a.device(0).unwrap().peak_time_ns, Some(4 * MS));
}

#[test]
fn an_allocation_at_a_live_address_means_a_lost_free() {
    let a = run(&[events(
        3,
        vec![alloc(1, 0, 0x1000, MIB), alloc(2, 0, 0x1000, 3 * MIB)],
    )]);
    assert_eq!(a.lost_frees, 1);
    let d = a.device(0).unwrap();
    assert_eq!(d.peak_bytes, 3 * MIB);
    assert_eq!(d.in_use_bytes_at_end, 3 * MIB);
    assert_eq!(a.process(3).unwrap().lost_frees, 1);
    assert_eq!(a.live_at_end_count, 1);
}

#[test]
fn cumemcreate_counts_on_its_device_and_address_space_never_counts() {
    let h = 0x1000; // the same number as a pointer below: handles are a namespace of their own
    let a = run(&[
        hello(4, 0),
        events(
            4,
            vec![
                ev(1, Api::MemAddressReserve, 1, 0x7000_0000_0000, 64 * GIB),
                ev(2, Api::MemCreate, 1, h, 2 * GIB),
                ev(3, Api::MemMap, 1, 0x7000_0000_0000, 2 * GIB),
                alloc(4, 0, 0x1000, MIB),
                ev(5, Api::MemUnmap, 1, 0x7000_0000_0000, 2 * GIB),
                free(6, 0x1000),
                ev(7, Api::MemRelease, NO_DEVICE, h, 0),
                ev(8, Api::MemAddressFree, 1, 0x7000_0000_0000, 64 * GIB),
            ],
        ),
        end(4, 9, EndKind::Goodbye),
    ]);
    let d1 = a.device(1).unwrap();
    assert_eq!(d1.peak_bytes, 2 * GIB);
    assert_eq!(d1.peak_time_ns, Some(2 * MS));
    assert_eq!(d1.allocations, 1);
    assert_eq!(a.device(0).unwrap().peak_bytes, MIB);
    let p = a.process(4).unwrap();
    assert_eq!(p.peak_bytes, 2 * GIB + MIB);
    assert_eq!((p.allocations, p.frees, p.unmatched_frees), (2, 2, 0));
    assert_eq!(p.address_reserved_peak_bytes, 64 * GIB);
    assert_eq!(p.mapped_peak_bytes, 2 * GIB);
    assert_eq!(a.live_at_end_count, 0);
}

#[test]
fn failed_allocations_are_counted_not_held() {
    let mut refused = failed(alloc(3, 0, 0, 8 * GIB), 2);
    refused.flags |= flags::CAP_REFUSED;
    let a = run(&[events(
        5,
        vec![
            alloc(1, 0, 0x1000, GIB),
            failed(alloc(2, 0, 0, 80 * GIB), 2),
            refused,
            failed(alloc(4, 0, 0, GIB), 1),
            failed(free(5, 0x1000), 1), // a failed free frees nothing
            free(6, 0x1000),
        ],
    )]);
    let p = a.process(5).unwrap();
    assert_eq!(
        (
            p.allocations,
            p.failed_allocations,
            p.oom_results,
            p.cap_refusals
        ),
        (1, 3, 2, 1)
    );
    assert_eq!((p.frees, p.unmatched_frees), (1, 0));
    assert_eq!(a.device(0).unwrap().peak_bytes, GIB);
    assert_eq!(a.device(0).unwrap().largest_allocation_bytes, GIB);
}

#[test]
fn a_release_the_driver_refused_is_put_back() {
    // The shim publishes a release before the driver answers; a refusal follows, the thread's next event.
    let undone = |ms, addr| {
        let mut e = free(ms, addr);
        e.result = 1;
        e.flags |= flags::UNDONE;
        e
    };
    let mut other_thread = alloc(3, 0, 0x5000, MIB);
    other_thread.tid = 2;
    let a = run(&[events(
        5,
        vec![
            alloc(1, 0, 0x1000, GIB),
            free(2, 0x1000),
            other_thread,
            undone(4, 0x1000),
            // A double free: nothing was live there, and no unmatched free either once refused.
            free(5, 0xdead),
            undone(6, 0xdead),
            alloc(7, 0, 0x2000, GIB),
        ],
    )]);
    let p = a.process(5).unwrap();
    assert_eq!(
        (p.allocations, p.frees, p.unmatched_frees, p.lost_frees),
        (3, 0, 0, 0)
    );
    let d = a.device(0).unwrap();
    assert_eq!(d.peak_bytes, 2 * GIB + MIB);
    assert_eq!(d.in_use_bytes_at_end, 2 * GIB + MIB);
    assert_eq!(d.allocations, 3);
}

#[test]
fn a_release_refused_after_its_context_was_torn_down_puts_nothing_back() {
    // Thread 1 frees, another thread's teardown ends the last context, and the driver then refuses the free:
    // the memory is gone with the context, not live again.
    let mut undone = free(4, 0x1000);
    undone.result = 201;
    undone.flags |= flags::UNDONE;
    let a = run(&[
        hello(5, 0),
        events(
            5,
            vec![
                alloc(1, 0, 0x1000, GIB),
                alloc(1, 0, 0x2000, MIB),
                free(2, 0x1000),
            ],
        ),
        Record::ContextGone {
            pid: 5,
            ts_ns: START + 3 * MS,
            device: 0,
            how: "cuCtxDestroy".into(),
        },
        events(5, vec![undone]),
        goodbye(5, 10),
        end(5, 15, EndKind::Goodbye),
    ]);
    let d = a.device(0).unwrap();
    assert_eq!(d.in_use_bytes_at_end, 0);
    assert_eq!(d.live_bytes_at_end, 0);
}

#[test]
fn unmatched_frees_are_counted_and_ignored() {
    let a = run(&[events(
        6,
        vec![free(1, 0xdead), alloc(2, 0, 0x1000, MIB), free(3, 0xbeef)],
    )]);
    assert_eq!(a.unmatched_frees, 2);
    assert_eq!(a.process(6).unwrap().unmatched_frees, 2);
    assert_eq!(a.device(0).unwrap().in_use_bytes_at_end, MIB);
}

#[test]
fn memory_live_at_a_process_end_is_listed_and_released() {
    let mut first = Vec::new();
    for i in 0..25u64 {
        first.push(alloc(1 + i, 0, 0x10_0000 * (i + 1), (i + 1) * MIB));
    }
    first[3] = ptsz(ev(4, Api::MemAllocAsync, 0, 0x40_0000, 4 * MIB));
    let a = run(&[
        hello(1, 0),
        hello(2, 0),
        events(1, first),
        end(1, 100, EndKind::Vanished),
        // After process 1 is gone, process 2 takes memory: the device sum must not include process 1's.
        events(2, vec![alloc(200, 0, 0x1000, 100 * MIB)]),
        tick(2, 300),
    ]);
    let all: u64 = (1..=25).sum::<u64>() * MIB;
    let d = a.device(0).unwrap();
    assert_eq!(d.peak_bytes, all);
    assert_eq!(d.peak_time_ns, Some(25 * MS));
    assert_eq!(d.live_bytes_at_end, all + 100 * MIB);
    assert_eq!(d.in_use_bytes_at_end, 100 * MIB);
    assert_eq!(a.live_at_end_count, 26);
    assert_eq!(a.live_at_end_bytes, all + 100 * MIB);
    assert_eq!(a.live_at_end.len(), 20);
    // Largest first; ages run to the owner's end (process 1 ended at 100 ms; process 2 runs to 300 ms).
    assert_eq!(a.live_at_end[0].bytes, 100 * MIB);
    assert_eq!(a.live_at_end[0].pid, 2);
    assert_eq!(a.live_at_end[0].age_ns, 100 * MS);
    assert_eq!(a.live_at_end[1].bytes, 25 * MIB);
    assert_eq!(a.live_at_end[1].age_ns, 75 * MS);
    assert_eq!(a.live_at_end[1].address, 0x190_0000);
    assert_eq!(a.live_at_end[1].api, Api::MemAlloc);
    assert_eq!(a.live_at_end.last().unwrap().bytes, 7 * MIB);
    let p1 = a.process(1).unwrap();
    assert_eq!(p1.ended, Ended::Vanished);
    assert_eq!(p1.end_ns, Some(100 * MS));
    assert_eq!(
        (p1.live_allocations_at_end, p1.live_bytes_at_end),
        (25, all)
    );
    assert_eq!(a.process(2).unwrap().ended, Ended::Running);
    // The timeline drops when process 1 ends.
    let tl = &d.timeline;
    let at = |t: u64| tl.buckets[(t / tl.bucket_ns) as usize];
    assert_eq!(at(50 * MS).last_bytes, all);
    assert_eq!(at(150 * MS).max_bytes, 0);
    assert_eq!(at(250 * MS).last_bytes, 100 * MIB);

    // The ptsz one is listed as such once it is among the largest.
    let b = run(&[events(
        1,
        vec![
            ptsz(ev(1, Api::MemAllocAsync, 0, 0x1000, GIB)),
            alloc(2, 0, 0x2000, MIB),
        ],
    )]);
    assert_eq!(b.live_at_end.len(), 2);
    assert!(b.live_at_end[0].ptsz && b.live_at_end[0].api == Api::MemAllocAsync);
    assert!(!b.live_at_end[1].ptsz);
}

#[test]
fn events_within_a_batch_are_put_in_time_order() {
    // The free was stamped before the allocation that reused the address (another thread).
    let a = run(&[events(
        1,
        vec![
            alloc(1, 0, 0x1000, MIB),
            alloc(5, 0, 0x1000, 2 * MIB),
            free(3, 0x1000),
        ],
    )]);
    assert_eq!(a.lost_frees, 0);
    assert_eq!(a.unmatched_frees, 0);
    assert_eq!(a.device(0).unwrap().peak_bytes, 2 * MIB);
}

#[test]
fn a_late_batch_of_the_same_process_is_merged_in() {
    // Process 2 holds the merge back (its hello at 0), so process 1's batches wait and the late one is merged.
    let a = run(&[
        hello(2, 0),
        events(
            1,
            vec![alloc(1, 0, 0x1000, MIB), alloc(10, 0, 0x1000, 2 * MIB)],
        ),
        events(1, vec![free(5, 0x1000)]),
        tick(2, 100),
    ]);
    assert_eq!((a.lost_frees, a.unmatched_frees), (0, 0));
    assert_eq!(a.device(0).unwrap().peak_bytes, 2 * MIB);
}

#[test]
fn driver_info_and_drops_and_hello_fields() {
    let a = run(&[
        hello(9, 0),
        events(
            9,
            vec![
                ev(1, Api::MemGetInfo, 0, 80 * GIB, 70 * GIB),
                alloc(2, 0, 0x1000, GIB),
                ev(3, Api::MemGetInfo, 0, 80 * GIB, 69 * GIB),
            ],
        ),
        Record::Dropped {
            pid: 9,
            ts_ns: START + 4 * MS,
            count: 17,
        },
        Record::Dropped {
            pid: 9,
            ts_ns: START + 5 * MS,
            count: 3,
        },
        goodbye(9, 6),
    ]);
    let d = a.device(0).unwrap();
    assert_eq!(d.driver_total_bytes, Some(80 * GIB));
    assert_eq!(d.driver_free_bytes, Some(69 * GIB));
    assert_eq!(a.dropped_events, 20);
    let p = a.process(9).unwrap();
    assert_eq!(p.dropped_events, 20);
    assert_eq!(p.rank, Some(9));
    assert_eq!(p.ppid, Some(1));
    assert_eq!(p.cmdline[0], "/usr/bin/worker9");
    // A goodbye without a recorded connection end.
    assert_eq!(p.ended, Ended::Goodbye);
}

#[test]
fn a_pid_announced_again_is_a_new_process() {
    let a = run(&[
        hello(5, 0),
        events(5, vec![alloc(1, 0, 0x1000, GIB)]),
        end(5, 10, EndKind::Goodbye),
        hello(5, 20),
        events(5, vec![alloc(21, 0, 0x1000, GIB)]),
        end(5, 30, EndKind::Vanished),
    ]);
    assert_eq!(a.processes.len(), 2);
    assert_eq!(a.lost_frees, 0);
    assert_eq!(a.device(0).unwrap().peak_bytes, GIB);
    assert_eq!(a.processes[0].ended, Ended::Goodbye);
    assert_eq!(a.processes[1].ended, Ended::Vanished);
    assert_eq!(a.processes[1].start_ns, 20 * MS);
}

#[test]
fn unknown_frames_are_skipped_and_counted() {
    let mut t = trace(&[events(1, vec![alloc(1, 0, 0x1000, MIB)])]);
    put_frame(&mut t, 200, |o| o.extend_from_slice(b"from the future"));
    put_record(&mut t, &events(1, vec![free(2, 0x1000)]));
    let a = analyze_reader(&t[..]).unwrap();
    assert!(!a.partial);
    assert_eq!(a.unknown_frames, 1);
    assert_eq!(a.frames, 3);
    assert_eq!(a.device(0).unwrap().in_use_bytes_at_end, 0);
}

fn two_process_trace() -> Vec<Record> {
    vec![
        hello(1, 0),
        hello(2, 0),
        events(1, vec![alloc(10, 0, 0xa000, 6 * GIB)]),
        events(2, vec![alloc(30, 0, 0xb000, GIB)]),
        events(1, vec![free(20, 0xa000)]),
        events(2, vec![alloc(40, 0, 0xc000, 2 * GIB), free(45, 0xb000)]),
    ]
}

#[test]
fn a_trace_cut_at_any_byte_of_its_last_frame_reports_what_came_before() {
    let recs = two_process_trace();
    let before = trace(&recs[..recs.len() - 1]);
    let full = trace(&recs);
    let whole = analyze_reader(&before[..]).unwrap();
    assert!(!whole.partial && whole.stopped.is_none());
    for cut in before.len() + 1..full.len() {
        let a = analyze_reader(&full[..cut]).unwrap();
        assert!(a.partial, "cut at {cut}");
        let why = a.stopped.as_deref().unwrap();
        assert!(why.contains("cut short"), "{why}");
        assert!(why.contains(&format!("at byte {}", before.len())), "{why}");
        assert!(
            why.contains(&format!("after {} whole frames", recs.len() - 1)),
            "{why}"
        );
        assert_eq!(a.events, whole.events);
        assert_eq!(a.devices, whole.devices);
        assert_eq!(a.processes, whole.processes);
    }
    let a = analyze_reader(&full[..]).unwrap();
    assert!(!a.partial);
    assert_eq!(a.device(0).unwrap().peak_bytes, 6 * GIB);
    assert_eq!(a.device(0).unwrap().in_use_bytes_at_end, 2 * GIB);
}

#[test]
fn a_frame_that_does_not_decode_is_skipped_and_the_rest_is_read() {
    // Issue 25: one undecodable frame (a faulty or hostile process's) used to stop every reader there.
    let recs = two_process_trace();
    let mut t = trace(&recs[..4]);
    let at = t.len();
    // An events frame whose API byte names no API.
    put_frame(&mut t, kind::EVENTS, |o| {
        o.extend_from_slice(&[1, 1, 0, 0, 99, 0, 1, 0, 0, 0, 0])
    });
    put_record(&mut t, &recs[4]);
    let a = analyze_reader(&t[..]).unwrap();
    assert!(!a.partial, "{:?}", a.stopped);
    assert_eq!(a.bad_frames, 1);
    assert_eq!(a.first_bad_frame.as_ref().unwrap().0, at as u64);
    assert_eq!(a.frames, 5);
    // The free after the bad frame was read: pid 1's 6 GiB never overlapped pid 2's 1 GiB.
    assert_eq!(a.device(0).unwrap().peak_bytes, 6 * GIB);
    assert_eq!(a.device(0).unwrap().in_use_bytes_at_end, GIB);
    let text = vramtrace_collector::reporters::text::render(&a, None);
    assert!(
        text.contains("1 frame did not decode and was skipped"),
        "{text}"
    );
}

#[test]
fn an_empty_trace_is_a_report_of_nothing() {
    let a = run(&[]);
    assert!(!a.partial);
    assert_eq!(a.events, 0);
    assert!(a.devices.is_empty() && a.processes.is_empty());
    assert_eq!(a.duration_ns, 0);
    assert_eq!(a.first_ns, None);
}

#[test]
fn a_silent_open_process_does_not_lose_events() {
    // Process 1 says hello and nothing else, so the merge waits on it; everything is replayed at the end.
    let mut recs = vec![hello(1, 0)];
    for i in 0..2000u64 {
        recs.push(events(
            2,
            vec![
                alloc(2 * i, 0, 0x1000 + i % 3, MIB),
                free(2 * i + 1, 0x1000 + i % 3),
            ],
        ));
    }
    let a = run(&recs);
    assert_eq!(a.events, 4000);
    let d = a.device(0).unwrap();
    assert_eq!(
        (d.peak_bytes, d.allocations, d.in_use_bytes_at_end),
        (MIB, 2000, 0)
    );
    // 4 s in at most 2048 buckets: the narrowest doubling of the first width that fits.
    let w = d.timeline.bucket_ns;
    assert!(w * 2048 >= 4000 * MS && w * 1024 < 4000 * MS, "width {w}");
    assert!(d.timeline.buckets.len() <= 2048);
    assert_eq!(a.process(2).unwrap().frees, 2000);
}

/// A replay of all events sorted by time at once: what the merge must agree with.
fn reference_peak(recs: &[Record]) -> u64 {
    use std::collections::HashMap;
    let mut all: Vec<(u32, vramtrace_format::Event)> = Vec::new();
    for r in recs {
        if let Record::Events { pid, events } = r {
            all.extend(events.iter().map(|e| (*pid, *e)));
        }
    }
    all.sort_by_key(|(_, e)| e.ts_ns);
    let mut live: HashMap<(u32, u64), u64> = HashMap::new();
    let (mut cur, mut peak) = (0u64, 0u64);
    for (pid, e) in all {
        match e.api {
            Api::MemAlloc => {
                if let Some(old) = live.insert((pid, e.addr), e.size) {
                    cur -= old;
                }
                cur += e.size;
                peak = peak.max(cur);
            }
            Api::MemFree => cur -= live.remove(&(pid, e.addr)).unwrap_or(0),
            _ => unreachable!(),
        }
    }
    peak
}

#[test]
fn the_merge_agrees_with_a_global_time_sort() {
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for round in 0..40 {
        let procs = 1 + rnd(5) as u32;
        // Each process: its own clock and live set; its batches are sent when they fill.
        let mut clocks: Vec<u64> = (0..procs).map(|_| rnd(1000)).collect();
        let mut lives: Vec<Vec<u64>> = vec![Vec::new(); procs as usize];
        let mut recs = Vec::new();
        for p in 0..procs {
            recs.push(hello(p + 1, 0));
        }
        for _ in 0..200 {
            // Arrival: a random process among the ones not too far ahead.
            let min = *clocks.iter().min().unwrap();
            let p = loop {
                let p = rnd(procs as u64) as usize;
                if clocks[p] <= min + rnd(400) {
                    break p;
                }
            };
            let n = 1 + rnd(12);
            let mut batch = Vec::new();
            for _ in 0..n {
                clocks[p] += 1 + rnd(30);
                let t = clocks[p];
                let mut e = if !lives[p].is_empty() && rnd(2) == 0 {
                    let i = rnd(lives[p].len() as u64) as usize;
                    free(0, lives[p].swap_remove(i))
                } else {
                    let addr = 0x1000 * (1 + rnd(64));
                    lives[p].retain(|&a| a != addr);
                    lives[p].push(addr);
                    alloc(0, 0, addr, MIB * (1 + rnd(100)))
                };
                e.ts_ns = START + t * 1000 + p as u64; // no ties across processes
                batch.push(e);
            }
            recs.push(events(p as u32 + 1, batch));
            if rnd(4) == 0 {
                recs.push(tick(p as u32 + 1, 0));
                if let Record::Tick { ts_ns, .. } = recs.last_mut().unwrap() {
                    *ts_ns = START + clocks[p] * 1000;
                }
            }
        }
        let a = run(&recs);
        assert_eq!(
            a.device(0).map_or(0, |d| d.peak_bytes),
            reference_peak(&recs),
            "round {round}"
        );
        let max_in_timeline = a.device(0).map_or(0, |d| {
            d.timeline
                .buckets
                .iter()
                .map(|b| b.max_bytes)
                .max()
                .unwrap_or(0)
        });
        assert_eq!(max_in_timeline, reference_peak(&recs), "round {round}");
    }
}

#[test]
fn damaged_traces_never_panic_the_replay_or_the_reports() {
    use vramtrace_collector::reporters::{json, text};
    let mut recs = two_process_trace();
    recs.push(end(1, 60, EndKind::CutMidFrame { partial_bytes: 3 }));
    recs.push(Record::Dropped {
        pid: 2,
        ts_ns: u64::MAX,
        count: u64::MAX,
    });
    recs.push(events(
        2,
        vec![
            alloc(70, 0, 0xf000, u64::MAX),
            alloc(71, 0, 0xf100, u64::MAX),
            ev(72, Api::MemGetInfo, NO_DEVICE, 1, 2),
        ],
    ));
    let t = trace(&recs);
    let check = |bytes: &[u8]| {
        if let Ok(a) = analyze_reader(bytes) {
            let _ = text::render(&a, None);
            let _ = json::render(&a);
            let _ = vramtrace_collector::verbs::report::summary(&a);
        }
    };
    check(&t);
    for i in 0..t.len() {
        for x in [0xffu8, 0x80, 0x01] {
            let mut m = t.clone();
            m[i] ^= x;
            check(&m);
        }
    }
}

/// `cuMemFree(0)` is the driver's no-op (PyTorch calls it twice a process on every real trace): it is no free of
/// an allocation the trace lost, so no warning says so; a free of an address never allocated still is one.
#[test]
fn a_free_of_null_is_not_an_unmatched_free() {
    let a = run(&[
        hello(1, 0),
        events(
            1,
            vec![
                alloc(10, 0, 0xa000, GIB),
                free(11, 0),
                free(12, 0),
                free(20, 0xa000),
                free(30, 0xdead_0000),
            ],
        ),
        end(1, 50, EndKind::Goodbye),
    ]);
    let p = a.process(1).unwrap();
    assert_eq!((p.allocations, p.frees, p.unmatched_frees), (1, 1, 1));
    assert_eq!(a.unmatched_frees, 1);
    let text = vramtrace_collector::reporters::text::render(&a, None);
    assert!(text.contains("1 free named no live allocation"), "{text}");
}

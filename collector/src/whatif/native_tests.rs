//! Each rule of the native allocator on a small hand-made history whose outcome is worked out by hand in the
//! comments.

use super::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

#[derive(Clone, Copy)]
enum Step {
    A(u64, u64),
    AS(u64, u64, u64),
    F(u64),
    Empty,
}
use Step::*;

/// Replays `h` under `settings` with `limit` bytes the driver gives; the outcome, the reserve at the end, and
/// the index of the first refused request.
fn run(settings: Settings, limit: u64, h: &[Step]) -> (Outcome, u64, Option<usize>) {
    let mut m = Model::new(settings, 80 * GIB);
    let mut first = None;
    for (i, s) in h.iter().enumerate() {
        let ok = match *s {
            A(id, size) => m.malloc(id, size, 0, limit),
            AS(id, size, stream) => m.malloc(id, size, stream, limit),
            F(id) => {
                m.free(id);
                true
            }
            Empty => {
                m.release_cached();
                true
            }
        };
        if !ok && first.is_none() {
            first = Some(i);
        }
    }
    (m.outcome().clone(), m.reserved(), first)
}

fn conf(c: &str) -> Settings {
    Settings::parse(c).unwrap()
}

#[test]
fn sizes_round_and_segments_come_in_the_pools_sizes() {
    let d = Settings::default();
    assert_eq!(round_size(1, &d), 512);
    assert_eq!(round_size(513, &d), 1024);
    assert_eq!(round_size(5 * MIB + 1, &d), 5 * MIB + 512);
    // 4 divisions between 1 GiB and 2 GiB: steps of 256 MiB.
    let four = conf("roundup_power2_divisions:4");
    assert_eq!(round_size(GIB + 1, &four), GIB + 256 * MIB);
    assert_eq!(round_size(GIB, &four), GIB);
    // Under 512 x divisions bytes the plain rounding holds.
    assert_eq!(round_size(1500, &four), 1536);
    assert_eq!(segment_size(512), 2 * MIB);
    assert_eq!(segment_size(MIB), 2 * MIB);
    assert_eq!(segment_size(MIB + 512), 20 * MIB);
    assert_eq!(segment_size(10 * MIB), 10 * MIB);
    assert_eq!(segment_size(11 * MIB + 1), 12 * MIB);
}

#[test]
fn small_tensors_share_a_2_mib_segment_and_large_ones_a_20_mib_one() {
    // 3 x 512 KiB: one small segment holds four. Then 3 x 3 MiB: one 20 MiB segment holds six.
    let h = [
        A(1, 512 << 10),
        A(2, 512 << 10),
        A(3, 512 << 10),
        A(4, 3 * MIB),
        A(5, 3 * MIB),
        A(6, 3 * MIB),
    ];
    let (o, ..) = run(Settings::default(), 80 * GIB, &h);
    assert_eq!(o.segments_made, 2);
    assert_eq!(o.reserved_peak, 22 * MIB);
    assert_eq!(o.allocated_peak, 3 * (512 << 10) + 9 * MIB);
}

#[test]
fn a_freed_block_is_reused_best_fit_and_merges_back() {
    // 12 MiB and 14 MiB segments (large requests round to 2 MiB). Freeing the 12 MiB one and asking 11 MiB
    // reuses it (the rest, 1 MiB, is not more than 1 MiB, so the block stays whole).
    let h = [
        A(1, 12 * MIB),
        A(2, 14 * MIB),
        F(1),
        A(3, 11 * MIB),
        F(3),
        A(4, 12 * MIB),
    ];
    let (o, ..) = run(Settings::default(), 80 * GIB, &h);
    assert_eq!(o.segments_made, 2);
    assert_eq!(o.reserved_peak, 26 * MIB);
}

#[test]
fn freed_neighbours_merge_into_one_block() {
    // A cached 30 MiB segment carved into three 10 MiB tensors. Freeing the middle one, then the first, leaves
    // one free 20 MiB block: a 20 MiB request takes it, no new segment. Without the merge (only the first
    // freed), it needs one.
    let base = [
        A(9, 30 * MIB),
        F(9),
        A(1, 10 * MIB),
        A(2, 10 * MIB),
        A(3, 10 * MIB),
    ];
    let merged: Vec<Step> = base
        .iter()
        .copied()
        .chain([F(2), F(1), A(4, 20 * MIB)])
        .collect();
    let (o, ..) = run(Settings::default(), 80 * GIB, &merged);
    assert_eq!((o.segments_made, o.reserved_peak), (1, 30 * MIB));
    let apart: Vec<Step> = base.iter().copied().chain([F(1), A(4, 20 * MIB)]).collect();
    let (o, ..) = run(Settings::default(), 80 * GIB, &apart);
    assert_eq!((o.segments_made, o.reserved_peak), (2, 50 * MIB));
}

#[test]
fn holes_too_small_for_a_request_make_a_new_segment_and_the_flush_frees_whole_segments_only() {
    // A 100 MiB segment carved into 10 MiB tensors, every other freed: 50 MiB free in 10 MiB holes. A 30 MiB
    // request fits no hole: under a 140 MiB limit a new 30 MiB segment fits (130 MiB reserved).
    let mut h = vec![A(100, 100 * MIB), F(100)];
    for i in 0..10 {
        h.push(A(i, 10 * MIB));
    }
    for i in (0..10).step_by(2) {
        h.push(F(i));
    }
    h.push(A(50, 30 * MIB));
    let (o, _, first) = run(Settings::default(), 140 * MIB, &h);
    assert_eq!((first, o.reserved_peak, o.retries), (None, 130 * MIB, 0));
    // Under 120 MiB the segment is refused; the flush frees nothing (the only segment holds live tensors):
    // the request fails, at its index, after one retry.
    let (o, _, first) = run(Settings::default(), 120 * MIB, &h);
    assert_eq!(first, Some(h.len() - 1));
    assert_eq!((o.retries, o.failures), (1, 1));
}

#[test]
fn the_flush_frees_a_cached_whole_segment_and_the_retry_succeeds() {
    // 60 MiB allocated then freed (cached, whole); 70 MiB under a 100 MiB limit: refused at first (60 + 70 >
    // 100), the cached segment is freed, the retry fits.
    let h = [A(1, 60 * MIB), F(1), A(2, 70 * MIB)];
    let (o, end, first) = run(Settings::default(), 100 * MIB, &h);
    assert_eq!(first, None);
    assert_eq!(
        (o.retries, o.segments_released, o.reserved_peak, end),
        (1, 1, 70 * MIB, 70 * MIB)
    );
}

#[test]
fn max_split_size_keeps_small_requests_out_of_big_cached_blocks() {
    // A cached 200 MiB block, then 20 x 8 MiB requests. Unlimited: they are carved from it (one segment).
    // max_split_size_mb:100: a request under 100 MiB may not take a block of 100 MiB or more, so they make
    // segments of their own (8 MiB makes a 20 MiB segment, which holds two).
    let mut h = vec![A(1000, 200 * MIB), F(1000)];
    for i in 0..20 {
        h.push(A(i, 8 * MIB));
    }
    let (plain, ..) = run(Settings::default(), 80 * GIB, &h);
    assert_eq!((plain.segments_made, plain.reserved_peak), (1, 200 * MIB));
    let s = conf("max_split_size_mb:100");
    assert_eq!(s.conf(), "max_split_size_mb:100");
    let (split, ..) = run(s, 80 * GIB, &h);
    assert_eq!(
        (split.segments_made, split.reserved_peak),
        (11, 200 * MIB + 10 * 20 * MIB)
    );
}

#[test]
fn an_oversize_cached_block_serves_only_requests_within_the_rounding_limit() {
    // max_split_size_mb:100. A cached 300 MiB block serves a 290 MiB request (within 20 MiB) but not a 250 MiB
    // one (50 MiB larger): that makes a segment of its own.
    let s = conf("max_split_size_mb:100");
    let (o, ..) = run(
        s.clone(),
        80 * GIB,
        &[A(1, 300 * MIB), F(1), A(2, 290 * MIB)],
    );
    assert_eq!((o.segments_made, o.reserved_peak), (1, 300 * MIB));
    let (o, ..) = run(s, 80 * GIB, &[A(1, 300 * MIB), F(1), A(2, 250 * MIB)]);
    assert_eq!((o.segments_made, o.reserved_peak), (2, 550 * MIB));
}

#[test]
fn oversize_blocks_are_freed_largest_first_and_only_as_many_as_the_request_needs() {
    // max_split_size_mb:100, 700 MiB limit. Cached whole: 300, 200 and 150 MiB (650 reserved). A 400 MiB request
    // fits no block and 650 + 400 > 700. The oversize blocks go from the largest down until 400 MiB are freed:
    // 300 (not enough), then 200; the 150 MiB block stays. 150 + 400 = 550 fits without the full flush, so no
    // retry is counted.
    let h = [
        A(1, 300 * MIB),
        A(2, 200 * MIB),
        A(3, 150 * MIB),
        F(1),
        F(2),
        F(3),
        A(4, 400 * MIB),
    ];
    let (o, end, first) = run(conf("max_split_size_mb:100"), 700 * MIB, &h);
    assert_eq!(first, None);
    assert_eq!((o.segments_released, o.retries, end), (2, 0, 550 * MIB));
    // A 250 MiB request instead: the smallest oversize block at least as large (300) is freed alone.
    let mut h2 = h;
    h2[6] = A(4, 250 * MIB);
    let (o, end, _) = run(conf("max_split_size_mb:100"), 700 * MIB, &h2);
    assert_eq!((o.segments_released, end), (1, 600 * MIB));
    // Without max_split_size the request takes the 300 MiB block as it is (best fit, no limit on the rest).
    let (o, end, _) = run(Settings::default(), 700 * MIB, &h2);
    assert_eq!((o.segments_released, end), (0, 650 * MIB));
}

#[test]
fn empty_cache_frees_cached_segments_and_streams_keep_their_own_blocks() {
    let h = [
        A(1, 30 * MIB),
        F(1),
        // Another stream does not take stream 0's cached block.
        AS(2, 30 * MIB, 7),
        Empty,
        A(3, 30 * MIB),
    ];
    let (o, ..) = run(Settings::default(), 80 * GIB, &h);
    assert_eq!(
        (o.segments_made, o.segments_released, o.reserved_peak),
        (3, 1, 60 * MIB)
    );
}

#[test]
fn expandable_segments_map_20_mib_pages_and_grow_a_freed_range() {
    // Large pages are 20 MiB. 3 x 30 MiB: the first maps 40 MiB (10 free after it), the second uses those 10 and
    // maps 20 more, the third maps 40: 100 MiB in five pages' worth of three maps, 90 allocated.
    let e = conf("expandable_segments:True");
    let (o, ..) = run(
        e.clone(),
        80 * GIB,
        &[A(1, 30 * MIB), A(2, 30 * MIB), A(3, 30 * MIB)],
    );
    assert_eq!(
        (o.reserved_peak, o.segments_made, o.allocated_peak),
        (100 * MIB, 3, 90 * MIB)
    );
    // A freed 30 MiB tensor (40 MiB free with its tail) then a 50 MiB request: the free range grows by one page
    // (60 MiB reserved). The native allocator keeps the 30 MiB segment and makes a 50 MiB one (80 MiB).
    let h = [A(1, 30 * MIB), F(1), A(2, 50 * MIB)];
    let (o, ..) = run(e.clone(), 80 * GIB, &h);
    assert_eq!((o.reserved_peak, o.segments_made), (60 * MIB, 2));
    let (o, ..) = run(Settings::default(), 80 * GIB, &h);
    assert_eq!(o.reserved_peak, 80 * MIB);
    // empty_cache unmaps the free pages: after freeing the 50 MiB tensor, nothing stays mapped.
    let h = [A(1, 30 * MIB), F(1), A(2, 50 * MIB), F(2), Empty];
    let (_, end, _) = run(e, 80 * GIB, &h);
    assert_eq!(end, 0);
}

#[test]
fn expandable_segments_unmap_free_pages_to_make_room_under_a_limit() {
    // 80 MiB limit: a (30 MiB, maps 40) and b (30 MiB: 10 free + 20 mapped) hold 60 MiB reserved. a freed,
    // then c of 32 MiB: no free block holds it; mapping 40 more would make 100 > 80. The flush unmaps the one
    // whole free page under a ([0, 20) MiB; [20, 30) stays mapped and free), 40 reserved, and c maps 40 at the
    // end: 80 reserved, one retry.
    let h = [A(1, 30 * MIB), A(2, 30 * MIB), F(1), A(3, 32 * MIB)];
    let (o, end, first) = run(conf("expandable_segments:True"), 80 * MIB, &h);
    assert_eq!(first, None);
    assert_eq!((o.retries, end), (1, 80 * MIB));
}

#[test]
fn the_gc_frees_the_oldest_cached_segments_when_the_reserve_passes_its_threshold() {
    // Device 200 MiB, memory fraction 0.9 (the allocator allows 180 MiB), GC threshold 0.5 (90 MiB). The large
    // pool's searches are counted: 40 MiB freed after the 2nd; a 50 MiB request (3rd search; 70 reserved, under
    // the threshold: no GC) makes its segment; 30 and 50 MiB freed after it. A 60 MiB request (4th search) fits
    // no block; 120 reserved is 30 over the threshold; ages 2, 1 and 1, average 4/3: only the 40 MiB segment is
    // old enough, and enough. 80 + 60 = 140 reserved. Without the GC, 120 + 60 = 180 fits the fraction as is.
    let h = [
        A(1, 40 * MIB),
        A(2, 30 * MIB),
        F(1),
        A(3, 50 * MIB),
        F(2),
        F(3),
        A(4, 60 * MIB),
    ];
    let replay = |s: Settings| {
        let mut m = Model::new(s, 200 * MIB);
        for st in &h {
            match *st {
                A(id, size) => assert!(m.malloc(id, size, 0, u64::MAX)),
                F(id) => m.free(id),
                _ => unreachable!(),
            }
        }
        (
            m.outcome().retries,
            m.outcome().segments_released,
            m.reserved(),
        )
    };
    let mut s = conf("garbage_collection_threshold:0.5,per_process_memory_fraction:0.9");
    assert_eq!(replay(s.clone()), (0, 1, 140 * MIB));
    s.garbage_collection_threshold = None;
    assert_eq!(replay(s.clone()), (0, 0, 180 * MIB));
    // The threshold alone, with no fraction, does nothing (as in PyTorch).
    s.garbage_collection_threshold = Some(0.5);
    s.memory_fraction = None;
    assert_eq!(replay(s), (0, 0, 180 * MIB));
}

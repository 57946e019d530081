//! A model of PyTorch's CUDA caching allocator (the native backend), driven by a process's tensor-level history:
//! which segments it would ask the driver for, so how much it would reserve, under settings it was not run with.
//! Written from the rules of `c10/cuda/CUDACachingAllocator.cpp` (read for understanding; this is not a port):
//!
//! - A request is rounded up to a multiple of 512 bytes, or with `roundup_power2_divisions` to the next of that
//!   many divisions between two powers of two.
//! - Requests of at most 1 MiB come from the small pool, whose segments are 2 MiB; larger ones from the large
//!   pool, whose segments are 20 MiB for requests under 10 MiB and otherwise the request rounded up to 2 MiB.
//! - A free block is found best-fit (the smallest that holds the request; the lowest address among equals) in
//!   the request's pool and stream. With `max_split_size_mb`, a request under it never takes a block at or over
//!   it, and a request at or over it takes no block 20 MiB or more larger than itself.
//! - A block larger than the request is split when what remains is worth keeping: any remainder of 512 bytes
//!   or more in the small pool; in the large pool more than 1 MiB, and only for requests under `max_split_size`.
//! - A freed block merges with its free neighbours in its segment.
//! - When no free block fits, a new segment is asked for; if the device (or the cap) refuses it, the allocator
//!   frees its oversized cached blocks (with `max_split_size`), then every fully free cached segment, and asks
//!   again; a second refusal is the out-of-memory error. (PyTorch frees only as many oversized blocks as the
//!   request needs; the model frees them all, which can leave less cached after a retry than PyTorch would.)
//! - `empty_cache()` frees every fully free cached segment.
//!
//! Not modelled yet (issue 28 goes on): expandable segments, `garbage_collection_threshold`, the
//! cudaMallocAsync backend, events that keep a block from its stream's reuse, and per-size-interval
//! `roundup_power2_divisions`.

use std::collections::BTreeSet;

const MIN_BLOCK: u64 = 512;
const SMALL_SIZE: u64 = 1 << 20;
const SMALL_BUFFER: u64 = 2 << 20;
const LARGE_BUFFER: u64 = 20 << 20;
const MIN_LARGE_ALLOC: u64 = 10 << 20;
const ROUND_LARGE: u64 = 2 << 20;

/// The allocator settings a what-if tries (`PYTORCH_CUDA_ALLOC_CONF`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// `max_split_size_mb`, in bytes; `None`: unlimited.
    pub max_split_size: Option<u64>,
    /// `roundup_power2_divisions` (one value for every size); 0 or 1: plain 512-byte rounding.
    pub roundup_power2_divisions: u64,
}

impl Settings {
    /// The `PYTORCH_CUDA_ALLOC_CONF` string that sets these (empty for the defaults).
    pub fn conf(&self) -> String {
        let mut parts = Vec::new();
        if let Some(m) = self.max_split_size {
            parts.push(format!("max_split_size_mb:{}", m >> 20));
        }
        if self.roundup_power2_divisions > 1 {
            parts.push(format!(
                "roundup_power2_divisions:{}",
                self.roundup_power2_divisions
            ));
        }
        parts.join(",")
    }
}

/// One entry of a process's tensor history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Tensor `id` of `size` bytes is allocated on `stream`.
    Alloc { id: u64, size: u64, stream: u64 },
    /// Tensor `id` is freed.
    Free { id: u64 },
    /// `torch.cuda.empty_cache()`.
    EmptyCache,
}

/// What replaying a history gave.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The most bytes reserved (in segments) at once, and the most allocated (rounded) at once.
    pub reserved_peak: u64,
    pub allocated_peak: u64,
    /// Segments asked of the driver, and released by the allocator.
    pub segments_made: u64,
    pub segments_released: u64,
    /// Retries after a refused segment (the cache flushed), as `num_alloc_retries`.
    pub retries: u64,
    /// The first request that failed even after the flush: its index in the history. The replay stops there.
    pub failed_at: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pool {
    Small,
    Large,
}

#[derive(Clone, Debug)]
struct Block {
    segment: usize,
    /// Offset in the segment, and size.
    offset: u64,
    size: u64,
    allocated: bool,
}

#[derive(Clone, Debug)]
struct Segment {
    pool: Pool,
    stream: u64,
    size: u64,
    /// Its blocks in address order: indices into `Model::blocks`.
    blocks: Vec<usize>,
    live: bool,
}

/// A free block's place in its pool's order: (stream, size, segment, offset, block index).
type FreeKey = (u64, u64, usize, u64, usize);

/// The allocator's state for one device of one process.
pub struct Model {
    settings: Settings,
    /// What the driver gives at most (the device's free memory to this process, or the cap).
    limit: u64,
    blocks: Vec<Block>,
    segments: Vec<Segment>,
    /// Free blocks, per pool: (stream, size, segment, offset, block index), so the first at or after a key is
    /// the best fit on its stream.
    free: [BTreeSet<FreeKey>; 2],
    tensors: std::collections::HashMap<u64, usize>,
    reserved: u64,
    allocated: u64,
    out: Outcome,
}

fn pool_index(p: Pool) -> usize {
    match p {
        Pool::Small => 0,
        Pool::Large => 1,
    }
}

/// The request's size as the allocator rounds it.
pub fn round_size(size: u64, divisions: u64) -> u64 {
    if size < MIN_BLOCK {
        return MIN_BLOCK;
    }
    if divisions > 1 && size > MIN_BLOCK * divisions {
        // The next of `divisions` equal steps between the powers of two around `size`.
        let floor = 1u64 << (63 - size.leading_zeros());
        if floor == size {
            return size;
        }
        let step = (floor / divisions).max(1);
        return size.div_ceil(step) * step;
    }
    size.div_ceil(MIN_BLOCK) * MIN_BLOCK
}

/// The segment a request of (rounded) `size` makes when no cached block fits.
pub fn segment_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

impl Model {
    pub fn new(settings: Settings, limit: u64) -> Model {
        Model {
            settings,
            limit,
            blocks: Vec::new(),
            segments: Vec::new(),
            free: [BTreeSet::new(), BTreeSet::new()],
            tensors: std::collections::HashMap::new(),
            reserved: 0,
            allocated: 0,
            out: Outcome::default(),
        }
    }

    /// Replays `history` and says what it gave.
    pub fn run(settings: Settings, limit: u64, history: &[Step]) -> Outcome {
        let mut m = Model::new(settings, limit);
        for (i, s) in history.iter().enumerate() {
            let ok = match *s {
                Step::Alloc { id, size, stream } => m.alloc(id, size, stream),
                Step::Free { id } => {
                    m.free(id);
                    true
                }
                Step::EmptyCache => {
                    m.release_cached(None);
                    true
                }
            };
            if !ok {
                m.out.failed_at = Some(i);
                break;
            }
        }
        m.out
    }

    fn key(&self, b: usize) -> FreeKey {
        let bl = &self.blocks[b];
        let seg = &self.segments[bl.segment];
        (seg.stream, bl.size, bl.segment, bl.offset, b)
    }

    fn pool_of(&self, b: usize) -> usize {
        pool_index(self.segments[self.blocks[b].segment].pool)
    }

    fn insert_free(&mut self, b: usize) {
        let (p, k) = (self.pool_of(b), self.key(b));
        self.free[p].insert(k);
    }

    fn remove_free(&mut self, b: usize) {
        let (p, k) = (self.pool_of(b), self.key(b));
        self.free[p].remove(&k);
    }

    /// The best-fit free block for `size` on `stream` in `pool`, as the rules allow.
    fn find(&self, pool: Pool, stream: u64, size: u64) -> Option<usize> {
        let (_, _, _, _, b) = *self.free[pool_index(pool)]
            .range((stream, size, 0, 0, 0)..)
            .next()
            .filter(|k| k.0 == stream)?;
        let found = self.blocks[b].size;
        if let Some(max) = self.settings.max_split_size {
            if size < max && found >= max {
                return None;
            }
            if size >= max && found >= size + LARGE_BUFFER {
                return None;
            }
        }
        Some(b)
    }

    fn should_split(&self, pool: Pool, block: u64, size: u64) -> bool {
        let rest = block - size;
        match pool {
            Pool::Small => rest >= MIN_BLOCK,
            Pool::Large => {
                self.settings.max_split_size.is_none_or(|m| size < m) && rest > SMALL_SIZE
            }
        }
    }

    fn alloc(&mut self, id: u64, size: u64, stream: u64) -> bool {
        let size = round_size(size, self.settings.roundup_power2_divisions);
        let pool = if size <= SMALL_SIZE {
            Pool::Small
        } else {
            Pool::Large
        };
        let b = match self.find(pool, stream, size) {
            Some(b) => b,
            None => match self.new_segment(pool, stream, size) {
                Some(b) => b,
                None => return false,
            },
        };
        self.remove_free(b);
        if self.should_split(pool, self.blocks[b].size, size) {
            let (seg, offset, total) = {
                let bl = &self.blocks[b];
                (bl.segment, bl.offset, bl.size)
            };
            self.blocks[b].size = size;
            let rest = self.blocks.len();
            self.blocks.push(Block {
                segment: seg,
                offset: offset + size,
                size: total - size,
                allocated: false,
            });
            let pos = self.segments[seg]
                .blocks
                .iter()
                .position(|&x| x == b)
                .unwrap();
            self.segments[seg].blocks.insert(pos + 1, rest);
            self.insert_free(rest);
        }
        self.blocks[b].allocated = true;
        self.allocated += self.blocks[b].size;
        self.out.allocated_peak = self.out.allocated_peak.max(self.allocated);
        self.tensors.insert(id, b);
        true
    }

    /// A new segment for a request of `size`, after flushing the cache if the first ask is refused. Returns
    /// its one free block.
    fn new_segment(&mut self, pool: Pool, stream: u64, size: u64) -> Option<usize> {
        let seg_size = segment_size(size);
        if self.reserved + seg_size > self.limit {
            self.out.retries += 1;
            if self.settings.max_split_size.is_some() {
                self.release_cached(Some(self.settings.max_split_size.unwrap_or(0)));
            }
            if self.reserved + seg_size > self.limit {
                self.release_cached(None);
            }
            if self.reserved + seg_size > self.limit {
                return None;
            }
        }
        let s = self.segments.len();
        let b = self.blocks.len();
        self.blocks.push(Block {
            segment: s,
            offset: 0,
            size: seg_size,
            allocated: false,
        });
        self.segments.push(Segment {
            pool,
            stream,
            size: seg_size,
            blocks: vec![b],
            live: true,
        });
        self.insert_free(b);
        self.reserved += seg_size;
        self.out.segments_made += 1;
        self.out.reserved_peak = self.out.reserved_peak.max(self.reserved);
        Some(b)
    }

    /// Frees every fully free cached segment (`at_least`: only those of at least that size, the oversized).
    fn release_cached(&mut self, at_least: Option<u64>) {
        for s in 0..self.segments.len() {
            let seg = &self.segments[s];
            if !seg.live || seg.blocks.len() != 1 || at_least.is_some_and(|m| seg.size < m) {
                continue;
            }
            let b = seg.blocks[0];
            if self.blocks[b].allocated {
                continue;
            }
            self.remove_free(b);
            let seg = &mut self.segments[s];
            seg.live = false;
            seg.blocks.clear();
            self.reserved -= seg.size;
            self.out.segments_released += 1;
        }
    }

    fn free(&mut self, id: u64) {
        let Some(b) = self.tensors.remove(&id) else {
            return;
        };
        self.blocks[b].allocated = false;
        self.allocated -= self.blocks[b].size;
        let seg = self.blocks[b].segment;
        let pos = self.segments[seg]
            .blocks
            .iter()
            .position(|&x| x == b)
            .unwrap();
        // Merge with the free neighbours: the next one into this, this into the previous one.
        let mut keep = b;
        if let Some(&next) = self.segments[seg].blocks.get(pos + 1) {
            if !self.blocks[next].allocated {
                self.remove_free(next);
                self.blocks[b].size += self.blocks[next].size;
                self.segments[seg].blocks.remove(pos + 1);
            }
        }
        if pos > 0 {
            let prev = self.segments[seg].blocks[pos - 1];
            if !self.blocks[prev].allocated {
                self.remove_free(prev);
                self.blocks[prev].size += self.blocks[b].size;
                self.segments[seg].blocks.remove(pos);
                keep = prev;
            }
        }
        self.insert_free(keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn a(id: u64, size: u64) -> Step {
        Step::Alloc {
            id,
            size,
            stream: 0,
        }
    }
    fn f(id: u64) -> Step {
        Step::Free { id }
    }

    #[test]
    fn sizes_round_and_segments_come_in_the_pools_sizes() {
        assert_eq!(round_size(1, 0), 512);
        assert_eq!(round_size(513, 0), 1024);
        assert_eq!(round_size(5 * MIB + 1, 0), 5 * MIB + 512);
        // 4 divisions between 1 GiB and 2 GiB: steps of 256 MiB.
        assert_eq!(round_size(GIB + 1, 4), GIB + 256 * MIB);
        assert_eq!(round_size(GIB, 4), GIB);
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
            a(1, 512 << 10),
            a(2, 512 << 10),
            a(3, 512 << 10),
            a(4, 3 * MIB),
            a(5, 3 * MIB),
            a(6, 3 * MIB),
        ];
        let o = Model::run(Settings::default(), 80 * GIB, &h);
        assert_eq!(o.segments_made, 2);
        assert_eq!(o.reserved_peak, 22 * MIB);
        assert_eq!(o.allocated_peak, 3 * (512 << 10) + 9 * MIB);
    }

    #[test]
    fn a_freed_block_is_reused_best_fit_and_merges_back() {
        // 12 MiB and 14 MiB segments (large requests round to 2 MiB). Freeing the 12 MiB one and asking 11 MiB
        // reuses it (split: the rest, 1 MiB, is not more than 1 MiB, so the block stays whole).
        let h = [
            a(1, 12 * MIB),
            a(2, 14 * MIB),
            f(1),
            a(3, 11 * MIB),
            f(3),
            a(4, 12 * MIB),
        ];
        let o = Model::run(Settings::default(), 80 * GIB, &h);
        assert_eq!(o.segments_made, 2);
        assert_eq!(o.reserved_peak, 26 * MIB);
    }

    #[test]
    fn freed_neighbours_merge_into_one_block() {
        // A cached 30 MiB segment carved into three 10 MiB tensors. Freeing the middle one, then the first,
        // leaves one free 20 MiB block: a 20 MiB request takes it, no new segment. Without the merge (only the
        // first freed), it would need one.
        let base = [
            a(9, 30 * MIB),
            f(9),
            a(1, 10 * MIB),
            a(2, 10 * MIB),
            a(3, 10 * MIB),
        ];
        let merged: Vec<Step> = base
            .iter()
            .copied()
            .chain([f(2), f(1), a(4, 20 * MIB)])
            .collect();
        let o = Model::run(Settings::default(), 80 * GIB, &merged);
        assert_eq!((o.segments_made, o.reserved_peak), (1, 30 * MIB));
        let apart: Vec<Step> = base.iter().copied().chain([f(1), a(4, 20 * MIB)]).collect();
        let o = Model::run(Settings::default(), 80 * GIB, &apart);
        assert_eq!((o.segments_made, o.reserved_peak), (2, 50 * MIB));
    }

    #[test]
    fn holes_too_small_for_a_request_make_a_new_segment_and_the_flush_frees_whole_segments_only() {
        // A 100 MiB segment carved into 10 MiB tensors, every other freed: 50 MiB free in 10 MiB holes. A
        // 30 MiB request fits no hole: under a 140 MiB limit a new 30 MiB segment fits (130 MiB reserved).
        let mut h = vec![a(100, 100 * MIB), f(100)];
        for i in 0..10 {
            h.push(a(i, 10 * MIB));
        }
        for i in (0..10).step_by(2) {
            h.push(f(i));
        }
        h.push(a(50, 30 * MIB));
        let o = Model::run(Settings::default(), 140 * MIB, &h);
        assert_eq!(
            (o.failed_at, o.reserved_peak, o.retries),
            (None, 130 * MIB, 0)
        );
        // Under 120 MiB the segment is refused; the flush frees nothing (the only segment holds live
        // tensors): the request fails, at its index.
        let o = Model::run(Settings::default(), 120 * MIB, &h);
        assert_eq!(o.failed_at, Some(h.len() - 1));
        assert_eq!(o.retries, 1);
    }

    #[test]
    fn the_flush_frees_a_cached_whole_segment_and_the_retry_succeeds() {
        // 60 MiB allocated then freed (cached, whole); 70 MiB under a 100 MiB limit: refused at first
        // (60 + 70 > 100), the cached segment is freed, the retry fits.
        let h = [a(1, 60 * MIB), f(1), a(2, 70 * MIB)];
        let o = Model::run(Settings::default(), 100 * MIB, &h);
        assert_eq!(o.failed_at, None);
        assert_eq!(
            (o.retries, o.segments_released, o.reserved_peak),
            (1, 1, 70 * MIB)
        );
    }

    #[test]
    fn max_split_size_keeps_small_requests_out_of_big_cached_blocks() {
        // A cached 200 MiB block, then 20 x 8 MiB requests. Unlimited: they are carved from it (one segment).
        // max_split_size_mb:100: a request under 100 MiB may not take a block of 100 MiB or more, so they make
        // segments of their own (8 MiB rounds into a 20 MiB segment holding two).
        let mut h = vec![a(1000, 200 * MIB), f(1000)];
        for i in 0..20 {
            h.push(a(i, 8 * MIB));
        }
        let plain = Model::run(Settings::default(), 80 * GIB, &h);
        assert_eq!((plain.segments_made, plain.reserved_peak), (1, 200 * MIB));
        let s = Settings {
            max_split_size: Some(100 * MIB),
            roundup_power2_divisions: 0,
        };
        assert_eq!(s.conf(), "max_split_size_mb:100");
        let split = Model::run(s, 80 * GIB, &h);
        assert_eq!(
            (split.segments_made, split.reserved_peak),
            (11, 200 * MIB + 10 * 20 * MIB)
        );
    }

    #[test]
    fn empty_cache_frees_cached_segments_and_streams_keep_their_own_blocks() {
        let h = [
            a(1, 30 * MIB),
            f(1),
            // Another stream does not take stream 0's cached block.
            Step::Alloc {
                id: 2,
                size: 30 * MIB,
                stream: 7,
            },
            Step::EmptyCache,
            a(3, 30 * MIB),
        ];
        let o = Model::run(Settings::default(), 80 * GIB, &h);
        assert_eq!(
            (o.segments_made, o.segments_released, o.reserved_peak),
            (3, 1, 60 * MIB)
        );
    }
}

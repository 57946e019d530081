//! A model of PyTorch's CUDA caching allocator (the native backend), driven by a process's tensor-level history:
//! which segments it would ask the driver for, so how much it would reserve, under settings it was not run with.
//! Written from the rules of `c10/cuda/CUDACachingAllocator.cpp` (read for understanding; this is not a port):
//!
//! - A request is rounded up to a multiple of 512 bytes, or with `roundup_power2_divisions` to the next of that
//!   many divisions between two powers of two.
//! - Requests of at most 1 MiB come from the small pool, whose segments are 2 MiB; larger ones from the large
//!   pool, whose segments are 20 MiB for requests under 10 MiB and otherwise the request rounded up to 2 MiB.
//! - A free block is found best-fit (the smallest that holds the request, the lowest address among equals) in
//!   the request's pool and stream. With `max_split_size_mb`, a request under it never takes a block at or over
//!   it, and a request at or over it takes no block `max_non_split_rounding_mb` (20 MiB) or more larger.
//! - A block larger than the request is split when what remains is worth keeping: 512 bytes or more in the small
//!   pool and in expandable segments; in the large pool more than 1 MiB, and only for requests under
//!   `max_split_size`. A freed block merges with its free neighbours.
//! - When no free block fits: with a memory fraction and `garbage_collection_threshold`, cached whole segments
//!   older than the average are freed first while the reserve is over the threshold. Then a new segment is asked
//!   for; if refused (the fraction, the device, the cap), the oversize cached blocks are freed (only enough for
//!   the request, largest first), the segment asked for again, then every whole cached segment freed and asked
//!   once more (the retry PyTorch counts). A third refusal is the out-of-memory error.
//! - `expandable_segments:True`: one segment per pool and stream, whose pages (2 MiB small, 20 MiB large) are
//!   mapped as needed at the lowest address that has room; a flush unmaps the free pages.
//! - `empty_cache()` frees every whole cached segment and unmaps free expandable pages.
//!
//! Not modelled: CUDA events that delay a block's reuse on another stream (the history's `free_completed` says
//! when the block came back, which is what they decide), graph-private pools, and which addresses the driver
//! returns (segments are placed in the order they are made, which decides ties between equal free blocks).

use std::collections::BTreeSet;

use super::settings::Settings;
use crate::names::fasthash::FastMap;

const MIN_BLOCK: u64 = 512;
const SMALL_SIZE: u64 = 1 << 20;
const SMALL_BUFFER: u64 = 2 << 20;
const LARGE_BUFFER: u64 = 20 << 20;
const MIN_LARGE_ALLOC: u64 = 10 << 20;
const ROUND_LARGE: u64 = 2 << 20;
const NIL: u32 = u32::MAX;

/// What replaying a history gave.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The most bytes reserved (segments, or mapped pages) at once, and the most allocated (rounded) at once.
    pub reserved_peak: u64,
    pub allocated_peak: u64,
    /// Segments (or page ranges) asked of the driver, and given back.
    pub segments_made: u64,
    pub segments_released: u64,
    /// Flush-and-retry cycles, as PyTorch's `num_alloc_retries` counts them.
    pub retries: u64,
    /// Requests refused even after the flush.
    pub failures: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Allocated,
    Free,
    Unmapped,
}

#[derive(Clone, Debug)]
struct Block {
    addr: u64,
    size: u64,
    stream: u64,
    small: bool,
    state: State,
    prev: u32,
    next: u32,
    seg: u32,
    /// The pool's `get_free_block` count when it became free (its age for the GC).
    gc_base: u64,
}

#[derive(Clone, Debug)]
struct Segment {
    base: u64,
    /// Page size of an expandable segment; 0 for a plain one.
    page: u64,
}

#[derive(Default)]
struct Pool {
    /// Free (mapped) blocks: (stream, size, address, block), so the first at or after a key is the best fit.
    free: BTreeSet<(u64, u64, u64, u32)>,
    /// Unmapped ranges of expandable segments: (stream, address, block).
    unmapped: BTreeSet<(u64, u64, u32)>,
    /// `get_free_blocks_call_count`: counted only while the GC can act.
    calls: u64,
}

/// The allocator's state for one device of one process.
pub struct Model {
    settings: Settings,
    /// The device's memory: expandable segments reserve address space for 1 1/8 of it, and a memory fraction
    /// is a share of it.
    device_total: u64,
    blocks: Vec<Block>,
    spare: Vec<u32>,
    segments: Vec<Segment>,
    pools: [Pool; 2],
    tensors: FastMap<u64, u32>,
    next_addr: u64,
    reserved: u64,
    allocated: u64,
    out: Outcome,
    /// Every segment made (+size) and given back (-size), in order: compared with the run's own in tests.
    log: Vec<i64>,
    /// Addresses the driver gave the run's own segments, per size, in order: a segment of a size the run also
    /// made takes the next of them, so ties between equal free blocks (the lowest address wins) break as they
    /// did. The driver's placement is not modelled otherwise.
    hints: FastMap<u64, std::collections::VecDeque<u64>>,
}

/// `size` rounded up to the next of `divisions` equal steps between the powers of two around it.
fn next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let below = size & !(step - 1);
    if below == size {
        size
    } else {
        below + step
    }
}

/// The request's size as the allocator rounds it.
pub fn round_size(size: u64, settings: &Settings) -> u64 {
    if size < MIN_BLOCK {
        return MIN_BLOCK;
    }
    let divisions = settings.divisions_for(size);
    if divisions > 1 && size > MIN_BLOCK * divisions {
        return next_division(size, divisions);
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
    pub fn new(settings: Settings, device_total: u64) -> Model {
        Model {
            settings,
            // A forged total cannot make the address arithmetic overflow.
            device_total: device_total.min(super::history::MAX_SIZE),
            blocks: Vec::new(),
            spare: Vec::new(),
            segments: Vec::new(),
            pools: [Pool::default(), Pool::default()],
            tensors: FastMap::default(),
            next_addr: 1 << 47,
            reserved: 0,
            allocated: 0,
            out: Outcome::default(),
            log: Vec::new(),
            hints: FastMap::default(),
        }
    }

    /// The run's own segments, (size, address) in the order it made them: see `hints`.
    pub fn hint_addresses(&mut self, segments: &[(u64, u64)]) {
        for &(size, addr) in segments {
            self.hints.entry(size).or_default().push_back(addr);
            // Segments of other sizes go below every address the run had, the way the driver goes on.
            self.next_addr = self.next_addr.min(addr);
        }
    }

    /// Segments (or mapped ranges) made, +size, and released, -size, in order.
    pub fn segment_log(&self) -> &[i64] {
        &self.log
    }

    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    pub fn outcome(&self) -> &Outcome {
        &self.out
    }

    /// The allocator's own limit (a memory fraction under 1).
    fn allowed(&self) -> Option<u64> {
        self.settings
            .memory_fraction
            .filter(|f| *f < 1.0)
            .map(|f| (f * self.device_total as f64) as u64)
    }

    fn gc_on(&self) -> bool {
        self.allowed().is_some() && self.settings.garbage_collection_threshold.is_some()
    }

    fn max_split(&self) -> u64 {
        self.settings.max_split_size.unwrap_or(u64::MAX)
    }

    fn new_block(&mut self, b: Block) -> u32 {
        match self.spare.pop() {
            Some(i) => {
                self.blocks[i as usize] = b;
                i
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    fn drop_block(&mut self, i: u32) {
        self.spare.push(i);
    }

    fn b(&self, i: u32) -> &Block {
        &self.blocks[i as usize]
    }

    fn bm(&mut self, i: u32) -> &mut Block {
        &mut self.blocks[i as usize]
    }

    fn expandable(&self, i: u32) -> bool {
        self.segments[self.b(i).seg as usize].page != 0
    }

    fn whole(&self, i: u32) -> bool {
        let b = self.b(i);
        b.prev == NIL && b.next == NIL
    }

    fn pool(&mut self, small: bool) -> &mut Pool {
        &mut self.pools[small as usize]
    }

    fn insert_free(&mut self, i: u32) {
        let calls = self.pools[self.b(i).small as usize].calls;
        let b = self.bm(i);
        b.gc_base = calls;
        let (small, key) = (b.small, (b.stream, b.size, b.addr, i));
        self.pool(small).free.insert(key);
    }

    fn remove_free(&mut self, i: u32) {
        let b = self.b(i);
        let (small, key) = (b.small, (b.stream, b.size, b.addr, i));
        self.pool(small).free.remove(&key);
    }

    fn insert_unmapped(&mut self, i: u32) {
        let b = self.b(i);
        let (small, key) = (b.small, (b.stream, b.addr, i));
        self.pool(small).unmapped.insert(key);
    }

    fn remove_unmapped(&mut self, i: u32) {
        let b = self.b(i);
        let (small, key) = (b.small, (b.stream, b.addr, i));
        self.pool(small).unmapped.remove(&key);
    }

    fn note_reserved(&mut self) {
        self.out.reserved_peak = self.out.reserved_peak.max(self.reserved);
    }

    /// A request for tensor `id` of `size` bytes on `stream`. `room`: the most this process may hold reserved
    /// as the driver (or the cap) sees it now. False: refused even after the flush (the out-of-memory error).
    pub fn malloc(&mut self, id: u64, size: u64, stream: u64, room: u64) -> bool {
        let size = round_size(size, &self.settings);
        let small = size <= SMALL_SIZE;
        let alloc_size = segment_size(size);
        let mut found = self.get_free_block(small, stream, size);
        if found.is_none() {
            if self.gc_on() {
                self.garbage_collect();
            }
            found = self.alloc_block(small, stream, size, alloc_size, room, false);
            if found.is_none() && self.release_available(small, stream, size) {
                found = self.alloc_block(small, stream, size, alloc_size, room, false);
            }
            if found.is_none() {
                self.release_cached();
                found = self.alloc_block(small, stream, size, alloc_size, room, true);
            }
        }
        let Some(b) = found else {
            self.out.failures += 1;
            return false;
        };
        let b = self.split(b, size);
        self.bm(b).state = State::Allocated;
        self.allocated = self.allocated.saturating_add(self.b(b).size);
        self.out.allocated_peak = self.out.allocated_peak.max(self.allocated);
        if let Some(old) = self.tensors.insert(id, b) {
            // An id met twice (a history that lost a free): the older block is given back.
            self.release_tensor_block(old);
        }
        true
    }

    /// Carves `size` bytes off the front of free block `b` when the rest is worth keeping; the allocated part.
    fn split(&mut self, b: u32, size: u64) -> u32 {
        let rest = self.b(b).size - size;
        let keep = if self.b(b).small || self.settings.expandable_segments {
            rest >= MIN_BLOCK
        } else {
            size < self.max_split() && rest > SMALL_SIZE
        };
        if !keep {
            return b;
        }
        let old = self.b(b).clone();
        let a = self.new_block(Block {
            addr: old.addr,
            size,
            state: State::Free,
            next: b,
            ..old
        });
        if old.prev != NIL {
            self.bm(old.prev).next = a;
        }
        let r = self.bm(b);
        r.prev = a;
        r.addr += size;
        r.size -= size;
        self.insert_free(b);
        a
    }

    /// The best-fit free block for `size` on `stream`, as the rules allow; taken out of the free set.
    fn get_free_block(&mut self, small: bool, stream: u64, size: u64) -> Option<u32> {
        if self.gc_on() {
            self.pools[small as usize].calls += 1;
        }
        let pool = &self.pools[small as usize];
        let mut it = pool.free.range((stream, size, 0, 0)..);
        let mut cur = *it.next().filter(|k| k.0 == stream)?;
        if self.settings.expandable_segments && self.expandable(cur.3) {
            // In an expandable segment a block counts as the size it can grow to (with the unmapped range after
            // it): a smaller one of those may lie further on.
            let grow = |i: u32| {
                let b = self.b(i);
                b.size
                    + if b.next != NIL && self.b(b.next).state == State::Unmapped {
                        self.b(b.next).size
                    } else {
                        0
                    }
            };
            for next in it {
                if next.0 != stream || !self.expandable(cur.3) || grow(next.3) >= grow(cur.3) {
                    break;
                }
                cur = *next;
            }
        }
        let found = cur.1;
        let max = self.max_split();
        if size < max && found >= max {
            return None;
        }
        if size >= max && found >= size.saturating_add(self.settings.max_non_split_rounding) {
            return None;
        }
        self.pools[small as usize].free.remove(&cur);
        Some(cur.3)
    }

    /// A new segment (or newly mapped pages) for the request; `None` when refused.
    fn alloc_block(
        &mut self,
        small: bool,
        stream: u64,
        size: u64,
        alloc_size: u64,
        room: u64,
        retry: bool,
    ) -> Option<u32> {
        if retry {
            self.out.retries += 1;
        }
        if let Some(allowed) = self.allowed() {
            if self.reserved.saturating_add(alloc_size) > allowed {
                return None;
            }
        }
        if self.settings.expandable_segments {
            return self.alloc_expandable(small, stream, size, room);
        }
        if self.reserved.saturating_add(alloc_size) > room {
            return None;
        }
        let addr = match self.hints.get_mut(&alloc_size).and_then(|q| q.pop_front()) {
            Some(a) => a,
            None => self.take_addresses(alloc_size),
        };
        let seg = self.segments.len() as u32;
        self.segments.push(Segment {
            base: addr,
            page: 0,
        });
        let b = self.new_block(Block {
            addr,
            size: alloc_size,
            stream,
            small,
            state: State::Free,
            prev: NIL,
            next: NIL,
            seg,
            gc_base: 0,
        });
        self.reserved = self.reserved.saturating_add(alloc_size);
        self.log.push(alloc_size as i64);
        self.out.segments_made += 1;
        self.note_reserved();
        Some(b)
    }

    fn take_addresses(&mut self, size: u64) -> u64 {
        let a = self.next_addr;
        self.next_addr = self
            .next_addr
            .saturating_add(size.div_ceil(ROUND_LARGE) * ROUND_LARGE);
        a
    }

    /// Expandable segments: room at the lowest address that has it, mapping pages as needed.
    fn alloc_expandable(&mut self, small: bool, stream: u64, size: u64, room: u64) -> Option<u32> {
        let mut c = self.find_expandable(small, stream, size);
        if self.b(c).state == State::Unmapped {
            let n = self.b(c).size.min(size);
            if !self.map(c, n, room) {
                return None;
            }
        }
        while self.b(c).size < size {
            let next = self.b(c).next;
            if next == NIL || self.b(next).state != State::Unmapped {
                return None;
            }
            let n = (size - self.b(c).size).min(self.b(next).size);
            if !self.map(next, n, room) {
                return None;
            }
            c = next;
        }
        self.remove_free(c);
        Some(c)
    }

    fn find_expandable(&mut self, small: bool, stream: u64, size: u64) -> u32 {
        let room_from = |m: &Model, mut i: u32| {
            let mut bytes = 0u64;
            while bytes < size && i != NIL && m.b(i).state != State::Allocated {
                bytes += m.b(i).size;
                i = m.b(i).next;
            }
            bytes >= size
        };
        let candidates: Vec<u32> = self.pools[small as usize]
            .unmapped
            .range((stream, 0, 0)..)
            .take_while(|k| k.0 == stream)
            .map(|k| k.2)
            .collect();
        for u in candidates {
            let p = self.b(u).prev;
            let c = if p != NIL && self.b(p).state == State::Free {
                p
            } else {
                u
            };
            if room_from(self, c) {
                return c;
            }
        }
        let page = if small { SMALL_BUFFER } else { LARGE_BUFFER };
        let total = if self.device_total == 0 {
            1 << 50
        } else {
            self.device_total
        };
        let virt = (total + total / 8).div_ceil(page).max(1) * page;
        let addr = self.take_addresses(virt);
        let seg = self.segments.len() as u32;
        self.segments.push(Segment { base: addr, page });
        let b = self.new_block(Block {
            addr,
            size: virt,
            stream,
            small,
            state: State::Unmapped,
            prev: NIL,
            next: NIL,
            seg,
            gc_base: 0,
        });
        self.insert_unmapped(b);
        b
    }

    /// Maps the pages under the first `size` bytes of unmapped block `i`; it becomes free and merges with free
    /// neighbours (keeping index `i`).
    fn map(&mut self, i: u32, size: u64, room: u64) -> bool {
        let (base, page) = {
            let s = &self.segments[self.b(i).seg as usize];
            (s.base, s.page)
        };
        let start = self.b(i).addr - base;
        let end = (start + size).div_ceil(page) * page;
        let mapped = end - start;
        if mapped == 0 || self.reserved.saturating_add(mapped) > room {
            return false;
        }
        self.remove_unmapped(i);
        self.bm(i).state = State::Free;
        if mapped < self.b(i).size {
            let old = self.b(i).clone();
            let r = self.new_block(Block {
                addr: old.addr + mapped,
                size: old.size - mapped,
                state: State::Unmapped,
                prev: i,
                ..old
            });
            if old.next != NIL {
                self.bm(old.next).prev = r;
            }
            let b = self.bm(i);
            b.next = r;
            b.size = mapped;
            self.insert_unmapped(r);
        }
        let (p, n) = (self.b(i).prev, self.b(i).next);
        self.merge(i, p);
        self.merge(i, n);
        self.insert_free(i);
        self.reserved = self.reserved.saturating_add(mapped);
        self.log.push(mapped as i64);
        self.out.segments_made += 1;
        self.note_reserved();
        true
    }

    /// Merges `src` into `dst` when both are free, or both unmapped; `dst` is out of its set, `src` is taken
    /// out of its own.
    fn merge(&mut self, dst: u32, src: u32) {
        if src == NIL
            || self.b(src).state != self.b(dst).state
            || self.b(src).state == State::Allocated
        {
            return;
        }
        match self.b(src).state {
            State::Free => self.remove_free(src),
            State::Unmapped => self.remove_unmapped(src),
            State::Allocated => unreachable!(),
        }
        let s = self.b(src).clone();
        if self.b(dst).prev == src {
            let d = self.bm(dst);
            d.addr = s.addr;
            d.prev = s.prev;
            if s.prev != NIL {
                self.bm(s.prev).next = dst;
            }
        } else {
            self.bm(dst).next = s.next;
            if s.next != NIL {
                self.bm(s.next).prev = dst;
            }
        }
        self.bm(dst).size += s.size;
        self.drop_block(src);
    }

    /// Tensor `id` is freed (its block comes back to the cache).
    pub fn free(&mut self, id: u64) {
        if let Some(b) = self.tensors.remove(&id) {
            self.release_tensor_block(b);
        }
    }

    fn release_tensor_block(&mut self, b: u32) {
        self.allocated = self.allocated.saturating_sub(self.b(b).size);
        self.bm(b).state = State::Free;
        let (p, n) = (self.b(b).prev, self.b(b).next);
        self.merge(b, p);
        self.merge(b, n);
        self.insert_free(b);
    }

    /// Gives a whole cached (non-expandable) segment back to the driver.
    fn release_block(&mut self, b: u32) {
        self.remove_free(b);
        self.reserved = self.reserved.saturating_sub(self.b(b).size);
        self.log.push(-(self.b(b).size as i64));
        self.out.segments_released += 1;
        self.drop_block(b);
    }

    /// Unmaps the whole free pages of free expandable block `b`; drops the segment when nothing is left mapped.
    fn unmap(&mut self, b: u32) {
        let (base, page) = {
            let s = &self.segments[self.b(b).seg as usize];
            (s.base, s.page)
        };
        let (addr, size) = (self.b(b).addr, self.b(b).size);
        let begin = base + (addr - base).div_ceil(page) * page;
        let end = base + (addr + size - base) / page * page;
        if begin >= end {
            return;
        }
        self.remove_free(b);
        let old = self.b(b).clone();
        if begin > addr {
            let f = self.new_block(Block {
                addr,
                size: begin - addr,
                state: State::Free,
                prev: old.prev,
                next: b,
                ..old
            });
            if old.prev != NIL {
                self.bm(old.prev).next = f;
            }
            self.bm(b).prev = f;
            self.insert_free(f);
        }
        if addr + size > end {
            let next = self.b(b).next;
            let f = self.new_block(Block {
                addr: end,
                size: addr + size - end,
                state: State::Free,
                prev: b,
                next,
                ..old
            });
            if next != NIL {
                self.bm(next).prev = f;
            }
            self.bm(b).next = f;
            self.insert_free(f);
        }
        {
            let x = self.bm(b);
            x.addr = begin;
            x.size = end - begin;
            x.state = State::Unmapped;
        }
        let (p, n) = (self.b(b).prev, self.b(b).next);
        self.merge(b, p);
        self.merge(b, n);
        self.reserved = self.reserved.saturating_sub(end - begin);
        self.log.push(-((end - begin) as i64));
        self.out.segments_released += 1;
        if self.whole(b) {
            self.drop_block(b);
        } else {
            self.insert_unmapped(b);
        }
    }

    /// Frees oversize cached blocks, only as many as the request needs (largest first). False when there was
    /// no `max_split_size` or not enough.
    fn release_available(&mut self, small: bool, stream: u64, size: u64) -> bool {
        let Some(max) = self.settings.max_split_size else {
            return false;
        };
        let key = size.max(max);
        let first = self.pools[small as usize]
            .free
            .range((stream, key, 0, 0)..)
            .next()
            .copied();
        if let Some(k) = first.filter(|k| k.0 == stream && !self.expandable(k.3) && self.whole(k.3))
        {
            self.release_block(k.3);
            return true;
        }
        let mut released = 0u64;
        let candidates: Vec<(u64, u32)> = self.pools[small as usize]
            .free
            .range(..(stream, key, 0, 0))
            .rev()
            .take_while(|k| k.0 == stream && k.1 >= max)
            .map(|k| (k.1, k.3))
            .collect();
        for (s, i) in candidates {
            if released >= key {
                break;
            }
            if !self.expandable(i) && self.whole(i) {
                released += s;
                self.release_block(i);
            }
        }
        released >= key
    }

    /// Frees every whole cached segment and unmaps the free pages of expandable ones (`empty_cache`, and the
    /// last try before an out-of-memory error).
    pub fn release_cached(&mut self) {
        for small in [false, true] {
            let blocks: Vec<u32> = self.pools[small as usize]
                .free
                .iter()
                .map(|k| k.3)
                .collect();
            let mut to_unmap = Vec::new();
            for b in blocks {
                if self.expandable(b) {
                    to_unmap.push(b);
                } else if self.whole(b) {
                    self.release_block(b);
                }
            }
            for b in to_unmap {
                self.unmap(b);
            }
        }
    }

    /// The GC of `garbage_collection_threshold`: while the reserve is over the threshold, frees whole cached
    /// large segments at least as old (in searches of the pool) as the average.
    fn garbage_collect(&mut self) {
        let (Some(allowed), Some(t)) = (self.allowed(), self.settings.garbage_collection_threshold)
        else {
            return;
        };
        let threshold = (t * allowed as f64) as u64;
        if self.reserved <= threshold {
            return;
        }
        let target = self.reserved.saturating_sub(threshold);
        let calls = self.pools[0].calls;
        let age = |m: &Model, i: u32| calls.saturating_sub(m.b(i).gc_base);
        let freeable: Vec<u32> = self.pools[0]
            .free
            .iter()
            .map(|k| k.3)
            .filter(|&i| self.whole(i))
            .collect();
        let mut total_age: u64 = freeable.iter().map(|&i| age(self, i)).sum();
        let mut count = freeable.len() as u64;
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            let threshold_age = total_age as f64 / count as f64;
            freed = false;
            let now: Vec<u32> = self.pools[0].free.iter().map(|k| k.3).collect();
            for i in now {
                if self.whole(i) && !self.expandable(i) && age(self, i) as f64 >= threshold_age {
                    freed = true;
                    reclaimed = reclaimed.saturating_add(self.b(i).size);
                    total_age = total_age.saturating_sub(age(self, i));
                    count -= 1;
                    self.release_block(i);
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "native_tests.rs"]
mod tests;

//! A process's tensor-level history, from the PyTorch snapshot the bridge kept beside the trace
//! (`--torch-history`): per device, the requests (`alloc`, with the size asked), the blocks coming back
//! (`free_completed`: when the block could be reused, after the streams that used it were done) and the
//! `empty_cache()` calls, which PyTorch does not record but its segment releases show.
//!
//! PyTorch keeps the last N entries. When the ring started after the process's first allocation, the tensors
//! already live then are known from the entries that free them and from the snapshot's live blocks: the history
//! starts with them allocated (in address order) and says how many it had to assume.

use std::collections::HashMap;

use super::settings::{Backend, Settings, ROUNDUP_INTERVALS};
use crate::callsites::{is_library_python, short_path};
use crate::inputs::pickle::{Doc, V};

/// No call site known for an entry.
pub const NO_SITE: u32 = u32::MAX;
/// In [`LiveAt::by_site`]: tensors assumed live at the history's start, with no line known.
pub const BEFORE_HISTORY: u32 = u32::MAX - 1;
/// Sizes past this (256 TiB) are not a GPU's: an entry claiming one is forged or corrupt and is left out, so no
/// sum of sizes in the model can overflow.
pub const MAX_SIZE: u64 = 1 << 48;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Tensor `id` of `size` bytes (as asked) on `stream`.
    Alloc { id: u64, size: u64, stream: u64 },
    /// Tensor `id`'s block is back in the cache.
    Free { id: u64 },
    /// `torch.cuda.empty_cache()` (inferred: segments released with no request waiting on them).
    EmptyCache,
    /// The request PyTorch refused with an out-of-memory error (its rounded size). It never held memory.
    Oom { size: u64, stream: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Unix microseconds.
    pub t_us: u64,
    pub op: Op,
    /// Index into [`History::sites`], or [`NO_SITE`].
    pub site: u32,
}

/// One process's history on one device.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub pid: u32,
    pub device: u32,
    /// The snapshot it came from, and when that was taken ("exit", "out of memory").
    pub source: String,
    pub taken_at: String,
    pub entries: Vec<Entry>,
    /// `file:line in function` of the user's line that asked, interned.
    pub sites: Vec<String>,
    /// Tensors live before the history's first entry, assumed allocated at its start.
    pub assumed_live: u64,
    pub assumed_live_bytes: u64,
    /// The settings the process ran with, as its snapshot says.
    pub recorded: Settings,
    /// PyTorch's own reserve over the history (from its segment entries): at the start and at its most.
    pub recorded_reserved_start: u64,
    pub recorded_reserved_peak: u64,
    /// The run's own segments made (+size) and released (-size), in order.
    pub recorded_segments: Vec<i64>,
    /// The run's own `cudaMalloc` segments, (size, address) in order (hints for the model's placement).
    pub segment_addresses: Vec<(u64, u64)>,
    /// At the run's first out-of-memory error: the free memory the driver reported, and the reserve then.
    pub oom_device_free: Option<u64>,
    pub oom_reserved: Option<u64>,
    /// What could not be taken in (entries of graph-private pools, unreadable ones).
    pub notes: Vec<String>,
    /// Where PyTorch's segments changed, in order: before `entries[index]`.
    pub segment_marks: Vec<SegmentMark>,
    /// The lines of the tensors assumed live at the start (`entries[..assumed_live]`), where a later free
    /// entry or the snapshot's block named one (PyTorch records the allocation's frames with both).
    pub seed_sites: Vec<u32>,
}

/// A segment of PyTorch's made (`delta` > 0) or released, between two entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentMark {
    pub index: usize,
    pub delta: i64,
    pub t_us: u64,
}

/// The tensors live at one moment of a history, by the line that allocated them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveAt {
    /// (site, bytes, tensors), most bytes first; site [`NO_SITE`]: allocated with no Python frames (autograd's
    /// backward pass, native code); [`BEFORE_HISTORY`]: live before the history began, its line unknown.
    pub by_site: Vec<(u32, u64, u64)>,
    /// Bytes asked by the tensors live then, all lines.
    pub allocated: u64,
    /// PyTorch's reserve then (its segments).
    pub reserved: u64,
}

impl History {
    /// The history starts at the process's first allocation: nothing had to be assumed.
    pub fn complete(&self) -> bool {
        self.assumed_live == 0 && self.recorded_reserved_start == 0
    }

    pub fn start_us(&self) -> u64 {
        self.entries.first().map_or(0, |e| e.t_us)
    }

    pub fn site(&self, i: u32) -> Option<&str> {
        self.sites.get(i as usize).map(String::as_str)
    }

    pub fn requests(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| matches!(e.op, Op::Alloc { .. }))
            .count()
    }

    /// The tensors live at Unix time `t_us` (a moment the trace names, on the clock of another program:
    /// `slack_us` apart is the same moment), or `None` where the history does not reach it.
    ///
    /// A device peaks when a segment is made, and the trace's clock and PyTorch's differ by a little: the
    /// moment is the segment made nearest `t_us` within the slack, with the request it was made for (the entry
    /// after it); else the entries up to `t_us`.
    pub fn live_at(&self, t_us: u64, slack_us: u64, to_the_end: bool) -> Option<LiveAt> {
        let last = self.entries.last()?.t_us;
        if t_us.saturating_add(slack_us) < self.start_us()
            || (!to_the_end && t_us > last.saturating_add(slack_us))
        {
            return None;
        }
        let near = self
            .segment_marks
            .iter()
            .enumerate()
            .filter(|(_, m)| m.delta > 0 && m.t_us.abs_diff(t_us) <= slack_us)
            .min_by_key(|(_, m)| m.t_us.abs_diff(t_us));
        let (cut, marks) = match near {
            Some((i, m)) => {
                let asked = matches!(self.entries.get(m.index), Some(e) if matches!(e.op, Op::Alloc { .. }));
                (m.index + usize::from(asked), i + 1)
            }
            None => (
                self.entries.partition_point(|e| e.t_us <= t_us),
                self.segment_marks.partition_point(|m| m.t_us <= t_us),
            ),
        };
        let reserved = self.segment_marks[..marks]
            .iter()
            .fold(self.recorded_reserved_start as i128, |r, m| {
                r + m.delta as i128
            })
            .max(0) as u64;
        let mut live: HashMap<u64, (u64, u32)> = HashMap::new();
        for (i, e) in self.entries[..cut].iter().enumerate() {
            match e.op {
                Op::Alloc { id, size, .. } => {
                    let site = if (i as u64) < self.assumed_live {
                        match self.seed_sites.get(i).copied() {
                            Some(s) if s != NO_SITE => s,
                            _ => BEFORE_HISTORY,
                        }
                    } else {
                        e.site
                    };
                    live.insert(id, (size, site));
                }
                Op::Free { id } => {
                    live.remove(&id);
                }
                Op::EmptyCache | Op::Oom { .. } => {}
            }
        }
        let mut by: HashMap<u32, (u64, u64)> = HashMap::new();
        let mut allocated = 0u64;
        for (size, site) in live.into_values() {
            let x = by.entry(site).or_default();
            x.0 = x.0.saturating_add(size);
            x.1 += 1;
            allocated = allocated.saturating_add(size);
        }
        let mut by_site: Vec<(u32, u64, u64)> =
            by.into_iter().map(|(s, (b, n))| (s, b, n)).collect();
        by_site.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        Some(LiveAt {
            by_site,
            allocated,
            reserved,
        })
    }
}

fn uint(v: Option<&V>) -> u64 {
    v.and_then(V::int).unwrap_or(0) as u64
}

/// The snapshot's keys, looked up once: an entry's fields are found by id, not by string.
struct K<'d> {
    doc: &'d Doc,
    action: Option<u32>,
    time_us: Option<u32>,
    addr: Option<u32>,
    size: Option<u32>,
    stream: Option<u32>,
    frames: Option<u32>,
    device_free: Option<u32>,
    pool: Option<u32>,
    filename: Option<u32>,
    line: Option<u32>,
    name: Option<u32>,
}

impl<'d> K<'d> {
    fn new(doc: &'d Doc) -> K<'d> {
        K {
            doc,
            action: doc.id("action"),
            time_us: doc.id("time_us"),
            addr: doc.id("addr"),
            size: doc.id("size"),
            stream: doc.id("stream"),
            frames: doc.id("frames"),
            device_free: doc.id("device_free"),
            pool: doc.id("segment_pool_id"),
            filename: doc.id("filename"),
            line: doc.id("line"),
            name: doc.id("name"),
        }
    }

    fn text(&self, v: Option<&V>) -> Option<&'d str> {
        v.and_then(|v| self.doc.str(v))
    }

    fn get<'v>(&self, v: &'v V, key: &str) -> Option<&'v V> {
        v.get(self.doc.id(key))
    }
}

/// The settings a snapshot says its process ran with (`allocator_settings`).
pub fn recorded_settings(doc: &Doc) -> Settings {
    let k = K::new(doc);
    let mut s = Settings::default();
    let Some(a) = k.get(&doc.root, "allocator_settings") else {
        return s;
    };
    let conf = k.text(k.get(a, "PYTORCH_CUDA_ALLOC_CONF"));
    if let Some(parsed) = conf.and_then(|c| Settings::parse(c).ok()) {
        s = parsed;
    }
    if let Some(m) = k.get(a, "max_split_size").and_then(V::int) {
        s.max_split_size = (m > 0 && m < i64::MAX).then_some(m as u64);
    }
    if let Some(V::Bool(b)) = k.get(a, "expandable_segments") {
        s.expandable_segments = *b;
    }
    if let Some(V::Float(t)) = k.get(a, "garbage_collection_threshold") {
        s.garbage_collection_threshold = (*t > 0.0 && *t < 1.0).then_some(*t);
    }
    if let Some(V::Dict(d)) = k.get(a, "roundup_power2_divisions") {
        for (key, v) in d {
            let mb = match key {
                V::Int(x) => Some(*x as u64),
                _ => k.text(Some(key)).and_then(|x| x.parse::<u64>().ok()),
            };
            if let (Some(mb), Some(n)) = (mb.filter(|m| m.is_power_of_two()), v.int()) {
                let i = (63 - mb.leading_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
                s.roundup_power2_divisions[i] = n.max(0) as u64;
            }
        }
    }
    if conf.is_some_and(|c| c.contains("cudaMallocAsync")) {
        s.backend = Backend::CudaMallocAsync;
    }
    s
}

#[derive(Default)]
struct Builder {
    entries: Vec<Entry>,
    sites: Vec<String>,
    site_ids: HashMap<String, u32>,
    /// The label of a frame (file, line, function ids), and whether a file is a library's: a million entries
    /// name a few hundred frames.
    frame_sites: HashMap<(u32, i64, u32), u32>,
    library: HashMap<u32, bool>,
    live: HashMap<u64, (u64, u64)>,
    next_id: u64,
    seeds: Vec<(u64, u64, u64, u64)>,
    /// A seed's line (by id), where its free entry or its block named one.
    seed_site: HashMap<u64, u32>,
    /// Segment changes: before `entries[index]`.
    marks: Vec<SegmentMark>,
    /// Segment releases not yet known to be a request's or `empty_cache`'s.
    releasing: bool,
    release_t: u64,
}

impl Builder {
    /// The user's line of a request: its first frame in a file that is not a library's (else its innermost).
    fn site(&mut self, k: &K, frames: &[V]) -> u32 {
        let file_of = |f: &V| match f.get(k.filename) {
            Some(V::Str(i)) => Some(*i),
            _ => None,
        };
        let library = &mut self.library;
        let mut own = |i: u32| {
            !*library.entry(i).or_insert_with(|| {
                is_library_python(k.doc.strings.get(i as usize).map_or("", String::as_str))
            })
        };
        let Some(f) = frames
            .iter()
            .find(|f| file_of(f).is_some_and(&mut own))
            .or(frames.first())
        else {
            return NO_SITE;
        };
        let Some(file) = file_of(f) else {
            return NO_SITE;
        };
        let line = f.get(k.line).and_then(V::int).unwrap_or(0);
        let name = match f.get(k.name) {
            Some(V::Str(i)) => *i,
            _ => u32::MAX,
        };
        if let Some(&i) = self.frame_sites.get(&(file, line, name)) {
            return i;
        }
        let label = format!(
            "{}:{line} in {}",
            short_path(&k.doc.strings[file as usize]),
            k.doc.strings.get(name as usize).map_or("?", String::as_str)
        );
        let i = match self.site_ids.get(&label) {
            Some(&i) => i,
            None => {
                let i = self.sites.len() as u32;
                self.site_ids.insert(label.clone(), i);
                self.sites.push(label);
                i
            }
        };
        self.frame_sites.insert((file, line, name), i);
        i
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Releases seen, then something other than a new segment or an error: they were `empty_cache()`.
    fn settle(&mut self, next_is_request_side: bool) {
        if self.releasing && !next_is_request_side {
            self.entries.push(Entry {
                t_us: self.release_t,
                op: Op::EmptyCache,
                site: NO_SITE,
            });
        }
        self.releasing = false;
    }
}

/// Every device's history in a snapshot (devices with no requests are left out), and why any was not taken.
pub fn from_snapshot(
    doc: &Doc,
    pid: u32,
    source: &str,
    taken_at: &str,
    rejected: &mut Vec<String>,
) -> Vec<History> {
    let k = K::new(doc);
    let recorded = recorded_settings(doc);
    let traces = k.get(&doc.root, "device_traces").map_or(&[][..], V::list);
    let segments = k.get(&doc.root, "segments").map_or(&[][..], V::list);
    let mut out = Vec::new();
    for (device, trace) in traces.iter().enumerate() {
        let entries = trace.list();
        let kinds = |name: &str| {
            entries
                .iter()
                .any(|e| k.text(e.get(k.action)) == Some(name))
        };
        if kinds("alloc")
            && !kinds("free_completed")
            && !kinds("segment_alloc")
            && !kinds("segment_map")
        {
            // Recorded with only some actions (`skip_actions`, or an old `enabled="alloc"`): no frees, no
            // segments; replaying it would keep every tensor forever.
            rejected.push(format!(
                "pid {pid} GPU {device}: its history has allocations only (no frees, no segments), which cannot \
                 be replayed"
            ));
            continue;
        }
        let h = device_history(
            &k,
            entries,
            segments,
            device as u32,
            pid,
            source,
            taken_at,
            &recorded,
        );
        if h.requests() > 0 || h.assumed_live > 0 {
            out.push(h);
        }
    }
    out
}

fn default_pool(e: &V, k: &K) -> bool {
    match e.get(k.pool) {
        Some(V::Tuple(t)) | Some(V::List(t)) => t.iter().all(|x| x.int() == Some(0)),
        _ => true,
    }
}

#[allow(clippy::too_many_arguments)]
fn device_history(
    k: &K,
    trace: &[V],
    segments: &[V],
    device: u32,
    pid: u32,
    source: &str,
    taken_at: &str,
    recorded: &Settings,
) -> History {
    let mut b = Builder::default();
    let mut w = walk_trace(k, trace, &mut b);
    b.settle(false);
    let end_reserved = seed_live(k, segments, device, &mut b, &mut w.implausible);
    let start_t = b.entries.first().map_or(0, |e| e.t_us);
    b.seeds.sort_unstable();
    let assumed_live = b.seeds.len() as u64;
    let assumed_live_bytes = b.seeds.iter().map(|s| s.2).fold(0u64, u64::saturating_add);
    let mut entries: Vec<Entry> = b
        .seeds
        .iter()
        .map(|&(_, id, size, stream)| Entry {
            t_us: start_t,
            op: Op::Alloc { id, size, stream },
            site: NO_SITE,
        })
        .collect();
    let seed_sites: Vec<u32> = b
        .seeds
        .iter()
        .map(|s| b.seed_site.get(&s.1).copied().unwrap_or(NO_SITE))
        .collect();
    let seeded = entries.len();
    entries.append(&mut b.entries);
    let segment_marks: Vec<SegmentMark> = b
        .marks
        .iter()
        .map(|m| SegmentMark {
            index: m.index + seeded,
            ..*m
        })
        .collect();
    // PyTorch's reserve at the history's start: what its segments hold at the end, less what the entries added.
    let start = (end_reserved as i128 - w.reserved_delta).max(0);
    let peak = w
        .reserved_walk
        .iter()
        .map(|d| start + d)
        .max()
        .unwrap_or(start)
        .max(start);
    let mut notes = Vec::new();
    if w.implausible > 0 {
        notes.push(format!(
            "{} entries with a size over 256 TiB or an address at the top of the address space were \
             left out (forged or corrupt)",
            w.implausible
        ));
    }
    if w.private > 0 {
        notes.push(format!(
            "{} entries of private pools (CUDA graphs, use_mem_pool) are replayed as the default pool's",
            w.private
        ));
    }
    History {
        pid,
        device,
        source: source.to_string(),
        taken_at: taken_at.to_string(),
        entries,
        sites: b.sites,
        assumed_live,
        assumed_live_bytes,
        recorded: recorded.clone(),
        recorded_reserved_start: start as u64,
        recorded_reserved_peak: peak.max(0) as u64,
        recorded_segments: w.recorded_segments,
        segment_addresses: w.segment_addresses,
        oom_device_free: w.oom_device_free,
        oom_reserved: w.oom_at_walk.map(|d| (start + d).max(0) as u64),
        notes,
        segment_marks,
        seed_sites,
    }
}

/// What walking a history's entries leaves beside the builder's entries: the segments' moves, the first error's
/// figures, and what was left out.
#[derive(Default)]
struct Walked {
    private: u64,
    reserved_delta: i128,
    reserved_walk: Vec<i128>,
    recorded_segments: Vec<i64>,
    segment_addresses: Vec<(u64, u64)>,
    oom_device_free: Option<u64>,
    oom_at_walk: Option<i128>,
    implausible: u64,
}

/// Walks the history's entries into `b`: allocations, frees, errors, and the segments PyTorch made and gave back.
fn walk_trace(k: &K, trace: &[V], b: &mut Builder) -> Walked {
    let mut w = Walked::default();
    for e in trace {
        let Some(action) = k.text(e.get(k.action)) else {
            continue;
        };
        let t = uint(e.get(k.time_us));
        let addr = uint(e.get(k.addr));
        let size = uint(e.get(k.size));
        let stream = uint(e.get(k.stream));
        if size > MAX_SIZE || addr > u64::MAX - MAX_SIZE {
            w.implausible += 1;
            continue;
        }
        match action {
            "segment_free" | "segment_unmap" => {
                b.marks.push(SegmentMark {
                    index: b.entries.len(),
                    delta: -(size as i64),
                    t_us: t,
                });
                w.reserved_delta -= size as i128;
                w.reserved_walk.push(w.reserved_delta);
                w.recorded_segments.push(-(size as i64));
                if !b.releasing {
                    b.releasing = true;
                    b.release_t = t;
                }
                continue;
            }
            "segment_alloc" | "segment_map" => {
                b.marks.push(SegmentMark {
                    index: b.entries.len(),
                    delta: size as i64,
                    t_us: t,
                });
                w.reserved_delta += size as i128;
                w.reserved_walk.push(w.reserved_delta);
                w.recorded_segments.push(size as i64);
                if action == "segment_alloc" {
                    w.segment_addresses.push((size, addr));
                }
                b.settle(true);
                continue;
            }
            "oom" => {
                b.settle(true);
                let site = b.site(k, e.get(k.frames).map_or(&[][..], V::list));
                if w.oom_device_free.is_none() {
                    // The free memory the driver reported (the snapshot names it; the raw entry keeps it as
                    // its address).
                    w.oom_device_free = Some(
                        e.get(k.device_free)
                            .and_then(V::int)
                            .map_or(addr, |x| x.max(0) as u64),
                    );
                    w.oom_at_walk = Some(w.reserved_delta);
                }
                b.entries.push(Entry {
                    t_us: t,
                    op: Op::Oom { size, stream },
                    site,
                });
                continue;
            }
            _ => {}
        }
        match action {
            "alloc" => {
                b.settle(false);
                let site = b.site(k, e.get(k.frames).map_or(&[][..], V::list));
                let id = b.id();
                b.live.insert(addr, (id, size));
                b.entries.push(Entry {
                    t_us: t,
                    op: Op::Alloc { id, size, stream },
                    site,
                });
            }
            "free_completed" => {
                b.settle(false);
                let id = match b.live.remove(&addr) {
                    Some((id, _)) => id,
                    None => {
                        // Allocated before the history began.
                        let id = b.id();
                        b.seeds.push((addr, id, size, stream));
                        let site = b.site(k, e.get(k.frames).map_or(&[][..], V::list));
                        if site != NO_SITE {
                            b.seed_site.insert(id, site);
                        }
                        id
                    }
                };
                b.entries.push(Entry {
                    t_us: t,
                    op: Op::Free { id },
                    site: NO_SITE,
                });
            }
            "free_requested" | "snapshot" => {}
            _ => {}
        }
        if !default_pool(e, k) {
            w.private += 1;
        }
    }
    b.settle(false);
    w
}

/// Seeds `b` with what was live at the snapshot but allocated before the history (assumed live from its start
/// too); PyTorch's reserve on `device` at the snapshot.
fn seed_live(k: &K, segments: &[V], device: u32, b: &mut Builder, implausible: &mut u64) -> u64 {
    let mut end_reserved: u64 = 0;
    for seg in segments
        .iter()
        .filter(|s| k.get(s, "device").and_then(V::int) == Some(device as i64))
    {
        end_reserved = end_reserved.saturating_add(uint(k.get(seg, "total_size")).min(MAX_SIZE));
        for blk in k.get(seg, "blocks").map_or(&[][..], V::list) {
            let state = k.text(k.get(blk, "state")).unwrap_or("");
            if !state.starts_with("active") {
                continue;
            }
            let addr = uint(k.get(blk, "address"));
            if b.live.contains_key(&addr) {
                continue;
            }
            let id = b.id();
            let size = k
                .get(blk, "requested_size")
                .and_then(V::int)
                .filter(|x| *x > 0)
                .or(k.get(blk, "size").and_then(V::int))
                .unwrap_or(0) as u64;
            if size > MAX_SIZE {
                *implausible += 1;
                continue;
            }
            b.seeds.push((addr, id, size, uint(k.get(seg, "stream"))));
            let site = b.site(k, k.get(blk, "frames").map_or(&[][..], V::list));
            if site != NO_SITE {
                b.seed_site.insert(id, site);
            }
        }
    }
    end_reserved
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tensors live at a moment the trace names, on a clock a little off PyTorch's: the segment made
    /// nearest it and the request it was made for; tensors from before the history by the line their free entry
    /// or their block names; nothing past the end of a history taken at an error.
    #[test]
    fn the_tensors_live_at_a_moment_are_read_at_the_segment_made_then() {
        let doc = crate::inputs::pickle::read(&crate::inputs::pickle::python_written(
            "def f(n): return [dict(filename=n + '.py', line=1, name=n)]\n\
             M = 1 << 20\n\
             e = lambda a, addr, size, t, n=None: dict(action=a, addr=addr, size=size, stream=0, time_us=t, \
             frames=f(n) if n else [])\n\
             v = dict(segments=[dict(device=0, total_size=6 * M, stream=0, blocks=[dict(address=900, \
             size=M, requested_size=M, state='active_allocated', frames=f('e'))])], device_traces=[[\
             e('segment_alloc', 100, 2 * M, 1000), e('alloc', 100, M, 1001, 'a'), e('alloc', 200, M // 2, 1500, 'b'), \
             e('free_completed', 100, M, 2000, 'a'), e('segment_alloc', 300, 4 * M, 3000), \
             e('alloc', 300, 3 * M, 3001, 'c'), e('free_completed', 800, M, 4000, 'd'), \
             e('alloc', 400, 7, 5000)]])",
            true,
        ))
        .unwrap();
        let hs = from_snapshot(&doc, 7, "s", "exit", &mut Vec::new());
        let h = &hs[0];
        let named = |l: &LiveAt| -> Vec<(String, u64)> {
            l.by_site
                .iter()
                .map(|&(s, b, _)| match s {
                    BEFORE_HISTORY => ("before".into(), b),
                    NO_SITE => ("none".into(), b),
                    s => (h.site(s).unwrap().to_string(), b),
                })
                .collect()
        };
        const M: u64 = 1 << 20;
        // The trace saw the peak 10 us before PyTorch's clock: the 4 MiB segment, with its request.
        let l = h.live_at(2990, 2000, false).unwrap();
        assert_eq!(
            named(&l),
            [
                ("c.py:1 in c".to_string(), 3 * M),
                ("d.py:1 in d".to_string(), M),
                ("e.py:1 in e".to_string(), M),
                ("b.py:1 in b".to_string(), M / 2)
            ]
        );
        // The seeds' reserve (the segments at the end, less what the entries made) and both segments.
        assert_eq!(l.reserved, 6 * M);
        assert_eq!(l.allocated, 5 * M + M / 2);
        // Before the first segment's request was freed, far from any segment made: the entries up to then.
        let l = h.live_at(1800, 100, false).unwrap();
        assert!(named(&l).contains(&("a.py:1 in a".to_string(), M)), "{l:?}");
        assert_eq!(l.reserved, 2 * M);
        // Before the history, and past a history taken at an error, nothing is said; past one taken at exit,
        // the end's.
        assert_eq!(h.live_at(10, 100, false), None);
        assert_eq!(h.live_at(9000, 100, false), None);
        // The seed freed at 4000 is gone by then.
        assert_eq!(
            h.live_at(9000, 100, true).unwrap().allocated,
            4 * M + M / 2 + 7
        );
    }

    #[test]
    fn mutated_snapshots_are_read_or_refused_never_a_panic() {
        // A snapshot as the bridge writes it, then 3,000 mutants: bytes changed, cut, duplicated, shuffled.
        let good = crate::inputs::pickle::python_written(
            "f = [dict(filename='a.py', line=3, name='f')]\n\
             v = dict(segments=[dict(device=0, total_size=1 << 21, blocks=[dict(address=1, size=2, \
             state='active_allocated', frames=f)])], device_traces=[[dict(action=a, addr=i, size=i * 512, \
             stream=0, time_us=i, frames=f) for i, a in enumerate(['alloc', 'free_completed', 'segment_alloc', \
             'oom'] * 5)]], allocator_settings=dict(max_split_size=-1, roundup_power2_divisions={'1': 4}))",
            true,
        );
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n.max(1) as u64) as usize
        };
        let mut read_ok = 0;
        for _ in 0..3000 {
            let mut b = good.clone();
            for _ in 0..1 + next(4) {
                if b.is_empty() {
                    break;
                }
                match next(4) {
                    0 => {
                        let at = next(b.len());
                        b[at] = next(256) as u8;
                    }
                    1 => b.truncate(next(b.len())),
                    2 => {
                        let (at, n) = (next(b.len()), next(16));
                        let piece: Vec<u8> = b[at..(at + n).min(b.len())].to_vec();
                        let to = next(b.len());
                        b.splice(to..to, piece);
                    }
                    _ => {
                        let (i, j) = (next(b.len()), next(b.len()));
                        b.swap(i, j);
                    }
                }
            }
            if let Ok(d) = crate::inputs::pickle::read(&b) {
                read_ok += 1;
                // What was read can be taken apart as the what-if does.
                let mut notes = Vec::new();
                let hs = from_snapshot(&d, 1, "m", "exit", &mut notes);
                if !hs.is_empty() {
                    let n = hs.len();
                    let _ = crate::whatif::answer::answer(
                        hs,
                        vec![0; n],
                        Default::default(),
                        Default::default(),
                        &crate::whatif::settings::default_grid()[..3],
                        None,
                    );
                }
            }
        }
        assert!(
            read_ok > 100,
            "{read_ok} of 3000 mutants read: the mutations are too harsh to test reading"
        );
    }
}

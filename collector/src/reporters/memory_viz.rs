//! `--format memory-viz`: a snapshot pickle that PyTorch's memory_viz (pytorch.org/memory_viz,
//! `torch.cuda._memory_viz`) opens, made from the driver's calls (docs/EXPORTS.md).
//!
//! Each driver allocation is a segment holding one block: `segment_alloc` then `alloc`; its free
//! `free_completed` then `segment_free`; a process that ends holding memory frees it there. `cuMemMap`/
//! `cuMemUnmap` are `segment_map` + `alloc` / `free_completed` + `segment_unmap` (the memory of a
//! `cuMemCreate` handle is drawn where it is mapped: a handle has no address). Out-of-memory errors are `oom`
//! with the driver's free bytes. The final `segments` are what the replay holds at the end, so replaying
//! `device_traces` backwards from them (memory_viz's "Allocator State History") agrees at every step.
//!
//! Memory is bounded: each device keeps the last [`MAX_EVENTS`] events (fewer with `--max-events`), the rest
//! are counted and said in the pickle's `vramtrace.notes` and on stderr. Addresses are per process but
//! memory_viz has one address space per device: an allocation whose range another process holds at that
//! moment is drawn at a synthetic address past [`SYNTHETIC_BASE`] (counted, said).

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Write};
use std::path::Path;

use vramtrace_format::NO_DEVICE;

use super::pickle::{Pickler, BATCH};
use crate::callsites::{Frame, FrameKind};
use crate::model::observe::tap::{Change, Frames, OomStep, Step, Tap};
use crate::model::Analysis;
use crate::names::fasthash::FastMap;

mod torch_history;
use torch_history::TorchHistory;

/// The most events kept per device: memory_viz's users report it unusable past about 600 k.
pub const MAX_EVENTS: usize = 500_000;
/// Where synthetic addresses start (below 2^63: every integer fits in 64-bit signed).
pub const SYNTHETIC_BASE: u64 = 0x7000_0000_0000_0000;
/// The most bytes one allocation is drawn with (1 PiB: more than any device); larger sizes come only from a
/// corrupt or forged trace.
pub const MAX_DRAWN_BYTES: u64 = 1 << 50;
/// Synthetic addresses tried for one allocation before it is drawn where the last try fell.
const MAX_PLACE_TRIES: usize = 4096;
const NO_SITE: u32 = u32::MAX;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Action {
    SegmentAlloc,
    Alloc,
    FreeCompleted,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::SegmentAlloc => "segment_alloc",
            Action::Alloc => "alloc",
            Action::FreeCompleted => "free_completed",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
        }
    }
}

/// One trace entry; for `oom`, `addr` is the driver's free bytes.
#[derive(Clone, Copy)]
struct Ev {
    action: Action,
    mapped: bool,
    addr: u64,
    size: u64,
    t_ns: u64,
    site: u32,
}

#[derive(Clone, Copy)]
struct Seg {
    /// Its device's key in `MemoryViz::devices`.
    dev: u64,
    /// The address drawn (the real one unless another process held the range).
    xaddr: u64,
    size: u64,
    site: u32,
    mapped: bool,
}

#[derive(Default)]
struct DeviceTrace {
    ring: VecDeque<Ev>,
    total: u64,
    /// Drawn ranges live now: start -> end.
    live: BTreeMap<u64, u64>,
    next_synthetic: u64,
}

impl DeviceTrace {
    fn free_range(&self, a: u64, size: u64) -> bool {
        let Some(end) = a.checked_add(size) else {
            return false;
        };
        end <= i64::MAX as u64
            && self
                .live
                .range(..end)
                .next_back()
                .is_none_or(|(_, &e)| e <= a)
    }

    /// Where a range of `size` at `addr` is drawn: `addr` when free, else a synthetic address. A size no device
    /// has (a forged or corrupt record: up to 2^64) is drawn as [`MAX_DRAWN_BYTES`] past the synthetic base, and
    /// the search for room is bounded: the export ends whatever the input.
    fn place(&mut self, addr: u64, size: u64, remapped: &mut u64) -> u64 {
        let size = size.min(MAX_DRAWN_BYTES);
        let x = if self.free_range(addr, size) {
            addr
        } else {
            *remapped += 1;
            let step = size.max(1).next_multiple_of(2 << 20);
            let mut a = SYNTHETIC_BASE.saturating_add(self.next_synthetic);
            for _ in 0..MAX_PLACE_TRIES {
                a = SYNTHETIC_BASE.saturating_add(self.next_synthetic);
                self.next_synthetic = self.next_synthetic.saturating_add(step);
                if self.free_range(a, size) {
                    break;
                }
            }
            a
        };
        self.live.insert(x, x.saturating_add(size));
        x
    }
}

/// Device numbers drawn apart by more than this many unused ones are drawn one after another instead.
const MAX_UNUSED_DEVICES: u64 = 1024;

/// How the devices are numbered in the snapshot: memory_viz's `device_traces` is a list by device number, so
/// devices keep their numbers (an unused number is an empty list) unless that would draw more than
/// [`MAX_UNUSED_DEVICES`] empty ones (a trace naming device 2^31 asked for a list of 2^31): then they are
/// drawn one after another by number, and `vramtrace.device_numbers` says which is which.
struct Drawn {
    keys: Vec<u64>,
    positional: bool,
}

impl Drawn {
    fn of(devices: &BTreeMap<u64, DeviceTrace>) -> Drawn {
        let keys: Vec<u64> = devices.keys().copied().collect();
        let positional = keys
            .last()
            .is_none_or(|&k| k < keys.len() as u64 + MAX_UNUSED_DEVICES);
        Drawn { keys, positional }
    }

    /// Devices in the snapshot.
    fn count(&self) -> u64 {
        match (self.positional, self.keys.last()) {
            (true, Some(&k)) => k + 1,
            _ => self.keys.len() as u64,
        }
    }

    /// The snapshot's number of the device `key` (one of `keys`).
    fn index(&self, key: u64) -> u64 {
        if self.positional {
            key
        } else {
            self.keys.partition_point(|&k| k < key) as u64
        }
    }

    /// The snapshot's number of the first device at or after `key`.
    fn first_at(&self, key: u64) -> u64 {
        if self.positional {
            key.min(self.count())
        } else {
            self.keys.partition_point(|&k| k < key) as u64
        }
    }

    /// Every device the snapshot lists, in its order (`none` for an unused number).
    fn traces<'a>(
        &'a self,
        devices: &'a BTreeMap<u64, DeviceTrace>,
        none: &'a DeviceTrace,
    ) -> impl Iterator<Item = &'a DeviceTrace> + 'a {
        let n = if self.positional { self.count() } else { 0 };
        let positional = (0..n).map(move |k| devices.get(&k).unwrap_or(none));
        let compact = devices
            .values()
            .take(if self.positional { 0 } else { usize::MAX });
        positional.chain(compact)
    }
}

/// The tap that builds the snapshot.
pub struct MemoryViz {
    max_events: usize,
    /// By device: its number after the devices of the traces before (`dev_base`). Sparse: a trace can name any
    /// device number up to 2^32 - 1, and only the devices it uses are kept (see [`Drawn`] for how they are
    /// numbered in the snapshot).
    devices: BTreeMap<u64, DeviceTrace>,
    /// Live pointer allocations: (slot, pointer) -> segment.
    live: FastMap<(usize, u64), Seg>,
    /// Live mappings: (slot, address) -> segment.
    mapped: FastMap<(usize, u64), Seg>,
    sites: FastMap<(usize, u32), u32>,
    site_keys: Vec<(usize, u32)>,
    frames: Vec<Vec<Frame>>,
    no_device: u64,
    remapped: u64,
    handles: u64,
    unmatched_unmaps: u64,
    /// PyTorch's own allocator history (the bridge's snapshots), one device of its own each.
    torch: Vec<TorchHistory>,
    torch_notes: Vec<String>,
    /// Several traces of one job: the one being replayed goes after the others' devices and processes, its
    /// times moved onto the first trace's clock.
    dev_base: u64,
    slot_base: usize,
    t_offset: u64,
    /// Per trace so far: (its host, its first device key, its offset on the job's clock).
    hosts: Vec<(String, u64, u64)>,
}

impl MemoryViz {
    pub fn new(max_events: usize) -> Self {
        MemoryViz {
            max_events: max_events.max(1),
            devices: BTreeMap::new(),
            live: FastMap::default(),
            mapped: FastMap::default(),
            sites: FastMap::default(),
            site_keys: Vec::new(),
            frames: Vec::new(),
            no_device: 0,
            remapped: 0,
            handles: 0,
            unmatched_unmaps: 0,
            torch: Vec::new(),
            torch_notes: Vec::new(),
            dev_base: 0,
            slot_base: 0,
            t_offset: 0,
            hosts: Vec::new(),
        }
    }

    /// The next trace of a job (one per node): its devices after those drawn so far, its processes after
    /// `slot_base` (the slots of the traces before), its times `offset_ns` later than the first trace's.
    pub fn next_host(&mut self, host: &str, offset_ns: u64, slot_base: usize) {
        self.dev_base = self.devices.keys().next_back().map_or(0, |k| k + 1);
        self.slot_base = slot_base;
        self.t_offset = offset_ns;
        self.hosts
            .push((host.to_string(), self.dev_base, offset_ns));
    }

    /// Adds the tensor-level history of every process the bridge kept a snapshot of (its exit snapshot, else
    /// its last out-of-memory one): PyTorch's own segments and events, each process and GPU as a device of its
    /// own after the real ones (its allocator's view: blocks and tensors inside the segments the driver-level
    /// devices show whole). `trace`: where the snapshots are looked for beside.
    pub fn add_torch_history(&mut self, a: &Analysis, trace: &Path) {
        let host = match self.hosts.last() {
            Some((h, ..)) => format!("{h}: "),
            None => String::new(),
        };
        torch_history::add(a, trace, &host, &mut self.torch, &mut self.torch_notes);
    }

    fn site(&mut self, slot: usize, stack: u32) -> u32 {
        if stack == 0 {
            return NO_SITE;
        }
        let n = self.site_keys.len() as u32;
        *self.sites.entry((slot, stack)).or_insert_with(|| {
            self.site_keys.push((slot, stack));
            n
        })
    }

    fn dev(&mut self, d: u64) -> &mut DeviceTrace {
        self.devices.entry(d).or_default()
    }

    fn push(&mut self, d: u64, ev: Ev) {
        let max = self.max_events;
        let dt = self.dev(d);
        dt.total += 1;
        if dt.ring.len() >= max {
            dt.ring.pop_front();
        }
        dt.ring.push_back(ev);
    }

    fn open(&mut self, d: u64, addr: u64, size: u64, t_ns: u64, site: u32, mapped: bool) -> Seg {
        let mut remapped = self.remapped;
        let xaddr = self.dev(d).place(addr, size, &mut remapped);
        self.remapped = remapped;
        let (a, b) = if mapped {
            (Action::SegmentMap, Action::Alloc)
        } else {
            (Action::SegmentAlloc, Action::Alloc)
        };
        for action in [a, b] {
            self.push(
                d,
                Ev {
                    action,
                    mapped,
                    addr: xaddr,
                    size,
                    t_ns,
                    site,
                },
            );
        }
        Seg {
            dev: d,
            xaddr,
            size,
            site,
            mapped,
        }
    }

    fn close(&mut self, s: Seg, t_ns: u64) {
        let last = if s.mapped {
            Action::SegmentUnmap
        } else {
            Action::SegmentFree
        };
        for action in [Action::FreeCompleted, last] {
            self.push(
                s.dev,
                Ev {
                    action,
                    mapped: s.mapped,
                    addr: s.xaddr,
                    size: s.size,
                    t_ns,
                    site: s.site,
                },
            );
        }
        self.dev(s.dev).live.remove(&s.xaddr);
    }
}

impl Tap for MemoryViz {
    fn step(&mut self, s: &Step) {
        // Pinned host memory is no device's: not in the snapshot, and not an unknown device's either.
        if s.on_host {
            return;
        }
        let (slot, t_ns) = (s.slot + self.slot_base, s.t_ns + self.t_offset);
        if s.handle {
            if s.change == Change::Alloc {
                self.handles += 1;
            }
            return;
        }
        match s.change {
            Change::Alloc | Change::Map => {
                let Some(d) = s.device.filter(|&d| d != NO_DEVICE) else {
                    self.no_device += 1;
                    return;
                };
                let site = self.site(slot, s.stack);
                let mapped = s.change == Change::Map;
                let seg = self.open(self.dev_base + d as u64, s.addr, s.size, t_ns, site, mapped);
                let map = if mapped {
                    &mut self.mapped
                } else {
                    &mut self.live
                };
                if let Some(old) = map.insert((slot, s.addr), seg) {
                    // A mapping over one still recorded (its unmap was not seen): it ends here.
                    self.close(old, t_ns);
                }
            }
            Change::Free | Change::Released => {
                if let Some(seg) = self.live.remove(&(slot, s.addr)) {
                    self.close(seg, t_ns);
                }
                if s.change == Change::Released {
                    // The process is gone: its mappings went with it.
                    let gone: Vec<(usize, u64)> = self
                        .mapped
                        .keys()
                        .filter(|k| k.0 == slot)
                        .copied()
                        .collect();
                    for k in gone {
                        if let Some(seg) = self.mapped.remove(&k) {
                            self.close(seg, t_ns);
                        }
                    }
                }
            }
            Change::Unmap => match self.mapped.remove(&(slot, s.addr)) {
                Some(seg) => self.close(seg, t_ns),
                None => self.unmatched_unmaps += 1,
            },
        }
    }

    fn oom(&mut self, o: &OomStep) {
        let d = o.oom.device;
        // Pinned host memory is no device's: not in the snapshot, and not an unknown device's either.
        if o.on_host {
            return;
        }
        if d == NO_DEVICE {
            self.no_device += 1;
            return;
        }
        let site = self.site(o.slot + self.slot_base, o.stack);
        self.push(
            self.dev_base + d as u64,
            Ev {
                action: Action::Oom,
                mapped: false,
                addr: o.oom.device_free_bytes.unwrap_or(0),
                size: o.oom.requested_bytes,
                t_ns: o.t_ns + self.t_offset,
                site,
            },
        );
    }

    /// Resolves the sites this trace added (those of traces before it are resolved already).
    fn finish(&mut self, frames: &mut Frames) {
        let base = self.slot_base;
        let new: Vec<Vec<Frame>> = self.site_keys[self.frames.len()..]
            .iter()
            .map(|&(slot, stack)| frames(slot - base, stack).unwrap_or_default())
            .collect();
        self.frames.extend(new);
    }
}

impl MemoryViz {
    /// What the reader should know: events left out, synthetic addresses, what is not drawn.
    pub fn notes(&self) -> Vec<String> {
        let mut n = Vec::new();
        let drawn = Drawn::of(&self.devices);
        if !drawn.positional {
            n.push(format!(
                "device numbers as high as {} would draw that many devices, nearly all unused: the {} used are \
                 drawn one after another, by number (vramtrace.device_numbers gives each one's number)",
                drawn.keys.last().copied().unwrap_or(0),
                drawn.keys.len()
            ));
        }
        for (&k, dt) in &self.devices {
            if dt.total > dt.ring.len() as u64 {
                n.push(format!(
                    "device {}: device_traces holds the last {} of {} events (memory_viz becomes unusable \
                     past about 600 k; --max-events sets it); the segments are those at the end",
                    drawn.index(k),
                    dt.ring.len(),
                    dt.total
                ));
            }
        }
        if self.remapped > 0 {
            n.push(format!(
                "{} allocations were at addresses another process held at that moment (one address space per \
                 device here, one per process in CUDA): drawn at addresses from {SYNTHETIC_BASE:#x}",
                self.remapped
            ));
        }
        if self.no_device > 0 {
            n.push(format!(
                "{} allocations or errors on a device the shim could not tell are left out",
                self.no_device
            ));
        }
        if self.handles > 0 {
            n.push(format!(
                "{} cuMemCreate handles: their memory is drawn where it is mapped (cuMemMap)",
                self.handles
            ));
        }
        if self.unmatched_unmaps > 0 {
            n.push(format!(
                "{} cuMemUnmap calls matched no mapping the trace recorded (left out)",
                self.unmatched_unmaps
            ));
        }
        for (i, t) in self.torch.iter().enumerate() {
            n.push(format!("device {}: {}", drawn.count() + i as u64, t.label));
        }
        n.extend(self.torch_notes.iter().cloned());
        n
    }

    /// Writes the snapshot: `segments`, `device_traces`, `allocator_settings` and `vramtrace` (what made it).
    pub fn write<W: Write>(&self, a: &Analysis, w: W) -> io::Result<W> {
        let start_us = a.header.start_unix_ns / 1_000;
        let mut p = Pickler::new(w)?;
        let mut emitted = vec![false; self.frames.len()];
        let drawn = Drawn::of(&self.devices);
        p.empty_dict()?;
        p.mark()?;

        self.segments(&mut p, &drawn, &mut emitted)?;

        self.device_traces(&mut p, &drawn, &mut emitted, start_us)?;

        p.str("allocator_settings")?;
        p.empty_dict()?;

        p.str("vramtrace")?;
        p.empty_dict()?;
        p.mark()?;
        self.made_by(&mut p, &drawn)?;
        p.setitems()?;

        p.setitems()?;
        p.stop()
    }

    /// The segments live at the end, by device and address (each one block), then PyTorch's own.
    fn segments<W: Write>(
        &self,
        p: &mut Pickler<W>,
        drawn: &Drawn,
        emitted: &mut [bool],
    ) -> io::Result<()> {
        p.str("segments")?;
        p.empty_list()?;
        let mut segs: Vec<&Seg> = self.live.values().chain(self.mapped.values()).collect();
        segs.sort_by_key(|s| (s.dev, s.xaddr));
        for chunk in segs.chunks(BATCH) {
            p.mark()?;
            for s in chunk {
                p.empty_dict()?;
                p.mark()?;
                p.str("device")?;
                p.uint(drawn.index(s.dev))?;
                p.str("address")?;
                p.uint(s.xaddr)?;
                for k in [
                    "total_size",
                    "allocated_size",
                    "active_size",
                    "requested_size",
                ] {
                    p.str(k)?;
                    p.uint(s.size)?;
                }
                p.str("stream")?;
                p.int(stream(s.mapped))?;
                p.str("segment_type")?;
                p.str("large")?;
                p.str("segment_pool_id")?;
                p.int(0)?;
                p.int(0)?;
                p.tuple2()?;
                p.str("is_expandable")?;
                p.bool(s.mapped)?;
                p.str("frames")?;
                self.frames_of(p, s.site, emitted)?;
                p.str("blocks")?;
                p.empty_list()?;
                p.mark()?;
                p.empty_dict()?;
                p.mark()?;
                p.str("address")?;
                p.uint(s.xaddr)?;
                p.str("size")?;
                p.uint(s.size)?;
                p.str("requested_size")?;
                p.uint(s.size)?;
                p.str("state")?;
                p.str("active_allocated")?;
                p.str("frames")?;
                self.frames_of(p, s.site, emitted)?;
                p.setitems()?;
                p.appends()?;
                p.setitems()?;
            }
            p.appends()?;
        }
        for (i, t) in self.torch.iter().enumerate() {
            let device = (drawn.count() + i as u64) as i64;
            t.put_segments(p, device)?;
        }
        Ok(())
    }

    /// One list of events per device ordinal, then PyTorch's own history, one device each after the real ones.
    fn device_traces<W: Write>(
        &self,
        p: &mut Pickler<W>,
        drawn: &Drawn,
        emitted: &mut [bool],
        start_us: u64,
    ) -> io::Result<()> {
        p.str("device_traces")?;
        p.empty_list()?;
        let none = DeviceTrace::default();
        for dt in drawn.traces(&self.devices, &none) {
            p.mark()?;
            p.empty_list()?;
            let evs: Vec<&Ev> = dt.ring.iter().collect();
            for chunk in evs.chunks(BATCH) {
                p.mark()?;
                for e in chunk {
                    p.empty_dict()?;
                    p.mark()?;
                    p.str("action")?;
                    p.str(e.action.name())?;
                    p.str(if e.action == Action::Oom {
                        "device_free"
                    } else {
                        "addr"
                    })?;
                    p.uint(e.addr)?;
                    p.str("size")?;
                    p.uint(e.size)?;
                    p.str("stream")?;
                    p.int(stream(e.mapped))?;
                    p.str("time_us")?;
                    p.uint(start_us.saturating_add(e.t_ns / 1_000))?;
                    p.str("frames")?;
                    self.frames_of(p, e.site, emitted)?;
                    p.setitems()?;
                }
                p.appends()?;
            }
            p.appends()?;
        }
        // PyTorch's own history, one device each after the real ones, as PyTorch wrote it.
        for t in &self.torch {
            t.put_trace(p)?;
        }
        Ok(())
    }

    /// The `vramtrace` entry: what made it, each device's event count and number, whose devices, the notes.
    fn made_by<W: Write>(&self, p: &mut Pickler<W>, drawn: &Drawn) -> io::Result<()> {
        let none = DeviceTrace::default();
        p.str("made_by")?;
        p.str(concat!("vramtrace ", env!("CARGO_PKG_VERSION")))?;
        p.str("events")?;
        p.empty_list()?;
        if !self.devices.is_empty() {
            for chunk in drawn
                .traces(&self.devices, &none)
                .collect::<Vec<_>>()
                .chunks(BATCH)
            {
                p.mark()?;
                for dt in chunk {
                    p.uint(dt.total)?;
                }
                p.appends()?;
            }
        }
        if !drawn.positional {
            p.str("device_numbers")?;
            p.empty_list()?;
            for chunk in drawn.keys.chunks(BATCH) {
                p.mark()?;
                for &k in chunk {
                    p.uint(k)?;
                }
                p.appends()?;
            }
        }
        // Several traces of one job: which devices are whose.
        if !self.hosts.is_empty() {
            p.str("hosts")?;
            p.empty_list()?;
            p.mark()?;
            for (i, (host, first, offset)) in self.hosts.iter().enumerate() {
                let end = self
                    .hosts
                    .get(i + 1)
                    .map_or(drawn.count(), |h| drawn.first_at(h.1));
                let first = drawn.first_at(*first);
                p.empty_dict()?;
                p.mark()?;
                p.str("host")?;
                p.str(host)?;
                p.str("first_device")?;
                p.uint(first)?;
                p.str("devices")?;
                p.uint(end.saturating_sub(first))?;
                p.str("offset_ns")?;
                p.uint(*offset)?;
                p.setitems()?;
            }
            p.appends()?;
        }
        // The devices holding PyTorch's own history (after the real ones).
        p.str("torch_devices")?;
        p.empty_list()?;
        if !self.torch.is_empty() {
            p.mark()?;
            for i in 0..self.torch.len() {
                p.uint(drawn.count() + i as u64)?;
            }
            p.appends()?;
        }
        p.str("notes")?;
        p.empty_list()?;
        let notes = self.notes();
        if !notes.is_empty() {
            p.mark()?;
            for n in &notes {
                p.str(n)?;
            }
            p.appends()?;
        }
        Ok(())
    }

    /// A site's frames: written once, then the same list again by memo.
    fn frames_of<W: Write>(
        &self,
        p: &mut Pickler<W>,
        site: u32,
        emitted: &mut [bool],
    ) -> io::Result<()> {
        if site == NO_SITE || site as usize >= self.frames.len() {
            return p.empty_list();
        }
        let i = site as usize;
        if emitted[i] {
            return p.get(site);
        }
        emitted[i] = true;
        p.empty_list()?;
        let frames = &self.frames[i];
        for chunk in frames.chunks(BATCH) {
            p.mark()?;
            for f in chunk {
                let (file, line, name) = frame_fields(f);
                p.empty_dict()?;
                p.mark()?;
                p.str("filename")?;
                p.str(&file)?;
                p.str("line")?;
                p.uint(line as u64)?;
                p.str("name")?;
                p.str(&name)?;
                p.setitems()?;
            }
            p.appends()?;
        }
        p.put(site)
    }
}

/// Mappings are on stream 1, allocations on 0: memory_viz merges neighbouring segments of one stream when it
/// replays a `segment_unmap`, which must never swallow an allocation beside a mapping.
fn stream(mapped: bool) -> i64 {
    mapped as i64
}

/// (filename, line, name) of a frame: a Python frame's own; a native frame's source when its debug info says,
/// else its object, and its function, else `object+0xoffset`.
fn frame_fields(f: &Frame) -> (String, u32, String) {
    let module = f.module.clone().unwrap_or_default();
    let file = f.file.clone().unwrap_or_else(|| {
        if module.is_empty() {
            "??".into()
        } else {
            module.clone()
        }
    });
    let name = match (&f.function, f.kind) {
        (Some(n), _) => n.clone(),
        (None, FrameKind::Python) => "??".into(),
        (None, _) => match f.offset {
            Some(o) => format!("{}+{o:#x}", module.rsplit('/').next().unwrap_or(&module)),
            None => "??".into(),
        },
    };
    (file, f.line.unwrap_or(0), name)
}

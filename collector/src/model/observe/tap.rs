//! A tap on the replay: every change to device memory as the replay applies it, in the merge's exact order
//! (docs/ARCHITECTURE.md, "Time and order"), with the figures the report is made of, and every decision the
//! replay takes about a process or an out-of-memory refusal. The exports (`crate::verbs::export`) stream from
//! it, and so do the live metrics (`crate::live`): one set of rules, so what `/metrics` counts is what the report
//! counts. Nothing is kept for them here.

use vramtrace_format::{Event, FrameworkSample, Hello, Oom, TraceHeader};

use crate::callsites::Frame;
use crate::model::analysis::ProcessStats;

/// What changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// A pointer allocation, or a `cuMemCreate` handle (`handle`), succeeded; or (`Step::back`) a release the
    /// driver refused made it live again.
    Alloc,
    /// A free or release matched a live allocation.
    Free,
    /// The process ended holding it: CUDA gave it back.
    Released,
    /// `cuMemMap`: `addr` is the address; the memory is the handle's (counted at `cuMemCreate`).
    Map,
    /// `cuMemUnmap`.
    Unmap,
}

/// One change, as the replay applied it.
pub struct Step<'a> {
    pub change: Change,
    /// Relative ns.
    pub t_ns: u64,
    /// The process's slot (a pid reused or exec'd gets a new one).
    pub slot: usize,
    /// Its identity and counts so far; its peak and per-device figures are the observers' until the replay
    /// ends (`observe/process.rs`), filled in only at `finish`.
    pub process: &'a ProcessStats,
    pub device: Option<u32>,
    /// Pinned host memory (`cuMemCreate` with a host location; `device` is `None`), not a GPU's.
    pub on_host: bool,
    /// The address is a `cuMemCreate` handle, not a pointer.
    pub handle: bool,
    pub addr: u64,
    pub size: u64,
    /// The call-site stack id of the allocation (of the handle, for a map), 0 when none.
    pub stack: u32,
    /// The event's flags (`vramtrace_format::flags`); 0 for a release.
    pub flags: u8,
    /// An `Alloc` that is not a new allocation: a release the driver refused made it live again.
    pub back: bool,
    /// The job's bytes in use on the device after the change, and this process's.
    pub device_bytes: u64,
    pub process_device_bytes: u64,
}

/// An out-of-memory record, when the replay reaches it (every one, not only those given a snapshot).
pub struct OomStep<'a> {
    pub t_ns: u64,
    pub slot: usize,
    /// Its identity and counts so far; its peak and per-device figures are the observers' until the replay
    /// ends (`observe/process.rs`), filled in only at `finish`.
    pub process: &'a ProcessStats,
    pub oom: &'a Oom,
    /// A request for pinned host memory (`cuMemCreate` with a host location): the record's device figures, if
    /// any, are not the host's (shims before 2026-11-22 attached the current GPU's).
    pub on_host: bool,
    /// The failing request's call-site stack id, 0 when none.
    pub stack: u32,
    /// The job's bytes in use on the device at that moment.
    pub device_bytes: u64,
    /// A framework's own error, with no refusal of the driver's behind it (PyTorch's memory fraction refuses
    /// before asking the driver): not a refusal.
    pub framework: bool,
}

/// An out-of-memory error, as the replay decided it: a framework raised it (the refusals behind it fold into
/// it), or a refusal was never recovered from (its process ended, the trace did, or too many were open).
pub struct ErrorStep<'a> {
    pub t_ns: u64,
    pub slot: usize,
    /// Its identity and counts so far; its peak and per-device figures are the observers' until the replay
    /// ends (`observe/process.rs`), filled in only at `finish`.
    pub process: &'a ProcessStats,
    /// The error's GPU, if it named one.
    pub device: Option<u32>,
}

/// Resolves a call site: (slot, stack id) to its frames (Python first, innermost first; then native).
pub type Frames<'a> = dyn FnMut(usize, u32) -> Option<Vec<Frame>> + 'a;

/// What the replay tells its observers. Only `step` must be heard; the rest are for those who count more than
/// memory (the live metrics). Send: the live metrics' replay is held across the scrapes' threads.
pub trait Tap: Send {
    /// The trace's header, before anything else.
    fn start(&mut self, _header: &TraceHeader) {}
    fn step(&mut self, s: &Step);
    fn oom(&mut self, _o: &OomStep) {}
    /// An out-of-memory error decided (every one: the report's count is these).
    fn error(&mut self, _e: &ErrorStep) {}
    /// An allocation the driver or the cap refused (`e.flags`: `CAP_REFUSED`), on `device`.
    fn refused(&mut self, _slot: usize, _device: Option<u32>, _e: &Event) {}
    /// The replay reached the process's hello: who it is.
    fn hello(&mut self, _slot: usize, _h: &Hello) {}
    /// The process ended (its memory released: `Change::Released` steps came before).
    fn ended(&mut self, _slot: usize, _t_ns: u64) {}
    /// `count` events of the process were dropped (its ring was full).
    fn dropped(&mut self, _slot: usize, _count: u64) {}
    /// The framework allocator's figures of the process (the Python bridge's sample).
    fn framework(&mut self, _slot: usize, _f: &FrameworkSample) {}
    /// Which GPU each ordinal is, by the driver of process `pid` (slot `slot`, its current image; read as it
    /// arrives, before the replay reaches the process's hello).
    fn devices(&mut self, _slot: usize, _pid: u32, _uuids: &[(u32, [u8; 16])]) {}
    /// The driver said how much memory `device` has (`cuMemGetInfo`, `cuDeviceTotalMem`).
    fn device_total(&mut self, _device: u32, _total: u64) {}
    /// The trace is replayed: resolve the call sites the tap needs (symbolised offline, as the report's).
    fn finish(&mut self, _frames: &mut Frames) {}
    /// The tap itself, for the one who made it to read back (the live metrics' figures).
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

/// A borrowed tap is a tap: the exports lend theirs for one replay.
impl<T: Tap + ?Sized> Tap for &mut T {
    fn start(&mut self, header: &TraceHeader) {
        (**self).start(header)
    }
    fn step(&mut self, s: &Step) {
        (**self).step(s)
    }
    fn oom(&mut self, o: &OomStep) {
        (**self).oom(o)
    }
    fn error(&mut self, e: &ErrorStep) {
        (**self).error(e)
    }
    fn refused(&mut self, slot: usize, device: Option<u32>, e: &Event) {
        (**self).refused(slot, device, e)
    }
    fn hello(&mut self, slot: usize, h: &Hello) {
        (**self).hello(slot, h)
    }
    fn ended(&mut self, slot: usize, t_ns: u64) {
        (**self).ended(slot, t_ns)
    }
    fn dropped(&mut self, slot: usize, count: u64) {
        (**self).dropped(slot, count)
    }
    fn framework(&mut self, slot: usize, f: &FrameworkSample) {
        (**self).framework(slot, f)
    }
    fn devices(&mut self, slot: usize, pid: u32, uuids: &[(u32, [u8; 16])]) {
        (**self).devices(slot, pid, uuids)
    }
    fn device_total(&mut self, device: u32, total: u64) {
        (**self).device_total(device, total)
    }
    fn finish(&mut self, frames: &mut Frames) {
        (**self).finish(frames)
    }
}

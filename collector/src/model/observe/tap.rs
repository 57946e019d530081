//! A tap on the replay: every change to device memory as the replay applies it, in the merge's exact order
//! (docs/ARCHITECTURE.md, "Time and order"), with the figures of that moment, and every out-of-memory record it
//! reaches. The exports (`crate::verbs::export`) stream from it. The live metrics need no tap: they read the
//! replay's observers at the moment asked (`model::stream::Stream::now`). Nothing is kept for them here.

use vramtrace_format::{Oom, TraceHeader};

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

/// Resolves a call site: (slot, stack id) to its frames (Python first, innermost first; then native).
pub type Frames<'a> = dyn FnMut(usize, u32) -> Option<Vec<Frame>> + 'a;

/// What the replay tells the exports, as it goes. Only `step` must be heard.
pub trait Tap: Send {
    /// The trace's header, before anything else.
    fn start(&mut self, _header: &TraceHeader) {}
    fn step(&mut self, s: &Step);
    fn oom(&mut self, _o: &OomStep) {}
    /// The trace is replayed: resolve the call sites the tap needs (symbolised offline, as the report's).
    fn finish(&mut self, _frames: &mut Frames) {}
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
    fn finish(&mut self, frames: &mut Frames) {
        (**self).finish(frames)
    }
}

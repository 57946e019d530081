//! A tap on the replay: every change to device memory as the replay applies it, in the merge's exact order
//! (docs/ARCHITECTURE.md, "Time and order"), with the figures the report is made of. The exports
//! (`crate::verbs::export`) stream from it; nothing is kept for them here.

use vramtrace_format::{Oom, TraceHeader};

use crate::callsites::Frame;
use crate::model::analysis::ProcessStats;

/// What changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// A pointer allocation, or a `cuMemCreate` handle (`handle`), succeeded.
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
    /// The job's bytes in use on the device after the change, and this process's.
    pub device_bytes: u64,
    pub process_device_bytes: u64,
}

/// An out-of-memory record, when the replay reaches it (every one, not only those given a snapshot).
pub struct OomStep<'a> {
    pub t_ns: u64,
    pub slot: usize,
    pub process: &'a ProcessStats,
    pub oom: &'a Oom,
    /// A request for pinned host memory (`cuMemCreate` with a host location): the record's device figures, if
    /// any, are not the host's (shims before 2026-11-22 attached the current GPU's).
    pub on_host: bool,
    /// The failing request's call-site stack id, 0 when none.
    pub stack: u32,
    /// The job's bytes in use on the device at that moment.
    pub device_bytes: u64,
}

/// Resolves a call site: (slot, stack id) to its frames (Python first, innermost first; then native).
pub type Frames<'a> = dyn FnMut(usize, u32) -> Option<Vec<Frame>> + 'a;

pub trait Tap {
    /// The trace's header, before anything else.
    fn start(&mut self, _header: &TraceHeader) {}
    fn step(&mut self, s: &Step);
    fn oom(&mut self, _o: &OomStep) {}
    /// The trace is replayed: resolve the call sites the tap needs (symbolised offline, as the report's).
    fn finish(&mut self, _frames: &mut Frames) {}
}

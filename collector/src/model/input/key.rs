//! The merge's total order ([`Key`]): what the sorted runs, the heap of their fronts and the merge itself all
//! sort by. A leaf: it imports none of them.

use vramtrace_format::Event;

/// Entry kinds, in their order at the same nanosecond: the events, then what depends on them.
pub(in crate::model) const WHAT_EVENTS: u8 = 0;
pub(in crate::model) const WHAT_DROP: u8 = 1;
pub(in crate::model) const WHAT_OOM: u8 = 2;
pub(in crate::model) const WHAT_END: u8 = 3;
/// A bridge record (a framework's figures or out-of-memory error), after the events of its nanosecond.
pub(in crate::model) const WHAT_FW: u8 = 4;
/// Every context of a process on a device was torn down: its pointer allocations there are gone.
pub(in crate::model) const WHAT_CTX: u8 = 5;

/// The total order of a trace's entries: time, kind, pid, thread, then the order of arrival in the file, which
/// for one thread is its program order (a thread's records never overtake each other).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(in crate::model) struct Key {
    pub ts: u64,
    pub what: u8,
    pub pid: u32,
    pub tid: u32,
    pub seq: u64,
}

impl Key {
    /// The key of event `e` of process `pid`, the `seq`th entry of the file.
    #[inline(always)]
    pub(in crate::model) fn event(pid: u32, seq: u64, e: &Event) -> Key {
        Key {
            ts: e.ts_ns,
            what: WHAT_EVENTS,
            pid,
            tid: e.tid,
            seq,
        }
    }

    pub(in crate::model) const MAX: Key = Key {
        ts: u64::MAX,
        what: u8::MAX,
        pid: u32::MAX,
        tid: u32::MAX,
        seq: u64::MAX,
    };
}

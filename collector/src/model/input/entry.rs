//! What travels through the merge besides events: each timed record, typed, with the replay's slot of its
//! process. The merge holds it until its time comes and hands it back whole; nothing waits in maps keyed by ids
//! on the replay's side.

use vramtrace_format::{Bridge, FrameworkSample, Hello, Oom};

use crate::model::input::key::{WHAT_CTX, WHAT_DROP, WHAT_END, WHAT_FW, WHAT_OOM};

/// A timed record of process slot `slot`, or a hello (a place in the file: [`Entry::Hello`] travels as a mark,
/// never by time).
#[derive(Debug, Clone)]
pub(in crate::model) enum Entry {
    /// Events the process could not record.
    Dropped { slot: usize, count: u64 },
    /// A refused allocation's record (boxed: entries are moved often, and most are small).
    Oom { slot: usize, oom: Box<Oom> },
    /// The process ended: CUDA gave back what it held.
    End { slot: usize },
    /// A framework's figures, from the Python bridge.
    Sample {
        slot: usize,
        sample: Box<FrameworkSample>,
    },
    /// Any other bridge record.
    Bridge { slot: usize, rec: Box<Bridge> },
    /// Every context of the process on `device` was torn down.
    ContextGone { slot: usize, device: u32 },
    /// What a hello says of the process, applied where the file holds it.
    Hello { slot: usize, hello: Box<Hello> },
}

impl Entry {
    /// Its kind in the merge's order at one nanosecond ([`crate::model::input::key`]). A hello has none: it is
    /// a mark.
    pub fn what(&self) -> u8 {
        match self {
            Entry::Dropped { .. } => WHAT_DROP,
            Entry::Oom { .. } => WHAT_OOM,
            Entry::End { .. } => WHAT_END,
            Entry::Sample { .. } | Entry::Bridge { .. } => WHAT_FW,
            Entry::ContextGone { .. } => WHAT_CTX,
            Entry::Hello { .. } => u8::MAX,
        }
    }
}

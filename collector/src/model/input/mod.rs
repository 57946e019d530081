//! Reading and merging: the trace's frames decoded ahead of the replay (`decode`), and every process's timed
//! entries (events, and records typed as an [`entry::Entry`]) put into one total order (`key`), in sorted runs (`run`) whose fronts meet in a heap (`fronts`), by
//! the merge (`merge`) on a thread of its own (`merge_link`).

pub(crate) mod decode;
pub(crate) mod entry;
pub(crate) mod fronts;
pub(crate) mod key;
pub mod merge;
pub(crate) mod merge_link;
pub(crate) mod run;

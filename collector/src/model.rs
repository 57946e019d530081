//! Replays a trace into live sets, peaks and timelines.
//!
//! Physical memory is what [`Api::effect`] says: `AllocPtr` allocations keyed by (process, pointer) and
//! `cuMemCreate` handles keyed by (process, handle) in a namespace of their own, given back by the matching
//! frees and releases. Address-space calls (reserve, map, unmap, address free) never count as memory. Only
//! calls that succeeded (`result == 0`) move memory; failed allocations are counted per process.
//!
//! Ordering (the contract, docs/ARCHITECTURE.md "Time and order"): the figures are exactly those of replaying
//! every timed entry of the trace (events, dropped counts, out-of-memory and bridge records, process ends) one
//! by one, sorted by time, then kind (events first), pid, thread, and order of arrival. Frames interleave in the
//! file by arrival, not by time; [`merge`] restores the order as it reads, holding back what an open process
//! could still precede, with bounded memory (past [`MERGE_BOUND`] waiting events it spills sorted runs to a
//! temporary file). An entry that arrives after the merge handed out something later cannot be placed and is
//! counted in [`Analysis::merge_inexact_events`]. The pieces: [`merge`] (the order), [`replay`] (live sets,
//! peaks, per-process figures), `oom_snapshot` (out-of-memory snapshots), [`leak`] (rising floors), `sites`
//! (call sites), [`framework`] (the Python bridge's figures), [`timeline`].
//!
//! When a process's connection ends, CUDA gives back everything it still held: the replay releases it at that
//! moment (device totals drop) and lists it as live at the end: never freed before the process ended.
//!
//! Out-of-memory records go through the same merge: an [`OomSnapshot`] is taken when the replay reaches the
//! record's time, so every event of every process up to that moment has been applied (events at the same
//! nanosecond first; a process end at the same nanosecond after). The snapshot scans the live set once; at most
//! [`MAX_OOM_SNAPSHOTS`] are taken (the first ones), the rest are counted.
//!
//! All times in an [`Analysis`] are ns relative to the trace header's `start_mono_ns`.

// The stages an entry passes, in order: read and merged (`input`), replayed (`replay`, the state and the
// records it takes), drawn on (`observe`), judged (`diagnose`). The reporters and the verbs stand above.
mod analysis;
pub mod diagnose;
pub mod input;
pub mod observe;
pub mod replay;
pub mod stream;

pub use analysis::bridge::{BridgeRecord, Peaks, StepReading};
pub use analysis::framework::{
    AllocatorReplay, BatchAdvice, BatchFit, DeviceFramework, Figures, KeptLine, ProcessFramework,
    SnapshotReading,
};
pub use analysis::*;
use input::decode;
pub use observe::tap;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

pub use vramtrace_format::ExitStatus;
use vramtrace_format::{OpenError, TraceReader};

use crate::names::symbols::Symbolizer;
pub use observe::leak::minima;
pub use observe::timeline::{Bucket, Timeline};
use replay::Replay;
pub use replay::FOLD_NS;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {}: {}", path.display(), crate::files::untrusted_file::said(source))]
    Read { path: PathBuf, source: io::Error },
    #[error("{}: {source}", path.display())]
    Open { path: PathBuf, source: OpenError },
}

/// Reads and replays a trace file, the trace alone; call sites are symbolised from the files the trace names
/// ([`Symbolizer::new`]). `crate::whatif::trace_file::analyze` also reads the snapshots kept beside it.
pub fn analyze_trace(path: &Path) -> Result<Analysis, ModelError> {
    replay_file(path, None)
}

/// [`analyze_trace`] with a [`tap::Tap`] told of every change to memory as the replay applies it (the exports);
/// the framework snapshots kept beside the trace are not read.
pub fn analyze_tapped(path: &Path, tap: &mut dyn tap::Tap) -> Result<Analysis, ModelError> {
    replay_file(path, Some(tap))
}

fn replay_file(path: &Path, tap: Option<&mut dyn tap::Tap>) -> Result<Analysis, ModelError> {
    let file =
        crate::files::untrusted_file::open_regular(path).map_err(|source| ModelError::Read {
            path: path.to_owned(),
            source,
        })?;
    let mut sym = Symbolizer::new();
    replay_frames_tapped(
        BufReader::with_capacity(1 << 20, file),
        MERGE_BOUND,
        false,
        Some(&mut sym),
        tap,
    )
    .map_err(|e| match e {
        OpenError::Io(source) => ModelError::Read {
            path: path.to_owned(),
            source,
        },
        source => ModelError::Open {
            path: path.to_owned(),
            source,
        },
    })
}

/// Replays a trace from any reader (buffer it: frames are read a few bytes at a time); call sites are
/// symbolised from the files the trace names ([`Symbolizer::new`]).
pub fn analyze_reader(r: impl Read + Send) -> Result<Analysis, OpenError> {
    let mut sym = Symbolizer::new();
    analyze_bounded(r, MERGE_BOUND, Some(&mut sym))
}

/// [`analyze_reader`] with a given symboliser (its debug directories, its cache of objects), or none: native
/// frames are then `module+offset` and no file is read.
pub fn analyze_reader_with(
    r: impl Read + Send,
    sym: Option<&mut Symbolizer>,
) -> Result<Analysis, OpenError> {
    analyze_bounded(r, MERGE_BOUND, sym)
}

/// The plain reference replay: every entry of the trace read, sorted by the merge's order, then replayed. Holds
/// the whole trace in memory; for tests, as the yardstick of [`analyze_reader`] (which must give the same).
#[doc(hidden)]
pub fn analyze_reference(r: impl Read + Send) -> Result<Analysis, OpenError> {
    replay_frames(r, MERGE_BOUND, true, None)
}

/// [`analyze_reader_with`] with the merge's memory bound set to `bound` events (tests: spilling).
#[doc(hidden)]
pub fn analyze_bounded(
    r: impl Read + Send,
    bound: usize,
    sym: Option<&mut Symbolizer>,
) -> Result<Analysis, OpenError> {
    replay_frames(r, bound, false, sym)
}

/// [`analyze_reader_with`] with a tap (tests).
#[doc(hidden)]
pub fn analyze_reader_tapped(
    r: impl Read + Send,
    sym: Option<&mut Symbolizer>,
    tap: &mut dyn tap::Tap,
) -> Result<Analysis, OpenError> {
    replay_frames_tapped(r, MERGE_BOUND, false, sym, Some(tap))
}

fn replay_frames(
    r: impl Read + Send,
    bound: usize,
    reference: bool,
    sym: Option<&mut Symbolizer>,
) -> Result<Analysis, OpenError> {
    replay_frames_tapped(r, bound, reference, sym, None)
}

fn replay_frames_tapped(
    r: impl Read + Send,
    bound: usize,
    reference: bool,
    sym: Option<&mut Symbolizer>,
    tap: Option<&mut dyn tap::Tap>,
) -> Result<Analysis, OpenError> {
    let (reader, header) = TraceReader::open(r)?;
    // Everything that talks to the merge's thread lives inside the scope: if the replay panics, the link drops
    // as the closure unwinds and the thread ends, so the scope's wait for it ends too.
    let (reader, a, unknown_frames, stopped, no_end) = std::thread::scope(|scope| {
        let mut st = Replay::new(header.start_mono_ns, bound.max(8), reference);
        st.merge.start_thread(scope);
        st.tap = tap.map(|t| Box::new(t) as Box<dyn tap::Tap + '_>);
        let promised_end = st.configure(&header);
        let mut unknown_frames = 0u64;
        let reader = decode::decode_ahead(reader, |entry| match entry {
            decode::Entry::Events(pid, batch) => st.on_events(pid, batch),
            decode::Entry::Record(rec) => st.on_record(rec),
            decode::Entry::Unknown => unknown_frames += 1,
        });
        let cut = promised_end && !st.end_record;
        let described = reader.stop().describe(reader.frames());
        let no_end = described.is_none() && cut;
        let stopped = described.or_else(|| {
            cut.then(|| {
                "the trace has no end record: vramtrace did not finish it (the job is still running, or \
                 vramtrace was killed, or could not write the trace to its end, e.g. on a full disk); the \
                 figures cover what was written"
                    .to_string()
            })
        });
        let a = st.finish(header, sym);
        (reader, a, unknown_frames, stopped, no_end)
    });
    let mut a = a;
    a.format_version = reader.version;
    a.partial = stopped.is_some();
    a.no_end_record = stopped.is_some() && no_end;
    a.stopped = stopped;
    a.frames = reader.frames();
    a.unknown_frames = unknown_frames;
    let (bad, first) = reader.bad_frames();
    a.bad_frames = bad;
    a.first_bad_frame = first.cloned();
    Ok(a)
}

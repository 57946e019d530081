//! The frameworks' part of the answer: what the Python bridge saw inside their allocators, as the replay
//! (`replay/framework.rs`) leaves it.

use vramtrace_format::{Bridge, Framework, FrameworkSample, NO_DEVICE};

use crate::model::analysis::LeakTrend;
use crate::model::observe::timeline::Timeline;

/// Arming changes of the allocation history kept, all processes together.
pub const MAX_HISTORY_CHANGES: usize = 64;

/// The bridge armed or disarmed PyTorch's allocation history (a `history` record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryChange {
    pub pid: u32,
    pub device: Option<u32>,
    /// Relative ns.
    pub time_ns: u64,
    pub armed: bool,
    /// `requested` (`--torch-history`), `retry` (a cache flush), `pressure` (allocated near the limit),
    /// `growth` (a rising floor), `pressure_gone`.
    pub reason: String,
    pub entries: u64,
    pub allocated: Option<u64>,
    pub limit: Option<u64>,
}

/// Notes kept from the bridge, all processes together.
pub const MAX_BRIDGE_NOTES: usize = 64;

/// One reading of a framework allocator's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figures {
    /// Bytes in tensors (PyTorch `allocated_bytes`; JAX `bytes_in_use`).
    pub allocated: u64,
    /// Bytes the allocator holds from the driver (PyTorch `reserved_bytes`).
    pub reserved: u64,
    pub active: u64,
    /// Free bytes in segments that cannot be released (PyTorch `inactive_split_bytes`).
    pub inactive_split: u64,
    pub requested: u64,
    /// The allocator flushed its cache and retried a driver allocation this many times (PyTorch).
    pub alloc_retries: u64,
    pub ooms: u64,
}

impl Figures {
    pub(in crate::model) fn of(s: &FrameworkSample) -> Figures {
        Figures {
            allocated: s.allocated,
            reserved: s.reserved,
            active: s.active,
            inactive_split: s.inactive_split,
            requested: s.requested,
            alloc_retries: s.alloc_retries,
            ooms: s.ooms,
        }
    }

    /// Reserved but not allocated: the allocator's cache.
    pub fn cached(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }
}

/// One process's framework figures on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessFramework {
    pub framework: Framework,
    pub device: u32,
    pub samples: u64,
    /// The last reading (at exit, for a process that ended normally).
    pub last: Figures,
    pub last_time_ns: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// The program's own iterations the bridge counted in this process (what, and how many), when it did.
    pub steps: Option<(crate::model::analysis::StepSource, u64)>,
}

/// The job's framework figures on one device: sums over its processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFramework {
    pub device: u32,
    /// `pytorch`, `jax`, or both joined by `+`.
    pub frameworks: String,
    pub processes: u64,
    pub allocated: Timeline,
    pub reserved: Timeline,
    pub peak_allocated: u64,
    pub peak_allocated_time_ns: Option<u64>,
    pub peak_reserved: u64,
    /// Cache flushes and retries, all processes (the guides' early warning).
    pub alloc_retries: u64,
    pub ooms: u64,
    /// Allocated bytes growing step after step (which the cache hides from the driver).
    pub leak: Option<LeakTrend>,
    /// Without a growth: something small kept at every step of a process (its readings at the steps'
    /// boundaries rose at each of the last 32 or more): (pid, steps, bytes it rose).
    pub small_growth: Option<(u32, u64, u64)>,
    /// With a growth: the live tensors at exit of the snapshot a process kept (the bridge dumps one when its
    /// allocation history is armed at exit), grouped by the line that allocated them: the lines that grew.
    pub kept: Option<SnapshotReading>,
}

pub use crate::torch_snapshot::{KeptLine, SnapshotReading};

/// A framework's out-of-memory error, from its own observer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameworkOom {
    pub framework: Framework,
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub device: Option<u32>,
    /// The OS name of the failing thread (`pt_autograd_0`: autograd's backward thread).
    pub thread: Option<String>,
    /// The bytes the allocator tried to get (PyTorch: the rounded segment size).
    pub requested_bytes: u64,
    /// PyTorch: the per-process fraction's limit if one is set, else the device's total.
    pub allowed_or_total_bytes: Option<u64>,
    pub device_free_bytes: Option<u64>,
    pub figures: Figures,
    pub backend: Option<String>,
    pub alloc_conf: Option<String>,
    pub expandable_segments: Option<bool>,
    pub garbage_collection_threshold: Option<String>,
    /// Blocks larger than this are never split (PyTorch; none when unlimited).
    pub max_split_size: Option<u64>,
    pub segments: Option<u64>,
    pub largest_free_block: Option<u64>,
    /// Free bytes inside segments that hold a live block: they cannot go back to the driver.
    pub free_in_live_segments: Option<u64>,
    pub snapshot_path: Option<String>,
    pub snapshot: Option<SnapshotReading>,
    /// The process's history replayed up to this error (the snapshot's `device_traces`), when it has one.
    pub replay: Option<crate::whatif::postmortem::Replay>,
}

impl FrameworkOom {
    pub(in crate::model) fn from_bridge(b: &Bridge, t: u64) -> FrameworkOom {
        let num = |k: &str| b.num(k);
        let text = |k: &str| b.field(k).filter(|v| !v.is_empty()).map(str::to_string);
        let framework = match b.field("framework") {
            Some("jax") => Framework::Jax,
            _ => Framework::Torch,
        };
        let figures = if framework == Framework::Jax {
            Figures {
                allocated: num("bytes_in_use").unwrap_or(0),
                reserved: num("bytes_reserved").or(num("bytes_limit")).unwrap_or(0),
                ..Figures::default()
            }
        } else {
            Figures {
                allocated: num("allocated").unwrap_or(0),
                reserved: num("reserved").unwrap_or(0),
                active: num("active").unwrap_or(0),
                inactive_split: num("inactive_split").unwrap_or(0),
                requested: num("requested_current").unwrap_or(0),
                alloc_retries: num("alloc_retries").unwrap_or(0),
                ooms: num("ooms").unwrap_or(0),
            }
        };
        let largest = num("largest_free_block").or(num("largest_free_block_bytes"));
        // PyTorch reports "unlimited" as SIZE_MAX (or -1 through a signed cast).
        let max_split = b
            .field("max_split_size")
            .and_then(|v| v.trim().parse::<i128>().ok())
            .filter(|&v| v > 0 && v < i64::MAX as i128)
            .map(|v| v as u64);
        FrameworkOom {
            framework,
            time_ns: t,
            pid: b.pid,
            tid: b.tid,
            device: (b.device != NO_DEVICE).then_some(b.device),
            thread: text("thread"),
            requested_bytes: num("requested").unwrap_or(0),
            allowed_or_total_bytes: num("allowed_or_total"),
            device_free_bytes: num("device_free"),
            figures,
            backend: text("backend"),
            alloc_conf: text("alloc_conf"),
            expandable_segments: b
                .field("expandable_segments")
                .map(|v| v.trim().eq_ignore_ascii_case("true"))
                .or_else(|| b.field("segments_expandable").map(|v| v.trim() == "1")),
            garbage_collection_threshold: text("garbage_collection_threshold"),
            max_split_size: max_split,
            segments: num("segments"),
            largest_free_block: largest,
            free_in_live_segments: num("free_in_live_segments"),
            snapshot_path: text("snapshot"),
            snapshot: None,
            replay: None,
        }
    }

    /// The thread was autograd's backward thread (PyTorch names its device threads `pt_autograd_N`).
    pub fn on_backward_thread(&self) -> bool {
        self.thread
            .as_deref()
            .is_some_and(|t| t.starts_with("pt_autograd"))
    }
}

/// A process where the bridge attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeProcess {
    pub pid: u32,
    pub framework: Framework,
    pub framework_version: Option<String>,
    pub python: Option<String>,
    pub backend: Option<String>,
    pub alloc_conf: Option<String>,
    pub sample_ms: Option<u64>,
    pub history_entries: u64,
    /// What it could not do (no observer for this backend, history refused, ...).
    pub problems: Vec<String>,
}

/// The bridge's side of the trace.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BridgeSummary {
    pub attached: Vec<BridgeProcess>,
    /// (pid, time, text), at most [`MAX_BRIDGE_NOTES`].
    pub notes: Vec<(u32, u64, String)>,
    /// Snapshots kept at exit: (pid, path).
    pub exit_snapshots: Vec<(u32, String)>,
    /// When the bridge armed and disarmed PyTorch's allocation history by itself (or at the start, when
    /// asked), at most [`MAX_HISTORY_CHANGES`]: what the tensors' lines can cover.
    pub history: Vec<HistoryChange>,
    /// Samples received, all processes.
    pub samples: u64,
    /// The bridge's walks of what held the tensors, at exit (after a growth) or on request, at most
    /// [`crate::model::analysis::holders::MAX_WALKS`]; those at an error are on its snapshot.
    pub walks: Vec<crate::model::analysis::holders::Holders>,
}

#[cfg(test)]
mod tests {
    /// Every key the collector's readers of bridge records ask for is one bridge/schema.json names (the bridge's
    /// own tests check every record it makes against the same file): read off the readers' source, so a key
    /// spelled differently on one side, or read and never sent, fails here.
    #[test]
    fn every_bridge_key_read_is_in_the_schema() {
        let schema = include_str!("../../../../bridge/schema.json");
        let named = |k: &str| {
            schema.contains(&format!("\"{k}\""))
                || schema
                    .split('"')
                    .any(|a| a.ends_with('*') && k.starts_with(a.trim_end_matches('*')))
        };
        let readers = [
            include_str!("framework.rs"),
            include_str!("holders.rs"),
            include_str!("../replay/framework.rs"),
        ];
        let mut read = Vec::new();
        for src in readers {
            for call in ["field(\"", "num(\"", "text(\""] {
                for piece in src.split(call).skip(1) {
                    if let Some(k) = piece.split('"').next() {
                        read.push(k.to_string());
                    }
                }
            }
        }
        assert!(read.len() > 20, "{read:?}");
        let unknown: Vec<&String> = read.iter().filter(|k| !named(k)).collect();
        assert!(
            unknown.is_empty(),
            "read but not in bridge/schema.json: {unknown:?}"
        );
    }
}

//! The frameworks' part of the answer: what the Python bridge saw inside their allocators, as the replay
//! (`observe/framework.rs`) leaves it.

use vramtrace_format::{Framework, FrameworkSample};

use crate::model::analysis::growth::{LeakTrend, StepSource};
use crate::model::analysis::timeline::Timeline;

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
    /// The most of its samples and of the allocator's own peak counters over the run (PyTorch
    /// `max_memory_allocated()`/`max_memory_reserved()`, JAX `peak_bytes_in_use`; `observe/framework.rs`).
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// The program's own iterations the bridge counted in this process (what, and how many), when it did.
    pub steps: Option<(StepSource, u64)>,
}

/// The job's framework figures on one device: sums over its processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFramework {
    pub device: u32,
    /// `pytorch`, `jax`, or both joined by `+`.
    pub frameworks: String,
    pub processes: u64,
    /// The samples' sums, with a moment at each peak the allocator counted that raised the device's.
    pub allocated: Timeline,
    pub reserved: Timeline,
    /// The most of the samples' sum and of each process's own peak counters added to the others' last figures
    /// (`observe/framework.rs`).
    pub peak_allocated: u64,
    /// When it was read: for a peak the allocator counted, when the bridge read its counter (within a sampling
    /// period after the moment).
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

/// A live tensor group of a PyTorch snapshot: the line that allocated them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptLine {
    /// `file:line in function`, the first frame that is the user's own.
    pub label: String,
    pub bytes: u64,
    pub count: u64,
    /// Of them, allocated during the leak's rise (between its first and last low point), when known.
    pub during_rise_bytes: u64,
}

/// What a framework snapshot kept beside the trace says (`--torch-history`; read by `inputs/torch_snapshot.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnapshotReading {
    pub path: String,
    /// Live tensors grouped by the line that allocated them, most bytes first.
    pub kept: Vec<KeptLine>,
    pub live_tensors: u64,
    pub live_bytes: u64,
    /// Live bytes whose blocks carried no Python frames.
    pub no_frames_bytes: u64,
    /// The history ring had wrapped: the oldest allocations' times are unknown.
    pub overflowed: bool,
    /// Why it could not be read, if it could not.
    pub error: Option<String>,
}

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
    pub replay: Option<AllocatorReplay>,
    /// The largest batch that fits, from this run and a run beside it at another batch (`whatif/batch/
    /// postmortem.rs`), when `vramtrace oom` found or was given one.
    pub batch: Option<BatchAdvice>,
}

/// What the failed run and a run of the same program at another value of a knob (the batch) say of the largest
/// value that fits where this one failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchAdvice {
    /// The knob as the command line names it (`--batch-size`), or as the user did.
    pub knob: String,
    /// The failed run's value.
    pub value: u64,
    /// The runs beside it: (trace, value).
    pub beside: Vec<(String, u64)>,
    /// What the allocator could have had at the failure ([`AllocatorReplay::limit`]).
    pub limit: u64,
    /// The answer, or why none is drawn (one line).
    pub outcome: Result<BatchFit, String>,
}

/// The largest value that fits, by the program replayed whole at each value tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchFit {
    /// With the settings it ran with; `None`: not even 1 fits.
    pub largest: Option<u64>,
    /// Where the next value up is first refused: its line.
    pub next_refused_at: Option<String>,
    /// A setting under which a larger value fits: (PYTORCH_CUDA_ALLOC_CONF, its largest).
    pub better: Option<(String, u64)>,
    /// Gradient accumulation that keeps the failed run's effective batch: (steps, value per step), the value per
    /// step replayed and fitting.
    pub accumulate: Option<(u64, u64)>,
    /// Requests whose size the runs leave ambiguous (a guessed shape).
    pub guessed: u64,
    /// Requests the failed run never made: sized from its earlier steps, from requests it made of the same size
    /// in the other run, and in proportion to the knob.
    pub filled_from_step: u64,
    pub filled_from_kin: u64,
    pub filled_in_proportion: u64,
    /// Requests one run made and the other did not: their code paths differ by kernels chosen by size. The advice
    /// then fits with both paths' requests.
    pub own_requests: u64,
}

/// What replaying a failed process's PyTorch history up to its failed request said (`whatif/postmortem.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatorReplay {
    /// What the allocator could have had at the failure: its reserve then plus the free memory reported.
    pub limit: u64,
    /// The history starts at the process's first allocation.
    pub complete: bool,
    /// The settings it ran with fail at the run's own failed request under `limit`.
    pub reproduced: bool,
    /// Settings that get past the failed request under `limit`: (PYTORCH_CUDA_ALLOC_CONF, the reserve at its
    /// most up to the request), the lowest reserve first.
    pub passes: Vec<(String, u64)>,
    /// The least that the settings it ran with need to get past the request.
    pub needs: u64,
}

impl FrameworkOom {
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
    /// Snapshots kept at exit: (pid, path), one a process, each path once, at most 256.
    pub exit_snapshots: Vec<(u32, String)>,
    /// Exit snapshots past that bound: named, not read.
    pub exit_snapshots_dropped: u64,
    /// Processes that ended themselves at a step's boundary, as `run --stop-after-steps` asked: (pid, steps
    /// done), at most one per process.
    pub stopped: Vec<(u32, u64)>,
    /// When the bridge armed and disarmed PyTorch's allocation history by itself (or at the start, when
    /// asked), at most [`MAX_HISTORY_CHANGES`]: what the tensors' lines can cover.
    pub history: Vec<HistoryChange>,
    /// Samples received, all processes.
    pub samples: u64,
    /// Samples dropped for naming a device ordinal no GPU has ([`crate::model::analysis::MAX_DEVICE_ORDINAL`]).
    pub implausible_devices: u64,
    /// The bridge's walks of what held the tensors, at exit (after a growth) or on request, at most
    /// [`crate::model::analysis::holders::MAX_WALKS`]; those at an error are on its snapshot.
    pub walks: Vec<crate::model::analysis::holders::Holders>,
}

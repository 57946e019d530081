//! What a diagnosis says: the cause with the rule and the figures that decided it, what it could see, where the
//! job's bytes came from, the findings beside it and the advice.

use super::cause::{Cause, Rule};
use super::growth_line::GrowthLine;
use super::reason::Reason;
use super::steps::Advice;
use crate::model::analysis::holders::Holder;
use crate::model::analysis::LeakTrend;

/// The estimate of one process's CUDA context, module and library memory on a device (never seen by the trace).
pub const CONTEXT_ESTIMATE_BYTES: u64 = 500 << 20;
/// A suggested cap is rounded up to a multiple of this (0.25 GiB).
pub const CAP_STEP_BYTES: u64 = 1 << 28;

/// The cause of one out-of-memory event, the figures that decided it, findings and advice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    /// `reason.cause()`.
    pub cause: Cause,
    /// What the diagnosis could see.
    pub view: View,
    /// Which rule decided (docs/OOM.md): `reason.rule()`.
    pub rule: Rule,
    /// The deciding figures, by rule.
    pub reason: Reason,
    /// The job's bytes in use on the device: the cap's ledger when the record has it, else the trace's.
    pub job_live_bytes: u64,
    /// Where `job_live_bytes` came from.
    pub job_live_source: JobSource,
    /// The cap on the device: the record's, else the trace header's.
    pub cap_bytes: Option<u64>,
    /// The device total used: the record's, else (only when the record has none) the trace's best figure.
    pub total_bytes: Option<u64>,
    /// `requested - device free`, when the driver said what was free.
    pub shortfall_bytes: Option<u64>,
    /// `total - free - job_live_bytes` (saturating): everything on the device the job's allocations were not.
    pub outside_job_bytes: Option<u64>,
    /// [`CONTEXT_ESTIMATE_BYTES`] x the job's processes on the device: an estimate.
    pub context_estimate_bytes: u64,
    /// `outside_job_bytes - context_estimate_bytes` (saturating): the estimate of other processes' memory.
    pub outside_excess_bytes: Option<u64>,
    /// `max(job peak on the device, job_live_bytes + requested)`.
    pub needed_bytes: u64,
    /// What the job's allocations could have reached: min(cap, free + job_live_bytes) of those known.
    pub available_bytes: Option<u64>,
    /// `needed - available` (saturating).
    pub short_of_fitting_bytes: Option<u64>,
    /// `needed_bytes` rounded up to [`CAP_STEP_BYTES`].
    pub suggested_cap_bytes: u64,
    /// With cause growth: the growth read (PyTorch's allocated bytes when the bridge gave them, else the
    /// driver's), and the line it came from when one can be named.
    pub growth: Option<LeakTrend>,
    pub growth_line: Option<GrowthLine>,
    /// What held the most of the process's tensors at the error, of what the program keeps by name, a graph or
    /// a cycle (the bridge's walk; never its weights, optimizer state or cache): with a growth, what grew.
    pub holder: Option<Holder>,
    /// A rise read in wall-clock windows went to a KV cache: the work grew (a sequence, a batch), nothing was
    /// kept; no advice says to fix what is kept.
    pub work_grows: bool,
    pub findings: Vec<Finding>,
    /// What to do, first the step that fixes the cause.
    pub advice: Vec<Advice>,
}

/// What a diagnosis could see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// The driver's calls only.
    Driver,
    /// The driver's calls and PyTorch's allocator's own figures (the Python bridge).
    DriverPytorch,
    /// The driver's calls and JAX's.
    DriverJax,
}

impl View {
    /// The JSON name.
    pub fn key(self) -> &'static str {
        match self {
            View::Driver => "driver",
            View::DriverPytorch => "driver+pytorch",
            View::DriverJax => "driver+jax",
        }
    }

    /// The framework whose figures were seen, for people.
    pub fn framework(self) -> Option<&'static str> {
        match self {
            View::Driver => None,
            View::DriverPytorch => Some("PyTorch"),
            View::DriverJax => Some("JAX"),
        }
    }
}

/// Where a diagnosis's job bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JobSource {
    /// The cap's ledger, from the record.
    Ledger,
    /// The trace's replay.
    #[default]
    Trace,
}

impl JobSource {
    /// The JSON name.
    pub fn key(self) -> &'static str {
        match self {
            JobSource::Ledger => "ledger",
            JobSource::Trace => "trace",
        }
    }
}

/// Something worth knowing beside the cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// How far the job's peak was from fitting what the device or cap could give.
    Fit {
        needed_bytes: u64,
        available_bytes: u64,
        short_bytes: u64,
        /// `"cap"` or `"device"`: which gave less.
        limited_by: &'static str,
    },
    /// Bytes in use rising across cycles before the event.
    LeakTrend(LeakTrend),
    /// Stream-ordered frees shortly before the event whose pool may still have cached the memory.
    PoolCache {
        freed_bytes: u64,
        shortfall_bytes: Option<u64>,
    },
    /// The cap's ledger counted the job's bytes differently from the trace.
    LedgerDiffers { ledger_bytes: u64, trace_bytes: u64 },
    /// The shim dropped events before the event: the trace's figures can be low.
    DroppedEvents { count: u64 },
    /// The driver could not say how much was free: the cause was decided without it.
    NoDriverFigures,
    /// The framework allocator's own figures at the event (the Python bridge).
    FrameworkFigures {
        allocated_bytes: u64,
        reserved_bytes: u64,
        inactive_split_bytes: u64,
        largest_free_block_bytes: Option<u64>,
        free_in_live_segments_bytes: Option<u64>,
        alloc_retries: u64,
        /// The allocator's settings, from the framework's out-of-memory record (`None`: it sent none).
        settings: Option<AllocatorSettings>,
    },
    /// Allocated bytes (the framework's figure, which its cache hides from the driver) rising across cycles.
    AllocatedLeakTrend(LeakTrend),
    /// The allocator flushed its cache and retried before the error: the guides' danger zone.
    AllocRetries { count: u64 },
    /// The failing allocation was made on autograd's backward thread.
    BackwardThread { thread: String },
    /// Each of the latest steps needed more than the last (PyTorch's peak rising at their boundaries) by more
    /// than what they kept: the work of a step grows with its input.
    StepNeedRises(crate::model::analysis::StepNeed),
    /// The failing process is one of several ranks running the same program, and held far more than its peers
    /// at the error: what it keeps that they do not is the suspect.
    RankAsymmetry {
        pid: u32,
        rank: u32,
        bytes: u64,
        peers: u64,
        peers_median_bytes: u64,
        peers_max_bytes: u64,
    },
}

impl Finding {
    /// The JSON name.
    pub fn key(&self) -> &'static str {
        match self {
            Finding::Fit { .. } => "fit",
            Finding::LeakTrend(_) => "leak_trend",
            Finding::PoolCache { .. } => "pool_cache",
            Finding::LedgerDiffers { .. } => "ledger_differs",
            Finding::DroppedEvents { .. } => "dropped_events",
            Finding::NoDriverFigures => "no_driver_figures",
            Finding::FrameworkFigures { .. } => "framework_figures",
            Finding::AllocatedLeakTrend(_) => "allocated_leak_trend",
            Finding::AllocRetries { .. } => "alloc_retries",
            Finding::BackwardThread { .. } => "backward_thread",
            Finding::RankAsymmetry { .. } => "rank_asymmetry",
            Finding::StepNeedRises(_) => "step_need_rises",
        }
    }
}

/// The allocator settings a framework's out-of-memory record carried (PyTorch's), as it gave them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatorSettings {
    pub backend: Option<String>,
    /// `None`: not said (off, PyTorch's default).
    pub expandable_segments: Option<bool>,
    /// Blocks larger than this are never split (`None`: unlimited).
    pub max_split_size: Option<u64>,
    pub garbage_collection_threshold: Option<String>,
    /// `PYTORCH_CUDA_ALLOC_CONF` as set (`None` or empty: not set).
    pub alloc_conf: Option<String>,
}

impl AllocatorSettings {
    pub(super) fn of(o: &crate::model::observe::framework::FrameworkOom) -> AllocatorSettings {
        AllocatorSettings {
            backend: o.backend.clone(),
            expandable_segments: o.expandable_segments,
            max_split_size: o.max_split_size,
            garbage_collection_threshold: o.garbage_collection_threshold.clone(),
            alloc_conf: o.alloc_conf.clone(),
        }
    }
}

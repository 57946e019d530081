//! The steps of advice: what to do, each with the figures it names. advice.rs fits them to a diagnosis;
//! reporters/prose/advice.rs says them.

use super::reason::Limit;

/// One step of advice. `device`: the GPU it is about (`None`: not known). Grouped by what it is about, one enum a
/// group, so that each group's words (reporters/prose/advice.rs) match their own group whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Advice {
    /// Growth: what grows, what keeps it, and why a larger limit only delays the error.
    Growth(GrowthAdvice),
    /// Host memory, or one request too large for any room that could be made.
    Request(RequestAdvice),
    /// Fragmentation: of PyTorch's cache (`Cache*`), or of the driver's pools and mappings.
    Fragmentation(FragmentationAdvice),
    /// Pressure: what to shed, and the levers that shed it.
    Pressure(PressureAdvice),
    /// Memory held outside the job.
    Outside(OutsideAdvice),
    /// The cap: what cap would fit, and what the allocator replayed says of its settings (whatif/postmortem.rs).
    Cap(CapAdvice),
    // A run beside it at another batch (`vramtrace oom` found or was given one).
    /// The largest value of the knob that fits where this run failed, by the program replayed whole.
    LargestBatch(Box<crate::model::BatchAdvice>),
    // Any cause.
    /// The memory went to a KV cache (`line`): bound the batch and the sequence.
    BoundKvCache { line: String },
}

/// Growth: what grows, what keeps it, and why a larger limit only delays the error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrowthAdvice {
    /// A KV cache grows with the batch and the sequence (`line`: where, when named).
    GrowthKvCache { line: Option<String> },
    /// An optimizer's state, made at its first steps and then kept.
    GrowthOptimizerState { line: Option<String> },
    /// Something allocated every step is never freed (a program without a caching allocator).
    GrowthNeverFreed { line: Option<String> },
    /// Something keeps tensors alive across steps.
    GrowthKeptTensors { line: Option<String> },
    /// What the bridge's walk found holding the most at the error keeps what grew.
    GrowthHeldBy {
        holder: crate::model::analysis::holders::Holder,
    },
    /// A growth read in driver-level cycles: a program loading its weights piece by piece (a staging buffer
    /// freed after each) reads the same; if it was loading, what it loads does not fit (`held` when it failed).
    CyclesMayBeLoading { held: u64 },
    /// `vramtrace run --torch-history` names the line next time.
    TorchHistory,
    /// A larger cap (`capped`) or GPU only delays it; `per_step`: the rise a step (`noun`: step, batch or
    /// cycle), when steps were counted; `lasts`: for a larger limit (bytes, `true` for the whole device), about
    /// how many more steps it would last at that rate.
    FixGrowthFirst {
        capped: bool,
        per_step: Option<u64>,
        noun: &'static str,
        lasts: Vec<(u64, u64, bool)>,
    },
}

/// Host memory, or one request too large for any room that could be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestAdvice {
    /// Check the host's memory and its limit on locked memory.
    HostMemory { requested: u64 },
    /// Split the work: one allocation of `requested` cannot fit under `limit`.
    SplitRequest {
        requested: u64,
        device: Option<u32>,
        limit: Limit,
    },
    /// Such a size is often a bug: check the shape.
    CheckShape,
}

/// Fragmentation: of PyTorch's cache (`Cache*`), or of the driver's pools and mappings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FragmentationAdvice {
    /// `expandable_segments:True`, PyTorch's own advice for it.
    CacheExpandableSegments,
    /// `max_split_size_mb:<mb>`.
    CacheMaxSplitSize {
        mb: u64,
    },
    /// `torch.cuda.empty_cache()` between phases.
    CacheEmptyBetweenPhases,
    /// `garbage_collection_threshold:0.8`.
    CacheGcThreshold,
    /// Large persistent buffers first, before the short-lived tensors.
    CachePersistentFirst,
    ExpandableSegments,
    TrimPools,
    PersistentFirst,
}

/// Pressure: what to shed, and the levers that shed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PressureAdvice {
    /// Shed at least `bytes` of the `needed` at the peak.
    Shed {
        bytes: u64,
        device: Option<u32>,
        needed: u64,
    },
    /// Each step needed more than the last (its input grows): bound the input, bucket it, or find the longest
    /// that fits. `noun`: what a step is.
    BoundInput {
        noun: &'static str,
    },
    /// `vramtrace fit`'s command for this job: its recorded command with `{}` where its batch size was (`batch`:
    /// the value it ran with; `None`: no argument named one), for this cap (`None`: the whole GPU).
    FitCommand {
        command: Vec<String>,
        batch: Option<u64>,
        cap: Option<u64>,
        device: Option<u32>,
    },
    SmallerBatch,
    Checkpointing,
    MixedPrecision,
    OffloadOptimizer,
    Shard,
    /// Bytes in use rose before it: fix what is kept first.
    FixKeptFirst,
    /// The framework's own allocator refused it within its `limit` (`total`: the GPU's, when known): give it
    /// more of the GPU, or make the step smaller. `needed`: its bytes in use plus the request; `fragmented`: that
    /// fitted the limit, but no free block was as large as the request.
    FrameworkLimit {
        framework: vramtrace_format::Framework,
        limit: u64,
        needed: u64,
        total: Option<u64>,
        fragmented: bool,
    },
}

/// Memory held outside the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutsideAdvice {
    /// `bytes` (estimated; `None`: unknown) held outside the job, which held `job_bytes`.
    HeldOutside {
        bytes: Option<u64>,
        device: Option<u32>,
        job_bytes: u64,
    },
    /// `nvidia-smi` names who holds the GPU.
    WhoHoldsTheGpu,
    /// Move the job, or stop the other process.
    MoveTheJob { device: Option<u32> },
}

/// The cap: what cap would fit, and what the allocator replayed says of its settings (whatif/postmortem.rs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapAdvice {
    /// A cap of `cap` would have fitted `needed`; `device`: named in the flag (several devices).
    CapWouldFit {
        cap: u64,
        needed: u64,
        device: Option<u32>,
    },
    /// A cap of `cap` gets the history past the failed request with the settings it ran with.
    CapFitsHistory { cap: u64, device: Option<u32> },
    /// With `conf`, PyTorch's allocator gets past the failed request within `limit`, its reserve at most
    /// `reserve` up to it; `complete`: the history covers the process from its first allocation.
    SettingGetsPast {
        conf: String,
        reserve: u64,
        limit: u64,
        complete: bool,
    },
    /// No allocator setting of the grid gets past the failed request within `limit`.
    NoSettingGetsPast { limit: u64 },
    /// The cap that would fit is more than the device's `total`.
    CapOverDevice { total: u64 },
    /// `--cap-mode warn` to measure first.
    CapModeWarn,
    /// Bytes in use rose before it: a larger cap only delays it.
    FixGrowthBeforeCap,
}

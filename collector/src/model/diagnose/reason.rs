//! Why a rule decided: one variant per rule of docs/OOM.md, with the figures it decided on. The reporters say
//! it (reporters/prose.rs); the rule and the cause are read from it, so the three cannot disagree.

use super::cause::{Cause, Rule};

/// Which limit a figure is: the vramtrace cap, or the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Cap,
    Device,
}

/// Whose bytes grew, for the growth rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrowthOf {
    /// PyTorch's allocated bytes (the Python bridge's figures): its cache hides the tensors' rise from the driver.
    FrameworkAllocated,
    /// The job's bytes in use, as the driver's calls show them.
    JobInUse,
    /// An autograd graph the program keeps across its iterations (the bridge's walk at the error: a graph
    /// behind one variable spanning several iterations), for a loop with no step the bridge could count.
    HeldGraph,
    /// A container (a list, a dict, a deque) holding many tensors added as the run went on (the walk at the
    /// error, against the job's bytes rising to it), for a loop with no step the bridge could count.
    HeldContainer,
}

/// What lay outside the job on the device, when the driver said its total and free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outside {
    /// `total - free - job`.
    pub bytes: u64,
    /// The part of it that the contexts estimate covers: `min(bytes, contexts estimate)`.
    pub contexts_bytes: u64,
    /// `bytes - contexts estimate` (saturating): what others held.
    pub excess_bytes: u64,
}

/// The rule that decided, and the figures it decided on. `job_bytes` is the diagnosis's `job_live_bytes` (from
/// the cap's ledger or the trace, as its `job_live_source` says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// `host_memory`: pinned host memory through `cuMemCreate` could not be had.
    HostMemory { requested: u64 },
    /// `request_exceeds_limit`: the request alone is larger than the cap or the device's total.
    RequestExceedsLimit {
        requested: u64,
        limit_bytes: u64,
        limit: Limit,
    },
    /// `cache_fragmented`: PyTorch's cache held what was short, but no free block as large as the request.
    CacheFragmented {
        reserved: u64,
        allocated: u64,
        cached: u64,
        /// What the cap or the driver could not give.
        short: u64,
        largest_free_block: u64,
        requested: u64,
        /// The cap refused it (else the driver did).
        cap_refused: bool,
    },
    /// `growth`: bytes in use rose step after step by at least what was missing. The growth and its line are the
    /// diagnosis's `growth` and `growth_line`.
    Growth {
        of: GrowthOf,
        requested: u64,
        missing: u64,
    },
    /// `framework_limit`: the framework's allocator refused it within its own `limit`, before asking the
    /// driver, with `in_use` bytes in its tensors or arrays; `largest_free_block` when it said it.
    FrameworkLimit {
        framework: vramtrace_format::Framework,
        limit: u64,
        in_use: u64,
        requested: u64,
        largest_free_block: Option<u64>,
    },
    /// The vramtrace cap refused it, or the job was over a cap that was not enforcing.
    Cap(CapReason),
    /// Decided from the driver's free figure: what was free, and who held the rest.
    Driver(DriverReason),
    /// Decided without the driver's free figure: from the device's size, or the job's bytes alone.
    NoFigures(NoFiguresReason),
}

/// The vramtrace cap refused it, or the job was over a cap that was not enforcing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapReason {
    /// `cap_refused`: the vramtrace cap refused it (`cap`: `None` when the record does not say the cap).
    CapRefused {
        job_bytes: u64,
        cap: Option<u64>,
        requested: u64,
    },
    /// `over_cap`: the job's bytes plus the request are over a cap that was not enforcing.
    OverCap {
        job_bytes: u64,
        requested: u64,
        cap: u64,
    },
}

/// Decided from the driver's free figure: what was free, and who held the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverReason {
    /// `free_at_least_request`: the driver had the bytes free, and refused.
    FreeAtLeastRequest { free: u64, requested: u64 },
    /// `pool_cached_async_frees`: short, but the job had just freed at least the shortfall to its pool.
    PoolCachedAsyncFrees {
        free: u64,
        shortfall: u64,
        requested: u64,
        async_freed: u64,
    },
    /// `outside_excess`: memory outside the job, beyond its contexts, at least the shortfall and a quarter of
    /// the job's.
    OutsideExcess {
        outside: u64,
        total: u64,
        free: u64,
        job_bytes: u64,
        contexts_estimate: u64,
        processes: u64,
        excess: u64,
        shortfall: u64,
    },
    /// `job_fills_device`: the job's own allocations filled what the device could give.
    JobFillsDevice {
        job_bytes: u64,
        free: u64,
        requested: u64,
        shortfall: u64,
        /// The framework's (allocated, cached) bytes, when its figures are known.
        framework: Option<(u64, u64)>,
        outside: Option<Outside>,
        processes: u64,
    },
}

/// Decided without the driver's free figure: from the device's size, or the job's bytes alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoFiguresReason {
    /// `no_driver_figures_pool`: no free figure; it fits the device, and the job had just freed the request
    /// to its pool.
    NoFiguresPool {
        job_bytes: u64,
        requested: u64,
        contexts_estimate: u64,
        total: u64,
        async_freed: u64,
    },
    /// `no_driver_figures_fits_total`: no free figure; it fits the device, so something outside filled it.
    NoFiguresFitsTotal {
        job_bytes: u64,
        requested: u64,
        contexts_estimate: u64,
        total: u64,
    },
    /// `no_driver_figures`: no free figure; the job, the request and its contexts exceed the device.
    NoFiguresOverTotal {
        job_bytes: u64,
        requested: u64,
        contexts_estimate: u64,
        total: u64,
    },
    /// `no_driver_figures`: neither free nor total known: decided from the job and the request alone.
    NothingKnown { job_bytes: u64, requested: u64 },
}

impl Reason {
    /// The rule that gave it (docs/OOM.md).
    pub fn rule(&self) -> Rule {
        match self {
            Reason::HostMemory { .. } => Rule::HostMemory,
            Reason::RequestExceedsLimit { .. } => Rule::RequestExceedsLimit,
            Reason::CacheFragmented { .. } => Rule::CacheFragmented,
            Reason::Growth { .. } => Rule::Growth,
            Reason::FrameworkLimit { .. } => Rule::FrameworkLimit,
            Reason::Cap(CapReason::CapRefused { .. }) => Rule::CapRefused,
            Reason::Cap(CapReason::OverCap { .. }) => Rule::OverCap,
            Reason::Driver(DriverReason::FreeAtLeastRequest { .. }) => Rule::FreeAtLeastRequest,
            Reason::Driver(DriverReason::PoolCachedAsyncFrees { .. }) => Rule::PoolCachedAsyncFrees,
            Reason::Driver(DriverReason::OutsideExcess { .. }) => Rule::OutsideExcess,
            Reason::Driver(DriverReason::JobFillsDevice { .. }) => Rule::JobFillsDevice,
            Reason::NoFigures(NoFiguresReason::NoFiguresPool { .. }) => Rule::NoDriverFiguresPool,
            Reason::NoFigures(NoFiguresReason::NoFiguresFitsTotal { .. }) => {
                Rule::NoDriverFiguresFitsTotal
            }
            // One rule, two sets of figures: with the device's total, and with nothing known.
            Reason::NoFigures(NoFiguresReason::NoFiguresOverTotal { .. })
            | Reason::NoFigures(NoFiguresReason::NothingKnown { .. }) => Rule::NoDriverFigures,
        }
    }

    /// The cause the rule gives.
    pub fn cause(&self) -> Cause {
        self.rule().cause()
    }
}

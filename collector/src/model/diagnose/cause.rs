//! The causes an out-of-memory event is told apart into, and the rules of docs/OOM.md that give them: a rule's
//! identity names its cause, so the two cannot disagree.

/// Why the allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The vramtrace cap refused it, or the job's bytes plus the request were over the cap.
    Cap,
    /// The device had the bytes free (or the job's pools held them) but not as one block the allocation could get.
    Fragmentation,
    /// PyTorch's cache held enough free bytes to cover what was short, but in blocks smaller than the request
    /// (inside segments it could not give back).
    FragmentationCache,
    /// The request alone was larger than the device or the cap.
    RequestTooLarge,
    /// Memory held outside the job filled the device.
    External,
    /// Pinned host memory (`cuMemCreate` with a host location) could not be had: not GPU memory.
    HostMemory,
    /// Bytes in use rose step after step up to the error, by at least what was missing: something is kept
    /// across steps (or grows with the work, as a KV cache with its batch).
    Growth,
    /// The job's own allocations filled what the device could give.
    Pressure,
    /// The framework's own allocator refused it within the limit it keeps for itself, before asking the driver
    /// (JAX's pool, `XLA_PYTHON_CLIENT_MEM_FRACTION`; PyTorch's `set_per_process_memory_fraction`).
    FrameworkLimit,
}

impl Cause {
    /// The JSON name.
    pub fn key(self) -> &'static str {
        match self {
            Cause::Cap => "cap",
            Cause::Fragmentation => "fragmentation",
            Cause::FragmentationCache => "fragmentation_cache",
            Cause::RequestTooLarge => "request_too_large",
            Cause::External => "external",
            Cause::Pressure => "pressure",
            Cause::HostMemory => "host_memory",
            Cause::Growth => "growth",
            Cause::FrameworkLimit => "framework_limit",
        }
    }
}

/// A rule's identity. Its key is the `cause_rule` the JSON and the tests name it by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    HostMemory,
    RequestExceedsLimit,
    CacheFragmented,
    Growth,
    FrameworkLimit,
    CapRefused,
    OverCap,
    FreeAtLeastRequest,
    PoolCachedAsyncFrees,
    OutsideExcess,
    JobFillsDevice,
    NoDriverFiguresPool,
    NoDriverFiguresFitsTotal,
    NoDriverFigures,
}

impl Rule {
    /// The rule's JSON name (docs/OOM.md).
    pub fn key(self) -> &'static str {
        match self {
            Rule::HostMemory => "host_memory",
            Rule::RequestExceedsLimit => "request_exceeds_limit",
            Rule::CacheFragmented => "cache_fragmented",
            Rule::Growth => "growth",
            Rule::FrameworkLimit => "framework_limit",
            Rule::CapRefused => "cap_refused",
            Rule::OverCap => "over_cap",
            Rule::FreeAtLeastRequest => "free_at_least_request",
            Rule::PoolCachedAsyncFrees => "pool_cached_async_frees",
            Rule::OutsideExcess => "outside_excess",
            Rule::JobFillsDevice => "job_fills_device",
            Rule::NoDriverFiguresPool => "no_driver_figures_pool",
            Rule::NoDriverFiguresFitsTotal => "no_driver_figures_fits_total",
            Rule::NoDriverFigures => "no_driver_figures",
        }
    }

    /// The cause the rule gives.
    pub fn cause(self) -> Cause {
        match self {
            Rule::HostMemory => Cause::HostMemory,
            Rule::RequestExceedsLimit => Cause::RequestTooLarge,
            Rule::CacheFragmented => Cause::FragmentationCache,
            Rule::Growth => Cause::Growth,
            Rule::FrameworkLimit => Cause::FrameworkLimit,
            Rule::CapRefused | Rule::OverCap => Cause::Cap,
            Rule::FreeAtLeastRequest | Rule::PoolCachedAsyncFrees | Rule::NoDriverFiguresPool => {
                Cause::Fragmentation
            }
            Rule::OutsideExcess | Rule::NoDriverFiguresFitsTotal => Cause::External,
            Rule::JobFillsDevice | Rule::NoDriverFigures => Cause::Pressure,
        }
    }

    /// The rule decided on the recent async frees a stream-ordered pool may still cache: the pool-cache finding
    /// would only repeat it.
    pub fn reads_pool_cache(self) -> bool {
        matches!(self, Rule::PoolCachedAsyncFrees | Rule::NoDriverFiguresPool)
    }
}

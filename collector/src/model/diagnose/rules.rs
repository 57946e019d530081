//! The rules of docs/OOM.md, "The cause: exactly one, first rule that holds": each a function of the evidence
//! that gives its reason when it holds, in a table in the documented order. The first that holds decides.

use super::cause::Rule;
use super::evidence::Evidence;
use super::reason::{CapReason, DriverReason, NoFiguresReason, Outside, Reason};

/// One row of the table: the rule, and its test of the evidence.
pub(super) struct Row {
    pub rule: Rule,
    pub holds: fn(&Evidence) -> Option<Reason>,
}

/// The rules in the order they are tried (docs/OOM.md). The last always holds, so one always decides.
pub(super) const RULES: [Row; 14] = [
    row(Rule::HostMemory, host_memory),
    row(Rule::RequestExceedsLimit, request_exceeds_limit),
    row(Rule::CacheFragmented, cache_fragmented),
    row(Rule::Growth, growth),
    row(Rule::FrameworkLimit, framework_limit),
    row(Rule::CapRefused, cap_refused),
    row(Rule::OverCap, over_cap),
    row(Rule::FreeAtLeastRequest, free_at_least_request),
    row(Rule::PoolCachedAsyncFrees, pool_cached_async_frees),
    row(Rule::OutsideExcess, outside_excess),
    row(Rule::JobFillsDevice, job_fills_device),
    row(Rule::NoDriverFiguresPool, no_driver_figures_pool),
    row(Rule::NoDriverFiguresFitsTotal, no_driver_figures_fits_total),
    row(Rule::NoDriverFigures, |e| Some(no_driver_figures(e))),
];

const fn row(rule: Rule, holds: fn(&Evidence) -> Option<Reason>) -> Row {
    Row { rule, holds }
}

/// The reason of the first rule that holds.
pub(super) fn decide(e: &Evidence) -> Reason {
    for r in &RULES {
        if let Some(reason) = (r.holds)(e) {
            // The reports name the rule from the reason: a row giving another rule's reason would misname it.
            debug_assert_eq!(reason.rule(), r.rule, "row {:?}", r.rule);
            return reason;
        }
    }
    // Not reached: the table's last rule always holds.
    no_driver_figures(e)
}

/// 0.0: pinned host memory through `cuMemCreate` could not be had. Before any GPU figure: an older shim attached
/// some to the record, and they are not this failure's.
fn host_memory(e: &Evidence) -> Option<Reason> {
    e.on_host.then_some(Reason::HostMemory { requested: e.req })
}

/// 0.1: the request alone is larger than the cap or the device: no freeing makes it fit.
fn request_exceeds_limit(e: &Evidence) -> Option<Reason> {
    let (limit_bytes, limit) = e.limit_alone.filter(|&(l, _)| e.req > l)?;
    Some(Reason::RequestExceedsLimit {
        requested: e.req,
        limit_bytes,
        limit,
    })
}

/// 0.2: PyTorch's cache held what was short, in blocks smaller than the request. Before the cap: a cap refusing
/// a segment the cache should have served is still the cache's fragmentation.
fn cache_fragmented(e: &Evidence) -> Option<Reason> {
    let c = e.cache_frag?;
    Some(Reason::CacheFragmented {
        reserved: c.reserved,
        allocated: c.allocated,
        cached: c.cached,
        short: c.short,
        largest_free_block: c.largest_free_block,
        requested: e.req,
        cap_refused: e.cap_refused,
    })
}

/// 0.3: bytes in use rose step after step by at least what was missing. Before the cap and pressure: a larger
/// cap or a smaller batch only moves the error to a later step.
fn growth(e: &Evidence) -> Option<Reason> {
    let g = e.grew.as_ref()?;
    Some(Reason::Growth {
        of: g.of,
        requested: e.req,
        missing: e.missing.unwrap_or(e.req),
    })
}

/// 0.4: the framework's own allocator refused it before asking the driver, within the limit it keeps: the
/// driver-level figures say nothing of why (JAX's pool was taken whole at its start).
fn framework_limit(e: &Evidence) -> Option<Reason> {
    let f = e.framework_limit?;
    // Within its limit, the limit decided only if the framework held all of it: one that could still grow (JAX
    // without preallocation, a fraction not yet reached) was refused growth by the driver, whose rules decide.
    if f.in_use.saturating_add(e.req) <= f.limit && f.reserved < f.limit {
        return None;
    }
    Some(Reason::FrameworkLimit {
        framework: f.framework,
        limit: f.limit,
        in_use: f.in_use,
        requested: e.req,
        largest_free_block: f.largest_free_block,
    })
}

/// 1: the cap refused the call.
fn cap_refused(e: &Evidence) -> Option<Reason> {
    e.cap_refused.then_some(Reason::Cap(CapReason::CapRefused {
        job_bytes: e.job,
        cap: e.cap,
        requested: e.req,
    }))
}

/// 2: the job's bytes plus the request are over a cap that did not refuse (warn mode, or the device first).
fn over_cap(e: &Evidence) -> Option<Reason> {
    let cap = e.cap.filter(|&c| e.job.saturating_add(e.req) > c)?;
    Some(Reason::Cap(CapReason::OverCap {
        job_bytes: e.job,
        requested: e.req,
        cap,
    }))
}

/// 3.1: the driver had the bytes free, and refused.
fn free_at_least_request(e: &Evidence) -> Option<Reason> {
    let free = e.free.filter(|&f| f >= e.req)?;
    Some(Reason::Driver(DriverReason::FreeAtLeastRequest {
        free,
        requested: e.req,
    }))
}

/// 3.2: short, but the job had just freed at least the shortfall to its stream-ordered pools.
fn pool_cached_async_frees(e: &Evidence) -> Option<Reason> {
    let (free, shortfall) = e.free.zip(e.shortfall)?;
    (e.recent > 0 && e.recent >= shortfall).then_some(Reason::Driver(
        DriverReason::PoolCachedAsyncFrees {
            free,
            shortfall,
            requested: e.req,
            async_freed: e.recent,
        },
    ))
}

/// 3.3: memory outside the job, beyond its contexts, covers the shortfall and is not small beside the job's.
fn outside_excess(e: &Evidence) -> Option<Reason> {
    let (free, shortfall) = e.free.zip(e.shortfall)?;
    let excess = e.excess.filter(|&ex| ex >= shortfall && ex >= e.job / 4)?;
    Some(Reason::Driver(DriverReason::OutsideExcess {
        outside: e.outside.unwrap_or(0),
        total: e.total.unwrap_or(0),
        free,
        job_bytes: e.job,
        contexts_estimate: e.ctx,
        processes: e.procs,
        excess,
        shortfall,
    }))
}

/// 3.4: with the driver's free memory known and nothing else to blame, the job filled the device.
fn job_fills_device(e: &Evidence) -> Option<Reason> {
    let (free, shortfall) = e.free.zip(e.shortfall)?;
    Some(Reason::Driver(DriverReason::JobFillsDevice {
        job_bytes: e.job,
        free,
        requested: e.req,
        shortfall,
        framework: e.framework_split,
        outside: e.outside.zip(e.excess).map(|(o, ex)| Outside {
            bytes: o,
            contexts_bytes: o.min(e.ctx),
            excess_bytes: ex,
        }),
        processes: e.procs,
    }))
}

/// The device's total, without the driver's free memory, when the job, the request and its contexts fit in it.
fn fits_total_without_free(e: &Evidence) -> Option<u64> {
    if e.free.is_some() {
        return None;
    }
    e.known_total
        .filter(|&t| e.job.saturating_add(e.req).saturating_add(e.ctx) <= t)
}

/// 4.1, first: it fits the device, and the job had just freed the request to its pools.
fn no_driver_figures_pool(e: &Evidence) -> Option<Reason> {
    let total = fits_total_without_free(e)?;
    (e.recent >= e.req).then_some(Reason::NoFigures(NoFiguresReason::NoFiguresPool {
        job_bytes: e.job,
        requested: e.req,
        contexts_estimate: e.ctx,
        total,
        async_freed: e.recent,
    }))
}

/// 4.1, else: it fits the device, so something outside the job's allocations filled it.
fn no_driver_figures_fits_total(e: &Evidence) -> Option<Reason> {
    let total = fits_total_without_free(e)?;
    Some(Reason::NoFigures(NoFiguresReason::NoFiguresFitsTotal {
        job_bytes: e.job,
        requested: e.req,
        contexts_estimate: e.ctx,
        total,
    }))
}

/// 4.2: over the device's total, or no total at all: pressure. Holds always: the last resort.
fn no_driver_figures(e: &Evidence) -> Reason {
    match e.known_total {
        Some(total) => Reason::NoFigures(NoFiguresReason::NoFiguresOverTotal {
            job_bytes: e.job,
            requested: e.req,
            contexts_estimate: e.ctx,
            total,
        }),
        None => Reason::NoFigures(NoFiguresReason::NothingKnown {
            job_bytes: e.job,
            requested: e.req,
        }),
    }
}

#[cfg(test)]
mod tests;

//! The diagnosis in words: every sentence an out-of-memory report says about its cause, findings and advice,
//! from the typed diagnosis (model/diagnose.rs). The text, the JSON (its `cause_reason`, findings' `text`,
//! `settings` and `advice`), the HTML page and `vramtrace run`'s closing lines all say it from here, so they
//! say the same thing. docs/OOM.md describes the rules these sentences report.

mod advice;
mod findings;
mod phrases;

pub use advice::{advice, advice_text};
pub use findings::{finding, leak, settings};
pub use phrases::{cap_spec, growth_size, holder_label, nouns};

use crate::model::diagnose::{
    CapReason, Cause, Diagnosis, DriverReason, Finding, GrowthOf, Limit, NoFiguresReason, Reason,
};
use crate::model::OomSnapshot;
use crate::names::units::{bytes as b, counted};

/// A few words for people.
pub fn cause_title(c: Cause) -> &'static str {
    match c {
        Cause::Cap => "the vramtrace cap",
        Cause::Fragmentation => "fragmentation",
        Cause::FragmentationCache => "fragmentation of PyTorch's cache",
        Cause::RequestTooLarge => "a request larger than the device or the cap",
        Cause::External => "memory held outside the job",
        Cause::Pressure => "memory pressure from the job itself",
        Cause::HostMemory => "pinned host memory ran out (not GPU memory)",
        Cause::Growth => "memory growing step after step",
        Cause::FrameworkLimit => "the framework's own memory limit",
    }
}

/// `3 job processes`.
fn processes(n: u64) -> String {
    format!("{n} job process{}", if n == 1 { "" } else { "es" })
}

/// The deciding figures in a sentence (no capital, no full stop: the reports put it after "Because").
pub fn reason(d: &Diagnosis) -> String {
    let by = if d.job_live_source == crate::model::diagnose::JobSource::Ledger {
        "by the cap's ledger"
    } else {
        "by the trace"
    };
    match d.reason {
        Reason::HostMemory { requested } => format!(
            "cuMemCreate asked for {} of pinned memory on the host (a host location, not a GPU) and the \
             driver could not give it: the host's memory, or its limit on locked memory, ran out; no \
             GPU's memory was the limit",
            b(requested)
        ),
        Reason::RequestExceedsLimit {
            requested,
            limit_bytes,
            limit,
        } => format!(
            "the request alone ({}) is larger than {} ({}): no amount of freeing other memory makes it fit",
            b(requested),
            match limit {
                Limit::Cap => "the cap",
                Limit::Device => "the device's total",
            },
            b(limit_bytes)
        ),
        Reason::CacheFragmented {
            reserved,
            allocated,
            cached,
            short,
            largest_free_block,
            requested,
            cap_refused,
        } => format!(
            "PyTorch held {} reserved but only {} in tensors: {} cached, at least the {} that {} could not \
             give, yet its largest free block was {}, smaller than the {} request (the free bytes lie \
             between live tensors, in segments it cannot release)",
            b(reserved),
            b(allocated),
            b(cached),
            b(short),
            if cap_refused { "the cap" } else { "the driver" },
            b(largest_free_block),
            b(requested)
        ),
        Reason::Growth {
            of,
            requested,
            missing,
        } => growth_reason(d, of, requested, missing),
        Reason::FrameworkLimit {
            framework,
            limit,
            in_use,
            requested,
            largest_free_block,
        } => framework_limit_reason(framework, limit, in_use, requested, largest_free_block),
        Reason::Cap(ref r) => cap_reason(r, by),
        Reason::Driver(ref r) => driver_reason(r, by),
        Reason::NoFigures(ref r) => no_figures_reason(r),
    }
}

/// Growth in words: what grew, where its bytes were made, and what held them at the error.
fn growth_reason(d: &Diagnosis, of: GrowthOf, requested: u64, missing: u64) -> String {
    if let GrowthOf::HeldGraph | GrowthOf::HeldContainer = of {
        return format!(
            "{} grew iteration after iteration up to this error ({}); without it the {} request would have \
             fitted ({} was missing)",
            d.holder.as_ref().map_or(
                if of == GrowthOf::HeldGraph {
                    "an autograd graph kept across iterations"
                } else {
                    "a container kept across iterations"
                }
                .to_string(),
                holder_label
            ),
            d.growth.as_ref().map_or(String::new(), growth_size),
            b(requested),
            b(missing)
        );
    }
    let what = match of {
        GrowthOf::FrameworkAllocated => "PyTorch's allocated bytes",
        GrowthOf::JobInUse => "the job's bytes in use",
        GrowthOf::HeldGraph => "an autograd graph",
        GrowthOf::HeldContainer => "a container",
    };
    let at = match &d.growth_line {
        Some(g) if g.source == crate::model::diagnose::LineSource::Cache => format!(
            "; the code that grew PyTorch's cache during the rise: {} (the bytes are whatever tensors \
             live in it now)",
            g.label
        ),
        Some(g) => format!(
            "; {}: {} in {} at {}",
            if g.during_rise {
                "made during the rise and live at the error"
            } else {
                "live at the error, by their line (PyTorch's allocation history, armed late in the \
                 rise)"
            },
            b(g.bytes),
            if g.source == crate::model::diagnose::LineSource::Tensors {
                counted(g.count, "tensor", "tensors")
            } else {
                counted(g.count, "allocation", "allocations")
            },
            g.label
        ),
        None => String::new(),
    };
    let held = d.holder.as_ref().map_or(String::new(), |h| {
        format!("; at the error {} held {}", holder_label(h), b(h.bytes))
    });
    format!(
        "{what} grew step after step up to this error ({}); without that rise the {} request would \
         have fitted ({} was missing){held}{at}",
        d.growth.as_ref().map_or(String::new(), growth_size),
        b(requested),
        b(missing)
    )
}

/// The framework's own limit: over it, or within it with no block as large as the request.
fn framework_limit_reason(
    framework: vramtrace_format::Framework,
    limit: u64,
    in_use: u64,
    requested: u64,
    largest: Option<u64>,
) -> String {
    use vramtrace_format::Framework;
    let (who, what, things) = match framework {
        Framework::Jax => (
            "JAX",
            "its pool, XLA_PYTHON_CLIENT_MEM_FRACTION of the GPU",
            "arrays",
        ),
        Framework::Torch => (
            "PyTorch",
            "the share torch.cuda.set_per_process_memory_fraction allows",
            "tensors",
        ),
    };
    let needed = in_use.saturating_add(requested);
    if needed > limit {
        return format!(
            "{who}'s allocator refused it before asking the driver, at the limit it keeps for itself ({what}): \
             {} in its {things} plus the {} request is {}, {} more than its {}",
            b(in_use),
            b(requested),
            b(needed),
            b(needed - limit),
            b(limit)
        );
    }
    format!(
        "{who}'s allocator refused it before asking the driver, within the limit it keeps for itself ({what}): \
         {} of its {} were free, enough for the {} request, but {}: the free bytes lie between live {things}",
        b(limit - in_use),
        b(limit),
        b(requested),
        largest.map_or("not as one block".to_string(), |l| format!(
            "its largest free block was {}",
            b(l)
        )),
    )
}

/// The vramtrace cap: it refused the request, or the job was over a cap that was not enforcing.
fn cap_reason(r: &CapReason, by: &str) -> String {
    match *r {
        CapReason::CapRefused {
            job_bytes,
            cap: Some(c),
            requested,
        } => format!(
            "the vramtrace cap refused it: the job held {} ({by}) of its {} cap and asked for {} more ({} in \
             all)",
            b(job_bytes),
            b(c),
            b(requested),
            b(job_bytes.saturating_add(requested))
        ),
        CapReason::CapRefused {
            job_bytes,
            cap: None,
            requested,
        } => format!(
            "the vramtrace cap refused it (the record does not say the cap): the job held {} ({by}) and asked \
             for {} more",
            b(job_bytes),
            b(requested)
        ),
        CapReason::OverCap {
            job_bytes,
            requested,
            cap,
        } => format!(
            "the job's {} ({by}) plus the {} request is {}, over the {} cap (the cap was not enforcing: the \
             device refused first)",
            b(job_bytes),
            b(requested),
            b(job_bytes.saturating_add(requested)),
            b(cap)
        ),
    }
}

/// Decided from the driver's free figure: what was free, and who held the rest.
fn driver_reason(r: &DriverReason, by: &str) -> String {
    match *r {
        DriverReason::FreeAtLeastRequest { free, requested } => format!(
            "the driver reported {} free, at least the {} asked for, yet refused it: no block that large \
             could be made from what was free",
            b(free),
            b(requested)
        ),
        DriverReason::PoolCachedAsyncFrees {
            free,
            shortfall,
            requested,
            async_freed,
        } => format!(
            "the driver reported {} free, {} short of the {} asked for, but the job had freed {} with \
             cuMemFreeAsync in the last second: its stream-ordered pool still held freed memory it could not \
             hand to this allocation",
            b(free),
            b(shortfall),
            b(requested),
            b(async_freed)
        ),
        DriverReason::OutsideExcess {
            outside,
            total,
            free,
            job_bytes,
            contexts_estimate,
            processes: n,
            excess,
            shortfall,
        } => format!(
            "{} lay outside the job's allocations ({} total - {} free - {} job); less an estimated {} for the \
             contexts of {}, {} was held by something else: at least the {} shortfall and at least a quarter \
             of the job's {}",
            b(outside),
            b(total),
            b(free),
            b(job_bytes),
            b(contexts_estimate),
            processes(n),
            b(excess),
            b(shortfall),
            b(job_bytes)
        ),
        DriverReason::JobFillsDevice {
            job_bytes,
            free,
            requested,
            shortfall,
            framework,
            outside,
            processes: n,
        } => {
            let tensors = framework.map_or(String::new(), |(alloc, cached)| {
                format!(
                    "; of it, the framework had {} in tensors and {} cached",
                    b(alloc),
                    b(cached)
                )
            });
            let out = outside.map_or(String::new(), |o| {
                format!(
                    "; outside the job lay {} (about {} of it the contexts of {}), leaving {} held by others: \
                     not enough to explain it",
                    b(o.bytes),
                    b(o.contexts_bytes),
                    processes(n),
                    b(o.excess_bytes)
                )
            });
            format!(
                "the job's own allocations held {} ({by}) with {} free: the {} request was {} \
                 short{tensors}{out}",
                b(job_bytes),
                b(free),
                b(requested),
                b(shortfall)
            )
        }
    }
}

/// Decided without the driver's free figure: from the device's size, or the job's bytes alone.
fn no_figures_reason(r: &NoFiguresReason) -> String {
    match *r {
        NoFiguresReason::NoFiguresPool {
            job_bytes,
            requested,
            contexts_estimate,
            total,
            async_freed,
        } => format!(
            "the driver's free memory is unknown; the job's {} plus the {} request and an estimated {} of \
             contexts fit in the device's {}, and the job had freed {} with cuMemFreeAsync in the last \
             second: its pool most likely held it",
            b(job_bytes),
            b(requested),
            b(contexts_estimate),
            b(total),
            b(async_freed)
        ),
        NoFiguresReason::NoFiguresFitsTotal {
            job_bytes,
            requested,
            contexts_estimate,
            total,
        } => format!(
            "the driver's free memory is unknown; the job's {} plus the {} request and an estimated {} of \
             contexts fit in the device's {}, so memory outside the job's allocations must have filled it \
             (other processes most likely; fragmentation cannot be ruled out without the driver's figures)",
            b(job_bytes),
            b(requested),
            b(contexts_estimate),
            b(total)
        ),
        NoFiguresReason::NoFiguresOverTotal {
            job_bytes,
            requested,
            contexts_estimate,
            total,
        } => format!(
            "the driver's free memory is unknown; the job's {} plus the {} request and an estimated {} of \
             contexts exceed the device's {}",
            b(job_bytes),
            b(requested),
            b(contexts_estimate),
            b(total)
        ),
        NoFiguresReason::NothingKnown {
            job_bytes,
            requested,
        } => format!(
            "neither the driver's free memory nor the device's size is known: decided from the job's own {} \
             and the {} request alone (nothing points elsewhere)",
            b(job_bytes),
            b(requested)
        ),
    }
}

/// The findings a short form shows: all but those its key figures already say (how far it was from fitting,
/// the framework's split).
pub fn short_findings(d: &Diagnosis) -> impl Iterator<Item = &Finding> {
    // Each fact once: a growth that is the cause is said in the cause; the backward thread in the headline.
    let growth_is_cause = d.cause == Cause::Growth;
    d.findings.iter().filter(move |f| match f {
        Finding::Fit { .. } | Finding::FrameworkFigures { .. } | Finding::BackwardThread { .. } => {
            false
        }
        Finding::LeakTrend(_) | Finding::AllocatedLeakTrend(_) => !growth_is_cause,
        _ => true,
    })
}

/// The few figures that prove a verdict, in the order a reader checks them: what was asked, what the job held,
/// the cap, what the device had free, what was needed against what could be given, PyTorch's split, and what
/// grew. Every output's short form shows these (the rest is the full report's and the JSON's).
pub fn key_figures(s: &OomSnapshot, d: &Diagnosis) -> Vec<(&'static str, u64)> {
    let mut v = vec![
        ("requested", s.requested_bytes),
        ("job live", d.job_live_bytes),
    ];
    v.extend(d.cap_bytes.map(|c| ("cap", c)));
    v.extend(s.device_free_bytes.map(|f| ("device free", f)));
    // What was missing, not "needed" beside "could give": two figures that round alike read as a contradiction
    // for a request that was refused. The growth, where there is one, is the cause's or a finding's figure.
    // Nothing missing (fragmentation, a refusal within the numbers): no figure rather than "0 B".
    if let Some(m) = d
        .available_bytes
        .map(|avail| d.needed_bytes.saturating_sub(avail))
        .filter(|&m| m > 0)
    {
        v.push(("missing", m));
    }
    if let Some(f) = s.framework_figures {
        v.push(("allocated (tensors)", f.allocated));
        v.push(("reserved (segments)", f.reserved));
    }
    v
}

/// Why events were lost, from the causes the collector wrote beside its counts: "its ring was full", or, for a
/// trace without them, what a drop was before causes were written.
pub fn events_lost(a: &crate::model::Analysis) -> String {
    use vramtrace_format::LossCause;
    let mut why: Vec<&str> = Vec::new();
    for p in &a.processes {
        for (c, _) in &p.lost {
            let w = match c {
                LossCause::RingFull => "a ring was full",
                LossCause::CollectorStalled => "the collector was stalled",
                LossCause::DiedMidRecord => "a process ended while writing them",
                LossCause::Refused | LossCause::DiedMidNonEvent => continue,
            };
            if !why.contains(&w) {
                why.push(w);
            }
        }
    }
    let why = if why.is_empty() {
        "dropped by the shim".to_string()
    } else {
        format!("lost ({})", why.join("; "))
    };
    format!(
        "{} {why}",
        counted(a.dropped_events, "event was", "events were")
    )
}

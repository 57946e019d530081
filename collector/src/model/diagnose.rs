//! Telling the causes of an out-of-memory event apart, from its snapshot: the cause (exactly one, with the rule
//! and the figures that decided it), the findings beside it, and advice fitted to both. docs/OOM.md states the
//! rules; keep the two in step.

mod advice;
mod growth_line;

pub use growth_line::{growth_size_text, GrowthKind, GrowthLine};

use crate::model::analysis::{Analysis, LeakTrend, OomSnapshot};
use crate::units::{bytes, count};
use advice::advice;
use growth_line::growth_line;

/// The estimate of one process's CUDA context, module and library memory on a device (never seen by the trace).
pub const CONTEXT_ESTIMATE_BYTES: u64 = 500 << 20;
/// A suggested cap is rounded up to a multiple of this (0.25 GiB).
pub const CAP_STEP_BYTES: u64 = 1 << 28;
/// Fragmentation of PyTorch's cache is the cause only when the cache (reserved - allocated) is at least this
/// share of what it reserved.
pub const CACHE_SHARE_PCT: u64 = 10;
/// The cap's ledger and the trace disagreeing by more than this is a finding.
pub const LEDGER_SLACK_BYTES: u64 = 1 << 20;

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
        }
    }

    /// A few words for people.
    pub fn title(self) -> &'static str {
        match self {
            Cause::Cap => "the vramtrace cap",
            Cause::Fragmentation => "fragmentation",
            Cause::FragmentationCache => "fragmentation of PyTorch's cache",
            Cause::RequestTooLarge => "a request larger than the device or the cap",
            Cause::External => "memory held outside the job",
            Cause::Pressure => "memory pressure from the job itself",
            Cause::HostMemory => "pinned host memory ran out (not GPU memory)",
            Cause::Growth => "memory growing step after step",
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
        settings: String,
    },
    /// Allocated bytes (the framework's figure, which its cache hides from the driver) rising across cycles.
    AllocatedLeakTrend(LeakTrend),
    /// The allocator flushed its cache and retried before the error: the guides' danger zone.
    AllocRetries { count: u64 },
    /// The failing allocation was made on autograd's backward thread.
    BackwardThread { thread: String },
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
        }
    }

    /// One sentence for people.
    pub fn text(&self) -> String {
        match self {
            Finding::Fit {
                needed_bytes,
                available_bytes,
                short_bytes,
                limited_by,
            } => {
                let what = if *limited_by == "cap" {
                    "the cap"
                } else {
                    "the device"
                };
                if *short_bytes == 0 {
                    format!(
                        "The job needed {} at most up to this point (its peak, or its bytes plus the request) \
                         and {what} could give it {}: it fitted by the numbers.",
                        bytes(*needed_bytes),
                        bytes(*available_bytes)
                    )
                } else {
                    format!(
                        "The job needed {} at most up to this point (its peak, or its bytes plus the request); \
                         {what} could give it {}: {} short of fitting.",
                        bytes(*needed_bytes),
                        bytes(*available_bytes),
                        bytes(*short_bytes)
                    )
                }
            }
            Finding::LeakTrend(l) => leak_text(l),
            Finding::PoolCache {
                freed_bytes,
                shortfall_bytes,
            } => {
                let vs = match shortfall_bytes {
                    Some(s) if freed_bytes >= s => {
                        format!(", at least the {} shortfall", bytes(*s))
                    }
                    Some(s) => format!(" (the shortfall was {})", bytes(*s)),
                    None => String::new(),
                };
                format!(
                    "The job freed {} with cuMemFreeAsync in the last second before the event{vs}; its \
                     stream-ordered pool may still have held that memory cached.",
                    bytes(*freed_bytes)
                )
            }
            Finding::LedgerDiffers {
                ledger_bytes,
                trace_bytes,
            } => format!(
                "The cap's ledger counted {} for the job on this device, the trace {} (dropped events, or a dead \
                 process's share not yet reclaimed); the ledger's figure was used.",
                bytes(*ledger_bytes),
                bytes(*trace_bytes)
            ),
            Finding::DroppedEvents { count } => format!(
                "{count} events were dropped by the shim before this point: the job's bytes from the trace can \
                 be low."
            ),
            Finding::NoDriverFigures => "The driver could not say how much memory was free (no current \
                                         context): the cause was decided from the trace's figures alone."
                .to_string(),
            Finding::FrameworkFigures {
                allocated_bytes,
                reserved_bytes,
                inactive_split_bytes,
                largest_free_block_bytes,
                free_in_live_segments_bytes,
                alloc_retries,
                settings,
            } => {
                let mut t = format!(
                    "PyTorch's allocator in this process: {} allocated in tensors, {} reserved ({} cached, \
                     {} of it inactive split)",
                    bytes(*allocated_bytes),
                    bytes(*reserved_bytes),
                    bytes(reserved_bytes.saturating_sub(*allocated_bytes)),
                    bytes(*inactive_split_bytes)
                );
                if let Some(l) = largest_free_block_bytes {
                    t.push_str(&format!("; largest free block {}", bytes(*l)));
                }
                if let Some(f) = free_in_live_segments_bytes {
                    t.push_str(&format!(
                        "; {} free inside segments that hold live tensors (it cannot give those back)",
                        bytes(*f)
                    ));
                }
                t.push_str(&format!(
                    "; {alloc_retries} cache flush{} and retr{}; settings: {settings}.",
                    if *alloc_retries == 1 { "" } else { "es" },
                    if *alloc_retries == 1 { "y" } else { "ies" }
                ));
                t
            }
            Finding::AllocatedLeakTrend(l) => format!(
                "Allocated bytes (PyTorch's own figure; its cache hides them from the driver) grew: {}",
                leak_text(l).trim_start_matches("Growth: ")
            ),
            Finding::AllocRetries { count } => format!(
                "PyTorch flushed its cache and retried a driver allocation {count} time{} before this \
                 error: the allocator was already short of memory (the guides' early warning).",
                if *count == 1 { "" } else { "s" }
            ),
            Finding::BackwardThread { thread } => format!(
                "The failing allocation was made on autograd's backward thread ({thread}): the backward \
                 pass ran out of memory, not the forward pass."
            ),
        }
    }
}

/// One sentence on a growth finding: its size, then what grew and where.
pub fn leak_text(l: &LeakTrend) -> String {
    let mut s = format!("Growth: {}.", growth_size_text(l));
    if !l.groups.is_empty() {
        let g: Vec<String> = l
            .groups
            .iter()
            .take(3)
            .map(|g| format!("{} x {} {}", g.count, bytes(g.bytes_each), g.api.name()))
            .collect();
        s.push_str(&format!(
            " Made during the rise and still live: {}.",
            g.join(", ")
        ));
    }
    if !l.sites.is_empty() {
        let g: Vec<String> = l
            .sites
            .iter()
            .take(3)
            .map(|g| format!("{} ({} in {})", g.label, bytes(g.bytes), count(g.count)))
            .collect();
        s.push_str(&format!(" Their call sites: {}.", g.join("; ")));
    }
    s
}

/// The cause of one out-of-memory event, the figures that decided it, findings and advice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    pub cause: Cause,
    /// What the diagnosis could see: `driver` (the driver's calls only) or `driver+pytorch` / `driver+jax`
    /// (the framework allocator's own figures too, from the Python bridge).
    pub view: &'static str,
    /// Which rule decided (docs/OOM.md): `cap_refused`, `over_cap`, `free_at_least_request`,
    /// `pool_cached_async_frees`, `outside_excess`, `job_fills_device`, and without the driver's figures
    /// `no_driver_figures_pool`, `no_driver_figures_fits_total`, `no_driver_figures`.
    pub rule: &'static str,
    /// The deciding figures in a sentence.
    pub reason: String,
    /// The job's bytes in use on the device: the cap's ledger when the record has it, else the trace's.
    pub job_live_bytes: u64,
    /// `"ledger"` or `"trace"`.
    pub job_live_source: &'static str,
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
    pub findings: Vec<Finding>,
    pub advice: Vec<String>,
}

/// Decides the cause of out-of-memory snapshot `s` of analysis `a`.
pub fn diagnose(a: &Analysis, s: &OomSnapshot) -> Diagnosis {
    let dev = s.device.and_then(|d| a.device(d));
    let req = s.requested_bytes;
    let (job, source) = match s.ledger_job_bytes {
        Some(b) => (b, "ledger"),
        None => (s.job_live_trace_bytes, "trace"),
    };
    let by = if source == "ledger" {
        "by the cap's ledger"
    } else {
        "by the trace"
    };
    let cap = s.cap_bytes.or(dev.and_then(|d| d.cap_bytes));
    let free = s.device_free_bytes;
    let total = s.device_total_bytes;
    let ctx = CONTEXT_ESTIMATE_BYTES.saturating_mul(s.job_processes_on_device);
    let shortfall = free.map(|f| req.saturating_sub(f));
    let outside = match (total, free) {
        (Some(t), Some(f)) => Some(t.saturating_sub(f).saturating_sub(job)),
        _ => None,
    };
    let excess = outside.map(|o| o.saturating_sub(ctx));
    let needed = s.job_peak_bytes.max(job.saturating_add(req));
    let device_room = free.map(|f| f.saturating_add(job));
    let (available, limited_by) = match (cap, device_room) {
        (Some(c), Some(r)) if c <= r => (Some(c), "cap"),
        (_, Some(r)) => (Some(r), "device"),
        (Some(c), None) => (Some(c), "cap"),
        (None, None) => (None, "device"),
    };
    let short = available.map(|av| needed.saturating_sub(av));
    let suggested = needed
        .div_ceil(CAP_STEP_BYTES)
        .max(1)
        .saturating_mul(CAP_STEP_BYTES);
    let recent = s.async_freed_recent_bytes;
    let n = s.job_processes_on_device;
    let procs = format!("{n} job process{}", if n == 1 { "" } else { "es" });

    let b = bytes;
    let fw = s.framework.as_ref();
    let fig = s.framework_figures;
    let known_total = total.or(dev.and_then(|d| d.total_bytes));
    // The most any single request could get: the cap or the device, whichever is smaller.
    let (limit_alone, limit_what) = match (cap, known_total) {
        (Some(c), Some(t)) if c <= t => (Some(c), "the cap"),
        (_, Some(t)) => (Some(t), "the device's total"),
        (Some(c), None) => (Some(c), "the cap"),
        (None, None) => (None, ""),
    };
    // What a new segment could get: the device's free memory, and under a cap the cap's room.
    let room = {
        let dev_room = free.or(fw.and_then(|f| f.device_free_bytes));
        let cap_room = cap.map(|c| c.saturating_sub(job));
        match (dev_room, cap_room) {
            (Some(d), Some(c)) => Some(d.min(c)),
            (d, c) => d.or(c),
        }
    };
    // PyTorch's cache had the bytes that were short, but no block as large as the request.
    let cache_frag = fig.zip(fw).and_then(|(f, o)| {
        let largest = o.largest_free_block?;
        let short = req.saturating_sub(room?);
        let cached = f.cached();
        // The cache must be a real share of what is reserved: a few stray blocks beside a job that filled
        // its cap or device with live tensors are not why it failed.
        let sizeable = cached.saturating_mul(100) >= f.reserved.saturating_mul(CACHE_SHARE_PCT);
        (short > 0 && cached >= short && sizeable && largest < req)
            .then_some((f, cached, largest, short))
    });
    // Growth: the bytes in use rose step after step up to this error, by at least what was missing (without
    // the rise it would have fitted). PyTorch's allocated bytes when the bridge gave them: its cache hides
    // the tensors' rise from the driver.
    // What was missing: short of fitting, else the driver's shortfall; the request itself only when the driver
    // said nothing of its free memory. Nothing missing (the device had the bytes free): no growth verdict.
    let missing = short
        .filter(|&x| x > 0)
        .or(shortfall.filter(|&x| x > 0))
        .or(free.is_none().then_some(req));
    let grew = s
        .framework_leak
        .as_ref()
        .map(|l| (l, "PyTorch's allocated bytes"))
        .or(s.leak.as_ref().map(|l| (l, "the job's bytes in use")))
        .filter(|(l, _)| missing.is_some_and(|m| l.rise_bytes >= m))
        // Lost events can be lost frees, which look exactly like memory kept: no growth verdict on them.
        .filter(|_| s.dropped_events == 0);
    let line = grew.and_then(|(l, _)| growth_line(a, s, l));
    let (cause, rule, reason) = if s.on_host {
        (
            Cause::HostMemory,
            "host_memory",
            format!(
                "cuMemCreate asked for {} of pinned memory on the host (a host location, not a GPU) and the \
                 driver could not give it: the host's memory, or its limit on locked memory, ran out; no \
                 GPU's memory was the limit",
                b(req)
            ),
        )
    } else if let Some(l) = limit_alone.filter(|&l| req > l) {
        (
            Cause::RequestTooLarge,
            "request_exceeds_limit",
            format!(
                "the request alone ({}) is larger than {limit_what} ({}): no amount of freeing other memory \
                 makes it fit",
                b(req),
                b(l)
            ),
        )
    } else if let Some((f, cached, largest, short)) = cache_frag {
        let by_whom = if s.cap_refused {
            "the cap"
        } else {
            "the driver"
        };
        (
            Cause::FragmentationCache,
            "cache_fragmented",
            format!(
                "PyTorch held {} reserved but only {} in tensors: {} cached, at least the {} that {by_whom} \
                 could not give, yet its largest free block was {}, smaller than the {} request (the free \
                 bytes lie between live tensors, in segments it cannot release)",
                b(f.reserved),
                b(f.allocated),
                b(cached),
                b(short),
                b(largest),
                b(req)
            ),
        )
    } else if let Some((l, what)) = grew {
        let at = match &line {
            Some(g) if g.source == "cache" => format!(
                "; the code that grew PyTorch's cache during the rise: {} (the bytes are whatever tensors \
                 live in it now)",
                g.label
            ),
            Some(g) => format!(
                "; {}: {} in {} at {}",
                if g.during_rise {
                    "made during the rise and live at the error"
                } else {
                    "live at the error, by their line (PyTorch's allocation history, armed late in the rise)"
                },
                b(g.bytes),
                crate::units::counted(
                    g.count,
                    if g.source == "tensors" { "tensor" } else { "allocation" },
                    if g.source == "tensors" { "tensors" } else { "allocations" }
                ),
                g.label
            ),
            None => String::new(),
        };
        (
            Cause::Growth,
            "growth",
            format!(
                "{what} grew step after step up to this error ({}); without that rise the {} request \
                 would have fitted ({} was missing){at}",
                growth_size_text(l),
                b(req),
                b(missing.unwrap_or(req))
            ),
        )
    } else if s.cap_refused {
        let reason = match cap {
            Some(c) => format!(
                "the vramtrace cap refused it: the job held {} ({by}) of its {} cap and asked for {} more \
                 ({} in all)",
                b(job),
                b(c),
                b(req),
                b(job.saturating_add(req))
            ),
            None => format!(
                "the vramtrace cap refused it (the record does not say the cap): the job held {} ({by}) \
                 and asked for {} more",
                b(job),
                b(req)
            ),
        };
        (Cause::Cap, "cap_refused", reason)
    } else if let Some(c) = cap.filter(|&c| job.saturating_add(req) > c) {
        (
            Cause::Cap,
            "over_cap",
            format!(
                "the job's {} ({by}) plus the {} request is {}, over the {} cap (the cap was not \
                 enforcing: the device refused first)",
                b(job),
                b(req),
                b(job.saturating_add(req)),
                b(c)
            ),
        )
    } else if let Some(f) = free {
        let sf = req.saturating_sub(f);
        if f >= req {
            (
                Cause::Fragmentation,
                "free_at_least_request",
                format!(
                    "the driver reported {} free, at least the {} asked for, yet refused it: no block that \
                     large could be made from what was free",
                    b(f),
                    b(req)
                ),
            )
        } else if recent > 0 && recent >= sf {
            (
                Cause::Fragmentation,
                "pool_cached_async_frees",
                format!(
                    "the driver reported {} free, {} short of the {} asked for, but the job had freed {} with \
                     cuMemFreeAsync in the last second: its stream-ordered pool still held freed memory it \
                     could not hand to this allocation",
                    b(f),
                    b(sf),
                    b(req),
                    b(recent)
                ),
            )
        } else if let Some(ex) = excess.filter(|&ex| ex >= sf && ex >= job / 4) {
            (
                Cause::External,
                "outside_excess",
                format!(
                    "{} lay outside the job's allocations ({} total - {} free - {} job); less an estimated {} \
                     for the contexts of {procs}, {} was held by something else: at least the {} shortfall \
                     and at least a quarter of the job's {}",
                    b(outside.unwrap_or(0)),
                    b(total.unwrap_or(0)),
                    b(f),
                    b(job),
                    b(ctx),
                    b(ex),
                    b(sf),
                    b(job)
                ),
            )
        } else {
            let out = match (outside, excess) {
                (Some(o), Some(ex)) => format!(
                    "; outside the job lay {} (about {} of it the contexts of {procs}), leaving {} held by \
                     others: not enough to explain it",
                    b(o),
                    b(o.min(ctx)),
                    b(ex)
                ),
                _ => String::new(),
            };
            let tensors = match (fig, s.framework_job) {
                (Some(_), Some((alloc, res))) => format!(
                    "; of it, the framework had {} in tensors and {} cached",
                    b(alloc),
                    b(res.saturating_sub(alloc))
                ),
                _ => String::new(),
            };
            (
                Cause::Pressure,
                "job_fills_device",
                format!(
                    "the job's own allocations held {} ({by}) with {} free: the {} request was {} \
                     short{tensors}{out}",
                    b(job),
                    b(f),
                    b(req),
                    b(sf)
                ),
            )
        }
    } else {
        let known_total = total.or(dev.and_then(|d| d.total_bytes));
        match known_total {
            Some(t) if job.saturating_add(req).saturating_add(ctx) <= t => {
                if recent >= req {
                    (
                        Cause::Fragmentation,
                        "no_driver_figures_pool",
                        format!(
                            "the driver's free memory is unknown; the job's {} plus the {} request and an \
                             estimated {} of contexts fit in the device's {}, and the job had freed {} with \
                             cuMemFreeAsync in the last second: its pool most likely held it",
                            b(job),
                            b(req),
                            b(ctx),
                            b(t),
                            b(recent)
                        ),
                    )
                } else {
                    (
                        Cause::External,
                        "no_driver_figures_fits_total",
                        format!(
                            "the driver's free memory is unknown; the job's {} plus the {} request and an \
                             estimated {} of contexts fit in the device's {}, so memory outside the job's \
                             allocations must have filled it (other processes most likely; fragmentation \
                             cannot be ruled out without the driver's figures)",
                            b(job),
                            b(req),
                            b(ctx),
                            b(t)
                        ),
                    )
                }
            }
            Some(t) => (
                Cause::Pressure,
                "no_driver_figures",
                format!(
                    "the driver's free memory is unknown; the job's {} plus the {} request and an estimated \
                     {} of contexts exceed the device's {}",
                    b(job),
                    b(req),
                    b(ctx),
                    b(t)
                ),
            ),
            None => (
                Cause::Pressure,
                "no_driver_figures",
                format!(
                    "neither the driver's free memory nor the device's size is known: decided from the job's \
                     own {} and the {} request alone (nothing points elsewhere)",
                    b(job),
                    b(req)
                ),
            ),
        }
    };

    let mut findings = Vec::new();
    if let Some(f) = fig {
        let settings = match fw {
            Some(o) => settings_text(o),
            None => "unknown (no out-of-memory record from the framework)".to_string(),
        };
        findings.push(Finding::FrameworkFigures {
            allocated_bytes: f.allocated,
            reserved_bytes: f.reserved,
            inactive_split_bytes: f.inactive_split,
            largest_free_block_bytes: fw.and_then(|o| o.largest_free_block),
            free_in_live_segments_bytes: fw.and_then(|o| o.free_in_live_segments),
            alloc_retries: f.alloc_retries,
            settings,
        });
        if f.alloc_retries > 0 {
            findings.push(Finding::AllocRetries {
                count: f.alloc_retries,
            });
        }
    }
    if let Some(o) = fw.filter(|o| o.on_backward_thread()) {
        findings.push(Finding::BackwardThread {
            thread: o.thread.clone().unwrap_or_default(),
        });
    }
    if let (Some(av), Some(sh)) = (available, short) {
        findings.push(Finding::Fit {
            needed_bytes: needed,
            available_bytes: av,
            short_bytes: sh,
            limited_by,
        });
    }
    // With the framework's figures the leak is read from allocated bytes (the cache hides it from the
    // driver); the driver's own trend is kept when it shows one too.
    if let Some(l) = &s.framework_leak {
        findings.push(Finding::AllocatedLeakTrend(l.clone()));
    }
    // The driver's own growth, unless PyTorch's allocated bytes told it: under a caching allocator the driver
    // sees the cache grow, and its call sites are the code that grew it, not the owners of the tensors.
    if let Some(l) = s.leak.as_ref().filter(|_| s.framework_leak.is_none()) {
        findings.push(Finding::LeakTrend(l.clone()));
    }
    if recent > 0 && !rule.ends_with("pool") && rule != "pool_cached_async_frees" {
        findings.push(Finding::PoolCache {
            freed_bytes: recent,
            shortfall_bytes: shortfall,
        });
    }
    if let Some(l) = s.ledger_job_bytes {
        if l.abs_diff(s.job_live_trace_bytes) > LEDGER_SLACK_BYTES {
            findings.push(Finding::LedgerDiffers {
                ledger_bytes: l,
                trace_bytes: s.job_live_trace_bytes,
            });
        }
    }
    if s.dropped_events > 0 {
        findings.push(Finding::DroppedEvents {
            count: s.dropped_events,
        });
    }
    // Host memory has no driver figures to miss.
    if free.is_none() && !s.on_host {
        findings.push(Finding::NoDriverFigures);
    }

    let view = match (fig, fw.map(|o| o.framework)) {
        (None, None) => "driver",
        (_, Some(vramtrace_format::Framework::Jax)) => "driver+jax",
        _ => {
            let pid_jax = a.process(s.pid).is_some_and(|p| {
                p.framework
                    .iter()
                    .any(|f| f.framework == vramtrace_format::Framework::Jax)
            });
            if pid_jax {
                "driver+jax"
            } else {
                "driver+pytorch"
            }
        }
    };
    let mut d = Diagnosis {
        view,
        cause,
        rule,
        reason,
        job_live_bytes: job,
        job_live_source: source,
        cap_bytes: cap,
        total_bytes: total.or(dev.and_then(|d| d.total_bytes)),
        shortfall_bytes: shortfall,
        outside_job_bytes: outside,
        context_estimate_bytes: ctx,
        outside_excess_bytes: excess,
        needed_bytes: needed,
        available_bytes: available,
        short_of_fitting_bytes: short,
        suggested_cap_bytes: suggested,
        growth: (cause == Cause::Growth)
            .then(|| grew.map(|(l, _)| l.clone()))
            .flatten(),
        growth_line: line.filter(|_| cause == Cause::Growth),
        findings,
        advice: Vec::new(),
    };
    d.advice = advice(a, s, &d);
    d
}

/// The allocator settings an out-of-memory record carried, in a few words.
pub fn settings_text(o: &crate::model::replay::framework::FrameworkOom) -> String {
    let mut v = Vec::new();
    if let Some(b) = &o.backend {
        v.push(format!("backend {b}"));
    }
    v.push(match o.expandable_segments {
        Some(true) => "expandable segments on".to_string(),
        Some(false) | None => "expandable segments off".to_string(),
    });
    v.push(match o.max_split_size {
        Some(m) => format!("max split size {}", bytes(m)),
        None => "no max split size".to_string(),
    });
    if let Some(g) = &o.garbage_collection_threshold {
        v.push(format!("garbage collection threshold {g}"));
    }
    if let Some(c) = o.alloc_conf.as_deref().filter(|c| !c.is_empty()) {
        v.push(format!("PYTORCH_CUDA_ALLOC_CONF={c}"));
    }
    v.join(", ")
}

/// `20.25GiB`, `8GiB`: a cap spec for `--cap`.
pub fn cap_spec(b: u64) -> String {
    let s = format!("{:.2}", b as f64 / (1u64 << 30) as f64);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}GiB")
}

/// The findings a short form shows: all but those its key figures already say (how far it was from fitting,
/// the framework's split).
pub fn short_findings(d: &Diagnosis) -> impl Iterator<Item = &Finding> {
    d.findings
        .iter()
        .filter(|f| !matches!(f, Finding::Fit { .. } | Finding::FrameworkFigures { .. }))
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
    v.push(("needed", d.needed_bytes));
    v.extend(d.available_bytes.map(|a| ("could give", a)));
    if let Some(f) = s.framework_figures {
        v.push(("allocated (tensors)", f.allocated));
        v.push(("reserved (segments)", f.reserved));
    }
    v.extend(d.growth.as_ref().map(|g| ("grew", g.rise_bytes)));
    v
}

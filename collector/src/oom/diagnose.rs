//! Telling the causes of an out-of-memory event apart, from its snapshot: the cause (exactly one, with the rule
//! and the figures that decided it), the findings beside it, and advice fitted to both. docs/OOM.md states the
//! rules; keep the two in step.

use crate::model::{Analysis, LeakTrend, OomSnapshot};
use crate::out_text::units::{bytes, count};

/// The estimate of one process's CUDA context, module and library memory on a device (never seen by the trace).
pub const CONTEXT_ESTIMATE_BYTES: u64 = 500 << 20;
/// A suggested cap is rounded up to a multiple of this (0.25 GiB).
pub const CAP_STEP_BYTES: u64 = 1 << 28;
/// The cap's ledger and the trace disagreeing by more than this is a finding.
pub const LEDGER_SLACK_BYTES: u64 = 1 << 20;

/// Why the allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The vramtrace cap refused it, or the job's bytes plus the request were over the cap.
    Cap,
    /// The device had the bytes free (or the job's pools held them) but not as one block the allocation could get.
    Fragmentation,
    /// Memory held outside the job filled the device.
    External,
    /// The job's own allocations filled what the device could give.
    Pressure,
}

impl Cause {
    /// The JSON name.
    pub fn key(self) -> &'static str {
        match self {
            Cause::Cap => "cap",
            Cause::Fragmentation => "fragmentation",
            Cause::External => "external",
            Cause::Pressure => "pressure",
        }
    }

    /// A few words for people.
    pub fn title(self) -> &'static str {
        match self {
            Cause::Cap => "the vramtrace cap",
            Cause::Fragmentation => "fragmentation",
            Cause::External => "memory held outside the job",
            Cause::Pressure => "memory pressure from the job itself",
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
        }
    }
}

/// One sentence on a leak trend.
pub fn leak_text(l: &LeakTrend) -> String {
    let first = l.minima[0];
    let last = l.minima[l.minima.len() - 1];
    let mut s = format!(
        "Leak trend: the low points between peaks rose over {} cycles, from {} to {} (+{}).",
        l.minima.len(),
        bytes(first.bytes),
        bytes(last.bytes),
        bytes(l.rise_bytes)
    );
    if !l.groups.is_empty() {
        let g: Vec<String> = l
            .groups
            .iter()
            .take(3)
            .map(|g| format!("{} x {} {}", g.count, bytes(g.bytes_each), g.api.name()))
            .collect();
        s.push_str(&format!(
            " Made between the first and last low point and still live: {}.",
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
    let suggested = needed.div_ceil(CAP_STEP_BYTES).max(1) * CAP_STEP_BYTES;
    let recent = s.async_freed_recent_bytes;
    let n = s.job_processes_on_device;
    let procs = format!("{n} job process{}", if n == 1 { "" } else { "es" });

    let b = bytes;
    let (cause, rule, reason) = if s.cap_refused {
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
            (
                Cause::Pressure,
                "job_fills_device",
                format!(
                    "the job's own allocations held {} ({by}) with {} free: the {} request was {} \
                     short{out}",
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
    if let (Some(av), Some(sh)) = (available, short) {
        findings.push(Finding::Fit {
            needed_bytes: needed,
            available_bytes: av,
            short_bytes: sh,
            limited_by,
        });
    }
    if let Some(l) = &s.leak {
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
    if free.is_none() {
        findings.push(Finding::NoDriverFigures);
    }

    let mut d = Diagnosis {
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
        findings,
        advice: Vec::new(),
    };
    d.advice = advice(a, s, &d);
    d
}

/// `20.25GiB`, `8GiB`: a cap spec for `--cap`.
pub fn cap_spec(b: u64) -> String {
    let s = format!("{:.2}", b as f64 / (1u64 << 30) as f64);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}GiB")
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".to_string();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

fn advice(a: &Analysis, s: &OomSnapshot, d: &Diagnosis) -> Vec<String> {
    let b = bytes;
    let mut v = Vec::new();
    let gpu = s
        .device
        .map_or("the GPU".to_string(), |d| format!("GPU {d}"));
    match d.cause {
        Cause::Pressure => {
            let shed = d
                .short_of_fitting_bytes
                .filter(|&x| x > 0)
                .or(d.shortfall_bytes)
                .unwrap_or(s.requested_bytes);
            v.push(format!(
                "Shed at least {:.2} GiB on {gpu} ({} bytes, {} of the {} the job needed at its peak); more \
                 to leave room for the allocator's rounding and caching.",
                shed as f64 / (1u64 << 30) as f64,
                count(shed),
                pct(shed, d.needed_bytes),
                b(d.needed_bytes)
            ));
            v.push(
                "Smaller batch, or micro-batching with gradient accumulation: the same effective batch with \
                 activations for one micro-batch at a time."
                    .to_string(),
            );
            v.push(
                "Activation checkpointing (torch.utils.checkpoint): recompute activations in the backward pass \
                 instead of keeping them."
                    .to_string(),
            );
            v.push(
                "Mixed precision (bf16/fp16 autocast): halves activation memory, and weights too when kept \
                 in bf16."
                    .to_string(),
            );
            v.push(
                "Offload optimizer state to host memory (DeepSpeed ZeRO-Offload, FSDP CPU offload)."
                    .to_string(),
            );
            v.push(
                "Shard parameters, gradients and optimizer state across GPUs (FSDP, DeepSpeed ZeRO)."
                    .to_string(),
            );
            if s.leak.is_some() {
                v.push(
                    "Bytes in use rose cycle over cycle before the event (see the leak finding): fix what \
                     is kept across steps first (tensors stored in lists, losses accumulated with their graph)."
                        .to_string(),
                );
            }
        }
        Cause::Fragmentation => {
            v.push(
                "PyTorch: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, so segments grow in place instead \
                 of needing new contiguous blocks."
                    .to_string(),
            );
            v.push(
                "Trim pools at phase boundaries: torch.cuda.empty_cache() (PyTorch), cuMemPoolTrimTo(pool, 0) \
                 for stream-ordered pools (or lower their CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)."
                    .to_string(),
            );
            v.push(
                "Allocate large persistent buffers first (weights, optimizer state, KV cache), before the \
                 churn of short-lived ones breaks up the free memory."
                    .to_string(),
            );
        }
        Cause::External => {
            let held = d.outside_excess_bytes.map_or("memory".to_string(), b);
            v.push(format!(
                "{held} (estimated) on {gpu} was held outside the job, by processes vramtrace did not trace: \
                 their pids are unknown to it. Inside the job: none to blame (its processes held {} there).",
                b(d.job_live_bytes)
            ));
            v.push(
                "Who holds the GPU: nvidia-smi --query-compute-apps=pid,used_memory --format=csv"
                    .to_string(),
            );
            v.push(format!(
                "Move the job to a free GPU (CUDA_VISIBLE_DEVICES), or stop the other process on {gpu}."
            ));
        }
        Cause::Cap => {
            let flag = if a.devices.len() <= 1 {
                cap_spec(d.suggested_cap_bytes)
            } else {
                match s.device {
                    Some(dv) => format!("{dv}={}", cap_spec(d.suggested_cap_bytes)),
                    None => cap_spec(d.suggested_cap_bytes),
                }
            };
            v.push(format!(
                "A cap of {} would have fitted the job's peak so far ({} = the larger of its peak and its \
                 bytes plus the request, rounded up to 0.25 GiB): --cap {flag}",
                b(d.suggested_cap_bytes),
                b(d.needed_bytes)
            ));
            if let Some(t) = d.total_bytes {
                if d.suggested_cap_bytes > t {
                    v.push(format!(
                        "That is more than the device's {}: the job itself must shed memory (smaller batch, \
                         checkpointing, mixed precision, sharding).",
                        b(t)
                    ));
                }
            }
            v.push(
                "To measure first: --cap-mode warn lets over-cap allocations through and flags them in the \
                 trace."
                    .to_string(),
            );
        }
    }
    v
}

//! Telling the causes of an out-of-memory event apart, from its snapshot: the cause (exactly one, with the rule
//! and the figures that decided it), the findings beside it, and advice fitted to both. docs/OOM.md states the
//! rules; keep the two in step.
//!
//! All of it is data: the reporters say it (reporters/prose.rs holds every sentence), so text, JSON and HTML
//! say the same thing in the same words.

mod advice;
mod growth_line;
mod reason;

pub use advice::Advice;
pub use growth_line::{GrowthKind, GrowthLine};
pub use reason::{GrowthOf, Limit, Outside, Reason};

use crate::model::analysis::holders::Holder;
use crate::model::analysis::{Analysis, LeakTrend, OomSnapshot};
use advice::advice;
use growth_line::growth_line;

/// The estimate of one process's CUDA context, module and library memory on a device (never seen by the trace).
pub const CONTEXT_ESTIMATE_BYTES: u64 = 500 << 20;
/// A suggested cap is rounded up to a multiple of this (0.25 GiB).
pub const CAP_STEP_BYTES: u64 = 1 << 28;
/// Fragmentation of PyTorch's cache is the cause only when the cache (reserved - allocated) is at least this
/// share of what it reserved.
pub const CACHE_SHARE_PCT: u64 = 10;
/// ... and only when what was short is at least this share of the request (percent).
pub const CACHE_MARGIN_PCT: u64 = 10;
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
    fn of(o: &crate::model::replay::framework::FrameworkOom) -> AllocatorSettings {
        AllocatorSettings {
            backend: o.backend.clone(),
            expandable_segments: o.expandable_segments,
            max_split_size: o.max_split_size,
            garbage_collection_threshold: o.garbage_collection_threshold.clone(),
            alloc_conf: o.alloc_conf.clone(),
        }
    }
}

/// The cause of one out-of-memory event, the figures that decided it, findings and advice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    /// `reason.cause()`.
    pub cause: Cause,
    /// What the diagnosis could see: `driver` (the driver's calls only) or `driver+pytorch` / `driver+jax`
    /// (the framework allocator's own figures too, from the Python bridge).
    pub view: &'static str,
    /// Which rule decided (docs/OOM.md): `reason.rule()`.
    pub rule: &'static str,
    /// The deciding figures, by rule.
    pub reason: Reason,
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

/// Decides the cause of out-of-memory snapshot `s` of analysis `a`.
pub fn diagnose(a: &Analysis, s: &OomSnapshot) -> Diagnosis {
    let dev = s.device.and_then(|d| a.device(d));
    let req = s.requested_bytes;
    let (job, source) = match s.ledger_job_bytes {
        Some(b) => (b, "ledger"),
        None => (s.job_live_trace_bytes, "trace"),
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
    let procs = s.job_processes_on_device;

    let fw = s.framework.as_ref();
    let fig = s.framework_figures;
    let known_total = total.or(dev.and_then(|d| d.total_bytes));
    // The most any single request could get: the cap or the device, whichever is smaller.
    let limit_alone = match (cap, known_total) {
        (Some(c), Some(t)) if c <= t => Some((c, Limit::Cap)),
        (_, Some(t)) => Some((t, Limit::Device)),
        (Some(c), None) => Some((c, Limit::Cap)),
        (None, None) => None,
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
        // What fragmentation cost must be a real part of the request: a job only a few MiB short of room for it
        // was at its limit anyway (a batch that doubles each round fails at the next one whatever the cache's
        // layout): the cap or pressure is why.
        let marginal = short.saturating_mul(100) < req.saturating_mul(CACHE_MARGIN_PCT);
        (short > 0 && cached >= short && sizeable && largest < req && !marginal)
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
    // Counted in steps or cycles first; then a graph kept across iterations (a loop without an optimizer or a
    // DataLoader, such as an evaluation that sums its losses with their graphs); then wall-clock windows.
    let graph = graph_growth(s);
    let counted = |l: &&LeakTrend| l.unit != crate::model::analysis::GrowthUnit::Time;
    let fw_leak = s
        .framework_leak
        .as_ref()
        .map(|l| (l, GrowthOf::FrameworkAllocated));
    let driver_leak = s.leak.as_ref().map(|l| (l, GrowthOf::JobInUse));
    let grew = fw_leak
        .filter(|(l, _)| counted(l))
        .or(driver_leak.filter(|(l, _)| counted(l)))
        .or(graph.as_ref().map(|l| (l, GrowthOf::HeldGraph)))
        .or(fw_leak)
        .or(driver_leak)
        .filter(|(l, _)| missing.is_some_and(|m| l.rise_bytes >= m))
        // Lost events can be lost frees, which look exactly like memory kept: no growth verdict on them.
        .filter(|_| s.dropped_events == 0);
    let mut line = grew.and_then(|(l, _)| growth_line(a, s, l));
    // A rise read in wall-clock windows (no step counted) that went to a KV cache is a request's sequence or
    // batch growing as it is served, not memory kept across steps: the cap or pressure is why, and bounding
    // the cache is the advice (kv_cache_line). Counted steps that keep a cache growing stay a growth.
    let kv_holder = growth_line::kv_cache_holder(s).is_some();
    let work_grows = grew.is_some_and(|(l, _)| {
        l.unit == crate::model::analysis::GrowthUnit::Time
            && (kv_holder || line.as_ref().is_some_and(|g| g.kind == GrowthKind::KvCache))
    });
    let grew = grew.filter(|_| !work_grows);
    if grew.is_none() {
        line = None;
    }
    let reason = if s.on_host {
        Reason::HostMemory { requested: req }
    } else if let Some((l, limit)) = limit_alone.filter(|&(l, _)| req > l) {
        Reason::RequestExceedsLimit {
            requested: req,
            limit_bytes: l,
            limit,
        }
    } else if let Some((f, cached, largest, short)) = cache_frag {
        Reason::CacheFragmented {
            reserved: f.reserved,
            allocated: f.allocated,
            cached,
            short,
            largest_free_block: largest,
            requested: req,
            cap_refused: s.cap_refused,
        }
    } else if let Some((_, of)) = grew {
        Reason::Growth {
            of,
            requested: req,
            missing: missing.unwrap_or(req),
        }
    } else if s.cap_refused {
        Reason::CapRefused {
            job_bytes: job,
            cap,
            requested: req,
        }
    } else if let Some(c) = cap.filter(|&c| job.saturating_add(req) > c) {
        Reason::OverCap {
            job_bytes: job,
            requested: req,
            cap: c,
        }
    } else if let Some(f) = free {
        let sf = req.saturating_sub(f);
        if f >= req {
            Reason::FreeAtLeastRequest {
                free: f,
                requested: req,
            }
        } else if recent > 0 && recent >= sf {
            Reason::PoolCachedAsyncFrees {
                free: f,
                shortfall: sf,
                requested: req,
                async_freed: recent,
            }
        } else if let Some(ex) = excess.filter(|&ex| ex >= sf && ex >= job / 4) {
            Reason::OutsideExcess {
                outside: outside.unwrap_or(0),
                total: total.unwrap_or(0),
                free: f,
                job_bytes: job,
                contexts_estimate: ctx,
                processes: procs,
                excess: ex,
                shortfall: sf,
            }
        } else {
            Reason::JobFillsDevice {
                job_bytes: job,
                free: f,
                requested: req,
                shortfall: sf,
                framework: match (fig, s.framework_job) {
                    (Some(_), Some((alloc, res))) => Some((alloc, res.saturating_sub(alloc))),
                    _ => None,
                },
                outside: outside.zip(excess).map(|(o, ex)| Outside {
                    bytes: o,
                    contexts_bytes: o.min(ctx),
                    excess_bytes: ex,
                }),
                processes: procs,
            }
        }
    } else {
        match known_total {
            Some(t) if job.saturating_add(req).saturating_add(ctx) <= t => {
                if recent >= req {
                    Reason::NoFiguresPool {
                        job_bytes: job,
                        requested: req,
                        contexts_estimate: ctx,
                        total: t,
                        async_freed: recent,
                    }
                } else {
                    Reason::NoFiguresFitsTotal {
                        job_bytes: job,
                        requested: req,
                        contexts_estimate: ctx,
                        total: t,
                    }
                }
            }
            Some(t) => Reason::NoFiguresOverTotal {
                job_bytes: job,
                requested: req,
                contexts_estimate: ctx,
                total: t,
            },
            None => Reason::NothingKnown {
                job_bytes: job,
                requested: req,
            },
        }
    };
    let (cause, rule) = (reason.cause(), reason.rule());

    let mut findings = Vec::new();
    if let Some(f) = fig {
        findings.push(Finding::FrameworkFigures {
            allocated_bytes: f.allocated,
            reserved_bytes: f.reserved,
            inactive_split_bytes: f.inactive_split,
            largest_free_block_bytes: fw.and_then(|o| o.largest_free_block),
            free_in_live_segments_bytes: fw.and_then(|o| o.free_in_live_segments),
            alloc_retries: f.alloc_retries,
            settings: fw.map(AllocatorSettings::of),
        });
        if f.alloc_retries > 0 {
            findings.push(Finding::AllocRetries {
                count: f.alloc_retries,
            });
        }
    }
    if let Some(f) = rank_asymmetry(s) {
        findings.push(f);
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
        holder: s
            .holders
            .as_ref()
            .and_then(|h| h.suspects().next().cloned())
            .filter(|h| h.bytes > 0),
        work_grows,
        findings,
        advice: Vec::new(),
    };
    d.advice = advice(a, s, &d);
    d
}

/// A rank holding at least this many times its peers' median ...
pub const RANK_FACTOR_PCT: u64 = 150;
/// ... and at least this many bytes more.
pub const RANK_EXCESS_BYTES: u64 = 256 << 20;

/// The failing process against the other ranks of the same program (same command line: torchrun's, Slurm's and
/// MPI's workers run one), by their bytes live at the error on all devices.
fn rank_asymmetry(s: &OomSnapshot) -> Option<Finding> {
    let me = s.processes.iter().find(|p| p.pid == s.pid)?;
    let rank = me.rank?;
    let total = |p: &crate::model::analysis::OomProcess| {
        p.per_device
            .iter()
            .fold(0u64, |a, (_, b)| a.saturating_add(*b))
    };
    let mine = total(me);
    let mut peers: Vec<u64> = s
        .processes
        .iter()
        .filter(|p| p.pid != s.pid && p.rank.is_some() && p.cmdline == me.cmdline)
        .map(total)
        .collect();
    if peers.is_empty() {
        return None;
    }
    peers.sort_unstable();
    let median = peers[peers.len() / 2];
    let far = (mine as u128) * 100 >= (median as u128) * RANK_FACTOR_PCT as u128
        && mine >= median.saturating_add(RANK_EXCESS_BYTES);
    far.then(|| Finding::RankAsymmetry {
        pid: s.pid,
        rank,
        bytes: mine,
        peers: peers.len() as u64,
        peers_median_bytes: median,
        peers_max_bytes: peers[peers.len() - 1],
    })
}

/// Iterations a graph kept at the error must span to be a growth by itself.
pub const GRAPH_MIN_ITERATIONS: u64 = 3;

/// The growth an autograd graph kept across iterations makes (the bridge's walk at the error): its bytes over
/// the iterations it spans. The walk cannot say when they were made: one point, at the error.
fn graph_growth(s: &OomSnapshot) -> Option<LeakTrend> {
    use crate::model::analysis::{GrowthUnit, Minimum, StepSource};
    // Where the process's steps were counted they decide: a graph over a few micro-batches is gradient
    // accumulation, released at the optimizer's step. A graph rooted in a library's frame (a model's forward in
    // progress: `hidden_states = residual + hidden_states`, twice a layer) spans layers, not iterations.
    if s.steps_counted {
        return None;
    }
    let h = s
        .holders
        .as_ref()?
        .holders
        .iter()
        .filter(|h| h.kind == crate::model::analysis::holders::HolderKind::Graph && !h.library)
        .filter(|h| h.batches.is_some_and(|b| b >= GRAPH_MIN_ITERATIONS))
        .max_by_key(|h| h.bytes)?;
    Some(LeakTrend {
        minima: vec![Minimum {
            t_ns: s.time_ns,
            bytes: h.bytes,
        }],
        rise_bytes: h.bytes,
        steps: h.batches,
        unit: GrowthUnit::Steps(StepSource::GraphIterations),
        pid: Some(s.pid),
        groups: Vec::new(),
        more_groups: 0,
        sites: Vec::new(),
        more_sites: 0,
    })
}

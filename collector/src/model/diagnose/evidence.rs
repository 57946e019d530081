//! The figures a diagnosis decides on, gathered once from the snapshot: the rules (rules.rs) only read them, so
//! each rule is a test of figures, and two rules cannot compute one figure two ways.

use super::growth_line::{growth_line, kv_cache_holder, GrowthKind, GrowthLine};
use super::reason::{GrowthOf, Limit};
use super::verdict::{JobSource, CAP_STEP_BYTES, CONTEXT_ESTIMATE_BYTES};
use crate::model::analysis::{Analysis, GrowthUnit, LeakTrend, OomSnapshot};

/// Fragmentation of PyTorch's cache is the cause only when the cache (reserved - allocated) is at least this
/// share of what it reserved.
pub const CACHE_SHARE_PCT: u64 = 10;
/// ... and only when what was short is at least this share of the request (percent).
pub const CACHE_MARGIN_PCT: u64 = 10;
/// Iterations a graph kept at the error must span to be a growth by itself.
pub const GRAPH_MIN_ITERATIONS: u64 = 3;

/// Everything the rules read. The names follow docs/OOM.md, "The figures".
#[derive(Debug, Clone, Default)]
pub(super) struct Evidence {
    /// The requested bytes.
    pub req: u64,
    /// The job's bytes in use on the device: the cap's ledger when the record has it, else the trace's.
    pub job: u64,
    /// `"ledger"` or `"trace"`: where `job` came from.
    pub job_source: JobSource,
    /// The record's cap, else the trace header's.
    pub cap: Option<u64>,
    /// The driver's free and total memory, as the record gave them.
    pub free: Option<u64>,
    pub total: Option<u64>,
    /// The record's total, else the trace's best figure for the device.
    pub known_total: Option<u64>,
    /// The job's processes on the device, and the estimate of their contexts.
    pub procs: u64,
    pub ctx: u64,
    /// `req - free`, when the driver said what was free.
    pub shortfall: Option<u64>,
    /// `total - free - job`, and that less the contexts estimate.
    pub outside: Option<u64>,
    pub excess: Option<u64>,
    pub needed: u64,
    /// What the job's allocations could reach, and which limit gave it (`"cap"` or `"device"`).
    pub available: Option<u64>,
    pub limited_by: &'static str,
    /// `needed - available`.
    pub short: Option<u64>,
    /// `needed` rounded up to [`CAP_STEP_BYTES`].
    pub suggested: u64,
    /// Bytes freed with `cuMemFreeAsync` on the device in the last second.
    pub recent: u64,
    /// The most any single request could get: the cap or the device, whichever is smaller.
    pub limit_alone: Option<(u64, Limit)>,
    /// PyTorch's cache had the bytes that were short but no block as large as the request.
    pub cache_frag: Option<CacheFrag>,
    /// What was missing for the request to fit (`None`: nothing was).
    pub missing: Option<u64>,
    /// A growth that covers what was missing, and the line it came from.
    pub grew: Option<Grew>,
    pub line: Option<GrowthLine>,
    /// A wall-clock rise that went to a KV cache: the work grew, nothing was kept.
    pub work_grows: bool,
    /// The failed call was for pinned host memory.
    pub on_host: bool,
    /// The cap refused the call.
    pub cap_refused: bool,
    /// The framework's (allocated, cached) bytes of the job, when its figures are known.
    pub framework_split: Option<(u64, u64)>,
    /// The framework's allocator refused the request itself, before asking the driver, and said its limit.
    pub framework_limit: Option<FrameworkLimit>,
}

/// A framework's own limit, where its allocator refused a request before asking the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FrameworkLimit {
    pub framework: vramtrace_format::Framework,
    pub limit: u64,
    /// Its bytes in tensors or arrays then, and what it held from the driver.
    pub in_use: u64,
    pub reserved: u64,
    pub largest_free_block: Option<u64>,
}

/// The figures of a fragmented PyTorch cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CacheFrag {
    pub reserved: u64,
    pub allocated: u64,
    pub cached: u64,
    /// What the cap or the driver could not give.
    pub short: u64,
    pub largest_free_block: u64,
}

/// A growth read, and whose bytes it is.
#[derive(Debug, Clone)]
pub(super) struct Grew {
    pub trend: LeakTrend,
    pub of: GrowthOf,
}

impl Evidence {
    /// Gathers the evidence of out-of-memory snapshot `s` of analysis `a`.
    pub fn gather(a: &Analysis, s: &OomSnapshot) -> Evidence {
        let dev = s.device.and_then(|d| a.device(d));
        let req = s.requested_bytes;
        let (job, job_source) = match s.ledger_job_bytes {
            Some(b) => (b, JobSource::Ledger),
            None => (s.job_live_trace_bytes, JobSource::Trace),
        };
        let cap = s.cap_bytes.or(dev.and_then(|d| d.cap_bytes));
        let free = s.device_free_bytes;
        let total = s.device_total_bytes;
        let known_total = total.or(dev.and_then(|d| d.total_bytes));
        let procs = s.job_processes_on_device;
        let ctx = CONTEXT_ESTIMATE_BYTES.saturating_mul(procs);
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
        let limit_alone = match (cap, known_total) {
            (Some(c), Some(t)) if c <= t => Some((c, Limit::Cap)),
            (_, Some(t)) => Some((t, Limit::Device)),
            (Some(c), None) => Some((c, Limit::Cap)),
            (None, None) => None,
        };
        // What was missing: short of fitting, else the driver's shortfall; the request itself only when the
        // driver said nothing of its free memory. Nothing missing (the device had the bytes free): no growth
        // verdict.
        let missing = short
            .filter(|&x| x > 0)
            .or(shortfall.filter(|&x| x > 0))
            .or(free.is_none().then_some(req));
        let (grew, line, work_grows) = growth(a, s, missing);
        Evidence {
            req,
            job,
            job_source,
            cap,
            free,
            total,
            known_total,
            procs,
            ctx,
            shortfall,
            outside,
            excess,
            needed,
            available,
            limited_by,
            short,
            suggested,
            recent: s.async_freed_recent_bytes,
            limit_alone,
            cache_frag: cache_frag(s, req, job, cap, free),
            missing,
            grew,
            line,
            work_grows,
            on_host: s.on_host,
            cap_refused: s.cap_refused,
            framework_split: match (s.framework_figures, s.framework_job) {
                (Some(_), Some((alloc, res))) => Some((alloc, res.saturating_sub(alloc))),
                _ => None,
            },
            framework_limit: framework_limit(s, known_total),
        }
    }
}

/// The framework's own limit, when its allocator refused the request without a driver call (no driver record
/// behind the error) and its record said the limit: PyTorch's `allowed` under a memory fraction, JAX's pool.
/// PyTorch's observer says the device's total where no fraction is set (a driver record lost, say): no limit
/// of its own then.
fn framework_limit(s: &OomSnapshot, device_total: Option<u64>) -> Option<FrameworkLimit> {
    let f = s.framework.as_ref()?;
    if s.api.is_some() || s.api_code != 0 {
        return None;
    }
    let own = |l: u64| {
        l > 0
            && (f.framework != vramtrace_format::Framework::Torch
                || device_total.is_some_and(|t| l < t))
    };
    Some(FrameworkLimit {
        framework: f.framework,
        limit: f.allowed_or_total_bytes.filter(|&l| own(l))?,
        in_use: f.figures.allocated,
        reserved: f.figures.reserved,
        largest_free_block: f.largest_free_block,
    })
}

/// PyTorch's cache had the bytes that were short, but no block as large as the request.
fn cache_frag(
    s: &OomSnapshot,
    req: u64,
    job: u64,
    cap: Option<u64>,
    free: Option<u64>,
) -> Option<CacheFrag> {
    let fw = s.framework.as_ref();
    let f = s.framework_figures?;
    let largest = fw?.largest_free_block?;
    // What a new segment could get: the device's free memory, and under a cap the cap's room.
    let room = {
        let dev_room = free.or(fw.and_then(|f| f.device_free_bytes));
        let cap_room = cap.map(|c| c.saturating_sub(job));
        match (dev_room, cap_room) {
            (Some(d), Some(c)) => Some(d.min(c)),
            (d, c) => d.or(c),
        }
    };
    let short = req.saturating_sub(room?);
    let cached = f.cached();
    // The cache must be a real share of what is reserved: a few stray blocks beside a job that filled its cap or
    // device with live tensors are not why it failed.
    let sizeable = cached.saturating_mul(100) >= f.reserved.saturating_mul(CACHE_SHARE_PCT);
    // What fragmentation cost must be a real part of the request: a job only a few MiB short of room for it was
    // at its limit anyway (a batch that doubles each round fails at the next one whatever the cache's layout):
    // the cap or pressure is why.
    let marginal = short.saturating_mul(100) < req.saturating_mul(CACHE_MARGIN_PCT);
    (short > 0 && cached >= short && sizeable && largest < req && !marginal).then_some(CacheFrag {
        reserved: f.reserved,
        allocated: f.allocated,
        cached,
        short,
        largest_free_block: largest,
    })
}

/// Growth: the bytes in use rose step after step up to this error, by at least what was `missing` (without the
/// rise it would have fitted). PyTorch's allocated bytes when the bridge gave them: its cache hides the tensors'
/// rise from the driver. Returns the growth, its line, and whether the rise was the work growing instead.
fn growth(
    a: &Analysis,
    s: &OomSnapshot,
    missing: Option<u64>,
) -> (Option<Grew>, Option<GrowthLine>, bool) {
    // Counted in steps or cycles first; then a graph kept across iterations (a loop without an optimizer or a
    // DataLoader, such as an evaluation that sums its losses with their graphs); then wall-clock windows.
    let graph = graph_growth(s);
    let container = container_growth(s);
    let counted = |l: &&LeakTrend| l.unit != GrowthUnit::Time;
    let fw_leak = s
        .framework_leak
        .as_ref()
        .map(|l| (l, GrowthOf::FrameworkAllocated));
    let driver_leak = s.driver_leak().map(|l| (l, GrowthOf::JobInUse));
    let grew = fw_leak
        .filter(|(l, _)| counted(l))
        .or(driver_leak.filter(|(l, _)| counted(l)))
        .or(graph.as_ref().map(|l| (l, GrowthOf::HeldGraph)))
        .or(container.as_ref().map(|l| (l, GrowthOf::HeldContainer)))
        .or(fw_leak)
        .or(driver_leak)
        .filter(|(l, _)| missing.is_some_and(|m| l.rise_bytes >= m))
        // Lost events can be lost frees, which look exactly like memory kept: no growth verdict on them.
        .filter(|_| s.dropped_events == 0);
    let line = grew.and_then(|(l, _)| growth_line(a, s, l));
    // A rise read in wall-clock windows (no step counted) that went to a KV cache is a request's sequence or batch
    // growing as it is served, not memory kept across steps: the cap or pressure is why, and bounding the cache
    // is the advice (kv_cache_line). Counted steps that keep a cache growing stay a growth.
    let kv_holder = kv_cache_holder(s).is_some();
    let work_grows = grew.is_some_and(|(l, _)| {
        l.unit == GrowthUnit::Time
            && (kv_holder || line.as_ref().is_some_and(|g| g.kind == GrowthKind::KvCache))
    }) || grew.is_some_and(|(l, of)| {
        // A floor read at steps' boundaries that rose with the steps' own need, where what holds the memory at
        // the error is the step in progress (one tensor, or a graph of one iteration): the input live at the
        // boundary growing step by step (sequences sorted by length), not memory kept.
        matches!(l.unit, GrowthUnit::Steps(_))
            && !matches!(of, GrowthOf::HeldGraph | GrowthOf::HeldContainer)
            && step_need(s).is_some()
            && held_by_the_step(s)
    });
    match grew.filter(|_| !work_grows) {
        Some((l, of)) => (
            Some(Grew {
                trend: l.clone(),
                of,
            }),
            line,
            work_grows,
        ),
        None => (None, None, work_grows),
    }
}

/// What holds the most at the error (of what a growth could be blamed on) is the step in progress: a variable of
/// one or two tensors, or an autograd graph spanning one iteration.
fn held_by_the_step(s: &OomSnapshot) -> bool {
    use crate::model::analysis::holders::HolderKind;
    let Some(h) = s
        .holders
        .as_ref()
        .and_then(|h| h.suspects().max_by_key(|x| x.bytes))
    else {
        return false;
    };
    match h.kind {
        HolderKind::Variable => h.tensors <= 2,
        HolderKind::Graph => h.batches.unwrap_or(1) <= 1,
        _ => false,
    }
}

/// Tensors a container must hold to be taken for one filled an iteration at a time.
pub const CONTAINER_MIN_TENSORS: u64 = 8;

/// The growth a container kept across iterations makes (the bridge's walk at the error): a list, dict or deque
/// of the program's holding at least [`CONTAINER_MIN_TENSORS`], where the job's bytes in use rose by at least half
/// of what it holds from a quarter into the run up to the error (so it filled as the run went on: a ring of
/// buffers made at the start, however large, is not a growth). The walk cannot say when each was made: one
/// point, at the error. Where the program's steps were counted they decide.
fn container_growth(s: &OomSnapshot) -> Option<LeakTrend> {
    use crate::model::analysis::holders::HolderKind;
    use crate::model::analysis::StepSource;
    if s.steps_counted {
        return None;
    }
    let h = s
        .holders
        .as_ref()?
        .holders
        .iter()
        .filter(|h| {
            h.kind == HolderKind::Variable && !h.library && h.tensors >= CONTAINER_MIN_TENSORS
        })
        .filter(|h| h.is_container())
        .max_by_key(|h| h.bytes)?;
    // A KV cache growing as a request is served is the request's work, not memory kept across requests (the
    // cap or pressure is why; the advice bounds the cache).
    if super::growth_line::GrowthKind::of_holder(h) == super::growth_line::GrowthKind::KvCache {
        return None;
    }
    let b = &s.timeline.buckets;
    let upto = b.iter().take_while(|x| x.t_ns <= s.time_ns).count();
    let from = upto / 4;
    let low = b.get(from..upto)?.iter().map(|x| x.last_bytes).min()?;
    let at_error = b.get(upto.checked_sub(1)?)?.max_bytes;
    if at_error.saturating_sub(low).saturating_mul(2) < h.bytes {
        return None;
    }
    Some(held(s, h.bytes, Some(h.tensors), StepSource::HeldEntries))
}

/// The growth an autograd graph kept across iterations makes (the bridge's walk at the error): its bytes over
/// the iterations it spans. The walk cannot say when they were made: one point, at the error.
fn graph_growth(s: &OomSnapshot) -> Option<LeakTrend> {
    use crate::model::analysis::holders::HolderKind;
    use crate::model::analysis::StepSource;
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
        .filter(|h| h.kind == HolderKind::Graph && !h.library)
        .filter(|h| h.batches.is_some_and(|b| b >= GRAPH_MIN_ITERATIONS))
        .max_by_key(|h| h.bytes)?;
    Some(held(s, h.bytes, h.batches, StepSource::GraphIterations))
}

/// A growth the walk at the error found held (a graph, a container): one point, at the error.
fn held(
    s: &OomSnapshot,
    bytes: u64,
    steps: Option<u64>,
    source: crate::model::analysis::StepSource,
) -> LeakTrend {
    use crate::model::analysis::Minimum;
    LeakTrend {
        minima: vec![Minimum {
            t_ns: s.time_ns,
            bytes,
        }],
        rise_bytes: bytes,
        steps,
        unit: GrowthUnit::Steps(source),
        pid: Some(s.pid),
        groups: Vec::new(),
        more_groups: 0,
        sites: Vec::new(),
        more_sites: 0,
    }
}

/// The steps' need rising by half again more than what they kept over the same steps (a leak lifts every step's
/// peak by what it keeps: that is not the work growing; an input live at the boundary lifts both, the need by
/// what the step makes of it besides).
pub(super) fn step_need(s: &OomSnapshot) -> Option<crate::model::analysis::StepNeed> {
    let n = s.step_need?;
    let span = n.last_step.saturating_sub(n.first_step);
    let kept_per_step = s
        .framework_leak
        .as_ref()
        .filter(|l| matches!(l.unit, crate::model::GrowthUnit::Steps(_)))
        .and_then(|l| l.steps.filter(|&k| k > 0).map(|k| l.rise_bytes / k))
        .unwrap_or(0);
    let rose = n.last_peak.saturating_sub(n.first_peak);
    let kept = kept_per_step.saturating_mul(span);
    (rose > kept.saturating_add(kept / 2)).then_some(n)
}

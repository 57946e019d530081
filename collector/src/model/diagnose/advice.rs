//! Advice fitted to a diagnosis: what to do, first the step that fixes the cause. Each item is a step with the
//! figures it names; reporters/prose/advice.rs says it.

use super::cause::Cause;
use super::growth_line::GrowthKind;
use super::reason::{Limit, Reason};
use super::steps::{
    Advice, CapAdvice, FragmentationAdvice, GrowthAdvice, OutsideAdvice, PressureAdvice,
    RequestAdvice,
};
use super::verdict::{Diagnosis, View};
use crate::model::analysis::{Analysis, OomSnapshot};

/// What to change in a training job whose step does not fit its limit, in the order the evidence supports: a
/// smaller batch with gradient accumulation (the effective batch kept), activation checkpointing where saved
/// activations are most of what the tensors hold, mixed precision. Only for a PyTorch process that the walk
/// shows training (an autograd graph or an optimizer's state among the holders) and whose memory is not a KV
/// cache's (a serving loop's levers are its own).
fn training_levers(a: &Analysis, s: &OomSnapshot, d: &Diagnosis) -> Vec<Advice> {
    use crate::model::holders::HolderKind;
    let Some(h) = s.holders.as_ref().filter(|_| d.view != View::Driver) else {
        return Vec::new();
    };
    let bytes_of = |k: HolderKind| {
        h.holders
            .iter()
            .filter(|x| x.kind == k)
            .fold(0u64, |t, x| t.saturating_add(x.bytes))
    };
    let (graph, optimizer) = (bytes_of(HolderKind::Graph), bytes_of(HolderKind::Optimizer));
    let kv = super::growth_line::kv_cache_line(a, s).is_some()
        || super::growth_line::kv_cache_holder(s).is_some();
    // A step that records a graph: an optimizer's state, the error in the backward pass, or a graph of saved
    // activations (a first step fails before the optimizer makes its state). An evaluation run without no_grad
    // reads the same here; a smaller batch serves it too.
    let backward = s.framework.as_ref().is_some_and(|f| f.on_backward_thread());
    if kv || graph == 0 && optimizer == 0 && !backward {
        return Vec::new();
    }
    let mut v = vec![
        fit_command(a, s, d),
        Advice::Pressure(PressureAdvice::SmallerBatch),
    ];
    if graph > 0 && graph.saturating_mul(2) >= h.tensor_bytes {
        v.push(Advice::Pressure(PressureAdvice::Checkpointing));
    }
    v.push(Advice::Pressure(PressureAdvice::MixedPrecision));
    v
}

/// Memory kept step after step before the error, to fix before anything else: a rise that explains the error
/// (at least what was missing), or a smaller one where the steps' own need did not rise (a smaller rise beside a
/// need that grows is the input itself growing a little each step: not memory kept, and no advice).
fn growth_explains(s: &OomSnapshot, d: &Diagnosis) -> bool {
    if d.work_grows {
        return false;
    }
    if super::evidence::step_need(s).is_none() {
        return s.framework_leak.is_some() || s.driver_leak().is_some();
    }
    let rise = [s.framework_leak.as_ref(), s.driver_leak()]
        .into_iter()
        .flatten()
        .map(|l| l.rise_bytes)
        .max();
    let missing = d
        .short_of_fitting_bytes
        .filter(|&x| x > 0)
        .or(d.shortfall_bytes)
        .unwrap_or(s.requested_bytes);
    rise.is_some_and(|r| r >= missing)
}

/// The `vramtrace fit` command that finds the largest batch of this job under its limit.
fn fit_command(a: &Analysis, s: &OomSnapshot, d: &Diagnosis) -> Advice {
    let command = &a.header.command;
    let (command, batch) = match super::batch_arg::batch_template(command) {
        Some((c, v)) => (c, Some(v)),
        None => (command.clone(), None),
    };
    let cap = if d.cause == Cause::Cap {
        d.cap_bytes
    } else {
        None
    };
    Advice::Pressure(PressureAdvice::FitCommand {
        command,
        batch,
        cap,
        device: s.device.filter(|_| a.devices.len() > 1),
    })
}

pub(super) fn advice(a: &Analysis, s: &OomSnapshot, d: &Diagnosis) -> Vec<Advice> {
    let mut v = Vec::new();
    let device = s.device;
    // The allocator replayed from the process's own history, where it fails where the run failed.
    let replay = s
        .framework
        .as_ref()
        .and_then(|f| f.replay.as_ref())
        .filter(|r| r.reproduced);
    match d.cause {
        Cause::Growth => growth_advice(s, d, &mut v),
        Cause::HostMemory => v.push(Advice::Request(RequestAdvice::HostMemory {
            requested: s.requested_bytes,
        })),
        Cause::RequestTooLarge => {
            let limit = if d
                .cap_bytes
                .is_some_and(|c| d.total_bytes.is_none_or(|t| c <= t))
            {
                Limit::Cap
            } else {
                Limit::Device
            };
            v.push(Advice::Request(RequestAdvice::SplitRequest {
                requested: s.requested_bytes,
                device,
                limit,
            }));
            v.push(Advice::Request(RequestAdvice::CheckShape));
        }
        Cause::FragmentationCache => cache_advice(s, replay, &mut v),
        Cause::Pressure => pressure_advice(a, s, d, &mut v),
        Cause::FrameworkLimit => framework_limit_advice(a, s, d, &mut v),
        Cause::Fragmentation => v.extend([
            Advice::Fragmentation(FragmentationAdvice::ExpandableSegments),
            Advice::Fragmentation(FragmentationAdvice::TrimPools),
            Advice::Fragmentation(FragmentationAdvice::PersistentFirst),
        ]),
        Cause::External => v.extend([
            Advice::Outside(OutsideAdvice::HeldOutside {
                bytes: d.outside_excess_bytes,
                device,
                job_bytes: d.job_live_bytes,
            }),
            Advice::Outside(OutsideAdvice::WhoHoldsTheGpu),
            Advice::Outside(OutsideAdvice::MoveTheJob { device }),
        ]),
        Cause::Cap => cap_advice(a, s, d, replay, &mut v),
    }
    first_by_evidence(a, s, d, replay, &mut v);
    v
}

/// A growth: what keeps the memory, named as the evidence allows, and what a larger limit would only buy.
fn growth_advice(s: &OomSnapshot, d: &Diagnosis, v: &mut Vec<Advice>) {
    // A rate only where steps were counted (the program's, or a process's cycles): the timeline's
    // cycles in wall-clock windows are not the program's steps.
    let per_step = d
        .growth
        .as_ref()
        .filter(|l| l.unit != crate::model::analysis::GrowthUnit::Time)
        .and_then(|l| l.steps.filter(|&n| n > 0).map(|n| l.rise_bytes / n));
    let line = d.growth_line.as_ref().map(|g| g.label.clone());
    let kind = d.growth_line.as_ref().map_or(GrowthKind::Kept, |g| g.kind);
    let native = d.view == View::Driver;
    v.push(match (kind, &d.holder) {
        (GrowthKind::KvCache, _) => Advice::Growth(GrowthAdvice::GrowthKvCache { line }),
        (GrowthKind::OptimizerState, _) => {
            Advice::Growth(GrowthAdvice::GrowthOptimizerState { line })
        }
        // The walk names the object that keeps them: the fix is there (a KV cache's own advice when it
        // is one).
        (GrowthKind::Kept, Some(h)) if GrowthKind::of_holder(h) == GrowthKind::KvCache => {
            Advice::Growth(GrowthAdvice::GrowthKvCache {
                line: Some(h.label()),
            })
        }
        (GrowthKind::Kept, Some(h)) => {
            Advice::Growth(GrowthAdvice::GrowthHeldBy { holder: h.clone() })
        }
        (GrowthKind::Kept, None) if native => {
            Advice::Growth(GrowthAdvice::GrowthNeverFreed { line })
        }
        (GrowthKind::Kept, None) => Advice::Growth(GrowthAdvice::GrowthKeptTensors { line }),
    });
    if d.growth_line.is_none() && d.holder.is_none() && !native {
        v.push(Advice::Growth(GrowthAdvice::TorchHistory));
    }
    // What a larger limit would buy at this rate: twice the cap, and the whole device.
    let now = d.job_live_bytes.saturating_add(s.requested_bytes);
    let mut lasts = Vec::new();
    if let Some(p) = per_step.filter(|&p| p > 0) {
        let mut limits: Vec<(u64, bool)> = Vec::new();
        match (d.cap_bytes, d.total_bytes) {
            (Some(c), t) => {
                let twice = c.saturating_mul(2);
                if t.is_none_or(|t| twice < t) {
                    limits.push((twice, false));
                }
                if let Some(t) = t.filter(|&t| t > c) {
                    limits.push((t, true));
                }
            }
            (None, Some(t)) => limits.push((t.saturating_mul(2), false)),
            (None, None) => {}
        }
        for (l, whole) in limits {
            lasts.push((l, l.saturating_sub(now) / p, whole));
        }
    }
    if d.growth
        .as_ref()
        .is_some_and(|l| l.unit == crate::model::analysis::GrowthUnit::Cycles)
    {
        v.push(Advice::Growth(GrowthAdvice::CyclesMayBeLoading {
            held: d.job_live_bytes,
        }));
    }
    v.push(Advice::Growth(GrowthAdvice::FixGrowthFirst {
        capped: d.cap_bytes.is_some(),
        per_step,
        noun: d.growth.as_ref().map_or("step", |l| l.unit.noun()),
        lasts,
    }));
}

/// PyTorch's cache fragmented: the settings the replay shows getting past it, else the usual ones.
fn cache_advice(
    s: &OomSnapshot,
    replay: Option<&crate::model::AllocatorReplay>,
    v: &mut Vec<Advice>,
) {
    let o = s.framework.as_ref();
    match replay {
        // The settings that the replay shows getting past it, and no others.
        Some(r) => {
            if r.passes.is_empty() {
                v.push(Advice::Cap(CapAdvice::NoSettingGetsPast { limit: r.limit }));
            }
        }
        None => {
            if o.and_then(|o| o.expandable_segments) != Some(true) {
                v.push(Advice::Fragmentation(
                    FragmentationAdvice::CacheExpandableSegments,
                ));
            }
            if o.is_none_or(|o| o.max_split_size.is_none()) {
                v.push(Advice::Fragmentation(
                    FragmentationAdvice::CacheMaxSplitSize {
                        mb: (s.requested_bytes >> 20).clamp(20, 1024),
                    },
                ));
            }
        }
    }
    v.push(Advice::Fragmentation(
        FragmentationAdvice::CacheEmptyBetweenPhases,
    ));
    if replay.is_none() {
        v.push(Advice::Fragmentation(FragmentationAdvice::CacheGcThreshold));
    }
    v.push(Advice::Fragmentation(
        FragmentationAdvice::CachePersistentFirst,
    ));
}

/// The job fills the memory it may have: what to shed, and the levers of a training step.
fn pressure_advice(a: &Analysis, s: &OomSnapshot, d: &Diagnosis, v: &mut Vec<Advice>) {
    let device = s.device;
    let shed = d
        .short_of_fitting_bytes
        .filter(|&x| x > 0)
        .or(d.shortfall_bytes)
        .unwrap_or(s.requested_bytes);
    v.push(Advice::Pressure(PressureAdvice::Shed {
        bytes: shed,
        device,
        needed: d.needed_bytes,
    }));
    // A PyTorch job: the batch that fits the whole GPU, in one command.
    if s.framework.is_some() {
        v.push(fit_command(a, s, d));
    }
    v.extend([
        Advice::Pressure(PressureAdvice::SmallerBatch),
        Advice::Pressure(PressureAdvice::Checkpointing),
        Advice::Pressure(PressureAdvice::MixedPrecision),
        Advice::Pressure(PressureAdvice::OffloadOptimizer),
        Advice::Pressure(PressureAdvice::Shard),
    ]);
    if growth_explains(s, d) {
        v.push(Advice::Pressure(PressureAdvice::FixKeptFirst));
    }
}

/// The framework's own limit: give it more of the GPU where the GPU has room, else shed; PyTorch's training
/// levers for a PyTorch job (JAX's own are in the first step's words).
fn framework_limit_advice(a: &Analysis, s: &OomSnapshot, d: &Diagnosis, v: &mut Vec<Advice>) {
    let Reason::FrameworkLimit {
        framework,
        limit,
        in_use,
        requested,
        ..
    } = d.reason
    else {
        return;
    };
    let needed = in_use.saturating_add(requested);
    v.push(Advice::Pressure(PressureAdvice::FrameworkLimit {
        framework,
        limit,
        needed,
        total: d.total_bytes,
        fragmented: needed <= limit,
    }));
    if framework == vramtrace_format::Framework::Torch {
        v.push(fit_command(a, s, d));
        v.extend([
            Advice::Pressure(PressureAdvice::SmallerBatch),
            Advice::Pressure(PressureAdvice::Checkpointing),
            Advice::Pressure(PressureAdvice::MixedPrecision),
        ]);
    }
}

/// The cap refused it: what to change in the job, then the cap that would fit.
fn cap_advice(
    a: &Analysis,
    s: &OomSnapshot,
    d: &Diagnosis,
    replay: Option<&crate::model::AllocatorReplay>,
    v: &mut Vec<Advice>,
) {
    let device = s.device;
    // A training step too large for its limit: what to change in the job comes before a larger limit.
    let grows = (s.framework_leak.is_some() || s.leak.is_some()) && !d.work_grows;
    if !grows {
        v.extend(training_levers(a, s, d));
    }
    // With one device the flag is the cap alone; with several it names the device it is for.
    let flag_device = device.filter(|_| a.devices.len() > 1);
    match (replay, d.cap_bytes) {
        // The replay's own figure: the cap less what the allocator had, plus what it needs.
        (Some(r), Some(cap)) => v.push(Advice::Cap(CapAdvice::CapFitsHistory {
            cap: (cap.saturating_sub(r.limit) + r.needs).div_ceil(64 << 20) * (64 << 20),
            device: flag_device,
        })),
        _ => v.push(Advice::Cap(CapAdvice::CapWouldFit {
            cap: d.suggested_cap_bytes,
            needed: d.needed_bytes,
            device: flag_device,
        })),
    }
    if let Some(t) = d.total_bytes.filter(|&t| d.suggested_cap_bytes > t) {
        v.push(Advice::Cap(CapAdvice::CapOverDevice { total: t }));
    }
    v.push(Advice::Cap(CapAdvice::CapModeWarn));
    if growth_explains(s, d) {
        v.push(Advice::Cap(CapAdvice::FixGrowthBeforeCap));
    }
}

/// What the evidence puts first, whatever the cause gave: a setting the replay shows getting past the error, an
/// input to bound, the largest batch from a run beside it, a KV cache to bound.
fn first_by_evidence(
    a: &Analysis,
    s: &OomSnapshot,
    d: &Diagnosis,
    replay: Option<&crate::model::AllocatorReplay>,
    v: &mut Vec<Advice>,
) {
    // A setting that gets past the failure in the same memory, by the replay: the first thing to try.
    let settings_matter = matches!(
        d.cause,
        Cause::Cap | Cause::FragmentationCache | Cause::Pressure | Cause::Fragmentation
    );
    if let Some(r) = replay.filter(|_| settings_matter) {
        if let Some((conf, reserve)) = r.passes.first() {
            v.insert(
                0,
                Advice::Cap(CapAdvice::SettingGetsPast {
                    conf: conf.clone(),
                    reserve: *reserve,
                    limit: r.limit,
                    complete: r.complete,
                }),
            );
        }
    }
    // A step whose own need grows with its input: bounding the input comes before anything else, a setting
    // that gets past this error included (the next, longer input fails again).
    if matches!(d.cause, Cause::Cap | Cause::Pressure) {
        if let Some(n) = super::evidence::step_need(s) {
            v.insert(
                0,
                Advice::Pressure(PressureAdvice::BoundInput {
                    noun: n.unit.noun(),
                }),
            );
        }
    }
    // The largest batch, from a run beside it at another batch: first where the work's size decides (a growth
    // only fails later at a smaller batch); why none was drawn is said too, since the user gave or kept the run.
    let batch = s.framework.as_ref().and_then(|f| f.batch.as_ref());
    if let Some(b) = batch.filter(|_| d.cause != Cause::Growth) {
        v.insert(0, Advice::LargestBatch(Box::new(b.clone())));
        // The largest batch and its accumulation answer what a smaller batch, or a fit, would ask.
        v.retain(|x| {
            *x != Advice::Pressure(PressureAdvice::SmallerBatch)
                && !matches!(x, Advice::Pressure(PressureAdvice::FitCommand { .. }))
        });
    }
    // A KV cache behind a cause other than its own growth (a serving loop's batch or sequence outgrew the
    // memory): bounding them is the lasting fix, said second, after the cause's own first step.
    if d.cause != Cause::Growth {
        let held = super::growth_line::kv_cache_holder(s).map(crate::model::holders::Holder::label);
        if let Some(line) = super::growth_line::kv_cache_line(a, s).or(held) {
            let at = v.len().min(1);
            v.insert(at, Advice::BoundKvCache { line });
        }
    }
}

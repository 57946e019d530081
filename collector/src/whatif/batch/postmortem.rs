//! The knob's what-if inside a post-mortem (issue 39): a process that ran out of memory, and the same program
//! run at another value of a knob (the batch) beside it. The failed run is matched up to its failure (`align`),
//! the program synthesized whole at each value tried and replayed against what the allocator could have had
//! where it failed (the post-mortem's own replay limit): the largest value that fits, a setting that fits more,
//! and the gradient accumulation that keeps the failed run's effective batch. Drawn only where the model,
//! replaying the program at the failed value, fails there too.

use std::collections::BTreeMap;

use super::align::{align, KnobRun};
use super::answer::{answer, KnobConfig, KnobJob};
use super::fit::Shape;
use crate::model::{BatchAdvice, BatchFit};
use crate::whatif::answer::Limit;
use crate::whatif::history::History;
use crate::whatif::settings::default_grid;

/// The failed process's history (with its `oom` entry) at `value`, and the runs beside it, each with its
/// history of the same process (same GPU, same place among that GPU's processes).
pub struct Failed<'a> {
    pub knob: &'a str,
    pub value: u64,
    pub history: History,
    /// (trace, value, history) per run beside it.
    pub beside: Vec<(String, u64, History)>,
    /// What the allocator could have had at the failure.
    pub limit: u64,
    /// The device's memory (expandable segments' address space depends on it).
    pub device_total: u64,
    /// The commands the failed run and each run beside it ran (empty: unknown).
    pub commands: Vec<Vec<String>>,
}

pub fn advise(f: Failed<'_>) -> BatchAdvice {
    let beside: Vec<(String, u64)> = f.beside.iter().map(|(l, v, _)| (l.clone(), *v)).collect();
    let (knob, value, limit) = (f.knob, f.value, f.limit);
    let outcome = fit(f);
    BatchAdvice {
        knob: knob.to_string(),
        value,
        beside,
        limit,
        outcome,
    }
}

/// The answer, from `f` taken whole: its histories become the runs (a long history is not copied).
fn fit(f: Failed<'_>) -> Result<BatchFit, String> {
    let device = f.history.device;
    let runs = knob_runs(f.value, f.history, f.beside, &f.commands);
    let aligned = align(runs).map_err(|e| e.to_string())?;
    if aligned.failed.is_none() {
        return Err("the failed run's history holds no out-of-memory error to match".into());
    }
    let guessed = aligned
        .slots
        .iter()
        .flat_map(|s| &s.fits)
        .filter(|x| x.alternative.is_some())
        .count() as u64;
    let filled = aligned.slots[0].filled;
    if aligned.slots[0]
        .fits
        .iter()
        .all(|x| x.shape == Shape::Constant)
    {
        return Err(format!(
            "no request's size changes with the {} between the runs, so it does not decide the memory",
            f.knob
        ));
    }
    // The failed run's own refused request, as a request of the program (the last it made).
    let failed_at = aligned
        .failed
        .map_or(0, |r| aligned.slots[0].at[r].len())
        .saturating_sub(1);
    let job = KnobJob {
        aligned,
        search_factor: crate::whatif::batch::answer::SEARCH_FACTOR,
        outside: vec![0],
        device_total: BTreeMap::from([(device, f.device_total)]),
        others: BTreeMap::new(),
    };
    let limit = Limit {
        bytes: BTreeMap::from([(device, f.limit)]),
        what: "what the allocator could have had".into(),
    };
    let w = answer(&job, &default_grid(), &[f.value], Some(limit.clone()));
    let own = &w.configs[0];
    reproduced(&job, own, f.knob, f.value, failed_at)?;
    let largest = own.largest.as_ref().ok_or("no search was made")?;
    // Where the runs' code paths differ, which one the program takes at a value between them is unknown: the
    // advice must fit with both paths' requests (the alternative's search, which adds the other run's).
    let own_requests: u64 = job
        .aligned
        .slots
        .iter()
        .flat_map(|s| &s.own)
        .map(|o| o.len() as u64)
        .sum();
    let both = |g: &crate::whatif::batch::answer::Largest| match g.alternative {
        Some(alt) if own_requests > 0 && alt < g.value => alt,
        _ => g.value,
    };
    // Below the failed value, and a value the search saw fit and the next one refused.
    let advised = both(largest);
    if largest.at_least || advised.is_some_and(|v| v >= f.value) {
        return Err(format!(
            "the search finds {} {}{} fitting, not below the {} that failed: the model and the run disagree, so \
             no value is advised",
            f.knob,
            advised.unwrap_or(0),
            if largest.at_least { " and more" } else { "" },
            f.value
        ));
    }
    // The fitted search's refusal names the next value up only where its answer is the one advised.
    let next_refused_at = (advised == largest.value)
        .then_some(largest.next_failure.as_ref())
        .flatten()
        .map(|x| {
            let at = largest.value.map_or(1, |v| v + 1);
            let (_, _, line, place) = job.place(at, x);
            format!("{line} ({place})")
        });
    let better = w.best.and_then(|b| {
        let c = &w.configs[b];
        both(c.largest.as_ref()?).map(|v| (c.conf.clone(), v))
    });
    let accumulate = advised
        .and_then(|l| accumulation(f.value, l))
        .filter(|&(_, micro)| accumulation_fits(&job, micro, &limit, f.limit, own_requests));
    Ok(BatchFit {
        largest: advised,
        next_refused_at,
        better,
        accumulate,
        guessed,
        filled_from_step: filled.from_step,
        filled_from_kin: filled.from_kin,
        filled_in_proportion: filled.in_proportion,
        own_requests,
    })
}

/// The runs to align, the failed one first (labelled so), each with its history and its command (`commands`
/// in the same order; empty where unknown): moved in, not copied.
fn knob_runs(
    value: u64,
    history: History,
    beside: Vec<(String, u64, History)>,
    commands: &[Vec<String>],
) -> Vec<KnobRun> {
    let mut runs = vec![KnobRun {
        value,
        label: "the failed run".into(),
        histories: vec![history],
        command: commands.first().cloned().unwrap_or_default(),
    }];
    for (i, (label, value, h)) in beside.into_iter().enumerate() {
        runs.push(KnobRun {
            value,
            label,
            histories: vec![h],
            command: commands.get(i + 1).cloned().unwrap_or_default(),
        });
    }
    runs
}

/// Whether the model, replaying the program whole at the failed `value` (`own`), fails it where the run
/// failed (its request `failed_at`): otherwise its "fits" says nothing of this run, and no value is advised.
fn reproduced(
    job: &KnobJob,
    own: &KnobConfig,
    knob: &str,
    value: u64,
    failed_at: usize,
) -> Result<(), String> {
    // The model must fail the program where the run failed, or its "fits" says nothing of this run.
    if own.at[0].fits != Some(false) {
        return Err(format!(
            "replayed whole at {} {}, the program fits what the allocator could have had, where the run failed: \
             the model does not reproduce the failure, so no value is advised",
            knob, value
        ));
    }
    // ... and no later than the run failed: a model that fails only further on explains another failure.
    if let Some(x) = &own.at[0].first_failure {
        let a = &job.aligned;
        let t = a.nearest(value);
        let k = a.slots[x.history].at[t].partition_point(|&i| (i as usize) < x.entry);
        if k > failed_at {
            return Err(format!(
                "replayed whole at {} {}, the program is first refused at request {} where the run was at request \
                 {}: the model does not reproduce the failure, so no value is advised",
                knob,
                value,
                k + 1,
                failed_at + 1
            ));
        }
    }
    Ok(())
}

/// Whether the value per step of the accumulation advised (`micro`) fits too, replayed: fitting is not
/// monotone in the knob (and with both paths' requests where the runs' paths differ: then their peak within
/// `bytes`, what the allocator could have had).
fn accumulation_fits(
    job: &KnobJob,
    micro: u64,
    limit: &Limit,
    bytes: u64,
    own_requests: u64,
) -> bool {
    let at = answer(job, &[], &[micro], Some(limit.clone()));
    let a = &at.configs[0].at[0];
    a.fits == Some(true)
        && (own_requests == 0 || a.alternative.as_ref().is_none_or(|p| p.peak <= bytes))
}

/// Steps of gradient accumulation that keep an effective batch of `effective` with at most `largest` a step:
/// the fewest steps that divide it exactly (up to twice the fewest that could, 64 more at most), else the fewest,
/// each step
/// `ceil(effective / steps)` (an effective batch a little larger). `None` when one step fits it.
pub fn accumulation(effective: u64, largest: u64) -> Option<(u64, u64)> {
    if largest == 0 || largest >= effective {
        return None;
    }
    let fewest = effective.div_ceil(largest);
    (fewest
        ..=fewest
            .saturating_mul(2)
            .min(fewest.saturating_add(64))
            .min(effective))
        .find(|&k| effective.is_multiple_of(k))
        .map(|k| (k, effective / k))
        .or(Some((fewest, effective.div_ceil(fewest))))
}

#[cfg(test)]
mod tests {
    use super::accumulation;

    #[test]
    fn accumulation_keeps_the_effective_batch_exactly_where_it_can() {
        assert_eq!(accumulation(32, 26), Some((2, 16)));
        assert_eq!(accumulation(32, 16), Some((2, 16)));
        assert_eq!(
            accumulation(32, 15),
            Some((4, 8)),
            "3 steps do not divide 32"
        );
        assert_eq!(accumulation(30, 7), Some((5, 6)));
        // A prime: no divisor near, so the fewest steps, a little more than asked.
        assert_eq!(accumulation(31, 20), Some((2, 16)));
        assert_eq!(accumulation(8, 8), None);
        assert_eq!(accumulation(8, 0), None);
        assert_eq!(accumulation(u64::MAX, 1), Some((u64::MAX, 1)));
        // A prime near 2^32 over 2: bounded, not two billion tries.
        assert_eq!(accumulation(4_294_967_291, 2), Some((2_147_483_646, 2)));
    }
}

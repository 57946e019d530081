//! The answers a what-if gives for one job (one trace: one host): per configuration, the job's peak per device,
//! whether it fits a limit and where it would first fail, the smallest limit it fits in, and which configuration
//! saves most. Configurations are replayed in parallel, one thread each.

use std::collections::BTreeMap;

use super::history::History;
use super::settings::{Backend, Settings};
use super::sim::{Failure, Job, Replayed};

/// The limit the answers are judged against, per device, and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    pub bytes: BTreeMap<u32, u64>,
    /// "the run's cap", "--cap 20GiB", "--device-memory 80GiB less 0.5 GiB per process for its CUDA context".
    pub what: String,
}

/// One configuration's answers.
#[derive(Clone, Debug)]
pub struct ConfigAnswer {
    /// `None`: each process as it ran (its snapshot's settings).
    pub settings: Option<Settings>,
    pub label: String,
    /// The `PYTORCH_CUDA_ALLOC_CONF` string that sets it (as run: the run's, when all processes agree).
    pub conf: String,
    /// The backend's model is a lower bound (`cudaMallocAsync`: the driver's pool is not public).
    pub approximate: bool,
    pub devices: Vec<DeviceAnswer>,
    /// Per history (same order as the job's), the replay's reserve at its most, retries and refusals.
    pub processes: Vec<ProcessAnswer>,
    /// Under the limit: whether every request got through, and the first that did not.
    pub fits: Option<bool>,
    pub first_failure: Option<Failure>,
    /// The run's own out-of-memory requests this configuration gets through under the limit.
    pub passes_run_ooms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAnswer {
    pub device: u32,
    /// The job's most bytes at once on the device (PyTorch's reserves with what is held outside them).
    pub peak: u64,
    pub allocated_peak: u64,
    /// The smallest limit under which every request gets through.
    pub smallest_limit: u64,
    pub fits: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessAnswer {
    /// Its reserve at its most with no limit.
    pub reserved_peak: u64,
    /// Its reserve at its most under the limit (flushing its cache and retrying as PyTorch does); the same as
    /// `reserved_peak` without one.
    pub reserved_peak_limited: u64,
    pub retries: u64,
    pub failures: u64,
}

/// How well the model replays what the run did: per history, the run's reserve at its most (from its segment
/// entries) and the model's under the same settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    pub history: usize,
    pub recorded_peak: u64,
    pub modelled_peak: u64,
}

impl Check {
    /// (modelled - recorded) / recorded.
    pub fn error(&self) -> f64 {
        if self.recorded_peak == 0 {
            return 0.0;
        }
        (self.modelled_peak as f64 - self.recorded_peak as f64) / self.recorded_peak as f64
    }
}

/// What a what-if says of one job.
#[derive(Clone, Debug)]
pub struct WhatIf {
    pub histories: Vec<History>,
    pub outside: Vec<u64>,
    pub limit: Option<Limit>,
    /// The first is always "as run".
    pub configs: Vec<ConfigAnswer>,
    pub checks: Vec<Check>,
    /// The configuration that needs the least (the smallest limit, then the lowest peak), if it is not "as run".
    pub best: Option<usize>,
}

impl WhatIf {
    /// The largest smallest-limit over devices: what a job-wide cap on every device must be.
    pub fn needs(&self, c: usize) -> u64 {
        self.configs[c]
            .devices
            .iter()
            .map(|d| d.smallest_limit)
            .max()
            .unwrap_or(0)
    }

    pub fn peak(&self, c: usize) -> u64 {
        self.configs[c]
            .devices
            .iter()
            .map(|d| d.peak)
            .max()
            .unwrap_or(0)
    }
}

/// One configuration's replays: unlimited, under the limit, and the smallest limit per device.
type Replays = (Replayed, Option<Replayed>, BTreeMap<u32, u64>);

fn one(job: &Job, settings: Option<&Settings>, limit: Option<&Limit>, smallest: bool) -> Replays {
    let hs = job.histories;
    let pick = |i: usize| match settings {
        Some(s) => s.clone(),
        None => hs[i].recorded.clone(),
    };
    let unlimited = job.replay(&pick, &BTreeMap::new());
    let limited = limit.map(|l| job.replay(&pick, &l.bytes));
    let smallest = if smallest {
        let tried = limited.as_ref().zip(limit.map(|l| &l.bytes));
        job.smallest_limits(&pick, &unlimited, tried)
    } else {
        unlimited.device_peak.clone()
    };
    (unlimited, limited, smallest)
}

/// The configurations to replay: "as run" (`None`) first, then each of `configs` that differs from it and from
/// the others.
pub fn to_try(histories: &[History], configs: &[Settings]) -> Vec<Option<Settings>> {
    let same_as_run =
        |s: &Settings| !histories.is_empty() && histories.iter().all(|h| &h.recorded == s);
    let mut tried: Vec<Option<Settings>> = vec![None];
    for c in configs {
        if !same_as_run(c) && !tried.iter().any(|t| t.as_ref() == Some(c)) {
            tried.push(Some(c.clone()));
        }
    }
    tried
}

/// The settings string the processes ran with, when they agree.
pub fn run_conf(histories: &[History]) -> String {
    let confs: Vec<String> = histories.iter().map(|h| h.recorded.conf()).collect();
    if confs.windows(2).all(|w| w[0] == w[1]) {
        confs.first().cloned().unwrap_or_default()
    } else {
        "(differs between processes)".to_string()
    }
}

/// A configuration's label, its conf string, and whether its model is a lower bound only.
pub fn describe(
    settings: Option<&Settings>,
    histories: &[History],
    run_conf: &str,
) -> (String, String, bool) {
    match settings {
        None => (
            "as run".to_string(),
            run_conf.to_string(),
            histories
                .iter()
                .any(|h| h.recorded.backend == Backend::CudaMallocAsync),
        ),
        Some(s) => (s.label(), s.conf(), s.backend == Backend::CudaMallocAsync),
    }
}

/// `f(0..n)`, spread over the machine's threads (each configuration's replays are independent).
pub fn parallel<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(n)
        .max(1);
    let mut results: Vec<Option<T>> = (0..n).map(|_| None).collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let f = &f;
                scope.spawn(move || {
                    (t..n)
                        .step_by(threads)
                        .map(|i| (i, f(i)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            for (i, r) in h.join().expect("a what-if replay panicked") {
                results[i] = Some(r);
            }
        }
    });
    results
        .into_iter()
        .map(|r| r.expect("every configuration was replayed"))
        .collect()
}

/// Replays `histories` (one job, one host) as run and under each of `configs`.
pub fn answer(
    histories: Vec<History>,
    outside: Vec<u64>,
    device_total: BTreeMap<u32, u64>,
    others: BTreeMap<u32, u64>,
    configs: &[Settings],
    limit: Option<Limit>,
) -> WhatIf {
    answer_with(
        histories,
        outside,
        device_total,
        others,
        configs,
        limit,
        true,
    )
}

/// [`answer`]; with `every_smallest` false, only "as run" gets its smallest limit searched (the others' is
/// their peak): the post-mortem asks only which settings fit, and a search costs several replays each.
pub fn answer_with(
    histories: Vec<History>,
    outside: Vec<u64>,
    device_total: BTreeMap<u32, u64>,
    others: BTreeMap<u32, u64>,
    configs: &[Settings],
    limit: Option<Limit>,
    every_smallest: bool,
) -> WhatIf {
    let tried = to_try(&histories, configs);
    let job = Job::new(&histories, outside.clone(), device_total, others);
    let results = parallel(tried.len(), |i| {
        one(
            &job,
            tried[i].as_ref(),
            limit.as_ref(),
            every_smallest || i == 0,
        )
    });
    let run_conf = run_conf(&histories);
    let mut answers = Vec::new();
    let mut checks = Vec::new();
    for (i, (t, r)) in tried.iter().zip(results).enumerate() {
        let (unlimited, limited, smallest) = r;
        if i == 0 {
            for (h, hist) in histories.iter().enumerate() {
                checks.push(Check {
                    history: h,
                    recorded_peak: hist.recorded_reserved_peak,
                    modelled_peak: unlimited.outcomes[h].reserved_peak,
                });
            }
        }
        let devices = unlimited
            .device_peak
            .iter()
            .map(|(&d, &peak)| DeviceAnswer {
                device: d,
                peak,
                allocated_peak: unlimited
                    .device_allocated_peak
                    .get(&d)
                    .copied()
                    .unwrap_or(0),
                smallest_limit: smallest.get(&d).copied().unwrap_or(peak),
                fits: limited.as_ref().map(|l| !l.failed_devices.contains(&d)),
            })
            .collect();
        let processes = unlimited
            .outcomes
            .iter()
            .zip(
                limited
                    .as_ref()
                    .map(|l| &l.outcomes)
                    .unwrap_or(&unlimited.outcomes),
            )
            .map(|(u, l)| ProcessAnswer {
                reserved_peak: u.reserved_peak,
                reserved_peak_limited: l.reserved_peak,
                retries: l.retries,
                failures: l.failures,
            })
            .collect();
        let (label, conf, approximate) = describe(t.as_ref(), &histories, &run_conf);
        answers.push(ConfigAnswer {
            settings: t.clone(),
            label,
            conf,
            approximate,
            devices,
            processes,
            fits: limited.as_ref().map(|l| l.failures == 0),
            first_failure: limited.as_ref().and_then(|l| l.first_failure.clone()),
            passes_run_ooms: limited.as_ref().map_or(0, |l| l.passed_run_ooms),
        });
    }
    let mut w = WhatIf {
        histories,
        outside,
        limit,
        configs: answers,
        checks,
        best: None,
    };
    // The best: under a limit, one that fits it; then the least needed cap, then the lowest peak. Approximate
    // models are not chosen. Reported when it needs less than the run's own settings, or fits where they do not.
    let fits = |c: usize| w.configs[c].fits == Some(true);
    let best = (0..w.configs.len())
        .filter(|&c| !w.configs[c].approximate && (w.limit.is_none() || fits(c)))
        .min_by_key(|&c| (w.needs(c), w.peak(c), c));
    w.best = best.filter(|&b| b != 0 && (w.needs(b) < w.needs(0) || (fits(b) && !fits(0))));
    w
}

//! The what-if's command line, shared by `whatif`, `whatif --knob` (`verbs/whatif_knob.rs`) and `fit`, which
//! builds one for each search: its arguments, the allocator configurations they name, and the limit they set
//! (`--cap`, `--device-memory`, or the run's own cap).

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;
use vramtrace_format::cap::CapSpec;

use crate::whatif::answer::Limit;
use crate::whatif::from_trace::Loaded;
use crate::whatif::settings::{default_grid, Settings};

/// What each process is assumed to lose to its CUDA context under `--device-memory` (the context, cuBLAS and
/// cuDNN handles: 300 to 600 MiB on recent GPUs and drivers), since the trace counts allocations only.
pub const CONTEXT_ALLOWANCE: u64 = 512 << 20;

#[derive(Args, Debug)]
pub struct WhatifArgs {
    /// Trace files written by `vramtrace run --torch-history N` (one per host of the job); with --knob, two or
    /// three runs of one program as FILE=VALUE (the knob's value in that run).
    #[arg(required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
    /// The runs differ in this knob (a name for reports: batch, seq, ...): match their allocations, fit each
    /// size in the knob, and answer at other values (docs/WHATIF.md, "What if the batch").
    #[arg(long)]
    pub knob: Option<String>,
    /// With --knob: a value to predict the peaks at (repeat for several).
    #[arg(long, requires = "knob")]
    pub at: Vec<u64>,
    /// Judge every configuration against this job-wide cap (the syntax of `run --cap`); default: the run's own
    /// cap, if it had one.
    #[arg(long, conflicts_with = "device_memory")]
    pub cap: Option<String>,
    /// Judge against a device of this much memory (a size or a share, per device as in --cap), less 512 MiB per
    /// process for its CUDA context.
    #[arg(long)]
    pub device_memory: Option<String>,
    /// A PYTORCH_CUDA_ALLOC_CONF to try (repeat for several); default: a grid of the usual advice.
    #[arg(long = "alloc-conf")]
    pub alloc_conf: Vec<String>,
    /// Print the documented JSON (docs/JSON-SCHEMA.md) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `processes`: the device of each process's history (a device once per process on it: `--device-memory`
/// leaves each process its context's allowance).
pub fn limit_for(
    args: &WhatifArgs,
    l: &Loaded,
    processes: &[u32],
) -> Result<Option<Limit>, String> {
    let mut devices = processes.to_vec();
    devices.sort_unstable();
    devices.dedup();
    let devices = &devices[..];
    let total = |d: u32| l.device_total.get(&d).copied().unwrap_or(0);
    if let Some(spec) = &args.cap {
        let s = CapSpec::parse(spec).map_err(|e| format!("--cap {spec}: {e}"))?;
        let bytes = devices
            .iter()
            .filter_map(|&d| s.amount(d).map(|a| (d, a.bytes(total(d)))))
            .collect();
        return Ok(Some(Limit {
            bytes,
            what: format!("--cap {spec}"),
        }));
    }
    if let Some(spec) = &args.device_memory {
        let s = CapSpec::parse(spec).map_err(|e| format!("--device-memory {spec}: {e}"))?;
        let mut per = BTreeMap::new();
        for &d in processes {
            *per.entry(d).or_insert(0u64) += 1;
        }
        let bytes = devices
            .iter()
            .filter_map(|&d| {
                s.amount(d).map(|a| {
                    let n = per.get(&d).copied().unwrap_or(1);
                    (d, a.bytes(total(d)).saturating_sub(n * CONTEXT_ALLOWANCE))
                })
            })
            .collect();
        return Ok(Some(Limit {
            bytes,
            what: format!(
                "--device-memory {spec}, less {} per process for its CUDA context",
                crate::names::units::bytes(CONTEXT_ALLOWANCE)
            ),
        }));
    }
    if !l.run_cap.is_empty() {
        let bytes = devices
            .iter()
            .filter_map(|d| l.run_cap.get(d).map(|&c| (*d, c)))
            .collect();
        return Ok(Some(Limit {
            bytes,
            what: "the run's cap".to_string(),
        }));
    }
    Ok(None)
}

/// The configurations to try: those given, else the grid.
pub fn configs(given: &[String]) -> Result<Vec<Settings>, String> {
    if given.is_empty() {
        return Ok(default_grid());
    }
    given
        .iter()
        .map(|c| Settings::parse(c).map_err(|e| format!("--alloc-conf {c:?}: {e}")))
        .collect()
}

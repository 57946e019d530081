//! `vramtrace`: parses the command line and hands each verb to its own module. Nothing else lives here.

use std::path::PathBuf;

use vramtrace_collector::process::{exit, probe};
use vramtrace_collector::verbs::{demo, export, fit, fleet, kernel, oom, report, run, top, whatif};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "vramtrace",
    version,
    about = "See, cap and explain the GPU memory of any CUDA program"
)]
struct Cli {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand)]
enum Verb {
    /// Run a command with every process it starts traced: `vramtrace run [--out FILE] -- CMD...`
    Run(run::RunArgs),
    /// Report peaks, timelines and memory still live at the end, from a trace file.
    Report {
        /// The trace file written by `vramtrace run`; several traces of one job (one per node) are merged.
        #[arg(required = true, num_args = 1..)]
        files: Vec<PathBuf>,
        /// Print the documented JSON (docs/JSON-SCHEMA.md) instead of text.
        #[arg(long)]
        json: bool,
        /// Merge traces even when they are of different jobs.
        #[arg(long)]
        force: bool,
    },
    /// Explain an out-of-memory death from a trace file: the cause, what was live, advice (docs/OOM.md).
    Oom {
        /// The trace file written by `vramtrace run`; several traces of one job (one per node) are merged.
        #[arg(required = true, num_args = 1..)]
        files: Vec<PathBuf>,
        /// Print the documented JSON (docs/JSON-SCHEMA.md) instead of text.
        #[arg(long)]
        json: bool,
        /// Every section: each error's live allocations, sizes, call sites and timeline, and how every process
        /// ended (by default: one screen per error).
        #[arg(long)]
        full: bool,
        /// Merge traces even when they are of different jobs.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        beside: oom::BesideArgs,
    },
    /// Write a trace for a viewer people already use: `vramtrace export TRACE --format memory-viz --out FILE`.
    Export(export::ExportArgs),
    /// Attach to a running job (`vramtrace run --metrics`): bytes in use per GPU and process, peak, cap,
    /// headroom, allocation rate, refreshed.
    Top(top::TopArgs),
    /// Run the bundled workload under `vramtrace run` (real GPU if present, simulated driver otherwise), then report.
    Demo(demo::DemoArgs),
    /// Replay each process's PyTorch history (`run --torch-history N`) under other allocator settings: which
    /// fit, the smallest cap each needs, where each would first fail, and which saves most.
    Whatif(whatif::WhatifArgs),
    /// The largest batch (or any whole-number knob) that fits: runs `CMD` (with `{}` where the value goes) a few
    /// steps at a time under `run`, and answers from its allocations: `vramtrace fit -- python train.py --batch {}`.
    Fit(fit::FitCliArgs),
    /// A Jupyter kernel traced by `vramtrace run`, with the `%vramtrace` magics: `vramtrace kernel install`,
    /// `list`, `remove NAME` (docs/NOTEBOOKS.md).
    Kernel(kernel::KernelArgs),
    /// (internal) Print each device's total memory, asked of the driver.
    #[command(name = "__probe", hide = true)]
    Probe,
}

fn main() {
    #[cfg(feature = "glibc217")]
    vramtrace_glibc217::link();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => exit::usage(e),
    };
    let code = match cli.verb {
        Verb::Run(args) => run::main(args),
        Verb::Report { files, json, .. } if files.len() == 1 => report::main(&files[0], json),
        Verb::Report { files, json, force } => fleet::report(&files, json, force),
        Verb::Oom {
            files,
            json,
            full,
            beside,
            ..
        } if files.len() == 1 => oom::main(&files[0], json, full, &beside),
        Verb::Oom {
            files,
            json,
            force,
            beside,
            ..
        } if beside.is_default() => fleet::oom_main(&files, json, force),
        Verb::Oom { .. } => exit::fail(
            exit::USAGE,
            "--beside, --value and --knob are for one trace (the run that failed), not several merged",
        ),
        Verb::Export(args) => export::main(args),
        Verb::Demo(args) => demo::main(args),
        Verb::Top(args) => top::main(args),
        Verb::Whatif(args) => whatif::main(args),
        Verb::Fit(args) => fit::main(args),
        Verb::Kernel(args) => kernel::main(args),
        Verb::Probe => probe::main(),
    };
    exit::with(code)
}

//! `vramtrace run`'s command line: its flags, and the values they take.

use std::ffi::OsString;
use std::path::PathBuf;

use vramtrace_format::env;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Where to write the trace (default: vramtrace-<command>-<pid>.vtrace in the current directory).
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// Overwrite the --out file if it exists (otherwise an existing file is never touched).
    #[arg(long)]
    pub force: bool,
    /// Print nothing at the end (the trace is still written).
    #[arg(long, short)]
    pub quiet: bool,
    /// Cap the job's device memory, all its processes together: a size (20GiB, 512MiB, 20G, bytes), a share
    /// of each device (50%), or per device (0=20GiB,1=10GiB). Default: $VRAMTRACE_CAP, if set.
    #[arg(long, value_name = "SPEC")]
    pub cap: Option<String>,
    /// What the cap does: `enforce` refuses allocations past it with CUDA's out-of-memory error; `warn` only
    /// records them. Default: $VRAMTRACE_CAP_MODE, else enforce.
    #[arg(long, value_enum)]
    pub cap_mode: Option<CapMode>,
    /// Which call sites to record for each allocation: native return addresses, the allocating thread's
    /// Python frames, both, or none. Default: $VRAMTRACE_STACKS, else all.
    #[arg(long, value_enum)]
    pub stacks: Option<Stacks>,
    /// Record call sites only for allocations of at least this many bytes (a size: 1MiB, 65536).
    /// Default: $VRAMTRACE_STACK_MIN_BYTES, else the shim's default.
    #[arg(long, value_name = "SIZE")]
    pub stack_min_bytes: Option<String>,
    /// The Python bridge: in Python processes, see inside PyTorch's allocator (allocated versus reserved, its
    /// out-of-memory errors). `off` leaves Python alone. Default: $VRAMTRACE_PYTHON_AGENT, else on.
    #[arg(long, value_enum, value_name = "on|off")]
    pub python_agent: Option<OnOff>,
    /// PyTorch's allocation history with Python stacks, dumped beside the trace at each out-of-memory error
    /// and at exit: names the lines whose tensors are kept alive. Default `auto`: the bridge arms it by itself
    /// when it matters (a cache flush, allocated past 90% of the limit, a rising floor) and disarms it when
    /// the pressure is gone. ENTRIES (alone: 100000): on from the start, a ring of that many. `off`: never.
    #[arg(
        long,
        value_name = "ENTRIES|auto|off",
        num_args = 0..=1,
        default_missing_value = "100000",
        value_parser = parse_history
    )]
    pub torch_history: Option<TorchHistory>,
    /// End each Python process cleanly at the boundary of its N-th step (optimizer steps, else DataLoader
    /// batches, as the bridge counts them), its history and figures kept as at exit: a few steps of a long job,
    /// with no change to it. The program's own exit handlers are skipped (a `finally:` that saves a checkpoint
    /// does not run). Processes that never step are not stopped.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub stop_after_steps: Option<u64>,
    /// Each process's event ring (shared memory the collector drains; a size, default 16MiB, about 262,000
    /// events; pages are used only as it fills). A ring that fills drops events and counts them, unless --lossless.
    #[arg(long, value_name = "SIZE")]
    pub ring_size: Option<String>,
    /// A thread that finds its process's ring full waits for room instead of dropping the event: nothing is
    /// lost, at the price of stalling the program while the collector is slow (for investigations and
    /// benchmarks). Default: $VRAMTRACE_LOSSLESS.
    #[arg(long)]
    pub lossless: bool,
    /// Serve the job's memory as Prometheus/OpenMetrics text at http://ADDR/metrics while it runs (and for
    /// `vramtrace top`): an address, or a port alone for loopback. Without ADDR: loopback, a free port.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:0")]
    pub metrics: Option<String>,
    /// Label `--metrics`' per-process series with their pids. Off by default: anyone who reaches the port
    /// (every local user, on loopback) would see them; without it a process's series are its rank's.
    #[arg(long, requires = "metrics")]
    pub metrics_pids: bool,
    /// Under a cap, what the job's first process on a GPU may hold beyond what its shim counted (its CUDA
    /// context, modules and libraries) before the GPU's own count (NVML) calls the job past its cap; each
    /// other process there adds 768MiB (at most this). Default 1.5GiB.
    #[arg(long, value_name = "SIZE")]
    pub cap_allowance: Option<String>,
    /// The job's name, for the `job` label and the trace header (traces of one job merge). Default: the
    /// launcher's job id ($SLURM_JOB_ID, $TORCHELASTIC_RUN_ID, $PBS_JOBID, $LSB_JOBID, $FLUX_JOB_ID, $JOB_ID).
    #[arg(long, value_name = "NAME")]
    pub job_name: Option<String>,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_parser = clap::value_parser!(OsString))]
    pub command: Vec<OsString>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stacks {
    None,
    Native,
    Python,
    All,
}

impl Stacks {
    /// As `VRAMTRACE_STACKS` spells it (format's `env::stacks` reads it).
    pub fn name(self) -> &'static str {
        match self {
            Stacks::None => "none",
            Stacks::Native => "native",
            Stacks::Python => "python",
            Stacks::All => "all",
        }
    }
}

/// `--torch-history`: when the bridge keeps PyTorch's allocation history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TorchHistory {
    /// The bridge arms it when memory is tight or growing (the default).
    Auto,
    Off,
    /// On from the start, a ring of this many entries.
    Entries(u64),
}

fn parse_history(s: &str) -> Result<TorchHistory, String> {
    match s.trim() {
        "auto" => Ok(TorchHistory::Auto),
        "off" | "0" => Ok(TorchHistory::Off),
        n => match n.parse::<u64>() {
            Ok(n) => Ok(TorchHistory::Entries(n)),
            Err(_) => Err(format!("'{n}' is not a number of entries, auto or off")),
        },
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnOff {
    On,
    Off,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapMode {
    Enforce,
    Warn,
}

impl From<env::CapMode> for CapMode {
    fn from(m: env::CapMode) -> CapMode {
        match m {
            env::CapMode::Enforce => CapMode::Enforce,
            env::CapMode::Warn => CapMode::Warn,
        }
    }
}

impl CapMode {
    /// As `VRAMTRACE_CAP_MODE` spells it.
    pub fn name(self) -> &'static str {
        match self {
            CapMode::Enforce => env::CapMode::Enforce.name(),
            CapMode::Warn => env::CapMode::Warn.name(),
        }
    }
}

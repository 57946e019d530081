//! `vramtrace run`: start the command with the shim preloaded, receive every process's events over a Unix
//! socket in a private directory, and append them to the trace as whole frames the moment they arrive, so that a
//! run ended by anything (SIGKILL included) leaves a trace readable up to its last whole frame.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};
use vramtrace_format::keys;

use anyhow::{bail, Context};
use vramtrace_format::codec;
use vramtrace_format::{Record, TraceHeader};

use crate::cap_check::CapOn;
use crate::exit::{self, Code};
use crate::probe;
use crate::receive::{spawn_acceptor, Connections, TraceWriter};
use crate::runtime_dir::RuntimeDir;
use crate::ticks::mono_ns;
use crate::units;
use vramtrace_format::cap::CapSpec;
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
    /// Under a cap, what each process may hold on a GPU beyond what its shim counted (its CUDA context,
    /// modules and libraries) before the GPU's own count (NVML) calls the job past its cap. Default 1.5GiB.
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

/// Keys and values for the trace header's `extra`.
type HeaderKeys = Vec<(String, String)>;

/// After the command exits, how long to wait for its other processes' connections to close.
const LINGER: Duration = Duration::from_secs(2);

pub fn main(args: RunArgs) -> Code {
    // Signals are blocked before any thread exists, so every thread inherits the mask and they reach us only
    // through the signalfd. The child gets an empty mask back before it execs.
    let signals = match Signals::block() {
        Ok(s) => s,
        Err(e) => return exit::fail(exit::FAILURE, format!("cannot set up signal handling: {e}")),
    };
    let prep = match Prepared::new(&args) {
        Ok(p) => p,
        Err(e) => match e.downcast_ref::<crate::runtime_dir::NoRuntimeDir>() {
            // Nowhere to put the socket (every base out of inodes, say): the job still runs, untraced.
            Some(why) => return run_untraced(&args, why, &signals),
            None => return exit::fail(exit::USAGE, format!("{e:#}")),
        },
    };
    prep.execute(&args, signals)
}

/// Runs the command as it is, without the shim, when the job's runtime directory cannot be made: nothing of the
/// job is traced, capped or bridged, and `run` says so in one line before the job starts. Signals sent to us
/// are passed on as in a traced run; its exit code is the command's.
fn run_untraced(args: &RunArgs, why: &crate::runtime_dir::NoRuntimeDir, signals: &Signals) -> Code {
    let cap = args.cap.clone().or_else(|| {
        std::env::var(env::CAP)
            .ok()
            .filter(|c| !c.trim().is_empty())
    });
    // An enforced cap that cannot be kept is not dropped quietly on a shared GPU: refused, as before the job.
    if cap.is_some() && cap_mode(args).is_ok_and(|m| m == CapMode::Enforce) {
        return exit::fail(
            exit::USAGE,
            format!(
                "{why}: the cap cannot be enforced without it, so the job was not started (with \
                 --cap-mode warn it runs untraced and uncapped)"
            ),
        );
    }
    eprintln!(
        "vramtrace: {why}: the job runs untraced: no trace is written{}, no Python bridge",
        cap.map_or(String::new(), |c| format!(
            ", the cap ({c}, warn) is not checked"
        ))
    );
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return spawn_failed(args, &e),
    };
    let pid = child.id() as i32;
    std::mem::forget(child);
    loop {
        let mut status = 0;
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            if let Some(x) = vramtrace_format::ExitStatus::from_wait(status) {
                return x.shell_code();
            }
        } else if r < 0 {
            return exit::FAILURE;
        }
        if let Some(signo) = wait_signal(signals, 200) {
            if FORWARDED.contains(&signo.0) && signo.1 != libc::SI_KERNEL {
                unsafe { libc::kill(pid, signo.0) };
            }
        }
    }
}

/// Exit code and one line for a command that could not be started.
fn spawn_failed(args: &RunArgs, e: &io::Error) -> Code {
    let name = args.command[0].to_string_lossy();
    match e.kind() {
        io::ErrorKind::NotFound => {
            exit::fail(exit::NOT_FOUND, format!("{name}: command not found"))
        }
        io::ErrorKind::PermissionDenied => {
            exit::fail(exit::NOT_EXECUTABLE, format!("{name}: permission denied"))
        }
        _ => exit::fail(exit::NOT_EXECUTABLE, format!("{name}: cannot run: {e}")),
    }
}

/// Everything made before the command starts. Any failure here is the user's input: exit 2, nothing started.
struct Prepared {
    shim: PathBuf,
    out: PathBuf,
    trace: Arc<Mutex<TraceWriter>>,
    /// Held for its Drop: the directory goes when the run ends.
    _dir: RuntimeDir,
    listener: UnixListener,
    socket: PathBuf,
    cap: Option<String>,
    ledger: PathBuf,
    cap_mode: CapMode,
    /// The Python bridge's directory, to put first on PYTHONPATH (none: `--python-agent off`).
    bridge: Option<PathBuf>,
    /// `--metrics`: the server, stopped when the run ends.
    _metrics: Option<crate::live::Running>,
    /// The job's cap per GPU, and the trace's reader, for the check against the GPU's own count.
    cap_on: Vec<CapOn>,
    cap_allowance: u64,
    live: Option<Arc<crate::live::Live>>,
}

impl Prepared {
    fn new(args: &RunArgs) -> anyhow::Result<Prepared> {
        let shim = find_shim()?;
        let cap = args.cap.clone().or_else(|| {
            std::env::var(env::CAP)
                .ok()
                .filter(|c| !c.trim().is_empty())
        });
        let mode = cap_mode(args)?;
        // What the job inherits from our environment (no flag given for it) is checked as the flags are: the
        // shim would only warn and use its default.
        let inherited = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        if args.stacks.is_none() {
            if let Some(v) = inherited(env::STACKS) {
                env::stacks(Some(&v)).map_err(|e| anyhow::anyhow!(e))?;
            }
        }
        for (k, given) in [
            (env::STACK_MIN_BYTES, args.stack_min_bytes.is_some()),
            (env::RING_BYTES, args.ring_size.is_some()),
        ] {
            if let Some(v) = inherited(k).filter(|_| !given) {
                env::size(&v).map_err(|e| anyhow::anyhow!("{k}={v:?}: {e}"))?;
            }
        }
        let cap_allowance = match &args.cap_allowance {
            Some(a) => env::size(a).map_err(|e| anyhow::anyhow!("--cap-allowance {a}: {e}"))?,
            None => crate::cap_check::ALLOWANCE,
        };
        let mut extra = Vec::new();
        let mut cap_on = Vec::new();
        if let Some(spec) = &cap {
            (extra, cap_on) = check_cap(spec, mode)?;
        }
        if let Some(min) = &args.stack_min_bytes {
            env::size(min).map_err(|e| anyhow::anyhow!("--stack-min-bytes {min}: {e}"))?;
        }
        if let Some(r) = &args.ring_size {
            let b = env::size(r).map_err(|e| anyhow::anyhow!("--ring-size {r}: {e}"))?;
            let (lo, hi) = (
                vramtrace_format::ring::bytes_for(vramtrace_format::ring::MIN_SLOTS),
                vramtrace_format::ring::bytes_for(vramtrace_format::ring::MAX_SLOTS),
            );
            if b < lo as u64 || b > hi as u64 {
                bail!("--ring-size {r}: must be between {lo} and {hi} bytes");
            }
        }
        // The acceptor's ticks of pid 0 bound what processes still to come can hold (docs/TRACE-FORMAT.md).
        extra.push((keys::header::NEWCOMER_TICKS.to_string(), "1".to_string()));
        // A process's goodbye is written once its ring is drained, after its last record (the replay releases
        // what it held there: docs/TRACE-FORMAT.md).
        extra.push((keys::header::GOODBYE_LAST.to_string(), "1".to_string()));
        // The trace ends with an end record once finished: a reader then knows a trace without one was cut.
        extra.push((keys::header::END_RECORD.to_string(), "1".to_string()));
        let out = args
            .out
            .clone()
            .unwrap_or_else(|| default_out(&args.command));
        let agent = args.python_agent.unwrap_or_else(|| {
            match std::env::var("VRAMTRACE_PYTHON_AGENT")
                .as_deref()
                .map(str::trim)
            {
                Ok("off" | "0" | "no" | "false") => OnOff::Off,
                _ => OnOff::On,
            }
        });
        if agent == OnOff::Off && matches!(args.torch_history, Some(TorchHistory::Entries(_))) {
            bail!("--torch-history needs the Python bridge, which --python-agent off turns off");
        }
        // A private temporary beside `out`, renamed onto it once the run can start (never through a link, never
        // onto another user's file: `out_file`). Until then a failure leaves whatever was at `out` untouched.
        let mut pending = crate::out_file::OutFile::create(&out, args.force)?;
        // Traces of one job (one per node) merge in `report`; the `job` label of `--metrics`.
        let job = crate::live::job_name(args.job_name.as_deref());
        if let Some((name, from)) = &job {
            extra.push((keys::header::JOB.to_string(), name.clone()));
            extra.push((keys::header::JOB_SOURCE.to_string(), from.to_string()));
        }
        let metrics_addr = match &args.metrics {
            Some(m) => Some(
                crate::live::parse_addr(m).map_err(|e| anyhow::anyhow!("--metrics {m}: {e}"))?,
            ),
            None => None,
        };
        // The report can then say which Python processes the bridge did not run in.
        extra.push((
            keys::header::PYTHON_AGENT.to_string(),
            if agent == OnOff::On { "on" } else { "off" }.to_string(),
        ));
        let header = TraceHeader {
            start_unix_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
            start_mono_ns: mono_ns(),
            command: args
                .command
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            hostname: crate::receive::hostname(),
            vramtrace_version: env!("CARGO_PKG_VERSION").to_string(),
            extra,
        };
        let head = codec::encode_header(&header);
        pending
            .file()
            .write_all(&head)
            .with_context(|| format!("cannot write {}", out.display()))?;
        // The trace's own folder is the last place tried: the user could write there.
        let folder = out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let dir = RuntimeDir::create(Some(folder))?;
        // Only the job's user reaches the runtime directory: 0700, the socket 0600 (mkdtemp made it ours). Run as
        // root, a process of the job may drop its privileges to another user and must still connect: then the
        // directory lets others through (0711) but not list it, every name in it is random, the socket is
        // 0666, and the peer check (`spawn_acceptor`, on the kernel's credentials) turns away anything that does
        // not descend from the job.
        let root = unsafe { libc::geteuid() } == 0;
        let socket = dir.path.join(format!("sock-{:016x}", random_u64()));
        let listener = UnixListener::bind(&socket)
            .with_context(|| format!("cannot listen on {}", socket.display()))?;
        set_mode(&dir.path, if root { 0o711 } else { 0o700 })?;
        set_mode(&socket, if root { 0o666 } else { 0o600 })?;
        // The cap's ledger: the job's user's alone (a lock on its slot bytes is a claim on the cap), at a name
        // no one can guess, made afresh.
        let ledger = dir.path.join(format!("ledger-{:016x}", random_u64()));
        if cap.is_some() {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&ledger)
                .with_context(|| format!("cannot create {}", ledger.display()))?;
        }
        // A runtime filesystem that cannot take the bridge (full) does not stop the job: its Python processes
        // are traced without it, and the summary says so, as the cap's ledger degrades.
        let bridge = match agent {
            OnOff::On => match crate::bridge_files::write(&dir.path.join("python")) {
                Ok(p) => Some(p),
                Err(e) => {
                    eprintln!(
                        "vramtrace: cannot write the Python bridge into {} ({e}): Python processes are traced \
                         without it (no view inside PyTorch's or JAX's allocator)",
                        dir.path.display()
                    );
                    None
                }
            },
            OnOff::Off => None,
        };
        let file = pending
            .file()
            .try_clone()
            .with_context(|| format!("cannot write {}", out.display()))?;
        let reader = file.try_clone().ok();
        let writer = TraceWriter::new(file, head.len() as u64);
        let metrics = match metrics_addr {
            Some(addr) => {
                let labels = crate::live::JobLabels {
                    job: job.map(|j| j.0).unwrap_or_default(),
                    host: header.hostname.clone(),
                    uuids: crate::live::uuids_from_env(),
                    pids: args.metrics_pids,
                };
                let live = crate::live::Live::new(
                    labels,
                    &header,
                    reader,
                    head.len() as u64,
                    writer.written.clone(),
                );
                let running =
                    crate::live::Running::start(addr, live, &header.command.join(" "), &out)
                        .with_context(|| format!("--metrics: cannot listen on {addr}"))?;
                if !args.quiet {
                    eprintln!(
                        "vramtrace: metrics at http://{}/metrics",
                        running.server.addr
                    );
                }
                Some(running)
            }
            None => None,
        };
        // The cap's check against the GPU's count reads the trace as the metrics do (their reader, if running).
        let live = match (&metrics, cap_on.is_empty()) {
            (_, true) => None,
            (Some(m), false) => Some(m.live.clone()),
            (None, false) => pending.file().try_clone().ok().map(|f| {
                crate::live::Live::new(
                    crate::live::JobLabels::default(),
                    &header,
                    Some(f),
                    head.len() as u64,
                    writer.written.clone(),
                )
            }),
        };
        // Everything that could refuse the run has been made: the trace takes its name.
        pending.commit()?;
        Ok(Prepared {
            shim,
            out,
            trace: Arc::new(Mutex::new(writer)),
            _metrics: metrics,
            cap_on,
            cap_allowance,
            live,
            _dir: dir,
            listener,
            socket,
            cap,
            ledger,
            cap_mode: mode,
            bridge,
        })
    }

    fn execute(self, args: &RunArgs, signals: Signals) -> Code {
        // Every process of the job that loses its parent becomes ours: we learn how it ended (its wait status),
        // and when none is left, that the job is over.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        // The clock's first sample before the job starts: its events' counter ticks convert without a wait.
        crate::ticks::start();
        // One socket per live process of the job, and a ring passed with each hello: room for many (the
        // command gets the limit it had).
        let nofile = crate::fdlimit::raise();
        // The job's token: only the job's processes see it (their environment), so it vouches for one of
        // another user that was gone before the kernel could be asked where it came from.
        let token = format!("{:016x}{:016x}", random_u64(), random_u64());
        // The job's settings, answered to each process's hello: its shim applies the job's cap, whatever its own
        // environment says (a child started with its own VRAMTRACE_CAP, or without VRAMTRACE_LEDGER).
        let settings = vramtrace_format::settings::JobSettings {
            cap: self.cap.clone(),
            warn: self.cap_mode == CapMode::Warn,
            ledger: self.cap.as_ref().map(|_| {
                use std::os::unix::ffi::OsStrExt;
                self.ledger.as_os_str().as_bytes().to_vec()
            }),
        };
        let conns = Arc::new(Connections::new(&token).with_settings(&settings));
        let acceptor = spawn_acceptor(
            self.listener.try_clone().ok(),
            self.trace.clone(),
            conns.clone(),
        );

        let mut cmd = Command::new(&args.command[0]);
        cmd.args(&args.command[1..]);
        let mut preload = OsString::from(&self.shim);
        if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
            preload.push(":");
            preload.push(old);
        }
        cmd.env("LD_PRELOAD", preload)
            .env(env::SOCKET, &self.socket)
            .env(env::JOB_TOKEN, &token);
        // Snapshots and other files the job's processes write beside the trace.
        cmd.env(
            "VRAMTRACE_TRACE",
            std::path::absolute(&self.out).unwrap_or_else(|_| self.out.clone()),
        );
        match &self.bridge {
            Some(dir) => {
                let mut path = dir.clone().into_os_string();
                if let Some(old) = std::env::var_os("PYTHONPATH").filter(|v| !v.is_empty()) {
                    path.push(":");
                    path.push(old);
                }
                cmd.env("PYTHONPATH", path)
                    .env("VRAMTRACE_PYTHON_AGENT", "on");
                match args.torch_history {
                    Some(TorchHistory::Entries(n)) => {
                        cmd.env("VRAMTRACE_TORCH_HISTORY", n.to_string());
                    }
                    Some(TorchHistory::Off) => {
                        cmd.env("VRAMTRACE_TORCH_HISTORY", "off");
                    }
                    // The bridge's default; an inherited setting is the caller's.
                    Some(TorchHistory::Auto) => {
                        cmd.env("VRAMTRACE_TORCH_HISTORY", "auto");
                    }
                    None => {}
                }
            }
            None => {
                cmd.env("VRAMTRACE_PYTHON_AGENT", "off");
            }
        }
        // Each as format's `env` parses it in the shim.
        if let Some(stacks) = args.stacks {
            cmd.env(env::STACKS, stacks.name());
        }
        if let Some(min) = &args.stack_min_bytes {
            cmd.env(
                env::STACK_MIN_BYTES,
                env::size(min).unwrap_or(0).to_string(),
            );
        }
        if let Some(r) = &args.ring_size {
            cmd.env(env::RING_BYTES, env::size(r).unwrap_or(0).to_string());
        }
        if args.lossless {
            cmd.env(env::LOSSLESS, "1");
        }
        if let Some(spec) = &self.cap {
            cmd.env(env::CAP, spec)
                .env(env::CAP_MODE, self.cap_mode.name())
                .env(env::LEDGER, &self.ledger);
        }
        // Our blocked signals must not be the command's (std does not reset the mask it inherits), nor our
        // descriptor limit.
        unsafe {
            cmd.pre_exec(move || {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
                if let Some(o) = nofile {
                    o.restore();
                }
                Ok(())
            });
        }
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                // Nothing ran: the trace file we created holds only a header; take it away again.
                let _ = std::fs::remove_file(&self.out);
                return spawn_failed(args, &e);
            }
        };
        // The cap, confirmed by the GPU's own count while the job runs.
        let watch = match (&self.cap, &self.live) {
            (Some(spec), Some(live)) if !self.cap_on.is_empty() => crate::cap_check::start(
                crate::cap_check::JobCap {
                    spec: spec.clone(),
                    enforce: self.cap_mode == CapMode::Enforce,
                    on: self.cap_on.clone(),
                    allowance: self.cap_allowance,
                },
                Arc::new(CheckSink {
                    live: live.clone(),
                    trace: self.trace.clone(),
                }),
                args.quiet,
            ),
            _ => None,
        };
        let status = supervise(child.id(), &signals, &self.trace, &conns);
        // std's handle must not wait for a pid we reaped ourselves.
        std::mem::forget(child);

        // The command is gone. Its other processes are ours now: wait, briefly, until none is left, then take
        // every connection still waiting to be accepted (a process that connected and died before the acceptor
        // got to it is not lost), then let the receivers read to the end.
        let deadline = Instant::now() + LINGER;
        let running = reap_until(&signals, &self.trace, &conns, deadline);
        conns.stop.store(true, Ordering::Release);
        if let Some(a) = acceptor {
            let _ = a.join();
        }
        while conns.open.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        let lingering = conns.open.load(Ordering::Acquire);
        let code = exit_code(status);
        let breaches = watch
            .map(|w| std::mem::take(&mut *w.breaches.lock().unwrap_or_else(|e| e.into_inner())))
            .unwrap_or_default();
        // How the processes their own parents reaped ended, where the kernel agrees the parent is theirs.
        crate::receive::write_reaped(&conns, &self.trace);
        if let Ok(mut w) = self.trace.lock() {
            // Finished: the end record (on a full disk it is lost too, and the trace says it was cut).
            let mut end = Vec::new();
            codec::put_record(&mut end, &Record::End { ts_ns: mono_ns() });
            w.write(0, &end);
            let _ = w.file.sync_data();
        }
        // The readers of the trace and the files it names are bounded and should never panic; if one does
        // (a bug), the job's exit code, the losses below and the trace's path are still said.
        let summary = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut msg = String::new();
            match crate::model::analyze(&self.out) {
                Ok(a) => {
                    msg.push_str(&crate::verbs::report::summary(&a));
                    msg.push_str(&endings(&a));
                    if let Some(w) = crate::reporters::text::cap_exceeded_text(&a) {
                        msg.push_str(&w);
                        msg.push('\n');
                    }
                    msg.push_str(&self.post_mortem(&a, code, &breaches));
                }
                Err(e) => msg.push_str(&format!("cannot summarise the trace: {e}\n")),
            }
            msg
        }));
        let mut msg = summary.unwrap_or_else(|_| {
            "cannot summarise the trace: its reader failed (a bug in vramtrace: please report it with the \
             trace)\n"
                .to_string()
        });
        let loss = self
            .trace
            .lock()
            .map(|w| w.loss_report())
            .unwrap_or_default();
        let refused_any = conns.refused.lock().is_ok_and(|r| !r.is_empty());
        let starved = conns.starved.load(Ordering::Acquire);
        if !loss.is_empty() || refused_any || starved {
            // What the trace lacks may well have allocated: never claim the job did not.
            msg = msg.replace(
                "no GPU memory was allocated\n",
                "no GPU memory allocation reached the trace (below: what did not)\n",
            );
        }
        msg.push_str(&loss);
        if let Ok(refused) = conns.refused.lock() {
            for (pid, uid) in refused.iter().take(8) {
                msg.push_str(&format!(
                    "refused a connection from pid {pid} (uid {uid}): not a process of this job\n"
                ));
            }
        }
        if starved {
            msg.push_str(&format!(
                "{} (its limit: {}; raise the hard limit, `ulimit -Hn`)\n",
                crate::receive::STARVED_NOTE,
                crate::fdlimit::soft().map_or("unknown".into(), |n| n.to_string())
            ));
        }
        if lingering > 0 || running > 0 {
            msg.push_str(&format!(
                "{} process(es) of the job were still running {}s after the command ended; the trace holds \
                 what they recorded until then\n",
                lingering.max(running),
                LINGER.as_secs()
            ));
        }
        if !args.quiet {
            eprint!("{}", indent_summary(&msg));
            eprintln!("vramtrace: trace written to {}", self.out.display());
        }
        code
    }
}

impl Prepared {
    /// When the job met an out-of-memory error or ended badly, the post-mortem goes beside the trace (even
    /// with --quiet: it is the evidence) and its gist into the summary.
    fn post_mortem(
        &self,
        a: &crate::model::Analysis,
        code: Code,
        breaches: &[crate::cap_check::Breach],
    ) -> String {
        let oom = a.oom_records > 0;
        if !oom && code == exit::OK && breaches.is_empty() {
            return String::new();
        }
        let mut msg = String::new();
        // The cap past by the GPU's own count comes first: it is why the job was stopped, if it was.
        let mut head = String::new();
        for b in breaches {
            head.push_str("CAP PASSED, BY THE GPU'S OWN COUNT\n");
            for (_, line) in b.lines() {
                head.push_str(&format!("- {line}\n"));
            }
            head.push('\n');
        }
        if let Some(s) = crate::verbs::oom::summary(a) {
            msg.push_str(&s);
        } else {
            let how = if code > 128 {
                format!("was ended by signal {}", code - 128)
            } else {
                format!("exited with code {code}")
            };
            msg.push_str(&format!(
                "the command {how}; no out-of-memory error was recorded\n"
            ));
        }
        let kind = if oom { "oom" } else { "postmortem" };
        let text = format!("{head}{}", crate::verbs::oom::render_short(a));
        match write_beside(&self.out, kind, &text) {
            Ok(p) => msg.push_str(&format!(
                "post-mortem written to {} (vramtrace oom reads the trace too)\n",
                p.display()
            )),
            Err(e) => msg.push_str(&format!("cannot write the post-mortem: {e}\n")),
        }
        msg
    }
}

/// What the cap's check reads (the trace's count, as the metrics read it) and writes (its notes).
struct CheckSink {
    live: Arc<crate::live::Live>,
    trace: Arc<Mutex<TraceWriter>>,
}

impl crate::cap_check::Sink for CheckSink {
    fn counted(&self) -> Vec<crate::live::Counted> {
        self.live.counted()
    }

    fn note(&self, pid: u32, text: &str) {
        let mut buf = Vec::new();
        codec::put_record(
            &mut buf,
            &Record::Note {
                pid,
                ts_ns: mono_ns(),
                text: text.to_string(),
            },
        );
        if let Ok(mut w) = self.trace.lock() {
            w.write(pid, &buf);
        }
    }
}

/// Writes `text` to `<trace stem>.<kind>.txt`, never over an existing file (a numbered name instead).
fn write_beside(trace: &Path, kind: &str, text: &str) -> io::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    for n in 0..100 {
        let ext = if n == 0 {
            format!("{kind}.txt")
        } else {
            format!("{kind}.{n}.txt")
        };
        let path = trace.with_extension(ext);
        // Afresh, never through a link; the job's user's alone, as the trace is.
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(mut f) => return f.write_all(text.as_bytes()).map(|_| path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "too many post-mortems beside the trace",
    ))
}

/// `--cap-mode`, else `VRAMTRACE_CAP_MODE` (as the shim reads it), else enforce; anything else is bad usage.
fn cap_mode(args: &RunArgs) -> anyhow::Result<CapMode> {
    if let Some(m) = args.cap_mode {
        return Ok(m);
    }
    env::cap_mode(std::env::var(env::CAP_MODE).ok().as_deref())
        .map(CapMode::from)
        .map_err(|e| anyhow::anyhow!(e))
}

/// Checks a cap before anything starts: its syntax, and the devices it names against the machine's. Returns the
/// trace header's record of it: the spec, the mode, and per device the cap and the device's size.
fn check_cap(spec: &str, mode: CapMode) -> anyhow::Result<(HeaderKeys, Vec<CapOn>)> {
    let parsed = CapSpec::parse(spec).map_err(|e| anyhow::anyhow!("--cap {spec}: {e}"))?;
    let mut extra = vec![
        (keys::header::CAP.to_string(), spec.to_string()),
        (keys::header::CAP_MODE.to_string(), mode.name().to_string()),
    ];
    let Some(devices) = probe::devices() else {
        eprintln!("vramtrace: no CUDA driver answered; the cap is applied to whatever devices the job finds");
        return Ok((extra, Vec::new()));
    };
    if let Some(d) = parsed.max_device() {
        if d as usize >= devices.len() {
            bail!(
                "--cap {spec}: there is no device {d} (this machine has {} device{})",
                devices.len(),
                if devices.len() == 1 { "" } else { "s" }
            );
        }
    }
    let mut on = Vec::new();
    for (i, dev) in devices.iter().enumerate() {
        let total = &dev.total;
        extra.push((
            keys::header::per_device(keys::header::DEVICE_TOTAL, i as u32),
            total.to_string(),
        ));
        if let Some(a) = parsed.amount(i as u32) {
            let bytes = a.bytes(*total);
            if bytes > *total {
                eprintln!(
                    "vramtrace: the cap on device {i} ({}) is above its memory ({}): the device's own size is the limit",
                    units::bytes(bytes),
                    units::bytes(*total)
                );
            }
            extra.push((
                keys::header::per_device(keys::header::CAP_BYTES, i as u32),
                bytes.to_string(),
            ));
            // Checked against NVML's per-process count, which names GPUs by UUID.
            if let Some(uuid) = &dev.uuid {
                on.push(CapOn {
                    uuid: uuid.clone(),
                    ordinal: i as u32,
                    bytes: bytes.min(*total),
                });
            }
        }
    }
    Ok((extra, on))
}

fn indent_summary(s: &str) -> String {
    s.lines().map(|l| format!("vramtrace: {l}\n")).collect()
}

/// The command's exit code, or 128+N when signal N ended it, as a shell reports it.
fn exit_code(status: Option<vramtrace_format::ExitStatus>) -> Code {
    status.map_or(exit::FAILURE, |s| s.shell_code())
}

/// Finds `libvramtrace.so`: `VRAMTRACE_SHIM`, else beside this executable, else `../lib/vramtrace/`.
fn find_shim() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("VRAMTRACE_SHIM").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("VRAMTRACE_SHIM names {}, which is not a file", p.display());
        }
        return Ok(std::fs::canonicalize(&p).unwrap_or(p));
    }
    let exe = std::env::current_exe().context("cannot locate the vramtrace executable")?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [
        dir.join("libvramtrace.so"),
        dir.join("../lib/vramtrace/libvramtrace.so"),
    ];
    for c in &candidates {
        if c.is_file() {
            return Ok(std::fs::canonicalize(c).unwrap_or_else(|_| c.clone()));
        }
    }
    bail!(
        "cannot find libvramtrace.so (looked in {} and {}); build it with `cargo build --release` or set VRAMTRACE_SHIM",
        candidates[0].display(),
        candidates[1].display()
    )
}

fn default_out(command: &[OsString]) -> PathBuf {
    let prog = Path::new(&command[0])
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "job".into());
    let prog: String = prog
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    PathBuf::from(format!("vramtrace-{prog}-{}.vtrace", std::process::id()))
}

/// How the job's processes ended that did not end well, from their wait statuses (at most 8 lines).
fn endings(a: &crate::model::Analysis) -> String {
    let bad: Vec<&crate::model::ProcessStats> = a
        .processes
        .iter()
        .filter(|p| matches!(p.exit, Some(x) if x != vramtrace_format::ExitStatus::Code(0)))
        .collect();
    let mut m = String::new();
    for p in bad.iter().take(8) {
        let x = p.exit.expect("filtered");
        m.push_str(&format!(
            "pid {} ({}) {}\n",
            p.pid,
            crate::reporters::text::short_command(&p.cmdline),
            x.describe()
        ));
    }
    if bad.len() > 8 {
        m.push_str(&format!(
            "... and {} more processes that did not exit 0\n",
            bad.len() - 8
        ));
    }
    m
}

fn random_u64() -> u64 {
    let mut v = 0u64;
    let n = unsafe { libc::getrandom((&mut v as *mut u64).cast(), 8, 0) };
    if n != 8 {
        // No entropy source: still unlikely to be guessed by someone who cannot list the directory.
        v = mono_ns() ^ (std::process::id() as u64) << 32;
    }
    v
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))
}

// ---- signals and the child -----------------------------------------------------------------------------

const FORWARDED: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// The signals we forward, blocked and read from a signalfd.
struct Signals {
    fd: i32,
}

impl Signals {
    fn block() -> io::Result<Signals> {
        unsafe {
            // A write past a file-size limit (`ulimit -f`) raises SIGXFSZ, which kills: with a handler the write
            // fails with EFBIG instead, and the trace's writer says what was lost. A handler, unlike an ignored
            // signal, is not inherited by the command.
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_file_size_limit as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = libc::SA_RESTART;
            if libc::sigaction(libc::SIGXFSZ, &sa, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in FORWARDED {
                libc::sigaddset(&mut set, s);
            }
            libc::sigaddset(&mut set, libc::SIGCHLD);
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(Signals { fd })
        }
    }
}

extern "C" fn on_file_size_limit(_: libc::c_int) {}

/// Reaps every child that has ended (the command, and descendants orphaned to us), writing each one's wait
/// status into the trace. Returns the command's status when it is among them.
fn reap(
    command: u32,
    trace: &Mutex<TraceWriter>,
    conns: &Connections,
) -> (Option<vramtrace_format::ExitStatus>, bool) {
    let mut mine = None;
    loop {
        let mut status = 0;
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid == 0 {
            return (mine, false);
        }
        if pid < 0 {
            // ECHILD: no process of the job is left.
            return (mine, true);
        }
        let Some(x) = vramtrace_format::ExitStatus::from_wait(status) else {
            continue;
        };
        let pid = pid as u32;
        if let Ok(mut r) = conns.reaped.lock() {
            r.insert(pid);
        }
        if pid == command {
            mine = Some(x);
        }
        let mut buf = Vec::new();
        codec::put_record(
            &mut buf,
            &Record::Exit(vramtrace_format::Exit {
                pid,
                ts_ns: mono_ns(),
                status: x,
            }),
        );
        if let Ok(mut w) = trace.lock() {
            w.write(pid, &buf);
        }
    }
}

/// Waits for the command, forwarding signals to it and reaping whatever else of the job ends meanwhile. A
/// signal the terminal sent to the whole foreground group (si_code SI_KERNEL) already reached the command, so
/// only signals sent to us alone are passed on.
fn supervise(
    command: u32,
    signals: &Signals,
    trace: &Mutex<TraceWriter>,
    conns: &Connections,
) -> Option<vramtrace_format::ExitStatus> {
    loop {
        let (mine, none_left) = reap(command, trace, conns);
        if mine.is_some() {
            return mine;
        }
        if none_left {
            return None;
        }
        if let Some(signo) = wait_signal(signals, 200) {
            if FORWARDED.contains(&signo.0) && signo.1 != libc::SI_KERNEL {
                unsafe { libc::kill(command as i32, signo.0) };
            }
        }
    }
}

/// After the command: reaps the rest of the job until none is left or `deadline`. Returns how many processes
/// were still running then (at least one, if any).
fn reap_until(
    signals: &Signals,
    trace: &Mutex<TraceWriter>,
    conns: &Connections,
    deadline: Instant,
) -> usize {
    loop {
        if reap(0, trace, conns).1 {
            return 0;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return children_left();
        }
        let _ = wait_signal(signals, left.as_millis().clamp(1, 50) as i32);
    }
}

/// Our children still running (by /proc), at least 1 when the count cannot be read.
fn children_left() -> usize {
    let me = std::process::id();
    std::fs::read_to_string(format!("/proc/{me}/task/{me}/children"))
        .map(|s| s.split_whitespace().count().max(1))
        .unwrap_or(1)
}

/// Waits up to `ms` for a signal on the signalfd: (signal, si_code).
fn wait_signal(signals: &Signals, ms: i32) -> Option<(i32, i32)> {
    let mut pfd = libc::pollfd {
        fd: signals.fd,
        events: libc::POLLIN,
        revents: 0,
    };
    if unsafe { libc::poll(&mut pfd, 1, ms) } <= 0 {
        return None;
    }
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::signalfd_siginfo>();
    let n = unsafe { libc::read(signals.fd, &mut info as *mut _ as *mut libc::c_void, size) };
    (n as usize == size).then_some((info.ssi_signo as i32, info.ssi_code))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    /// What `run` sets in the job's environment is what the shim reads: each value through format's `env`,
    /// the parser the shim uses.
    #[test]
    fn the_values_run_sets_mean_to_the_shim_what_run_meant() {
        for s in Stacks::value_variants() {
            let want = match s {
                Stacks::None => (false, false),
                Stacks::Native => (true, false),
                Stacks::Python => (false, true),
                Stacks::All => (true, true),
            };
            assert_eq!(env::stacks(Some(s.name())), Ok(want), "{s:?}");
        }
        for m in CapMode::value_variants() {
            assert_eq!(env::cap_mode(Some(m.name())).map(CapMode::from), Ok(*m));
        }
        // Sizes are written as byte counts.
        for given in ["1MiB", "0", "65536", "2G"] {
            let b = env::size(given).unwrap();
            assert_eq!(env::size(&b.to_string()), Ok(b), "{given}");
        }
        // A mode neither knows is refused by run (and, preloaded by hand, warned about by the shim).
        assert!(env::cap_mode(Some("loose")).is_err());
    }
}

//! The steps of `Prepared::new`, in the order it takes them: the flags checked, the trace's header, the
//! runtime directory with its socket and the cap's ledger, the Python bridge, the readers that follow the trace
//! while the job runs. Any of them may refuse the run; none starts the job.

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use vramtrace_format::{env, keys, TraceHeader};

use super::args::{CapMode, OnOff, RunArgs, TorchHistory};
use super::cap::{cap_mode, check_cap, HeaderKeys};
use super::files::{default_out, set_mode};
use crate::cap_check::CapOn;
use crate::files::runtime_dir::{random_u64, RuntimeDir};
use crate::names::ticks::mono_ns;

/// A setting the job inherits from our environment (no flag given for it): unset when blank.
pub(super) fn inherited(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.trim().is_empty())
}

/// What the flags (and the environment they default to) ask of the run, every one checked before anything is
/// made: the first step of `Prepared::new`, kept apart so that what can only be the user's input is in one place.
pub(super) struct Asked {
    pub(super) cap: Option<String>,
    pub(super) mode: CapMode,
    pub(super) cap_allowance: u64,
    /// The trace header's keys so far: the cap's, then those every run writes.
    pub(super) extra: HeaderKeys,
    pub(super) cap_on: Vec<CapOn>,
    pub(super) out: PathBuf,
    pub(super) agent: OnOff,
}

impl Asked {
    pub(super) fn check(args: &RunArgs) -> anyhow::Result<Asked> {
        let cap = args.cap.clone().or_else(|| inherited(env::CAP));
        let mode = cap_mode(args)?;
        check_inherited(args)?;
        let cap_allowance = match &args.cap_allowance {
            Some(a) => env::size(a).map_err(|e| anyhow::anyhow!("--cap-allowance {a}: {e}"))?,
            None => crate::cap_check::ALLOWANCE,
        };
        let mut extra = Vec::new();
        let mut cap_on = Vec::new();
        if let Some(spec) = &cap {
            (extra, cap_on) = check_cap(spec, mode)?;
        }
        check_sizes(args)?;
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
        let agent = python_agent(args)?;
        Ok(Asked {
            cap,
            mode,
            cap_allowance,
            extra,
            cap_on,
            out,
            agent,
        })
    }
}

/// What the job inherits from our environment (no flag given for it) is checked as the flags are: the shim
/// would only warn and use its default.
fn check_inherited(args: &RunArgs) -> anyhow::Result<()> {
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
    Ok(())
}

/// `--stack-min-bytes` and `--ring-size`: sizes, the ring's within what a ring can be.
fn check_sizes(args: &RunArgs) -> anyhow::Result<()> {
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
    Ok(())
}

/// Whether the Python bridge runs (`--python-agent`, else $VRAMTRACE_PYTHON_AGENT), refusing the flags that
/// need it when it does not.
fn python_agent(args: &RunArgs) -> anyhow::Result<OnOff> {
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
    if agent == OnOff::Off && args.stop_after_steps.is_some() {
        bail!("--stop-after-steps needs the Python bridge (it counts the steps), which --python-agent off turns off");
    }
    Ok(agent)
}

/// A private temporary beside `out`, renamed onto it once the run can start (never through a link, never onto
/// another user's file: `out_file`). Until then a failure leaves whatever was at `out` untouched.
pub(super) fn open_trace(
    out: &Path,
    force: bool,
) -> anyhow::Result<crate::files::out_file::OutFile> {
    let mut pending = crate::files::out_file::OutFile::create(out, force)?;
    // Held as long as the trace is written (advisory, released when its descriptor closes): a reader that
    // finds no end record can tell a job still running from a run that was killed (`trace_file`).
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on the descriptor just opened; integer arguments only, no memory passed.
        unsafe { libc::flock(pending.file().as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    }
    Ok(pending)
}

/// The call-site settings the job runs with, so that a report can say why an allocation has no site; and
/// whether the bridge runs, so that it can say which Python processes the bridge did not run in.
pub(super) fn push_job_settings(args: &RunArgs, agent: OnOff, extra: &mut HeaderKeys) {
    let stack_min = match &args.stack_min_bytes {
        Some(m) => env::size(m).ok(),
        None => inherited(env::STACK_MIN_BYTES).and_then(|v| env::size(&v).ok()),
    }
    .unwrap_or(env::DEFAULT_STACK_MIN_BYTES);
    let stacks = match args.stacks {
        Some(s) => s.name().to_string(),
        None => inherited(env::STACKS).map_or("all".to_string(), |v| v.trim().to_ascii_lowercase()),
    };
    extra.push((
        keys::header::STACK_MIN_BYTES.to_string(),
        stack_min.to_string(),
    ));
    extra.push((keys::header::STACKS.to_string(), stacks));
    // The report can then say which Python processes the bridge did not run in.
    extra.push((
        keys::header::PYTHON_AGENT.to_string(),
        if agent == OnOff::On { "on" } else { "off" }.to_string(),
    ));
}

/// The trace's header: the command, this host, the clocks at the start, and `extra`'s keys.
pub(super) fn trace_header(args: &RunArgs, extra: HeaderKeys) -> TraceHeader {
    TraceHeader {
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
    }
}

/// The run's private directory and what is made in it before the job starts: the socket the shims connect to,
/// and the cap's ledger (its name always, the file only under a cap).
pub(super) struct Runtime {
    pub(super) dir: RuntimeDir,
    pub(super) socket: PathBuf,
    pub(super) listener: UnixListener,
    pub(super) ledger: PathBuf,
}

impl Runtime {
    /// Makes the directory (the trace's own folder is the last place tried: the user could write there).
    pub(super) fn make(out: &Path, capped: bool) -> anyhow::Result<Runtime> {
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
        // SAFETY: no arguments and no preconditions; it cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        let socket = dir.path.join(format!("sock-{:016x}", random_u64()));
        let listener = UnixListener::bind(&socket)
            .with_context(|| format!("cannot listen on {}", socket.display()))?;
        set_mode(&dir.path, if root { 0o711 } else { 0o700 })?;
        set_mode(&socket, if root { 0o666 } else { 0o600 })?;
        // The cap's ledger: the job's user's alone (a lock on its slot bytes is a claim on the cap), at a name
        // no one can guess, made afresh.
        let ledger = dir.path.join(format!("ledger-{:016x}", random_u64()));
        if capped {
            create_ledger(&dir.path, &ledger)?;
        }
        Ok(Runtime {
            dir,
            socket,
            listener,
            ledger,
        })
    }
}

/// Creates the cap's ledger with every byte of it reserved now, before the job starts: a filesystem another
/// user filled would leave each process to cap itself alone, the job as a whole uncapped, in silence.
fn create_ledger(dir: &Path, ledger: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(ledger)
        .with_context(|| format!("cannot create {}", ledger.display()))?;
    // SAFETY: plain integer arguments on the descriptor just opened; no memory passed.
    let rc = unsafe {
        libc::posix_fallocate(
            f.as_raw_fd(),
            0,
            vramtrace_format::cap::LEDGER_BYTES as libc::off_t,
        )
    };
    if rc != 0 {
        bail!(
            "cannot reserve the cap's ledger in {} ({}): the job's processes could not share its cap, \
             so it is not started; free space there (or set XDG_RUNTIME_DIR to a folder with room)",
            dir.display(),
            std::io::Error::from_raw_os_error(rc)
        );
    }
    Ok(())
}

/// The Python bridge's files, written into the runtime directory. A runtime filesystem that cannot take them
/// (full) does not stop the job: its Python processes are traced without it, and the summary says so, as the
/// cap's ledger degrades.
pub(super) fn write_bridge(agent: OnOff, dir: &Path) -> Option<PathBuf> {
    match agent {
        OnOff::On => match crate::files::bridge_files::write(&dir.join("python")) {
            Ok(p) => Some(p),
            Err(e) => {
                crate::note!(
                    "vramtrace: cannot write the Python bridge into {} ({e}): Python processes are traced \
                     without it (no view inside PyTorch's or JAX's allocator)",
                    dir.display()
                );
                None
            }
        },
        OnOff::Off => None,
    }
}

/// The trace as the run writes it, for the readers that follow it while the job runs (`--metrics`, the cap's
/// check against the GPU's count).
pub(super) struct Followed<'a> {
    pub(super) header: &'a TraceHeader,
    /// Where the frames begin: the header's length.
    pub(super) start: u64,
    /// The writer's count of whole bytes.
    pub(super) written: &'a Arc<std::sync::atomic::AtomicU64>,
}

/// `--metrics`: the server over the trace, started before the job (`reader`: a clone of the trace's
/// descriptor). `capped`: its reader also keeps the counts the cap's check reads.
pub(super) fn start_metrics(
    args: &RunArgs,
    addr: std::net::SocketAddr,
    job: Option<(String, &'static str)>,
    trace: &Followed,
    reader: Option<std::fs::File>,
    capped: bool,
    out: &Path,
) -> anyhow::Result<crate::live::Running> {
    let labels = crate::live::JobLabels {
        job: job.map(|j| j.0).unwrap_or_default(),
        host: trace.header.hostname.clone(),
        uuids: crate::live::uuids_from_env(),
        pids: args.metrics_pids,
    };
    let live = crate::live::Live::new(
        labels,
        trace.header,
        reader,
        trace.start,
        trace.written.clone(),
        capped,
    );
    let running = crate::live::Running::start(addr, live, &trace.header.command.join(" "), out)
        .with_context(|| format!("--metrics: cannot listen on {addr}"))?;
    if !args.quiet {
        crate::note!(
            "vramtrace: metrics at http://{}/metrics",
            running.server.addr
        );
    }
    Ok(running)
}

/// The reader the cap's check against the GPU's count follows the trace with: the metrics' if they run,
/// otherwise one of its own on `file` (the trace); none without a cap on a GPU.
pub(super) fn cap_reader(
    metrics: &Option<crate::live::Running>,
    capped: bool,
    file: &std::fs::File,
    trace: &Followed,
) -> Option<Arc<crate::live::Live>> {
    match (metrics, capped) {
        (_, false) => None,
        (Some(m), true) => Some(m.live.clone()),
        (None, true) => file.try_clone().ok().map(|f| {
            crate::live::Live::new(
                crate::live::JobLabels::default(),
                trace.header,
                Some(f),
                trace.start,
                trace.written.clone(),
                true,
            )
        }),
    }
}

//! `vramtrace run`: start the command with the shim preloaded, receive every process's events over a Unix
//! socket in a private directory, and append them to the trace as whole frames the moment they arrive, so that a
//! run ended by anything (SIGKILL included) leaves a trace readable up to its last whole frame.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};
use vramtrace_format::keys;

use anyhow::Context;
use vramtrace_format::codec;
use vramtrace_format::Record;

use crate::cap_check::CapOn;
use crate::files::runtime_dir::{random_u64, RuntimeDir};
use crate::names::ticks::mono_ns;
use crate::process::exit::{self, Code};
use crate::receive::{spawn_acceptor, Connections, TraceWriter};
use vramtrace_format::env;

mod args;
mod cap;
mod files;
mod prepare;
mod supervise;
mod untraced;
pub use args::{CapMode, OnOff, RunArgs, Stacks, TorchHistory};
use cap::*;
use files::*;
use prepare::*;
use supervise::*;
use untraced::*;

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
        Err(e) => match e.downcast_ref::<crate::files::runtime_dir::NoRuntimeDir>() {
            // Nowhere to put the socket (every base out of inodes, say): the job still runs, untraced.
            Some(why) => return run_untraced(&args, why, &signals),
            None => return exit::fail(exit::USAGE, format!("{e:#}")),
        },
    };
    prep.execute(&args, signals)
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
    /// Makes everything the run needs, in order: each step in `prepare`.
    fn new(args: &RunArgs) -> anyhow::Result<Prepared> {
        let shim = find_shim()?;
        let Asked {
            cap,
            mode,
            cap_allowance,
            mut extra,
            cap_on,
            out,
            agent,
        } = Asked::check(args)?;
        let mut pending = open_trace(&out, args.force)?;
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
        push_job_settings(args, agent, &mut extra);
        let header = trace_header(args, extra);
        let head = codec::encode_header(&header);
        pending
            .file()
            .write_all(&head)
            .with_context(|| format!("cannot write {}", out.display()))?;
        let Runtime {
            dir,
            socket,
            listener,
            ledger,
        } = Runtime::make(&out, cap.is_some())?;
        let bridge = write_bridge(agent, &dir.path);
        let file = pending
            .file()
            .try_clone()
            .with_context(|| format!("cannot write {}", out.display()))?;
        let reader = file.try_clone().ok();
        let writer = TraceWriter::new(file, head.len() as u64);
        let followed = Followed {
            header: &header,
            start: head.len() as u64,
            written: &writer.written,
        };
        let metrics = match metrics_addr {
            Some(addr) => Some(start_metrics(
                args,
                addr,
                job,
                &followed,
                reader,
                !cap_on.is_empty(),
                &out,
            )?),
            None => None,
        };
        // The cap's check against the GPU's count reads the trace as the metrics do (their reader, if running).
        let live = cap_reader(&metrics, !cap_on.is_empty(), pending.file(), &followed);
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

    /// Runs the command with the shim preloaded and supervises it to its end, then finishes the trace and
    /// says what it holds: each step a method below.
    fn execute(self, args: &RunArgs, signals: Signals) -> Code {
        // Every process of the job that loses its parent becomes ours: we learn how it ended (its wait status),
        // and when none is left, that the job is over.
        // SAFETY: integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        // The clock's first sample before the job starts: its events' counter ticks convert without a wait.
        crate::names::ticks::start();
        // One socket per live process of the job, and a ring passed with each hello: room for many (the
        // command gets the limit it had).
        let nofile = crate::process::fdlimit::raise();
        // The job's token: only the job's processes see it (their environment), so it vouches for one of
        // another user that was gone before the kernel could be asked where it came from.
        let token = format!("{:016x}{:016x}", random_u64(), random_u64());
        let settings = self.job_settings();
        let conns = Arc::new(Connections::new(&token).with_settings(&settings));
        let acceptor = spawn_acceptor(
            self.listener.try_clone().ok(),
            self.trace.clone(),
            conns.clone(),
        );
        let mut cmd = self.command(args, &token);
        // Our blocked signals must not be the command's (std does not reset the mask it inherits), nor our
        // descriptor limit.
        as_started(&mut cmd, nofile);
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                // Nothing ran: the trace file we created holds only a header; take it away again.
                let _ = std::fs::remove_file(&self.out);
                return spawn_failed(args, &e);
            }
        };
        let watch = self.watch_cap(args.quiet);
        let status = supervise(child.id(), &signals, &self.trace, &conns);
        // std's handle must not wait for a pid we reaped ourselves.
        std::mem::forget(child);
        let (running, lingering) = self.linger(&signals, &conns, acceptor);
        let code = exit_code(status);
        let breaches = watch
            .map(|w| std::mem::take(&mut *w.breaches.lock().unwrap_or_else(|e| e.into_inner())))
            .unwrap_or_default();
        // How the processes their own parents reaped ended, where the kernel agrees the parent is theirs.
        conns.write_reaped(&self.trace);
        // The native frames' names, from the files the job loaded, while they are still here: the trace then
        // names its frames wherever it is read (crate::names::frame_names).
        self.name_frames();
        self.end_trace();
        let mut msg = self.summary(code, &breaches);
        self.push_losses(&mut msg, &conns, lingering, running);
        if !args.quiet {
            crate::process::exit::write_err(format_args!("{}", indent_summary(&msg)));
            crate::note!("vramtrace: trace written to {}", self.out.display());
        }
        code
    }

    /// The job's settings, answered to each process's hello: its shim applies the job's cap, whatever its own
    /// environment says (a child started with its own VRAMTRACE_CAP, or without VRAMTRACE_LEDGER).
    fn job_settings(&self) -> vramtrace_format::settings::JobSettings {
        vramtrace_format::settings::JobSettings {
            cap: self.cap.clone(),
            warn: self.cap_mode == CapMode::Warn,
            ledger: self.cap.as_ref().map(|_| {
                use std::os::unix::ffi::OsStrExt;
                self.ledger.as_os_str().as_bytes().to_vec()
            }),
        }
    }

    /// The command with the job's environment: the shim preloaded, the socket and the job's token, the trace's
    /// path, the bridge's settings, and each flag as format's `env` parses it in the shim.
    fn command(&self, args: &RunArgs, token: &str) -> Command {
        let mut cmd = Command::new(&args.command[0]);
        cmd.args(&args.command[1..]);
        let mut preload = OsString::from(&self.shim);
        if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
            preload.push(":");
            preload.push(old);
        }
        cmd.env("LD_PRELOAD", preload)
            .env(env::SOCKET, &self.socket)
            .env(env::JOB_TOKEN, token);
        // Snapshots and other files the job's processes write beside the trace.
        cmd.env(
            "VRAMTRACE_TRACE",
            std::path::absolute(&self.out).unwrap_or_else(|_| self.out.clone()),
        );
        self.bridge_env(&mut cmd, args);
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
        cmd
    }

    /// The Python bridge's part of the job's environment: its directory first on PYTHONPATH and its settings,
    /// or that it is off.
    fn bridge_env(&self, cmd: &mut Command, args: &RunArgs) {
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
                match args.stop_after_steps {
                    Some(n) => cmd.env("VRAMTRACE_STOP_STEPS", n.to_string()),
                    // Never inherited: a stop is asked of this run only.
                    None => cmd.env_remove("VRAMTRACE_STOP_STEPS"),
                };
            }
            None => {
                cmd.env("VRAMTRACE_PYTHON_AGENT", "off");
            }
        }
    }

    /// The cap, confirmed by the GPU's own count while the job runs (under a cap on a GPU).
    fn watch_cap(&self, quiet: bool) -> Option<crate::cap_check::Watch> {
        match (&self.cap, &self.live) {
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
                quiet,
            ),
            _ => None,
        }
    }

    /// The command is gone. Its other processes are ours now: wait, briefly, until none is left, then take
    /// every connection still waiting to be accepted (a process that connected and died before the acceptor
    /// got to it is not lost), then let the receivers read to the end. Returns the processes still running
    /// and the connections still open when the wait ended.
    fn linger(
        &self,
        signals: &Signals,
        conns: &Connections,
        acceptor: Option<thread::JoinHandle<()>>,
    ) -> (usize, usize) {
        let deadline = Instant::now() + LINGER;
        let running = reap_until(signals, &self.trace, conns, deadline);
        conns.stop.store(true, Ordering::Release);
        if let Some(a) = acceptor {
            let _ = a.join();
        }
        while conns.open.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        (running, conns.open.load(Ordering::Acquire))
    }

    /// Finished: the end record (on a full disk it is lost too, and the trace says it was cut).
    fn end_trace(&self) {
        if let Ok(mut w) = self.trace.lock() {
            let mut end = Vec::new();
            codec::put_record(&mut end, &Record::End { ts_ns: mono_ns() });
            w.write(0, &end);
            let _ = w.file.sync_data();
        }
    }

    /// The summary of the finished trace. The readers of the trace and the files it names are bounded and
    /// should never panic; if one does (a bug), the job's exit code, the losses and the trace's path are still
    /// said.
    fn summary(&self, code: Code, breaches: &[crate::cap_check::Breach]) -> String {
        let summary = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut msg = String::new();
            match crate::whatif::trace_file::analyze(&self.out) {
                Ok(mut a) => {
                    // A run of the same command at another batch beside this one names the largest that fits
                    // (docs/OOM.md); nothing is read unless an error has a history to match.
                    if a.oom_records > 0 {
                        let _ = crate::verbs::oom_batch::attach(
                            &mut a,
                            &self.out,
                            &crate::verbs::oom_batch::BesideArgs::default(),
                        );
                    }
                    msg.push_str(&crate::verbs::report::summary(&a));
                    msg.push_str(&endings(&a));
                    if let Some(w) = crate::reporters::text::cap_exceeded_text(&a) {
                        msg.push_str(&w);
                        msg.push('\n');
                    }
                    msg.push_str(&self.post_mortem(&a, code, breaches));
                }
                Err(e) => msg.push_str(&format!("cannot summarise the trace: {e}\n")),
            }
            msg
        }));
        summary.unwrap_or_else(|_| {
            "cannot summarise the trace: its reader failed (a bug in vramtrace: please report it with the \
             trace)\n"
                .to_string()
        })
    }

    /// What the trace lacks, after the summary: the writer's losses, the connections refused, a descriptor
    /// limit that starved the receivers, processes still running when the wait for them ended.
    fn push_losses(&self, msg: &mut String, conns: &Connections, lingering: usize, running: usize) {
        let loss = self
            .trace
            .lock()
            .map(|w| w.loss_report())
            .unwrap_or_default();
        let refused_any = conns.refused.lock().is_ok_and(|r| !r.is_empty());
        let starved = conns.starved.load(Ordering::Acquire);
        if !loss.is_empty() || refused_any || starved {
            // What the trace lacks may well have allocated: never claim the job did not.
            *msg = msg.replace(
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
                crate::process::fdlimit::soft().map_or("unknown".into(), |n| n.to_string())
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
    }
}

impl Prepared {
    /// Resolves the native frames the trace's stacks hold and appends their names (frame kind 20), within
    /// [`crate::names::frame_names::RESOLVE_BUDGET`]. `VRAMTRACE_DEBUG` says what it cost.
    fn name_frames(&self) {
        let gathered = match self.trace.lock() {
            Ok(mut w) => std::mem::take(&mut w.names),
            Err(_) => return,
        };
        if gathered.addresses() == 0 {
            return;
        }
        let deadline = Instant::now() + crate::names::frame_names::RESOLVE_BUDGET;
        let r = gathered.resolve(&mut crate::names::symbols::Symbolizer::new(), deadline);
        let frames = crate::names::frame_names::encode(&r);
        if let Ok(mut w) = self.trace.lock() {
            if !frames.is_empty() {
                w.write(0, &frames);
            }
        }
        if std::env::var_os("VRAMTRACE_DEBUG").is_some() {
            crate::note!(
                "vramtrace: named {} native frames ({} unnamed, {} left to the reader, {} addresses not kept) \
                 in {:.3} s",
                r.named,
                r.unnamed,
                r.left,
                gathered.not_kept,
                r.elapsed.as_secs_f64()
            );
        }
    }

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

fn indent_summary(s: &str) -> String {
    s.lines().map(|l| format!("vramtrace: {l}\n")).collect()
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

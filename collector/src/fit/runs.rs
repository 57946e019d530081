//! One short run of the program under `vramtrace run`, as `fit` makes them: the whole allocation history, the
//! program stopped by its bridge after N of its steps (`run --stop-after-steps`), or by a time bound when it never
//! steps, its progress read from the trace as it is written.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vramtrace_format::codec::{self, HEADER_PREFIX};
use vramtrace_format::keys::bridge::Kind;
use vramtrace_format::Record;

use crate::model::{Analysis, BridgeRecord};

/// The history each run keeps: every entry of a short run (the ring's size, not what it costs: PyTorch keeps
/// only what the program asks), the figure the docs give for `whatif --knob`.
pub const HISTORY_ENTRIES: u64 = 4_000_000;

/// After the bound, how long the program has to end on SIGINT (its history is dumped at exit), then on SIGTERM.
const GRACE_INT: Duration = Duration::from_secs(15);
const GRACE_TERM: Duration = Duration::from_secs(5);

/// What one run is asked to do.
pub struct Spec {
    pub value: u64,
    pub command: Vec<OsString>,
    pub out: PathBuf,
    pub steps: u64,
    pub bound: Duration,
    /// `--cap` for the run (the verification runs), else none.
    pub cap: Option<String>,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Its processes stopped themselves after the steps asked.
    Stopped,
    /// It ended by itself with success before the steps asked (a program that does its work once).
    Finished,
    /// It ran out of memory.
    OutOfMemory,
    /// It failed otherwise: its exit code, or 128+N for signal N.
    Failed(i32),
    /// The bound stopped it; `clean`: it ended on SIGINT, so its history was kept.
    Bound { clean: bool },
}

/// One run done.
pub struct Ran {
    pub value: u64,
    pub trace: PathBuf,
    pub ending: Ending,
    pub seconds: f64,
    /// Its steps (the most of any process), as the bridge counted them.
    pub steps: u64,
    /// The bridge attached in a process (PyTorch initialised CUDA there).
    pub torch: bool,
    /// The trace could not be read (`run` failed before writing it, or it is damaged): why.
    pub unreadable: Option<String>,
    /// The program's output (and `run`'s own lines).
    pub log: PathBuf,
    /// Per GPU, the room the job had there when the driver last said (its free memory plus what the job held).
    pub room: std::collections::BTreeMap<u32, u64>,
    /// Out-of-memory errors PyTorch raised in a run that still did its steps: caught inside it (cuDNN trying
    /// its next algorithm when a workspace was refused) or by the program.
    pub caught_ooms: u64,
}

impl Ran {
    /// The last `n` lines of its output, escaped for the terminal.
    pub fn last_lines(&self, n: usize) -> Vec<String> {
        // The end of it only: a program may print gigabytes.
        let Ok(mut f) = crate::files::untrusted_file::open_regular(&self.log) else {
            return Vec::new();
        };
        let len = f.metadata().map_or(0, |m| m.len());
        let mut bytes = Vec::new();
        if f.seek(SeekFrom::Start(len.saturating_sub(64 << 10)))
            .is_err()
            || f.read_to_end(&mut bytes).is_err()
        {
            return Vec::new();
        }
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(n)..]
            .iter()
            .map(|l| crate::names::units::printable(l))
            .collect()
    }
}

/// What the runs show while they go: `fit`'s progress line.
pub trait Progress {
    fn update(&mut self, value: u64, steps: u64, elapsed: Duration);
    /// The run ended (after its last `update`).
    fn done(&mut self, ran: &Ran);
}

/// Runs `spec` to its end with `exe run` (the `vramtrace` binary).
pub fn run(exe: &Path, spec: &Spec, progress: &mut dyn Progress) -> std::io::Result<Ran> {
    let mut c = Command::new(exe);
    c.arg("run")
        .arg("--quiet")
        .arg("--force")
        .arg("--torch-history")
        .arg(HISTORY_ENTRIES.to_string())
        .arg("--stop-after-steps")
        .arg(spec.steps.to_string())
        .arg("--out")
        .arg(&spec.out);
    if let Some(cap) = &spec.cap {
        c.arg("--cap").arg(cap);
    }
    c.arg("--").args(&spec.command);
    // The program's output goes to a log beside its trace (a run stopped, or failing where it was expected to,
    // prints what would bury fit's own screen); stdin is not the program's to read.
    let log = spec.out.with_extension("log");
    let out = crate::files::out_file::OutFile::create(&log, true)
        .and_then(|f| f.commit())
        .map_err(|e| std::io::Error::other(format!("{}: {e}", log.display())))?;
    let err = out.try_clone()?;
    c.stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .env_remove("VRAMTRACE_CAP");
    let start = Instant::now();
    let mut child = c.spawn()?;
    let mut tail = Tail::new(&spec.out);
    let mut bound_hit = None;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        tail.poll();
        progress.update(spec.value, tail.steps, start.elapsed());
        if bound_hit.is_none() && start.elapsed() >= spec.bound {
            bound_hit = Some(stop(&mut child));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    tail.poll();
    let seconds = start.elapsed().as_secs_f64();
    let code = status.code().unwrap_or(1);
    let mut ran = Ran {
        value: spec.value,
        trace: spec.out.clone(),
        ending: Ending::Failed(code),
        seconds,
        steps: tail.steps,
        torch: tail.attached,
        unreadable: None,
        log,
        room: Default::default(),
        caught_ooms: 0,
    };
    match crate::whatif::trace_file::analyze(&spec.out) {
        Ok(a) => ran.ending = ending(&a, code, bound_hit, &mut ran),
        Err(e) => {
            ran.unreadable = Some(e.to_string());
            if let Some(clean) = bound_hit {
                ran.ending = Ending::Bound { clean };
            }
        }
    }
    progress.done(&ran);
    Ok(ran)
}

fn ending(a: &Analysis, code: i32, bound: Option<bool>, ran: &mut Ran) -> Ending {
    ran.torch = !a.bridge.attached.is_empty();
    ran.room = a
        .devices
        .iter()
        .filter_map(|d| Some((d.device?, d.room_bytes?)))
        .collect();
    // The steps done where the bridge stopped it (a loop over batches had drawn one more).
    if let Some(s) = a.bridge.stopped.iter().map(|(_, s)| *s).max() {
        ran.steps = s;
    }
    // A run the bridge stopped after its steps did them, whatever errors were raised and caught on the way
    // (cuDNN's search for a convolution algorithm meets one for each workspace the cap refuses, and goes on
    // with the next): it fits, with the algorithms it could get.
    if !a.bridge.stopped.is_empty() && code == 0 && bound.is_none() {
        ran.caught_ooms = a.oom_records;
        return Ending::Stopped;
    }
    if a.oom_records > 0 {
        return Ending::OutOfMemory;
    }
    if let Some(clean) = bound {
        return Ending::Bound { clean };
    }
    if code == 0 {
        Ending::Finished
    } else {
        Ending::Failed(code)
    }
}

/// The bound: SIGINT to `run` (which passes it to the program: Python raises KeyboardInterrupt, and the bridge
/// dumps the history at exit), then SIGTERM, then SIGKILL. True when it ended on SIGINT.
fn stop(child: &mut Child) -> bool {
    let pid = child.id() as libc::pid_t;
    for (sig, grace) in [(libc::SIGINT, GRACE_INT), (libc::SIGTERM, GRACE_TERM)] {
        // SAFETY: kill(2) on our own child's pid, which is not reaped yet (try_wait said it runs), so the pid is
        // still ours.
        unsafe { libc::kill(pid, sig) };
        let until = Instant::now() + grace;
        while Instant::now() < until {
            if let Ok(Some(_)) = child.try_wait() {
                return sig == libc::SIGINT;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let _ = child.kill();
    false
}

/// Reads the trace as `run` appends to it: the steps the bridge counted so far, and whether it attached.
struct Tail {
    path: PathBuf,
    offset: Option<u64>,
    buf: Vec<u8>,
    steps: u64,
    attached: bool,
}

/// Progress needs only the bridge's small records: a trace past this is no longer read for it (a long history
/// is in the snapshot files, not the trace).
const TAIL_MAX: u64 = 256 << 20;

impl Tail {
    fn new(path: &Path) -> Tail {
        Tail {
            path: path.to_path_buf(),
            offset: None,
            buf: Vec::new(),
            steps: 0,
            attached: false,
        }
    }

    fn poll(&mut self) {
        let Ok(mut f) = File::open(&self.path) else {
            return;
        };
        let offset = match self.offset {
            Some(o) => o,
            None => {
                let mut prefix = [0u8; HEADER_PREFIX];
                if f.read_exact(&mut prefix).is_err() {
                    return;
                }
                let Ok((_, len)) = codec::decode_header_prefix(&prefix) else {
                    return;
                };
                let o = HEADER_PREFIX as u64 + u64::from(len);
                self.offset = Some(o);
                o
            }
        };
        let pos = offset + self.buf.len() as u64;
        if pos > TAIL_MAX || f.seek(SeekFrom::Start(pos)).is_err() {
            return;
        }
        if f.take(TAIL_MAX - pos).read_to_end(&mut self.buf).is_err() {
            return;
        }
        let mut used = 0usize;
        for (kind, payload) in codec::frames(&self.buf) {
            used += payload.len() + codec::FRAME_OVERHEAD;
            if let Ok(Some(Record::Bridge(b))) = codec::decode_record(kind, payload) {
                match b.kind() {
                    Some(Kind::Attach) => self.attached = true,
                    // The program's own steps: optimizer steps, else batches (a scope is no step of a fit).
                    Some(Kind::Steps) => {
                        if let Some(BridgeRecord::Steps(r)) = BridgeRecord::read(&b, 0) {
                            let s = if r.optimizer > 0 {
                                r.optimizer
                            } else {
                                r.batches
                            };
                            self.steps = self.steps.max(s);
                        }
                    }
                    Some(Kind::Stopped) => {
                        if let Some(BridgeRecord::Stopped { steps }) = BridgeRecord::read(&b, 0) {
                            self.steps = self.steps.max(steps);
                        }
                    }
                    // Nothing of these tells a run's progress.
                    Some(
                        Kind::History
                        | Kind::Oom
                        | Kind::Exit
                        | Kind::Snapshot
                        | Kind::Peak
                        | Kind::Holders
                        | Kind::Note,
                    )
                    | None => {}
                }
            }
        }
        self.buf.drain(..used);
        self.offset = Some(offset + used as u64);
    }
}

//! The cap, confirmed by the GPU's own count. The shim enforces the cap in each process through the job's
//! ledger; a process of the job can get past it (started without the preload, with its own `VRAMTRACE_CAP`,
//! without the ledger, through a door the shim does not see: glibc's own `dlsym`, `dlmopen`, a second copy of the
//! driver; or by scribbling on the ledger). NVML's per-process count (what `nvidia-smi --query-compute-apps`
//! reads) sees every one of them: while a capped job runs, `run` reads it (twice a second, ten times while the job
//! is near its cap) and compares it with what the trace counted.
//!
//! A process's GPU figure includes what the shim never counts (its context, modules, libraries), so the job is
//! allowed [`ALLOWANCE`] (or `--cap-allowance`) beyond its counted bytes for its first process on a GPU and
//! [`EXTRA_PROCESS_ALLOWANCE`] for each other. The job is past its cap on a GPU when the sum over its processes
//! of the larger of (counted, GPU figure less the allowance), or the GPU's figures less the job's allowance,
//! passes the cap: at every reading for [`CONFIRM`] (the trace can lag the driver by a drain), or, where the GPU's
//! figures alone put it past (they do not lag), at [`PULSES`] readings within [`PULSE_WINDOW`]. Then, under
//! `--cap-mode enforce`, the job is stopped (SIGTERM, SIGKILL 5 s later) and the post-mortem names each process
//! that got past and how; under `warn` it is flagged.
//!
//! NVML is opened and read on a thread of its own: a call that hangs holds only that thread (it is never
//! joined). The check runs only where the collector's pids are the kernel's first namespace's (NVML's).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::live::Counted;

mod nvml;
use crate::names::units;
pub use nvml::{GpuProc, Nvml};

/// What a process may hold on a GPU beyond what its shim counted, by default (`--cap-allowance`): its CUDA
/// context, loaded modules and libraries' own memory (cuBLAS, cuDNN, NCCL). Measured: 676 MiB for a PyTorch
/// process with cuBLAS loaded on an H200 (docs/GPU-RESULTS.md "Issue 36"); twice that leaves room for more
/// libraries without calling a well-behaved job past its cap.
pub const ALLOWANCE: u64 = 3 << 29;
/// What the job may hold past its cap before it is called past it: a stream-ordered pool's growth is rounded
/// up by the driver after it was admitted (at least this, or 1% of the cap).
const SLACK: u64 = 64 << 20;
/// What each process after the first on a GPU may hold beyond its counted bytes, within the job's allowance: a
/// context of its own and its libraries (612 to 630 MiB past the shim's count measured for PyTorch with cuBLAS or
/// cuDNN on an H200, docs/GPU-RESULTS.md 2026-11-29). The job's
/// allowance on a GPU is [`ALLOWANCE`] (or `--cap-allowance`) for its first process and this (at most that) for
/// each other: six processes each slipping 1 GiB past their shims are not each forgiven 1.5 GiB.
pub const EXTRA_PROCESS_ALLOWANCE: u64 = 768 << 20;
/// How often the GPU's count is read while the job is far from its cap.
pub const INTERVAL: Duration = Duration::from_millis(500);
/// How often while it is near (half the cap or more on a GPU, by either count) or a reading found it past.
pub const FAST_INTERVAL: Duration = Duration::from_millis(100);
/// A job is past its cap when every reading over at least this long found it past (the trace can lag the
/// driver by a drain, at most 50 ms, or more when the collector is loaded): a pulse past the cap that lasts
/// longer than this and one fast interval is caught, however it repeats.
pub const CONFIRM: Duration = Duration::from_millis(200);
/// Or when this many readings within [`PULSE_WINDOW`] found it past, however short each pulse (a lagging
/// trace does not repeat a lag that large that often).
pub const PULSES: usize = 3;
pub const PULSE_WINDOW: Duration = Duration::from_secs(10);
/// Between SIGTERM and SIGKILL, when the job is stopped.
const GRACE: Duration = Duration::from_secs(5);

/// The job's cap on one GPU: its UUID as the driver names it, the job's ordinal for it, and the bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapOn {
    pub uuid: String,
    pub ordinal: u32,
    pub bytes: u64,
}

/// How a process got past the cap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum How {
    /// It never reached the collector: no shim (its `LD_PRELOAD` or `VRAMTRACE_SOCKET` taken away).
    Untraced,
    /// Its shim applied a cap of its own (`VRAMTRACE_CAP` set by the process; `None`: none at all).
    OwnCap(Option<String>),
    /// Its shim only warned (`VRAMTRACE_CAP_MODE=warn` set by the process) under an enforced cap.
    OwnMode,
    /// Its shim had no `VRAMTRACE_LEDGER`: it capped the process alone, not with the job.
    NoLedger,
    /// Its shim applied the job's settings, yet the GPU holds more for it than the shim counted.
    Unseen,
    /// The shim was loaded in it, yet it never reached vramtrace, and the GPU holds memory for it: every call
    /// went past the shim (`dlmopen`, a second copy of the driver, glibc's own `dlsym`).
    Bypassed,
    /// No process holds more than its shim counted, yet the counts sum past the cap: the shared ledger no
    /// longer agrees with them.
    Ledger,
    /// Past the cap by the GPU's count, but some of the job's records were lost: how cannot be told.
    Untold,
}

impl How {
    fn text(&self) -> String {
        match self {
            How::Untraced => {
                "it ran without the shim: it never reached vramtrace (its LD_PRELOAD or \
                              VRAMTRACE_SOCKET was taken away)"
                    .into()
            }
            How::OwnCap(Some(c)) => {
                format!("its shim applied a cap of its own (VRAMTRACE_CAP={c})")
            }
            How::OwnCap(None) => "its shim applied no cap (VRAMTRACE_CAP taken away)".into(),
            How::OwnMode => {
                "its shim only warned (VRAMTRACE_CAP_MODE=warn set in the process)".into()
            }
            How::NoLedger => {
                "its shim had no VRAMTRACE_LEDGER: it capped this process alone, not with \
                              the job"
                    .into()
            }
            How::Unseen => {
                "the GPU holds memory for it that its shim did not count: a door the shim does not \
                 intercept, or calls it could not place on this GPU (glibc's own dlsym, dlmopen, a second copy \
                 of the driver)"
                    .into()
            }
            How::Bypassed => {
                "it loaded the shim but its memory went past it: every call through a door the shim does \
                 not intercept (dlmopen, a second copy of the driver, glibc's own dlsym)"
                    .into()
            }
            How::Untold => {
                "the GPU holds more for the job than its cap, and some of its records were lost (dropped or \
                 refused), so how it got past cannot be told from the trace"
                    .into()
            }
            How::Ledger => {
                "the job's shared ledger no longer agrees with its processes' counts (written \
                            over by a process of the job)"
                    .into()
            }
        }
    }
}

/// One process named in a breach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offender {
    pub pid: u32,
    pub argv: Vec<String>,
    /// By NVML (`None`: NVML did not list it).
    pub gpu_bytes: Option<u64>,
    pub counted: u64,
    pub how: How,
}

/// The job past its cap on one GPU, by the GPU's count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Breach {
    pub cap: CapOn,
    /// The job's allowance it was judged with on this GPU.
    pub allowance: u64,
    /// The job's bytes on the GPU as judged: per process the larger of counted and GPU less the allowance, or
    /// the GPU's figures less the job's allowance, whichever is more.
    pub job_bytes: u64,
    /// The GPU's figures alone put the job past its cap. The counts can lag the driver by a drain (a free not
    /// yet seen beside an allocation that is), the GPU's figures cannot: such a reading needs no second one
    /// right after it.
    pub by_gpu: bool,
    pub offenders: Vec<Offender>,
}

impl Breach {
    /// What `run` says and the post-mortem begins with: the breach, then one line per process.
    pub fn lines(&self) -> Vec<(u32, String)> {
        let allowance = self.allowance;
        let mut v = vec![(
            0,
            format!(
                "the GPU's own count puts the job past its cap on GPU {} ({}): {} against a cap of {} \
                 (its processes allowed {} beyond their counts for contexts and libraries)",
                self.cap.ordinal,
                self.cap.uuid,
                units::bytes(self.job_bytes),
                units::bytes(self.cap.bytes),
                units::bytes(allowance)
            ),
        )];
        for o in &self.offenders {
            let cmd = units::fit(&units::printable(&o.argv.join(" ")), 60);
            let gpu = o.gpu_bytes.map_or("NVML did not list it".to_string(), |b| {
                format!("holds {} by the GPU's count", units::bytes(b))
            });
            v.push((
                o.pid,
                format!(
                    "pid {} ({cmd}) {gpu}, its shim counted {}: {}",
                    o.pid,
                    units::bytes(o.counted),
                    o.how.text()
                ),
            ));
        }
        v
    }
}

/// The job's cap specification as given (`--cap`) and its mode, to tell a process's own settings apart.
#[derive(Clone, Debug)]
pub struct JobCap {
    pub spec: String,
    pub enforce: bool,
    pub on: Vec<CapOn>,
    /// What each process may hold beyond its counted bytes ([`ALLOWANCE`] unless `--cap-allowance`).
    pub allowance: u64,
}

/// Judges one reading: the GPUs on which the job is past its cap. `job(pid)` says whether a process NVML lists
/// is one of the job's (the trace's processes always are); `shimmed(pid)` whether the shim is loaded in a
/// process that never reached the collector.
pub fn judge(
    cap: &JobCap,
    gpu: &[GpuProc],
    counted: &[Counted],
    job: &dyn Fn(u32) -> bool,
    shimmed: &dyn Fn(u32) -> bool,
) -> Vec<Breach> {
    let traced: HashMap<u32, &Counted> = counted.iter().map(|c| (c.pid, c)).collect();
    cap.on
        .iter()
        .filter_map(|on| OnGpu::new(cap, on, &traced, gpu, counted, job).breach(shimmed))
        .collect()
}

/// One GPU of the job's cap in one reading, as [`judge`] weighs it: per process of the job there, the GPU's
/// figure (none where NVML lists none) and what its shim counted. Judging one GPU is its own concern: the job's
/// bytes there, then who put it past its cap.
struct OnGpu<'a> {
    cap: &'a JobCap,
    on: &'a CapOn,
    /// The trace's processes, by pid.
    traced: &'a HashMap<u32, &'a Counted>,
    /// Per process on this GPU: (GPU figure, counted).
    procs: BTreeMap<u32, (Option<u64>, u64)>,
}

impl<'a> OnGpu<'a> {
    fn new(
        cap: &'a JobCap,
        on: &'a CapOn,
        traced: &'a HashMap<u32, &'a Counted>,
        gpu: &[GpuProc],
        counted: &[Counted],
        job: &dyn Fn(u32) -> bool,
    ) -> OnGpu<'a> {
        let mut procs: BTreeMap<u32, (Option<u64>, u64)> = BTreeMap::new();
        for g in gpu.iter().filter(|g| g.uuid == on.uuid) {
            if traced.contains_key(&g.pid) || job(g.pid) {
                let e = procs.entry(g.pid).or_default();
                e.0 = Some(e.0.unwrap_or(0).saturating_add(g.bytes));
            }
        }
        for c in counted {
            // Bytes on an ordinal whose GPU the process has not named are on no GPU here: with its own
            // CUDA_VISIBLE_DEVICES, its ordinal 0 may be another GPU than the collector's.
            let here: u64 = c
                .bytes
                .iter()
                .filter(|(u, _, _)| u.as_deref() == Some(on.uuid.as_str()))
                .map(|(_, _, b)| *b)
                .sum();
            if here > 0 || procs.contains_key(&c.pid) {
                procs.entry(c.pid).or_default().1 = here;
            }
        }
        OnGpu {
            cap,
            on,
            traced,
            procs,
        }
    }

    /// Whether the process's records were lost somewhere: its count is not whole.
    fn lossy(&self, pid: &u32) -> bool {
        self.traced.get(pid).is_some_and(|t| t.lossy)
    }

    /// Per process the larger of its count and the GPU's figure less the allowance; a process whose records
    /// were lost is judged by the GPU alone (a free that never reached the trace looks like memory kept).
    fn judged(&self, pid: &u32, g: Option<u64>, c: u64) -> u64 {
        let gpu = g.unwrap_or(0).saturating_sub(self.cap.allowance);
        if self.lossy(pid) {
            gpu
        } else {
            c.max(gpu)
        }
    }

    /// The breach on this GPU, if the job is past its cap there (and, under warn, something the shims never
    /// saw put it there).
    fn breach(&self, shimmed: &dyn Fn(u32) -> bool) -> Option<Breach> {
        let cap = self.cap;
        let procs = &self.procs;
        let per_process: u64 = procs
            .iter()
            .map(|(pid, (g, c))| self.judged(pid, *g, *c))
            .fold(0u64, u64::saturating_add);
        // The allowance is the job's: its first process's, and a context's for each other on this GPU. What
        // the GPU holds for the job past that is the job's, however it is spread over processes.
        let on_gpu = procs.values().filter(|(g, _)| g.is_some()).count() as u64;
        let extra = EXTRA_PROCESS_ALLOWANCE.min(cap.allowance);
        let job_allowance = cap
            .allowance
            .saturating_add(on_gpu.saturating_sub(1).saturating_mul(extra));
        let spread = procs
            .values()
            .map(|(g, _)| g.unwrap_or(0))
            .fold(0u64, u64::saturating_add)
            .saturating_sub(job_allowance);
        let job_bytes = per_process.max(spread);
        let by_gpu = procs
            .values()
            .map(|(g, _)| g.unwrap_or(0).saturating_sub(cap.allowance))
            .fold(0u64, u64::saturating_add)
            .max(spread);
        // A process escaped when the GPU holds more for it than its count and its share of the allowance.
        let share = if on_gpu > 1 { extra } else { cap.allowance };
        // A few MiB past the cap are the driver's rounding of a pool's growth (docs/CAP.md), not an escape.
        let limit = self.on.bytes.saturating_add(SLACK.max(self.on.bytes / 100));
        if job_bytes <= limit {
            return None;
        }
        let mut offenders = self.offenders(share, shimmed);
        if !cap.enforce {
            // Under warn the shims let requests past the cap through, and the trace marks each: only what they
            // never saw is news.
            offenders.retain(|o| {
                matches!(o.how, How::Untraced | How::Bypassed)
                    || o.gpu_bytes.unwrap_or(0) > o.counted.saturating_add(share)
            });
            if offenders.is_empty() {
                return None;
            }
        }
        if offenders.is_empty() {
            offenders.extend(self.ledger_offender());
        }
        Some(Breach {
            cap: self.on.clone(),
            allowance: job_allowance,
            job_bytes,
            by_gpu: by_gpu > limit,
            offenders,
        })
    }

    /// The processes that put the job past its cap here, and how: settings of their own, untraced, or holding
    /// more than they counted and their `share` of the allowance.
    fn offenders(&self, share: u64, shimmed: &dyn Fn(u32) -> bool) -> Vec<Offender> {
        let cap = self.cap;
        let mut offenders = Vec::new();
        for (pid, (g, c)) in &self.procs {
            let t = self.traced.get(pid);
            let escaped = g.unwrap_or(0) > c.saturating_add(share);
            let untraced = t.is_none();
            let how = match t {
                None if shimmed(*pid) => Some(How::Bypassed),
                None => Some(How::Untraced),
                Some(t) => match &t.cap {
                    None => Some(How::OwnCap(None)),
                    Some((spec, _, _)) if *spec != cap.spec => {
                        Some(How::OwnCap(Some(spec.clone())))
                    }
                    Some((_, mode, _)) if cap.enforce && mode == "warn" => Some(How::OwnMode),
                    Some((_, _, false)) => Some(How::NoLedger),
                    Some(_) if escaped => Some(How::Unseen),
                    Some(_) => None,
                },
            };
            // A process with the job's settings and no excess is no offender; one with settings of its own
            // is, once it holds anything here.
            let holds = g.unwrap_or(0) > 0 || *c > 0;
            if let Some(how) = how.filter(|_| holds && (escaped || !untraced)) {
                offenders.push(Offender {
                    pid: *pid,
                    argv: t
                        .map(|t| t.argv.clone())
                        .unwrap_or_else(|| crate::receive::cmdline_of(*pid)),
                    gpu_bytes: *g,
                    counted: *c,
                    how,
                });
            }
        }
        offenders
    }

    /// Where no process is an offender, every process counted what it holds, with the job's settings: the
    /// ledger was what let them (the largest process is named). Said only where every count is whole: where
    /// records were lost, the GPU's figure made the breach and how is not told.
    fn ledger_offender(&self) -> Option<Offender> {
        let untold = self.procs.keys().any(|pid| self.lossy(pid));
        let largest = self
            .procs
            .iter()
            .max_by_key(|(pid, (g, c))| self.judged(pid, *g, *c));
        largest.map(|(pid, (g, c))| Offender {
            pid: *pid,
            argv: self
                .traced
                .get(pid)
                .map(|t| t.argv.clone())
                .unwrap_or_default(),
            gpu_bytes: *g,
            counted: *c,
            how: if untold { How::Untold } else { How::Ledger },
        })
    }
}

/// Whether the job is near its cap on some GPU (half of it or more, by the GPU's figures or by its counts):
/// then the GPU's count is read every [`FAST_INTERVAL`].
pub fn near(cap: &JobCap, gpu: &[GpuProc], counted: &[Counted], job: &dyn Fn(u32) -> bool) -> bool {
    cap.on.iter().any(|on| {
        let half = on.bytes / 2;
        let by_gpu = gpu
            .iter()
            .filter(|g| g.uuid == on.uuid && (counted.iter().any(|c| c.pid == g.pid) || job(g.pid)))
            .map(|g| g.bytes)
            .fold(0u64, u64::saturating_add);
        let by_count = counted
            .iter()
            .flat_map(|c| &c.bytes)
            .filter(|(u, _, _)| u.as_deref() == Some(on.uuid.as_str()))
            .map(|(_, _, b)| *b)
            .fold(0u64, u64::saturating_add);
        by_gpu >= half || by_count >= half
    })
}

/// Intervals drawn between half and all of a base (xorshift, seeded by the clock and pid).
struct Jitter(u64);

impl Jitter {
    fn seeded() -> Jitter {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Jitter((t ^ u64::from(std::process::id()).rotate_left(32)) | 1)
    }

    fn of(&mut self, base: Duration) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let half = base / 2;
        half + Duration::from_nanos(self.0 % (half.as_nanos() as u64).max(1))
    }
}

/// When a GPU's breaches are confirmed: every reading past the cap for [`CONFIRM`], or [`PULSES`] readings the
/// GPU's figures alone put past it within [`PULSE_WINDOW`].
#[derive(Default)]
pub struct Confirm {
    /// Per GPU, the first and the last reading of the breach going on (readings more than two slow intervals
    /// apart are not one breach going on).
    since: HashMap<String, (Instant, Instant)>,
    /// Per GPU, the recent readings whose GPU figures alone were past the cap.
    by_gpu: HashMap<String, Vec<Instant>>,
}

impl Confirm {
    /// One reading's breaches at `now`: those confirmed.
    pub fn reading(&mut self, found: Vec<Breach>, now: Instant) -> Vec<Breach> {
        self.since
            .retain(|u, _| found.iter().any(|b| &b.cap.uuid == u));
        for hits in self.by_gpu.values_mut() {
            hits.retain(|t| now.duration_since(*t) <= PULSE_WINDOW);
        }
        self.by_gpu.retain(|_, h| !h.is_empty());
        let mut out = Vec::new();
        for b in found {
            let run = self.since.entry(b.cap.uuid.clone()).or_insert((now, now));
            if now.duration_since(run.1) > 2 * INTERVAL {
                run.0 = now;
            }
            run.1 = now;
            let first = run.0;
            let hits = self.by_gpu.entry(b.cap.uuid.clone()).or_default();
            if b.by_gpu {
                hits.push(now);
            }
            if now.duration_since(first) >= CONFIRM || hits.len() >= PULSES {
                out.push(b);
            }
        }
        out
    }

    /// A breach is going on, or was seen lately: read fast.
    pub fn watching(&self) -> bool {
        !self.since.is_empty() || !self.by_gpu.is_empty()
    }
}

/// Whether `libvramtrace.so` is mapped in `pid` (by /proc/<pid>/maps, at most 4 MiB of it read).
fn shim_loaded(pid: u32) -> bool {
    use std::io::Read;
    let mut maps = Vec::new();
    std::fs::File::open(format!("/proc/{pid}/maps"))
        .and_then(|f| f.take(4 << 20).read_to_end(&mut maps))
        .is_ok()
        && maps.windows(15).any(|w| w == b"libvramtrace.so")
}

/// Whether `pid` descends from `root` (orphans of the job are reparented to `run`, its subreaper): the
/// acceptor's test (by /proc), a failure to read /proc taken as no.
fn descends_from(pid: u32, root: u32) -> bool {
    crate::receive::descends_from(pid, root).unwrap_or(false)
}

/// Every process descending from `root`, by /proc.
fn descendants(root: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| *p != root && descends_from(*p, root))
        .collect()
}

/// The running check: its breaches, and the thread, stopped when dropped.
pub struct Watch {
    pub breaches: Arc<Mutex<Vec<Breach>>>,
    stop: Arc<AtomicBool>,
    stopping: Arc<Stopping>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// What the check acts through: the trace (its notes) and how it reads what the trace counted.
pub trait Sink: Send + Sync + 'static {
    fn counted(&self) -> Vec<Counted>;
    fn note(&self, pid: u32, text: &str);
}

/// Whether this process sees pids as the kernel's first pid namespace does. In a namespace of its own (a
/// container's), NVML's pids are the host's and name none of ours, or, worse, another process by the same
/// number.
fn in_first_pid_namespace() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .map(|v| v.split_whitespace().count() == 1)
        })
        .unwrap_or(false)
}

/// Starts the check for a job whose processes descend from this one, on a thread of its own (NVML is opened
/// there too: a driver slow to answer, or one that hangs, holds only that thread). Where NVML cannot be read,
/// or its pids would not be ours, it says so in one line and the cap holds only as far as the shims see.
pub fn start(cap: JobCap, sink: Arc<dyn Sink>, quiet: bool) -> Option<Watch> {
    let breaches = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::new(Mutex::new(None));
    let (b2, s2, st2) = (breaches.clone(), stop.clone(), stopping.clone());
    let root = std::process::id();
    let off = move |why: String| {
        if !quiet {
            crate::note!(
                "vramtrace: the cap is not checked against the GPU's own count ({why}): a process of the job \
                 that gets past its shim is not seen"
            );
        }
    };
    thread::Builder::new()
        .name("vramtrace-capcheck".into())
        .spawn(move || {
            if !in_first_pid_namespace() {
                off("vramtrace runs in a pid namespace of its own, where NVML's pids are not its own".into());
                return;
            }
            let nvml = match Nvml::open() {
                Ok(n) => n,
                Err(e) => return off(e),
            };
            let uuids: Vec<String> = cap.on.iter().map(|o| o.uuid.clone()).collect();
            let uuids: Vec<&str> = uuids.iter().map(String::as_str).collect();
            let mut confirm = Confirm::default();
            let mut unseen: Vec<String> = Vec::new();
            let mut told: Vec<String> = Vec::new();
            let mut fast = false;
            let mut jitter = Jitter::seeded();
            while !s2.load(Ordering::Acquire) {
                // Jittered: memory pulsing with a period the interval divides would otherwise be read always
                // between its pulses (400 ms of every second, read every 500 ms at the wrong phase).
                thread::sleep(jitter.of(if fast { FAST_INTERVAL } else { INTERVAL }));
                escalate(&st2, root);
                let (gpu, unmeasured) = nvml.read(&uuids);
                // A process of the job NVML gives no figure for is one the check cannot see: said once.
                for (uuid, pid) in unmeasured {
                    let key = format!("{uuid}/{pid}");
                    if unseen.len() >= 64 || unseen.contains(&key) || !descends_from(pid, root) {
                        continue;
                    }
                    unseen.push(key);
                    let line = format!(
                        "NVML gives no figure for pid {pid} on {uuid} (a MIG instance, or no right to read it): the \
                         GPU's own count cannot check it; the cap holds there as far as its shim counts"
                    );
                    if !quiet {
                        crate::note!("vramtrace: {line}");
                    }
                    sink.note(pid, &line);
                }
                let counted = sink.counted();
                // Each listed pid's ancestry read once a reading (judge and near both ask).
                let ancestry = std::cell::RefCell::new(HashMap::new());
                let job = |pid: u32| {
                    *ancestry
                        .borrow_mut()
                        .entry(pid)
                        .or_insert_with(|| descends_from(pid, root))
                };
                let found = judge(&cap, &gpu, &counted, &job, &shim_loaded);
                let confirmed = confirm.reading(found, Instant::now());
                fast = confirm.watching() || near(&cap, &gpu, &counted, &job);
                for b in confirmed {
                    if told.contains(&b.cap.uuid) {
                        continue;
                    }
                    told.push(b.cap.uuid.clone());
                    for (pid, line) in b.lines() {
                        crate::note!("vramtrace: {line}");
                        sink.note(pid, &line);
                    }
                    let act = if cap.enforce {
                        "stopping the job (--cap-mode enforce)"
                    } else {
                        "flagged (--cap-mode warn): the job goes on"
                    };
                    crate::note!("vramtrace: {act}");
                    sink.note(0, act);
                    if let Ok(mut v) = b2.lock() {
                        v.push(b);
                    }
                    if cap.enforce {
                        stop_job(&st2, root);
                    }
                }
            }
        })
        .ok()
        .map(|_| Watch {
            breaches,
            stop,
            stopping,
        })
}

/// When the job was told to stop (SIGTERM), if it was.
type Stopping = Mutex<Option<Instant>>;

/// SIGTERM to every process of the job; SIGKILL follows [`GRACE`] later ([`escalate`], [`Watch::finish`]).
fn stop_job(stopping: &Stopping, root: u32) {
    if let Ok(mut s) = stopping.lock() {
        s.get_or_insert_with(Instant::now);
    }
    for p in descendants(root) {
        // SAFETY: kill has no memory preconditions; a pid gone meanwhile only fails.
        unsafe { libc::kill(p as i32, libc::SIGTERM) };
    }
}

/// SIGKILL to every process of the job still there [`GRACE`] after it was told to stop.
fn escalate(stopping: &Stopping, root: u32) {
    let due = stopping
        .lock()
        .ok()
        .and_then(|s| *s)
        .is_some_and(|t| t.elapsed() >= GRACE);
    if due {
        for p in descendants(root) {
            // SAFETY: as in `stop_job`.
            unsafe { libc::kill(p as i32, libc::SIGKILL) };
        }
    }
}

impl Watch {
    /// Once the command has ended: if the check stopped the job, waits out the rest of [`GRACE`] while any of
    /// its processes is left, then kills those (they ignored SIGTERM). `run` calls it before it ends, so the
    /// escalation never dies with it.
    pub fn finish(&self) {
        let since = self.stopping.lock().ok().and_then(|s| *s);
        let Some(since) = since else { return };
        let root = std::process::id();
        while since.elapsed() < GRACE && !descendants(root).is_empty() {
            thread::sleep(Duration::from_millis(100));
        }
        escalate(&self.stopping, root);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn cap() -> JobCap {
        JobCap {
            spec: "1GiB".into(),
            enforce: true,
            allowance: GIB,
            on: vec![CapOn {
                uuid: "GPU-a".into(),
                ordinal: 0,
                bytes: GIB,
            }],
        }
    }

    fn counted(pid: u32, bytes: u64, settings: Option<(&str, &str, bool)>) -> Counted {
        Counted {
            pid,
            argv: vec![format!("p{pid}")],
            cap: settings.map(|(c, m, l)| (c.to_string(), m.to_string(), l)),
            lossy: false,
            bytes: vec![(Some("GPU-a".into()), 0, bytes)],
        }
    }

    fn gpu(pid: u32, bytes: u64) -> GpuProc {
        GpuProc {
            uuid: "GPU-a".into(),
            pid,
            bytes,
        }
    }

    const JOB: Option<(&str, &str, bool)> = Some(("1GiB", "enforce", true));

    #[test]
    fn a_job_at_its_cap_with_contexts_is_no_breach() {
        // Two processes, 0.5 GiB counted each, 0.9 GiB of context each beside it.
        let c = [counted(10, GIB / 2, JOB), counted(11, GIB / 2, JOB)];
        let g = [
            gpu(10, GIB / 2 + (900 << 20)),
            gpu(11, GIB / 2 + (900 << 20)),
        ];
        assert!(judge(&cap(), &g, &c, &|_| true, &|_| false).is_empty());
        // Another user's process on the GPU is not the job's.
        let g = [gpu(10, GIB / 2), gpu(99, 70 * GIB)];
        assert!(judge(&cap(), &g, &c, &|p| p != 99, &|_| false).is_empty());
    }

    #[test]
    fn each_way_past_the_cap_is_named() {
        let judge1 = |c: Vec<Counted>, g: Vec<GpuProc>| {
            let b = judge(&cap(), &g, &c, &|_| true, &|_| false);
            assert_eq!(b.len(), 1, "{b:?}");
            b[0].offenders
                .iter()
                .map(|o| (o.pid, o.how.clone()))
                .collect::<Vec<_>>()
        };
        // Without the preload: never in the trace.
        assert_eq!(
            judge1(
                vec![counted(10, GIB / 2, JOB)],
                vec![gpu(10, GIB / 2), gpu(11, 3 * GIB)]
            ),
            [(11, How::Untraced)]
        );
        // Its own VRAMTRACE_CAP: counted, but past the job's cap.
        assert_eq!(
            judge1(
                vec![
                    counted(10, GIB / 2, JOB),
                    counted(11, 3 * GIB, Some(("100GiB", "enforce", true)))
                ],
                vec![gpu(10, GIB / 2), gpu(11, 3 * GIB)]
            ),
            [(11, How::OwnCap(Some("100GiB".into())))]
        );
        // No ledger: capped alone at 1 GiB; with its parent's 1 GiB the job holds 2.
        assert_eq!(
            judge1(
                vec![
                    counted(10, GIB, JOB),
                    counted(11, GIB, Some(("1GiB", "enforce", false)))
                ],
                vec![gpu(10, GIB), gpu(11, GIB)]
            ),
            [(11, How::NoLedger)]
        );
        // The job's settings, but memory the shim never saw (glibc's dlsym, dlmopen).
        assert_eq!(
            judge1(vec![counted(10, 0, JOB)], vec![gpu(10, 3 * GIB)]),
            [(10, How::Unseen)]
        );
        // A scribbled ledger: each count right, the sum past the cap.
        assert_eq!(
            judge1(
                vec![counted(10, GIB, JOB), counted(11, 2 * GIB, JOB)],
                vec![gpu(10, GIB), gpu(11, 2 * GIB)]
            ),
            [(11, How::Ledger)]
        );
        // The shim loaded, never reached: every call went past it.
        let b = judge(
            &cap(),
            &[gpu(10, GIB / 2), gpu(11, 3 * GIB)],
            &[counted(10, GIB / 2, JOB)],
            &|_| true,
            &|p| p == 11,
        );
        assert_eq!(b[0].offenders[0].how, How::Bypassed);
        // A process that only warns under an enforced cap.
        assert_eq!(
            judge1(
                vec![counted(10, 2 * GIB, Some(("1GiB", "warn", true)))],
                vec![gpu(10, 2 * GIB)]
            ),
            [(10, How::OwnMode)]
        );
    }

    #[test]
    fn a_count_that_lost_records_is_no_evidence() {
        // Its ring dropped frees: the trace says 2 GiB, the GPU 0.5 GiB. No breach, and no ledger blamed.
        let mut c = counted(10, 2 * GIB, JOB);
        c.lossy = true;
        assert!(judge(
            &cap(),
            &[gpu(10, GIB / 2)],
            &[c.clone()],
            &|_| true,
            &|_| false
        )
        .is_empty());
        // The GPU's own figure still counts: 3 GiB is past the cap whatever the trace lost.
        let b = judge(&cap(), &[gpu(10, 3 * GIB)], &[c], &|_| true, &|_| false);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].offenders[0].how, How::Untold);
    }

    #[test]
    fn under_warn_only_what_the_shims_never_saw_is_flagged() {
        let warn = JobCap {
            enforce: false,
            ..cap()
        };
        let w = Some(("1GiB", "warn", true));
        // Let through past the cap by the shim itself (the trace marks it): nothing to say.
        let c = [counted(10, 2 * GIB, w)];
        assert!(judge(&warn, &[gpu(10, 2 * GIB)], &c, &|_| true, &|_| false).is_empty());
        // A process without the shim beside it: flagged, alone.
        let b = judge(
            &warn,
            &[gpu(10, 2 * GIB), gpu(11, 3 * GIB)],
            &c,
            &|_| true,
            &|_| false,
        );
        let named: Vec<_> = b[0]
            .offenders
            .iter()
            .map(|o| (o.pid, o.how.clone()))
            .collect();
        assert_eq!(named, [(11, How::Untraced)]);
    }

    #[test]
    fn a_breach_says_who_and_how_in_its_lines() {
        let c = [counted(10, 0, JOB)];
        let g = [gpu(10, 3 * GIB)];
        let b = &judge(&cap(), &g, &c, &|_| true, &|_| false)[0];
        let lines = b.lines();
        assert!(
            lines[0].1.contains("past its cap on GPU 0 (GPU-a)"),
            "{lines:?}"
        );
        assert!(
            lines[0].1.contains("2.00 GiB against a cap of 1.00 GiB"),
            "{lines:?}"
        );
        assert_eq!(lines[1].0, 10);
        assert!(
            lines[1]
                .1
                .contains("pid 10 (p10) holds 3.00 GiB by the GPU's count, its shim counted 0 B"),
            "{lines:?}"
        );
    }

    /// The allowance is the job's: six processes each holding 1 GiB past their shims beside a context are past
    /// a 1 GiB cap (each was under the 1.5 GiB a process used to be allowed); six with their contexts alone,
    /// counting the job's bytes between them, are not.
    #[test]
    fn the_allowance_is_the_jobs_not_each_processs() {
        let cap = JobCap {
            allowance: 3 << 29,
            ..cap()
        };
        let ctx = 600 << 20;
        let c: Vec<Counted> = (10..16).map(|p| counted(p, 0, JOB)).collect();
        let g: Vec<GpuProc> = (10..16).map(|p| gpu(p, ctx + GIB)).collect();
        let b = judge(&cap, &g, &c, &|_| true, &|_| false);
        assert_eq!(b.len(), 1, "{b:?}");
        assert!(b[0].by_gpu);
        assert_eq!(b[0].allowance, (3 << 29) + 5 * EXTRA_PROCESS_ALLOWANCE);
        assert_eq!(b[0].job_bytes, 6 * (ctx + GIB) - b[0].allowance);
        assert_eq!(b[0].offenders.len(), 6, "{b:?}");
        assert!(b[0].offenders.iter().all(|o| o.how == How::Unseen));
        // Contexts of 676 MiB each (PyTorch with cuBLAS, measured), the job's 1 GiB counted between them.
        let c: Vec<Counted> = (10..16).map(|p| counted(p, GIB / 6, JOB)).collect();
        let g: Vec<GpuProc> = (10..16).map(|p| gpu(p, (676 << 20) + GIB / 6)).collect();
        assert!(judge(&cap, &g, &c, &|_| true, &|_| false).is_empty());
    }

    fn breach(by_gpu: bool) -> Breach {
        Breach {
            cap: cap().on[0].clone(),
            allowance: GIB,
            job_bytes: 2 * GIB,
            by_gpu,
            offenders: Vec::new(),
        }
    }

    /// A breach by the counts alone (which can lag the driver) is confirmed only by readings past the cap for
    /// CONFIRM without a break; one by the GPU's figures, by PULSES readings within PULSE_WINDOW however they
    /// are spread: a job that pulses past its cap between readings is caught.
    #[test]
    fn a_breach_is_confirmed_over_time_or_by_the_gpus_figures_repeated() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Counts alone: a break resets it; CONFIRM of readings without one confirms it.
        let mut c = Confirm::default();
        assert!(c.reading(vec![breach(false)], at(0)).is_empty());
        assert!(c.watching());
        assert!(c.reading(vec![], at(100)).is_empty());
        assert!(c.reading(vec![breach(false)], at(200)).is_empty());
        assert!(c.reading(vec![breach(false)], at(300)).is_empty());
        assert_eq!(c.reading(vec![breach(false)], at(400)).len(), 1);
        // Counts alone, seen now and then: never confirmed.
        let mut c = Confirm::default();
        for i in 0..50 {
            let found = if i % 2 == 0 {
                vec![breach(false)]
            } else {
                vec![]
            };
            assert!(c.reading(found, at(i * 100)).is_empty(), "{i}");
        }
        // The GPU's figures, in pulses each caught by one reading: the third within the window confirms.
        let mut c = Confirm::default();
        assert!(c.reading(vec![breach(true)], at(0)).is_empty());
        assert!(c.reading(vec![], at(500)).is_empty());
        assert!(c.reading(vec![breach(true)], at(1000)).is_empty());
        assert!(c.reading(vec![], at(1500)).is_empty());
        assert_eq!(c.reading(vec![breach(true)], at(2000)).len(), 1);
        // Spread wider than the window: each falls out before the next comes.
        let mut c = Confirm::default();
        for i in 0..5 {
            assert!(
                c.reading(vec![breach(true)], at(i * 6000)).is_empty(),
                "{i}"
            );
        }
        // Far from the cap and nothing seen lately: slow again.
        let mut c = Confirm::default();
        c.reading(vec![breach(true)], at(0));
        c.reading(vec![], at(100));
        assert!(c.watching());
        c.reading(vec![], at(11_000));
        assert!(!c.watching());
    }

    #[test]
    fn near_the_cap_by_either_count() {
        let c = [counted(10, GIB / 4, JOB)];
        assert!(!near(&cap(), &[gpu(10, GIB / 4)], &c, &|_| true));
        assert!(near(&cap(), &[gpu(10, GIB / 2)], &c, &|_| true));
        assert!(near(
            &cap(),
            &[gpu(10, 0)],
            &[counted(10, GIB / 2, JOB)],
            &|_| true
        ));
        // Another user's process is not the job's.
        assert!(!near(&cap(), &[gpu(99, 70 * GIB)], &c, &|p| p != 99));
    }
}

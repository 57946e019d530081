//! Several traces of one job (one per node): `vramtrace report A B ...` and `vramtrace oom A B ...`.
//!
//! Each trace is replayed on its own (its events are on its own host's monotonic clock); the traces are then put
//! on one clock by their wall-clock starts (`start_unix_ns`): the earliest trace starts the job's clock, and
//! every time of a later trace is shifted by how much later it started. Devices and processes keep their host
//! (`devices[].host`, `processes[].hostname`), ranks are the job's (torchrun and Slurm number them across
//! nodes), and the job's totals are summed over hosts.
//!
//! What makes traces one job: the trace header's `job` (`vramtrace run --job-name`, else the launcher's job id,
//! `SLURM_JOB_ID`, `TORCHELASTIC_RUN_ID`, ...); a trace without one is identified by its command line. Traces
//! of different jobs are refused (exit 2) unless `--force`; the same trace given twice is always refused (exit 2).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;
use vramtrace_format::keys;

use vramtrace_format::TraceHeader;

use crate::model::Analysis;
use crate::names::units::{bytes, count, secs};
use crate::process::exit::{self, Code};
use crate::reporters::json::{self, print};
use crate::reporters::oom_json;
use crate::reporters::text::device_label;

/// One trace of the job.
pub struct Member {
    pub path: PathBuf,
    pub a: Analysis,
    /// How much later than the job's first trace this one started (wall clock), ns.
    pub offset_ns: u64,
}

/// What identifies a trace's job: its `job` (`--job-name` or the launcher's id), else its command line.
pub fn job_of(h: &TraceHeader) -> String {
    match h.setting(keys::header::JOB) {
        Some(j) => format!("job {j}"),
        None => format!("command `{}`", h.command.join(" ")),
    }
}

pub fn job_key(a: &Analysis) -> String {
    job_of(&a.header)
}

/// Whether traces given together may be read as one job: each trace once (the same trace twice, or a copy of it,
/// would count everything in it twice; `--force` does not allow that), and all of one job unless `force`. The
/// line that says why not.
pub fn check_together<'a>(
    traces: impl IntoIterator<Item = (&'a Path, &'a TraceHeader)>,
    force: bool,
) -> Result<(), String> {
    let traces: Vec<(&Path, &TraceHeader)> = traces.into_iter().collect();
    // One run's trace: its host and its start, to the nanosecond, on both clocks.
    let id = |h: &TraceHeader| (h.hostname.clone(), h.start_unix_ns, h.start_mono_ns);
    for (i, (p, h)) in traces.iter().enumerate() {
        if let Some((q, _)) = traces[..i].iter().find(|(_, g)| id(g) == id(h)) {
            return Err(format!(
                "{} and {} are the same trace (host {}, the same start): give each trace once",
                q.display(),
                p.display(),
                h.hostname
            ));
        }
    }
    if !force {
        let (first_path, first) = traces[0];
        if let Some((p, h)) = traces.iter().find(|(_, h)| job_of(h) != job_of(first)) {
            return Err(format!(
                "{} and {} are traces of different jobs ({}; {}): add --force to merge them anyway",
                first_path.display(),
                p.display(),
                job_of(first),
                job_of(h)
            ));
        }
    }
    Ok(())
}

/// Replays every trace and checks they can be read together (`check_together`); in order of their wall-clock
/// starts.
pub fn load(files: &[PathBuf], force: bool) -> Result<Vec<Member>, (Code, String)> {
    let mut ms = Vec::new();
    for f in files {
        let a = crate::whatif::trace_file::analyze(f).map_err(|e| (exit::USAGE, e.to_string()))?;
        ms.push(Member {
            path: f.clone(),
            a,
            offset_ns: 0,
        });
    }
    check_together(ms.iter().map(|m| (m.path.as_path(), &m.a.header)), force)
        .map_err(|why| (exit::USAGE, why))?;
    ms.sort_by_key(|m| m.a.header.start_unix_ns);
    let t0 = ms[0].a.header.start_unix_ns;
    for m in &mut ms {
        m.offset_ns = m.a.header.start_unix_ns - t0;
    }
    Ok(ms)
}

fn host(m: &Member) -> &str {
    &m.a.header.hostname
}

/// The job's totals, summed over its traces.
struct Totals {
    processes: u64,
    events: u64,
    dropped: u64,
    allocations: u64,
    ooms: u64,
    peak_sum: u64,
    duration_ns: u64,
}

/// A trace's GPUs' peaks added up (memory on the host, `on_host`, is not GPU memory).
fn gpu_peaks(a: &Analysis) -> u64 {
    a.devices
        .iter()
        .filter(|d| !d.on_host)
        .map(|d| d.peak_bytes)
        .sum()
}

fn totals(ms: &[Member]) -> Totals {
    let sum = |f: &dyn Fn(&Analysis) -> u64| ms.iter().map(|m| f(&m.a)).sum::<u64>();
    Totals {
        processes: sum(&|a| a.processes.len() as u64),
        events: sum(&|a| a.events),
        dropped: sum(&|a| a.dropped_events),
        allocations: sum(&|a| a.devices.iter().map(|d| d.allocations).sum()),
        ooms: sum(&|a| a.oom_records),
        // GPU memory: what is on the host (`on_host`) is not.
        peak_sum: sum(&|a| gpu_peaks(a)),
        duration_ns: ms
            .iter()
            .map(|m| m.offset_ns + m.a.duration_ns)
            .max()
            .unwrap_or(0),
    }
}

fn ranks(ms: &[Member]) -> Vec<(u32, String, u32)> {
    let mut r: Vec<(u32, String, u32)> = ms
        .iter()
        .flat_map(|m| {
            m.a.processes
                .iter()
                .filter_map(move |p| p.rank.map(|r| (r, host(m).to_string(), p.pid)))
        })
        .collect();
    r.sort();
    r
}

/// `vramtrace report A B ...`: the job across its hosts, then each host's own report.
pub fn report_text(ms: &[Member]) -> String {
    let mut o = String::new();
    let t = totals(ms);
    writeln!(
        o,
        "vramtrace report: {}, {} traces from {} host{}",
        job_key(&ms[0].a),
        ms.len(),
        hosts(ms).len(),
        if hosts(ms).len() == 1 { "" } else { "s" }
    )
    .ok();
    writeln!(
        o,
        "  clocks aligned by each trace's wall-clock start; times below are from the first trace's start"
    )
    .ok();
    for m in ms {
        writeln!(
            o,
            "  host {:<20} started at +{}, {} process{}, trace {}",
            host(m),
            secs(m.offset_ns),
            m.a.processes.len(),
            if m.a.processes.len() == 1 { "" } else { "es" },
            m.path.display()
        )
        .ok();
        // The job's totals take what this trace holds: say it is not all there was.
        if let Some(why) = &m.a.stopped {
            writeln!(o, "    PARTIAL: {why}").ok();
        }
        for d in m.a.devices.iter().filter(|d| d.peak_bytes > 0) {
            writeln!(
                o,
                "    {} peak {} at {} ({} allocations)",
                device_label(d),
                bytes(d.peak_bytes),
                secs(m.offset_ns + d.peak_time_ns.unwrap_or(0)),
                count(d.allocations)
            )
            .ok();
        }
    }
    let r = ranks(ms);
    if !r.is_empty() {
        let list: Vec<String> = r
            .iter()
            .map(|(rank, h, pid)| format!("{rank}={h}/{pid}"))
            .collect();
        writeln!(o, "  ranks (rank=host/pid): {}", list.join(" ")).ok();
    }
    writeln!(
        o,
        "  job: {} processes, {} events, {} dropped, {} allocations, {} out-of-memory errors; its GPUs' peaks add up to {} over {}",
        count(t.processes),
        count(t.events),
        count(t.dropped),
        count(t.allocations),
        count(t.ooms),
        bytes(t.peak_sum),
        secs(t.duration_ns)
    )
    .ok();
    for m in ms {
        writeln!(
            o,
            "\n== host {} (times in this part are from its own trace's start, +{} on the job's clock) ==",
            host(m),
            secs(m.offset_ns)
        )
        .ok();
        o.push_str(&crate::reporters::text::render(&m.a, Some(&m.path)));
    }
    o
}

fn hosts(ms: &[Member]) -> Vec<&str> {
    let mut h: Vec<&str> = ms.iter().map(host).collect();
    h.dedup();
    h
}

/// A process of a trace of several: one without a host of its own gets its trace's, last.
#[derive(Serialize)]
struct FleetProcess<'a> {
    #[serde(flatten)]
    p: json::Process<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hostname: Option<&'a str>,
}

/// A trace of several, and where its clock starts on the job's.
#[derive(Serialize)]
struct Host<'a> {
    host: &'a str,
    trace: String,
    start_unix_ns: u64,
    offset_ns: u64,
    processes: u64,
    peak_bytes_sum: u64,
    partial: Option<&'a str>,
}

#[derive(Serialize)]
struct Rank {
    rank: u32,
    host: String,
    pid: u32,
}

/// The job across its hosts.
#[derive(Serialize)]
struct Job<'a> {
    key: String,
    partial: bool,
    start_unix_ns: u64,
    duration_ns: u64,
    hosts: Vec<Host<'a>>,
    ranks: Vec<Rank>,
    processes: u64,
    events: u64,
    dropped_events: u64,
    allocations: u64,
    oom_records: u64,
    device_peaks_sum_bytes: u64,
}

/// `report --json` of several traces: the job, every device and process on the job's clock, then each trace's
/// own report (on its own clock).
#[derive(Serialize)]
struct JobReport<'a> {
    version: u64,
    job: Job<'a>,
    devices: Vec<json::Device<'a>>,
    processes: Vec<FleetProcess<'a>>,
    traces: Vec<json::Report<'a>>,
}

/// Adds `by` to a time, when there is one.
fn shift(t: &mut Option<u64>, by: u64) {
    if let Some(t) = t {
        *t += by;
    }
}

/// `vramtrace report --json A B ...` (docs/JSON-SCHEMA.md, "Several traces of one job").
pub fn report_json(ms: &[Member]) -> String {
    let t = totals(ms);
    let mut devices = Vec::new();
    let mut processes = Vec::new();
    for m in ms {
        for mut d in json::devices(&m.a) {
            shift(&mut d.peak_time_ns, m.offset_ns);
            devices.push(d);
        }
        for p in &m.a.processes {
            let mut p = json::Process::of(p);
            p.start_ns += m.offset_ns;
            shift(&mut p.end_ns, m.offset_ns);
            shift(&mut p.peak_time_ns, m.offset_ns);
            let hostname = match p.hostname {
                Some(Some(_)) => None,
                _ => {
                    p.hostname = None;
                    Some(host(m))
                }
            };
            processes.push(FleetProcess { p, hostname });
        }
    }
    let doc = JobReport {
        version: json::SCHEMA_VERSION,
        job: Job {
            key: job_key(&ms[0].a),
            partial: ms.iter().any(|m| m.a.partial),
            start_unix_ns: ms[0].a.header.start_unix_ns,
            duration_ns: t.duration_ns,
            hosts: ms
                .iter()
                .map(|m| Host {
                    host: host(m),
                    trace: m.path.display().to_string(),
                    start_unix_ns: m.a.header.start_unix_ns,
                    offset_ns: m.offset_ns,
                    processes: m.a.processes.len() as u64,
                    peak_bytes_sum: gpu_peaks(&m.a),
                    partial: m.a.stopped.as_deref(),
                })
                .collect(),
            ranks: ranks(ms)
                .into_iter()
                .map(|(rank, host, pid)| Rank { rank, host, pid })
                .collect(),
            processes: t.processes,
            events: t.events,
            dropped_events: t.dropped,
            allocations: t.allocations,
            oom_records: t.ooms,
            device_peaks_sum_bytes: t.peak_sum,
        },
        devices,
        processes,
        traces: ms.iter().map(|m| json::Report::of(&m.a)).collect(),
    };
    let mut out = print::pretty(&doc);
    out.push('\n');
    out
}

/// `oom --json` of several traces: each host's post-mortem.
#[derive(Serialize)]
struct JobOom<'a> {
    version: u64,
    job: String,
    hosts: Vec<HostOom<'a>>,
}

#[derive(Serialize)]
struct HostOom<'a> {
    host: &'a str,
    trace: String,
    offset_ns: u64,
    oom_records: u64,
    oom: oom_json::Oom<'a>,
}

/// `vramtrace oom A B ...`: each host's post-mortem, on the job's clock, the ones with an out-of-memory error
/// first. JSON: `{"job": ..., "hosts": [{"host", "offset_ns", "trace", "oom": <the oom JSON>}]}`.
pub fn oom(ms: &[Member], json: bool) -> String {
    let mut order: Vec<&Member> = ms.iter().collect();
    order.sort_by_key(|m| (m.a.oom_records == 0, m.offset_ns));
    if json {
        let diagnoses: Vec<_> = order.iter().map(|m| oom_json::diagnoses(&m.a)).collect();
        let doc = JobOom {
            version: json::SCHEMA_VERSION,
            job: job_key(&ms[0].a),
            hosts: order
                .iter()
                .zip(&diagnoses)
                .map(|(m, ds)| HostOom {
                    host: host(m),
                    trace: m.path.display().to_string(),
                    offset_ns: m.offset_ns,
                    oom_records: m.a.oom_records,
                    oom: oom_json::Oom::of(&m.a, ds),
                })
                .collect(),
        };
        let mut out = print::pretty(&doc);
        out.push('\n');
        return out;
    }
    let mut o = String::new();
    let with: Vec<&str> = order
        .iter()
        .filter(|m| m.a.oom_records > 0)
        .map(|m| host(m))
        .collect();
    writeln!(
        o,
        "vramtrace oom: {}, {} traces; out-of-memory errors on {}",
        job_key(&ms[0].a),
        ms.len(),
        if with.is_empty() {
            "no host".to_string()
        } else {
            with.join(", ")
        }
    )
    .ok();
    for m in order {
        writeln!(
            o,
            "\n== host {} ({}; times from its own start, +{} on the job's clock) ==",
            host(m),
            m.path.display(),
            secs(m.offset_ns)
        )
        .ok();
        o.push_str(&crate::reporters::oom_text::render(&m.a, Some(&m.path)));
    }
    o
}

/// Prints `text`, as `report` and `oom` do.
pub fn print(text: &str) -> Code {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => exit::OK,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => exit::OK,
        Err(e) => exit::fail(exit::FAILURE, format_args!("cannot write the report: {e}")),
    }
}

/// `report` with several traces.
pub fn report(files: &[PathBuf], json: bool, force: bool) -> Code {
    match load(files, force) {
        Ok(ms) => print(&if json {
            report_json(&ms)
        } else {
            report_text(&ms)
        }),
        Err((code, msg)) => exit::fail(code, msg),
    }
}

/// `oom` with several traces.
pub fn oom_main(files: &[PathBuf], json: bool, force: bool) -> Code {
    match load(files, force) {
        Ok(ms) => print(&oom(&ms, json)),
        Err((code, msg)) => exit::fail(code, msg),
    }
}

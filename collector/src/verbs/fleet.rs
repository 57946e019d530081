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
use vramtrace_format::keys;

use vramtrace_format::TraceHeader;

use crate::exit::{self, Code};
use crate::model::{self, Analysis};
use crate::reporters::json::{self, J};
use crate::reporters::text::device_label;
use crate::units::{bytes, count, secs};

/// One trace of the job.
pub struct Member {
    pub path: PathBuf,
    pub a: Analysis,
    /// How much later than the job's first trace this one started (wall clock), ns.
    pub offset_ns: u64,
}

/// What identifies a trace's job: its `job` (`--job-name` or the launcher's id), else its command line.
pub fn job_of(h: &TraceHeader) -> String {
    match h.extra.iter().find(|(k, _)| k == keys::header::JOB) {
        Some((_, j)) => format!("job {j}"),
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
        let a = model::analyze(f).map_err(|e| (exit::USAGE, e.to_string()))?;
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

/// Shifts the named time fields of an object by `by` ns.
fn shift(v: &mut J, fields: &[&str], by: u64) {
    if let J::O(kv) = v {
        for (k, x) in kv.iter_mut() {
            if let (true, J::U(t)) = (fields.contains(k), &mut *x) {
                *t += by;
            }
        }
    }
}

fn field(v: &J, name: &str) -> Option<J> {
    match v {
        J::O(kv) => kv.iter().find(|(k, _)| *k == name).map(|(_, x)| x.clone()),
        _ => None,
    }
}

/// `vramtrace report --json A B ...` (docs/JSON-SCHEMA.md, "Several traces of one job").
pub fn report_json(ms: &[Member]) -> String {
    let t = totals(ms);
    let mut devices = Vec::new();
    let mut processes = Vec::new();
    let mut traces = Vec::new();
    let mut hosts_j = Vec::new();
    for m in ms {
        let full = json::to_value(&m.a);
        if let Some(J::A(ds)) = field(&full, "devices") {
            for mut d in ds {
                shift(&mut d, &["peak_time_ns"], m.offset_ns);
                devices.push(d);
            }
        }
        if let Some(J::A(ps)) = field(&full, "processes") {
            for mut p in ps {
                shift(&mut p, &["start_ns", "end_ns", "peak_time_ns"], m.offset_ns);
                if let J::O(kv) = &mut p {
                    if matches!(
                        kv.iter().find(|(k, _)| *k == "hostname"),
                        Some((_, J::Null)) | None
                    ) {
                        kv.retain(|(k, _)| *k != "hostname");
                        kv.push(("hostname", host(m).into()));
                    }
                }
                processes.push(p);
            }
        }
        hosts_j.push(J::O(vec![
            ("host", host(m).into()),
            ("trace", m.path.display().to_string().into()),
            ("start_unix_ns", m.a.header.start_unix_ns.into()),
            ("offset_ns", m.offset_ns.into()),
            ("processes", (m.a.processes.len() as u64).into()),
            ("peak_bytes_sum", gpu_peaks(&m.a).into()),
            ("partial", m.a.stopped.clone().into()),
        ]));
        traces.push(full);
    }
    let ranks = ranks(ms)
        .into_iter()
        .map(|(r, h, pid)| {
            J::O(vec![
                ("rank", r.into()),
                ("host", h.into()),
                ("pid", pid.into()),
            ])
        })
        .collect();
    let doc = J::O(vec![
        ("version", json::SCHEMA_VERSION.into()),
        (
            "job",
            J::O(vec![
                ("key", job_key(&ms[0].a).into()),
                ("partial", ms.iter().any(|m| m.a.partial).into()),
                ("start_unix_ns", ms[0].a.header.start_unix_ns.into()),
                ("duration_ns", t.duration_ns.into()),
                ("hosts", J::A(hosts_j)),
                ("ranks", J::A(ranks)),
                ("processes", t.processes.into()),
                ("events", t.events.into()),
                ("dropped_events", t.dropped.into()),
                ("allocations", t.allocations.into()),
                ("oom_records", t.ooms.into()),
                ("device_peaks_sum_bytes", t.peak_sum.into()),
            ]),
        ),
        ("devices", J::A(devices)),
        ("processes", J::A(processes)),
        ("traces", J::A(traces)),
    ]);
    let mut out = String::new();
    json::write_value(&mut out, &doc, 0);
    out.push('\n');
    out
}

/// `vramtrace oom A B ...`: each host's post-mortem, on the job's clock, the ones with an out-of-memory error
/// first. JSON: `{"job": ..., "hosts": [{"host", "offset_ns", "trace", "oom": <the oom JSON>}]}`.
pub fn oom(ms: &[Member], json: bool) -> String {
    let mut order: Vec<&Member> = ms.iter().collect();
    order.sort_by_key(|m| (m.a.oom_records == 0, m.offset_ns));
    if json {
        let hosts = order
            .iter()
            .map(|m| {
                J::O(vec![
                    ("host", host(m).into()),
                    ("trace", m.path.display().to_string().into()),
                    ("offset_ns", m.offset_ns.into()),
                    ("oom_records", m.a.oom_records.into()),
                    ("oom", crate::reporters::oom_json::to_value(&m.a)),
                ])
            })
            .collect();
        let doc = J::O(vec![
            ("version", json::SCHEMA_VERSION.into()),
            ("job", job_key(&ms[0].a).into()),
            ("hosts", J::A(hosts)),
        ]);
        let mut out = String::new();
        json::write_value(&mut out, &doc, 0);
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

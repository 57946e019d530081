//! `vramtrace top`: attaches to a running job (a `vramtrace run --metrics`) and shows, refreshed, bytes in use
//! per GPU and process, peak, cap and headroom, the allocation rate and a sparkline of each GPU's bytes. It reads
//! the run's typed status (`/status.json`, the figures `/metrics` serves Prometheus), found through the attach file
//! the run writes
//! (`$XDG_RUNTIME_DIR/vramtrace/<pid>.addr`) or given with `--addr`. On a terminal: ratatui (q or Esc quits);
//! otherwise, or with `--once`, plain text.

use std::collections::BTreeMap;
use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::live::http::get;
use crate::names::units::bytes_short as bytes;
use crate::process::exit::{self, Code};

#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// The job's metrics address (`vramtrace run --metrics ADDR`). Default: the running job's attach file.
    #[arg(long, value_name = "ADDR")]
    pub addr: Option<String>,
    /// Print one plain-text snapshot and exit.
    #[arg(long)]
    pub once: bool,
    /// Refresh every MS milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub interval: u64,
}

/// One sample of the job.
#[derive(Debug, Default, Clone)]
pub struct Sample {
    pub job: String,
    pub host: String,
    /// By GPU ordinal: used, peak, cap, total, allocations so far.
    pub gpus: BTreeMap<String, Gpu>,
    /// (pid, rank, gpu) -> process figures; pid `-` for a rank's series of `/metrics` without pids.
    pub procs: BTreeMap<(String, String, String), ProcRow>,
    pub dropped: u64,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Gpu {
    pub used: u64,
    pub peak: u64,
    pub cap: Option<u64>,
    pub total: Option<u64>,
    pub allocations: u64,
}

#[derive(Debug, Default, Clone)]
pub struct ProcRow {
    pub rank: String,
    /// The process's command line, its program by name (`/status.json`'s `command`).
    pub command: String,
    pub used: u64,
    pub peak: u64,
}

impl From<crate::live::Status> for Sample {
    fn from(st: crate::live::Status) -> Sample {
        Sample {
            job: st.job,
            host: st.host,
            gpus: st
                .gpus
                .into_iter()
                .map(|g| {
                    (
                        g.gpu.to_string(),
                        Gpu {
                            used: g.used,
                            peak: g.peak,
                            cap: g.cap,
                            total: g.total,
                            allocations: g.allocations,
                        },
                    )
                })
                .collect(),
            procs: st
                .processes
                .into_iter()
                .map(|p| {
                    (
                        (
                            p.pid.to_string(),
                            p.rank.map_or(String::new(), |r| r.to_string()),
                            p.gpu.to_string(),
                        ),
                        ProcRow {
                            rank: p.rank.map_or(String::new(), |r| r.to_string()),
                            command: p.command,
                            used: p.used,
                            peak: p.peak,
                        },
                    )
                })
                .collect(),
            dropped: st.dropped,
        }
    }
}

impl Sample {
    /// A sample from what `/metrics` serves (`top --addr`, a job on another host or port): the same figures
    /// as the status file, without command lines, and without pids unless the run was given `--metrics-pids`.
    pub fn from_metrics(text: &str) -> Result<Sample, String> {
        let mut s = Sample::default();
        let mut seen = false;
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let Some((name, labels, value)) = metric_line(line) else {
                return Err(format!(
                    "not a metrics line: {}",
                    crate::names::units::fit(line, 80)
                ));
            };
            let name = name.strip_suffix("_total").unwrap_or(name);
            let label = |k: &str| {
                labels
                    .iter()
                    .find(|(n, _)| n == k)
                    .map_or(String::new(), |(_, v)| v.clone())
            };
            let v = value.max(0.0) as u64;
            if s.job.is_empty() {
                s.job = label("job");
                s.host = label("host");
            }
            let gpu = label("gpu");
            match name {
                "vramtrace_memory_used_bytes" | "vramtrace_memory_peak_bytes" => {
                    let pid = labels
                        .iter()
                        .find(|(n, _)| n == "pid")
                        .map_or("-".to_string(), |(_, v)| v.clone());
                    let rank = label("rank");
                    let row = s.procs.entry((pid, rank.clone(), gpu)).or_default();
                    row.rank = rank;
                    if name == "vramtrace_memory_used_bytes" {
                        row.used = v;
                    } else {
                        row.peak = v;
                    }
                }
                "vramtrace_device_used_bytes"
                | "vramtrace_device_peak_bytes"
                | "vramtrace_cap_bytes"
                | "vramtrace_device_total_bytes"
                | "vramtrace_allocations"
                    if !gpu.is_empty() =>
                {
                    let g = s.gpus.entry(gpu).or_default();
                    match name {
                        "vramtrace_device_used_bytes" => g.used = v,
                        "vramtrace_device_peak_bytes" => g.peak = v,
                        "vramtrace_cap_bytes" => g.cap = Some(v),
                        "vramtrace_device_total_bytes" => g.total = Some(v),
                        _ => g.allocations = v,
                    }
                }
                "vramtrace_events_dropped" => s.dropped = v,
                "vramtrace_processes" => seen = true,
                _ => {}
            }
        }
        if !seen {
            return Err("not a vramtrace run's metrics (no vramtrace_processes)".into());
        }
        Ok(s)
    }
}

/// A series' labels, in their order.
type Labels = Vec<(String, String)>;

/// `name{k="v",...} value` (or `name value`) of the Prometheus text formats; label values unescaped.
fn metric_line(line: &str) -> Option<(&str, Labels, f64)> {
    let end = line.find(['{', ' '])?;
    let name = &line[..end];
    let mut labels = Vec::new();
    let mut rest = &line[end..];
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices();
        let mut key = String::new();
        loop {
            let (i, c) = chars.next()?;
            match c {
                '}' => {
                    rest = &r[i + 1..];
                    break;
                }
                ',' | ' ' => {}
                '=' => {
                    if chars.next()?.1 != '"' {
                        return None;
                    }
                    let mut v = String::new();
                    loop {
                        match chars.next()?.1 {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => v.push('\n'),
                                c => v.push(c),
                            },
                            c => v.push(c),
                        }
                    }
                    labels.push((std::mem::take(&mut key), v));
                }
                c => key.push(c),
            }
        }
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some((name, labels, value))
}

/// The running job: its metrics address and its status file, from the newest attach file whose run is alive.
fn find_job() -> Result<(String, PathBuf), String> {
    use std::os::unix::fs::MetadataExt;
    // Only a folder that is ours and private is read, and only files of ours in it: another user could have
    // made `/tmp/vramtrace-<uid>` first and planted an address there.
    let dirs = crate::live::private_attach_dirs();
    if dirs.is_empty() {
        // None is ours and private: say why the first is not (another user's, a link, open to others).
        crate::live::private_attach_dir().map_err(|e| e.to_string())?;
    }
    // SAFETY: no arguments and no preconditions; it cannot fail.
    let me = unsafe { libc::geteuid() };
    let mut found: Vec<(std::time::SystemTime, String, PathBuf)> = Vec::new();
    for e in dirs
        .iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
    {
        let p = e.path();
        if !std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_file() && m.uid() == me) {
            continue;
        }
        let Some(pid) = p
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".addr"))
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: kill takes integers only; a pid gone meanwhile only makes it fail.
        if unsafe { libc::kill(pid, 0) } != 0
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        {
            continue;
        }
        let Ok(t) = std::fs::read_to_string(&p) else {
            continue;
        };
        if let Some(a) = t.lines().find_map(|l| l.strip_prefix("addr=")) {
            let m = e
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            found.push((m, a.to_string(), p));
        }
    }
    found.sort();
    found
        .pop()
        .map(|(_, a, p)| (a, p.with_extension("status.json")))
        .ok_or_else(|| {
        format!(
            "no running job to attach to (none in {}): start it with `vramtrace run --metrics -- CMD`, or give --addr",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        )
    })
}

/// The job's status file (the run replaces it whole at each change; it may not be there yet for a moment after
/// the run starts). Only a regular file of ours, at most 64 MiB.
fn read_status(p: &std::path::Path) -> Result<Sample, String> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    // A run killed outright leaves its file behind: its pid (the file's name) says whether it still runs.
    let pid = p
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.split('.').next())
        .and_then(|n| n.parse::<i32>().ok());
    let gone = |pid: i32| {
        // SAFETY: kill takes integers only; a pid gone meanwhile only makes it fail.
        let r = unsafe { libc::kill(pid, 0) };
        r != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    };
    if pid.is_some_and(gone) {
        return Err("the job has ended".into());
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(p);
        match f {
            Ok(f) => {
                let m = f.metadata().map_err(|e| e.to_string())?;
                // SAFETY: no arguments and no preconditions; it cannot fail.
                if !m.is_file() || m.uid() != unsafe { libc::geteuid() } {
                    return Err(format!("{} is not the job's status file", p.display()));
                }
                let mut body = String::new();
                f.take(64 << 20)
                    .read_to_string(&mut body)
                    .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
                return serde_json::from_str::<crate::live::Status>(&body)
                    .map(Sample::from)
                    .map_err(|e| format!("{} is not a vramtrace status: {e}", p.display()));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(format!("the job's status ({}): {e}", p.display())),
        }
    }
}

/// The state `top` keeps between refreshes: the last sample, and per GPU its history and allocation rate.
#[derive(Default)]
struct View {
    now: Sample,
    history: BTreeMap<String, Vec<u64>>,
    rate: BTreeMap<String, f64>,
    last: Option<(Instant, Sample)>,
}

const HISTORY: usize = 120;

impl View {
    fn update(&mut self, s: Sample) {
        let t = Instant::now();
        if let Some((t0, prev)) = &self.last {
            let dt = t.duration_since(*t0).as_secs_f64().max(1e-3);
            for (g, v) in &s.gpus {
                let before = prev.gpus.get(g).map_or(0, |p| p.allocations);
                self.rate
                    .insert(g.clone(), v.allocations.saturating_sub(before) as f64 / dt);
            }
        }
        for (g, v) in &s.gpus {
            let h = self.history.entry(g.clone()).or_default();
            h.push(v.used);
            if h.len() > HISTORY {
                h.remove(0);
            }
        }
        self.last = Some((t, s.clone()));
        self.now = s;
    }

    fn gpu_rows(&self) -> Vec<[String; 7]> {
        self.now
            .gpus
            .iter()
            .map(|(g, v)| {
                let limit = match (v.cap, v.total) {
                    (Some(c), Some(t)) => Some(c.min(t)),
                    (c, t) => c.or(t),
                };
                [
                    format!("GPU {g}"),
                    bytes(v.used),
                    bytes(v.peak),
                    v.cap.map_or("-".into(), bytes),
                    limit.map_or("-".into(), |l| bytes(l.saturating_sub(v.used))),
                    self.rate.get(g).map_or("-".into(), |r| format!("{r:.0}/s")),
                    spark(self.history.get(g).map_or(&[][..], |h| h.as_slice()), 24),
                ]
            })
            .collect()
    }

    fn proc_rows(&self) -> Vec<[String; 6]> {
        let mut rows: Vec<(&(String, String, String), &ProcRow)> = self.now.procs.iter().collect();
        rows.sort_by(|a, b| b.1.used.cmp(&a.1.used).then(a.0.cmp(b.0)));
        rows.iter()
            .map(|((pid, _, g), r)| {
                [
                    pid.clone(),
                    if r.rank.is_empty() {
                        "-".into()
                    } else {
                        r.rank.clone()
                    },
                    format!("GPU {g}"),
                    bytes(r.used),
                    bytes(r.peak),
                    // The program's own words: control characters shown, never sent to the terminal.
                    crate::names::units::fit(&crate::names::units::printable(&r.command), 32),
                ]
            })
            .collect()
    }

    fn plain(&self, addr: &str) -> String {
        let mut o = String::new();
        let job = if self.now.job.is_empty() {
            "-"
        } else {
            &self.now.job
        };
        o.push_str(&format!(
            "vramtrace top: job {job} on {} ({addr}), {} process series, {} events dropped\n",
            self.now.host,
            self.now.procs.len(),
            self.now.dropped
        ));
        o.push_str(&format!(
            "{:<8} {:>12} {:>12} {:>12} {:>12} {:>10}  {}\n",
            "gpu", "in use", "peak", "cap", "headroom", "allocs", "in use over time"
        ));
        for r in self.gpu_rows() {
            o.push_str(&format!(
                "{:<8} {:>12} {:>12} {:>12} {:>12} {:>10}  {}\n",
                r[0], r[1], r[2], r[3], r[4], r[5], r[6]
            ));
        }
        o.push_str(&format!(
            "{:>8} {:>6} {:<8} {:>12} {:>12}  {}\n",
            "pid", "rank", "gpu", "in use", "peak", "command"
        ));
        for r in self.proc_rows() {
            o.push_str(&format!(
                "{:>8} {:>6} {:<8} {:>12} {:>12}  {}\n",
                r[0], r[1], r[2], r[3], r[4], r[5]
            ));
        }
        o
    }
}

/// A sparkline of `h` in `width` characters (the last values), scaled to its maximum.
fn spark(h: &[u64], width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let tail = &h[h.len().saturating_sub(width)..];
    let max = tail.iter().copied().max().unwrap_or(0).max(1);
    tail.iter()
        .map(|v| BARS[((*v as u128 * 7) / max as u128) as usize])
        .collect()
}

pub fn main(args: TopArgs) -> Code {
    // Given an address: what its /metrics serves (open to any local user, so no command lines). Else the
    // running job's own status file, in our private attach folder: pids and command lines too.
    let (addr, status) = match args.addr.clone() {
        Some(a) => (a, None),
        None => match find_job() {
            Ok((a, p)) => (a, Some(p)),
            Err(e) => return exit::fail(exit::USAGE, e),
        },
    };
    let fetch = |addr: &str| -> Result<Sample, String> {
        if let Some(p) = &status {
            return read_status(p);
        }
        match get(addr, "/metrics", Duration::from_secs(2)) {
            Ok((200, body)) => Sample::from_metrics(&body)
                .map_err(|e| format!("{addr} answered what is not a vramtrace run's metrics: {e}")),
            Ok((code, _)) => Err(format!(
                "{addr} answered HTTP {code}: not a vramtrace run --metrics"
            )),
            Err(e) => Err(format!("cannot reach the job at {addr}: {e}")),
        }
    };
    let mut view = View::default();
    match fetch(&addr) {
        Ok(s) => view.update(s),
        Err(e) => return exit::fail(exit::USAGE, e),
    }
    let interval = Duration::from_millis(args.interval.max(50));
    if args.once || !io::stdout().is_terminal() {
        loop {
            let mut out = io::stdout().lock();
            if out.write_all(view.plain(&addr).as_bytes()).is_err() || args.once {
                return exit::OK;
            }
            drop(out);
            std::thread::sleep(interval);
            match fetch(&addr) {
                Ok(s) => view.update(s),
                Err(_) => {
                    crate::say!("the job has ended");
                    return exit::OK;
                }
            }
            if !crate::say!() {
                return exit::OK;
            }
        }
    }
    match tui(&addr, &mut view, interval, &fetch) {
        Ok(msg) => {
            if let Some(m) = msg {
                crate::note!("vramtrace: {m}");
            }
            exit::OK
        }
        Err(e) => exit::fail(exit::FAILURE, format!("the terminal failed: {e}")),
    }
}

fn tui(
    addr: &str,
    view: &mut View,
    interval: Duration,
    fetch: &dyn Fn(&str) -> Result<Sample, String>,
) -> io::Result<Option<String>> {
    use crossterm::event::{self, Event, KeyCode, KeyModifiers};
    let mut term = ratatui::init();
    let mut next = Instant::now() + interval;
    let result = loop {
        term.draw(|f| draw(f, addr, view))?;
        let wait = next.saturating_duration_since(Instant::now());
        if event::poll(wait)? {
            if let Event::Key(k) = event::read()? {
                let ctrl_c =
                    k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c {
                    break None;
                }
            }
            continue;
        }
        next = Instant::now() + interval;
        match fetch(addr) {
            Ok(s) => view.update(s),
            Err(_) => break Some("the job has ended".to_string()),
        }
    };
    ratatui::restore();
    Ok(result)
}

fn draw(f: &mut ratatui::Frame, addr: &str, view: &View) {
    use ratatui::layout::{Constraint, Layout};
    use ratatui::style::{Modifier, Style};
    use ratatui::widgets::{Block, Borders, Paragraph, Row, Sparkline, Table};
    let gpus = view.gpu_rows();
    let procs = view.proc_rows();
    let n_gpu = view.now.gpus.len() as u16;
    let [title, gpu_area, spark_area, proc_area] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(n_gpu + 3),
        Constraint::Length(n_gpu.max(1) * 2 + 2),
        Constraint::Min(3),
    ])
    .areas(f.area());
    let job = if view.now.job.is_empty() {
        "-"
    } else {
        &view.now.job
    };
    f.render_widget(
        Paragraph::new(format!(
            "vramtrace top: job {job} on {} ({addr}), {} events dropped   q: quit",
            view.now.host, view.now.dropped
        )),
        title,
    );
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let header = Row::new(["gpu", "in use", "peak", "cap", "headroom", "allocs"]).style(bold);
    let rows = gpus.iter().map(|r| Row::new(r[..6].to_vec()));
    f.render_widget(
        Table::new(
            rows,
            [
                Constraint::Length(8),
                Constraint::Length(12),
                Constraint::Length(12),
                Constraint::Length(12),
                Constraint::Length(12),
                Constraint::Length(10),
            ],
        )
        .header(header)
        .block(Block::default().borders(Borders::ALL).title("GPUs")),
        gpu_area,
    );
    let block = Block::default()
        .borders(Borders::ALL)
        .title("in use over time");
    let inner = block.inner(spark_area);
    f.render_widget(block, spark_area);
    let lines =
        Layout::vertical(vec![Constraint::Length(2); view.now.gpus.len().max(1)]).split(inner);
    for (i, (g, h)) in view.history.iter().enumerate() {
        if i >= lines.len() {
            break;
        }
        let [label, line] =
            Layout::horizontal([Constraint::Length(8), Constraint::Min(1)]).areas(lines[i]);
        f.render_widget(Paragraph::new(format!("GPU {g}")), label);
        let w = line.width as usize;
        let data = &h[h.len().saturating_sub(w)..];
        f.render_widget(Sparkline::default().data(data), line);
    }
    let header = Row::new(["pid", "rank", "gpu", "in use", "peak", "command"]).style(bold);
    let rows = procs.iter().map(|r| Row::new(r.to_vec()));
    f.render_widget(
        Table::new(
            rows,
            [
                Constraint::Length(8),
                Constraint::Length(6),
                Constraint::Length(8),
                Constraint::Length(12),
                Constraint::Length(12),
                Constraint::Min(10),
            ],
        )
        .header(header)
        .block(Block::default().borders(Borders::ALL).title("processes")),
        proc_area,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_what_the_server_serves() {
        use crate::live::{GpuStatus, ProcStatus, Status};
        let st = Status {
            job: "j".into(),
            host: "h".into(),
            gpus: vec![GpuStatus {
                gpu: 0,
                uuid: "GPU-1".into(),
                used: 1004 << 20,
                peak: 1004 << 20,
                cap: Some(4 << 30),
                total: None,
                allocations: 3,
            }],
            processes: vec![ProcStatus {
                pid: 7,
                rank: Some(2),
                command: "python3".into(),
                gpu: 0,
                used: 1004 << 20,
                peak: 1004 << 20,
            }],
            dropped: 0,
        };
        // As it travels.
        let back: Status = serde_json::from_str(&serde_json::to_string(&st).unwrap()).unwrap();
        assert_eq!(back, st);
        let s = Sample::from(back);
        assert_eq!(s.gpus["0"].cap, Some(4 << 30));
        assert_eq!(s.procs[&("7".into(), "2".into(), "0".into())].rank, "2");
        let mut v = View::default();
        v.update(s);
        let t = v.plain("a");
        // 1004 MiB in the next unit, three figures; the process's command in its column.
        assert!(t.contains("GPU 0") && t.contains("0.98 GiB"), "{t}");
        assert!(!t.contains("1004.00 MiB"), "{t}");
        assert!(t.contains("command") && t.contains("python3"), "{t}");
        assert_eq!(spark(&[0, 4, 8], 10), "▁▄█");
    }
}

//! The terminal report: devices (peak, when, a sparkline of the timeline), processes, what was still live at
//! the end, and warnings. Fits in 100 columns.

pub mod framework;
mod labels;
mod layout;
mod processes;
pub mod sparkline;
pub use labels::{device_label, device_name, ended_label, ending_label, oom_place, short_command};
pub use layout::{fit_label, wrap, SPARK_COLUMNS, WIDTH};
pub use processes::MAX_PROCESS_ROWS;

use crate::names::units;

use std::fmt::Write;
use std::path::Path;

use crate::callsites::{PeakRow, TENSOR_LINES_NOTE};
use crate::model::{Analysis, DeviceStats, Ended, LiveAlloc, ProcessStats};
use units::{bytes, bytes_exact, count, fit, printable, secs, utc};

/// The widest a table grows to where the terminal has the room ([`render_in`]).
pub const MAX_TABLE_WIDTH: usize = 200;

/// The whole report. `file` names the trace in the title.
pub fn render(a: &Analysis, file: Option<&Path>) -> String {
    render_in(a, file, WIDTH)
}

/// The whole report for a terminal `columns` wide: prose stays within [`WIDTH`] (for reading), and the process
/// table's commands take what room the terminal has beyond it, up to [`MAX_TABLE_WIDTH`].
pub fn render_in(a: &Analysis, file: Option<&Path>, columns: usize) -> String {
    let mut o = String::new();
    if let Some(why) = &a.stopped {
        wrap(&mut o, &format!("PARTIAL TRACE: {why}."), "", WIDTH);
        wrap(
            &mut o,
            "Everything below covers only what was recorded before that point.",
            "  ",
            WIDTH,
        );
        o.push('\n');
    }
    header(&mut o, a, file);
    outcome(&mut o, a, file);
    devices(&mut o, a);
    processes::table(&mut o, a, columns.clamp(WIDTH, MAX_TABLE_WIDTH));
    call_sites(&mut o, a);
    live_at_end(&mut o, a);
    address_space(&mut o, a);
    framework::bridge_section(&mut o, a);
    notes(&mut o, a);
    warnings(&mut o, a);
    o
}

/// Callers shown under a call site in text (the JSON has every frame).
pub const SITE_CALLERS: usize = 2;

/// What a call site in a PyTorch process is, said once under a section that lists any (not under each site).
pub const CACHE_LEGEND: &str =
    "In PyTorch processes a call site is where the cache grew: the segment asked for \
     there holds whatever tensors live in it now.";

/// A call site in text: `lead` then the site (with `pid N:` before it when the trace has several processes),
/// then its first [`SITE_CALLERS`] callers and what tells it apart from the other sites on lines of their own
/// under it ([`crate::callsites::Site::short`]), each line within [`WIDTH`] ([`fit_label`]).
pub fn site_lines(a: &Analysis, site: usize, lead: &str) -> Vec<String> {
    let Some(s) = a.call_sites.sites.get(site) else {
        return vec![format!("{lead}?")];
    };
    label_lines(a, s.pid, s.short(SITE_CALLERS), lead)
}

/// `lines` of a site's label under `lead`, each within [`WIDTH`].
fn label_lines(a: &Analysis, pid: u32, lines: Vec<String>, lead: &str) -> Vec<String> {
    let pad = " ".repeat(lead.chars().count());
    let room = WIDTH.saturating_sub(pad.len()).max(20);
    let mut labels = lines.into_iter();
    let first = labels.next().unwrap_or_default();
    let pid = if a.processes.len() > 1 {
        format!("pid {pid}: ")
    } else {
        String::new()
    };
    let mut out = vec![format!(
        "{lead}{pid}{}",
        fit_label(&printable(&first), room.saturating_sub(pid.len()))
    )];
    for l in labels {
        out.push(format!("{pad}{}", fit_label(&printable(&l), room)));
    }
    out
}

/// Rows of call sites merged by what a reader sees as one line of code: the site and its callers, without the
/// library frames (`via ...`) or ids that only tell the sites' stacks apart. `figures` are summed with `add`;
/// the rows keep the order of their first site.
pub fn merged_sites<T>(
    a: &Analysis,
    sites: impl IntoIterator<Item = (usize, T)>,
    add: impl Fn(&mut T, &T),
) -> Vec<MergedSite<T>> {
    let mut rows: Vec<MergedSite<T>> = Vec::new();
    for (i, t) in sites {
        let Some(s) = a.call_sites.sites.get(i) else {
            continue;
        };
        let lines: Vec<String> = s
            .short(SITE_CALLERS)
            .into_iter()
            .filter(|l| !l.starts_with("via ") && !l.starts_with("(pid "))
            .collect();
        match rows.iter_mut().find(|r| r.pid == s.pid && r.lines == lines) {
            Some(r) => add(&mut r.figures, &t),
            None => rows.push(MergedSite {
                pid: s.pid,
                lines,
                figures: t,
                cache: a.caching_allocator(s.pid),
            }),
        }
    }
    rows
}

/// One row of [`merged_sites`].
pub struct MergedSite<T> {
    pub pid: u32,
    pub lines: Vec<String>,
    pub figures: T,
    /// In a process whose allocator caches (PyTorch): [`CACHE_LEGEND`] applies.
    pub cache: bool,
}

impl<T> MergedSite<T> {
    /// The row's lines under `lead`.
    pub fn lines(&self, a: &Analysis, lead: &str) -> Vec<String> {
        label_lines(a, self.pid, self.lines.clone(), lead)
    }
}

/// [`CACHE_LEGEND`] under a section, indented by `pad`.
pub fn cache_legend(o: &mut String, pad: &str) {
    wrap(o, &format!("{pad}{CACHE_LEGEND}"), pad, WIDTH);
}

/// The row of bytes allocated with no call site: below the shim's threshold (`run --stack-min-bytes`), named
/// (the trace does not say whether the run changed it).
/// Why an allocation has no call site, as far as the trace says: the job's threshold and capture settings are in
/// its header (`run` writes them); a trace without them gets the default named as a default, not as a fact.
pub fn no_site_label(a: &Analysis) -> String {
    use vramtrace_format::keys::header;
    let stacks = a.header.setting(header::STACKS);
    if stacks == Some("none") {
        return "(no call sites: capture was off, --stacks none)".to_string();
    }
    // With Python frames alone, an allocation made outside Python (autograd's backward thread, a native
    // library's own thread, a process that is not Python) has no site whatever its size. Short enough for a
    // row of the call-site tables within the report's width.
    match a
        .header
        .setting(header::STACK_MIN_BYTES)
        .and_then(|v| v.parse::<u64>().ok())
    {
        Some(min) if stacks == Some("python") => format!(
            "(no call site: below {}, or outside Python: --stacks python)",
            bytes(min)
        ),
        Some(min) => format!(
            "(no call site: below the {} threshold of --stack-min-bytes)",
            bytes(min)
        ),
        None => format!(
            "(no call site: below --stack-min-bytes, {} unless set)",
            bytes(vramtrace_format::env::DEFAULT_STACK_MIN_BYTES)
        ),
    }
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".to_string();
    }
    // Rounded to the nearest, and a small share never reads 0%: the rows of a table add up to about 100.
    let p = (part as u128 * 100 + whole as u128 / 2) / whole as u128;
    if p == 0 && part > 0 {
        return "<1%".to_string();
    }
    format!("{p}%")
}

fn call_sites(o: &mut String, a: &Analysis) {
    let cs = &a.call_sites;
    if !cs.present {
        return;
    }
    if !cs.at_peak.is_empty() {
        sites_at_peak(o, a);
    }
    if !cs.by_allocated.is_empty() {
        sites_by_allocated(o, a);
    }
    if cs.stacks_not_kept > 0 {
        wrap(
            o,
            &format!(
                "{} stack{} past the collector's limits {} not kept: {} allocations show no frames.",
                count(cs.stacks_not_kept),
                if cs.stacks_not_kept == 1 { "" } else { "s" },
                if cs.stacks_not_kept == 1 { "was" } else { "were" },
                if cs.stacks_not_kept == 1 { "its" } else { "their" }
            ),
            "  ",
            WIDTH,
        );
        o.push('\n');
    }
}

/// Each device's peak: the bytes live then, by the call site that allocated them.
fn sites_at_peak(o: &mut String, a: &Analysis) {
    let cs = &a.call_sites;
    writeln!(
        o,
        "CALL SITES AT EACH DEVICE'S PEAK (bytes live then, by where they were allocated)"
    )
    .ok();
    let index = a.device_index();
    let mut legend = false;
    for d in &cs.at_peak {
        let stats = index.get(&(d.device, d.on_host)).map(|&i| &a.devices[i]);
        let when = stats
            .and_then(|x| x.peak_time_ns)
            .map_or(String::new(), |t| format!(" at {}", secs(t)));
        writeln!(
            o,
            "  {}  peak {}{when}",
            stats.map_or_else(|| device_name(d.device), device_label),
            bytes(d.peak_bytes)
        )
        .ok();
        let rows = d.rows(&cs.sites);
        let mut shown = merged_sites(
            a,
            rows.iter().filter_map(|r| match *r {
                PeakRow::Site { site, bytes } => Some((site, bytes)),
                _ => None,
            }),
            |x, y| *x = x.saturating_add(*y),
        );
        legend |= shown.iter().any(|r| r.cache);
        // The other rows as one-line sites of their process; the unlisted and unsited rows stay last.
        let mut last = Vec::new();
        for r in &rows {
            let (pid, label) = match (r, r.pid(), r.label()) {
                (_, Some(pid), Some(label)) => (pid, label),
                (PeakRow::Unlisted { bytes }, ..) => {
                    last.push((*bytes, "(other call sites)".to_string()));
                    continue;
                }
                (PeakRow::NoSite { bytes }, ..) => {
                    last.push((*bytes, no_site_label(a)));
                    continue;
                }
                _ => continue,
            };
            shown.push(MergedSite {
                pid,
                lines: vec![label],
                figures: r.bytes(),
                cache: false,
            });
        }
        shown.sort_by_key(|r| std::cmp::Reverse(r.figures));
        for r in &shown {
            let lead = format!(
                "    {:>11}  {:>4}  ",
                bytes(r.figures),
                pct(r.figures, d.peak_bytes)
            );
            for line in r.lines(a, &lead) {
                writeln!(o, "{line}").ok();
            }
        }
        for (v, what) in last {
            writeln!(
                o,
                "    {:>11}  {:>4}  {what}",
                bytes(v),
                pct(v, d.peak_bytes)
            )
            .ok();
        }
        if !d.tensor_lines.is_empty() {
            let whose = if a.processes.len() > 1 {
                let pids: Vec<String> = d.tensor_lines.iter().map(|t| t.pid.to_string()).collect();
                format!(" (pid {})", pids.join(", "))
            } else {
                String::new()
            };
            wrap(o, &format!("  {TENSOR_LINES_NOTE}{whose}"), "  ", WIDTH);
        }
    }
    if legend {
        cache_legend(o, "  ");
    }
    o.push('\n');
}

/// The call sites by the bytes they allocated over the run, with their allocations and what was live at the end.
fn sites_by_allocated(o: &mut String, a: &Analysis) {
    let cs = &a.call_sites;
    writeln!(o, "CALL SITES BY BYTES ALLOCATED").ok();
    writeln!(
        o,
        "    {:>11}  {:>9}  {:>11}  SITE",
        "ALLOCATED", "ALLOCS", "LIVE AT END"
    )
    .ok();
    let mut rows = merged_sites(
        a,
        cs.by_allocated.iter().map(|&i| {
            let s = &cs.sites[i];
            (i, [s.allocated_bytes, s.allocations, s.live_bytes_at_end])
        }),
        |x, y| {
            for (x, y) in x.iter_mut().zip(y) {
                *x = x.saturating_add(*y);
            }
        },
    );
    rows.sort_by_key(|r| std::cmp::Reverse(r.figures[0]));
    for r in &rows {
        let [allocated, allocs, live] = r.figures;
        let lead = format!(
            "    {:>11}  {:>9}  {:>11}  ",
            bytes(allocated),
            count(allocs),
            bytes(live)
        );
        for line in r.lines(a, &lead) {
            writeln!(o, "{line}").ok();
        }
    }
    // Said once in the report: under the first table of sites.
    if cs.at_peak.is_empty() && rows.iter().any(|r| r.cache) {
        cache_legend(o, "  ");
    }
    o.push('\n');
}

/// The shim's notes (each once), when the trace has any.
pub fn notes(o: &mut String, a: &Analysis) {
    if a.call_sites.notes.is_empty() {
        return;
    }
    writeln!(o, "NOTES").ok();
    for n in &a.call_sites.notes {
        let who = if n.pid == 0 {
            "vramtrace".to_string()
        } else if n.processes > 1 {
            format!("pid {} and {} more", n.pid, n.processes - 1)
        } else {
            format!("pid {}", n.pid)
        };
        let text = printable(&n.text);
        // A note that names its process itself (the GPU check's lines: `pid N (cmd) holds ...`) says it once.
        if n.processes <= 1 && text.starts_with(&format!("pid {} ", n.pid)) {
            wrap(o, &format!("- {text}"), "  ", WIDTH);
        } else {
            wrap(o, &format!("- {who}: {text}"), "  ", WIDTH);
        }
    }
    o.push('\n');
}

fn header(o: &mut String, a: &Analysis, file: Option<&Path>) {
    let h = &a.header;
    match file {
        Some(f) => writeln!(o, "vramtrace report: {}", f.display()),
        None => writeln!(o, "vramtrace report"),
    }
    .ok();
    let cmd = printable(&h.command.join(" "));
    writeln!(o, "  command   {}", fit(&cmd, WIDTH - 12)).ok();
    writeln!(
        o,
        "  host      {}, started {}",
        fit(&printable(&h.hostname), 40),
        utc(h.start_unix_ns)
    )
    .ok();
    writeln!(
        o,
        "  recorded  {} from {} process{} over {} (trace format {})",
        units::counted(a.events, "event", "events"),
        count(a.processes.len() as u64),
        if a.processes.len() == 1 { "" } else { "es" },
        secs(a.end_ns),
        a.format_version
    )
    .ok();
}

/// What happened, before any figure: the job finished, or ran out of memory (where, the cause, and the command
/// for its post-mortem), or how its processes ended otherwise.
fn outcome(o: &mut String, a: &Analysis, file: Option<&Path>) {
    let trace = file.map_or_else(|| "TRACE".to_string(), units::shown_path);
    if a.oom_records > 0 {
        // The error `vramtrace oom` shows whole: the same choice on both screens.
        let main = a.main_error();
        let more = match (a.oom_records, main) {
            (1, _) => String::new(),
            (n, Some(i)) => format!(" (error {} of {})", i + 1, count(n)),
            (n, None) => format!(" ({} errors)", count(n)),
        };
        let line = match main.map(|i| &a.ooms[i]) {
            Some(s) => {
                let d = crate::model::diagnose::diagnose(a, s);
                format!(
                    "OUT OF MEMORY on {} at {}{more}: pid {} asked {}; cause: {} ({}). Why, what held \
                     the memory and what to change:",
                    oom_place(s),
                    secs(s.time_ns),
                    s.pid,
                    bytes(s.requested_bytes),
                    d.cause.key(),
                    crate::reporters::prose::cause_title(d.cause)
                )
            }
            None => format!(
                "OUT OF MEMORY: {} (none could be analysed). What the trace shows of them:",
                units::counted(a.oom_records, "error", "errors")
            ),
        };
        o.push('\n');
        wrap(o, &line, "  ", WIDTH);
        writeln!(o, "    vramtrace oom {trace}").ok();
        return;
    }
    let traced: Vec<&ProcessStats> = a
        .processes
        .iter()
        .filter(|p| p.untraced.is_none())
        .collect();
    if traced.is_empty() {
        return;
    }
    // A trace cut short says nothing of what came after the cut: no error "recorded", no end "recorded".
    let cut = a.stopped.is_some();
    let none = if cut {
        "no out-of-memory error recorded before the trace stops"
    } else {
        "no out-of-memory error"
    };
    let clean = |p: &&ProcessStats| p.ended_cleanly();
    let n = units::counted(traced.len() as u64, "process", "processes");
    let stopped = &a.bridge.stopped;
    let line = if traced.iter().all(clean) && !stopped.is_empty() {
        // Ended by `run --stop-after-steps`: a short run asked for, not a job that finished.
        let steps: Vec<u64> = stopped.iter().map(|(_, s)| *s).collect();
        let (lo, hi) = (
            steps.iter().min().unwrap_or(&0),
            steps.iter().max().unwrap_or(&0),
        );
        format!(
            "STOPPED after {} as asked (--stop-after-steps): {}, {none}.",
            if lo == hi {
                units::counted(*hi, "step", "steps")
            } else {
                format!("{lo} to {hi} steps")
            },
            if traced.len() == 1 {
                "the process ended cleanly".to_string()
            } else {
                format!("all {n} ended cleanly")
            }
        )
    } else if traced.iter().all(clean) {
        format!(
            "FINISHED: {}, {none}.",
            if traced.len() == 1 {
                "the process ended cleanly".to_string()
            } else {
                format!("all {n} ended cleanly")
            }
        )
    } else {
        let others: Vec<String> = traced
            .iter()
            .filter(|p| !clean(p))
            .take(3)
            .map(|p| match (cut, p.ended) {
                (true, Ended::Running) => format!("pid {} no end recorded", p.pid),
                _ => format!("pid {} {}", p.pid, ending_label(p)),
            })
            .collect();
        let more = traced
            .iter()
            .filter(|p| !clean(p))
            .count()
            .saturating_sub(others.len());
        format!(
            "{}: {n}, {none}; {}{}.",
            if cut { "SO FAR" } else { "ENDED" },
            others.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        )
    };
    o.push('\n');
    wrap(o, &line, "  ", WIDTH);
}

fn devices(o: &mut String, a: &Analysis) {
    o.push('\n');
    // A device that only a free or a refusal-less call named (`GPU ?` from a pool's frees) has nothing to show.
    let shown: Vec<&DeviceStats> = a
        .devices
        .iter()
        .filter(|d| {
            d.allocations > 0
                || d.peak_bytes > 0
                || d.framework.is_some()
                || a.ooms
                    .iter()
                    .any(|s| s.device == d.device && s.on_host == d.on_host)
        })
        .collect();
    if shown.is_empty() {
        writeln!(o, "No GPU memory was allocated in this trace.").ok();
        return;
    }
    for d in shown {
        device(o, a, d);
    }
}

fn device(o: &mut String, a: &Analysis, d: &DeviceStats) {
    let name = device_label(d);
    let pad = " ".repeat(name.len() + 2);
    match d.peak_time_ns {
        Some(t) => writeln!(
            o,
            "{name}  peak {} at {}",
            bytes_exact(d.peak_bytes),
            secs(t)
        ),
        None => writeln!(o, "{name}  nothing allocated"),
    }
    .ok();
    if d.on_host {
        writeln!(
            o,
            "{pad}on no GPU: cuMemCreate with a host location (pinned host memory, e.g. NCCL's buffers)"
        )
        .ok();
    }
    if d.allocations > 0 {
        // The count is of the whole run, not of what was live: said first, apart from the live bytes.
        writeln!(
            o,
            "{pad}{} allocation{} in the run, the largest {}; live at end {}",
            count(d.allocations),
            if d.allocations == 1 { "" } else { "s" },
            bytes(d.largest_allocation_bytes),
            bytes(d.live_bytes_at_end)
        )
        .ok();
    }
    if d.in_use_bytes_at_end > 0 {
        writeln!(
            o,
            "{pad}in use when the trace ends: {} ({})",
            bytes(d.in_use_bytes_at_end),
            if a.stopped.is_some() {
                "processes whose end is not in the trace"
            } else {
                "processes still running"
            }
        )
        .ok();
    }
    if let (Some(total), Some(free)) = (d.driver_total_bytes, d.driver_free_bytes) {
        writeln!(
            o,
            "{pad}the driver last reported {} free of {}",
            bytes(free),
            bytes(total)
        )
        .ok();
    }
    if let Some(h) = headroom_line(d) {
        writeln!(o, "{pad}{h}").ok();
    }
    let line = sparkline::sparkline(&d.timeline, a.end_ns, d.peak_bytes, SPARK_COLUMNS);
    if !line.trim().is_empty() {
        let right = secs(a.end_ns);
        writeln!(o, "{pad}{}", line.trim_end()).ok();
        writeln!(
            o,
            "{pad}0 s{}{right}",
            " ".repeat(SPARK_COLUMNS.saturating_sub(3 + right.len()))
        )
        .ok();
    }
    if let Some(g) = &d.growth {
        wrap(
            o,
            &format!("{pad}{}", growth_text(g, d.framework.is_some())),
            &format!("{pad}  "),
            WIDTH,
        );
    }
    framework::device_lines(o, a, d, &pad);
    o.push('\n');
}

/// A growth in one sentence, with what grew; `cache`: the bytes are a caching allocator's segments (the
/// driver's view of PyTorch), so its call sites grew the cache and do not own what lives in it now.
pub fn growth_text(g: &crate::model::LeakTrend, cache: bool) -> String {
    let what = if cache {
        "Growth of the framework's cache (its segments, as the driver sees them)"
    } else {
        "Growth"
    };
    let mut t = format!("{what}: {}.", crate::reporters::prose::growth_size(g));
    if let Some(x) = g.groups.first() {
        t.push_str(&format!(
            " Made during the rise and live at the end: {} x {} {}",
            count(x.count),
            bytes(x.bytes_each),
            x.api.name()
        ));
        if g.groups.len() > 1 {
            t.push_str(&format!(
                " and {} more size{}",
                g.groups.len() - 1,
                if g.groups.len() == 2 { "" } else { "s" }
            ));
        }
        t.push('.');
    }
    if let Some(site) = g.sites.first() {
        if cache {
            t.push_str(&format!(
                " The code that grew the cache: {} (not the owner of the tensors in it).",
                site.label
            ));
        } else {
            t.push_str(&format!(
                " From {} ({} in {}).",
                site.label,
                bytes(site.bytes),
                count(site.count)
            ));
        }
    }
    t
}

/// Allocations the cap let through in warn mode, in one sentence, or `None` without any.
pub fn cap_exceeded_text(a: &Analysis) -> Option<String> {
    let n: u64 = a.processes.iter().map(|p| p.cap_exceeded).sum();
    (n > 0).then(|| {
        format!(
            "the job went past its cap with {} (--cap-mode warn let them through): it needs more than the cap",
            units::counted(n, "allocation", "allocations")
        )
    })
}

/// The refusals a program recovered from, in one sentence, or `None` without any.
pub fn refusals_text(a: &Analysis) -> Option<String> {
    let n = a.refusals_recovered;
    if n == 0 {
        return None;
    }
    let longest = a
        .refusals
        .iter()
        .map(|r| r.recovered_after_ns)
        .max()
        .unwrap_or(0);
    Some(format!(
        "{} allocation{} refused for lack of memory {} recovered from (the same thread allocated on the \
         device again: PyTorch flushes its cache and retries), costing {} in all, the longest {}: not \
         errors, but the job was at its limit{}.",
        count(n),
        if n == 1 { "" } else { "s" },
        if n == 1 { "was" } else { "were" },
        crate::names::units::duration(a.refusal_stall_ns),
        crate::names::units::duration(longest),
        match a.refusals.first() {
            Some(r) => format!(" (the first at {})", secs(r.time_ns)),
            None => String::new(),
        }
    ))
}

fn api_label(l: &LiveAlloc) -> String {
    if l.ptsz {
        format!("{}_ptsz", l.api.name())
    } else {
        l.api.name().to_string()
    }
}

fn live_at_end(o: &mut String, a: &Analysis) {
    if a.live_at_end_count == 0 {
        if !a.devices.is_empty() {
            writeln!(
                o,
                "LIVE AT END: nothing; every allocation was freed before its process ended.\n"
            )
            .ok();
        }
        return;
    }
    wrap(
        o,
        &format!(
            "LIVE AT END: {} allocation{} ({}) never freed before their process ended. CUDA frees \
             them at exit; large, old ones are leak candidates{}.",
            count(a.live_at_end_count),
            if a.live_at_end_count == 1 { "" } else { "s" },
            bytes(a.live_at_end_bytes),
            framework::cache_at_end_sentence(a).map_or(String::new(), |t| format!(". {t}"))
        ),
        "",
        WIDTH,
    );
    // The largest allocations grouped by call site (merged by line, as the call-site tables are), one row
    // each: how many, where, since when. Each allocation with its address is in the JSON.
    let where_ = |l: &LiveAlloc| match (l.on_host, l.device) {
        (true, _) => "host".to_string(),
        (false, Some(d)) => d.to_string(),
        (false, None) => "?".to_string(),
    };
    // (bytes, allocations, first allocated, the place as one string).
    type Row = (u64, u64, u64, String);
    let mut sited = merged_sites(
        a,
        a.live_at_end.iter().filter_map(|l| {
            l.site
                .map(|s| (s, (l.bytes, 1, l.alloc_time_ns, where_(l))))
        }),
        |x: &mut Row, y: &Row| {
            x.0 = x.0.saturating_add(y.0);
            x.1 += y.1;
            x.2 = x.2.min(y.2);
            if !x.3.split(',').any(|g| g == y.3) {
                x.3 = format!("{},{}", x.3, y.3);
            }
        },
    );
    sited.sort_by_key(|r| std::cmp::Reverse(r.figures.0));
    let mut unsited: Vec<(u32, String, String, Row)> = Vec::new();
    for l in a.live_at_end.iter().filter(|l| l.site.is_none()) {
        let (gpu, api) = (where_(l), api_label(l));
        match unsited
            .iter_mut()
            .find(|u| u.0 == l.pid && u.1 == gpu && u.2 == api)
        {
            Some(u) => {
                u.3 .0 = u.3 .0.saturating_add(l.bytes);
                u.3 .1 += 1;
                u.3 .2 = u.3 .2.min(l.alloc_time_ns);
            }
            None => unsited.push((l.pid, gpu.clone(), api, (l.bytes, 1, l.alloc_time_ns, gpu))),
        }
    }
    let row = |size: &str, n: &str, pid: &str, gpu: &str, at: &str| {
        format!("  {size:>11}  {n:>6}  {pid:>7}  {gpu:>4}  {at:>10}  ")
    };
    if (a.live_at_end.len() as u64) < a.live_at_end_count {
        writeln!(
            o,
            "  The {} largest, by where they were allocated:",
            count(a.live_at_end.len() as u64)
        )
        .ok();
    }
    writeln!(o, "{}SITE", row("SIZE", "ALLOCS", "PID", "GPU", "FIRST AT")).ok();
    for r in &sited {
        let (b, n, t, gpu) = &r.figures;
        let lead = row(&bytes(*b), &count(*n), &r.pid.to_string(), gpu, &secs(*t));
        for line in r.lines(a, &lead) {
            writeln!(o, "{line}").ok();
        }
    }
    for (pid, _, api, (b, n, t, gpu)) in &unsited {
        let lead = row(&bytes(*b), &count(*n), &pid.to_string(), gpu, &secs(*t));
        writeln!(o, "{lead}{} (no call site recorded)", api).ok();
    }
    let shown = a
        .live_at_end
        .iter()
        .fold(0u64, |s, l| s.saturating_add(l.bytes));
    let more = a.live_at_end_count - a.live_at_end.len() as u64;
    if more > 0 {
        writeln!(
            o,
            "  ... and {} smaller ones, {} in all",
            count(more),
            bytes(a.live_at_end_bytes.saturating_sub(shown))
        )
        .ok();
    }
    if !a.call_sites.present && sited.iter().any(|r| r.cache) {
        cache_legend(o, "  ");
    }
    o.push('\n');
}

fn address_space(o: &mut String, a: &Analysis) {
    let with: Vec<&ProcessStats> = a
        .processes
        .iter()
        .filter(|p| p.address_reserved_peak_bytes > 0 || p.mapped_peak_bytes > 0)
        .collect();
    if with.is_empty() {
        return;
    }
    writeln!(
        o,
        "VIRTUAL ADDRESS SPACE (not memory: mapped memory is counted as its cuMemCreate handles)"
    )
    .ok();
    for p in with.iter().take(16) {
        writeln!(
            o,
            "  pid {}: reserved up to {}, mapped up to {}",
            p.pid,
            bytes(p.address_reserved_peak_bytes),
            bytes(p.mapped_peak_bytes)
        )
        .ok();
    }
    if with.len() > 16 {
        writeln!(o, "  ... and {} more processes", with.len() - 16).ok();
    }
    o.push('\n');
}

fn warnings(o: &mut String, a: &Analysis) {
    let mut w: Vec<String> = Vec::new();
    if a.dropped_events > 0 {
        w.push(format!(
            "{}: the numbers above can be low, and frees of unrecorded allocations show up as unmatched.",
            super::prose::events_lost(a)
        ));
    }
    if a.merge_inexact_events > 0 {
        w.push(format!(
            "{} event{} reached the trace after events of later times had been replayed (a process broke \
             its time order): they were replayed late, so peaks around them may be off.",
            count(a.merge_inexact_events),
            if a.merge_inexact_events == 1 { "" } else { "s" }
        ));
    }
    if a.bridge.exit_snapshots_dropped > 0 {
        w.push(format!(
            "{} more snapshots at exit were named than processes could make (past 256): not read, so the \
             lines of tensors live at exit come from the first 256 only.",
            count(a.bridge.exit_snapshots_dropped)
        ));
    }
    if a.implausible_devices > 0 {
        w.push(format!(
            "{} event{} and samples named a GPU ordinal no host has (past {}): a process wrote them, not the \
             driver; their allocations count on the unknown device (GPU ?), the samples not at all.",
            count(a.implausible_devices),
            if a.implausible_devices == 1 { "" } else { "s" },
            crate::model::MAX_DEVICE_ORDINAL - 1
        ));
    }
    if a.unmatched_frees > 0 {
        w.push(format!(
            "{} free{} named no live allocation (a double free, memory allocated before the trace began, or an \
             allocation the trace lost) and {} ignored: no figure counts {}.",
            count(a.unmatched_frees),
            if a.unmatched_frees == 1 { "" } else { "s" },
            if a.unmatched_frees == 1 {
                "was"
            } else {
                "were"
            },
            if a.unmatched_frees == 1 { "it" } else { "them" }
        ));
    }
    if a.lost_frees > 0 {
        w.push(format!(
            "{} allocation{} came back at an address still live in the same process (a free was not \
             recorded); the older allocation was counted as freed then.",
            count(a.lost_frees),
            if a.lost_frees == 1 { "" } else { "s" }
        ));
    }
    if let Some(r) = refusals_text(a) {
        w.push(r);
    }
    if let Some(x) = cap_exceeded_text(a) {
        let mut x = x;
        x[..1].make_ascii_uppercase();
        w.push(format!("{x}."));
    }
    // With an out-of-memory error the summary at the top says the cap refused; without one, the program got
    // past its refusals, and the figures hold none of the refused bytes.
    let refused: u64 = a.processes.iter().map(|p| p.cap_refusals).sum();
    let told = a.main_error().is_some_and(|i| {
        crate::model::diagnose::diagnose(a, &a.ooms[i]).cause == crate::model::diagnose::Cause::Cap
    });
    if refused > 0 && !told {
        w.push(format!(
            "{} allocation{} refused by the vramtrace cap (each an out-of-memory error to the program): no \
             figure counts the bytes refused.",
            count(refused),
            if refused == 1 { " was" } else { "s were" }
        ));
    }
    if a.bad_frames > 0 {
        w.push(format!(
            "{} did not decode and {} skipped{}: what they held is missing, the rest of the trace was read.",
            units::counted(a.bad_frames, "frame", "frames"),
            if a.bad_frames == 1 { "was" } else { "were" },
            a.first_bad_frame
                .as_ref()
                .map_or(String::new(), |(at, why)| format!(" (the first at byte {at}: {why})"))
        ));
    }
    if a.unknown_frames > 0 {
        w.push(format!(
            "{} frame{} of a kind this vramtrace does not know (written by a newer one) {} skipped: the \
             figures above do not include what they held; a newer vramtrace reads them.",
            count(a.unknown_frames),
            if a.unknown_frames == 1 { "" } else { "s" },
            if a.unknown_frames == 1 { "was" } else { "were" }
        ));
    }
    if w.is_empty() {
        return;
    }
    writeln!(o, "WARNINGS").ok();
    for line in w {
        wrap(o, &format!("- {line}"), "  ", WIDTH);
    }
}

/// The report's "peak and headroom" line for a device, when its total or cap is known.
pub fn headroom_line(d: &DeviceStats) -> Option<String> {
    let limit = d.limit_bytes()?;
    let of = match (d.cap_bytes, d.total_bytes) {
        (Some(c), Some(t)) if c <= t => format!("the {} cap (device {})", bytes(c), bytes(t)),
        (Some(c), None) => format!("the {} cap", bytes(c)),
        (_, Some(t)) => format!("the device's {}", bytes(t)),
        (None, None) => return None,
    };
    Some(if d.peak_bytes > limit {
        format!(
            "no headroom: the peak {} is {} over {of}",
            bytes(d.peak_bytes),
            bytes(d.peak_bytes - limit)
        )
    } else {
        format!(
            "headroom {}: peak {} of {of}",
            bytes(limit - d.peak_bytes),
            bytes(d.peak_bytes)
        )
    })
}

#[cfg(test)]
mod tests;

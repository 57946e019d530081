//! The terminal out-of-memory report (`vramtrace oom`): per event the cause and the figures that decided it,
//! the memory at that moment (processes, largest live allocations, size classes, the seconds before), findings
//! and advice; then how each process ended and each device's peak and headroom. Fits in 100 columns.

mod after;
mod held;
mod layout;
use after::*;
use held::*;
use layout::{wrap, MAX_ROWS};

use std::fmt::Write;
use std::path::Path;

use vramtrace_format::Api;

use crate::model::diagnose::{diagnose, Advice, CapAdvice, Diagnosis, CONTEXT_ESTIMATE_BYTES};
use crate::model::{self, Analysis, OomSnapshot, Timeline};
use crate::names::units::{bytes, bytes_exact, count, fit, printable, secs};
use crate::reporters::prose;
use crate::reporters::text::sparkline::sparkline;
use crate::reporters::text::{fit_label, oom_place, short_command, site_lines, WIDTH};

/// Characters of the timeline before an event.
const SPARK: usize = 60;

/// The whole report, every section (`vramtrace oom --full`). `file` names the trace in the title.
pub fn render(a: &Analysis, file: Option<&Path>) -> String {
    compose(a, file, true)
}

/// The report as `vramtrace oom` prints it by default: per error one screen (the headline, the cause with its
/// evidence and line, the figures that prove it, findings, advice), then how processes ended abnormally and
/// each device's peak. Every live allocation, call site and refusal: [`render`] and the JSON.
pub fn render_short(a: &Analysis, file: Option<&Path>) -> String {
    compose(a, file, false)
}

fn compose(a: &Analysis, file: Option<&Path>, full: bool) -> String {
    let mut o = String::new();
    match file {
        Some(f) => writeln!(o, "vramtrace oom: {}", f.display()),
        None => writeln!(o, "vramtrace oom"),
    }
    .ok();
    let cmd = printable(&a.header.command.join(" "));
    writeln!(o, "  command   {}", fit(&cmd, WIDTH - 12)).ok();
    if let Some(why) = &a.stopped {
        wrap(
            &mut o,
            &format!(
                "  PARTIAL TRACE: {why}. What follows covers what was recorded before that point{}.",
                if a.ooms.is_empty() {
                    ""
                } else {
                    "; the out-of-memory records below are whole"
                }
            ),
            "    ",
        );
    }
    o.push('\n');
    if a.oom_records == 0 {
        no_oom(&mut o, a);
    } else {
        if full {
            for (i, s) in a.ooms.iter().enumerate() {
                event(&mut o, a, s, &diagnose(a, s), i + 1, true);
            }
        } else if let Some(i) = a.main_error() {
            // One screen: the error that decides whole, the others a line for each kind.
            let s = &a.ooms[i];
            event(&mut o, a, s, &diagnose(a, s), i + 1, false);
            other_errors(&mut o, a, i);
        } else {
            wrap(
                &mut o,
                &format!(
                    "{} recorded, none could be analysed (--json has what the trace holds).",
                    crate::names::units::counted(
                        a.oom_records,
                        "out-of-memory event was",
                        "out-of-memory events were"
                    )
                ),
                "  ",
            );
            o.push('\n');
        }
        // Refusals recovered from are `--full`'s: the error's cause already says the job was at its limit.
        if let Some(r) = crate::reporters::text::refusals_text(a).filter(|_| full) {
            wrap(&mut o, &format!("Besides: {r}"), "  ");
            o.push('\n');
        }
        let rest = a.ooms_not_snapshotted();
        if rest > 0 && full {
            wrap(
                &mut o,
                &format!(
                    "{} more out-of-memory event{} recorded after these (only the first {} are analysed).",
                    count(rest),
                    if rest == 1 { " was" } else { "s were" },
                    model::MAX_OOM_SNAPSHOTS
                ),
                "  ",
            );
            o.push('\n');
        }
    }
    if full {
        crate::reporters::text::notes(&mut o, a);
        endings(&mut o, a);
        devices(&mut o, a);
    } else if a.oom_records > 0 {
        short_end(&mut o, a);
    } else {
        if a.processes.iter().any(|p| !p.ended_cleanly()) {
            endings(&mut o, a);
        }
        devices(&mut o, a);
    }
    if !full && a.oom_records > 0 {
        wrap(
            &mut o,
            "More: vramtrace oom --full TRACE (every live allocation, call site and refusal), or --json.",
            "  ",
        );
    }
    o
}

/// The errors after the first on the one screen: a line for each kind (where, who, how much, the cause), the
/// first [`OTHER_KINDS`] kinds.
fn other_errors(o: &mut String, a: &Analysis, shown: usize) {
    if a.ooms.len() < 2 {
        return;
    }
    // (place, pid, requested, cause) -> (how many, first, last).
    type Kind = (String, u32, u64, &'static str);
    let mut kinds: Vec<(Kind, (u64, u64, u64))> = Vec::new();
    for (_, s) in a.ooms.iter().enumerate().filter(|(i, _)| *i != shown) {
        let k = (
            oom_place(s),
            s.pid,
            s.requested_bytes,
            diagnose(a, s).cause.key(),
        );
        match kinds.iter_mut().find(|x| x.0 == k) {
            Some(x) => {
                x.1 .0 += 1;
                x.1 .2 = s.time_ns;
            }
            None => kinds.push((k, (1, s.time_ns, s.time_ns))),
        }
    }
    let others = a.oom_records.saturating_sub(1);
    writeln!(
        o,
        "THE OTHER {}",
        crate::names::units::counted(others, "ERROR", "ERRORS")
    )
    .ok();
    for ((place, pid, asked, cause), (n, t0, t1)) in kinds.iter().take(OTHER_KINDS) {
        let when = if n == &1 {
            format!("at {}", secs(*t0))
        } else {
            format!("{} times, {} to {}", count(*n), secs(*t0), secs(*t1))
        };
        wrap(
            o,
            &format!(
                "  {place}, pid {pid} asked {}, {when}; cause: {cause}",
                bytes(*asked)
            ),
            "    ",
        );
    }
    if kinds.len() > OTHER_KINDS {
        writeln!(o, "  ... and {} more kinds", kinds.len() - OTHER_KINDS).ok();
    }
    let rest = a.ooms_not_snapshotted();
    if rest > 0 {
        writeln!(
            o,
            "  ... and {} after these, not analysed (the first {} are)",
            count(rest),
            model::MAX_OOM_SNAPSHOTS
        )
        .ok();
    }
    o.push('\n');
}

/// Kinds of further error listed on the one screen.
const OTHER_KINDS: usize = 4;

/// The end of the one screen: how the processes ended that did not exit cleanly, and each device's peak, in
/// one or two lines (the tables are `--full`'s).
fn short_end(o: &mut String, a: &Analysis) {
    let bad: Vec<String> = a
        .processes
        .iter()
        .filter(|p| !p.ended_cleanly())
        .map(|p| format!("pid {} {}", p.pid, crate::reporters::text::ending_label(p)))
        .collect();
    let ended = match bad.len() {
        0 => "every process exited 0".to_string(),
        1..=3 => bad.join(", "),
        n => format!("{} and {} more did not exit 0", bad[..3].join(", "), n - 3),
    };
    // Host memory only where an error was.
    let host_error = a.ooms.iter().any(|s| s.on_host);
    let peaks: Vec<String> = a
        .devices
        .iter()
        .filter(|d| d.peak_bytes > 0 && (!d.on_host || host_error))
        .take(4)
        .map(|d| {
            format!(
                "{} {}",
                crate::reporters::text::device_label(d),
                bytes(d.peak_bytes)
            )
        })
        .collect();
    let peaks = match peaks.len() {
        0 => String::new(),
        1 => format!("; peak {}", peaks[0]),
        _ => format!("; peaks {}", peaks.join(", ")),
    };
    wrap(o, &format!("ENDED: {ended}{peaks}."), "  ");
}

/// `cuMemAlloc_v2`, `cuMemAllocAsync_ptsz`, `api 99` for a number this build does not know.
/// A framework as its users write it.
pub fn framework_name(f: vramtrace_format::Framework) -> &'static str {
    match f {
        vramtrace_format::Framework::Torch => "PyTorch",
        vramtrace_format::Framework::Jax => "JAX",
    }
}

pub fn api_label(api: Option<Api>, code: u8, ptsz: bool) -> String {
    match api {
        Some(a) if ptsz => format!("{}_ptsz", a.name()),
        Some(a) => a.name().to_string(),
        None => format!("api {code}"),
    }
}

/// One out-of-memory event's part of the report (`n` its number), as `vramtrace oom` prints it.
pub fn event_text(a: &Analysis, s: &OomSnapshot, d: &Diagnosis, n: usize) -> String {
    let mut o = String::new();
    event(&mut o, a, s, d, n, true);
    o
}

fn event(o: &mut String, a: &Analysis, s: &OomSnapshot, d: &Diagnosis, n: usize, full: bool) {
    headline(o, a, s, d, n, full);
    cause(o, d, full);
    if !full {
        short_figures(o, s, d);
        held_by(o, a, s);
        // The flushes are the headline's where it tells of this error's own.
        let told = s.driver_ooms_folded > 0 && s.framework.is_some();
        findings_and_advice(
            o,
            prose::short_findings(d).filter(|f| {
                !(told && matches!(f, crate::model::diagnose::Finding::AllocRetries { .. }))
            }),
            &d.advice,
            // One error: its advice takes what the one screen has left; several: each its share.
            if a.oom_records == 1 {
                AdviceRoom::Screen(ONE_SCREEN)
            } else {
                AdviceRoom::Lines(SHORT_ADVICE)
            },
        );
        return;
    }

    full_figures(o, s, d);
    o.push('\n');

    event_processes(o, s);
    if let Some(h) = s.holders.as_ref().filter(|h| !h.holders.is_empty()) {
        holders(o, h, crate::model::holders::MAX_HOLDERS, usize::MAX);
    }
    top_live(o, a, s);
    classes(o, s);
    live_by_site(o, a, s);
    kept_tensors(o, s);
    window(o, s, d);

    findings_and_advice(
        o,
        d.findings.iter(),
        &d.advice,
        AdviceRoom::Lines(usize::MAX),
    );
}

/// Which error, of which process, refused how, and where it was asked from.
fn headline(o: &mut String, a: &Analysis, s: &OomSnapshot, d: &Diagnosis, n: usize, full: bool) {
    let gpu = oom_place(s);
    let of = match a.oom_records {
        1 => String::new(),
        all => format!(" {n} of {}", count(all)),
    };
    writeln!(o, "OUT OF MEMORY{of} on {gpu} at {}", secs(s.time_ns)).ok();
    let who = a
        .processes
        .iter()
        .find(|p| p.pid == s.pid && p.start_ns <= s.time_ns)
        .or_else(|| a.process(s.pid));
    let mut whom = format!("pid {}", s.pid);
    if let Some(p) = who {
        if let Some(r) = p.rank {
            whom.push_str(&format!(" (rank {r})"));
        }
        // The one process's command is the title's; with several, each error names its own.
        if p.announced && (full || a.processes.len() > 1) {
            whom.push_str(&format!(" {}", fit(&short_command(&p.cmdline), 30)));
        }
    }
    let by = if s.cap_refused {
        "refused by the vramtrace cap"
    } else {
        "refused by the driver"
    };
    let fw = s.framework.as_ref();
    match fw {
        // The framework refused before asking the driver (PyTorch's per-process memory fraction).
        Some(f) if s.api.is_none() && s.api_code == 0 => wrap(
            o,
            &format!(
                "  {whom}, thread {}: {}'s allocator refused {} before asking the driver (its own \
                 limit: {}).",
                s.tid,
                framework_name(f.framework),
                bytes_exact(s.requested_bytes),
                f.allowed_or_total_bytes
                    .map_or("unknown".to_string(), bytes)
            ),
            "    ",
        ),
        // The exact bytes and the driver's code are `--full`'s.
        _ if !full => wrap(
            o,
            &format!(
                "  {whom}, thread {}: {} of {} {by}.",
                s.tid,
                api_label(s.api, s.api_code, s.ptsz),
                bytes(s.requested_bytes),
            ),
            "    ",
        ),
        _ => wrap(
            o,
            &format!(
                "  {whom}, thread {}: {} of {} {by} (CUresult {}).",
                s.tid,
                api_label(s.api, s.api_code, s.ptsz),
                bytes_exact(s.requested_bytes),
                s.result
            ),
            "    ",
        ),
    }
    if let Some(f) = fw {
        raised(o, f, s, d, full);
    }
    // On the one screen, a site that is only the allocator's own native frame (`libc10_cuda.so+0x43c0b`) says
    // nothing the headline does not.
    let informative = |site: usize| {
        full || a
            .call_sites
            .sites
            .get(site)
            .and_then(|x| x.site_frame())
            .is_some_and(|f| {
                f.kind == crate::callsites::FrameKind::Python
                    || crate::callsites::policy::own_frame(f)
            })
    };
    if let Some(site) = s.request_site.filter(|&i| informative(i)) {
        // The library frames that tell sites' stacks apart (`via ...`) are `--full`'s.
        for line in site_lines(a, site, "    asked from ")
            .into_iter()
            .filter(|l| full || !l.trim_start().starts_with("via "))
        {
            writeln!(o, "{line}").ok();
        }
    }
}

/// How the framework raised its error: on which thread, after how many refusals and flushes.
fn raised(
    o: &mut String,
    f: &crate::model::observe::framework::FrameworkOom,
    s: &OomSnapshot,
    d: &Diagnosis,
    full: bool,
) {
    let thread = match f.thread.as_deref() {
        Some(t) if f.on_backward_thread() => format!(" on {t} (autograd's backward thread)"),
        _ => String::new(),
    };
    let folded = match s.driver_ooms_folded {
        0 => String::new(),
        n if !full => {
            // The process's flushes before this one too (the allocator's `num_alloc_retries`): the
            // finding's figure, said here once.
            let all = d.findings.iter().find_map(|f| match f {
                crate::model::diagnose::Finding::AllocRetries { count } => Some(*count),
                _ => None,
            });
            format!(
                " after {} refusal{} (it flushed its cache and retried{})",
                count(n as u64),
                if n == 1 { "" } else { "s" },
                match all {
                    Some(r) if r > 1 => format!("; {} flushes in this process", count(r)),
                    _ => String::new(),
                }
            )
        }
        n => format!(
            "; the driver refused {} request{} for it (the allocator flushed its cache and retried)",
            n + 1,
            if n == 0 { "" } else { "s" }
        ),
    };
    wrap(
        o,
        &format!(
            "    {} raised its out-of-memory error{thread}{folded}.",
            crate::reporters::text::framework::title(f.framework.name())
        ),
        "    ",
    );
}

/// The cause and the one sentence of its figures.
fn cause(o: &mut String, d: &Diagnosis, full: bool) {
    o.push('\n');
    let title = prose::cause_title(d.cause);
    writeln!(o, "  CAUSE: {} ({title})", d.cause.key()).ok();
    wrap(o, &format!("    Because {}.", prose::reason(d)), "    ");
    let view = match d.view.framework() {
        None => "the driver's calls only (no framework figures for this process)".to_string(),
        Some(f) => format!("the driver's calls and {f}'s allocator (the Python bridge)"),
    };
    if full {
        writeln!(o, "    Seen through {view}.").ok();
    }
    o.push('\n');
}

/// One line of `--full`'s figures: name, bytes (or unknown), where the figure comes from.
fn fig(o: &mut String, name: &str, v: Option<u64>, note: &str) {
    let v = v.map_or("unknown".to_string(), bytes);
    let line = format!("    {name:<26}{v:>12}   {note}");
    writeln!(o, "{}", line.trim_end()).ok();
}

/// `--full`'s table of the device's figures at the error.
fn full_figures(o: &mut String, s: &OomSnapshot, d: &Diagnosis) {
    let gpu = oom_place(s);
    if s.on_host {
        // Host memory: the driver gives no free or total for it, and the GPU figures do not apply.
        writeln!(
            o,
            "  FIGURES: none; the driver reports no free or total for host memory ({} asked for)",
            bytes(s.requested_bytes)
        )
        .ok();
    } else {
        writeln!(o, "  FIGURES ON {gpu}").ok();
        fig(o, "requested", Some(s.requested_bytes), "");
        fig(
            o,
            "device total",
            s.device_total_bytes,
            "the driver's, at the event",
        );
        fig(
            o,
            "device free",
            s.device_free_bytes,
            "the driver's, at the event",
        );
        match d.cap_bytes {
            Some(c) => fig(
                o,
                "cap",
                Some(c),
                if s.cap_refused { "refused it" } else { "" },
            ),
            None => writeln!(o, "    {:<26}{:>12}", "cap", "none").map_or((), |_| ()),
        }
        let src = if d.job_live_source == crate::model::diagnose::JobSource::Ledger {
            format!(
                "the cap's ledger (the trace: {})",
                bytes(s.job_live_trace_bytes)
            )
        } else {
            "the trace, all job processes".to_string()
        };
        fig(o, "job live", Some(d.job_live_bytes), &src);
        if let Some(p) = s.ledger_process_bytes {
            fig(
                o,
                "  this process",
                Some(p),
                "the cap's ledger, pid of the event",
            );
        }
        fig(
            o,
            "outside the job",
            d.outside_job_bytes,
            "total - free - job live",
        );
        if d.outside_job_bytes.is_some() {
            let n = s.job_processes_on_device;
            fig(
                o,
                "  job contexts (estimate)",
                Some(
                    d.context_estimate_bytes
                        .min(d.outside_job_bytes.unwrap_or(0)),
                ),
                &if d.context_estimate_bytes > d.outside_job_bytes.unwrap_or(0) {
                    format!(
                        "all that lay outside the job (less than the ~{} x {n} estimated)",
                        bytes(CONTEXT_ESTIMATE_BYTES)
                    )
                } else {
                    format!(
                        "~{} x {n} job process{} on the device",
                        bytes(CONTEXT_ESTIMATE_BYTES),
                        if n == 1 { "" } else { "es" }
                    )
                },
            );
            fig(
                o,
                "  others (estimate)",
                d.outside_excess_bytes,
                "processes outside the job, libraries",
            );
        }
        fig(o, "shortfall", d.shortfall_bytes, "requested - free");
        fig(
            o,
            "freed async, last second",
            Some(s.async_freed_recent_bytes),
            "cuMemFreeAsync: a pool may still cache it",
        );
        fig(
            o,
            "job peak so far",
            Some(s.job_peak_bytes),
            &s.job_peak_time_ns
                .map_or(String::new(), |t| format!("at {}", secs(t))),
        );
        fig(
            o,
            "needed",
            Some(d.needed_bytes),
            "max(peak, job live + requested)",
        );
        fig(
            o,
            "could give",
            d.available_bytes,
            "min(cap, free + job live)",
        );
        framework_figures(o, s);
    }
}

/// `--full`'s figures of the framework's allocator, where the bridge sent them.
fn framework_figures(o: &mut String, s: &OomSnapshot) {
    let Some(f) = s.framework_figures else {
        return;
    };
    let fw = s.framework.as_ref();
    let src = if fw.is_some() {
        "at the error"
    } else {
        "last sample"
    };
    fig(o, "allocated (tensors)", Some(f.allocated), src);
    fig(o, "reserved (segments)", Some(f.reserved), src);
    fig(o, "cached", Some(f.cached()), "reserved - allocated");
    fig(
        o,
        "inactive split",
        Some(f.inactive_split),
        "free, in segments that cannot be released",
    );
    if let Some(l) = fw.and_then(|f| f.largest_free_block) {
        fig(o, "largest free block", Some(l), "in the cache's segments");
    }
    if let Some((al, _)) = s.framework_job {
        fig(
            o,
            "job allocated",
            Some(al),
            "all processes' tensors on the device",
        );
    }
}

/// Lines of advice on the one screen, in the order the evidence supports; the rest with `--full`.
const SHORT_ADVICE: usize = 7;
/// ... and at most this many, whatever room is left.
const MOST_ADVICE: usize = 9;
/// The one screen's lines at 100 columns.
const ONE_SCREEN: usize = 40;
/// Lines after the advice on the one screen: "(N more with --full)", the blank line, how the job ended (up to
/// 2) and the command for more.
const ADVICE_TAIL: usize = 5;

/// How many lines of advice: so many, or what is left of a screen of so many lines (`o` holding it so far).
#[derive(Clone, Copy)]
enum AdviceRoom {
    Lines(usize),
    Screen(usize),
}

/// The FINDINGS (when any) and ADVICE sections of one error.
fn findings_and_advice<'d>(
    o: &mut String,
    findings: impl Iterator<Item = &'d crate::model::diagnose::Finding>,
    advice: &[Advice],
    room: AdviceRoom,
) {
    let mut findings = findings.peekable();
    if findings.peek().is_some() {
        writeln!(o, "  FINDINGS").ok();
        for f in findings {
            wrap(o, &format!("  - {}", prose::finding(f)), "    ");
        }
        o.push('\n');
    }
    writeln!(o, "  ADVICE").ok();
    // `o` holds the screen so far: the advice takes what is left of it, at least SHORT_ADVICE lines.
    let limit = match room {
        AdviceRoom::Lines(n) => n,
        AdviceRoom::Screen(n) => n
            .saturating_sub(o.lines().count() + ADVICE_TAIL)
            .clamp(SHORT_ADVICE, MOST_ADVICE),
    };
    // Whole suggestions in their order, the first always, while they fit in `limit` lines; a larger cap, where
    // one is advised, always shows, so the one screen never hides what the platform can change.
    let texts: Vec<String> = advice
        .iter()
        .map(|x| {
            let mut one = String::new();
            wrap(&mut one, &format!("  - {}", prose::advice_text(x)), "    ");
            one
        })
        .collect();
    let cap = advice.iter().position(|x| {
        matches!(
            x,
            Advice::Cap(CapAdvice::CapWouldFit { .. } | CapAdvice::CapFitsHistory { .. })
        )
    });
    let reserve = cap.map_or(0, |i| texts[i].lines().count());
    let mut picked: Vec<usize> = Vec::new();
    let mut used = 0;
    for (i, t) in texts.iter().enumerate().filter(|(i, _)| Some(*i) != cap) {
        let n = t.lines().count();
        if !picked.is_empty() && used + n + reserve > limit {
            break;
        }
        picked.push(i);
        used += n;
    }
    picked.extend(cap);
    picked.sort_unstable();
    for &i in &picked {
        o.push_str(&texts[i]);
    }
    let shown = picked.len();
    if advice.len() > shown {
        let more = advice.len() - shown;
        writeln!(o, "  - ({more} more with --full)").ok();
    }
    o.push('\n');
}

/// The few figures that prove the cause: what was asked, what the device or the cap could give, what the job
/// held and needed, and the framework's own split.
fn short_figures(o: &mut String, s: &OomSnapshot, d: &Diagnosis) {
    if s.on_host {
        writeln!(
            o,
            "  FIGURES: none; the driver reports no free or total for host memory ({} asked for)\n",
            bytes(s.requested_bytes)
        )
        .ok();
        return;
    }
    let rows: Vec<(&str, String)> = prose::key_figures(s, d)
        .into_iter()
        .map(|(k, v)| (k, bytes(v)))
        .collect();
    writeln!(o, "  FIGURES ON {}", oom_place(s)).ok();
    // Four to a line: the short labels (`allocated (tensors)` is `allocated`) keep it within the width.
    for row in rows.chunks(4) {
        let mut line = String::from("  ");
        for (k, v) in row {
            let k = k.split(" (").next().unwrap_or(k);
            line.push_str(&format!("  {k:<12}{v:>10}"));
        }
        writeln!(o, "{}", line.trim_end()).ok();
    }
    o.push('\n');
}

fn event_processes(o: &mut String, s: &OomSnapshot) {
    if s.processes.is_empty() {
        return;
    }
    let gpu = oom_place(s);
    writeln!(o, "  PROCESSES AT THE EVENT (bytes live)").ok();
    let row = |pid: &str, rank: &str, cmd: &str, here: &str, all: &str| {
        format!("    {pid:>7}  {rank:>4}  {cmd:<30} {here:>12}  {all:>12}")
    };
    writeln!(o, "{}", row("PID", "RANK", "COMMAND", &gpu, "ALL GPUS")).ok();
    for p in s.processes.iter().take(MAX_ROWS) {
        let cmd = if p.announced {
            short_command(&p.cmdline)
        } else {
            "(no hello)".to_string()
        };
        let all = p
            .per_device
            .iter()
            .fold(0u64, |x, (_, b)| x.saturating_add(*b));
        let mark = if p.pid == s.pid { "*" } else { "" };
        let line = row(
            &format!("{mark}{}", p.pid),
            &p.rank.map_or("-".to_string(), |r| r.to_string()),
            &fit(&cmd, 30),
            &bytes(p.device_live_bytes),
            &bytes(all),
        );
        writeln!(o, "{}", line.trim_end()).ok();
    }
    if s.processes.len() > MAX_ROWS {
        writeln!(o, "    ... and {} more", s.processes.len() - MAX_ROWS).ok();
    }
    writeln!(o, "    * the process whose allocation failed").ok();
    o.push('\n');
}

/// The live tensors of the allocation history kept at the error, by the line that allocated them.
fn kept_tensors(o: &mut String, s: &OomSnapshot) {
    let Some(r) = s.framework.as_ref().and_then(|f| f.snapshot.as_ref()) else {
        return;
    };
    writeln!(
        o,
        "  LIVE TENSORS BY THE LINE THAT ALLOCATED THEM (allocation history, {})",
        r.path
    )
    .ok();
    if let Some(e) = &r.error {
        wrap(o, &format!("    could not read it: {e}"), "    ");
        o.push('\n');
        return;
    }
    for k in &r.kept {
        let rise = if k.during_rise_bytes > 0 {
            format!(
                ", {} of it allocated while the low points rose",
                bytes(k.during_rise_bytes)
            )
        } else {
            String::new()
        };
        wrap(
            o,
            &format!(
                "    {:>12}  {} tensor{}  {}{rise}",
                bytes(k.bytes),
                count(k.count),
                if k.count == 1 { "" } else { "s" },
                k.label
            ),
            "                  ",
        );
    }
    if r.no_frames_bytes > 0 {
        writeln!(
            o,
            "    {:>12}  without Python frames",
            bytes(r.no_frames_bytes)
        )
        .ok();
    }
    if r.overflowed {
        writeln!(
            o,
            "    (the history ring had wrapped: the oldest allocations' times are unknown)"
        )
        .ok();
    }
    o.push('\n');
}

fn top_live(o: &mut String, a: &Analysis, s: &OomSnapshot) {
    if s.top_live.is_empty() {
        writeln!(o, "  LARGEST LIVE ALLOCATIONS: none on {}\n", oom_place(s)).ok();
        return;
    }
    writeln!(
        o,
        "  LARGEST LIVE ALLOCATIONS ({} live on {})",
        count(s.live_count),
        oom_place(s)
    )
    .ok();
    let row = |size: &str, pid: &str, tid: &str, api: &str, addr: &str, age: &str| {
        format!("    {size:>11}  {pid:>7}  {tid:>7}  {api:<28} {addr:>16}  {age:>10}")
    };
    writeln!(o, "{}", row("SIZE", "PID", "TID", "API", "ADDRESS", "AGE")).ok();
    for l in &s.top_live {
        writeln!(
            o,
            "{}",
            row(
                &bytes(l.bytes),
                &l.pid.to_string(),
                &l.tid.to_string(),
                &api_label(Some(l.api), l.api as u8, l.ptsz),
                &format!("{:#x}", l.address),
                &secs(l.age_ns),
            )
        )
        .ok();
        if let Some(site) = l.site.and_then(|i| a.call_sites.sites.get(i)) {
            let lead = "                 at ";
            let label = fit_label(&printable(&site.label()), WIDTH - lead.len());
            writeln!(o, "{lead}{label}").ok();
        }
    }
    o.push('\n');
}

fn classes(o: &mut String, s: &OomSnapshot) {
    if s.live_count == 0 {
        return;
    }
    writeln!(o, "  LIVE BY SIZE").ok();
    for c in &s.size_classes {
        writeln!(
            o,
            "    {:<16}{:>10} allocation{:<2}{:>12}",
            c.label,
            count(c.count),
            if c.count == 1 { "" } else { "s" },
            bytes(c.bytes)
        )
        .ok();
    }
    o.push('\n');
}

fn window(o: &mut String, s: &OomSnapshot, d: &Diagnosis) {
    let tl = &s.timeline;
    let Some(first) = tl.buckets.first() else {
        return;
    };
    let start = first.t_ns;
    let span = s.time_ns.saturating_sub(start).max(1);
    let shifted = Timeline {
        bucket_ns: tl.bucket_ns,
        buckets: tl
            .buckets
            .iter()
            .map(|b| model::Bucket {
                t_ns: b.t_ns - start,
                ..*b
            })
            .collect(),
    };
    let max = tl.buckets.iter().map(|b| b.max_bytes).max().unwrap_or(0);
    let mut beside = vec![format!("max {}", bytes(max))];
    if let Some(c) = d.cap_bytes {
        beside.push(format!("cap {}", bytes(c)));
    }
    if let Some(t) = d.total_bytes {
        beside.push(format!("device {}", bytes(t)));
    }
    writeln!(
        o,
        "  {} BEFORE THE EVENT, job bytes in use ({})",
        oom_place(s),
        beside.join(", ")
    )
    .ok();
    let line = sparkline(&shifted, span, max, SPARK);
    writeln!(o, "    {}", line.trim_end()).ok();
    let left = format!("-{}", secs(span));
    writeln!(
        o,
        "    {left}{}event",
        " ".repeat(SPARK.saturating_sub(left.len() + 5))
    )
    .ok();
    o.push('\n');
}

#[cfg(test)]
mod tests;

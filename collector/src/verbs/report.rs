//! `vramtrace report FILE [--json]`: replays a trace and prints the text report or the documented JSON.
//!
//! A file that cannot be read as a trace (missing, unreadable, empty, not a trace, a newer format) is one
//! line on stderr and exit 2. A trace cut short or corrupt part way is still reported, up to where it stops,
//! with a note saying where (exit 0; the JSON has `"partial": true` and the sentence in `"stopped"`).

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::Path;

use crate::model::Analysis;
use crate::names::units::{bytes, count, secs};
use crate::process::exit::{self, Code};
use crate::reporters::json;
use crate::reporters::text::{device_label, render_in, WIDTH};

pub fn main(file: &Path, json: bool) -> Code {
    let a = match crate::whatif::trace_file::analyze(file) {
        Ok(a) => a,
        Err(e) => return exit::fail(exit::USAGE, e),
    };
    let text = if json {
        json::render(&a)
    } else {
        render_in(&a, Some(file), terminal_columns().unwrap_or(WIDTH))
    };
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => exit::OK,
        // `vramtrace report t | head`: the reader has seen what it wanted.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => exit::OK,
        Err(e) => exit::fail(exit::FAILURE, format_args!("cannot write the report: {e}")),
    }
}

/// A few lines for the end of `vramtrace run` (the caller prints them on stderr and adds the trace's path):
/// each device's peak and when, processes, events, dropped events, and what was live at the end. Every line
/// ends with a newline.
pub fn summary(a: &Analysis) -> String {
    let mut o = String::new();
    if let Some(why) = &a.stopped {
        writeln!(o, "partial trace: {why}").ok();
    }
    let untraced: Vec<&crate::model::ProcessStats> = a
        .processes
        .iter()
        .filter(|p| p.untraced.is_some())
        .collect();
    if a.devices.iter().all(|d| d.peak_bytes == 0) {
        if untraced.is_empty() {
            writeln!(o, "no GPU memory was allocated").ok();
        } else {
            writeln!(o, "no GPU memory allocation reached the trace").ok();
        }
    }
    for d in a.devices.iter().filter(|d| d.peak_bytes > 0) {
        writeln!(
            o,
            "{} peak {} at {} ({} allocations)",
            device_label(d),
            bytes(d.peak_bytes),
            secs(d.peak_time_ns.unwrap_or(0)),
            count(d.allocations)
        )
        .ok();
    }
    let traced = a.processes.len() - untraced.len();
    writeln!(
        o,
        "{} process{} traced{}, {}, {} dropped",
        count(traced as u64),
        if traced == 1 { "" } else { "es" },
        if untraced.is_empty() {
            String::new()
        } else {
            format!(" ({} not traced, below)", count(untraced.len() as u64))
        },
        crate::names::units::counted(a.events, "event", "events"),
        count(a.dropped_events)
    )
    .ok();
    for p in untraced.iter().take(8) {
        writeln!(
            o,
            "pid {} ({}) was not traced: {}",
            p.pid,
            crate::names::units::printable(p.cmdline.first().map_or("?", |c| c.as_str())),
            crate::names::units::printable(p.untraced.as_deref().unwrap_or_default())
        )
        .ok();
    }
    if untraced.len() > 8 {
        writeln!(
            o,
            "... and {} more not traced (`vramtrace report --json` lists them all)",
            count(untraced.len() as u64 - 8)
        )
        .ok();
    }
    for p in a.processes.iter().filter(|p| !p.lost.is_empty()).take(8) {
        for (cause, n) in &p.lost {
            writeln!(
                o,
                "pid {} ({}): {} records lost: {}",
                p.pid,
                crate::names::units::printable(p.cmdline.first().map_or("?", |c| c.as_str())),
                count(*n),
                cause.describe()
            )
            .ok();
        }
    }
    // What the Python bridge could not do (a snapshot it could not write beside the trace, a history it could
    // not arm): said here too, not only in `report --json`'s bridge messages.
    for (pid, _, text) in a.bridge.notes.iter().take(4) {
        writeln!(
            o,
            "pid {pid}: the Python bridge: {}",
            crate::names::units::printable(text)
        )
        .ok();
    }
    if a.bridge.notes.len() > 4 {
        writeln!(
            o,
            "... and {} more from the Python bridge (`vramtrace report --json`, bridge.messages)",
            count(a.bridge.notes.len() as u64 - 4)
        )
        .ok();
    }
    if a.live_at_end_count > 0 {
        writeln!(
            o,
            "live at end (never freed before the process ended): {} in {} allocation{}{}",
            bytes(a.live_at_end_bytes),
            count(a.live_at_end_count),
            if a.live_at_end_count == 1 { "" } else { "s" },
            crate::reporters::text::framework::cache_at_end_sentence(a)
                .map_or(String::new(), |t| format!("; {t}"))
        )
        .ok();
    }
    o
}

/// The columns of the terminal the report is printed on, if standard output is one: a table may use them.
/// Piped or redirected, the report keeps its fixed width (the same bytes whoever runs it).
fn terminal_columns() -> Option<usize> {
    // SAFETY: `winsize` is plain data, and TIOCGWINSZ only writes one into the pointer it is given; on a
    // descriptor that is not a terminal it fails and writes nothing.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: as above: fd 1 and a valid, writable `winsize`.
    let ok = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) } == 0;
    (ok && ws.ws_col > 0).then_some(ws.ws_col as usize)
}

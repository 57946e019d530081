//! The report's process table.

use std::fmt::Write;

use super::labels::{ending_label, short_command};
use crate::model::{Analysis, Ended, ProcessStats};
use crate::names::units::{bytes, count, fit};

/// Rows of the process table before the rest is summed up.
pub const MAX_PROCESS_ROWS: usize = 64;

/// The process table's columns but the command and the ending, with their gaps.
const PROCESS_COLUMNS: usize = 2 + 7 + 2 + 4 + 2 + 1 + 10 + 2 + 11 + 2 + 8 + 2 + 10 + 2;

/// The PROCESSES section: a row per process (the first [`MAX_PROCESS_ROWS`]), its command taking the room the
/// other columns leave within `width`.
pub(super) fn table(o: &mut String, a: &Analysis, width: usize) {
    if a.processes.is_empty() {
        return;
    }
    writeln!(o, "PROCESSES").ok();
    // The command takes the room the other columns leave within `width` (at least 22 characters).
    let shown = &a.processes[..a.processes.len().min(MAX_PROCESS_ROWS)];
    let commands: Vec<String> = shown
        .iter()
        .map(|p| {
            if p.announced {
                short_command(&p.cmdline)
            } else {
                "(no hello)".to_string()
            }
        })
        .collect();
    let ended_width = shown
        .iter()
        .map(|p| ending_label(p).chars().count())
        .max()
        .unwrap_or(0)
        .max("ENDED".len());
    let room = width.saturating_sub(PROCESS_COLUMNS + ended_width);
    let cmd_width = commands
        .iter()
        .map(|c| c.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(22, room.max(22));
    let row = |pid: &str,
               rank: &str,
               cmd: &str,
               peak: &str,
               live: &str,
               allocs: &str,
               failed: &str,
               ended: &str| {
        format!(
            "  {pid:>7}  {rank:>4}  {cmd:<cmd_width$} {peak:>10}  {live:>11}  {allocs:>8}  {failed:>10}  {ended}"
        )
    };
    writeln!(
        o,
        "{}",
        row(
            "PID",
            "RANK",
            "COMMAND",
            "PEAK",
            "LIVE AT END",
            "ALLOCS",
            "FAILED/OOM",
            "ENDED"
        )
    )
    .ok();
    for (p, cmd) in shown.iter().zip(&commands) {
        let failed = if p.failed_allocations == 0 {
            "-".to_string()
        } else {
            format!("{}/{}", p.failed_allocations, p.oom_results)
        };
        let line = row(
            &p.pid.to_string(),
            &p.rank.map_or("-".to_string(), |r| r.to_string()),
            &fit(cmd, cmd_width),
            &bytes(p.peak_bytes),
            &bytes(p.live_bytes_at_end),
            &count(p.allocations),
            &failed,
            &ending_label(p),
        );
        writeln!(o, "{}", line.trim_end()).ok();
    }
    if a.processes.len() > MAX_PROCESS_ROWS {
        let rest: &[ProcessStats] = &a.processes[MAX_PROCESS_ROWS..];
        writeln!(
            o,
            "  ... and {} more processes (peaks up to {}; --json lists them all)",
            rest.len(),
            bytes(rest.iter().map(|p| p.peak_bytes).max().unwrap_or(0))
        )
        .ok();
    }
    if a.processes
        .iter()
        .any(|p| p.ended == Ended::Vanished && p.exit.is_none())
    {
        writeln!(
            o,
            "  vanished: the connection closed without a goodbye, and its parent, not vramtrace, reaped it \
             (killed, crashed, or _exit)"
        )
        .ok();
    }
    o.push('\n');
}

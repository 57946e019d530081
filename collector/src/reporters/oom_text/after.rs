//! After the events: a run with no error, how each process ended, each device's peak and headroom.

use std::fmt::Write;

use super::layout::{wrap, MAX_ROWS};
use crate::model::{Analysis, Ended};
use crate::names::units::{bytes, count, fit, secs};
use crate::reporters::text::{device_name, short_command};

pub(super) fn no_oom(o: &mut String, a: &Analysis) {
    writeln!(o, "No out-of-memory error was recorded.").ok();
    if let Some(r) = crate::reporters::text::refusals_text(a) {
        wrap(o, &format!("  {r}"), "    ");
    }
    if let Some(x) = crate::reporters::text::cap_exceeded_text(a) {
        wrap(o, &format!("  But {x}."), "    ");
    }
    // Failed allocations with no record of their own: recovered refusals had one each.
    let ooms: u64 = a
        .processes
        .iter()
        .map(|p| p.oom_results)
        .sum::<u64>()
        .saturating_sub(a.refusals_recovered);
    if ooms > 0 {
        wrap(
            o,
            &format!(
                "  But {} allocation{} failed with CUDA_ERROR_OUT_OF_MEMORY without an out-of-memory record \
                 (a shim older than this vramtrace, or the collector was gone): `vramtrace report` lists them \
                 per process.",
                count(ooms),
                if ooms == 1 { "" } else { "s" }
            ),
            "    ",
        );
    }
    // How those without a goodbye really ended, where vramtrace reaped them.
    for (p, x) in a
        .processes
        .iter()
        .filter(|p| matches!(p.ended, Ended::Vanished | Ended::CutMidFrame { .. }))
        .filter_map(|p| p.exit.map(|x| (p, x)))
    {
        wrap(
            o,
            &format!(
                "  pid {} ({}) {} without a goodbye{}.",
                p.pid,
                crate::reporters::text::short_command(&p.cmdline),
                x.describe(),
                match x {
                    vramtrace_format::ExitStatus::Code(_) => " (it called _exit, or exec failed)",
                    vramtrace_format::ExitStatus::Signal { .. } => "",
                }
            ),
            "    ",
        );
    }
    let vanished = a
        .processes
        .iter()
        .filter(|p| {
            matches!(p.ended, Ended::Vanished | Ended::CutMidFrame { .. }) && p.exit.is_none()
        })
        .count();
    if vanished > 0 {
        wrap(
            o,
            &format!(
                "  {vanished} process{} ended without a goodbye, reaped by {} own parent so vramtrace did not \
                 see how: killed (a signal, the host's OOM killer, a scheduler's time limit), crashed, or \
                 _exit. `dmesg` and the scheduler's log say which.",
                if vanished == 1 { "" } else { "es" },
                if vanished == 1 { "its" } else { "their" }
            ),
            "    ",
        );
    }
    o.push('\n');
}

pub(super) fn endings(o: &mut String, a: &Analysis) {
    if a.processes.is_empty() {
        return;
    }
    writeln!(o, "HOW EACH PROCESS ENDED").ok();
    let row = |pid: &str, rank: &str, cmd: &str, ended: &str, at: &str, peak: &str, live: &str| {
        format!("  {pid:>7}  {rank:>4}  {cmd:<24} {ended:<14} {at:>10}  {peak:>11}  {live:>11}")
    };
    writeln!(
        o,
        "{}",
        row(
            "PID",
            "RANK",
            "COMMAND",
            "ENDED",
            "AT",
            "PEAK",
            "LIVE AT END"
        )
    )
    .ok();
    for p in a.processes.iter().take(MAX_ROWS) {
        let cmd = if p.announced {
            short_command(&p.cmdline)
        } else {
            "(no hello)".to_string()
        };
        let line = row(
            &p.pid.to_string(),
            &p.rank.map_or("-".to_string(), |r| r.to_string()),
            &fit(&cmd, 24),
            &crate::reporters::text::ending_label(p),
            &p.end_ns.map_or("-".to_string(), secs),
            &bytes(p.peak_bytes),
            &bytes(p.live_bytes_at_end),
        );
        writeln!(o, "{}", line.trim_end()).ok();
        if p.per_device
            .iter()
            .filter(|d| d.live_bytes_at_end > 0)
            .count()
            > 1
        {
            let per: Vec<String> = p
                .per_device
                .iter()
                .filter(|d| d.live_bytes_at_end > 0)
                .map(|d| {
                    let name = if d.on_host {
                        "host memory".to_string()
                    } else {
                        device_name(d.device)
                    };
                    format!("{name} {}", bytes(d.live_bytes_at_end))
                })
                .collect();
            wrap(
                o,
                &format!("           live at end: {}", per.join(", ")),
                "             ",
            );
        }
    }
    if a.processes.len() > MAX_ROWS {
        writeln!(
            o,
            "  ... and {} more processes (--json lists them all)",
            a.processes.len() - MAX_ROWS
        )
        .ok();
    }
    o.push('\n');
}

pub(super) fn devices(o: &mut String, a: &Analysis) {
    if a.devices.is_empty() {
        writeln!(o, "No GPU memory was allocated in this trace.").ok();
        return;
    }
    writeln!(o, "DEVICES: PEAK AND HEADROOM").ok();
    for d in &a.devices {
        let mut line = format!(
            "  {}  peak {}{}",
            crate::reporters::text::device_label(d),
            bytes(d.peak_bytes),
            d.peak_time_ns
                .map_or(String::new(), |t| format!(" at {}", secs(t)))
        );
        match crate::reporters::text::headroom_line(d) {
            Some(h) => line.push_str(&format!("; {h}")),
            None if d.on_host => line.push_str("; pinned host memory, on no GPU"),
            None => line.push_str("; device size unknown (no cuMemGetInfo, no cap)"),
        }
        wrap(o, &line, "    ");
        if let Some(g) = &d.growth {
            let t = crate::reporters::text::growth_text(g, d.framework.is_some());
            wrap(o, &format!("    {t}"), "      ");
        }
    }
}

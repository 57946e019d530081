//! The text report's view of the frameworks' allocators (the Python bridge): allocated versus reserved per
//! device, the cache flushes that warn of trouble, the leak read from allocated bytes, what was the cache at
//! the end rather than live tensors, and where the bridge did not run.

use std::fmt::Write as _;

use super::labels::short_command;
use super::layout::{wrap, SPARK_COLUMNS, WIDTH};
use super::sparkline;
use crate::model::{Analysis, DeviceFramework, DeviceStats};
use crate::names::units::{bytes, count, printable, secs};

/// A framework's name for people.
pub fn title(name: &str) -> String {
    name.split('+')
        .map(|n| match n {
            "pytorch" => "PyTorch",
            "jax" => "JAX",
            other => other,
        })
        .collect::<Vec<_>>()
        .join(" and ")
}

/// Under a device: the framework's allocated and reserved bytes over time, on one scale.
pub fn device_lines(o: &mut String, a: &Analysis, d: &DeviceStats, pad: &str) {
    let Some(f) = &d.framework else {
        return;
    };
    wrap(
        o,
        &format!(
            "{pad}{}'s allocator ({} process{}): allocated peak {}{}, reserved peak {}",
            title(&f.frameworks),
            count(f.processes),
            if f.processes == 1 { "" } else { "es" },
            bytes(f.peak_allocated),
            f.peak_allocated_time_ns
                .map_or(String::new(), |t| format!(" at {}", secs(t))),
            bytes(f.peak_reserved)
        ),
        pad,
        WIDTH,
    );
    let scale = f.peak_reserved.max(f.peak_allocated);
    for (name, tl) in [("allocated", &f.allocated), ("reserved ", &f.reserved)] {
        let line = sparkline::sparkline(tl, a.end_ns, scale, SPARK_COLUMNS - 10);
        if !line.trim().is_empty() {
            writeln!(o, "{pad}{name} {}", line.trim_end()).ok();
        }
    }
    if f.alloc_retries > 0 {
        wrap(
            o,
            &format!(
                "{pad}warning: the allocator flushed its cache and retried a driver allocation {} time{} \
                 (`num_alloc_retries`): it ran short of memory, which comes before out-of-memory errors.",
                count(f.alloc_retries),
                if f.alloc_retries == 1 { "" } else { "s" }
            ),
            pad,
            WIDTH,
        );
    }
    small_growth(o, a, f, pad);
    allocated_growth(o, a, d, f, pad);
}

/// Allocated bytes that rose at every step's boundary, too little to call a growth: said, with what held them.
fn small_growth(o: &mut String, a: &Analysis, f: &DeviceFramework, pad: &str) {
    let Some((pid, steps, rise)) = f.small_growth else {
        return;
    };
    // Named with what held it at exit, when the bridge walked; never a cause.
    let held = a
        .bridge
        .walks
        .iter()
        .rev()
        .find(|w| w.pid == pid)
        // Something kept at every step: the holder of the most tensors, not the largest one.
        .and_then(|w| w.suspects().max_by_key(|h| (h.tensors, h.bytes)))
        .map_or(String::new(), |h| format!("; {}", held_at_exit(h)));
    wrap(
        o,
        &format!(
            "{pad}Small growth (pid {pid}): allocated bytes rose at every one of the last {} steps' \
             boundaries, about {} a step ({} in all), too little to call a growth{held}.",
            count(steps),
            bytes(rise / steps.max(1)),
            bytes(rise)
        ),
        pad,
        WIDTH,
    );
}

/// The growth of allocated bytes (the tensors), what held them at exit, and the line whose tensors grew.
fn allocated_growth(o: &mut String, a: &Analysis, d: &DeviceStats, f: &DeviceFramework, pad: &str) {
    let Some(l) = &f.leak else {
        return;
    };
    wrap(
        o,
        &format!(
            "{pad}Growth of allocated bytes (the tensors; the cache hides it from the driver): {}.",
            crate::reporters::prose::growth_size(l)
        ),
        pad,
        WIDTH,
    );
    // What held the tensors at exit (the bridge walks them after a growth): the object, named first.
    let walk =
        a.bridge.walks.iter().rev().find(|w| {
            l.pid.is_none_or(|p| p == w.pid) && w.device.is_none_or(|x| Some(x) == d.device)
        });
    if let Some(w) = walk {
        // What grew, not every name that holds a tensor: a tenth of the rise at least.
        for h in w
            .suspects()
            .filter(|h| h.bytes >= l.rise_bytes / 10)
            .take(3)
        {
            wrap(o, &format!("{pad}  {}", held_at_exit(h)), pad, WIDTH);
        }
    }
    let walked = walk.is_some_and(|w| w.suspects().any(|h| h.bytes >= l.rise_bytes / 10));
    let during = f
        .kept
        .as_ref()
        .and_then(|k| k.kept.iter().max_by_key(|x| x.during_rise_bytes))
        .filter(|k| k.during_rise_bytes > 0);
    let largest = f.kept.as_ref().and_then(|k| k.kept.first());
    match (during, largest) {
        (Some(k), _) => wrap(
            o,
            &format!(
                "{pad}  the line whose tensors grew: {} ({} made during the rise and live at exit, in {})",
                k.label,
                bytes(k.during_rise_bytes),
                crate::names::units::counted(k.count, "tensor", "tensors")
            ),
            pad,
            WIDTH,
        ),
        // The history was armed late in the rise: it cannot say when the tensors were made, only where.
        (None, Some(k)) => wrap(
            o,
            &format!(
                "{pad}  the tensors live at exit, by their line (the history was armed late in the rise): \
                 {} ({} in {})",
                k.label,
                bytes(k.bytes),
                crate::names::units::counted(k.count, "tensor", "tensors")
            ),
            pad,
            WIDTH,
        ),
        (None, None) if walked => {}
        (None, None) => wrap(
            o,
            &match &f.kept {
                Some(k) => format!(
                    "{pad}  the snapshot kept at exit holds none of its tensors ({} live then, without \
                     lines: the growth was freed before the exit){}.",
                    bytes(k.live_bytes),
                    if a.oom_records > 0 {
                        "; the post-mortem of its error names the line (vramtrace oom)"
                    } else {
                        ""
                    }
                ),
                None => format!(
                    "{pad}  no allocation history was armed at exit to name its line: vramtrace run \
                     --torch-history keeps it from the start."
                ),
            },
            pad,
            WIDTH,
        ),
    }
}

/// `held at exit by kept (list, global of __main__): 1.25 GiB in 40 tensors`.
fn held_at_exit(h: &crate::model::holders::Holder) -> String {
    format!(
        "held at exit by {}: {}{}",
        h.label(),
        bytes(h.bytes),
        if h.tensors > 0 {
            format!(
                " in {}",
                crate::names::units::counted(h.tensors, "tensor", "tensors")
            )
        } else {
            String::new()
        }
    )
}

/// Bytes live at the end that were a framework's allocator's segments: (held by the allocator, of it in
/// tensors at its last figures). The driver freed them at exit; they are not leaks by themselves.
pub fn cache_at_end(a: &Analysis) -> (u64, u64) {
    let mut held = 0u64;
    let mut tensors = 0u64;
    for p in &a.processes {
        for f in &p.framework {
            let live = p
                .per_device
                .iter()
                .find(|pd| pd.device == Some(f.device))
                .map_or(0, |pd| pd.live_bytes_at_end);
            let h = live.min(f.last.reserved);
            held = held.saturating_add(h);
            tensors = tensors.saturating_add(f.last.allocated.min(h));
        }
    }
    (held, tensors)
}

/// The sentence the live-at-end section and the run summary add, when frameworks held some of it.
pub fn cache_at_end_sentence(a: &Analysis) -> Option<String> {
    let (held, tensors) = cache_at_end(a);
    (held > 0).then(|| {
        format!(
            "{} of it was the frameworks' allocator caches ({} in tensors at their last figures, {} cached), \
             released by the driver at exit: not leaks by themselves",
            bytes(held),
            bytes(tensors),
            bytes(held - tensors)
        )
    })
}

/// Whether a command line is a Python interpreter's.
fn is_python(argv: &[String]) -> bool {
    argv.first()
        .and_then(|a| a.rsplit('/').next())
        .is_some_and(|b| b.starts_with("python"))
}

/// What the bridge attached to, what it could not do, and the Python processes it did not run in.
/// An arming change of PyTorch's allocation history in a few words: what the tensors' lines cover.
pub fn history_text(h: &crate::model::observe::framework::HistoryChange) -> String {
    let why = match h.reason.as_str() {
        "requested" => "as asked (--torch-history)".to_string(),
        "retry" => "PyTorch flushed its cache and retried".to_string(),
        "pressure" => match (h.allocated, h.limit) {
            (Some(al), Some(l)) => format!("{} allocated of a {} limit", bytes(al), bytes(l)),
            _ => "allocated near the limit".to_string(),
        },
        "growth" => "allocated bytes rising step after step".to_string(),
        "pressure_gone" => "the pressure was gone".to_string(),
        other => other.to_string(),
    };
    let dev = h.device.map_or(String::new(), |d| format!(" on GPU {d}"));
    if h.armed {
        format!(
            "allocation history armed at {}{dev} ({why}; {} entries): tensors allocated from then on \
             have their lines",
            crate::names::units::secs(h.time_ns),
            count(h.entries)
        )
    } else {
        format!(
            "allocation history disarmed at {}{dev} ({why})",
            crate::names::units::secs(h.time_ns)
        )
    }
}

pub fn bridge_section(o: &mut String, a: &Analysis) {
    let b = &a.bridge;
    // Only traces that say the bridge was on can say where it did not run.
    let agent = a
        .header
        .setting(vramtrace_format::keys::header::PYTHON_AGENT);
    let missing: Vec<&crate::model::ProcessStats> = match agent {
        Some("on") => a
            .processes
            .iter()
            .filter(|p| {
                p.announced
                    && !p.python_bridge
                    && p.allocations > 0
                    && is_python(&p.cmdline)
                    && !b.attached.iter().any(|x| x.pid == p.pid)
            })
            .collect(),
        _ => Vec::new(),
    };
    let off = agent == Some("off")
        && a.processes
            .iter()
            .any(|p| p.allocations > 0 && is_python(&p.cmdline));
    if b.attached.is_empty()
        && b.notes.is_empty()
        && b.history.is_empty()
        && missing.is_empty()
        && !off
    {
        return;
    }
    writeln!(o, "PYTHON BRIDGE").ok();
    if off {
        wrap(
            o,
            "- off for this run (--python-agent off): Python processes are seen through the driver only.",
            "  ",
            WIDTH,
        );
    }
    for p in &b.attached {
        let mut line = format!(
            "- pid {}: attached to {} {}",
            p.pid,
            title(p.framework.name()),
            p.framework_version.as_deref().unwrap_or("?")
        );
        if let Some(be) = &p.backend {
            line.push_str(&format!(", backend {be}"));
        }
        if let Some(ms) = p.sample_ms {
            line.push_str(&format!(", sampled every {ms} ms"));
        }
        if p.history_entries > 0 {
            line.push_str(&format!(
                ", allocation history of {} entries",
                count(p.history_entries)
            ));
        }
        for pr in &p.problems {
            line.push_str(&format!("; could not: {pr}"));
        }
        // The version, backend and problems are the traced program's words: escaped before the terminal.
        wrap(o, &printable(&line), "  ", WIDTH);
    }
    for h in &b.history {
        wrap(
            o,
            &printable(&format!("- pid {}: {}", h.pid, history_text(h))),
            "  ",
            WIDTH,
        );
    }
    for (pid, _, text) in &b.notes {
        wrap(o, &printable(&format!("- pid {pid}: {text}")), "  ", WIDTH);
    }
    for p in missing {
        wrap(
            o,
            &format!(
                "- pid {} ({}) is a Python process that allocated GPU memory without the bridge (python -I or \
                 -E, a PYTHONPATH it replaced, or --python-agent off): only the driver's view of it.",
                p.pid,
                short_command(&p.cmdline)
            ),
            "  ",
            WIDTH,
        );
    }
    o.push('\n');
}

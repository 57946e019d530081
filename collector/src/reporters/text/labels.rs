//! Names and labels for people: a device, where an out-of-memory event was, a command, how a process ended.

use crate::model::{DeviceStats, Ended, ProcessStats};
use crate::names::units::printable;

/// A device's name for people: `GPU 0`, or `GPU ?` when the shim could not tell.
pub fn device_name(device: Option<u32>) -> String {
    match device {
        Some(d) => format!("GPU {d}"),
        None => "GPU ?".to_string(),
    }
}

/// Where an out-of-memory event was: `GPU 0`, `GPU ?`, or `host memory` (a `cuMemCreate` on the host).
pub fn oom_place(s: &crate::model::OomSnapshot) -> String {
    if s.on_host {
        "host memory".to_string()
    } else {
        device_name(s.device)
    }
}

/// A device's name where its figures are at hand: memory on no GPU (host `cuMemCreate`) is `host memory`.
pub fn device_label(d: &DeviceStats) -> String {
    if d.on_host {
        "host memory".to_string()
    } else {
        device_name(d.device)
    }
}

/// `python train.py --lr 3e-4`: argv[0] without its directory, the rest as given.
pub fn short_command(argv: &[String]) -> String {
    let mut it = argv.iter();
    let Some(first) = it.next() else {
        return String::new();
    };
    let base = first.rsplit('/').next().unwrap_or(first);
    printable(
        &std::iter::once(base)
            .chain(it.map(String::as_str))
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// How a process ended, in a few words: its exit code or signal when vramtrace reaped it, else what its
/// connection showed.
pub fn ending_label(p: &ProcessStats) -> String {
    use vramtrace_format::ExitStatus;
    match p.exit {
        Some(ExitStatus::Code(c)) => format!("exit {c}"),
        Some(ExitStatus::Signal { signal, .. }) => vramtrace_format::signal_name(signal),
        None => ended_label(p.ended).to_string(),
    }
}

/// How a process's connection ended, in a few words.
pub fn ended_label(e: Ended) -> &'static str {
    match e {
        Ended::Goodbye => "exited",
        Ended::Vanished => "vanished",
        Ended::CutMidFrame { .. } => "cut mid-frame",
        Ended::Running => "still running",
    }
}

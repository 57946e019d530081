//! A trace file and what was kept beside it: the replay's answer (`model`), then the framework snapshots its
//! records name, read (`inputs/torch_snapshot.rs`), and the allocator replayed from them up to each error (the
//! what-if's `postmortem`). In the what-if's room, above the model and the readers it uses, so that neither
//! reaches up for the other.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::inputs::pickle::Doc;

use crate::model::{self, Analysis, ModelError, SnapshotReading};

/// Reads and replays a trace file (`model::analyze_trace`), then reads the snapshots kept beside it.
pub fn analyze(path: &Path) -> Result<Analysis, ModelError> {
    let mut a = model::analyze_trace(path)?;
    read_snapshots(&mut a, path);
    Ok(a)
}

/// A trace without its end record that `run` still holds (its lock on the file, `verbs/run.rs`): the job is
/// still running, and the figures are what it recorded so far; said so in place of the reasons a trace can be
/// cut short (a notebook's kernel reads its own trace while it runs).
pub fn say_if_running(a: &mut Analysis, trace: &Path) {
    if a.no_end_record && being_written(trace) {
        a.stopped = Some(
            "the job is still running (vramtrace run is still writing this trace): the figures are what it \
             recorded so far"
                .to_string(),
        );
    }
}

/// Whether a process holds the trace's write lock (`run`, while it writes it).
pub fn being_written(trace: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(trace)
    else {
        return false;
    };
    // SAFETY: flock on the descriptor just opened; integer arguments only. A shared lock taken is released when
    // `f` closes.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)
}

/// Reads the framework snapshots kept beside the trace (`--torch-history`) for the out-of-memory events that
/// name one ([`analyze`] does; `model::analyze_tapped` leaves it to its caller), and says whether a trace without
/// its end record is still being written ([`say_if_running`]).
pub fn read_snapshots(a: &mut Analysis, trace: &Path) {
    say_if_running(a, trace);
    let start_unix = a.header.start_unix_ns;
    // The last file loaded, kept: records that name one file many times (up to the 16 errors analysed, and every
    // device's exit) load it once.
    let mut last: Option<(PathBuf, Rc<Result<Doc, String>>)> = None;
    let mut loaded = |p: &Path| -> Rc<Result<Doc, String>> {
        if let Some((q, d)) = &last {
            if q == p {
                return d.clone();
            }
        }
        let d = Rc::new(crate::inputs::torch_snapshot::load(p));
        last = Some((p.to_path_buf(), d.clone()));
        d
    };
    for o in &mut a.ooms {
        let rise = o.framework_leak.as_ref().map(|l| {
            let us = |t: u64| start_unix.saturating_add(t) / 1_000;
            (us(l.minima[0].t_ns), us(l.minima[l.minima.len() - 1].t_ns))
        });
        let (device, pid) = (o.device, o.pid);
        // Under the cap, what was left is the cap less the job's bytes (the driver's free memory is the
        // device's, not the cap's).
        let left = match (o.cap_refused, o.cap_bytes, o.ledger_job_bytes) {
            (true, Some(c), Some(j)) => Some(c.saturating_sub(j)),
            _ => None,
        };
        let Some(f) = o.framework.as_mut() else {
            continue;
        };
        let Some(recorded) = f.snapshot_path.clone() else {
            continue;
        };
        f.snapshot = Some(read_snapshot(&recorded, trace, device, rise, &mut loaded));
        // The allocator replayed from the history up to this error (whatif/postmortem.rs).
        if let (Some(p), Some(d)) = (
            crate::inputs::torch_snapshot::locate(&recorded, trace),
            device,
        ) {
            if let Ok(doc) = loaded(&p).as_ref() {
                f.replay = crate::whatif::postmortem::replay_failure_in(doc, &p, pid, d, left);
            }
        }
    }
    // A device whose allocated bytes grew over the run: the lines of the tensors live at exit, from the snapshot
    // a process of it kept then (the one holding the most).
    let exits = a.bridge.exit_snapshots.clone();
    for d in &mut a.devices {
        let Some(f) = d.framework.as_mut() else {
            continue;
        };
        let Some(l) = f.leak.as_ref() else {
            continue;
        };
        let us = |t: u64| start_unix.saturating_add(t) / 1_000;
        let rise = Some((us(l.minima[0].t_ns), us(l.minima[l.minima.len() - 1].t_ns)));
        f.kept = exits
            .iter()
            .map(|(_, p)| read_snapshot(p, trace, Some(f.device), rise, &mut loaded))
            .filter(|r| r.error.is_none() && r.live_bytes > 0)
            .max_by_key(|r| r.live_bytes);
    }
    tensor_lines_at_peaks(a, trace, &mut loaded);
}

/// The shim's clock and PyTorch's read one moment at most this far apart (both are the wall clock, read a few
/// calls apart).
const CLOCK_SLACK_US: u64 = 2_000;

/// Lines holding less than this at a peak are one row of other lines (the shim's default smallest call site).
const LINE_MIN_BYTES: u64 = vramtrace_format::env::DEFAULT_STACK_MIN_BYTES;

/// Each device's peak in the lines of the tensors live then, for the PyTorch processes whose history reaches
/// it: what their cache segments held, where the segments' own call sites say only where the cache grew.
fn tensor_lines_at_peaks(
    a: &mut Analysis,
    trace: &Path,
    loaded: &mut impl FnMut(&Path) -> Rc<Result<Doc, String>>,
) {
    use crate::callsites::{TensorLine, TensorLines, SITES_LISTED};
    use crate::whatif::history::{BEFORE_HISTORY, NO_SITE};
    let snapshots = !a.bridge.exit_snapshots.is_empty()
        || a.ooms.iter().any(|o| {
            o.framework
                .as_ref()
                .is_some_and(|f| f.snapshot_path.is_some())
        });
    if !a.call_sites.present || !snapshots {
        return;
    }
    // What the histories could not say is the what-if's to tell; here a process without one keeps its sites.
    let histories = crate::whatif::from_trace::histories(a, trace, loaded, &mut Vec::new());
    let index = a.device_index();
    let start = a.header.start_unix_ns;
    let peak_time: Vec<Option<u64>> = a
        .call_sites
        .at_peak
        .iter()
        .map(|d| {
            let i = *index.get(&(d.device, d.on_host))?;
            a.devices[i].peak_time_ns
        })
        .collect();
    for (d, t) in a.call_sites.at_peak.iter_mut().zip(peak_time) {
        let (Some(dev), Some(t), false) = (d.device, t, d.on_host) else {
            continue;
        };
        let t_us = start.saturating_add(t) / 1_000;
        for h in histories.iter().filter(|h| h.device == dev) {
            let Some(live) = h.live_at(t_us, CLOCK_SLACK_US, h.taken_at == "exit") else {
                continue;
            };
            if live.reserved == 0 && live.allocated == 0 {
                continue;
            }
            let mut tl = TensorLines {
                pid: h.pid,
                taken_at: h.taken_at.clone(),
                allocated_bytes: live.allocated,
                reserved_bytes: live.reserved,
                ..TensorLines::default()
            };
            for &(site, bytes, tensors) in &live.by_site {
                let line = h.site(site).filter(|_| site != NO_SITE);
                match line {
                    _ if site == BEFORE_HISTORY => {
                        tl.before_history_bytes = tl.before_history_bytes.saturating_add(bytes)
                    }
                    None => tl.no_line_bytes = tl.no_line_bytes.saturating_add(bytes),
                    // Lines under the shim's smallest call site are folded, as its small allocations are.
                    Some(line) if tl.lines.len() < SITES_LISTED && bytes >= LINE_MIN_BYTES => {
                        tl.lines.push(TensorLine {
                            line: line.to_string(),
                            bytes,
                            tensors,
                        })
                    }
                    Some(_) => tl.unlisted_bytes = tl.unlisted_bytes.saturating_add(bytes),
                }
            }
            // A history armed late (near a limit, by default) knows too little of what was live: the sites say
            // more then.
            if tl.before_history_bytes > tl.allocated_bytes / 10 {
                continue;
            }
            d.tensor_lines.push(tl);
        }
    }
}

/// A framework snapshot named by a record, found beside `trace` or where it was written, and read.
fn read_snapshot(
    recorded: &str,
    trace: &Path,
    device: Option<u32>,
    rise: Option<(u64, u64)>,
    loaded: &mut impl FnMut(&Path) -> Rc<Result<Doc, String>>,
) -> SnapshotReading {
    match crate::inputs::torch_snapshot::locate(recorded, trace) {
        Some(p) => crate::inputs::torch_snapshot::read_loaded(&loaded(&p), &p, device, rise),
        None => SnapshotReading {
            path: recorded.to_string(),
            error: Some("not found (beside the trace or where it was written)".into()),
            ..SnapshotReading::default()
        },
    }
}

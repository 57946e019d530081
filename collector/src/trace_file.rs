//! A trace file and what was kept beside it: the replay's answer (`model`), then the framework snapshots its
//! records name, read (`torch_snapshot`), and the allocator replayed from them up to each error (`whatif`).
//! Above both the model and the what-if, so that neither reaches up for the other.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::pickle::Doc;

use crate::model::{self, Analysis, ModelError, SnapshotReading};

/// Reads and replays a trace file (`model::analyze_trace`), then reads the snapshots kept beside it.
pub fn analyze(path: &Path) -> Result<Analysis, ModelError> {
    let mut a = model::analyze_trace(path)?;
    read_snapshots(&mut a, path);
    Ok(a)
}

/// Reads the framework snapshots kept beside the trace (`--torch-history`) for the out-of-memory events that
/// name one ([`analyze`] does; `model::analyze_tapped` leaves it to its caller).
pub fn read_snapshots(a: &mut Analysis, trace: &Path) {
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
        let d = Rc::new(crate::torch_snapshot::load(p));
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
        if let (Some(p), Some(d)) = (crate::torch_snapshot::locate(&recorded, trace), device) {
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
}

/// A framework snapshot named by a record, found beside `trace` or where it was written, and read.
fn read_snapshot(
    recorded: &str,
    trace: &Path,
    device: Option<u32>,
    rise: Option<(u64, u64)>,
    loaded: &mut impl FnMut(&Path) -> Rc<Result<Doc, String>>,
) -> SnapshotReading {
    match crate::torch_snapshot::locate(recorded, trace) {
        Some(p) => crate::torch_snapshot::read_loaded(&loaded(&p), &p, device, rise),
        None => SnapshotReading {
            path: recorded.to_string(),
            error: Some("not found (beside the trace or where it was written)".into()),
            ..SnapshotReading::default()
        },
    }
}

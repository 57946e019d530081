//! The what-if inside a post-mortem: a process that ran out of memory with its PyTorch history kept is replayed
//! up to its failed request, against what its allocator could have had then (its reserve at the failure plus
//! what was left: under the cap, the cap less the job's bytes by its ledger; else the free memory the driver
//! reported), under the settings it ran with and under each of the grid's. When the
//! model fails where the run failed, the settings that get past that request are advice drawn from the run
//! itself, not from rounding; when it does not, its advice is withheld.

use std::collections::BTreeMap;
use std::path::Path;

use super::answer::{answer_with, Limit};
use super::history::{from_snapshot, History, Op};
use super::settings::default_grid;

/// What replaying a failed process's history said (a type of the model's answer).
pub use crate::model::AllocatorReplay as Replay;

/// The history up to and including its first refused request.
fn to_first_failure(mut h: History) -> Option<History> {
    let at = h
        .entries
        .iter()
        .position(|e| matches!(e.op, Op::Oom { .. }))?;
    h.entries.truncate(at + 1);
    Some(h)
}

/// Replays the failure of `pid` on `device` from the snapshot at `path`; `None` when the snapshot has no history
/// of it with the failed request in it. `left`: what was left beyond the process's reserve when the cap refused
/// (the cap less the job's bytes); `None`: the driver refused, and the history's free memory says.
pub fn replay_failure(path: &Path, pid: u32, device: u32, left: Option<u64>) -> Option<Replay> {
    let v = crate::inputs::torch_snapshot::load(path).ok()?;
    replay_failure_in(&v, path, pid, device, left)
}

/// [`replay_failure`] on a snapshot already loaded.
pub fn replay_failure_in(
    v: &crate::inputs::pickle::Doc,
    path: &Path,
    pid: u32,
    device: u32,
    left: Option<u64>,
) -> Option<Replay> {
    let mut notes = Vec::new();
    let h = from_snapshot(
        v,
        pid,
        &path.display().to_string(),
        "out of memory",
        &mut notes,
    )
    .into_iter()
    .find(|h| h.device == device)?;
    replay_history(h, left)
}

/// [`replay_failure`] on a history already read.
pub fn replay_history(h: History, left: Option<u64>) -> Option<Replay> {
    let limit = h.oom_reserved? + left.or(h.oom_device_free)?;
    let h = to_first_failure(h)?;
    let oom_entry = h.entries.len() - 1;
    let complete = h.complete();
    let device = h.device;
    let w = answer_with(
        vec![h],
        vec![0],
        BTreeMap::new(),
        BTreeMap::new(),
        &default_grid(),
        Some(Limit {
            bytes: BTreeMap::from([(device, limit)]),
            what: "what the allocator could have had".into(),
        }),
        false,
    );
    let own = &w.configs[0];
    let reproduced = own
        .first_failure
        .as_ref()
        .is_some_and(|f| f.the_runs_own && f.entry == oom_entry);
    let mut passes: Vec<(String, u64)> = w.configs[1..]
        .iter()
        .filter(|c| c.fits == Some(true) && !c.approximate && c.settings.is_some())
        // Its reserve as it served the request under that limit: with no limit it would have reserved more
        // (H200, longer_opt: "in the same 3.87 GiB, its reserve at most 4.42 GiB" was the unlimited figure).
        .map(|c| (c.conf.clone(), c.processes[0].reserved_peak_limited))
        .collect();
    passes.sort_by_key(|p| (p.1, p.0.clone()));
    Some(Replay {
        limit,
        complete,
        reproduced,
        passes,
        needs: own.devices.first().map_or(0, |d| d.smallest_limit),
    })
}

//! The findings beside the cause (docs/OOM.md, "Findings beside the cause"): what is worth knowing whichever
//! rule decided, in the order the reports list them.

use super::cause::Rule;
use super::evidence::Evidence;
use super::verdict::{AllocatorSettings, Finding};
use crate::model::analysis::{OomProcess, OomSnapshot};

/// The cap's ledger and the trace disagreeing by more than this is a finding.
pub const LEDGER_SLACK_BYTES: u64 = 1 << 20;
/// A rank holding at least this many times its peers' median ...
pub const RANK_FACTOR_PCT: u64 = 150;
/// ... and at least this many bytes more.
pub const RANK_EXCESS_BYTES: u64 = 256 << 20;

/// The findings of snapshot `s`, whose cause `rule` decided on evidence `e`.
pub(super) fn findings(s: &OomSnapshot, e: &Evidence, rule: Rule) -> Vec<Finding> {
    let fw = s.framework.as_ref();
    let mut v = Vec::new();
    if let Some(f) = s.framework_figures {
        v.push(Finding::FrameworkFigures {
            allocated_bytes: f.allocated,
            reserved_bytes: f.reserved,
            inactive_split_bytes: f.inactive_split,
            largest_free_block_bytes: fw.and_then(|o| o.largest_free_block),
            free_in_live_segments_bytes: fw.and_then(|o| o.free_in_live_segments),
            alloc_retries: f.alloc_retries,
            settings: fw.map(AllocatorSettings::of),
        });
        if f.alloc_retries > 0 {
            v.push(Finding::AllocRetries {
                count: f.alloc_retries,
            });
        }
    }
    if let Some(f) = rank_asymmetry(s) {
        v.push(f);
    }
    if let Some(n) = super::evidence::step_need(s) {
        v.push(Finding::StepNeedRises(n));
    }
    if let Some(o) = fw.filter(|o| o.on_backward_thread()) {
        v.push(Finding::BackwardThread {
            thread: o.thread.clone().unwrap_or_default(),
        });
    }
    // The device's or the cap's room says nothing where the framework's own limit refused it.
    if let (Some(av), Some(sh), None) = (e.available, e.short, e.framework_limit) {
        v.push(Finding::Fit {
            needed_bytes: e.needed,
            available_bytes: av,
            short_bytes: sh,
            limited_by: e.limited_by,
        });
    }
    // With the framework's figures the leak is read from allocated bytes (the cache hides it from the driver);
    // the driver's own trend is kept when it shows one too.
    // Not where the rise is the steps' input live at their boundary (the growth was set aside for it): the need
    // finding below says what rose.
    if let Some(l) = s
        .framework_leak
        .as_ref()
        .filter(|_| !(e.work_grows && super::evidence::step_need(s).is_some()))
    {
        v.push(Finding::AllocatedLeakTrend(l.clone()));
    }
    // The driver's own growth, unless PyTorch's allocated bytes told it: under a caching allocator the driver
    // sees the cache grow, and its call sites are the code that grew it, not the owners of the tensors.
    if let Some(l) = s.driver_leak().filter(|_| s.framework_leak.is_none()) {
        v.push(Finding::LeakTrend(l.clone()));
    }
    if e.recent > 0 && !rule.reads_pool_cache() {
        v.push(Finding::PoolCache {
            freed_bytes: e.recent,
            shortfall_bytes: e.shortfall,
        });
    }
    if let Some(l) = s.ledger_job_bytes {
        if l.abs_diff(s.job_live_trace_bytes) > LEDGER_SLACK_BYTES {
            v.push(Finding::LedgerDiffers {
                ledger_bytes: l,
                trace_bytes: s.job_live_trace_bytes,
            });
        }
    }
    if s.dropped_events > 0 {
        v.push(Finding::DroppedEvents {
            count: s.dropped_events,
        });
    }
    // Host memory has no driver figures to miss, nor has a framework that refused without asking the driver
    // (its own figures decided).
    if e.free.is_none() && !s.on_host && e.framework_limit.is_none() {
        v.push(Finding::NoDriverFigures);
    }
    v
}

/// The failing process against the other ranks of the same program (same command line: torchrun's, Slurm's and
/// MPI's workers run one), by their bytes live at the error on all devices.
fn rank_asymmetry(s: &OomSnapshot) -> Option<Finding> {
    let me = s.processes.iter().find(|p| p.pid == s.pid)?;
    let rank = me.rank?;
    let total = |p: &OomProcess| {
        p.per_device
            .iter()
            .fold(0u64, |a, (_, b)| a.saturating_add(*b))
    };
    let mine = total(me);
    let mut peers: Vec<u64> = s
        .processes
        .iter()
        .filter(|p| p.pid != s.pid && p.rank.is_some() && p.cmdline == me.cmdline)
        .map(total)
        .collect();
    if peers.is_empty() {
        return None;
    }
    peers.sort_unstable();
    let median = peers[peers.len() / 2];
    let far = (mine as u128) * 100 >= (median as u128) * RANK_FACTOR_PCT as u128
        && mine >= median.saturating_add(RANK_EXCESS_BYTES);
    far.then(|| Finding::RankAsymmetry {
        pid: s.pid,
        rank,
        bytes: mine,
        peers: peers.len() as u64,
        peers_median_bytes: median,
        peers_max_bytes: peers[peers.len() - 1],
    })
}

//! The minima between a timeline's peaks (the cycles a growth counts), and the list of what was never freed.

use crate::model::analysis::*;
use crate::model::observe::timeline::Timeline;
use crate::model::replay::site_store::NO_SITE;

/// The low points between peaks of a timeline, in time order. Peaks and troughs are the turns of a zigzag that
/// ignores moves smaller than [`TURN_PCT`] % of the timeline's range: a trough is the lowest point after a peak
/// once the bytes rose again by that much. Each bucket is read as its highest value, then its value at its end
/// (the time of the latter is the bucket's end).
pub fn minima(tl: &Timeline) -> Vec<Minimum> {
    let w = tl.bucket_ns;
    let samples = tl.buckets.iter().flat_map(|b| {
        [
            Minimum {
                t_ns: b.t_ns,
                bytes: b.max_bytes,
            },
            Minimum {
                t_ns: b.t_ns.saturating_add(w),
                bytes: b.last_bytes,
            },
        ]
    });
    let (lo, hi) = samples.clone().fold((u64::MAX, 0), |(lo, hi), m| {
        (lo.min(m.bytes), hi.max(m.bytes))
    });
    let mut out = Vec::new();
    if hi <= lo {
        return out;
    }
    let h = ((hi - lo) / 100 * TURN_PCT).max(1);
    // None: no direction yet (tracking both ends); Some(true): rising (candidate peak); Some(false): falling
    // (candidate trough, after a peak).
    let mut rising: Option<bool> = None;
    let (mut min0, mut max0) = (u64::MAX, 0u64);
    let mut cand = Minimum { t_ns: 0, bytes: 0 };
    for m in samples {
        match rising {
            None => {
                min0 = min0.min(m.bytes);
                max0 = max0.max(m.bytes);
                if m.bytes >= min0.saturating_add(h) {
                    rising = Some(true);
                    cand = m;
                } else if m.bytes.saturating_add(h) <= max0 {
                    // It started high and fell: the start was a peak.
                    rising = Some(false);
                    cand = m;
                }
            }
            Some(true) => {
                if m.bytes >= cand.bytes {
                    cand = m;
                } else if cand.bytes - m.bytes >= h {
                    rising = Some(false);
                    cand = m;
                }
            }
            Some(false) => {
                if m.bytes < cand.bytes {
                    cand = m;
                } else if m.bytes - cand.bytes >= h {
                    out.push(cand);
                    rising = Some(true);
                    cand = m;
                }
            }
        }
    }
    out
}

/// An aggregate index as a site reference (turned into an index of `CallSites::sites` by `finish`).
#[inline]
pub(in crate::model) fn site_ref(site: u32) -> Option<usize> {
    (site != NO_SITE).then_some(site as usize)
}

/// Keeps the largest [`LEAK_LIST`], in a stable order: largest first, then oldest, then by pid and address.
pub(in crate::model) fn trim_leaks(v: &mut Vec<LiveAlloc>) {
    v.sort_unstable_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(a.alloc_time_ns.cmp(&b.alloc_time_ns))
            .then(a.pid.cmp(&b.pid))
            .then(a.address.cmp(&b.address))
    });
    v.truncate(LEAK_LIST);
}

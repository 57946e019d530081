//! The minima between a timeline's peaks (the cycles a growth counts), and what was never freed: the list, the
//! counts, and what each device kept (for telling what grew).

use crate::model::analysis::*;
use crate::model::observe::sites::NO_SITE;
use crate::model::observe::timeline::Timeline;
use vramtrace_format::Api;

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

/// The most allocations live at their process's end kept for telling what grew (16 MiB).
pub const KEPT_BOUND: usize = 1 << 19;

/// What was live when its process ended (or the trace did), as the replay finds it: the largest
/// [`LEAK_LIST`] listed (trimmed as it goes, so a million never sit in memory), all of them counted, and the
/// first [`KEPT_BOUND`] kept with their device index as (api, bytes, call-site aggregate, time made), for the
/// growth's "what grew".
#[derive(Default)]
pub(in crate::model) struct LiveAtEnd {
    pub list: Vec<LiveAlloc>,
    pub count: u64,
    pub bytes: u64,
    kept: Vec<(u16, Api, u64, u32, u64)>,
}

impl LiveAtEnd {
    /// `a`, live at its process's end, on device index `dev`, its aggregate `site`.
    pub fn add(&mut self, a: LiveAlloc, dev: u16, site: u32) {
        self.count += 1;
        self.bytes = self.bytes.saturating_add(a.bytes);
        if self.kept.len() < KEPT_BOUND {
            self.kept.push((dev, a.api, a.bytes, site, a.alloc_time_ns));
        }
        self.list.push(a);
        if self.list.len() >= 64 * LEAK_LIST {
            trim_leaks(&mut self.list);
        }
    }

    /// The list as the report gives it: the largest, in a stable order.
    pub fn finish(&mut self) {
        trim_leaks(&mut self.list);
    }

    /// What device index `dev` kept, by index of device (once: never every device against every allocation,
    /// a trace can name a million devices).
    pub fn kept_by_device(&self, devices: usize) -> Vec<Vec<(Api, u64, u32, u64)>> {
        let mut on = vec![Vec::new(); devices];
        for k in &self.kept {
            if let Some(v) = on.get_mut(k.0 as usize) {
                v.push((k.1, k.2, k.3, k.4));
            }
        }
        on
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(pid: u32, bytes: u64, t: u64) -> LiveAlloc {
        LiveAlloc {
            pid,
            device: Some(0),
            on_host: false,
            api: Api::MemAlloc,
            ptsz: false,
            address: t,
            bytes,
            alloc_time_ns: t,
            age_ns: 0,
            site: None,
        }
    }

    #[test]
    fn every_allocation_is_counted_the_largest_listed_and_each_device_keeps_its_own() {
        let mut l = LiveAtEnd::default();
        let n = 64 * LEAK_LIST as u64 + 5;
        for i in 0..n {
            l.add(alloc(1, i, i), (i % 3) as u16, NO_SITE);
        }
        l.finish();
        assert_eq!(l.count, n);
        assert_eq!(l.bytes, n * (n - 1) / 2);
        assert_eq!(l.list.len(), LEAK_LIST);
        assert_eq!(l.list[0].bytes, n - 1, "largest first");
        assert!(l.list.windows(2).all(|w| w[0].bytes >= w[1].bytes));
        let by = l.kept_by_device(3);
        assert_eq!(by.iter().map(Vec::len).sum::<usize>() as u64, n);
        assert!(by[1].iter().all(|k| k.1 % 3 == 1), "device 1 keeps its own");
        // A device index past those asked for is not kept anywhere, and nothing panics.
        assert_eq!(l.kept_by_device(1).len(), 1);
    }
}

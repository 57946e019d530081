//! A device's bytes in use over time, downsampled as it is built: buckets start 1 µs wide (so a short run still has
//! a shape); when a value would
//! land past the last of `MAX_BUCKETS`, neighbouring pairs merge and the width doubles. Each bucket keeps the
//! highest value seen in it and the value at its end, so a peak is never lost to downsampling.

/// Width of the first buckets.
pub const FIRST_BUCKET_NS: u64 = 1_000;
/// The most buckets a timeline holds.
pub const MAX_BUCKETS: usize = 2048;
/// The most buckets all of a replay's timelines hold together: each of 64 devices gets [`MAX_BUCKETS`], more
/// devices fewer each ([`cap_for`]), so that a trace naming a million devices costs no more than 64 of them.
pub const TOTAL_BUCKETS: usize = 64 * MAX_BUCKETS;
/// The fewest buckets a timeline is cut to.
pub const MIN_BUCKETS: usize = 2;

/// The buckets each of `timelines` timelines may hold: a power of two, [`MIN_BUCKETS`] to [`MAX_BUCKETS`].
pub fn cap_for(timelines: usize) -> usize {
    let c = (TOTAL_BUCKETS / timelines.max(1)).clamp(MIN_BUCKETS, MAX_BUCKETS);
    1 << c.ilog2()
}

pub use crate::model::analysis::timeline::{Bucket, Timeline};

/// Builds a timeline from (time, value) changes whose times never go backwards (later ones are clamped).
#[derive(Debug, Clone)]
pub(crate) struct TimelineBuilder {
    width: u64,
    /// (max, last) per bucket.
    b: Vec<(u64, u64)>,
    last_t: u64,
    last_v: u64,
    /// The most buckets it holds ([`cap_for`]).
    cap: usize,
}

impl Default for TimelineBuilder {
    fn default() -> Self {
        TimelineBuilder {
            width: FIRST_BUCKET_NS,
            b: Vec::new(),
            last_t: 0,
            last_v: 0,
            cap: MAX_BUCKETS,
        }
    }
}

impl TimelineBuilder {
    /// The value becomes `v` at time `t` (ns from the trace start). Inlined: once per event.
    #[inline(always)]
    pub fn set(&mut self, t: u64, v: u64) {
        let t = t.max(self.last_t);
        self.last_t = t;
        let len = self.b.len();
        // The common case: still inside the last bucket.
        let idx = if len > 0 && t < (len as u64).saturating_mul(self.width) {
            len - 1
        } else {
            self.bucket_for(t)
        };
        let bucket = &mut self.b[idx];
        bucket.0 = bucket.0.max(v);
        bucket.1 = v;
        self.last_v = v;
    }

    /// The bucket of time `t`, past the last one: the buckets between are made (each holding the last value),
    /// halving the resolution when there would be too many. Out of line: `set` stays small enough to inline.
    #[inline(never)]
    fn bucket_for(&mut self, t: u64) -> usize {
        let mut idx = t / self.width;
        while idx >= self.cap as u64 {
            self.halve();
            idx = t / self.width;
        }
        let idx = idx as usize;
        while self.b.len() <= idx {
            self.b.push((self.last_v, self.last_v));
        }
        idx
    }

    fn halve(&mut self) {
        let merged: Vec<(u64, u64)> = self
            .b
            .chunks(2)
            .map(|c| match c {
                [a, b] => (a.0.max(b.0), b.1),
                [a] => *a,
                _ => unreachable!(),
            })
            .collect();
        self.b = merged;
        self.width = self.width.saturating_mul(2);
    }

    /// From now on at most `cap` buckets (a power of two): coarser now if it holds more.
    pub fn set_cap(&mut self, cap: usize) {
        self.cap = cap.clamp(MIN_BUCKETS, MAX_BUCKETS);
        while self.b.len() > self.cap {
            self.halve();
        }
    }

    /// Extends the timeline to `end` (the value holds) and hands it out.
    pub fn finish(mut self, end: u64) -> Timeline {
        if !self.b.is_empty() || self.last_v != 0 {
            let v = self.last_v;
            self.set(end, v);
        }
        Timeline {
            bucket_ns: self.width,
            buckets: self
                .b
                .iter()
                .enumerate()
                .map(|(i, &(max, last))| Bucket {
                    t_ns: (i as u64).saturating_mul(self.width),
                    max_bytes: max,
                    last_bytes: last,
                })
                .collect(),
        }
    }
}

/// `N` timelines per device, by device index, sharing one budget of buckets ([`TOTAL_BUCKETS`]): more devices,
/// coarser each (the resolution changes log2 times at most). The replay keeps one a device (bytes in use), the
/// framework figures two (allocated and reserved).
pub(crate) struct Timelines<const N: usize> {
    devs: Vec<[TimelineBuilder; N]>,
}

impl<const N: usize> Default for Timelines<N> {
    fn default() -> Self {
        Timelines { devs: Vec::new() }
    }
}

impl<const N: usize> Timelines<N> {
    /// The next device index has its timelines (empty), every device's cut to the shared budget.
    pub fn add_device(&mut self) {
        let n = self.devs.len();
        let cap = cap_for(N * (n + 1));
        if cap != cap_for(N * n) {
            for tl in self.devs.iter_mut().flatten() {
                tl.set_cap(cap);
            }
        }
        self.devs.push(std::array::from_fn(|_| {
            let mut tl = TimelineBuilder::default();
            tl.set_cap(cap);
            tl
        }));
    }

    /// Device `d`'s timeline `k` is `v` from `t`. Inlined: once per event.
    #[inline(always)]
    pub fn set(&mut self, d: usize, k: usize, t: u64, v: u64) {
        self.devs[d][k].set(t, v);
    }

    /// Device `d`'s timeline `k` as it stands, extended to `end` (a copy: it goes on).
    pub fn at(&self, d: usize, k: usize, end: u64) -> Timeline {
        self.devs[d][k].clone().finish(end)
    }

    /// Every device's timelines, extended to `end`, by device index.
    pub fn finish(self, end: u64) -> Vec<[Timeline; N]> {
        self.devs
            .into_iter()
            .map(|tls| tls.map(|tl| tl.finish(end)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_max_and_last_and_fills_gaps() {
        let mut b = TimelineBuilder::default();
        let u = FIRST_BUCKET_NS;
        b.set(u / 2, 10);
        b.set(u * 6 / 10, 30);
        b.set(u * 7 / 10, 5);
        b.set(u * 32 / 10, 0);
        let t = b.finish(4 * u - 1);
        assert_eq!(t.bucket_ns, FIRST_BUCKET_NS);
        let got: Vec<(u64, u64)> = t
            .buckets
            .iter()
            .map(|b| (b.max_bytes, b.last_bytes))
            .collect();
        // Bucket 3 held 5 until the free at 3.2 buckets in.
        assert_eq!(got, vec![(30, 5), (5, 5), (5, 5), (5, 0)]);
    }

    #[test]
    fn halves_when_full_and_never_loses_a_peak() {
        let mut b = TimelineBuilder::default();
        // One short spike in the middle of a long run.
        for ms in 0..10_000u64 {
            let v = if ms == 4321 { 1_000 } else { ms % 7 };
            b.set(ms * FIRST_BUCKET_NS, v);
        }
        let t = b.finish(10_000 * FIRST_BUCKET_NS);
        assert!(t.buckets.len() <= MAX_BUCKETS);
        assert_eq!(t.bucket_ns, 8 * FIRST_BUCKET_NS);
        assert_eq!(t.buckets.iter().map(|b| b.max_bytes).max(), Some(1_000));
        assert_eq!(
            t.max_between(4321 * FIRST_BUCKET_NS, 4322 * FIRST_BUCKET_NS),
            Some(1_000)
        );
        // Times going backwards are clamped, not a panic.
        let mut b = TimelineBuilder::default();
        b.set(5_000_000, 1);
        b.set(1_000, 2);
        assert_eq!(b.finish(0).buckets.last().unwrap().last_bytes, 2);
    }

    #[test]
    fn timelines_share_one_budget_and_keep_each_devices_own_shape() {
        let mut tls: Timelines<2> = Timelines::default();
        tls.add_device();
        // One device: a full-width timeline each, at the first resolution.
        for i in 0..100u64 {
            tls.set(0, 0, i * FIRST_BUCKET_NS, i);
            tls.set(0, 1, i * FIRST_BUCKET_NS, 2 * i);
        }
        let one = tls.at(0, 0, 100 * FIRST_BUCKET_NS);
        assert_eq!(one.bucket_ns, FIRST_BUCKET_NS);
        assert_eq!(one.buckets[99].max_bytes, 99);
        // Enough devices that each gets fewer buckets than the first already holds: it is cut, its peak kept.
        let devices = TOTAL_BUCKETS / 64 + 1;
        for _ in 1..devices {
            tls.add_device();
        }
        let cap = cap_for(2 * devices);
        assert!(
            cap < 100,
            "the test needs a budget below 100 buckets, got {cap}"
        );
        tls.set(devices - 1, 0, 5, 7);
        let all = tls.finish(100 * FIRST_BUCKET_NS);
        assert_eq!(all.len(), devices);
        assert!(all[0][0].buckets.len() <= cap && all[0][0].bucket_ns > FIRST_BUCKET_NS);
        assert_eq!(
            all[0][0].buckets.iter().map(|b| b.max_bytes).max(),
            Some(99)
        );
        assert_eq!(
            all[0][1].buckets.iter().map(|b| b.max_bytes).max(),
            Some(198)
        );
        assert_eq!(all[devices - 1][0].buckets[0].max_bytes, 7);
        assert!(all[devices - 1][1].buckets.is_empty());
    }
}

//! Per (process, stack, device) call-site aggregate: allocations, bytes allocated, bytes and allocations live
//! now, bytes live at the device's peak, bytes live at the end. An observer of the replay's changes, by
//! aggregate index (the site store, `replay/site_store.rs`, hands the indices out and keeps the stacks).
//!
//! Bytes live at the peak cost O(1) an event: a device counts its new peaks (`peaks.rs`, `seq`); an aggregate
//! that changes notes the count it saw, and when it next changes (or at the end) with a newer peak in between,
//! its bytes then (unchanged since) were its bytes at that peak.

use std::ops::Deref;

/// No call site.
pub(crate) const NO_SITE: u32 = u32::MAX;

/// The figures of one (process slot, stack id, device index).
#[derive(Clone, Debug)]
pub(crate) struct Agg {
    pub slot: u32,
    pub stack: u32,
    pub dev: u16,
    /// The device's peak count when this last changed.
    seen: u64,
    pub cur: u64,
    pub at_peak: u64,
    pub live_count: u64,
    pub allocations: u64,
    pub bytes: u64,
    pub live_end: u64,
}

impl Agg {
    /// Before a change at a moment when the device has seen `seq` peaks: the bytes now were the bytes at
    /// every peak since the last change.
    #[inline]
    fn sync(&mut self, seq: u64) {
        if self.seen < seq {
            self.at_peak = self.cur;
            self.seen = seq;
        }
    }
}

/// Every aggregate, by index.
#[derive(Default)]
pub(crate) struct SiteAggs {
    aggs: Vec<Agg>,
}

impl Deref for SiteAggs {
    type Target = [Agg];
    fn deref(&self) -> &[Agg] {
        &self.aggs
    }
}

impl SiteAggs {
    /// A new aggregate for (slot, stack, device index); returns its index.
    pub fn add(&mut self, slot: u32, stack: u32, dev: u16) -> u32 {
        self.aggs.push(Agg {
            slot,
            stack,
            dev,
            seen: 0,
            cur: 0,
            at_peak: 0,
            live_count: 0,
            allocations: 0,
            bytes: 0,
            live_end: 0,
        });
        (self.aggs.len() - 1) as u32
    }

    /// `size` bytes allocated at `site` (not [`NO_SITE`]) while its device had seen `seq` peaks (before this
    /// allocation's own).
    #[inline(always)]
    pub fn give(&mut self, site: u32, size: u64, seq: u64) {
        let a = &mut self.aggs[site as usize];
        a.sync(seq);
        a.cur = a.cur.saturating_add(size);
        a.live_count += 1;
        a.allocations += 1;
        a.bytes = a.bytes.saturating_add(size);
    }

    /// `size` bytes of `site` released while its device had seen `seq` peaks.
    #[inline(always)]
    pub fn take(&mut self, site: u32, size: u64, seq: u64) {
        let a = &mut self.aggs[site as usize];
        a.sync(seq);
        a.cur = a.cur.saturating_sub(size);
        a.live_count = a.live_count.saturating_sub(1);
    }

    /// The last `give` of `size` bytes at `site` was memory live again (a release the driver refused), not a
    /// new allocation.
    pub fn uncount(&mut self, site: u32, size: u64) {
        let a = &mut self.aggs[site as usize];
        a.allocations = a.allocations.saturating_sub(1);
        a.bytes = a.bytes.saturating_sub(size);
    }

    /// `size` bytes of `site` were live at its process's end.
    pub fn kept(&mut self, site: u32, size: u64) {
        let a = &mut self.aggs[site as usize];
        a.live_end = a.live_end.saturating_add(size);
    }

    /// At the end: each aggregate's bytes at its device's last peak (`seq(d)`: device index `d`'s peak count).
    pub fn settle(&mut self, seq: impl Fn(usize) -> u64) {
        for a in &mut self.aggs {
            a.sync(seq(a.dev as usize));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::observe::peaks::DevicePeaks;

    /// Drives a device's peaks and one site on it the way the replay does: the site first, with the peak count
    /// from before the change.
    struct Both {
        peaks: DevicePeaks,
        sites: SiteAggs,
    }

    impl Both {
        fn give(&mut self, site: u32, size: u64, t: u64) {
            self.sites.give(site, size, self.peaks.seq(0));
            self.peaks.give(0, size, t);
        }
        fn take(&mut self, site: u32, size: u64) {
            self.sites.take(site, size, self.peaks.seq(0));
            self.peaks.take(0, size);
        }
    }

    #[test]
    fn bytes_at_the_peak_are_each_sites_bytes_when_the_device_last_peaked() {
        let mut b = Both {
            peaks: DevicePeaks::default(),
            sites: SiteAggs::default(),
        };
        b.peaks.add_device();
        let (x, y) = (b.sites.add(0, 1, 0), b.sites.add(0, 2, 0));
        b.give(x, 100, 1);
        b.give(y, 50, 2); // peak 150: x 100, y 50
        b.take(x, 100);
        b.give(y, 60, 3); // 110: no new peak
        b.take(y, 60);
        b.give(x, 30, 4); // 80
        b.sites.settle(|d| b.peaks.seq(d));
        assert_eq!(b.peaks.get(0).peak, 150);
        assert_eq!(
            (b.sites[x as usize].at_peak, b.sites[y as usize].at_peak),
            (100, 50)
        );
        assert_eq!(
            (b.sites[x as usize].allocations, b.sites[x as usize].bytes),
            (2, 130)
        );
        assert_eq!(
            (b.sites[y as usize].cur, b.sites[y as usize].live_count),
            (50, 1)
        );
        // A later, higher peak moves them: x 130 + y 50 + 100 more at y.
        b.give(x, 100, 5);
        b.give(y, 100, 6); // 80 + 100 + 100 = 280
        b.sites.settle(|d| b.peaks.seq(d));
        assert_eq!(b.peaks.get(0).peak, 280);
        assert_eq!(
            (b.sites[x as usize].at_peak, b.sites[y as usize].at_peak),
            (130, 150)
        );
    }

    #[test]
    fn memory_live_again_is_not_allocated_twice() {
        let mut s = SiteAggs::default();
        let x = s.add(3, 9, 1);
        s.give(x, 10, 0);
        s.take(x, 10, 0);
        s.give(x, 10, 0);
        s.uncount(x, 10);
        s.kept(x, 10);
        let a = &s[x as usize];
        assert_eq!((a.slot, a.stack, a.dev), (3, 9, 1));
        assert_eq!((a.allocations, a.bytes, a.cur, a.live_end), (1, 10, 10, 10));
    }
}

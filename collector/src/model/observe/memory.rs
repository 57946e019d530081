//! The figures drawn from every change to memory, in one place the replay's core calls: each is a concrete
//! observer (statically dispatched and inlined: these run once per event) in a file of its own, and this only
//! fans a change out to them in the order they depend on each other.

use crate::model::observe::peaks::DevicePeaks;
use crate::model::observe::process::ProcessFigures;
use crate::model::observe::recent_frees::RecentFrees;
use crate::model::observe::sites::{SiteAggs, NO_SITE};
use crate::model::observe::timeline::Timelines;

/// The replay's figures, by device index and process slot.
#[derive(Default)]
pub(crate) struct Memory {
    pub peaks: DevicePeaks,
    /// Each device's bytes in use over time.
    pub timelines: Timelines<1>,
    pub procs: ProcessFigures,
    pub sites: SiteAggs,
    pub recent_frees: RecentFrees,
}

/// One change to memory.
#[derive(Clone, Copy)]
pub(crate) struct Change {
    pub slot: usize,
    /// Device index.
    pub dev: usize,
    pub size: u64,
    /// Relative ns.
    pub t: u64,
    /// Its call-site aggregate, or `NO_SITE`.
    pub site: u32,
    /// Host memory (`cuMemCreate` with a host location): its device's figures, not its process's GPU ones.
    pub on_host: bool,
}

impl Memory {
    pub fn add_device(&mut self) {
        self.peaks.add_device();
        self.timelines.add_device();
        self.recent_frees.add_device();
    }

    pub fn add_process(&mut self) {
        self.procs.add_process();
    }

    /// Bytes allocated (or live again).
    #[inline(always)]
    pub fn give(&mut self, c: Change) {
        // The site first: it reads the device's peak count from before this allocation's own peak.
        if c.site != NO_SITE {
            self.sites.give(c.site, c.size, self.peaks.seq(c.dev));
        }
        let cur = self.peaks.give(c.dev, c.size, c.t);
        self.timelines.set(c.dev, 0, c.t, cur);
        self.procs.give(c.slot, c.dev, c.size, c.t, c.on_host);
    }

    /// Bytes released.
    #[inline(always)]
    pub fn take(&mut self, c: Change) {
        if c.site != NO_SITE {
            self.sites.take(c.site, c.size, self.peaks.seq(c.dev));
        }
        let cur = self.peaks.take(c.dev, c.size);
        self.timelines.set(c.dev, 0, c.t, cur);
        self.procs.take(c.slot, c.dev, c.size, c.on_host);
    }

    /// The last `give` was memory live again (a release the driver refused): the counts of allocations stay as
    /// they were.
    pub fn uncount(&mut self, c: Change) {
        if c.site != NO_SITE {
            self.sites.uncount(c.site, c.size);
        }
        self.peaks.uncount(c.dev);
        self.procs.uncount(c.slot, c.dev);
    }

    /// Bytes still live at their process's end.
    pub fn kept(&mut self, c: Change) {
        if c.site != NO_SITE {
            self.sites.kept(c.site, c.size);
        }
        self.peaks.kept(c.dev, c.size);
        self.procs.kept(c.slot, c.dev, c.size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(slot: usize, dev: usize, size: u64, t: u64, site: u32) -> Change {
        Change {
            slot,
            dev,
            size,
            t,
            site,
            on_host: false,
        }
    }

    #[test]
    fn every_observer_hears_a_change_and_a_refused_release_undoes_only_the_counts() {
        let mut m = Memory::default();
        m.add_device();
        m.add_process();
        let site = m.sites.add(0, 7, 0);
        m.give(at(0, 0, 100, 1_000, site));
        m.take(at(0, 0, 100, 2_000, site));
        // The driver refused the release: live again.
        m.give(at(0, 0, 100, 2_000, site));
        m.uncount(at(0, 0, 100, 2_000, site));
        m.kept(at(0, 0, 100, 3_000, site));
        let d = m.peaks.get(0);
        assert_eq!(
            (d.cur, d.peak, d.allocations, d.live_end),
            (100, 100, 1, 100)
        );
        let pd = m.procs.dev(0, 0).unwrap();
        assert_eq!((pd.cur, pd.allocations, pd.live_end), (100, 1, 100));
        assert_eq!(
            (m.sites[0].allocations, m.sites[0].cur, m.sites[0].live_end),
            (1, 100, 100)
        );
        let tl = m.timelines.at(0, 0, 3_000);
        let maxes: Vec<u64> = tl.buckets.iter().map(|b| b.max_bytes).collect();
        assert_eq!(maxes, vec![0, 100, 100, 100]);
        assert_eq!(tl.buckets[2].last_bytes, 100);
    }
}

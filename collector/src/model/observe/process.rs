//! Each process's GPU bytes in use and its peak, and per device it used: its bytes in use, peak, allocations,
//! what was live at its end, and its driver-level steps (cycles: an allocation after a free starts one), whose
//! floors tell growth without the bridge (`steps.rs`). An observer of the replay's changes, by process slot
//! and device index.

use crate::model::observe::steps::StepSeries;
use crate::names::fasthash::FastMap;

/// A process's figures on one device.
#[derive(Default, Clone)]
pub struct ProcDev {
    pub cur: u64,
    pub peak: u64,
    pub live_end: u64,
    pub allocations: u64,
    /// Its last change was a free: the next allocation starts a new cycle (the driver-level step).
    after_free: bool,
    cycles: u64,
    /// Its bytes in use at the start of each cycle.
    pub troughs: StepSeries,
}

/// One process's figures.
#[derive(Default)]
pub struct ProcFigures {
    /// GPU bytes in use (host memory is only its device's), its peak and when.
    pub cur: u64,
    pub peak: u64,
    pub peak_t: Option<u64>,
    /// Its largest allocation, host memory included.
    pub largest: u64,
    /// Per device it used, in the order it first used them; `slot` finds a device's. Sparse: a process that
    /// used the 100,000th device holds one entry, not 100,000.
    devs: Vec<(usize, ProcDev)>,
    slot: FastMap<usize, usize>,
}

impl ProcFigures {
    /// Its figures on device `d`, made on first use.
    #[inline]
    fn dev_mut(&mut self, d: usize) -> &mut ProcDev {
        // Nearly always the device of its last change.
        let i = match self.devs.last() {
            Some((last, _)) if *last == d => self.devs.len() - 1,
            _ => match self.slot.get(&d) {
                Some(&i) => i,
                None => {
                    self.devs.push((d, ProcDev::default()));
                    self.slot.insert(d, self.devs.len() - 1);
                    self.devs.len() - 1
                }
            },
        };
        &mut self.devs[i].1
    }

    /// Its figures on device `d`, if it used it.
    pub fn dev(&self, d: usize) -> Option<&ProcDev> {
        self.slot.get(&d).map(|&i| &self.devs[i].1)
    }

    /// (device index, figures) of every device it used, in the order it first used them.
    pub fn devs(&self) -> &[(usize, ProcDev)] {
        &self.devs
    }

    /// Its allocations on every device, and on none.
    pub fn allocations(&self) -> u64 {
        self.devs.iter().map(|(_, pd)| pd.allocations).sum()
    }
}

/// Every process's figures, by slot.
#[derive(Default)]
pub struct ProcessFigures {
    procs: Vec<ProcFigures>,
}

impl ProcessFigures {
    /// The next slot has figures (all zero).
    pub fn add_process(&mut self) {
        self.procs.push(ProcFigures::default());
    }

    /// `size` bytes allocated by process `s` on device `d` at `t` (`on_host`: host memory, not in its GPU figure).
    #[inline(always)]
    pub fn give(&mut self, s: usize, d: usize, size: u64, t: u64, on_host: bool) {
        let p = &mut self.procs[s];
        p.largest = p.largest.max(size);
        if !on_host {
            p.cur = p.cur.saturating_add(size);
            if p.cur > p.peak {
                p.peak = p.cur;
                p.peak_t = Some(t);
            }
        }
        let pd = p.dev_mut(d);
        if pd.after_free {
            pd.after_free = false;
            pd.cycles += 1;
            pd.troughs.observe(pd.cycles, t, pd.cur);
        }
        pd.cur = pd.cur.saturating_add(size);
        pd.allocations += 1;
        pd.peak = pd.peak.max(pd.cur);
    }

    /// `size` bytes released by process `s` on device `d`.
    #[inline(always)]
    pub fn take(&mut self, s: usize, d: usize, size: u64, on_host: bool) {
        let p = &mut self.procs[s];
        if !on_host {
            p.cur = p.cur.saturating_sub(size);
        }
        let pd = p.dev_mut(d);
        pd.cur = pd.cur.saturating_sub(size);
        pd.after_free = true;
    }

    /// The last `give` of `s` on `d` was memory live again (a release the driver refused), not a new allocation.
    pub fn uncount(&mut self, s: usize, d: usize) {
        let pd = self.procs[s].dev_mut(d);
        pd.allocations = pd.allocations.saturating_sub(1);
    }

    /// `size` bytes of `s` on `d` were live at its end.
    pub fn kept(&mut self, s: usize, d: usize, size: u64) {
        let pd = self.procs[s].dev_mut(d);
        pd.live_end = pd.live_end.saturating_add(size);
    }

    pub fn get(&self, s: usize) -> &ProcFigures {
        &self.procs[s]
    }

    /// Process `s`'s figures on device `d`, if it used it.
    pub fn dev(&self, s: usize, d: usize) -> Option<&ProcDev> {
        self.procs[s].dev(d)
    }

    /// The rule that lets processes' own cycles decide a device's growth: every one of `slots` that allocated
    /// on `d` has enough cycles to judge (observe/steps.rs). Then no growth in any of them is none; one without
    /// (a leaker that never frees, beside a steady neighbour) leaves it to the device's timeline. One rule, read
    /// at the end of the run (finish.rs) and at each error (oom_snapshot.rs).
    pub fn cycles_judge(&self, slots: impl IntoIterator<Item = usize>, d: usize) -> bool {
        slots.into_iter().all(|s| {
            self.dev(s, d)
                .is_none_or(|pd| pd.allocations == 0 || pd.troughs.judges())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_peak_is_of_gpu_memory_and_each_device_keeps_its_own() {
        let mut f = ProcessFigures::default();
        f.add_process();
        f.give(0, 3, 100, 1, false);
        f.give(0, 7, 1000, 2, true); // host memory: its device's figures, not the process's GPU peak
        f.give(0, 3, 50, 3, false);
        f.take(0, 3, 100, false);
        let p = f.get(0);
        assert_eq!((p.cur, p.peak, p.peak_t), (50, 150, Some(3)));
        let d3 = f.dev(0, 3).unwrap();
        assert_eq!((d3.cur, d3.peak, d3.allocations), (50, 150, 2));
        let d7 = f.dev(0, 7).unwrap();
        assert_eq!((d7.cur, d7.peak, d7.allocations), (1000, 1000, 1));
        assert!(f.dev(0, 4).is_none());
        // In the order first used.
        assert_eq!(
            p.devs().iter().map(|(d, _)| *d).collect::<Vec<_>>(),
            vec![3, 7]
        );
    }

    #[test]
    fn a_cycle_starts_at_an_allocation_after_a_free_and_notes_its_floor() {
        let mut f = ProcessFigures::default();
        f.add_process();
        f.add_process();
        // A floor rising 10 MiB a cycle, 12 cycles: growth in cycles.
        let mb = 1u64 << 20;
        for c in 0..12u64 {
            f.give(1, 0, 100 * mb, c * 10, false);
            f.give(1, 0, 10 * mb, c * 10 + 1, false); // kept
            f.take(1, 0, 100 * mb, false);
        }
        let pd = f.dev(1, 0).unwrap();
        // The first allocation follows no free: 11 cycles, each noted at its start.
        assert_eq!(pd.troughs.points().len(), 11);
        assert_eq!(pd.troughs.steps_seen(), 10);
        assert!(pd.troughs.judges());
        let floors: Vec<u64> = pd.troughs.points().iter().map(|p| p.floor).collect();
        assert_eq!(floors.first(), Some(&(10 * mb)));
        assert_eq!(floors.last(), Some(&(110 * mb)));
        // The other process saw nothing.
        assert!(f.get(0).devs().is_empty());
    }

    #[test]
    fn memory_live_again_is_not_a_new_allocation() {
        let mut f = ProcessFigures::default();
        f.add_process();
        f.give(0, 0, 10, 1, false);
        f.take(0, 0, 10, false);
        f.give(0, 0, 10, 2, false);
        f.uncount(0, 0);
        f.kept(0, 0, 10);
        let pd = f.dev(0, 0).unwrap();
        assert_eq!((pd.allocations, pd.live_end, pd.cur), (1, 10, 10));
    }
}

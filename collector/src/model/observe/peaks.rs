//! Each device's bytes in use, its peak and when it was reached, its allocations and largest one, and what was
//! live at the end: an observer of the replay's changes, by device index (the replay's `devs`).
//!
//! The call-site aggregates read `seq` (how many new peaks a device has reached) to know their bytes at the
//! peak without a pass over every site at each new peak (`replay/site_store.rs`).

/// One device's figures.
#[derive(Default, Clone, Debug, PartialEq, Eq)]
pub struct DevicePeak {
    /// Bytes in use now.
    pub cur: u64,
    pub peak: u64,
    /// When `peak` was first reached (relative ns).
    pub peak_t: Option<u64>,
    /// New peaks reached so far.
    pub seq: u64,
    pub allocations: u64,
    pub largest: u64,
    /// Bytes still live when their processes ended (or the trace did).
    pub live_end: u64,
}

/// Every device's figures, by device index.
#[derive(Default)]
pub struct DevicePeaks {
    devs: Vec<DevicePeak>,
}

impl DevicePeaks {
    /// The next device index has figures (all zero).
    pub fn add_device(&mut self) {
        self.devs.push(DevicePeak::default());
    }

    /// `size` bytes allocated on device `d` at `t`. Returns its bytes in use now.
    #[inline(always)]
    pub fn give(&mut self, d: usize, size: u64, t: u64) -> u64 {
        let dv = &mut self.devs[d];
        dv.cur = dv.cur.saturating_add(size);
        dv.allocations += 1;
        dv.largest = dv.largest.max(size);
        if dv.cur > dv.peak {
            dv.peak = dv.cur;
            dv.peak_t = Some(t);
            dv.seq += 1;
        }
        dv.cur
    }

    /// `size` bytes released on device `d`. Returns its bytes in use now.
    #[inline(always)]
    pub fn take(&mut self, d: usize, size: u64) -> u64 {
        let dv = &mut self.devs[d];
        dv.cur = dv.cur.saturating_sub(size);
        dv.cur
    }

    /// The last `give` on `d` was memory live again (a release the driver refused), not a new allocation.
    pub fn uncount(&mut self, d: usize) {
        let dv = &mut self.devs[d];
        dv.allocations = dv.allocations.saturating_sub(1);
    }

    /// `size` bytes on `d` were live at their process's end.
    pub fn kept(&mut self, d: usize, size: u64) {
        let dv = &mut self.devs[d];
        dv.live_end = dv.live_end.saturating_add(size);
    }

    /// Device `d`'s count of new peaks (0 before any: for the call-site aggregates).
    #[inline(always)]
    pub fn seq(&self, d: usize) -> u64 {
        self.devs[d].seq
    }

    pub fn get(&self, d: usize) -> &DevicePeak {
        &self.devs[d]
    }

    pub fn into_vec(self) -> Vec<DevicePeak> {
        self.devs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peak_is_the_most_in_use_at_once_and_its_first_moment() {
        let mut p = DevicePeaks::default();
        p.add_device();
        p.add_device();
        assert_eq!(p.give(1, 100, 10), 100);
        assert_eq!(p.give(1, 50, 20), 150);
        assert_eq!(p.take(1, 100), 50);
        // Back to 150 later: the peak keeps its first moment, and no new peak is counted.
        assert_eq!(p.give(1, 100, 30), 150);
        let d = p.get(1);
        assert_eq!(
            (d.peak, d.peak_t, d.seq, d.allocations, d.largest),
            (150, Some(20), 2, 3, 100)
        );
        // The other device saw nothing.
        assert_eq!(p.get(0), &DevicePeak::default());
    }

    #[test]
    fn memory_live_again_is_not_a_new_allocation_and_nothing_underflows() {
        let mut p = DevicePeaks::default();
        p.add_device();
        p.give(0, 10, 1);
        p.take(0, 10);
        p.give(0, 10, 2);
        p.uncount(0);
        assert_eq!(p.get(0).allocations, 1);
        assert_eq!(p.take(0, 1 << 40), 0);
        p.uncount(0);
        p.uncount(0);
        assert_eq!(p.get(0).allocations, 0);
        p.kept(0, u64::MAX);
        p.kept(0, 5);
        assert_eq!(p.get(0).live_end, u64::MAX);
    }
}

//! Bytes each device freed with `cuMemFreeAsync` lately: 100 ms steps in a ring over the last second, so an
//! out-of-memory snapshot can tell memory a stream-ordered pool still holds (docs/OOM.md's
//! `pool_cached_async_frees`). An observer of the replay's frees, by device index.

use crate::model::analysis::{ASYNC_STEPS, ASYNC_STEP_NS};

/// Every device's ring, by device index.
#[derive(Default)]
pub struct RecentFrees {
    devs: Vec<[(u64, u64); ASYNC_STEPS]>,
}

impl RecentFrees {
    /// The next device index has a ring (empty).
    pub fn add_device(&mut self) {
        self.devs.push([(u64::MAX, 0); ASYNC_STEPS]);
    }

    /// `size` bytes freed asynchronously on device `d` at `t` (relative ns).
    pub fn freed(&mut self, d: usize, t: u64, size: u64) {
        let step = t / ASYNC_STEP_NS;
        let slot = &mut self.devs[d][(step % ASYNC_STEPS as u64) as usize];
        if slot.0 != step {
            *slot = (step, 0);
        }
        slot.1 = slot.1.saturating_add(size);
    }

    /// Bytes freed asynchronously on `d` in the last second before `t`.
    pub fn recent(&self, d: usize, t: u64) -> u64 {
        let now = t / ASYNC_STEP_NS;
        self.devs[d]
            .iter()
            .filter(|(step, _)| *step <= now && now - *step < ASYNC_STEPS as u64)
            .fold(0u64, |a, (_, b)| a.saturating_add(*b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_last_second_counts_and_an_old_step_is_overwritten() {
        let mut r = RecentFrees::default();
        r.add_device();
        r.add_device();
        let second = ASYNC_STEP_NS * ASYNC_STEPS as u64;
        r.freed(1, 0, 100);
        r.freed(1, ASYNC_STEP_NS, 10);
        assert_eq!(r.recent(1, ASYNC_STEP_NS), 110);
        // A second later the first step is out of the window, then its slot is reused.
        assert_eq!(r.recent(1, second), 10);
        r.freed(1, second, 1);
        assert_eq!(r.recent(1, second), 11);
        // Asked at 0: the first step's slot now holds a later step, and step 1 is still to come.
        assert_eq!(r.recent(1, 0), 0);
        // The other device never freed.
        assert_eq!(r.recent(0, second), 0);
    }
}

//! How much where the driver put the segments moves PyTorch's reserve, measured on the runs themselves.
//!
//! Among free blocks of one size the caching allocator takes the lowest address, and the addresses are the
//! driver's choice: a history replayed with another run's segment addresses can reserve a few percent more or
//! less than it did (on the GPU: up to 4% on a conv net under cuDNN's defaults, 3.6% on BERT, none on some
//! programs). A history synthesized at another value can only borrow a run's addresses, so its reserve as run
//! carries that much uncertainty, whatever its sizes. Each run that finished is replayed under its own settings
//! with every other finished run's addresses; the spread is the most it moved, either way.

use super::answer::KnobJob;
use crate::whatif::answer::parallel;
use crate::whatif::history::History;
use crate::whatif::sim::Job;

/// Each run replayed with another's segment addresses against its own replay: the most its reserve moved down
/// and up (fractions of its own, `low <= 0 <= high`), over every pair and process.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub low: f64,
    pub high: f64,
    /// Replays compared.
    pub pairs: u32,
}

impl Spread {
    /// It moved by more than a tenth of a percent either way.
    pub fn matters(&self) -> bool {
        self.low < -0.001 || self.high > 0.001
    }
}

/// `None` with fewer than two runs that finished or none that recorded where its segments were.
pub fn spread(job: &KnobJob) -> Option<Spread> {
    let a = &job.aligned;
    let done: Vec<usize> = (0..a.runs.len()).filter(|&r| Some(r) != a.failed).collect();
    let slots = a.slots.len();
    // (slot, run replayed, run whose addresses it takes); `None` for its own.
    let mut pairs: Vec<(usize, usize, Option<usize>)> = Vec::new();
    for i in 0..slots {
        for &r in &done {
            if a.runs[r].histories[i].segment_addresses.is_empty() {
                continue;
            }
            pairs.push((i, r, None));
            for &o in done.iter().filter(|&&o| o != r) {
                if !a.runs[o].histories[i].segment_addresses.is_empty() {
                    pairs.push((i, r, Some(o)));
                }
            }
        }
    }
    if !pairs.iter().any(|p| p.2.is_some()) {
        return None;
    }
    let peaks = parallel(pairs.len(), |k| {
        let (i, r, o) = pairs[k];
        let own = &a.runs[r].histories[i];
        let borrowed;
        let h: &History = match o {
            None => own,
            Some(o) => {
                let mut c = own.clone();
                c.segment_addresses = a.runs[o].histories[i].segment_addresses.clone();
                borrowed = c;
                &borrowed
            }
        };
        let job = Job::new(
            std::slice::from_ref(h),
            vec![0],
            job.device_total.clone(),
            Default::default(),
        );
        let settings = |_| h.recorded.clone();
        job.replay_until(&settings, &Default::default(), None)
            .outcomes
            .first()
            .map_or(0, |o| o.reserved_peak)
    });
    let mut s = Spread {
        low: 0.0,
        high: 0.0,
        pairs: 0,
    };
    for (k, &(i, r, o)) in pairs.iter().enumerate() {
        if o.is_none() {
            continue;
        }
        let own = pairs
            .iter()
            .position(|&p| p == (i, r, None))
            .map_or(0, |j| peaks[j]);
        if own == 0 {
            continue;
        }
        let d = (peaks[k] as f64 - own as f64) / own as f64;
        s.low = s.low.min(d);
        s.high = s.high.max(d);
        s.pairs += 1;
    }
    (s.pairs > 0).then_some(s)
}

//! How much where the driver put the segments moves PyTorch's reserve, measured on the runs themselves.
//!
//! Among free blocks of one size the caching allocator takes the lowest address, and the addresses are the
//! driver's choice: a history replayed with another run's segment addresses can reserve a few percent more or
//! less than it did (on the H200, every size and order the run's own: 4.2% less for a conv net in bf16, 3.6% less
//! for BERT, 11.4% more for a deterministic conv net; nothing for some programs). A history synthesized at
//! another value can only borrow a run's addresses, so its reserve as run carries that much uncertainty,
//! whatever its sizes. Each run that finished is replayed as the answers replay a job (every process at once,
//! with what is held outside PyTorch), under its own settings, with its own addresses and with each other
//! finished run's; the spread is how far the processes' reserves, summed, moved either way.

use std::collections::BTreeMap;

use super::answer::KnobJob;
use crate::whatif::answer::parallel;
use crate::whatif::sim::Job;

/// Each run replayed with another's segment addresses against its replay with its own: the most its reserve
/// moved down and up (fractions of its own, `low <= 0 <= high`), over every pair of runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub low: f64,
    pub high: f64,
    /// Replays with borrowed addresses compared.
    pub pairs: u32,
}

impl Spread {
    /// It moved by more than a tenth of a percent either way.
    pub fn matters(&self) -> bool {
        self.low < -0.001 || self.high > 0.001
    }
}

/// `None` with fewer than two runs that finished, or fewer than two that recorded where their segments were
/// (runs under expandable segments map address ranges; they do not allocate segments).
pub fn spread(job: &KnobJob) -> Option<Spread> {
    let a = &job.aligned;
    let placed: Vec<usize> = (0..a.runs.len())
        .filter(|&r| Some(r) != a.failed)
        .filter(|&r| {
            a.runs[r]
                .histories
                .iter()
                .any(|h| !h.segment_addresses.is_empty())
        })
        .collect();
    if placed.len() < 2 {
        return None;
    }
    // (the run replayed, the run whose addresses it takes: itself first)
    let pairs: Vec<(usize, usize)> = placed
        .iter()
        .flat_map(|&r| {
            std::iter::once((r, r)).chain(
                placed
                    .iter()
                    .filter(move |&&o| o != r)
                    .map(move |&o| (r, o)),
            )
        })
        .collect();
    let reserves = parallel(pairs.len(), |k| {
        let (r, o) = pairs[k];
        let hs = &a.runs[r].histories;
        let mut j = Job::new(
            hs,
            job.outside.clone(),
            job.device_total.clone(),
            job.others.clone(),
        );
        if o != r {
            j = j.with_addresses(
                a.runs[o]
                    .histories
                    .iter()
                    .map(|h| &h.segment_addresses[..])
                    .collect(),
            );
        }
        j.replay(&|i| hs[i].recorded.clone(), &BTreeMap::new())
            .outcomes
            .iter()
            .map(|x| x.reserved_peak)
            .fold(0u64, u64::saturating_add)
    });
    let mut s = Spread {
        low: 0.0,
        high: 0.0,
        pairs: 0,
    };
    for (k, &(r, o)) in pairs.iter().enumerate() {
        let own = pairs
            .iter()
            .position(|&p| p == (r, r))
            .map_or(0, |i| reserves[i]);
        if o == r || own == 0 {
            continue;
        }
        let d = (reserves[k] as f64 - own as f64) / own as f64;
        s.low = s.low.min(d);
        s.high = s.high.max(d);
        s.pairs += 1;
    }
    (s.pairs > 0).then_some(s)
}

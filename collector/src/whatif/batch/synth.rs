//! A history at another value of the knob: the run that finished nearest that value (the larger on a tie: its
//! steps are the closer in what they hold), its requests' sizes replaced by what
//! their fits give there (its frees, streams, times and flushes kept as they were).

use super::align::Aligned;
use super::fit::eval;
use crate::whatif::history::{History, Op, MAX_SIZE};

/// Which fit to follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// Each request's fit.
    Fitted,
    /// Where a fit is ambiguous, its alternative (the other end of the bound).
    Alternative,
}

/// The synthesized histories, one per process, and how many requests' fits fell below zero there (clamped).
pub struct Synthesized {
    pub histories: Vec<History>,
    pub clamped: u64,
    /// The run whose history is the template.
    pub template: usize,
}

pub fn at(a: &Aligned, value: u64, which: Which) -> Synthesized {
    let t = a.nearest(value);
    let runs = a.values.len();
    let mut clamped = 0u64;
    let histories = a
        .slots
        .iter()
        .enumerate()
        .map(|(i, slot)| {
            let mut h = a.runs[t].histories[i].clone();
            for (k, (&e, f)) in slot.at[t].iter().zip(&slot.fits).enumerate() {
                let shape = match which {
                    Which::Alternative => f.alternative.unwrap_or(f.shape),
                    Which::Fitted => f.shape,
                };
                let s = eval(
                    shape,
                    &a.values,
                    &slot.sizes[k * runs..(k + 1) * runs],
                    value,
                );
                if s < 0 {
                    clamped += 1;
                }
                if let Op::Alloc { size, .. } = &mut h.entries[e as usize].op {
                    *size = s.clamp(0, MAX_SIZE as i128) as u64;
                }
            }
            h
        })
        .collect();
    Synthesized {
        histories,
        clamped,
        template: t,
    }
}

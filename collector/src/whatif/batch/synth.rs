//! A history at another value of the knob: the run that finished nearest that value (the larger on a tie: its
//! steps are the closer in what they hold), its requests' sizes replaced by what
//! their fits give there (its frees, streams, times and flushes kept as they were).
//!
//! Where the runs' code paths differ by a few requests (kernels chosen by size, [`super::paths`]), the template's
//! own requests follow its path, sized `s·max(x, x_t)/x_t` from its own size `s` at its value `x_t` (an upper bound
//! for a size that grows at most in proportion). Which path the program takes at a value between the runs is
//! unknown, so the alternative adds the other side's own requests too, each held from where it was asked to
//! just before the next request every run made after its free: a history that asks for both paths' memory.

use std::collections::HashMap;

use super::align::Aligned;
use super::fit::{eval, in_proportion};
use crate::whatif::history::{Entry, History, Op, MAX_SIZE, NO_SITE};

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
    let other = (which == Which::Alternative)
        .then(|| a.other(value, t))
        .flatten();
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
            for &e in &slot.own[t] {
                if let Op::Alloc { size, .. } = &mut h.entries[e as usize].op {
                    *size = in_proportion(*size, a.values[t], value);
                }
            }
            // Two runs on one path (of three, the two past a kernel's switch) both hold its requests as their own:
            // the other's are added only where its path is another.
            let another = |o: usize| {
                let lines = |r: usize| {
                    let h = &a.runs[r].histories[i];
                    let mut v: Vec<&str> = slot.own[r]
                        .iter()
                        .map(|&e| h.site(h.entries[e as usize].site).unwrap_or(""))
                        .collect();
                    v.sort_unstable();
                    v
                };
                !slot.own[o].is_empty() && lines(o) != lines(t)
            };
            if let Some(o) = other.filter(|&o| another(o)) {
                let from = &a.runs[o].histories[i];
                insert(
                    &mut h,
                    (&slot.at[t], &slot.at[o]),
                    from,
                    &slot.own[o],
                    (a.values[o], value),
                );
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

/// Adds to `h` (the template, whose requests every run made are at `at_t`) the requests `own` of history `from`
/// (whose common requests are at `at_o`), sized from their value at `x` (`(x_o, x)`): each asked just after the
/// common request before it, and freed just before the common request after its free (so held at least as long
/// as it was), with ids and lines of the template's.
fn insert(
    h: &mut History,
    (at_t, at_o): (&[u32], &[u32]),
    from: &History,
    own: &[u32],
    (xo, x): (u64, u64),
) {
    let frees: HashMap<u64, usize> = from
        .entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e.op {
            Op::Free { id } => Some((id, i)),
            _ => None,
        })
        .collect();
    let mut next_id = h
        .entries
        .iter()
        .filter_map(|e| match e.op {
            Op::Alloc { id, .. } | Op::Free { id } => Some(id),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let mut sites: HashMap<u32, u32> = HashMap::new();
    // (the template's entry it goes before, its order in `from`, the entry)
    let mut adds: Vec<(usize, usize, Entry)> = Vec::new();
    let end = h.entries.len();
    let before = |c: usize, after_previous: bool| -> usize {
        if after_previous {
            // Just after common request c - 1.
            c.checked_sub(1)
                .and_then(|p| at_t.get(p))
                .map_or(0, |&e| e as usize + 1)
        } else {
            at_t.get(c).map_or(end, |&e| e as usize)
        }
    };
    for &e in own {
        let entry = from.entries[e as usize];
        let Op::Alloc { id, size, stream } = entry.op else {
            continue;
        };
        next_id += 1;
        let site = if entry.site == NO_SITE {
            NO_SITE
        } else {
            *sites.entry(entry.site).or_insert_with(|| {
                h.sites
                    .push(from.site(entry.site).unwrap_or("?").to_string());
                h.sites.len() as u32 - 1
            })
        };
        let c = at_o.partition_point(|&i| i < e);
        let pos = before(c, true);
        let t_us = h
            .entries
            .get(pos.min(end.saturating_sub(1)))
            .map_or(entry.t_us, |x| x.t_us);
        let op = Op::Alloc {
            id: next_id,
            size: in_proportion(size, xo, x),
            stream,
        };
        adds.push((pos, e as usize, Entry { t_us, op, site }));
        if let Some(&f) = frees.get(&id).filter(|&&f| f > e as usize) {
            let cf = at_o.partition_point(|&i| (i as usize) < f);
            let fpos = if cf == c {
                pos
            } else {
                before(cf, false).max(pos)
            };
            let op = Op::Free { id: next_id };
            adds.push((fpos, f, Entry { t_us, op, site }));
        }
    }
    adds.sort_by_key(|&(pos, order, _)| (pos, order));
    let mut out = Vec::with_capacity(end + adds.len());
    let mut add = adds.into_iter().peekable();
    for (i, e) in h.entries.iter().enumerate() {
        while let Some((_, _, x)) = add.next_if(|a| a.0 <= i) {
            out.push(x);
        }
        out.push(*e);
    }
    out.extend(add.map(|a| a.2));
    h.entries = out;
}

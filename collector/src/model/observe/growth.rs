//! Growth: bytes in use whose floor rises step after step up to a moment (an out-of-memory error, or the end
//! of the run), told apart from memory made once and then kept (warm-up, weights, an optimizer's state) and from
//! a steady loop. One rule for the driver's timeline and for a framework's allocated bytes, whatever the length
//! of a step against the timeline's buckets (docs/OOM.md, "Growth").
//!
//! The floor at a moment is the least value from then to the end (a suffix minimum): it never falls, it steps
//! up when something made before that moment stays, and a step's own rise and fall (activations, a workspace)
//! do not move it. The span from the first bucket in use to the last rise (what follows the last rise is
//! teardown or an error's unwinding, never the rise itself) is cut into [`GROWTH_WINDOWS`] windows; a window
//! rises when the floor at its end (the last window: its least value) is above the one before by at least 1 MiB and 0.5% of the top. Growth is a
//! cluster of at least [`GROWTH_MIN_RISING`] rising windows, none more than [`GROWTH_MAX_GAP`] apart (slow steps
//! rise every few windows), spread over at least [`GROWTH_MIN_SPREAD`] windows (a burst of allocations, as at
//! warm-up, is not) and reaching into the last [`GROWTH_TAIL`] (it was still rising at the end), that added at
//! least [`GROWTH_MIN_BYTES`] and [`GROWTH_MIN_SHARE_PCT`] % of the top. Steps free something: the rise must hold
//! at least [`GROWTH_MIN_RISING`] falls of 1 MiB or more (a rise with none is one long allocation: weights
//! loading, a batch too large). In a timeline whose steps show as
//! cycles, the rise must also span at least [`GROWTH_MIN_RISING`] of them and most of them must each leave more
//! behind than the one before: growth is across steps, not across time.

use std::collections::HashMap;

use vramtrace_format::Api;

use crate::callsites::SITES_LISTED;
use crate::model::analysis::{LeakGroup, LeakSite, LeakTrend, Minimum};
use crate::model::observe::leak::minima;
use crate::model::observe::sites::NO_SITE;
use crate::model::observe::timeline::{Bucket, Timeline};

/// Windows the span is cut into.
pub const GROWTH_WINDOWS: usize = 16;
/// Rising windows a growth needs.
pub const GROWTH_MIN_RISING: usize = 4;
/// Windows from the first rising window of a growth to its last, at least.
pub const GROWTH_MIN_SPREAD: usize = 5;
/// The most windows between two rising windows of one growth.
pub const GROWTH_MAX_GAP: usize = 3;
/// A growth's last rising window is one of the last this many.
pub const GROWTH_TAIL: usize = 3;
/// A cluster whose last rise is its largest and this many times the typical rise of its first half is the work
/// growing (a batch that doubles each step), not memory kept: kept tensors add about the same each step.
pub const GEOMETRIC_FACTOR: u64 = 4;
/// A growth adds at least this many bytes ...
pub const GROWTH_MIN_BYTES: u64 = 4 << 20;
/// ... and at least this share of the top (percent).
pub const GROWTH_MIN_SHARE_PCT: u64 = 3;

/// A device's growth, by one rule at an error and at the end: growth in a process's own cycles first (time-free:
/// a leak of a few steps in a second counts); where the cycles of every process that allocated there are enough
/// to judge (`judged`), none in them is none; else the device's timeline in wall-clock windows (`timeline`).
pub fn judged(
    cycles: Option<LeakTrend>,
    judged: bool,
    timeline: impl FnOnce() -> Option<LeakTrend>,
) -> Option<LeakTrend> {
    match cycles {
        Some(g) => Some(g),
        None if judged => None,
        None => timeline(),
    }
}

/// The growth of `tl` up to `end` (ns from the trace start; the timeline's end when later), or `None`.
/// `minima` holds the floor at the end of each window from the one before the growth's first rise; `steps`
/// the repeating steps counted in it, when they can be told (cycles of the timeline, else the floor's own
/// separate rises). `groups` and `sites` are left empty: whoever holds the live set fills them.
pub fn growth(tl: &Timeline, end: u64) -> Option<LeakTrend> {
    growth_of(tl, end, true)
}

/// [`growth`] of a sampled series (a framework's allocated bytes, read every 20 ms): a step's short-lived
/// temporaries fall between two samples, so the rise need not show falls. Known limit: a single step that
/// allocates for seconds without freeing can then read as growth.
pub fn growth_sampled(tl: &Timeline, end: u64) -> Option<LeakTrend> {
    growth_of(tl, end, false)
}

/// [`growth`] and [`growth_sampled`]: `exact`, the rise must show the falls of steps. Each test of the rule is
/// a function below, in the order they are made.
fn growth_of(tl: &Timeline, end: u64, exact: bool) -> Option<LeakTrend> {
    let w = tl.bucket_ns;
    if w == 0 {
        return None;
    }
    let upto = ((end / w) as usize).saturating_add(1).min(tl.buckets.len());
    let (b, floor) = floor_span(&tl.buckets[..upto])?;
    // The windows cover the span from where the floor leaves its first level: a long flat lead-in (a model
    // loading, data being read) before the steps would squeeze their growth into a few windows.
    let step = (floor[floor.len() - 1] / 200).max(1 << 20);
    let lead = floor
        .iter()
        .rposition(|&f| f < floor[0].saturating_add(step))
        .unwrap_or(0);
    let (b, floor) = (&b[lead..], &floor[lead..]);
    let n = b.len();
    if n < GROWTH_WINDOWS {
        return None;
    }
    let end_of = |i: usize| b[i].t_ns.saturating_add(w).min(end.max(b[i].t_ns));
    let win = window_floors(floor, end_of);
    let (first_rise, rise) = rising_cluster(&win, step)?;
    let begin = win[first_rise - 1].0;
    // Steps free something: a rise with no fall in it (weights loading, a first step's activations made one
    // after another, a batch too large) is one long allocation, not memory kept step after step. Without at
    // least GROWTH_MIN_RISING falls of 1 MiB or more in the rise, nothing says there were steps.
    if exact && falls(b, begin) < GROWTH_MIN_RISING {
        return None;
    }
    let points: Vec<Minimum> = win[first_rise - 1..].iter().map(|(_, m)| *m).collect();
    let (from_t, to_t) = (points[0].t_ns, end_of(n - 1));
    if !across_steps(tl, points[1].t_ns, to_t, step) {
        return None;
    }
    Some(LeakTrend {
        steps: steps_in(tl, &floor[begin..], from_t, to_t, step),
        minima: points,
        rise_bytes: rise,
        unit: crate::model::analysis::GrowthUnit::Time,
        pid: None,
        groups: Vec::new(),
        more_groups: 0,
        sites: Vec::new(),
        more_sites: 0,
    })
}

/// The buckets from the first in use to the last rise (what follows the last rise is teardown or an error's
/// unwinding), and the floor at each: the least value from each bucket's end on; the last bucket counts at its
/// top. `None` when no bucket is in use.
fn floor_span(all: &[Bucket]) -> Option<(&[Bucket], Vec<u64>)> {
    let start = all.iter().position(|b| b.max_bytes > 0)?;
    let last = (start + 1..all.len())
        .rev()
        .find(|&i| all[i].max_bytes > all[i - 1].last_bytes)
        .unwrap_or(start);
    let b = &all[start..=last];
    let mut floor = vec![0u64; b.len()];
    let mut m = b[b.len() - 1].max_bytes;
    floor[b.len() - 1] = m;
    for i in (0..b.len() - 1).rev() {
        m = m.min(b[i].last_bytes);
        floor[i] = m;
    }
    Some((b, floor))
}

/// Each of the [`GROWTH_WINDOWS`] windows' floor at its end (the bucket's index, and the floor at the window's
/// end time, `end_of`); the last window's over the whole window (its least value): its end is the moment itself
/// (an error, with the step's own transient bytes live), not a floor.
fn window_floors(floor: &[u64], end_of: impl Fn(usize) -> u64) -> Vec<(usize, Minimum)> {
    let n = floor.len();
    (0..GROWTH_WINDOWS)
        .map(|k| {
            let i = if k + 1 == GROWTH_WINDOWS {
                k * n / GROWTH_WINDOWS
            } else {
                (k + 1) * n / GROWTH_WINDOWS - 1
            };
            (
                i,
                Minimum {
                    t_ns: end_of(i),
                    bytes: floor[i],
                },
            )
        })
        .collect()
}

/// The cluster of rising windows that ends with the last one, when it is a growth: enough rising windows,
/// spread wide enough, reaching into the tail, adding enough, and not the work growing. Its first rising window
/// and the bytes it added.
fn rising_cluster(win: &[(usize, Minimum)], step: u64) -> Option<(usize, u64)> {
    let top = win[GROWTH_WINDOWS - 1].1.bytes;
    let rising: Vec<usize> = (1..GROWTH_WINDOWS)
        .filter(|&k| win[k].1.bytes >= win[k - 1].1.bytes.saturating_add(step))
        .collect();
    let &last_rise = rising.last()?;
    if last_rise + GROWTH_TAIL < GROWTH_WINDOWS {
        return None;
    }
    let mut first = rising.len() - 1;
    while first > 0 && rising[first] - rising[first - 1] <= GROWTH_MAX_GAP {
        first -= 1;
    }
    let cluster = &rising[first..];
    let first_rise = cluster[0];
    if cluster.len() < GROWTH_MIN_RISING || last_rise - first_rise < GROWTH_MIN_SPREAD {
        return None;
    }
    let from = win[first_rise - 1].1.bytes;
    let rise = top - from;
    if rise < GROWTH_MIN_BYTES
        || (rise as u128) * 100 < (top as u128) * GROWTH_MIN_SHARE_PCT as u128
    {
        return None;
    }
    // A rise that doubles from step to step is the work growing (a batch or a sequence that doubles until it
    // does not fit), not memory kept across steps: kept tensors add about the same each step. A last rise that
    // is the largest and `GEOMETRIC_FACTOR` times the first half's typical one says so.
    let incs: Vec<u64> = cluster
        .iter()
        .map(|&k| win[k].1.bytes - win[k - 1].1.bytes)
        .collect();
    if last_dwarfs(&incs) {
        return None;
    }
    Some((first_rise, rise))
}

/// The buckets from `begin` on in which, or since the one before, at least 1 MiB was freed.
fn falls(b: &[Bucket], begin: usize) -> usize {
    (begin.max(1)..b.len())
        .filter(|&i| {
            let fell_inside = b[i].max_bytes.saturating_sub(b[i].last_bytes) >= 1 << 20;
            let fell_since = b[i - 1].last_bytes.saturating_sub(b[i].last_bytes) >= 1 << 20;
            fell_inside || fell_since
        })
        .count()
}

/// A timeline with cycles (steps whose rise and fall it resolves) grows across steps, not within one: the
/// ramp of a long last step (activations made layer by layer) is no growth. Whether the rise from
/// `first_rise_t` to `to_t` spans enough cycles, most leaving more behind than the one before (true where the
/// timeline shows too few cycles to tell).
fn across_steps(tl: &Timeline, first_rise_t: u64, to_t: u64, step: u64) -> bool {
    let cycles = minima(tl);
    let within: Vec<&Minimum> = cycles
        .iter()
        .filter(|m| m.t_ns > first_rise_t && m.t_ns <= to_t)
        .collect();
    if cycles.len() >= GROWTH_MIN_RISING {
        if within.len() + 1 < GROWTH_MIN_RISING {
            return false;
        }
        // Time is not steps: a first step slowed down (a cold start, a loaded machine) spreads its warm-up
        // over the windows while the steps after it are quick. Where the steps show, most of them must leave
        // more behind than the one before.
        let rises = within
            .windows(2)
            .filter(|p| p[1].bytes >= p[0].bytes.saturating_add(step))
            .count();
        if rises + 1 < GROWTH_MIN_RISING || rises * 2 < within.len() - 1 {
            return false;
        }
    }
    true
}

/// Rises `incs` (oldest first) whose last is the largest and [`GEOMETRIC_FACTOR`] times the typical one of the
/// first half: the work growing (a batch that doubles), not memory kept.
pub(crate) fn last_dwarfs(incs: &[u64]) -> bool {
    let Some(&last) = incs.last() else {
        return false;
    };
    let mut early: Vec<u64> = incs[..incs.len() / 2].to_vec();
    early.sort_unstable();
    early
        .get(early.len().saturating_sub(1) / 2)
        .is_some_and(|&typical| {
            last == *incs.iter().max().unwrap_or(&0)
                && last >= typical.saturating_mul(GEOMETRIC_FACTOR)
        })
}

/// The repeating steps of a growth between `from` and `to`: the timeline's cycles there (its low points
/// between peaks), else the separate rises of the floor, when there are enough of either to count and the
/// buckets resolve them (rises in neighbouring buckets may be several steps each: then `None`).
fn steps_in(tl: &Timeline, floor: &[u64], from: u64, to: u64, step: u64) -> Option<u64> {
    let cycles = minima(tl)
        .iter()
        .filter(|m| m.t_ns > from && m.t_ns <= to)
        .count() as u64;
    if cycles >= GROWTH_MIN_RISING as u64 {
        return Some(cycles);
    }
    let rises: Vec<usize> = (1..floor.len())
        .filter(|&i| floor[i] >= floor[i - 1].saturating_add(step / 2))
        .collect();
    let resolved = rises.windows(2).all(|p| p[1] - p[0] > 1);
    (rises.len() >= GROWTH_MIN_RISING && resolved).then_some(rises.len() as u64)
}

/// Fills `l`'s groups and sites from allocations (api, bytes, call-site aggregate or [`NO_SITE`], time made)
/// still live at its end: those made during the rise (after its first floor point, up to its last: not the
/// transient bytes of the step in progress) are what grew. Sites stay aggregate indices until the
/// replay's `finish` turns them into sites.
pub(in crate::model) fn fill_what_grew(
    l: &mut LeakTrend,
    live: impl Iterator<Item = (Api, u64, u32, u64)>,
) {
    let (from, to) = (l.minima[0].t_ns, l.minima[l.minima.len() - 1].t_ns);
    let mut groups: HashMap<(Api, u64), u64> = HashMap::new();
    let mut sites: HashMap<u32, (u64, u64)> = HashMap::new();
    for (api, size, site, ts) in live {
        if ts <= from || ts > to {
            continue;
        }
        *groups.entry((api, size)).or_default() += 1;
        if site != NO_SITE {
            let g = sites.entry(site).or_default();
            g.0 += 1;
            g.1 = g.1.saturating_add(size);
        }
    }
    let mut g: Vec<LeakGroup> = groups
        .into_iter()
        .map(|((api, size), count)| LeakGroup {
            api,
            bytes_each: size,
            count,
            bytes: size.saturating_mul(count),
        })
        .collect();
    g.sort_unstable_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.count.cmp(&a.count))
            .then(a.api.cmp(&b.api))
            .then(a.bytes_each.cmp(&b.bytes_each))
    });
    l.more_groups = g.len().saturating_sub(10) as u64;
    g.truncate(10);
    l.groups = g;
    let mut g: Vec<LeakSite> = sites
        .into_iter()
        .map(|(site, (count, bytes))| LeakSite {
            site: site as usize,
            count,
            bytes,
            label: String::new(),
        })
        .collect();
    g.sort_unstable_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.cmp(&b.site)));
    l.more_sites = g.len().saturating_sub(SITES_LISTED) as u64;
    g.truncate(SITES_LISTED);
    l.sites = g;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::observe::timeline::TimelineBuilder;

    const MIB: u64 = 1 << 20;
    const MS: u64 = 1_000_000;

    fn timeline(points: impl IntoIterator<Item = (u64, u64)>, end: u64) -> Timeline {
        let mut b = TimelineBuilder::default();
        for (t, v) in points {
            b.set(t, v);
        }
        b.finish(end)
    }

    /// `n` steps of `len` ns: each holds `base + kept * i`, rises by a 100 MiB swing for 40% of the step,
    /// falls back. `tail`: the process then frees everything.
    fn training(n: u64, len: u64, base: u64, kept: u64, tail: bool) -> (Timeline, u64) {
        let mut pts = Vec::new();
        for i in 0..n {
            let floor = base + kept * i;
            pts.push((i * len, floor));
            pts.push((i * len + len / 10, floor + 100 * MIB));
            pts.push((i * len + len / 2, floor + kept));
        }
        let end = n * len;
        if tail {
            pts.push((end, 0));
        }
        (timeline(pts, end + len), end)
    }

    #[test]
    fn kept_outputs_are_growth_whatever_the_step_length() {
        for len in [20_000, 5 * MS, 2_000 * MS, 120_000 * MS] {
            for n in [12, 30, 400] {
                let (tl, end) = training(n, len, 2 << 30, 64 * MIB, false);
                let g =
                    growth(&tl, end).unwrap_or_else(|| panic!("step {len} ns x {n}: no growth"));
                // Nearly all of what was kept, from the first window on (the weights came first).
                let kept = 64 * MIB * (n - 1);
                assert!(
                    g.rise_bytes * 10 >= kept * 7,
                    "{len} x {n}: {} of {kept}",
                    g.rise_bytes
                );
                assert!(
                    g.rise_bytes <= kept + 64 * MIB,
                    "{len} x {n}: {}",
                    g.rise_bytes
                );
                if let Some(s) = g.steps {
                    let per = g.rise_bytes / s;
                    assert!(
                        (32 * MIB..=200 * MIB).contains(&per),
                        "{len} x {n}: {per} per step"
                    );
                }
            }
        }
    }

    #[test]
    fn a_batch_that_doubles_each_step_is_the_work_growing_not_growth() {
        // What cap_oom_case.py's `batch` does: a batch kept across a step doubles every step (and so does the
        // step's length) until it does not fit. The floor rises step after step, each rise twice the last.
        for (exact, sampled) in [(true, false), (false, true)] {
            let mut pts = Vec::new();
            let (mut t, mut batch) = (0u64, 4 * MIB);
            let weights = 170 * MIB;
            for _ in 0..10 {
                let len = 20 * MS * (batch / (4 * MIB));
                pts.push((t, weights + batch));
                pts.push((t + len / 10, weights + batch + 3 * batch));
                pts.push((t + len / 2, weights + batch));
                t += len;
                batch *= 2;
            }
            let tl = timeline(pts, t + 10 * MS);
            let g = if exact {
                growth(&tl, t)
            } else {
                growth_sampled(&tl, t)
            };
            assert!(g.is_none(), "exact {exact} sampled {sampled}: {g:?}");
        }
        // Kept tensors of one size each step stay growth, whatever the step's length.
        let (tl, end) = training(12, 300 * MS, 170 * MIB, 60 * MIB, false);
        assert!(growth_sampled(&tl, end).is_some());
    }

    #[test]
    fn growth_then_teardown_is_read_up_to_the_last_rise() {
        let (tl, end) = training(40, 50 * MS, 1 << 30, 32 * MIB, true);
        let g = growth(&tl, end + 50 * MS).expect("growth before the exit");
        assert!(g.rise_bytes >= 30 * 32 * MIB, "{}", g.rise_bytes);
        assert_eq!(
            g.steps,
            Some(g.steps.unwrap_or(0)).filter(|s| (30..=41).contains(s))
        );
    }

    #[test]
    fn steady_loops_warm_up_and_one_off_state_are_not_growth() {
        for len in [20_000, 5 * MS, 120_000 * MS] {
            // Nothing kept.
            let (tl, end) = training(50, len, 2 << 30, 0, false);
            assert_eq!(growth(&tl, end), None, "steady, step {len}");
            // Weights loaded over the first tenth, one piece at a time, then steady.
            let mut pts: Vec<(u64, u64)> = (0..100).map(|i| (i * len / 20, i * 40 * MIB)).collect();
            for i in 0..45 {
                let t = 5 * len + i * len;
                pts.push((t, 4 << 30));
                pts.push((t + len / 3, (4 << 30) + 500 * MIB));
            }
            let tl = timeline(pts, 50 * len);
            assert_eq!(growth(&tl, 50 * len), None, "warm-up, step {len}");
            // An optimizer's state made at the first step, then steady.
            let mut pts = Vec::new();
            for i in 0..50 {
                let floor = if i == 0 { 1 << 30 } else { 3 << 30 };
                pts.push((i * len, floor));
                pts.push((i * len + len / 4, floor + 300 * MIB));
            }
            assert_eq!(
                growth(&timeline(pts, 50 * len), 50 * len),
                None,
                "state, step {len}"
            );
        }
    }

    #[test]
    fn growth_that_stopped_long_before_the_end_is_not_growth_now() {
        // Rises for the first third (a cache filling to its size), then flat for the rest.
        let mut pts = Vec::new();
        for i in 0..90u64 {
            let floor = (1 << 30) + 64 * MIB * i.min(30);
            pts.push((i * 10 * MS, floor));
            pts.push((i * 10 * MS + 3 * MS, floor + 100 * MIB));
        }
        assert_eq!(growth(&timeline(pts, 900 * MS), 900 * MS), None);
    }

    #[test]
    fn growth_after_a_long_warm_up_is_told_from_it() {
        // Weights in the first 10%, flat for 40%, then 32 MiB kept per step.
        let mut pts = vec![(0, 0), (MS, 6 << 30)];
        for i in 0..100u64 {
            let t = 10 * MS + i * 10 * MS;
            let floor = (6 << 30) + if i >= 40 { (i - 40) * 32 * MIB } else { 0 };
            pts.push((t, floor));
            pts.push((t + 2 * MS, floor + 64 * MIB));
        }
        let end = 1_010 * MS;
        let g = growth(&timeline(pts, end), end).expect("growth after the plateau");
        // The weights are not in the rise.
        assert!(g.rise_bytes < 2 << 30, "{}", g.rise_bytes);
        assert!(g.rise_bytes >= 1 << 30, "{}", g.rise_bytes);
        assert!(g.minima[0].t_ns >= 300 * MS, "{}", g.minima[0].t_ns);
    }

    #[test]
    fn the_ramp_of_a_last_step_cut_short_is_not_growth() {
        // 20 steps of 10 ms (8 layers of activations made one by one, then freed), then a long last step
        // killed in its forward pass (the driver releases everything): its ramp fills the last windows, but it
        // is one step, not growth across steps.
        let mut pts = vec![(0, 64 * MIB)];
        let mut t = MS;
        for i in 0..21u64 {
            let len = if i == 20 { 400 * MS } else { 10 * MS };
            // The killed step's forward pass takes all of it.
            let spacing = if i == 20 { len / 8 } else { len / 16 };
            for l in 0..8 {
                pts.push((t + l * spacing, 64 * MIB + (l + 1) * 8 * MIB));
            }
            if i == 20 {
                pts.push((t + len, 0));
            } else {
                for l in 0..8 {
                    pts.push((t + len / 2 + l * len / 16, 64 * MIB + (7 - l) * 8 * MIB));
                }
            }
            t += len;
        }
        let tl = timeline(pts, t);
        let g = growth(&tl, t);
        assert_eq!(g, None, "{:?}", minima(&tl).len());
    }

    #[test]
    fn growth_after_a_long_flat_lead_in_is_growth() {
        // 128 MiB from the start, flat for 70% of the run (a model loading, data read), then 90 steps of 25 ms
        // keeping 40 MiB each (and freeing 20 MiB of temporaries): the growth is a third of the run, and all of
        // its windows rise.
        let mut pts = vec![(MS, 128 * MIB)];
        let t0 = 5_600 * MS;
        for i in 0..90u64 {
            let floor = 128 * MIB + 40 * MIB * i;
            pts.push((t0 + i * 25 * MS, floor + 30 * MIB));
            pts.push((t0 + i * 25 * MS + 10 * MS, floor + 60 * MIB));
            pts.push((t0 + i * 25 * MS + 15 * MS, floor + 40 * MIB));
        }
        let end = t0 + 90 * 25 * MS;
        let g = growth(&timeline(pts, end), end).expect("growth after the lead-in");
        assert!(g.rise_bytes >= 75 * 40 * MIB, "{}", g.rise_bytes);
        assert!(g.minima[0].t_ns >= t0 - 100 * MS, "{}", g.minima[0].t_ns);
    }

    #[test]
    fn a_rise_with_no_fall_is_one_long_allocation_not_growth() {
        // A first step too large: 19 activations of 4 GiB, 50 ms apart, nothing freed (cap_oom.sh's pressure
        // case); and weights loaded over 5 s, then flat for 95 s.
        let pts: Vec<(u64, u64)> = (1..=19).map(|i| (i * 50 * MS, i * (4 << 30))).collect();
        assert_eq!(growth(&timeline(pts, 1_000 * MS), 1_000 * MS), None);
        let pts: Vec<(u64, u64)> = (1..=100).map(|i| (i * 50 * MS, i * 40 * MIB)).collect();
        assert_eq!(growth(&timeline(pts, 100_000 * MS), 100_000 * MS), None);
        // Sampled every 20 ms, a loop keeping 896 MiB a second shows no fall (its temporaries live a few ms):
        // PyTorch's allocated bytes still tell the growth.
        let pts: Vec<(u64, u64)> = (0..87)
            .map(|i| (i * 1_000 * MS + 40 * MS, (6 << 30) + i * 896 * MIB))
            .collect();
        let tl = timeline(pts, 87_000 * MS);
        assert!(growth_sampled(&tl, 87_000 * MS).is_some());
        assert_eq!(growth(&tl, 87_000 * MS), None);
    }

    #[test]
    fn a_growth_too_small_beside_the_top_is_not_claimed() {
        // 40 GiB of weights and 64 KiB kept per step: noise, not a finding.
        let (tl, end) = training(100, 10 * MS, 40 << 30, 64 << 10, false);
        assert_eq!(growth(&tl, end), None);
    }
}

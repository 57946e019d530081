//! Growth counted in the program's own steps, whatever the wall clock: a leak of 3 steps in 1 s and one of 300
//! steps in an hour are both growth (docs/OOM.md, "Growth").
//!
//! A [`StepSeries`] holds one process's floor on one device per step: for a Python process whose bridge counts
//! its iterations (optimizer steps, else DataLoader batches), the least allocated bytes PyTorch reported during
//! each step; for any other process, the driver-level rule: the bytes in use each time an allocation follows a
//! free (a trough of its own allocations; a "cycle"). [`growth_in_steps`] reads the floor's rises over those
//! points. Bounded: at most [`MAX_POINTS`] points; past that, neighbours merge pairwise (each keeps the lower
//! floor), so a run of any length costs O(1) amortised per point.

use crate::model::analysis::{GrowthUnit, LeakTrend, Minimum, StepSource};
use crate::model::observe::growth::last_dwarfs;

/// The most points a series keeps before merging neighbours.
pub const MAX_POINTS: usize = 1024;
/// Rises of the floor a growth needs: three steps that each kept more than the one before.
pub const MIN_RISES: usize = 3;
/// A growth adds at least this many bytes ...
pub const MIN_BYTES: u64 = 4 << 20;
/// ... and at least this share of the floor it reached (percent).
pub const MIN_SHARE_PCT: u64 = 3;
/// A rise of the floor is at least this many bytes ...
pub const RISE_BYTES: u64 = 1 << 20;
/// ... and this share of the floor where the series starts (per mille).
pub const RISE_PER_MILLE: u64 = 5;
/// The most points between two rises of one growth, at least; more when the rises themselves are spaced wider
/// (a leak every fifth step): [`GAP_FACTOR`] times their median spacing.
pub const MIN_GAP: u64 = 3;
pub const GAP_FACTOR: u64 = 3;

/// One point: the floor over the step (or steps, once merged) starting at `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepPoint {
    /// The first step (or cycle) index the point covers.
    pub index: u64,
    /// When that step's first figure was seen (ns from the trace's start).
    pub t_ns: u64,
    pub floor: u64,
    /// The highest figure seen in it.
    pub peak: u64,
}

/// One process's floor per step on one device.
#[derive(Debug, Clone, Default)]
pub struct StepSeries {
    points: Vec<StepPoint>,
    /// Steps per point (doubles at each merge).
    width: u64,
    /// The first index seen: points are `(index - first) / width` apart.
    first: u64,
    /// The newest index seen.
    last_index: u64,
}

/// Points enough for a process's own cycles to judge its growth: with this many, a series that shows none is
/// steady, and a timeline in wall-clock windows must not say otherwise (its minima move with how the machine
/// timed the steps: a loaded CI machine made the demo's steady loop read as growth one run in fifty).
pub const JUDGED_POINTS: usize = 8;

impl StepSeries {
    /// Whether the series is long enough to judge growth by ([`JUDGED_POINTS`]).
    pub fn judges(&self) -> bool {
        self.points.len() >= JUDGED_POINTS
    }

    /// The bytes `bytes` seen at `t` during step `index` (indices never go back; one that does restarts the
    /// series: a new counter).
    pub fn observe(&mut self, index: u64, t_ns: u64, bytes: u64) {
        if self.width == 0 || index < self.last_index {
            *self = StepSeries {
                points: Vec::new(),
                width: 1,
                first: index,
                last_index: index,
            };
        }
        self.last_index = index;
        let bucket = (index - self.first) / self.width;
        let start = self.first + bucket * self.width;
        match self.points.last_mut() {
            Some(p) if p.index == start => {
                p.floor = p.floor.min(bytes);
                p.peak = p.peak.max(bytes);
            }
            _ => {
                if self.points.len() >= MAX_POINTS {
                    self.merge();
                    return self.observe(index, t_ns, bytes);
                }
                self.points.push(StepPoint {
                    index: start,
                    t_ns,
                    floor: bytes,
                    peak: bytes,
                });
            }
        }
    }

    fn merge(&mut self) {
        self.width = self.width.saturating_mul(2);
        let (first, width) = (self.first, self.width);
        let mut out: Vec<StepPoint> = Vec::with_capacity(self.points.len() / 2 + 1);
        for p in &self.points {
            let start = first + (p.index - first) / width * width;
            match out.last_mut() {
                Some(q) if q.index == start => {
                    q.floor = q.floor.min(p.floor);
                    q.peak = q.peak.max(p.peak);
                }
                // The point takes its new bucket's start, so it merges with its neighbours next time too.
                _ => out.push(StepPoint { index: start, ..*p }),
            }
        }
        self.points = out;
    }

    pub fn points(&self) -> &[StepPoint] {
        &self.points
    }

    /// Steps (or cycles) seen: the newest index less the first.
    pub fn steps_seen(&self) -> u64 {
        self.last_index.saturating_sub(self.first)
    }

    /// The growth of this series now, in `unit`; `exact`: each point is the figure at the same moment of its
    /// step (the bridge's reading at the step's boundary, the driver's trough), not the least of a sampler's
    /// readings at random moments of it.
    pub fn growth(&self, unit: GrowthUnit, pid: u32, exact: bool) -> Option<LeakTrend> {
        growth_in_steps(&self.points, unit, pid, exact)
    }
}

/// The growth of `points` (one process, one device, oldest first), or `None`. The floor at a point is the least
/// value from it on: it never falls, it steps up when something made in a step stays, and a step's own rise and
/// fall do not move it. Growth is a trailing cluster of at least [`MIN_RISES`] rises of the floor, spaced no
/// wider than [`MIN_GAP`] or [`GAP_FACTOR`] times their median spacing, the last of them no further from the
/// end than that (it was still rising), together at least [`MIN_BYTES`] and [`MIN_SHARE_PCT`] % of the floor
/// reached, and not a doubling (the work growing). With the bridge's steps, the first iteration's rise is not
/// counted: what it makes and keeps (an optimizer's state, cuBLAS's workspace, a compile's) is warm-up. An
/// optimizer step is read after it (the rise into reading 1 is the first step's); a batch or a `no_grad` scope as
/// it begins (reading 1 comes before any work, the rise into reading 2 is the first iteration's).
/// Floors read by a sampler (not `exact`) must also end above the highest figure of the growth's first step: a
/// sampler whose phase drifts against a steady loop's sees its floors creep up, but never above what the loop
/// itself reaches; memory that stays gets there.
pub fn growth_in_steps(
    points: &[StepPoint],
    unit: GrowthUnit,
    pid: u32,
    exact: bool,
) -> Option<LeakTrend> {
    let n = points.len();
    if n < MIN_RISES + 1 {
        return None;
    }
    let mut floor = vec![0u64; n];
    let mut m = u64::MAX;
    for i in (0..n).rev() {
        m = m.min(points[i].floor);
        floor[i] = m;
    }
    let top = floor[n - 1];
    // Relative to where the floor started (the weights): a long leak's own size must not hide its steps.
    let thr = RISE_BYTES.max(floor[0] / 1000 * RISE_PER_MILLE);
    let first_done = match unit {
        GrowthUnit::Steps(StepSource::Optimizer) => 1,
        GrowthUnit::Steps(StepSource::Batches | StepSource::Scopes) => 2,
        _ => 0,
    };
    let warm = |i: usize| points[i - 1].index < first_done;
    let rises: Vec<usize> = (1..n)
        .filter(|&i| floor[i] >= floor[i - 1].saturating_add(thr) && !warm(i))
        .collect();
    if rises.len() < MIN_RISES {
        return None;
    }
    let cluster = trailing_cluster(&rises, n)?;
    let start = cluster[0] - 1;
    if !exact && top < points[start].peak {
        return None;
    }
    let from = floor[start];
    let rise = top - from;
    if rise < MIN_BYTES || (rise as u128) * 100 < (top as u128) * MIN_SHARE_PCT as u128 {
        return None;
    }
    // The same rise made and given back before, again and again (a request's KV cache, freed when it ends): the
    // trailing one is one more of them, still open when the readings end, not memory kept.
    if given_back(&points[..start], from, rise) >= GIVEN_BACK {
        return None;
    }
    if work_grows(points, &floor, cluster) {
        return None;
    }
    let steps = match unit {
        // The program's own count: every step from the floor before the rise to the last.
        GrowthUnit::Steps(_) => points[n - 1].index.saturating_sub(points[start].index),
        // No step signal: each rise of the floor is taken as one step (a loop that keeps something each time
        // round rises once a round), stated as cycles.
        _ => cluster.len() as u64,
    }
    .max(1);
    Some(LeakTrend {
        minima: curve(points, &floor, start, unit),
        rise_bytes: rise,
        steps: Some(steps),
        unit,
        pid: Some(pid),
        groups: Vec::new(),
        more_groups: 0,
        sites: Vec::new(),
        more_sites: 0,
    })
}

/// The trailing cluster of `rises` (indices of the floor's rises among `n` points): spacing judged by the
/// latest rises (a leak's rhythm), so a warm-up's scattered rises long before do not join it; its last rise no
/// further from the end than that spacing (it was still rising). `None` when it is too short or ended.
fn trailing_cluster(rises: &[usize], n: usize) -> Option<&[usize]> {
    let mut gaps: Vec<u64> = rises
        .windows(2)
        .rev()
        .take(8)
        .map(|w| (w[1] - w[0]) as u64)
        .collect();
    gaps.sort_unstable();
    let median = gaps[gaps.len() / 2];
    let max_gap = MIN_GAP.max(GAP_FACTOR.saturating_mul(median));
    let last = *rises.last()?;
    if ((n - 1 - last) as u64) > max_gap {
        return None;
    }
    let mut first = rises.len() - 1;
    while first > 0 && ((rises[first] - rises[first - 1]) as u64) <= max_gap {
        first -= 1;
    }
    let cluster = &rises[first..];
    if cluster.len() < MIN_RISES {
        return None;
    }
    Some(cluster)
}

/// The work growing, not memory kept: each rise of `cluster` about twice the one before (a batch or a sequence
/// doubling until it does not fit), or a last rise that dwarfs the first half's. Per step: readings paced every
/// few steps rise by several steps' worth at once, not by a doubling.
fn work_grows(points: &[StepPoint], floor: &[u64], cluster: &[usize]) -> bool {
    let incs: Vec<u64> = cluster
        .iter()
        .map(|&i| {
            let gap = points[i].index.saturating_sub(points[i - 1].index).max(1);
            (floor[i] - floor[i - 1]) / gap
        })
        .collect();
    let doubling = incs
        .windows(2)
        .filter(|w| w[1].saturating_mul(10) >= w[0].saturating_mul(17))
        .count();
    if incs.len() >= 3 && doubling * 3 >= (incs.len() - 1) * 2 {
        return true;
    }
    last_dwarfs(&incs)
}

/// A dozen points of the floor, evenly over the growth from point `start`, for the curve.
fn curve(points: &[StepPoint], floor: &[u64], start: usize, unit: GrowthUnit) -> Vec<Minimum> {
    let span = points.len() - start;
    let shown = span.min(16);
    (0..shown)
        .map(|k| start + k * (span - 1) / (shown - 1).max(1))
        .map(|i| Minimum {
            // A cycle's point is the bytes in use just before the allocation that started it.
            t_ns: match unit {
                GrowthUnit::Cycles => points[i].t_ns.saturating_sub(1),
                _ => points[i].t_ns,
            },
            bytes: floor[i],
        })
        .collect()
}

/// Rises as large as a growth's, given back before it, that make it one more of them: two.
const GIVEN_BACK: usize = 2;

/// How many times the floors before a growth from `from` rose by half its `rise` and came back within a quarter
/// of it: the cycles of a loop whose memory rises and is freed (requests, generations).
fn given_back(before: &[StepPoint], from: u64, rise: u64) -> usize {
    let (high, low) = (from.saturating_add(rise / 2), from.saturating_add(rise / 4));
    let mut up = false;
    let mut n = 0;
    for p in before {
        if p.floor >= high {
            up = true;
        } else if up && p.floor <= low {
            up = false;
            n += 1;
        }
    }
    n
}

/// Points in a row, each above the one before, that make a small growth: something kept at every step too
/// small for [`growth_in_steps`] (a loss tensor kept without `.item()`: 512 bytes a step).
pub const SMALL_RUN: usize = 32;

/// The trailing run of `points` (exact readings) that each rose, however little, when at least [`SMALL_RUN`]
/// long: (steps it spans, bytes it rose). Never a cause: a finding, named with what held it at exit.
pub fn small_growth(points: &[StepPoint]) -> Option<(u64, u64)> {
    let n = points.len();
    let run = (1..n)
        .rev()
        .take_while(|&i| points[i].floor > points[i - 1].floor)
        .count();
    if run < SMALL_RUN {
        return None;
    }
    let (a, b) = (&points[n - 1 - run], &points[n - 1]);
    Some((b.index.saturating_sub(a.index).max(1), b.floor - a.floor))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::analysis::StepSource;

    const MIB: u64 = 1 << 20;
    const STEPS: GrowthUnit = GrowthUnit::Steps(StepSource::Optimizer);

    /// `n` steps, `samples` figures each: the floor `base + kept * step`, a step's transient `swing` on top of
    /// all but the first sample.
    fn series(
        n: u64,
        base: u64,
        kept: impl Fn(u64) -> u64,
        swing: u64,
        samples: u64,
    ) -> StepSeries {
        let mut s = StepSeries::default();
        let mut t = 0;
        for i in 0..n {
            for k in 0..samples {
                t += 20_000_000;
                let extra = if k == 0 { 0 } else { swing };
                s.observe(i, t, base + kept(i) + extra);
            }
        }
        s
    }

    #[test]
    fn outputs_kept_each_step_are_growth_with_the_step_s_figure() {
        for (n, exact) in [
            (5, true),
            (16, false),
            (71, false),
            (400, false),
            (5000, false),
        ] {
            let s = series(n, 3 << 30, |i| i * 256 * MIB, 900 * MIB, 6);
            let g = s
                .growth(STEPS, 7, exact)
                .unwrap_or_else(|| panic!("{n} steps: none"));
            let per = g.rise_bytes / g.steps.unwrap();
            // Within 5% of the program's 256 MiB a step, however long the run (merged points included).
            assert!(
                per.abs_diff(256 * MIB) * 20 <= 256 * MIB,
                "{n}: {per} a step over {:?}",
                g.steps
            );
            assert_eq!(g.pid, Some(7));
        }
    }

    #[test]
    fn a_leak_every_fifth_step_is_growth_too() {
        let s = series(60, 1 << 30, |i| (i / 5) * 64 * MIB, 300 * MIB, 3);
        let g = s.growth(STEPS, 1, false).expect("growth");
        let per = g.rise_bytes / g.steps.unwrap();
        assert!((11 * MIB..=14 * MIB).contains(&per), "{per}");
    }

    #[test]
    fn warm_up_state_made_once_and_steady_loops_are_not_growth() {
        // Steady.
        assert_eq!(
            series(100, 2 << 30, |_| 0, 500 * MIB, 4).growth(STEPS, 1, false),
            None
        );
        // Optimizer state at the first step, then steady.
        let s = series(
            50,
            1 << 30,
            |i| if i >= 1 { 2 << 30 } else { 0 },
            300 * MIB,
            4,
        );
        assert_eq!(s.growth(STEPS, 1, false), None);
        // A compile's warm-up: the first three steps each keep workspaces, then steady for 40.
        let s = series(43, 1 << 30, |i| i.min(3) * 200 * MIB, 300 * MIB, 4);
        assert_eq!(s.growth(STEPS, 1, false), None);
        // A cache that fills for the first third, then stays.
        let s = series(90, 1 << 30, |i| i.min(30) * 64 * MIB, 100 * MIB, 3);
        assert_eq!(s.growth(STEPS, 1, false), None);
    }

    /// A `no_grad` loop read as each iteration begins (reading k: after k-1 iterations): what the first one
    /// makes and keeps (cuBLAS's workspace, 33 MiB on the H200) is warm-up, not the rate. There it read
    /// "32.28 MiB per iteration" for a program keeping 32.00 MiB in each (issue 49).
    #[test]
    fn the_first_iteration_of_a_loop_read_as_it_begins_is_warm_up() {
        for source in [StepSource::Scopes, StepSource::Batches] {
            let mut s = StepSeries::default();
            for k in 1..=120u64 {
                let bytes = if k == 1 {
                    64 * MIB
                } else {
                    64 * MIB + 33 * MIB + (k - 1) * 32 * MIB
                };
                s.observe(k, k * 10_000_000, bytes);
            }
            let g = s
                .growth(GrowthUnit::Steps(source), 1, true)
                .expect("growth");
            assert_eq!(g.rise_bytes / g.steps.unwrap(), 32 * MIB, "{source:?}");
            assert_eq!(g.rise_bytes % g.steps.unwrap(), 0, "{source:?}");
        }
    }

    /// A generation loop read per token: each request's KV cache rises a MiB a token and is freed when the
    /// request ends. The last request, still open at the last reading, is one more of them, not a leak (on the
    /// H200 it read "kept 1.00 MiB per iteration over 373 iterations" at exit, issue 49); the same rise never
    /// given back is.
    #[test]
    fn a_rise_given_back_again_and_again_is_not_growth_when_the_last_is_open() {
        let request = |k: u64| k % 400; // tokens into the current request
        let mut s = StepSeries::default();
        for k in 0..2_373u64 {
            s.observe(k, k * 1_000_000, 288 * MIB + request(k) * MIB);
        }
        assert_eq!(
            s.growth(GrowthUnit::Steps(StepSource::Scopes), 1, true),
            None
        );
        // Kept: the same tokens, never freed.
        let mut s = StepSeries::default();
        for k in 0..2_373u64 {
            s.observe(k, k * 1_000_000, 288 * MIB + k * MIB);
        }
        let g = s
            .growth(GrowthUnit::Steps(StepSource::Scopes), 1, true)
            .expect("growth");
        assert_eq!(g.rise_bytes / g.steps.unwrap(), MIB);
        // Given back once only (a warm-up phase, then a leak as large): still growth.
        let mut s = StepSeries::default();
        for k in 0..1_200u64 {
            let b = if k < 400 { request(k) } else { k - 400 };
            s.observe(k, k * 1_000_000, 288 * MIB + b * MIB);
        }
        assert!(s
            .growth(GrowthUnit::Steps(StepSource::Scopes), 1, true)
            .is_some());
    }

    #[test]
    fn a_sampler_drifting_against_a_steady_loop_is_not_growth() {
        // A 60 ms step (low for its first 10 ms, 2 GiB of activations for the rest) read every 21 ms: each
        // step's least reading wanders with the phase, and can climb for several steps in a row.
        let mut s = StepSeries::default();
        let (step, period) = (60_000_000u64, 21_000_000u64);
        let (mut t, mut fooled) = (0, false);
        while t < 200 * step {
            let phase = t % step;
            let ramp = phase.saturating_sub(10_000_000) * (2 << 30) / 50_000_000;
            s.observe(t / step, t, (4 << 30) + ramp);
            t += period;
            // Asked at every moment, as an error could come at any.
            assert_eq!(s.growth(STEPS, 1, false), None, "at {t}");
            fooled |= s.growth(STEPS, 1, true).is_some();
        }
        // The same floors taken for exact ones would have been called growth: the peak rule is what holds.
        assert!(fooled);
    }

    #[test]
    fn a_batch_that_doubles_each_round_is_the_work_growing() {
        let s = series(9, 200 * MIB, |i| (4 * MIB) << i, 0, 3);
        assert_eq!(s.growth(STEPS, 1, false), None);
        let s = series(9, 200 * MIB, |i| (4 * MIB) << i, 0, 3);
        assert_eq!(s.growth(GrowthUnit::Cycles, 1, true), None);
    }

    #[test]
    fn small_or_noisy_changes_are_not_claimed() {
        // 40 GiB of weights and 64 KiB kept a step.
        assert_eq!(
            series(200, 40 << 30, |i| i * 64 * 1024, 10 * MIB, 3).growth(STEPS, 1, false),
            None
        );
        // Too few steps to say.
        assert_eq!(
            series(3, 1 << 30, |i| i * 256 * MIB, 0, 3).growth(STEPS, 1, false),
            None
        );
    }

    #[test]
    fn the_series_stays_bounded_and_keeps_the_floor() {
        let s = series(100_000, 1 << 30, |i| (i / 1000) * MIB, 50 * MIB, 1);
        assert!(s.points().len() <= MAX_POINTS);
        assert_eq!(s.points()[0].floor, 1 << 30);
        assert_eq!(s.steps_seen(), 99_999);
        // A counter that goes back (a new process image, a reset) restarts the series.
        let mut s = s;
        s.observe(3, 1, 5);
        assert_eq!(s.points().len(), 1);
    }

    #[test]
    fn a_few_bytes_kept_every_step_is_a_small_growth_and_nothing_else() {
        let mut s = StepSeries::default();
        for i in 0..300u64 {
            s.observe(i, i * 1_000_000, (4 << 30) + 512 * i);
        }
        assert_eq!(s.growth(STEPS, 1, true), None);
        assert_eq!(small_growth(s.points()), Some((299, 299 * 512)));
        // One flat step near the end breaks the run; a steady loop has none.
        s.observe(300, 300_000_000, (4 << 30) + 512 * 299);
        assert_eq!(small_growth(s.points()), None);
        let steady = series(100, 2 << 30, |_| 0, 0, 1);
        assert_eq!(small_growth(steady.points()), None);
    }

    #[test]
    fn readings_every_few_steps_stay_bounded_and_exact_through_merges() {
        // Paced readings (every 3rd step, from step 64 on: not aligned with the buckets' widths).
        let mut s = StepSeries::default();
        let mut i = 1;
        while i < 40_000 {
            s.observe(i, i * 1_000_000, (1 << 30) + i * MIB);
            i += if i < 64 { 1 } else { 3 };
        }
        assert!(s.points().len() <= MAX_POINTS, "{}", s.points().len());
        // Every point starts its bucket: neighbours are a whole width apart.
        let w = s.points()[2].index - s.points()[1].index;
        assert!(s
            .points()
            .windows(2)
            .skip(1)
            .all(|p| p[1].index - p[0].index == w));
        let g = s.growth(STEPS, 1, true).expect("growth");
        assert_eq!(g.rise_bytes / g.steps.unwrap(), MIB);
        // A jump far ahead does not fold the history into one point.
        s.observe(1 << 40, 0, 1 << 31);
        assert!(s.points().len() > 1);
    }

    #[test]
    fn readings_every_step_then_paced_are_one_steady_growth() {
        // The bridge reads the first 64 steps, then every 8 or 9: a rise per reading eight times the early
        // ones is the same 32 MiB a step, not the work doubling.
        let mut s = StepSeries::default();
        let mut i = 1;
        while i <= 300 {
            s.observe(i, i * 10_000_000, (681 * MIB) + (i - 1) * 32 * MIB);
            i += if i < 64 { 1 } else { 8 + i % 2 };
        }
        let g = s.growth(STEPS, 1, true).expect("growth");
        assert_eq!(g.rise_bytes / g.steps.unwrap(), 32 * MIB);
    }

    #[test]
    fn driver_cycles_count_each_rise_as_a_step() {
        // A loop that keeps 32 MiB and frees a 64 MiB temporary each round: one trough a round.
        let mut s = StepSeries::default();
        for i in 0..24u64 {
            s.observe(i, i * 20_000_000, 200 * MIB + i * 32 * MIB);
        }
        let g = s.growth(GrowthUnit::Cycles, 3, true).expect("growth");
        assert_eq!(g.rise_bytes / g.steps.unwrap(), 32 * MIB);
    }
}

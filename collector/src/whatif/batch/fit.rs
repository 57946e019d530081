//! How one allocation's size depends on the knob, learnt from its requested size in each run (requested, not
//! rounded: PyTorch's 512-byte rounding and its pools' boundaries would bend a straight line).
//!
//! The rule (runs sorted by value, `x` the knob, `s` the size asked):
//! - the same size in every run: constant (weights, gradients, optimizer state);
//! - `s` proportional to `x` in every run (`s_i·x_0 = s_0·x_i`, exact in integers): `c·x`;
//! - `s` proportional to `x²` in every run: `c·x²`;
//! - three runs in a straight line: `a + b·x`; three runs otherwise: the quadratic through them;
//! - two runs otherwise: `a + b·x`.
//!
//! A fit that uses every run to pin its parameters has no run left to confirm it: `a + b·x` from two runs, the
//! quadratic from three, and `c·x²` from two (a straight line through the two points fits them as well). Those
//! are *ambiguous* and carry an alternative (`a + c·x²`, the chord through the two runs nearest the value, and
//! `a + b·x`), whose replay bounds the answer. Constant and `c·x` each have a run to spare, so they are taken as
//! they are.
//!
//! Two shapes replace an ambiguous fit where the steps give evidence two sizes cannot, each keeping the fit it
//! replaces as its alternative:
//! - sizes that stop growing ([`capped`]): a buffer sized by the work up to a bound (on the H200 a backward pass's
//!   132 MiB, one per SM) grows with the knob, then holds; told from `a + b·x` by steps whose data changes;
//! - sizes a library's choice of algorithm sets ([`switched`]): a workspace that grows faster than the knob's
//!   square between two runs and is the same in every step.

use super::steps::Steps;

/// The shape of one allocation's size in the knob.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    Constant,
    /// `c·x`.
    Linear,
    /// `c·x²`.
    Square,
    /// `a + b·x`, through the smallest and the largest run.
    Affine,
    /// `a + c·x²`, through the smallest and the largest run (the alternative to `a + b·x` from two runs).
    AffineSquare,
    /// `a + b·x + c·x²` through three runs.
    Quadratic,
    /// `a + b·x` through the two runs nearest the value (the alternative to a quadratic from three runs).
    Chord,
    /// `min(c·x, cap)`: in proportion from the largest run below the cap, held at the cap ([`capped`]).
    Capped,
    /// `c·x` from the runs around the value: the runs took different algorithms (a size that grows faster than
    /// the knob's square between two of them, the same in every step, [`switched`]); past the runs, the
    /// algorithm of the run at that end, between two the larger of the two in proportion.
    Switched,
}

impl Shape {
    pub fn name(self) -> &'static str {
        match self {
            Shape::Constant => "constant",
            Shape::Linear => "linear",
            Shape::Square => "square",
            Shape::Affine => "affine",
            Shape::AffineSquare => "affine_square",
            Shape::Quadratic => "quadratic",
            Shape::Chord => "chord",
            Shape::Capped => "capped",
            Shape::Switched => "switched",
        }
    }

    /// In words, for the text report.
    pub fn formula(self) -> &'static str {
        match self {
            Shape::Constant => "constant",
            Shape::Linear => "c·x",
            Shape::Square => "c·x²",
            Shape::Affine => "a + b·x",
            Shape::AffineSquare => "a + c·x²",
            Shape::Quadratic => "a + b·x + c·x²",
            Shape::Chord => "a + b·x between the nearest runs",
            Shape::Capped => "c·x up to a cap",
            Shape::Switched => "c·x, per algorithm",
        }
    }
}

/// One allocation's fit: its shape, and where the runs leave it ambiguous, the alternative.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fit {
    pub shape: Shape,
    pub alternative: Option<Shape>,
}

/// `a · b`, or `None` past i128: sizes come from untrusted snapshots and values from the command line, so no
/// product here is assumed to fit.
fn mul(a: i128, b: i128) -> Option<i128> {
    a.checked_mul(b)
}

/// `a · b == c · d`, false where either product overflows (no size the model would use is that large).
fn same(a: i128, b: i128, c: i128, d: i128) -> bool {
    matches!((mul(a, b), mul(c, d)), (Some(l), Some(r)) if l == r)
}

/// `size` asked at `from`, at `to`: in proportion above, as asked below (an upper bound for a size that grows at
/// most in proportion to the knob).
pub fn in_proportion(size: u64, from: u64, to: u64) -> u64 {
    if to <= from || from == 0 {
        return size;
    }
    ((size as u128).saturating_mul(to as u128) / from as u128)
        .min(crate::whatif::history::MAX_SIZE as u128) as u64
}

/// Fits sizes `s` (one per run) at knob values `x` (ascending, distinct, two or three of them).
pub fn fit(x: &[u64], s: &[u64]) -> Fit {
    let one = |shape| Fit {
        shape,
        alternative: None,
    };
    let (x0, s0) = (x[0] as i128, s[0] as i128);
    let all = |f: &dyn Fn(i128, i128) -> bool| {
        x.iter()
            .zip(s)
            .skip(1)
            .all(|(&xi, &si)| f(xi as i128, si as i128))
    };
    if all(&|_, si| si == s0) {
        return one(Shape::Constant);
    }
    if all(&|xi, si| same(si, x0, s0, xi)) {
        return one(Shape::Linear);
    }
    let square = all(&|xi, si| match (mul(x0, x0), mul(xi, xi)) {
        (Some(x00), Some(xii)) => same(si, x00, s0, xii),
        _ => false,
    });
    if x.len() >= 3 {
        if square {
            return one(Shape::Square);
        }
        let (x1, s1) = (x[x.len() - 1] as i128, s[s.len() - 1] as i128);
        if all(&|xi, si| same(si - s0, x1 - x0, s1 - s0, xi - x0)) {
            return one(Shape::Affine);
        }
        return Fit {
            shape: Shape::Quadratic,
            alternative: Some(Shape::Chord),
        };
    }
    if square {
        return Fit {
            shape: Shape::Square,
            alternative: Some(Shape::Affine),
        };
    }
    Fit {
        shape: Shape::Affine,
        alternative: Some(Shape::AffineSquare),
    }
}

/// `num / den` rounded to the nearest integer (halves away from zero); `den > 0`.
fn div_round(num: i128, den: i128) -> i128 {
    if num >= 0 {
        num.saturating_add(den / 2) / den
    } else {
        -(num.saturating_neg().saturating_add(den / 2) / den)
    }
}

/// The line through `(u0, s0)` and `(u1, s1)` at `u` (`u` is `x` or `x²`); `None` past i128.
fn line(u0: i128, s0: i128, u1: i128, s1: i128, u: i128) -> Option<i128> {
    if u1 == u0 {
        return Some(s0);
    }
    let (u0, s0, u1, s1) = if u1 < u0 {
        (u1, s1, u0, s0)
    } else {
        (u0, s0, u1, s1)
    };
    s0.checked_add(div_round(mul(s1 - s0, u.checked_sub(u0)?)?, u1 - u0))
}

/// The size `shape` gives at `at`, from the runs' values `x` and sizes `s`, in bytes: negative when a line
/// falling with the knob is followed below its zero (the caller clamps and says so); `i128::MAX` where the
/// arithmetic passes i128 (a value or a size far past any device: the replay refuses it).
pub fn eval(shape: Shape, x: &[u64], s: &[u64], at: u64) -> i128 {
    checked_eval(shape, x, s, at).unwrap_or(i128::MAX)
}

fn checked_eval(shape: Shape, x: &[u64], s: &[u64], at: u64) -> Option<i128> {
    let n = x.len() - 1;
    let (x0, s0) = (x[0] as i128, s[0] as i128);
    let (xn, sn) = (x[n] as i128, s[n] as i128);
    let t = at as i128;
    let tt = mul(t, t)?;
    Some(match shape {
        Shape::Constant => s0,
        Shape::Linear => div_round(mul(sn, t)?, xn.max(1)),
        Shape::Square => div_round(mul(sn, tt)?, mul(xn, xn)?.max(1)),
        Shape::Affine => line(x0, s0, xn, sn, t)?,
        Shape::AffineSquare => line(mul(x0, x0)?, s0, mul(xn, xn)?, sn, tt)?,
        Shape::Quadratic if n >= 2 => {
            // Lagrange through the three runs over the Vandermonde determinant V = (x1-x0)(x2-x0)(x2-x1): each
            // term is about s·t²·x, where the product of the three basis denominators (about x⁶) would pass
            // i128 for a token-count knob at a few hundred thousand.
            let (x1, s1) = (x[1] as i128, s[1] as i128);
            let v = mul(mul(x1 - x0, xn - x0)?, xn - x1)?;
            let term = |si: i128, a: i128, b: i128, w: i128| -> Option<i128> {
                mul(mul(mul(si, t - a)?, t - b)?, w)
            };
            let num = term(s0, x1, xn, xn - x1)?
                .checked_sub(term(s1, x0, xn, xn - x0)?)?
                .checked_add(term(sn, x0, x1, x1 - x0)?)?;
            if v < 0 {
                div_round(num.checked_neg()?, v.checked_neg()?)
            } else {
                div_round(num, v)
            }
        }
        Shape::Quadratic => line(x0, s0, xn, sn, t)?,
        Shape::Capped => {
            let cap = s.iter().copied().max().unwrap_or(0) as i128;
            match (0..=n).rev().find(|&i| (s[i] as i128) < cap) {
                Some(i) => div_round(mul(s[i] as i128, t)?, (x[i] as i128).max(1)).min(cap),
                None => cap,
            }
        }
        Shape::Switched => {
            // Past the runs, the algorithm of the run at that end; between two, either: the larger of the two
            // in proportion (an upper bound on which one the library takes).
            let prop = |i: usize| -> Option<i128> {
                Some(div_round(mul(s[i] as i128, t)?, (x[i] as i128).max(1)))
            };
            match x.iter().position(|&xi| xi >= at) {
                None => prop(n)?,
                Some(0) => prop(0)?,
                Some(i) if x[i] == at => s[i] as i128,
                Some(i) => prop(i - 1)?.max(prop(i)?),
            }
        }
        Shape::Chord => {
            // The two runs nearest `at`: the pair around it, else the two at the near end.
            let i = x.iter().position(|&xi| xi >= at).unwrap_or(n + 1);
            let i = i.clamp(1, n);
            line(
                x[i - 1] as i128,
                s[i - 1] as i128,
                x[i] as i128,
                s[i] as i128,
                t,
            )?
        }
    })
}

/// Grows faster than the square of the knob between two neighbouring runs (`s1·x0² > s0·x1²`): no size made of a
/// constant, a part in proportion and a part in the square (none negative) does.
fn past_square(x: &[u64], s: &[u64]) -> bool {
    x.windows(2).zip(s.windows(2)).any(|(x, s)| {
        let (x0, x1, s0, s1) = (x[0] as u128, x[1] as u128, s[0] as u128, s[1] as u128);
        match (
            s1.checked_mul(x0).and_then(|v| v.checked_mul(x0)),
            s0.checked_mul(x1).and_then(|v| v.checked_mul(x1)),
        ) {
            (Some(l), Some(r)) => l > r,
            _ => false,
        }
    })
}

/// `f` becomes `shape`, its fit until now the alternative; false where it already took one of these shapes (its
/// alternative stays the fit the runs gave).
fn recast(f: &mut Fit, shape: Shape) -> bool {
    if matches!(f.shape, Shape::Capped | Shape::Switched) {
        return false;
    }
    *f = Fit {
        shape,
        alternative: Some(f.shape),
    };
    true
}

/// The cycle's request at position `p` of each repeat.
fn repeats(steps: &Steps, p: usize) -> impl Iterator<Item = usize> + '_ {
    (0..steps.count).map(move |i| steps.setup + i * steps.period + p)
}

/// Marks the requests a library sized by its choice of algorithm (`fits[k]` becomes [`Shape::Switched`], its
/// first fit the alternative), from the sizes of runs that all finished (`sizes[k * runs + r]`, runs ascending in
/// `x`) and their steps. Returns how many.
///
/// A request of the step cycle whose fit is ambiguous, whose size grows faster than the knob's square between two
/// runs, and which asks the same size in every repeat within each run (a workspace sized by the shapes, not a
/// tensor sized by the data each step holds: padded lengths that grow with the batch grow faster than its square
/// too, and change step to step); and a setup request (a first step told apart) whose sizes are, in every run,
/// byte for byte those of such a request. cuDNN's workspace of 131 bytes at batch 16 and 54 MiB at 32 is one.
pub fn switched(x: &[u64], sizes: &[u64], steps: &Steps, fits: &mut [Fit]) -> usize {
    let runs = x.len();
    if runs < 2 || steps.period == 0 || steps.count < 2 || sizes.len() != fits.len() * runs {
        return 0;
    }
    let row = |k: usize| &sizes[k * runs..(k + 1) * runs];
    let mut seen: Vec<&[u64]> = Vec::new();
    let mut marked = 0;
    let mut mark = |f: &mut Fit| marked += usize::from(recast(f, Shape::Switched));
    for p in 0..steps.period {
        let first = steps.setup + p;
        if fits[first].alternative.is_none()
            || !past_square(x, row(first))
            || !repeats(steps, p).all(|k| row(k) == row(first))
        {
            continue;
        }
        seen.push(row(first));
        for k in repeats(steps, p) {
            mark(&mut fits[k]);
        }
    }
    for (k, f) in fits.iter_mut().enumerate().take(steps.setup) {
        if f.alternative.is_some() && seen.contains(&row(k)) {
            mark(f);
        }
    }
    marked
}

/// Marks the requests whose sizes stop growing with the knob (`fits[k]` becomes [`Shape::Capped`], its first fit
/// the alternative), from the sizes of runs that all finished (`sizes[k * runs + r]`, runs ascending in `x`),
/// their steps and the requests' lines (`lines[k]`). Returns how many.
///
/// The evidence is the steps: where the largest run's steps change in size (their data does) but one request of
/// the cycle asks the same size `C` in every repeat, while the smallest run asks less than `C` in every repeat,
/// by varying amounts, each of which in proportion would pass `C` at the largest value, that request is held at
/// `C` by something other than the data: a cap. A setup request (a first step told apart) from the same line that
/// asks that same `C` in the largest run on the same terms is capped too. Programs whose steps are all alike never
/// show it, and keep their fits.
pub fn capped(x: &[u64], sizes: &[u64], steps: &Steps, lines: &[u32], fits: &mut [Fit]) -> usize {
    let runs = x.len();
    if runs < 2
        || steps.period == 0
        || steps.count < 2
        || sizes.len() != fits.len() * runs
        || lines.len() != fits.len()
    {
        return 0;
    }
    let (lo, hi) = (0, runs - 1);
    let size = |k: usize, r: usize| sizes[k * runs + r];
    let alike =
        |p: usize, r: usize| repeats(steps, p).all(|k| size(k, r) == size(steps.setup + p, r));
    // Would pass `cap` at the largest value in proportion, from every run below it, and no run asks more.
    let under = |k: usize, cap: u64| {
        (0..runs).all(|r| size(k, r) <= cap)
            && (0..runs).filter(|&r| size(k, r) < cap).all(|r| {
                (size(k, r) as u128).saturating_mul(x[hi] as u128) >= (cap as u128) * (x[r] as u128)
            })
    };
    if (0..steps.period).all(|p| alike(p, hi)) {
        return 0;
    }
    let mut caps: Vec<(u32, u64)> = Vec::new();
    let mut marked = 0;
    let mut mark = |f: &mut Fit| marked += usize::from(recast(f, Shape::Capped));
    for p in 0..steps.period {
        let cap = size(steps.setup + p, hi);
        if !alike(p, hi)
            || alike(p, lo)
            || !repeats(steps, p).all(|k| size(k, lo) < cap && under(k, cap))
        {
            continue;
        }
        caps.push((lines[steps.setup + p], cap));
        for k in repeats(steps, p) {
            mark(&mut fits[k]);
        }
    }
    for (k, f) in fits.iter_mut().enumerate().take(steps.setup) {
        let cap = size(k, hi);
        if matches!(f.shape, Shape::Constant | Shape::Linear)
            || !caps.contains(&(lines[k], cap))
            || size(k, lo) >= cap
            || !under(k, cap)
        {
            continue;
        }
        mark(f);
    }
    marked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_picks_the_lowest_shape_the_runs_confirm() {
        let f = |x: &[u64], s: &[u64]| fit(x, s);
        // Weights: the same at every batch.
        assert_eq!(f(&[8, 16], &[4096, 4096]).shape, Shape::Constant);
        // Activations: batch × sequence × width × 4 bytes.
        let lin = f(&[8, 16], &[8 * 256 * 4096, 16 * 256 * 4096]);
        assert_eq!((lin.shape, lin.alternative), (Shape::Linear, None));
        // Attention scores in the sequence length: proportional to its square, but a line fits two points too.
        let sq = f(&[256, 512], &[256 * 256 * 64, 512 * 512 * 64]);
        assert_eq!(
            (sq.shape, sq.alternative),
            (Shape::Square, Some(Shape::Affine))
        );
        // A constant part and a proportional part: two runs cannot tell a line from a + c·x².
        let aff = f(&[8, 16], &[1000 + 8 * 512, 1000 + 16 * 512]);
        assert_eq!(
            (aff.shape, aff.alternative),
            (Shape::Affine, Some(Shape::AffineSquare))
        );
        // Three runs: a line confirmed by the third; a quadratic has no run to spare.
        let aff3 = f(
            &[4, 8, 16],
            &[1000 + 4 * 512, 1000 + 8 * 512, 1000 + 16 * 512],
        );
        assert_eq!((aff3.shape, aff3.alternative), (Shape::Affine, None));
        let q = |x: u64| 1000 + 512 * x + 64 * x * x;
        let quad = f(&[4, 8, 16], &[q(4), q(8), q(16)]);
        assert_eq!(
            (quad.shape, quad.alternative),
            (Shape::Quadratic, Some(Shape::Chord))
        );
        let sq3 = f(&[4, 8, 16], &[64 * 16, 64 * 64, 64 * 256]);
        assert_eq!((sq3.shape, sq3.alternative), (Shape::Square, None));
    }

    #[test]
    fn each_shape_gives_back_the_runs_and_extends_exactly() {
        let q = |x: u64| 1000 + 512 * x + 64 * x * x;
        let (x3, s3) = ([4, 8, 16], [q(4), q(8), q(16)]);
        for at in [1, 4, 8, 12, 16, 40] {
            assert_eq!(eval(Shape::Quadratic, &x3, &s3, at), q(at) as i128, "{at}");
        }
        let (x2, s2) = ([8, 16], [1000 + 8 * 512, 1000 + 16 * 512]);
        assert_eq!(eval(Shape::Affine, &x2, &s2, 24), 1000 + 24 * 512);
        assert_eq!(eval(Shape::Linear, &[8, 16], &[800, 1600], 3), 300);
        assert_eq!(eval(Shape::Square, &[2, 4], &[40, 160], 6), 360);
        assert_eq!(eval(Shape::Constant, &[2, 4], &[7, 7], 600), 7);
        // a + c·x² through (8, 5096) and (16, 9192): c = 4096 / 192, a = 5096 - 64·c; at 24: a + 576·c.
        let alt = eval(Shape::AffineSquare, &x2, &s2, 24);
        assert_eq!(alt, 5096 + div_round(4096 * (576 - 64), 256 - 64));
        assert!(
            alt > eval(Shape::Affine, &x2, &s2, 24),
            "convex beyond the runs"
        );
        // Between the runs, the chord of the nearest two; beyond them, the two at that end.
        assert_eq!(eval(Shape::Chord, &x3, &s3, 12), (q(8) + q(16)) as i128 / 2);
        assert_eq!(
            eval(Shape::Chord, &x3, &s3, 2),
            q(4) as i128 - (q(8) - q(4)) as i128 / 2
        );
        // A size falling with the knob, followed past its zero, is negative (the caller clamps).
        assert!(eval(Shape::Affine, &[8, 16], &[1000, 500], 40) < 0);
    }

    /// cuDNN's algorithm at 16 asks 131 bytes, at 32 another's asks 54 MiB (in proportion to the batch from there
    /// on), the same in every step: a line through the two would give 108 MiB at 48, where the program asks 81.
    #[test]
    fn a_workspace_that_grows_past_the_square_follows_the_runs_algorithms() {
        let (x, ws) = ([16u64, 32], [131u64, 56_623_376]);
        // A setup of one request like the cycle's, then five repeats of (the workspace, an activation).
        let mut sizes: Vec<u64> = ws.to_vec();
        for _ in 0..5 {
            sizes.extend(ws);
            sizes.extend([16 * 4096, 32 * 4096]);
        }
        let steps = Steps {
            setup: 1,
            period: 2,
            count: 5,
        };
        let mut fits: Vec<Fit> = sizes.chunks(2).map(|s| fit(&x, s)).collect();
        assert_eq!(switched(&x, &sizes, &steps, &mut fits), 6);
        for k in [0, 1, 3, 5, 7, 9] {
            assert_eq!(
                (fits[k].shape, fits[k].alternative),
                (Shape::Switched, Some(Shape::Affine)),
                "{k}"
            );
        }
        assert_eq!(fits[2].shape, Shape::Linear);
        // Past the runs, the end run's algorithm; between them, the larger of the two in proportion; at a run,
        // its own size.
        assert_eq!(eval(Shape::Switched, &x, &ws, 48), 84_935_064);
        assert_eq!(eval(Shape::Switched, &x, &ws, 8), 66);
        assert_eq!(eval(Shape::Switched, &x, &ws, 24), 42_467_532);
        assert_eq!(eval(Shape::Switched, &x, &ws, 32), 56_623_376);
        // Three runs: the switch between the first two, the last two in proportion.
        let (x3, s3) = ([16u64, 32, 48], [131u64, 56_623_376, 84_935_064]);
        assert_eq!(eval(Shape::Switched, &x3, &s3, 64), 113_246_752);
        // Exactly the square is a square, and a constant part with a square one is not past it.
        assert!(!past_square(&[16, 32], &[100, 400]));
        assert!(!past_square(&[16, 32], &[1000 + 100, 1000 + 400]));
        assert!(past_square(&[16, 32], &[100, 401]));
    }

    /// Padded batches: the longest sequence of a batch grows with the batch, so attention scores (`b·L²`) grow
    /// faster than the batch's square, but step by step with the data: not an algorithm's switch, and kept.
    #[test]
    fn sizes_that_follow_the_data_are_not_taken_for_a_switch() {
        let x = [4u64, 8];
        let (l4, l8) = ([60u64, 72, 50, 64], [100u64, 120, 90, 110]);
        let sizes: Vec<u64> = l4
            .iter()
            .zip(&l8)
            .flat_map(|(&a, &b)| [4 * a * a, 8 * b * b])
            .collect();
        assert!(sizes.chunks(2).all(|s| past_square(&x, s)));
        let mut fits: Vec<Fit> = sizes.chunks(2).map(|s| fit(&x, s)).collect();
        let steps = Steps {
            setup: 0,
            period: 1,
            count: 4,
        };
        assert_eq!(switched(&x, &sizes, &steps, &mut fits), 0);
        assert!(fits.iter().all(|f| f.shape == Shape::Affine));
    }

    /// Steps of a fine-tuning loop whose sequence lengths change step to step: a buffer grows with the batch and
    /// the length until 132 MiB (one MiB per SM), then holds; at batch 8 every step asks 132 MiB, at batch 4 each
    /// asks half its length's share. The activations beside it keep their fits.
    #[test]
    fn a_size_held_at_a_cap_while_the_steps_change_is_capped() {
        const MIB: u64 = 1 << 20;
        let x = [4u64, 8];
        let lens = [88u64, 120, 92, 72, 128];
        // Per step: the capped buffer, an activation `c·x·len`, a weight.
        let mut sizes = Vec::new();
        let setup = 2;
        // The setup: a weight, then a first step's buffer (the same cap, told apart as setup).
        sizes.extend([4096, 4096]);
        sizes.extend([88 * MIB, 132 * MIB]);
        for &l in &lens {
            sizes.extend([l * MIB, (2 * l * MIB).min(132 * MIB)]);
            sizes.extend([4 * l * 1024, 8 * l * 1024]);
            sizes.extend([512, 512]);
        }
        let mut fits: Vec<Fit> = sizes.chunks(2).map(|s| fit(&x, s)).collect();
        let steps = Steps {
            setup,
            period: 3,
            count: lens.len(),
        };
        // The buffer's line, the activation's, the weight's.
        let mut lines = vec![9, 1];
        for _ in &lens {
            lines.extend([1, 2, 3]);
        }
        // From another line, the setup's request of the same size is not taken for the same buffer.
        let mut other = lines.clone();
        other[1] = 4;
        let mut f: Vec<Fit> = sizes.chunks(2).map(|s| fit(&x, s)).collect();
        assert_eq!(capped(&x, &sizes, &steps, &other, &mut f), 5);
        assert_eq!(f[1].shape, Shape::Affine);
        assert_eq!(capped(&x, &sizes, &steps, &lines, &mut fits), 6);
        assert_eq!(
            fits[1].shape,
            Shape::Capped,
            "the setup's request of the same cap"
        );
        for (i, _) in lens.iter().enumerate() {
            let k = setup + 3 * i;
            assert_eq!(fits[k].shape, Shape::Capped);
            assert_eq!(fits[k + 1].shape, Shape::Linear);
            assert_eq!(fits[k + 2].shape, Shape::Constant);
        }
        // 72 MiB at 4 is 108 at 6 and the cap from 8 on; 128 at 4 is the cap at 6 already.
        let at = |k: usize, v: u64| eval(Shape::Capped, &x, &sizes[2 * k..2 * k + 2], v);
        assert_eq!(at(setup + 9, 6), (108 * MIB) as i128);
        assert_eq!(at(setup + 12, 6), (132 * MIB) as i128);
        assert_eq!(at(setup + 9, 16), (132 * MIB) as i128);
        assert_eq!(at(setup + 9, 2), (36 * MIB) as i128);
        // Steps all alike (no data to tell a cap from a constant part): nothing is capped.
        let same: Vec<u64> = (0..5).flat_map(|_| [72 * MIB, 132 * MIB]).collect();
        let mut f: Vec<Fit> = same.chunks(2).map(|s| fit(&x, s)).collect();
        let one = Steps {
            setup: 0,
            period: 1,
            count: 5,
        };
        assert_eq!(capped(&x, &same, &one, &[1; 5], &mut f), 0);
        assert!(f.iter().all(|f| f.shape == Shape::Affine));
        // The largest run's steps all alike while the smallest's vary (padding that reaches the longest sample at
        // the larger batch): no request is held apart from the data, so none is capped.
        let pad: Vec<u64> = lens.iter().flat_map(|&l| [l * MIB, 256 * MIB]).collect();
        let mut f: Vec<Fit> = pad.chunks(2).map(|s| fit(&x, s)).collect();
        assert_eq!(capped(&x, &pad, &one, &[1; 5], &mut f), 0);
    }

    /// Values and sizes as large as a forged snapshot or a command line can give: no fit or size overflows (a
    /// panic in debug builds, a wrong size in release ones); past i128 the size is the largest, which no device
    /// holds.
    #[test]
    fn the_largest_values_and_sizes_never_overflow() {
        let big = u64::MAX;
        for (x, s) in [
            (vec![1, big], vec![big, big - 1]),
            (vec![2, big], vec![big, 3]),
            (vec![1, 2, big], vec![big, 1, big]),
            (vec![1 << 40, 1 << 41, 1 << 42], vec![1 << 62, 1 << 63, big]),
        ] {
            let f = fit(&x, &s);
            for shape in [
                Shape::Constant,
                Shape::Linear,
                Shape::Square,
                Shape::Affine,
                Shape::AffineSquare,
                Shape::Quadratic,
                Shape::Chord,
                Shape::Capped,
                Shape::Switched,
            ] {
                for at in [0, 1, 3, 1 << 32, big] {
                    let _ = eval(shape, &x, &s, at);
                }
            }
            let _ = f.alternative;
        }
        // A square followed far out is the largest size, not a wrapped one.
        assert_eq!(
            eval(Shape::Square, &[1, 2], &[1 << 62, 1 << 63], big),
            i128::MAX
        );
    }

    /// A token-count knob: three runs at 65,536, 131,072 and 262,144 tokens, a size of 4096 + 64·x + x²/1024
    /// bytes, followed past the runs exactly (the common denominator of the three basis polynomials, about x⁶,
    /// once passed i128 here and made every such size the largest).
    #[test]
    fn a_quadratic_in_hundreds_of_thousands_stays_exact() {
        let size = |x: u64| 4096 + 64 * x + x * x / 1024;
        let x = [1u64 << 16, 1 << 17, 1 << 18];
        let s: Vec<u64> = x.iter().map(|&v| size(v)).collect();
        assert_eq!(fit(&x, &s).shape, Shape::Quadratic);
        for at in [1u64 << 16, 131_073, 393_216, 1 << 19, 1 << 22] {
            assert_eq!(
                eval(Shape::Quadratic, &x, &s, at),
                size(at) as i128,
                "at {at}"
            );
        }
    }
}

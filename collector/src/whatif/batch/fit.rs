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

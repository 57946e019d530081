//! Runs whose code paths differ a little: libraries choose their kernels by size (PyTorch's embedding backward
//! sorts past 3,072 indices and asks for its sort's buffers; cuDNN's algorithms ask a workspace or none), so a
//! run at another batch asks a few requests more or fewer among the same lines. The runs are matched by a shortest
//! edit script over their lines (Myers' O(ND) difference), bounded: past [`max_edits`] edits the runs take
//! different code paths and nothing is extrapolated.

/// Matched requests: (index in `a`, index in `b`), ascending in both.
pub type Pairs = Vec<(u32, u32)>;

/// The most steps the edit script may take (comparisons along its diagonals): about a second on one core.
pub const MAX_WORK: u64 = 200_000_000;

/// The most pairings one block of [`refine`] weighs (its table's cells).
const MAX_CELLS: usize = 4_000_000;

/// Re-pairs requests among runs of one line by their sizes. Many requests share a line (everything on autograd's
/// backward thread has no Python frame; a line in a loop over layers repeats), and among equally short edit
/// scripts Myers' pairs as early as it can: a sort's buffers asked before an embedding's gradient at the larger
/// batch would take the gradient's place, and every request after them would be paired with another tensor.
/// Each block of consecutive pairs on one line, with the unmatched requests of that line between its neighbours,
/// is paired again in order, as many pairs as before, at the least cost: a pair's cost is how far the ratio of
/// its sizes (`b` over `a`, logarithms) lies outside what one tensor's size does between the runs' values (from
/// equal to the square of their ratio `r`, `b`'s value over `a`'s), give or take a fifth of that range (the data a
/// step holds moves it a little).
pub fn refine(lines: (&[u32], &[u32]), sizes: (&[u64], &[u64]), r: f64, pairs: Pairs) -> Pairs {
    let (la, lb) = lines;
    let (sa, sb) = sizes;
    let sq = 2.0 * r.ln();
    let slack = 0.2 * sq.abs();
    let (lo, hi) = (sq.min(0.0) - slack, sq.max(0.0) + slack);
    let cost = |i: u32, j: u32| {
        let d = ((sb[j as usize] as f64 + 1.0) / (sa[i as usize] as f64 + 1.0)).ln();
        if d < lo {
            lo - d
        } else if d > hi {
            d - hi
        } else {
            0.0
        }
    };
    let mut out: Pairs = Vec::with_capacity(pairs.len());
    let mut k = 0;
    while k < pairs.len() {
        let line = la[pairs[k].0 as usize];
        let mut e = k + 1;
        while e < pairs.len() && la[pairs[e].0 as usize] == line {
            e += 1;
        }
        // Between the neighbouring pairs, every request of this line on each side.
        let (a0, b0) = k.checked_sub(1).map_or((0, 0), |p| {
            (pairs[p].0 as usize + 1, pairs[p].1 as usize + 1)
        });
        let (a1, b1) = pairs
            .get(e)
            .map_or((la.len(), lb.len()), |p| (p.0 as usize, p.1 as usize));
        let xs: Vec<u32> = (a0..a1)
            .filter(|&i| la[i] == line)
            .map(|i| i as u32)
            .collect();
        let ys: Vec<u32> = (b0..b1)
            .filter(|&j| lb[j] == line)
            .map(|j| j as u32)
            .collect();
        let want = e - k;
        let block = &pairs[k..e];
        let same = xs.len() == want && ys.len() == want;
        if same || want != xs.len().min(ys.len()) || xs.len() * ys.len() > MAX_CELLS {
            out.extend_from_slice(block);
        } else {
            out.extend(align_block(&xs, &ys, &cost));
        }
        k = e;
    }
    out
}

/// The order-keeping pairing of every element of the shorter of `xs` and `ys` with one of the longer at the least
/// total `cost` (a table of its prefixes; ties keep the earlier pairs).
fn align_block(xs: &[u32], ys: &[u32], cost: &dyn Fn(u32, u32) -> f64) -> Pairs {
    let flip = xs.len() > ys.len();
    let (s, l) = if flip { (ys, xs) } else { (xs, ys) };
    let c = |i: usize, j: usize| {
        if flip {
            cost(l[j], s[i])
        } else {
            cost(s[i], l[j])
        }
    };
    let (n, m) = (s.len(), l.len());
    // best[i][j]: the first i of the shorter paired among the first j of the longer.
    let w = m + 1;
    let mut best = vec![f64::INFINITY; (n + 1) * w];
    let mut took = vec![false; (n + 1) * w];
    best[..=m].fill(0.0);
    for i in 1..=n {
        for j in i..=m {
            let skip = best[i * w + j - 1];
            let pair = best[(i - 1) * w + j - 1] + c(i - 1, j - 1);
            if pair < skip {
                best[i * w + j] = pair;
                took[i * w + j] = true;
            } else {
                best[i * w + j] = skip;
            }
        }
    }
    let mut out = Vec::with_capacity(n);
    let (mut i, mut j) = (n, m);
    while i > 0 {
        if took[i * w + j] {
            out.push(if flip {
                (l[j - 1], s[i - 1])
            } else {
                (s[i - 1], l[j - 1])
            });
            i -= 1;
        }
        j -= 1;
    }
    out.reverse();
    out
}

/// The most edits (requests in one run and not the other) a match tolerates for `n` requests: an eighth of them,
/// at least 64 and at most 3,000 (the edit script's trace is quadratic in it: 36 MB at most).
pub fn max_edits(n: usize) -> usize {
    (n / 8).clamp(64, 3_000)
}

/// A shortest edit script between `a` and `b` with at most `max_d` edits, as the pairs it matches; `None` past
/// `max_d`. With `b_prefix`, `b` need only match a prefix of `a` (a run that failed, matched up to its failure: the
/// rest of `a` is what it never asked, not an edit).
pub fn matches(a: &[u32], b: &[u32], max_d: usize, b_prefix: bool) -> Option<Pairs> {
    // The common start, which is most of it, outside the quadratic part.
    let head = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let mut pairs: Pairs = (0..head as u32).map(|i| (i, i)).collect();
    let (a, b) = (&a[head..], &b[head..]);
    let (n, m) = (a.len() as i64, b.len() as i64);
    if m == 0 && (b_prefix || n == 0) {
        return Some(pairs);
    }
    let off = max_d as i64 + 1;
    let mut v = vec![-1i64; 2 * off as usize + 1];
    // Per round, the previous round's furthest points on the diagonals it reads (-(d+1)..=d+1), for the way back.
    let mut trace: Vec<Vec<i32>> = Vec::new();
    // Work: O((N + M)·D) at worst (long runs of one line on many diagonals); past a bound the runs are taken
    // for different code paths rather than spend seconds on a forged history.
    let budget = std::cell::Cell::new(MAX_WORK);
    let snake = |mut x: i64, k: i64| {
        let x0 = x;
        while x < n && x - k < m && a[x as usize] == b[(x - k) as usize] {
            x += 1;
        }
        budget.set(budget.get().saturating_sub((x - x0) as u64 + 1));
        x
    };
    // The furthest point on diagonal `k` after `d` edits, from the previous round's (`prev(k)`, -1: none), and
    // whether it came down (a request of `b` alone) rather than right (one of `a` alone).
    let step = |prev: &dyn Fn(i64) -> i64, d: i64, k: i64| -> Option<(i64, bool)> {
        if d == 0 {
            return Some((0, false));
        }
        let down = (k < d)
            .then(|| prev(k + 1))
            .filter(|&x| x >= 0 && x - k <= m);
        let right = (k > -d)
            .then(|| prev(k - 1))
            .filter(|&x| x >= 0 && x < n)
            .map(|x| x + 1);
        match (down, right) {
            (Some(x), Some(y)) if x >= y => Some((x, true)),
            (_, Some(y)) => Some((y, false)),
            (Some(x), None) => Some((x, true)),
            (None, None) => None,
        }
    };
    let mut end = None;
    'outer: for d in 0..=max_d as i64 {
        let lo = (off - d - 1) as usize;
        let prev: Vec<i64> = v[lo..=(off + d + 1) as usize].to_vec();
        trace.push(prev.iter().map(|&x| x as i32).collect());
        let get = |k: i64| prev[(k + d + 1) as usize];
        for k in (-d..=d).step_by(2) {
            let x = match step(&get, d, k) {
                Some((x0, _)) => snake(x0, k),
                None => -1,
            };
            v[(off + k) as usize] = x;
            if budget.get() == 0 {
                return None;
            }
            if x >= 0 && x - k == m && (b_prefix || x == n) {
                end = Some((d, k, x));
                break 'outer;
            }
        }
    }
    let (d_end, mut k, mut x) = end?;
    // Back from the end: each round's snake, then the edit that led to it.
    let mut back: Pairs = Vec::new();
    for d in (0..=d_end).rev() {
        let prev = &trace[d as usize];
        let get = |k: i64| i64::from(prev[(k + d + 1) as usize]);
        let (x0, down) = step(&get, d, k)?;
        for i in (x0..x).rev() {
            back.push((i as u32, (i - k) as u32));
        }
        if d == 0 {
            break;
        }
        k = if down { k + 1 } else { k - 1 };
        x = get(k);
    }
    let h = head as u32;
    pairs.extend(back.into_iter().rev().map(|(i, j)| (i + h, j + h)));
    Some(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(a: &[u32], b: &[u32], pairs: &Pairs) {
        for w in pairs.windows(2) {
            assert!(w[0].0 < w[1].0 && w[0].1 < w[1].1, "{pairs:?}");
        }
        for &(i, j) in pairs {
            assert_eq!(a[i as usize], b[j as usize]);
        }
    }

    #[test]
    fn the_same_lines_match_one_for_one() {
        let a = [1, 2, 3, 1, 2, 3];
        let p = matches(&a, &a, 8, false).unwrap();
        assert_eq!(p.len(), 6);
        check(&a, &a, &p);
    }

    #[test]
    fn requests_one_run_asks_more_are_left_out() {
        // A step with a sort's two buffers (9) at the larger batch.
        let a = [1, 2, 9, 9, 3, 1, 2, 9, 9, 3];
        let b = [1, 2, 3, 1, 2, 3];
        let p = matches(&a, &b, 8, false).unwrap();
        assert_eq!(p.len(), 6);
        check(&a, &b, &p);
        assert!(p.iter().all(|&(i, _)| a[i as usize] != 9));
        let q = matches(&b, &a, 8, false).unwrap();
        assert_eq!(q.len(), 6);
        check(&b, &a, &q);
        // Both ways at once: a workspace here, none there, and another there.
        let c = [1, 7, 2, 3, 1, 2, 8, 3];
        let p = matches(&a, &c, 16, false).unwrap();
        assert_eq!(p.len(), 6);
        check(&a, &c, &p);
    }

    #[test]
    fn past_the_bound_nothing_is_matched() {
        let a: Vec<u32> = (0..100).collect();
        let b: Vec<u32> = (100..200).collect();
        assert!(matches(&a, &b, 50, false).is_none());
        assert!(matches(&a, &b, 200, false).unwrap().is_empty());
        assert!(matches(&a, &[], 10, false).is_none());
        assert!(matches(&[], &[], 0, false).unwrap().is_empty());
    }

    #[test]
    fn a_failed_run_matches_a_prefix_and_the_rest_is_no_edit() {
        let a = [1, 2, 3, 1, 2, 3, 1, 2, 3];
        let b = [1, 2, 9, 3, 1];
        let p = matches(&a, &b, 2, true).unwrap();
        assert_eq!(p, vec![(0, 0), (1, 1), (2, 3), (3, 4)]);
        assert!(
            matches(&a, &b, 2, false).is_none(),
            "the rest of a is five edits"
        );
        assert_eq!(matches(&a, &[], 0, true).unwrap(), vec![]);
    }

    #[test]
    fn a_sort_before_the_gradient_leaves_the_gradient_paired_with_itself() {
        // One line (the backward thread): at 8, [act, grad, act]; at 16 the sort's two small buffers come first.
        let la = [0, 0, 0];
        let lb = [0, 0, 0, 0, 0];
        let sa = [8 << 20, 150 << 20, 4 << 20];
        let sb = [32 << 10, 64 << 10, 16 << 20, 150 << 20, 8 << 20];
        let p = matches(&la, &lb, 4, false).unwrap();
        assert_eq!(
            p,
            vec![(0, 0), (1, 1), (2, 2)],
            "Myers pairs as early as it can"
        );
        let q = refine((&la, &lb), (&sa, &sb), 2.0, p);
        assert_eq!(q, vec![(0, 2), (1, 3), (2, 4)]);
        // The other way round (the larger run first): the same pairs, flipped.
        let p = matches(&lb, &la, 4, false).unwrap();
        let q = refine((&lb, &la), (&sb, &sa), 0.5, p);
        assert_eq!(q, vec![(2, 0), (3, 1), (4, 2)]);
        // Blocks of other lines around it are kept.
        let la = [5, 0, 0, 7];
        let lb = [5, 0, 0, 0, 7];
        let sa = [1, 100, 1_000, 3];
        let sb = [1, 2, 200, 2_000, 3];
        let p = matches(&la, &lb, 4, false).unwrap();
        let q = refine((&la, &lb), (&sa, &sb), 2.0, p);
        assert_eq!(q, vec![(0, 0), (1, 2), (2, 3), (3, 4)]);
    }

    #[test]
    fn a_forged_history_costs_a_bounded_time() {
        // One line repeated on both sides with an edit at each end: every diagonal's snake runs long.
        let n = 400_000;
        let mut a = vec![1u32];
        a.extend(std::iter::repeat_n(0, n));
        let mut b = vec![2u32];
        b.extend(std::iter::repeat_n(0, n - 3_000));
        let t = std::time::Instant::now();
        assert!(matches(&a, &b, 3_000, false).is_none());
        assert!(t.elapsed().as_secs_f64() < 20.0);
    }

    #[test]
    fn random_edits_stay_matched_and_within_their_count() {
        // A seeded walk: sequences of a step cycle with insertions and deletions, matched both ways.
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |n: u64| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s % n
        };
        for _ in 0..200 {
            let a: Vec<u32> = (0..40 + rnd(60)).map(|i| (i % 7) as u32).collect();
            let mut b = a.clone();
            let edits = rnd(6) as usize;
            for _ in 0..edits {
                if rnd(2) == 0 && !b.is_empty() {
                    let at = rnd(b.len() as u64) as usize;
                    b.remove(at);
                } else {
                    let at = rnd(b.len() as u64 + 1) as usize;
                    b.insert(at, 7 + rnd(3) as u32);
                }
            }
            let p = matches(&a, &b, edits, false).expect("within its edits");
            check(&a, &b, &p);
            assert!(a.len() + b.len() - 2 * p.len() <= edits);
        }
    }
}

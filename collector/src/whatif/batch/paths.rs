//! Runs whose code paths differ a little: libraries choose their kernels by size (PyTorch's embedding backward
//! sorts past 3,072 indices and asks for its sort's buffers; cuDNN's algorithms ask a workspace or none), so a
//! run at another batch asks a few requests more or fewer among the same lines. The runs are matched by a shortest
//! edit script over their lines (Myers' O(ND) difference), bounded: past [`max_edits`] edits the runs take
//! different code paths and nothing is extrapolated.

/// Matched requests: (index in `a`, index in `b`), ascending in both.
pub type Pairs = Vec<(u32, u32)>;

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
    let snake = |mut x: i64, k: i64| {
        while x < n && x - k < m && a[x as usize] == b[(x - k) as usize] {
            x += 1;
        }
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

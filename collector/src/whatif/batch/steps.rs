//! A run's requests told apart into a setup and a repeating step cycle, from their lines alone: what the knob's
//! matching (`align`) and fits (`fit`: caps and switches the steps show) both read.

/// A run's requests as a setup and then `count` repeats of a cycle of `period` requests (the steps), the last
/// repeat ending with the history. A first step that differs from the rest (optimizer state made) is setup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Steps {
    pub setup: usize,
    pub period: usize,
    pub count: usize,
}

impl Steps {
    /// Where request `k` falls, in words.
    pub fn place(&self, k: usize) -> String {
        if k < self.setup || self.period == 0 {
            // Not "the setup" alone: a first step unlike the rest is here too, and a user reads setup as the
            // code before the loop (an H200 fit placed the first step's backward pass "in the setup").
            "before the steps repeat (the setup, or a first step unlike the rest)".to_string()
        } else {
            let i = (k - self.setup) / self.period + 1;
            format!("in repeat {i} of {} of the step cycle", self.count)
        }
    }
}

/// The setup and the cycle of a sequence of request lines: the longest suffix that holds at least two whole
/// repeats of its smallest period (a prefix function over the reversed sequence: linear time).
pub fn steps(lines: &[u32]) -> Steps {
    let n = lines.len();
    let r = |i: usize| lines[n - 1 - i];
    let mut pi = vec![0usize; n];
    for i in 1..n {
        let mut k = pi[i - 1];
        while k > 0 && r(i) != r(k) {
            k = pi[k - 1];
        }
        if r(i) == r(k) {
            k += 1;
        }
        pi[i] = k;
    }
    for l in (2..=n).rev() {
        let p = l - pi[l - 1];
        if l >= 2 * p {
            let count = l / p;
            return Steps {
                setup: n - count * p,
                period: p,
                count,
            };
        }
    }
    Steps {
        setup: n,
        period: 0,
        count: 0,
    }
}

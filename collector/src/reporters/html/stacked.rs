//! One device's timelines for the HTML page, downsampled as the replay goes, with no peak lost.
//!
//! The device's bytes in use (the job's) and the bytes of each part of it (a process, a call site) are
//! bucketed on one grid: buckets start 1 µs wide; when a change would land past [`MAX_BUCKETS`], neighbouring
//! pairs merge and the width doubles (as the report's timelines, `model/observe/timeline.rs`). Each bucket keeps:
//!
//! - the job's **maximum** in it (so the job's highest bucket is the report's peak, exactly);
//! - each part's value **at the moment of that maximum** (so the parts stack up to the job's line: a stacked
//!   chart that adds up, at the bucket's worst moment);
//! - each part's **own maximum** in it, where it is higher than its value at the job's maximum (a process can
//!   peak when the job does not: its own peak is kept too).
//!
//! The moment of the maximum is tracked lazily: a generation number is bumped when the job reaches a new
//! maximum in the open bucket, and a part reads its value at that moment only when it next changes (it did not
//! change in between) or when the bucket closes. A change costs O(1); closing a bucket costs O(parts).

/// The most buckets a timeline holds (then pairs merge).
pub const MAX_BUCKETS: usize = 2048;
/// Width of the first buckets.
pub const FIRST_BUCKET_NS: u64 = 1_000;

/// One part of the job's bytes (a process, a call site).
#[derive(Debug, Clone, Default)]
pub struct Part {
    /// Bytes now.
    pub cur: u64,
    /// Its value at the open bucket's maximum, valid when `seen` is the device's generation.
    at_peak: u64,
    seen: u64,
    /// Its own maximum in the open bucket.
    own: u64,
    /// Per closed bucket: the value at the job's maximum, and its own maximum.
    pub at: Vec<u64>,
    pub max: Vec<u64>,
}

impl Part {
    /// Its value at the open bucket's maximum is read before a change (it held `cur` since its last change).
    #[inline]
    fn sync(&mut self, generation: u64) {
        if self.seen != generation {
            self.at_peak = self.cur;
            self.seen = generation;
        }
    }

    fn close(&mut self, generation: u64) {
        self.sync(generation);
        self.at.push(self.at_peak);
        self.max.push(self.own.max(self.at_peak));
    }

    /// The new bucket starts at the value it holds.
    fn open(&mut self) {
        self.own = self.cur;
    }

    /// Takes the last closed bucket back as the open one (after a merge, a change can land in it).
    fn reopen(&mut self, generation: u64) {
        self.at_peak = self.at.pop().unwrap_or(self.cur);
        self.own = self.max.pop().unwrap_or(self.cur);
        self.seen = generation;
    }

    fn halve(&mut self, take_second: &[bool]) {
        self.at = self
            .at
            .chunks(2)
            .zip(take_second)
            .map(|(c, &second)| if second { c[1] } else { c[0] })
            .collect();
        self.max = self
            .max
            .chunks(2)
            .map(|c| c.iter().copied().max().unwrap_or(0))
            .collect();
    }

    /// The most it held in any bucket (its peak, when the timeline is finished).
    pub fn peak(&self) -> u64 {
        self.max.iter().copied().max().unwrap_or(0)
    }
}

/// A device's job timeline and its parts, on one grid.
#[derive(Debug, Clone)]
pub struct Stacked {
    pub width: u64,
    /// The job's maximum per closed bucket.
    pub job: Vec<u64>,
    pub parts: Vec<Part>,
    /// The job's bytes now.
    cur: u64,
    /// The open bucket: its index and the job's maximum in it (`None` before the first change).
    open: Option<usize>,
    open_max: u64,
    generation: u64,
    last_t: u64,
    /// The most buckets it holds: [`MAX_BUCKETS`], fewer when many devices share the budget
    /// (`timeline::cap_for`).
    cap: usize,
}

impl Default for Stacked {
    fn default() -> Self {
        Stacked {
            width: FIRST_BUCKET_NS,
            job: Vec::new(),
            parts: Vec::new(),
            cur: 0,
            open: None,
            open_max: 0,
            generation: 1,
            last_t: 0,
            cap: MAX_BUCKETS,
        }
    }
}

impl Stacked {
    /// At most `cap` buckets from its next change on (a power of two, at most [`MAX_BUCKETS`]).
    pub fn set_cap(&mut self, cap: usize) {
        self.cap = cap.clamp(2, MAX_BUCKETS);
    }

    /// A new part (holding nothing yet); its index.
    pub fn add_part(&mut self) -> usize {
        let n = self.job.len();
        let mut p = Part {
            at: vec![0; n],
            max: vec![0; n],
            ..Part::default()
        };
        p.seen = self.generation;
        self.parts.push(p);
        self.parts.len() - 1
    }

    /// Moves the open bucket to the one holding `t` (times never go backwards; later ones are clamped).
    #[inline]
    pub fn at_time(&mut self, t: u64) {
        let t = t.max(self.last_t);
        self.last_t = t;
        if let Some(i) = self.open {
            if t < (i as u64 + 1).saturating_mul(self.width) {
                return;
            }
        }
        self.advance(t);
    }

    #[cold]
    fn advance(&mut self, t: u64) {
        if let Some(_i) = self.open.take() {
            self.close();
        }
        let mut idx = t / self.width;
        while idx >= self.cap as u64 {
            self.halve();
            idx = t / self.width;
        }
        let idx = idx as usize;
        if idx < self.job.len() {
            // A merge put `t` in the last closed bucket: it is the open one again.
            self.open_max = self.job.pop().unwrap_or(self.cur);
            self.generation += 1;
            for p in &mut self.parts {
                p.reopen(self.generation);
            }
        } else {
            // Buckets with no change hold the value carried in.
            while self.job.len() < idx {
                self.job.push(self.cur);
                for p in &mut self.parts {
                    p.at.push(p.cur);
                    p.max.push(p.cur);
                }
            }
            self.open_max = self.cur;
            self.generation += 1;
            for p in &mut self.parts {
                p.open();
            }
        }
        self.open = Some(idx);
    }

    fn close(&mut self) {
        self.job.push(self.open_max);
        for p in &mut self.parts {
            p.close(self.generation);
        }
    }

    fn halve(&mut self) {
        // Each merged bucket takes the parts of the half whose job maximum is higher (the first on a tie).
        let take_second: Vec<bool> = self
            .job
            .chunks(2)
            .map(|c| c.len() == 2 && c[1] > c[0])
            .collect();
        self.job = self
            .job
            .chunks(2)
            .map(|c| c.iter().copied().max().unwrap_or(0))
            .collect();
        for p in &mut self.parts {
            p.halve(&take_second);
        }
        self.width = self.width.saturating_mul(2);
    }

    /// Part `part` holds `v` bytes now and the job `job` (call [`Stacked::at_time`] first).
    #[inline]
    pub fn set(&mut self, part: usize, v: u64, job: u64) {
        let p = &mut self.parts[part];
        p.sync(self.generation);
        p.cur = v;
        p.own = p.own.max(v);
        self.cur = job;
        if job > self.open_max {
            self.open_max = job;
            self.generation += 1;
            p.at_peak = v;
            p.seen = self.generation;
        }
    }

    /// Two parts change at once (a process's bytes and a call site's), the job then holding `job`.
    #[inline]
    pub fn set2(&mut self, a: usize, va: u64, b: usize, vb: u64, job: u64) {
        let g = self.generation;
        let pb = &mut self.parts[b];
        pb.sync(g);
        pb.cur = vb;
        pb.own = pb.own.max(vb);
        self.set(a, va, job);
        if self.generation != g {
            let pb = &mut self.parts[b];
            pb.at_peak = vb;
            pb.seen = self.generation;
        }
    }

    /// Closes the timeline at `end`: every bucket up to the one holding it is closed.
    pub fn finish(&mut self, end: u64) {
        if self.open.is_none() && self.cur == 0 {
            return;
        }
        self.at_time(end);
        if self.open.take().is_some() {
            self.close();
        }
    }

    /// The job's peak.
    pub fn peak(&self) -> u64 {
        self.job.iter().copied().max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny random walk: two parts, changes at random times; checks the invariants against a plain replay.
    #[test]
    fn parts_add_up_at_each_buckets_maximum_and_no_peak_is_lost() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..50 {
            let mut s = Stacked::default();
            let (a, b) = (s.add_part(), s.add_part());
            let (mut va, mut vb, mut t) = (0u64, 0u64, 0u64);
            let (mut peak, mut peak_a, mut peak_b) = (0, 0, 0);
            let steps = 100 + rnd(20_000);
            for _ in 0..steps {
                t += rnd(if round % 2 == 0 { 5_000 } else { 50_000_000 });
                s.at_time(t);
                if rnd(2) == 0 {
                    va = if rnd(3) == 0 { va / 2 } else { va + rnd(1000) };
                    s.set(a, va, va + vb);
                } else {
                    vb = if rnd(3) == 0 { vb / 2 } else { vb + rnd(1000) };
                    s.set(b, vb, va + vb);
                }
                peak = peak.max(va + vb);
                peak_a = peak_a.max(va);
                peak_b = peak_b.max(vb);
            }
            s.finish(t + 1);
            assert!(s.job.len() <= MAX_BUCKETS);
            assert_eq!(s.peak(), peak, "round {round}");
            assert_eq!(s.parts[a].peak(), peak_a, "round {round}");
            assert_eq!(s.parts[b].peak(), peak_b, "round {round}");
            for i in 0..s.job.len() {
                let (pa, pb) = (&s.parts[a], &s.parts[b]);
                assert_eq!(pa.at[i] + pb.at[i], s.job[i], "round {round} bucket {i}");
                assert!(pa.max[i] >= pa.at[i] && pb.max[i] >= pb.at[i]);
            }
        }
    }

    #[test]
    fn quiet_buckets_hold_the_value_carried_in() {
        let mut s = Stacked::default();
        let p = s.add_part();
        s.at_time(500);
        s.set(p, 10, 10);
        s.at_time(10_500);
        s.set(p, 0, 0);
        s.finish(20_000);
        assert_eq!(s.width, FIRST_BUCKET_NS);
        let mut want = vec![10; 11];
        want.extend([0; 10]);
        assert_eq!(s.job, want);
        assert_eq!(s.parts[p].at, s.job);
    }
}

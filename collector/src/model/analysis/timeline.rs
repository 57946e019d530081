//! A device's bytes in use over time, as the answer carries it: fixed-width buckets, each with its most and its
//! last (built by `observe/timeline.rs`).

/// One bucket: it covers `[t_ns, t_ns + bucket_ns)` relative to the trace start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub t_ns: u64,
    /// The most bytes in use at any moment in the bucket.
    pub max_bytes: u64,
    /// Bytes in use at the end of the bucket.
    pub last_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Timeline {
    /// Width of every bucket, ns.
    pub bucket_ns: u64,
    /// From the trace start, without gaps, up to the end of the trace.
    pub buckets: Vec<Bucket>,
}

impl Timeline {
    /// The most bytes in use at any moment of `[from, to)`, or `None` when no bucket covers any of it.
    pub fn max_between(&self, from: u64, to: u64) -> Option<u64> {
        if self.bucket_ns == 0 || self.buckets.is_empty() || to <= from {
            return None;
        }
        let first = (from / self.bucket_ns) as usize;
        let last = ((to - 1) / self.bucket_ns) as usize;
        self.buckets
            .get(first..=last.min(self.buckets.len() - 1))
            .and_then(|b| b.iter().map(|b| b.max_bytes).max())
    }
}

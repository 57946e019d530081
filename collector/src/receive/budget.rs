//! One budget for the bytes of unfinished frames, over every connection of the job. A process's records are
//! small (an out-of-memory record, the bridge's, a note); what a connection buffers beyond `FREE` bytes for
//! the frame it is receiving is drawn from one pool of `POOL` bytes. When the pool is spent, the largest
//! claim gives way: the connection that holds it drops its frame (refused, counted against its process) and
//! skips the rest of it as it comes. So a flood of large frames from any number of processes costs the
//! collector at most `POOL` plus `FREE` per connection, and a process that hoards costs its own records, not
//! another's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// What a connection may buffer for an unfinished frame without drawing on the pool.
pub(super) const FREE: usize = 64 << 10;
/// The pool, for all connections together.
pub(crate) const POOL: usize = 256 << 20;

/// The pool's size: `POOL`, or for the tests `VRAMTRACE_TEST_UNFINISHED_POOL` bytes.
fn pool_size() -> usize {
    static SIZE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SIZE.get_or_init(|| {
        std::env::var("VRAMTRACE_TEST_UNFINISHED_POOL")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(POOL)
    })
}

#[derive(Default)]
pub(crate) struct Budget {
    pool: Mutex<Pool>,
}

#[derive(Default)]
struct Pool {
    used: usize,
    next: u64,
    /// Per claim: bytes held, and the flag that tells its connection to give way.
    claims: HashMap<u64, (usize, Arc<AtomicBool>)>,
}

/// A connection's claim on the pool. Dropped: given back.
pub(super) struct Claim {
    budget: Arc<Budget>,
    id: u64,
    held: usize,
    evicted: Arc<AtomicBool>,
}

impl Budget {
    pub(super) fn claim(self: &Arc<Self>) -> Claim {
        let evicted = Arc::new(AtomicBool::new(false));
        let id = {
            let mut p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            p.next += 1;
            let id = p.next;
            p.claims.insert(id, (0, evicted.clone()));
            id
        };
        Claim {
            budget: self.clone(),
            id,
            held: 0,
            evicted,
        }
    }

    #[cfg(test)]
    fn used(&self) -> usize {
        self.pool.lock().unwrap().used
    }
}

impl Claim {
    /// The connection needs `bytes` of the pool in all for its unfinished frame (0 once it has none). Whether it
    /// has them: `false` when the pool is spent and no larger claim can give way, or when this claim was made
    /// to give way since it last asked. Either way the connection must drop its frame.
    pub(super) fn need(&mut self, bytes: usize) -> bool {
        let mut p = self.budget.pool.lock().unwrap_or_else(|e| e.into_inner());
        if self.evicted.swap(false, Ordering::AcqRel) {
            // Its bytes were taken back when it was told to give way.
            self.held = 0;
            if let Some(c) = p.claims.get_mut(&self.id) {
                c.0 = 0;
            }
            if bytes > 0 {
                return false;
            }
        }
        if bytes <= self.held {
            p.used -= self.held - bytes;
            self.held = bytes;
            if let Some(c) = p.claims.get_mut(&self.id) {
                c.0 = bytes;
            }
            return true;
        }
        let more = bytes - self.held;
        while p.used + more > pool_size() {
            // The largest other claim gives way, if it is larger than this one would be.
            let victim = p
                .claims
                .iter()
                .filter(|(id, (held, _))| **id != self.id && *held > bytes)
                .max_by_key(|(_, (held, _))| *held)
                .map(|(id, _)| *id);
            let Some(v) = victim else {
                return false;
            };
            if let Some(c) = p.claims.get_mut(&v) {
                let freed = std::mem::take(&mut c.0);
                c.1.store(true, Ordering::Release);
                p.used -= freed;
            }
        }
        p.used += more;
        self.held = bytes;
        if let Some(c) = p.claims.get_mut(&self.id) {
            c.0 = bytes;
        }
        true
    }

    /// Whether this claim was told to give way (its frame must be dropped).
    pub(super) fn evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut p = self.budget.pool.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((held, _)) = p.claims.remove(&self.id) {
            p.used -= held;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_share_one_pool_and_give_it_back() {
        let b = Arc::new(Budget::default());
        let mut a = b.claim();
        let mut c = b.claim();
        assert!(a.need(POOL / 2));
        assert!(c.need(POOL / 2));
        assert_eq!(b.used(), POOL);
        assert!(a.need(0));
        assert_eq!(b.used(), POOL / 2);
        drop(c);
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn the_largest_claim_gives_way_to_a_smaller_one() {
        let b = Arc::new(Budget::default());
        let mut hog = b.claim();
        let mut small = b.claim();
        assert!(hog.need(POOL - 10));
        // A small frame that does not fit: the hog gives way.
        assert!(small.need(1 << 20));
        assert!(hog.evicted());
        assert_eq!(b.used(), 1 << 20);
        // The hog learns it when it next asks, and its frame is dropped.
        assert!(!hog.need(POOL - 10));
        assert!(!hog.evicted());
        // Then it may ask afresh for a frame that fits.
        assert!(hog.need(10));
        assert_eq!(b.used(), (1 << 20) + 10);
    }

    #[test]
    fn a_claim_larger_than_every_other_is_refused_when_the_pool_is_spent() {
        let b = Arc::new(Budget::default());
        let mut many: Vec<Claim> = (0..4).map(|_| b.claim()).collect();
        for c in &mut many {
            assert!(c.need(POOL / 4));
        }
        let mut big = b.claim();
        assert!(!big.need(POOL / 2));
        assert!(many.iter().all(|c| !c.evicted()));
        assert_eq!(b.used(), POOL);
    }
}

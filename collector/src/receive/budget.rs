//! One budget for the memory connections buffer, over every connection of the job. A process's records are
//! small (an out-of-memory record, the bridge's, a note); each connection's buffer up to `FREE` bytes (its
//! read room and a small frame) is its own, and what it holds beyond that, for a large frame it is receiving,
//! is drawn from one pool of `POOL` bytes. A claim is what the connection's buffer holds or will need for the
//! frame it is receiving, whichever is more.
//!
//! When the pool is spent, the process (by the kernel's pid) that holds the most gives way, if it holds more
//! than the asking process would: its largest claim's connection drops its frame (refused, counted against
//! its process), skips the rest of it as it comes, and gives its buffer back (on its next turn: within the
//! receiver's longest nap, 100 ms). So a flood of large frames from any number of connections costs the
//! collector at most `POOL` plus `FREE` per connection, and a process that hoards, over one connection or
//! many, costs its own records, not another's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// What a connection's buffer may hold without drawing on the pool: its read room (twice the read size, as
/// the splitter keeps it) and a small frame.
pub(super) const FREE: usize = (2 * super::limits::READ) + (64 << 10);
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
    /// Per claim: its process (kernel pid; 0 when unknown), bytes held, and the flag that tells its connection
    /// to give way.
    claims: HashMap<u64, (u32, usize, Arc<AtomicBool>)>,
}

impl Pool {
    /// Bytes held by process `owner`'s claims.
    fn held_by(&self, owner: u32) -> usize {
        self.claims
            .values()
            .filter(|c| c.0 == owner)
            .map(|c| c.1)
            .sum()
    }
}

/// A connection's claim on the pool. Dropped: given back.
pub(super) struct Claim {
    budget: Arc<Budget>,
    id: u64,
    owner: u32,
    held: usize,
    evicted: Arc<AtomicBool>,
}

impl Budget {
    /// A claim of process `owner` (its kernel pid).
    pub(super) fn claim(self: &Arc<Self>, owner: u32) -> Claim {
        let evicted = Arc::new(AtomicBool::new(false));
        let id = {
            let mut p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            p.next += 1;
            let id = p.next;
            p.claims.insert(id, (owner, 0, evicted.clone()));
            id
        };
        Claim {
            budget: self.clone(),
            id,
            owner,
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
    /// The connection needs `bytes` of the pool in all (0 once it holds nothing beyond its own room). Whether
    /// it has them: `false` when the pool is spent and no process holding more can give way. A claim that was
    /// made to give way holds nothing from then on; asking again clears that.
    pub(super) fn need(&mut self, bytes: usize) -> bool {
        let mut p = self.budget.pool.lock().unwrap_or_else(|e| e.into_inner());
        if self.evicted.swap(false, Ordering::AcqRel) {
            // Its bytes were taken back when it was told to give way.
            self.held = 0;
        }
        if bytes <= self.held {
            p.used -= self.held - bytes;
            self.held = bytes;
            if let Some(c) = p.claims.get_mut(&self.id) {
                c.1 = bytes;
            }
            return true;
        }
        let more = bytes - self.held;
        while p.used + more > pool_size() {
            // The process holding the most gives way, if it holds more than this one would.
            let mine = p.held_by(self.owner) + more;
            let mut totals: HashMap<u32, usize> = HashMap::new();
            for (owner, held, _) in p.claims.values() {
                if *owner != self.owner {
                    *totals.entry(*owner).or_default() += held;
                }
            }
            let Some((victim, _)) = totals
                .into_iter()
                .filter(|(_, total)| *total > mine)
                .max_by_key(|(_, total)| *total)
            else {
                return false;
            };
            // Its largest claim.
            let Some(id) = p
                .claims
                .iter()
                .filter(|(_, c)| c.0 == victim && c.1 > 0)
                .max_by_key(|(_, c)| c.1)
                .map(|(id, _)| *id)
            else {
                return false;
            };
            if let Some(c) = p.claims.get_mut(&id) {
                let freed = std::mem::take(&mut c.1);
                c.2.store(true, Ordering::Release);
                p.used -= freed;
            }
        }
        p.used += more;
        self.held = bytes;
        if let Some(c) = p.claims.get_mut(&self.id) {
            c.1 = bytes;
        }
        true
    }

    /// Whether this claim was told to give way since it last asked (its frame must be dropped unless the pool
    /// grants it again).
    pub(super) fn evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut p = self.budget.pool.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, held, _)) = p.claims.remove(&self.id) {
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
        let mut a = b.claim(1);
        let mut c = b.claim(2);
        assert!(a.need(POOL / 2));
        assert!(c.need(POOL / 2));
        assert_eq!(b.used(), POOL);
        assert!(a.need(0));
        assert_eq!(b.used(), POOL / 2);
        drop(c);
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn the_process_holding_most_gives_way_to_a_smaller_one() {
        let b = Arc::new(Budget::default());
        let mut hog = b.claim(1);
        let mut small = b.claim(2);
        assert!(hog.need(POOL - 10));
        // A small frame that does not fit: the hog gives way.
        assert!(small.need(1 << 20));
        assert!(hog.evicted());
        assert_eq!(b.used(), 1 << 20);
        // Asked again, its large frame does not fit beside the small one, and the small one holds less.
        assert!(!hog.need(POOL - 10));
        assert!(!hog.evicted());
        // A frame that fits is granted.
        assert!(hog.need(10));
        assert_eq!(b.used(), (1 << 20) + 10);
    }

    #[test]
    fn a_process_hoarding_over_many_connections_gives_way_as_one() {
        // Sixty connections of one process at 4 MB each: an honest process's 10 MB record still gets room.
        let b = Arc::new(Budget::default());
        let mut hog: Vec<Claim> = (0..64).map(|_| b.claim(7)).collect();
        for c in &mut hog {
            assert!(c.need(POOL / 64));
        }
        let mut honest = b.claim(8);
        assert!(honest.need(10 << 20));
        assert!(hog.iter().filter(|c| c.evicted()).count() >= 1);
        assert!(b.used() <= POOL);
    }

    #[test]
    fn a_process_larger_than_every_other_is_refused_when_the_pool_is_spent() {
        let b = Arc::new(Budget::default());
        let mut many: Vec<Claim> = (0..4).map(|i| b.claim(i)).collect();
        for c in &mut many {
            assert!(c.need(POOL / 4));
        }
        let mut big = b.claim(9);
        assert!(!big.need(POOL / 2));
        assert!(many.iter().all(|c| !c.evicted()));
        assert_eq!(b.used(), POOL);
    }

    #[test]
    fn a_stale_give_way_does_not_refuse_a_frame_that_fits() {
        let b = Arc::new(Budget::default());
        let mut a = b.claim(1);
        let mut c = b.claim(2);
        assert!(a.need(POOL - 10));
        assert!(c.need(100));
        assert!(a.evicted());
        // `a`'s large frame was done meanwhile; its next, small one fits.
        assert!(a.need(50));
        assert!(!a.evicted());
    }
}

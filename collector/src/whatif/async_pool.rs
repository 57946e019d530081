//! `backend:cudaMallocAsync`, as far as it can be modelled. PyTorch hands every request to the driver's
//! stream-ordered pool, whose release threshold it sets to the maximum: the pool keeps what it once mapped until
//! a refused request makes PyTorch trim it (`cudaMemPoolTrimTo(0)`) and ask again, or `empty_cache()` trims it.
//! How the driver places blocks inside its pool is not public: the model assumes it packs them with no waste
//! beyond its 2 MiB granule, so its reserve is a lower bound of the real one, and reports say so.

use super::native::Outcome;
use crate::names::fasthash::FastMap;

const GRANULE: u64 = 2 << 20;
const ALIGN: u64 = 512;

fn granules(bytes: u64) -> u64 {
    bytes.div_ceil(GRANULE).saturating_mul(GRANULE)
}

#[derive(Default)]
pub struct AsyncPool {
    live: FastMap<u64, u64>,
    used: u64,
    reserved: u64,
    out: Outcome,
}

impl AsyncPool {
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    pub fn allocated(&self) -> u64 {
        self.used
    }

    pub fn outcome(&self) -> &Outcome {
        &self.out
    }

    pub fn malloc(&mut self, id: u64, size: u64, room: u64) -> bool {
        let size = size.max(1).div_ceil(ALIGN) * ALIGN;
        let used = self.used.saturating_add(size);
        let mut need = self.reserved.max(granules(used));
        if need > room {
            // Trim to what is in use and ask again.
            self.out.retries += 1;
            self.reserved = granules(self.used);
            need = self.reserved.max(granules(used));
            if need > room {
                self.out.failures += 1;
                return false;
            }
        }
        if need > self.reserved {
            self.out.segments_made += 1;
        }
        self.reserved = need;
        self.used = used;
        if let Some(old) = self.live.insert(id, size) {
            self.used = self.used.saturating_sub(old);
        }
        self.out.reserved_peak = self.out.reserved_peak.max(self.reserved);
        self.out.allocated_peak = self.out.allocated_peak.max(self.used);
        true
    }

    pub fn free(&mut self, id: u64) {
        if let Some(s) = self.live.remove(&id) {
            self.used = self.used.saturating_sub(s);
        }
    }

    pub fn release_cached(&mut self) {
        let trimmed = granules(self.used);
        if trimmed < self.reserved {
            self.out.segments_released += 1;
        }
        self.reserved = self.reserved.min(trimmed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_pool_keeps_its_high_water_until_a_refusal_or_empty_cache_trims_it() {
        let mut p = AsyncPool::default();
        // 3 MiB then 5 MiB: 8 MiB in use, 8 MiB reserved (granules of 2 MiB).
        assert!(p.malloc(1, 3 * MIB, u64::MAX));
        assert!(p.malloc(2, 5 * MIB, u64::MAX));
        assert_eq!(p.reserved(), 8 * MIB);
        // Freed: the pool keeps it.
        p.free(1);
        p.free(2);
        assert_eq!(p.reserved(), 8 * MIB);
        // 1 MiB more, within what is kept: no new memory.
        assert!(p.malloc(3, MIB, u64::MAX));
        assert_eq!((p.reserved(), p.outcome().segments_made), (8 * MIB, 2));
        // Under a 6 MiB room a 4 MiB request (5 MiB in use, 6 reserved after the trim) fits only after the trim.
        assert!(p.malloc(4, 4 * MIB, 6 * MIB));
        assert_eq!((p.reserved(), p.outcome().retries), (6 * MIB, 1));
        // 2 MiB more cannot fit 6 MiB even trimmed.
        assert!(!p.malloc(5, 2 * MIB, 6 * MIB));
        assert_eq!(p.outcome().failures, 1);
        p.free(4);
        p.release_cached();
        assert_eq!(p.reserved(), 2 * MIB);
    }
}

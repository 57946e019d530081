//! A hasher for device addresses and handles. SipHash costs more than the rest of the per-event work, and
//! addresses are aligned (their low bits are zero), so a plain multiply would put them all in one bucket: a
//! folded 128-bit multiply mixes high bits into low ones and low into high.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default, Clone, Copy)]
pub struct AddrHasher(u64);

#[inline]
fn fold(x: u64) -> u64 {
    let m = ((x ^ 0x243f_6a88_85a3_08d3) as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (m as u64) ^ ((m >> 64) as u64)
}

impl Hasher for AddrHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }

    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.0 = fold(self.0 ^ x);
    }

    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.write_u64(x as u64);
    }
}

pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<AddrHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn aligned_addresses_spread_over_low_bits() {
        let b = BuildHasherDefault::<AddrHasher>::default();
        let mut seen = std::collections::HashSet::new();
        for i in 0..1024u64 {
            seen.insert(b.hash_one(0x7f00_0000_0000u64 + (i << 21)) & 1023);
        }
        assert!(
            seen.len() > 550,
            "only {} distinct low-bit patterns",
            seen.len()
        );
    }
}

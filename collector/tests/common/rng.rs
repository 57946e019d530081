//! xorshift64*: deterministic, fast, good enough for generated traffic (the tests and the ingest benchmark).

pub struct Rng(pub u64);

#[allow(dead_code)]
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// In `0..n` (n below 2^32).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next() >> 32) * n) >> 32
    }

    /// True `pct` times in 100.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

//! A small seedable random generator shared by the randomized tests, so a
//! failure replays exactly from its printed seed.

use std::time::{SystemTime, UNIX_EPOCH};

/// The seed for a randomized test: `TB_FUZZ_SEED` to replay a run, else the
/// clock (odd, never 0). Tests print it.
pub fn seed() -> u64 {
    match std::env::var("TB_FUZZ_SEED") {
        Ok(s) => s.parse().expect("TB_FUZZ_SEED is a u64"),
        Err(_) => {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        }
    }
}

/// xorshift64*.
#[derive(Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (> 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True once in `one_in` times on average.
    pub fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }

    /// One of `items`.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    /// Up to `max` random bytes.
    pub fn bytes(&mut self, max: u64) -> Vec<u8> {
        (0..self.below(max + 1))
            .map(|_| self.next() as u8)
            .collect()
    }

    /// A u64 of random magnitude (log-uniform bit length).
    pub fn any(&mut self) -> u64 {
        let bits = self.below(65);
        if bits == 0 {
            0
        } else {
            self.next() >> (64 - bits)
        }
    }
}

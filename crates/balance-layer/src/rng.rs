//! A tiny per-clone pseudo-random generator (SplitMix64): no allocation, no lock, seedable.

use std::hash::{BuildHasher, Hasher};

/// SplitMix64: one add and a few multiplies per draw; plenty for choosing endpoints.
#[derive(Debug, Clone)]
pub(crate) struct Rng {
    state: u64,
}

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix(self.state)
    }

    /// A uniform index in `0..n` (`n > 0`), by multiply-and-keep-the-high-half (the bias is
    /// below `n / 2^64`).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// The SplitMix64 output function: a good 64-bit mixer.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed from the process's hash randomness (no extra dependency, no system call per use).
pub(crate) fn random_seed() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5EED);
    h.finish()
}

/// The golden-ratio Weyl sequence: the `k`-th point of a low-discrepancy sequence on `[0, 1)`,
/// scaled to `u64`. Consecutive points spread evenly, so shares drawn from it converge on
/// their targets within a few picks rather than with the square-root noise of random draws.
pub(crate) fn weyl(k: u64) -> u64 {
    k.wrapping_mul(GAMMA)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut rng = Rng::new(7);
        let mut seen = [0u32; 5];
        for _ in 0..10_000 {
            seen[rng.below(5)] += 1;
        }
        assert!(seen.iter().all(|&c| c > 1_800 && c < 2_200), "{seen:?}");
    }

    #[test]
    fn same_seed_same_sequence() {
        let (mut a, mut b) = (Rng::new(42), Rng::new(42));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }
}

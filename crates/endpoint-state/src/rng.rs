//! One small pseudo-random generator (SplitMix64) for spreading timers and choosing
//! endpoints: no allocation, no lock, seedable, no dependency. Not for secrets.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64: one add and a few multiplies per draw.
///
/// ```
/// use endpoint_state::rng::Rng;
/// let (mut a, mut b) = (Rng::new(7), Rng::new(7));
/// assert_eq!(a.next_u64(), b.next_u64());
/// assert!(a.below(10) < 10);
/// assert!((0.0..1.0).contains(&a.unit()));
/// ```
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    /// A generator seeded from the process's randomness.
    pub fn from_entropy() -> Self {
        Rng::new(random_seed())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix(self.state)
    }

    /// A uniform index in `0..n` (`n > 0`), by multiply-and-keep-the-high-half (the bias is
    /// below `n / 2^64`).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// A uniform number in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        to_unit(self.next_u64())
    }
}

/// The SplitMix64 output function: a good 64-bit mixer.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed from the process's hash randomness (no extra dependency, no system call per use).
pub fn random_seed() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(0x5EED);
    h.finish()
}

/// The golden-ratio Weyl sequence: the `k`-th point of a low-discrepancy sequence on `[0, 1)`,
/// scaled to `u64`. Consecutive points spread evenly, so shares drawn from it converge on
/// their targets within a few picks rather than with the square-root noise of random draws.
pub fn weyl(k: u64) -> u64 {
    k.wrapping_mul(GAMMA)
}

/// A uniform number in `[0, 1)` from a process-wide sequence (seeded once from the process's
/// randomness; one atomic add per draw). For spreading timers.
pub fn unit() -> f64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(random_seed);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    to_unit(mix(seed.wrapping_add(n.wrapping_mul(GAMMA))))
}

fn to_unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
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

    #[test]
    fn units_are_in_range_and_vary() {
        let xs: Vec<f64> = (0..1000).map(|_| unit()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((0.4..0.6).contains(&mean), "mean {mean}");
    }
}

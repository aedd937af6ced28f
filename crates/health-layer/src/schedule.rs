//! The arithmetic of the schedule: per-target delays after a check, and `Watch` re-subscription
//! backoff. Pure functions of their inputs and a random number in `[0, 1)`.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::config::WatchBackoff;

/// The delay before the next check after `failures` consecutive failures (0 after a success):
/// `interval` after a success, `interval × 2^(failures−1)` after failures, at most `max`; then
/// spread by ± `jitter` (with `unit` uniform in `[0, 1)`), still at most `max`.
pub(crate) fn check_delay(
    interval: Duration,
    max: Duration,
    failures: u32,
    jitter: f64,
    unit: f64,
) -> Duration {
    let base = match failures.saturating_sub(1) {
        0 => interval,
        exp if exp >= 32 => max,
        exp => interval.checked_mul(1u32 << exp).unwrap_or(max),
    };
    let base = base.min(max);
    spread(base, jitter, unit).min(max)
}

/// The wait before the `attempt`-th consecutive re-subscription (0 for the first):
/// `min(initial × multiplier^attempt, max)` ± `jitter`.
pub(crate) fn watch_delay(backoff: &WatchBackoff, attempt: u32, unit: f64) -> Duration {
    let max = backoff.max.as_secs_f64();
    let grown = backoff.initial.as_secs_f64() * backoff.multiplier.powi(attempt.min(1000) as i32);
    let base = if grown.is_finite() {
        grown.min(max)
    } else {
        max
    };
    spread(Duration::from_secs_f64(base), backoff.jitter, unit)
}

fn spread(base: Duration, jitter: f64, unit: f64) -> Duration {
    if jitter == 0.0 {
        return base;
    }
    let factor = 1.0 + jitter * (2.0 * unit - 1.0);
    Duration::from_secs_f64(base.as_secs_f64() * factor)
}

/// A uniform number in `[0, 1)`: a SplitMix64 sequence seeded once per process from the
/// standard library's random hasher keys. Good enough to spread timers; not for secrets.
pub(crate) fn unit_random() -> f64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(0x5eed);
        h.finish()
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut z = seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn check_delays_double_from_the_second_failure_and_cap() {
        let d = |f| check_delay(S(30), S(300), f, 0.0, 0.5);
        assert_eq!(
            [d(0), d(1), d(2), d(3), d(4), d(5), d(6), d(40), d(u32::MAX)],
            [
                S(30),
                S(30),
                S(60),
                S(120),
                S(240),
                S(300),
                S(300),
                S(300),
                S(300)
            ]
        );
    }

    #[test]
    fn check_jitter_stays_within_its_band_and_under_the_cap() {
        assert_eq!(check_delay(S(10), S(300), 0, 0.2, 0.0), S(8));
        assert_eq!(check_delay(S(10), S(300), 0, 0.2, 0.5), S(10));
        assert!(check_delay(S(10), S(300), 0, 0.2, 0.999_999) <= S(12));
        assert_eq!(check_delay(S(300), S(300), 0, 0.2, 0.999), S(300));
    }

    #[test]
    fn watch_delays_grow_by_1_6_and_cap_at_120_s() {
        let b = WatchBackoff {
            jitter: 0.0,
            ..WatchBackoff::default()
        };
        let ms = |a| watch_delay(&b, a, 0.5).as_millis();
        assert_eq!(
            [ms(0), ms(1), ms(2), ms(3), ms(10), ms(11), ms(1000)],
            [1000, 1600, 2560, 4096, 109_951, 120_000, 120_000]
        );
        let jittered = WatchBackoff::default();
        assert_eq!(watch_delay(&jittered, 0, 0.0).as_millis(), 800);
        assert_eq!(watch_delay(&jittered, 0, 0.5).as_millis(), 1000);
        assert!(watch_delay(&jittered, 0, 0.999_999) <= Duration::from_millis(1200));
    }

    #[test]
    fn unit_random_is_in_range_and_varies() {
        let xs: Vec<f64> = (0..1000).map(|_| unit_random()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((0.4..0.6).contains(&mean), "mean {mean}");
    }
}

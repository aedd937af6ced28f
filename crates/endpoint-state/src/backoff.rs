//! One exponential backoff for everything that waits longer after each failure: a breaker's
//! open periods, a health check's schedule after failures, a `Watch` re-subscription, a DNS
//! retry, the command-line probe's reconnections.

use std::time::Duration;

use crate::error::ConfigError;

/// The `n`-th wait in a row (from 0) is `d = min(initial × multiplierⁿ, max)`; with jitter `j`
/// it is drawn uniformly from `[d × (1 − j), min(d × (1 + j), max)]`. Every value saturates:
/// no multiplier, count or duration makes it panic.
///
/// ```
/// use std::time::Duration;
/// use endpoint_state::Backoff;
/// let b = Backoff::new(Duration::from_secs(1), 2.0, Duration::from_secs(30), 0.0);
/// let waits: Vec<u64> = (0..7).map(|n| b.nominal(n).as_secs()).collect();
/// assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The first wait (more than zero).
    pub initial: Duration,
    /// The growth per wait (finite, at least 1).
    pub multiplier: f64,
    /// The longest wait (at least `initial`).
    pub max: Duration,
    /// The random spread, a fraction of the wait in `[0, 1)`.
    pub jitter: f64,
}

impl Backoff {
    /// A backoff from its four settings (see [`validate`](Self::validate)).
    pub const fn new(initial: Duration, multiplier: f64, max: Duration, jitter: f64) -> Self {
        Backoff {
            initial,
            multiplier,
            max,
            jitter,
        }
    }

    /// The `n`-th wait before jitter: `min(initial × multiplierⁿ, max)`.
    pub fn nominal(&self, n: u32) -> Duration {
        let secs = self.initial.as_secs_f64() * self.multiplier.powi(n.min(10_000) as i32);
        if !secs.is_finite() || secs >= self.max.as_secs_f64() {
            self.max
        } else {
            Duration::try_from_secs_f64(secs).unwrap_or(self.max)
        }
    }

    /// The bounds the jittered `n`-th wait is drawn from.
    pub fn bounds(&self, n: u32) -> (Duration, Duration) {
        let d = self.nominal(n);
        let jitter = if self.jitter.is_finite() {
            self.jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        // In seconds as f64 and back, saturating: `Duration::MAX` (or any wait near it) must
        // not overflow on the way (`Duration::mul_f64` would panic).
        let scaled = |factor: f64| {
            Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(Duration::MAX)
        };
        let low = scaled(1.0 - jitter).min(d);
        let high = scaled(1.0 + jitter).min(self.max);
        (low, high.max(low))
    }

    /// The `n`-th wait, with `unit` uniform in `[0, 1)` (see [`crate::rng::unit`]).
    pub fn delay(&self, n: u32, unit: f64) -> Duration {
        let (low, high) = self.bounds(n);
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0)
        } else {
            0.5
        };
        let spread = Duration::try_from_secs_f64((high - low).as_secs_f64() * unit)
            .unwrap_or(high - low)
            .min(high - low);
        low.saturating_add(spread)
    }

    /// Checks every setting; the error names `config`'s field `prefix.<setting>`.
    pub fn validate(&self, config: &'static str, prefix: &str) -> Result<(), ConfigError> {
        let field = |name: &str| {
            if prefix.is_empty() {
                name.to_owned()
            } else {
                format!("{prefix}.{name}")
            }
        };
        if self.initial.is_zero() {
            return Err(ConfigError::new(
                config,
                field("initial"),
                format!("{:?}", self.initial),
                "more than zero",
            ));
        }
        if !(self.multiplier.is_finite() && self.multiplier >= 1.0) {
            return Err(ConfigError::new(
                config,
                field("multiplier"),
                self.multiplier,
                "a finite number of at least 1",
            ));
        }
        if self.max < self.initial {
            return Err(ConfigError::new(
                config,
                field("max"),
                format!("{:?}", self.max),
                format!("at least {}.initial ({:?})", prefix, self.initial),
            ));
        }
        if !(self.jitter.is_finite() && (0.0..1.0).contains(&self.jitter)) {
            return Err(ConfigError::new(
                config,
                field("jitter"),
                self.jitter,
                "a fraction in [0, 1)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn grows_caps_and_never_panics() {
        let b = Backoff::new(S(5), 2.0, S(60), 0.0);
        let waits: Vec<u64> = [0, 1, 2, 3, 4, 100, u32::MAX]
            .iter()
            .map(|n| b.nominal(*n).as_secs())
            .collect();
        assert_eq!(waits, [5, 10, 20, 40, 60, 60, 60]);
        let huge = Backoff::new(Duration::MAX, f64::MAX, Duration::MAX, 0.99);
        assert_eq!(huge.nominal(u32::MAX), Duration::MAX);
        let _ = huge.delay(u32::MAX, 0.999);
        // Any wait, however close to `Duration::MAX`, with any jitter (none included).
        for jitter in [0.0, 0.1, 0.5, 1.0] {
            let max = Backoff::new(Duration::MAX, 2.0, Duration::MAX, jitter);
            for unit in [0.0, 0.5, 0.999] {
                let d = max.delay(7, unit);
                assert!(d >= max.bounds(7).0 && d <= Duration::MAX);
            }
            let near = Backoff::new(Duration::MAX - S(1), 1.0, Duration::MAX, jitter);
            assert!(near.delay(0, 0.999) <= Duration::MAX);
        }
        let odd = Backoff::new(S(1), f64::NAN, S(10), f64::NAN);
        assert_eq!(odd.delay(3, f64::NAN), S(10));
    }

    #[test]
    fn jitter_stays_in_its_band_and_under_the_cap() {
        let b = Backoff::new(S(10), 2.0, S(300), 0.2);
        assert_eq!(b.delay(0, 0.0), S(8));
        assert_eq!(b.delay(0, 0.5), S(10));
        assert!(b.delay(0, 0.999_999) <= S(12));
        let capped = Backoff::new(S(300), 2.0, S(300), 0.2);
        assert_eq!(capped.bounds(0), (S(240), S(300)));
    }

    #[test]
    fn validation_names_the_field() {
        let bad = Backoff::new(S(5), 0.5, S(60), 0.1);
        let e = bad.validate("breaker", "open").unwrap_err();
        assert_eq!(e.field(), "open.multiplier");
        assert_eq!(e.value(), "0.5");
        let bad = Backoff::new(S(5), 2.0, S(1), 0.1);
        assert_eq!(
            bad.validate("health check", "watch_backoff")
                .unwrap_err()
                .field(),
            "watch_backoff.max"
        );
    }
}

//! The breaker's configuration: a plain struct with defaults and builder-style setters,
//! validated once when the layer is built.

use std::time::Duration;

use endpoint_state::FailureCodes;

use crate::error::ConfigError;

/// The most calls a count window may hold (its counters are packed in one atomic word).
pub const MAX_COUNT_WINDOW: u32 = 1_000_000;
/// The most half-open permits (they are packed in the breaker's state word).
pub const MAX_HALF_OPEN_PERMITS: u32 = 10_000;
/// The shortest time window: it is cut into [`TIME_WINDOW_BUCKETS`] buckets.
pub const MIN_TIME_WINDOW: Duration = Duration::from_millis(10);
/// The longest time window.
pub const MAX_TIME_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);
/// How many buckets a time window is cut into: it slides by a tenth of its length.
pub const TIME_WINDOW_BUCKETS: u32 = 10;
/// The most calls one time-window bucket counts; later calls in the same bucket are not
/// counted, so the rate is then sampled from the bucket's first calls.
pub const MAX_CALLS_PER_BUCKET: u32 = u16::MAX as u32;

/// What trips the breaker on failures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TripPolicy {
    /// Trip after this many failures in a row (any success resets the count). The default,
    /// with 5.
    ConsecutiveFailures(u32),
    /// Trip when the share of failures among the calls in `window` reaches `threshold`,
    /// judged only once the window holds at least `min_calls` calls.
    FailureRate {
        /// The share of failed calls that trips, in `(0, 1]` (`0.5` is 50 %).
        threshold: f64,
        /// Which calls are counted.
        window: Window,
        /// No verdict below this many calls in the window (at least 1).
        min_calls: u32,
    },
}

impl Default for TripPolicy {
    fn default() -> Self {
        TripPolicy::ConsecutiveFailures(5)
    }
}

/// The calls a rate is computed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// The last `n` calls (1 ..= [`MAX_COUNT_WINDOW`]).
    Count(u32),
    /// The calls that ended within the last `duration`
    /// ([`MIN_TIME_WINDOW`] ..= [`MAX_TIME_WINDOW`]). The window slides by a tenth of its
    /// length, so a call counts for between 0.9 and 1.0 of `duration` after it ends. One
    /// tenth counts at most [`MAX_CALLS_PER_BUCKET`] calls (beyond that the rate is sampled).
    Time(Duration),
}

/// The optional slow-call policy: trip when too many calls take too long, even if they
/// succeed (a backend that is drowning often answers, slowly, before it fails).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlowCalls {
    /// A call is slow when it takes at least this long, from `call` to its final status (for
    /// a stream, the whole stream). Must be more than zero.
    pub threshold: Duration,
    /// The share of slow calls that trips, in `(0, 1]`.
    pub rate: f64,
    /// Which calls are counted.
    pub window: Window,
    /// No verdict below this many calls in the window (at least 1).
    pub min_calls: u32,
}

impl SlowCalls {
    /// Trip when at least `rate` of the last 100 calls (once there are 10) took `threshold`
    /// or more.
    pub fn new(threshold: Duration, rate: f64) -> Self {
        SlowCalls {
            threshold,
            rate,
            window: Window::Count(100),
            min_calls: 10,
        }
    }

    /// Count over `window` instead.
    #[must_use]
    pub fn window(mut self, window: Window) -> Self {
        self.window = window;
        self
    }

    /// No verdict below `min_calls` calls.
    #[must_use]
    pub fn min_calls(mut self, min_calls: u32) -> Self {
        self.min_calls = min_calls;
        self
    }
}

/// How long the breaker stays open after a trip.
///
/// The `n`-th open period in a row (without a close in between) lasts
/// `d = min(base × multiplierⁿ⁻¹, max)`; with jitter `j` it is drawn uniformly from
/// `[d × (1 − j), min(d × (1 + j), max)]`. A probe that succeeds closes the breaker and
/// starts the sequence again from `base`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpenPeriod {
    /// The first open period (more than zero). Default 5 s.
    pub base: Duration,
    /// Growth between repeated trips (finite, at least 1.0). Default 2.0.
    pub multiplier: f64,
    /// The cap (at least `base`). Default 60 s.
    pub max: Duration,
    /// The jitter fraction, in `[0, 1)`. Default 0.1.
    pub jitter: f64,
}

impl Default for OpenPeriod {
    fn default() -> Self {
        OpenPeriod {
            base: Duration::from_secs(5),
            multiplier: 2.0,
            max: Duration::from_secs(60),
            jitter: 0.1,
        }
    }
}

impl OpenPeriod {
    /// The nominal period (before jitter) of the `trips`-th open period in a row (from 1).
    pub fn nominal(&self, trips: u32) -> Duration {
        let exp = trips.saturating_sub(1).min(1_000) as i32;
        let secs = self.base.as_secs_f64() * self.multiplier.powi(exp);
        if !secs.is_finite() || secs >= self.max.as_secs_f64() {
            self.max
        } else {
            Duration::from_secs_f64(secs)
        }
    }

    /// The bounds the jittered `trips`-th period is drawn from.
    pub fn bounds(&self, trips: u32) -> (Duration, Duration) {
        let d = self.nominal(trips);
        let low = d.mul_f64(1.0 - self.jitter);
        let high = d.mul_f64(1.0 + self.jitter).min(self.max);
        (low, high.max(low))
    }

    /// Draws the `trips`-th period, with `unit` uniform in `[0, 1)`.
    pub(crate) fn draw(&self, trips: u32, unit: f64) -> Duration {
        let (low, high) = self.bounds(trips);
        low + (high - low).mul_f64(unit.clamp(0.0, 1.0))
    }
}

/// What a call meets while the breaker refuses calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WhenOpen {
    /// `poll_ready` stays `Pending` — with a timer that fires when the breaker goes half-open,
    /// and a waker on the endpoint's card — so that a balancer routes around the endpoint.
    /// Never an error: tower treats that as final. The default.
    #[default]
    Wait,
    /// `poll_ready` is ready at once and the call fails with [`BreakerOpen`](crate::BreakerOpen),
    /// which a generated tonic client sees as `UNAVAILABLE` naming the target and when it
    /// will be retried. For a single channel with no alternative to route to.
    FailFast,
}

/// The breaker's configuration.
///
/// ```
/// use std::time::Duration;
/// use breaker_layer::{BreakerConfig, SlowCalls, Window, WhenOpen};
///
/// let config = BreakerConfig::default()
///     .failure_rate(0.5, Window::Time(Duration::from_secs(30)), 20)
///     .slow_calls(SlowCalls::new(Duration::from_secs(2), 0.8))
///     .open_base(Duration::from_secs(1))
///     .open_max(Duration::from_secs(30))
///     .half_open_permits(2)
///     .when_open(WhenOpen::FailFast);
/// assert!(config.validate().is_ok());
///
/// let bad = BreakerConfig::default().open_jitter(1.5);
/// assert_eq!(
///     bad.validate().unwrap_err().to_string(),
///     "invalid breaker configuration: open.jitter = 1.5 (expected a fraction in [0, 1))",
/// );
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    /// What trips the breaker on failures. Default: 5 consecutive failures.
    pub trip: TripPolicy,
    /// Optional slow-call policy. Default: none.
    pub slow_calls: Option<SlowCalls>,
    /// How long the breaker stays open. Default: 5 s, × 2 per repeated trip, at most 60 s,
    /// jitter 0.1.
    pub open: OpenPeriod,
    /// How many probe calls half-open admits (1 ..= [`MAX_HALF_OPEN_PERMITS`]); the breaker
    /// closes once that many have succeeded and reopens at the first failure. Default 1.
    pub half_open_permits: u32,
    /// Which gRPC codes count as failures. Default: [`FailureCodes::breaker_default`]
    /// (`UNAVAILABLE`, `DEADLINE_EXCEEDED`, `INTERNAL`, `UNKNOWN`, `DATA_LOSS`,
    /// `RESOURCE_EXHAUSTED`; transport errors count as `UNAVAILABLE`, local timeouts as
    /// `DEADLINE_EXCEEDED`).
    pub failure_codes: FailureCodes,
    /// What a call meets while the breaker refuses calls. Default: [`WhenOpen::Wait`].
    pub when_open: WhenOpen,
    /// Capacity of the transition event channel (at least 1). Default 64. A subscriber that
    /// falls further behind loses the oldest events and is told how many it missed.
    pub events_capacity: usize,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            trip: TripPolicy::default(),
            slow_calls: None,
            open: OpenPeriod::default(),
            half_open_permits: 1,
            failure_codes: FailureCodes::breaker_default(),
            when_open: WhenOpen::Wait,
            events_capacity: 64,
        }
    }
}

impl BreakerConfig {
    /// Trip after `n` failures in a row.
    #[must_use]
    pub fn consecutive_failures(mut self, n: u32) -> Self {
        self.trip = TripPolicy::ConsecutiveFailures(n);
        self
    }

    /// Trip when the share of failures in `window` reaches `threshold`, once the window holds
    /// `min_calls` calls.
    #[must_use]
    pub fn failure_rate(mut self, threshold: f64, window: Window, min_calls: u32) -> Self {
        self.trip = TripPolicy::FailureRate {
            threshold,
            window,
            min_calls,
        };
        self
    }

    /// Also trip on slow calls.
    #[must_use]
    pub fn slow_calls(mut self, slow: SlowCalls) -> Self {
        self.slow_calls = Some(slow);
        self
    }

    /// The whole open-period schedule.
    #[must_use]
    pub fn open_period(mut self, open: OpenPeriod) -> Self {
        self.open = open;
        self
    }

    /// The first open period.
    #[must_use]
    pub fn open_base(mut self, base: Duration) -> Self {
        self.open.base = base;
        self
    }

    /// Growth of the open period between repeated trips.
    #[must_use]
    pub fn open_multiplier(mut self, multiplier: f64) -> Self {
        self.open.multiplier = multiplier;
        self
    }

    /// The longest open period.
    #[must_use]
    pub fn open_max(mut self, max: Duration) -> Self {
        self.open.max = max;
        self
    }

    /// The open period's jitter fraction.
    #[must_use]
    pub fn open_jitter(mut self, jitter: f64) -> Self {
        self.open.jitter = jitter;
        self
    }

    /// How many probe calls half-open admits.
    #[must_use]
    pub fn half_open_permits(mut self, permits: u32) -> Self {
        self.half_open_permits = permits;
        self
    }

    /// Which gRPC codes count as failures.
    #[must_use]
    pub fn failure_codes(mut self, codes: FailureCodes) -> Self {
        self.failure_codes = codes;
        self
    }

    /// What a call meets while the breaker refuses calls.
    #[must_use]
    pub fn when_open(mut self, when_open: WhenOpen) -> Self {
        self.when_open = when_open;
        self
    }

    /// Capacity of the transition event channel.
    #[must_use]
    pub fn events_capacity(mut self, capacity: usize) -> Self {
        self.events_capacity = capacity;
        self
    }

    /// Checks every field; the error names the first bad one and its value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.trip {
            TripPolicy::ConsecutiveFailures(n) => {
                if n == 0 {
                    return Err(ConfigError::new(
                        "trip.consecutive_failures",
                        n,
                        "at least 1",
                    ));
                }
            }
            TripPolicy::FailureRate {
                threshold,
                window,
                min_calls,
            } => {
                check_fraction("trip.threshold", threshold)?;
                check_window("trip.window", window)?;
                check_min_calls("trip.min_calls", min_calls, window)?;
            }
        }
        if let Some(slow) = &self.slow_calls {
            if slow.threshold.is_zero() {
                return Err(ConfigError::new(
                    "slow_calls.threshold",
                    format_args!("{:?}", slow.threshold),
                    "more than zero",
                ));
            }
            check_fraction("slow_calls.rate", slow.rate)?;
            check_window("slow_calls.window", slow.window)?;
            check_min_calls("slow_calls.min_calls", slow.min_calls, slow.window)?;
        }
        let open = &self.open;
        if open.base.is_zero() {
            return Err(ConfigError::new(
                "open.base",
                format_args!("{:?}", open.base),
                "more than zero",
            ));
        }
        if !open.multiplier.is_finite() || open.multiplier < 1.0 {
            return Err(ConfigError::new(
                "open.multiplier",
                open.multiplier,
                "a finite number of at least 1.0",
            ));
        }
        if open.max < open.base {
            return Err(ConfigError::new(
                "open.max",
                format_args!("{:?}", open.max),
                "at least open.base",
            ));
        }
        if !(0.0..1.0).contains(&open.jitter) {
            return Err(ConfigError::new(
                "open.jitter",
                open.jitter,
                "a fraction in [0, 1)",
            ));
        }
        if !(1..=MAX_HALF_OPEN_PERMITS).contains(&self.half_open_permits) {
            return Err(ConfigError::new(
                "half_open_permits",
                self.half_open_permits,
                "between 1 and 10000",
            ));
        }
        if self.failure_codes == FailureCodes::NONE && self.slow_calls.is_none() {
            return Err(ConfigError::new(
                "failure_codes",
                "{}",
                "at least one code (an empty set never trips; disable the breaker instead)",
            ));
        }
        if self.failure_codes.contains(tonic::Code::Ok) {
            return Err(ConfigError::new(
                "failure_codes",
                format_args!("{:?}", self.failure_codes),
                "a set without OK",
            ));
        }
        if self.events_capacity == 0 {
            return Err(ConfigError::new("events_capacity", 0, "at least 1"));
        }
        Ok(())
    }
}

fn check_fraction(field: &'static str, value: f64) -> Result<(), ConfigError> {
    if value.is_finite() && value > 0.0 && value <= 1.0 {
        Ok(())
    } else {
        Err(ConfigError::new(field, value, "a fraction in (0, 1]"))
    }
}

fn check_window(field: &'static str, window: Window) -> Result<(), ConfigError> {
    match window {
        Window::Count(n) if n == 0 || n > MAX_COUNT_WINDOW => Err(ConfigError::new(
            field,
            format_args!("Count({n})"),
            "a count between 1 and 1000000",
        )),
        Window::Time(d) if !(MIN_TIME_WINDOW..=MAX_TIME_WINDOW).contains(&d) => {
            Err(ConfigError::new(
                field,
                format_args!("Time({d:?})"),
                "a duration between 10ms and 24h",
            ))
        }
        _ => Ok(()),
    }
}

fn check_min_calls(field: &'static str, min_calls: u32, window: Window) -> Result<(), ConfigError> {
    if min_calls == 0 {
        return Err(ConfigError::new(field, min_calls, "at least 1"));
    }
    if let Window::Count(n) = window
        && min_calls > n
    {
        return Err(ConfigError::new(
            field,
            min_calls,
            "at most the window's count (the window never holds more calls)",
        ));
    }
    Ok(())
}

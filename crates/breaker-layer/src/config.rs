//! The breaker's configuration: a plain struct with defaults and builder-style setters,
//! validated once when the layer is built.

use std::time::Duration;

use endpoint_state::{Backoff, ConfigError, FailureCodes};

use crate::trip::{
    MAX_COUNT_WINDOW, MAX_TIME_WINDOW, MIN_TIME_WINDOW, SlowCalls, TripPolicy, Window,
};

/// The configuration's name in its errors (`invalid breaker configuration: ...`).
const CONFIG: &str = "breaker";

/// The most half-open permits (they are packed in the breaker's state word).
pub const MAX_HALF_OPEN_PERMITS: u32 = 10_000;

/// The default open period: 5 s, × 2 per repeated trip, at most 60 s, jitter 0.1.
const OPEN: Backoff = Backoff::new(Duration::from_secs(5), 2.0, Duration::from_secs(60), 0.1);

/// What a call meets while the breaker refuses calls.
///
/// In a configuration file (feature `serde`): `"wait"` or `"fail_fast"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum WhenOpen {
    /// `poll_ready` stays `Pending` — with a timer that fires when the breaker goes half-open,
    /// and a waker on the endpoint's card — so that a balancer routes around the endpoint.
    /// Never an error: tower treats that as final. The default.
    #[default]
    Wait,
    /// `poll_ready` is ready at once and the call fails with
    /// [`BreakerOpen`](crate::error::BreakerOpen), which a generated tonic client sees as
    /// `UNAVAILABLE` naming the target and when it will be retried. For a single channel with
    /// no alternative to route to.
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
///     "invalid breaker configuration: open.jitter = 1.5: expected a fraction in [0, 1)",
/// );
/// ```
///
/// # In a configuration file
///
/// With the feature `serde`, the configuration reads from any serde format. Every field is
/// optional (an unset one keeps its default, so does each unset field of `open`), unknown
/// fields are refused, durations are written as humans write them (`"250ms"`, `"5s"`) and
/// codes by their gRPC names. The values are checked when the layer is built, as those set in
/// code are.
///
/// ```toml
/// half_open_permits = 2
/// failure_codes = ["UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL"]
/// when_open = "wait"            # or "fail_fast"
///
/// [trip]                        # consecutive_failures = 5, or a rate:
/// threshold = 0.5
/// window = "30s"                # or a number of calls: 100
/// min_calls = 20
///
/// [slow_calls]
/// threshold = "2s"
/// rate = 0.8
///
/// [open]                        # base × multiplierⁿ, capped at max, jittered
/// base = "1s"
/// multiplier = 2.0
/// max = "30s"
/// jitter = 0.1
/// ```
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct BreakerConfig {
    /// What trips the breaker on failures. Default: 5 consecutive failures.
    pub trip: TripPolicy,
    /// Optional slow-call policy. Default: none.
    pub slow_calls: Option<SlowCalls>,
    /// How long the breaker stays open: the `n`-th open period in a row (without a close in
    /// between) is the backoff's `n`-th wait, `min(base × multiplierⁿ⁻¹, max)`, jittered. A
    /// probe that succeeds closes the breaker and starts the sequence again from the base.
    /// Default: 5 s, × 2 per repeated trip, at most 60 s, jitter 0.1.
    ///
    /// The backoff's `initial` is the first open period, set with
    /// [`open_base`](Self::open_base) and written `base` in a configuration file.
    #[cfg_attr(feature = "serde", serde(deserialize_with = "open_period"))]
    pub open: Backoff,
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
    /// Capacity of the breaker's event channel (at least 1). Default 64. A subscriber that
    /// falls further behind loses the oldest events and is told how many it missed.
    pub events_capacity: usize,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            trip: TripPolicy::default(),
            slow_calls: None,
            open: OPEN,
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

    /// The whole open-period schedule (its `initial` is the first open period).
    #[must_use]
    pub fn open_period(mut self, open: Backoff) -> Self {
        self.open = open;
        self
    }

    /// The first open period.
    #[must_use]
    pub fn open_base(mut self, base: Duration) -> Self {
        self.open.initial = base;
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

    /// Capacity of the breaker's event channel.
    #[must_use]
    pub fn events_capacity(mut self, capacity: usize) -> Self {
        self.events_capacity = capacity;
        self
    }

    /// Checks every field; the error names the first bad one (as a path: `open.jitter`) and
    /// its value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.trip {
            TripPolicy::ConsecutiveFailures(n) => {
                if n == 0 {
                    return Err(ConfigError::new(
                        CONFIG,
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
            } => check_rate(("trip", "threshold"), threshold, window, min_calls)?,
        }
        if let Some(slow) = &self.slow_calls {
            if slow.threshold.is_zero() {
                return Err(ConfigError::new(
                    CONFIG,
                    "slow_calls.threshold",
                    format_args!("{:?}", slow.threshold),
                    "more than zero",
                ));
            }
            check_rate(
                ("slow_calls", "rate"),
                slow.rate,
                slow.window,
                slow.min_calls,
            )?;
        }
        validate_open(&self.open)?;
        if !(1..=MAX_HALF_OPEN_PERMITS).contains(&self.half_open_permits) {
            return Err(ConfigError::new(
                CONFIG,
                "half_open_permits",
                self.half_open_permits,
                "between 1 and 10000",
            ));
        }
        if self.failure_codes == FailureCodes::NONE && self.slow_calls.is_none() {
            return Err(ConfigError::new(
                CONFIG,
                "failure_codes",
                "{}",
                "at least one code (an empty set never trips; disable the breaker instead)",
            ));
        }
        if self.failure_codes.contains(tonic::Code::Ok) {
            return Err(ConfigError::new(
                CONFIG,
                "failure_codes",
                format_args!("{:?}", self.failure_codes),
                "a set without OK",
            ));
        }
        if self.events_capacity == 0 {
            return Err(ConfigError::new(CONFIG, "events_capacity", 0, "at least 1"));
        }
        Ok(())
    }
}

/// The open period is the core's [`Backoff`], checked by it; its first wait is the breaker's
/// `base` (`open.base`), which the backoff calls `initial`.
fn validate_open(open: &Backoff) -> Result<(), ConfigError> {
    open.validate(CONFIG, "open").map_err(|e| {
        let field = e.field().replace("open.initial", "open.base");
        let expected = e.expected().replace("open.initial", "open.base");
        ConfigError::new(CONFIG, field, e.value(), expected)
    })
}

/// A rate's share, window and minimum, named under `prefix` (`(trip, threshold)`,
/// `(slow_calls, rate)`).
fn check_rate(
    (prefix, share_name): (&str, &str),
    share: f64,
    window: Window,
    min_calls: u32,
) -> Result<(), ConfigError> {
    let field = |name: &str| format!("{prefix}.{name}");
    if !(share.is_finite() && share > 0.0 && share <= 1.0) {
        return Err(ConfigError::new(
            CONFIG,
            field(share_name),
            share,
            "a fraction in (0, 1]",
        ));
    }
    match window {
        Window::Count(n) if n == 0 || n > MAX_COUNT_WINDOW => {
            return Err(ConfigError::new(
                CONFIG,
                field("window"),
                format_args!("Count({n})"),
                "a count between 1 and 1000000",
            ));
        }
        Window::Time(d) if !(MIN_TIME_WINDOW..=MAX_TIME_WINDOW).contains(&d) => {
            return Err(ConfigError::new(
                CONFIG,
                field("window"),
                format_args!("Time({d:?})"),
                "a duration between 10ms and 24h",
            ));
        }
        _ => {}
    }
    if min_calls == 0 {
        return Err(ConfigError::new(
            CONFIG,
            field("min_calls"),
            min_calls,
            "at least 1",
        ));
    }
    if let Window::Count(n) = window
        && min_calls > n
    {
        return Err(ConfigError::new(
            CONFIG,
            field("min_calls"),
            min_calls,
            "at most the window's count (the window never holds more calls)",
        ));
    }
    Ok(())
}

/// `[open]` as written: `base`, `multiplier`, `max`, `jitter`, each defaulting on its own.
#[cfg(feature = "serde")]
fn open_period<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Backoff, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Open {
        #[serde(with = "humantime_serde")]
        base: Duration,
        multiplier: f64,
        #[serde(with = "humantime_serde")]
        max: Duration,
        jitter: f64,
    }
    impl Default for Open {
        fn default() -> Self {
            Open {
                base: OPEN.initial,
                multiplier: OPEN.multiplier,
                max: OPEN.max,
                jitter: OPEN.jitter,
            }
        }
    }
    let o = <Open as serde::Deserialize>::deserialize(d)?;
    Ok(Backoff::new(o.base, o.multiplier, o.max, o.jitter))
}

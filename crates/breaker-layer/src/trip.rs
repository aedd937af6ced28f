//! What trips the breaker: a run of failures or a failure rate ([`TripPolicy`]), the calls a
//! rate is computed over ([`Window`]), and the optional slow-call rate ([`SlowCalls`]).

use std::time::Duration;

/// The most calls a count window may hold (its counters are packed in one atomic word).
pub const MAX_COUNT_WINDOW: u32 = 1_000_000;
/// The shortest time window: it is cut into [`TIME_WINDOW_BUCKETS`] buckets.
pub const MIN_TIME_WINDOW: Duration = Duration::from_millis(10);
/// The longest time window.
pub const MAX_TIME_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);
/// How many buckets a time window is cut into: it slides by a tenth of its length.
pub const TIME_WINDOW_BUCKETS: u32 = 10;
/// The most calls one time-window bucket counts; later calls in the same bucket are not
/// counted, so the rate is then sampled from the bucket's first calls.
pub const MAX_CALLS_PER_BUCKET: u32 = u16::MAX as u32;

/// The window of a rate when none is given: the last 100 calls.
pub(crate) const DEFAULT_WINDOW: Window = Window::Count(100);
/// The minimum number of calls of a rate when none is given.
pub(crate) const DEFAULT_MIN_CALLS: u32 = 10;

/// What trips the breaker on failures.
///
/// In a configuration file (feature `serde`), either `consecutive_failures = 5`, or a failure
/// rate: `threshold = 0.5` with an optional `window` (a number of calls, `100`, or a duration,
/// `"30s"`; default 100 calls) and `min_calls` (default 10) — not both.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(try_from = "de::TripSection")
)]
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
///
/// In a configuration file (feature `serde`): a number of calls (`100`) or a duration
/// (`"30s"`).
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
///
/// In a configuration file (feature `serde`): `threshold` and `rate` are required, `window`
/// and `min_calls` default as in [`SlowCalls::new`].
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct SlowCalls {
    /// A call is slow when it takes at least this long, from `call` to its final status (for
    /// a stream, the whole stream). Must be more than zero.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub threshold: Duration,
    /// The share of slow calls that trips, in `(0, 1]`.
    pub rate: f64,
    /// Which calls are counted.
    #[cfg_attr(feature = "serde", serde(default = "de::default_window"))]
    pub window: Window,
    /// No verdict below this many calls in the window (at least 1).
    #[cfg_attr(feature = "serde", serde(default = "de::default_min_calls"))]
    pub min_calls: u32,
}

impl SlowCalls {
    /// Trip when at least `rate` of the last 100 calls (once there are 10) took `threshold`
    /// or more.
    pub fn new(threshold: Duration, rate: f64) -> Self {
        SlowCalls {
            threshold,
            rate,
            window: DEFAULT_WINDOW,
            min_calls: DEFAULT_MIN_CALLS,
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

/// The configuration file's form of the trip policy and the window.
#[cfg(feature = "serde")]
mod de {
    use std::fmt;

    use serde::de::{self, Deserializer, Visitor};

    use super::{DEFAULT_MIN_CALLS, DEFAULT_WINDOW, TripPolicy, Window};

    pub(super) fn default_window() -> Window {
        DEFAULT_WINDOW
    }

    pub(super) fn default_min_calls() -> u32 {
        DEFAULT_MIN_CALLS
    }

    /// `[trip]` as written: a run of failures, or a rate.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct TripSection {
        #[serde(default)]
        consecutive_failures: Option<u32>,
        #[serde(default)]
        threshold: Option<f64>,
        #[serde(default)]
        window: Option<Window>,
        #[serde(default)]
        min_calls: Option<u32>,
    }

    impl TryFrom<TripSection> for TripPolicy {
        type Error = &'static str;

        fn try_from(t: TripSection) -> Result<Self, Self::Error> {
            let rate = t.threshold.is_some() || t.window.is_some() || t.min_calls.is_some();
            match (t.consecutive_failures, rate) {
                (Some(n), false) => Ok(TripPolicy::ConsecutiveFailures(n)),
                (Some(_), true) => Err("set either consecutive_failures or a failure rate \
                     (threshold, window, min_calls), not both"),
                (None, true) => Ok(TripPolicy::FailureRate {
                    threshold: t
                        .threshold
                        .ok_or("a failure-rate trip needs a threshold (a fraction in (0, 1])")?,
                    window: t.window.unwrap_or(DEFAULT_WINDOW),
                    min_calls: t.min_calls.unwrap_or(DEFAULT_MIN_CALLS),
                }),
                (None, false) => Ok(TripPolicy::default()),
            }
        }
    }

    impl<'de> serde::Deserialize<'de> for Window {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(WindowVisitor)
        }
    }

    struct WindowVisitor;

    impl Visitor<'_> for WindowVisitor {
        type Value = Window;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a number of calls (100) or a duration (\"30s\")")
        }

        fn visit_u64<E: de::Error>(self, n: u64) -> Result<Window, E> {
            u32::try_from(n)
                .map(Window::Count)
                .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(n), &self))
        }

        fn visit_i64<E: de::Error>(self, n: i64) -> Result<Window, E> {
            u32::try_from(n)
                .map(Window::Count)
                .map_err(|_| E::invalid_value(de::Unexpected::Signed(n), &self))
        }

        fn visit_str<E: de::Error>(self, s: &str) -> Result<Window, E> {
            humantime_serde::re::humantime::parse_duration(s)
                .map(Window::Time)
                .map_err(|_| E::invalid_value(de::Unexpected::Str(s), &self))
        }
    }
}

//! Configuration: a plain struct with defaults and builder-style setters, validated once when
//! the group is built.

use std::time::Duration;

use endpoint_state::{ConfigError, FailureCodes};
use tonic::Code;

/// The configuration's name in its errors (`invalid quarantine configuration: ...`).
const CONFIG: &str = "quarantine";

/// The longest duration any setting accepts (a year): far enough to mean "a long time",
/// near enough that adding it to a clock reading can never overflow.
pub const MAX_SETTING: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// How a quarantine group quarantines its targets.
///
/// ```
/// use std::time::Duration;
/// use quarantine_layer::{OutlierEjection, QuarantineConfig, QuarantineGroup};
///
/// let config = QuarantineConfig::default()
///     .duration(Duration::from_secs(2))
///     .max_duration(Duration::from_secs(30))
///     .outlier_ejection(Some(OutlierEjection::default().minimum_hosts(3)));
/// let group = QuarantineGroup::new(config).unwrap();
/// # let _ = group;
///
/// let bad = QuarantineConfig::default().max_duration(Duration::from_secs(1));
/// let err = QuarantineGroup::new(bad).unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "invalid quarantine configuration: max_duration = 1s: expected at least duration (5s)"
/// );
/// ```
///
/// # In a configuration file
///
/// With the feature `serde`, the configuration reads from any serde format. Every field is
/// optional (an unset one keeps its default, so does each unset field of
/// `outlier_ejection`), unknown fields are refused, durations are written as humans write them
/// (`"500ms"`, `"5s"`) and codes by their gRPC names. The values are checked when the group
/// is built, as those set in code are.
///
/// ```toml
/// duration = "2s"
/// max_duration = "30s"
/// decay_after = "1m"
/// failure_codes = ["UNAVAILABLE", "DEADLINE_EXCEEDED"]
///
/// [outlier_ejection]            # present: the policy is on
/// interval = "10s"
/// failure_percentage_threshold = 85
/// minimum_hosts = 3
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct QuarantineConfig {
    /// How long a first quarantine lasts. Default 5 s. Must be more than zero.
    ///
    /// The `n`-th quarantine in a row lasts `duration × n`, capped at
    /// [`max_duration`](Self::max_duration).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub duration: Duration,
    /// The longest a repeated quarantine lasts. Default 60 s. At least
    /// [`duration`](Self::duration).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub max_duration: Duration,
    /// How long a target must stay out of quarantine for its repeat count to drop by one.
    /// Default 30 s. Must be more than zero.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub decay_after: Duration,
    /// The codes whose arrival quarantines the target that answered. Default
    /// [`FailureCodes::quarantine_default`]: `UNAVAILABLE` and `DEADLINE_EXCEEDED` (a refused
    /// connection and other transport errors count as `UNAVAILABLE`, a local timeout as
    /// `DEADLINE_EXCEEDED`). May be empty: then only the group's `report_failure` and outlier
    /// ejection quarantine. Must not contain `OK`.
    pub failure_codes: FailureCodes,
    /// The optional outlier-ejection policy. Default `None` (off).
    pub outlier_ejection: Option<OutlierEjection>,
}

impl Default for QuarantineConfig {
    fn default() -> Self {
        QuarantineConfig {
            duration: Duration::from_secs(5),
            max_duration: Duration::from_secs(60),
            decay_after: Duration::from_secs(30),
            failure_codes: FailureCodes::quarantine_default(),
            outlier_ejection: None,
        }
    }
}

impl QuarantineConfig {
    /// Sets [`duration`](Self::duration).
    #[must_use]
    pub fn duration(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// Sets [`max_duration`](Self::max_duration).
    #[must_use]
    pub fn max_duration(mut self, max: Duration) -> Self {
        self.max_duration = max;
        self
    }

    /// Sets [`decay_after`](Self::decay_after).
    #[must_use]
    pub fn decay_after(mut self, period: Duration) -> Self {
        self.decay_after = period;
        self
    }

    /// Sets [`failure_codes`](Self::failure_codes).
    #[must_use]
    pub fn failure_codes(mut self, codes: FailureCodes) -> Self {
        self.failure_codes = codes;
        self
    }

    /// Sets [`outlier_ejection`](Self::outlier_ejection).
    #[must_use]
    pub fn outlier_ejection(mut self, policy: Option<OutlierEjection>) -> Self {
        self.outlier_ejection = policy;
        self
    }

    /// How long the `count`-th quarantine in a row lasts: `duration × count`, capped at
    /// `max_duration` (a count of 0 is taken as 1).
    pub fn duration_for(&self, count: u32) -> Duration {
        self.duration
            .checked_mul(count.max(1))
            .map_or(self.max_duration, |d| d.min(self.max_duration))
    }

    /// Checks every field; the error names the first bad field (as a path:
    /// `outlier_ejection.interval`) and its value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        positive("duration", self.duration)?;
        positive("max_duration", self.max_duration)?;
        if self.max_duration < self.duration {
            return Err(refused(
                "max_duration",
                self.max_duration,
                format!("at least duration ({:?})", self.duration),
            ));
        }
        positive("decay_after", self.decay_after)?;
        no_ok("failure_codes", self.failure_codes)?;
        if let Some(policy) = &self.outlier_ejection {
            policy.validate()?;
        }
        Ok(())
    }
}

/// `field` refused: its value as `{:?}` writes it (`1s`, `{"OK"}`), and what was expected.
fn refused(
    field: &'static str,
    value: impl std::fmt::Debug,
    expected: impl Into<std::borrow::Cow<'static, str>>,
) -> ConfigError {
    ConfigError::new(CONFIG, field, format_args!("{value:?}"), expected)
}

fn positive(field: &'static str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(refused(field, value, "more than zero"));
    }
    if value > MAX_SETTING {
        return Err(refused(field, value, "at most a year"));
    }
    Ok(())
}

fn no_ok(field: &'static str, codes: FailureCodes) -> Result<(), ConfigError> {
    if codes.contains(Code::Ok) {
        return Err(refused(
            field,
            codes,
            "a set without OK (a success cannot be a failure)",
        ));
    }
    Ok(())
}

/// Outlier ejection by failure percentage (gRFC A50's `failure_percentage_ejection`, Envoy's
/// `failure_percentage_*`): every [`interval`](Self::interval), each target that carried at
/// least [`request_volume`](Self::request_volume) calls and failed more than
/// [`failure_percentage_threshold`](Self::failure_percentage_threshold) percent of them is
/// quarantined — provided at least [`minimum_hosts`](Self::minimum_hosts) targets carried that
/// volume, and only while the group's quarantined share stays within
/// [`max_ejection_percent`](Self::max_ejection_percent).
///
/// An ejection is a quarantine like any other: it lasts `duration × n` (capped) for the
/// target's `n`-th quarantine in a row, it counts towards the repeat count, and it is ignored
/// when it would leave no eligible target.
///
/// # The small-cluster rule
///
/// Of a group of `n` targets, an evaluation never leaves more than
/// [`max_ejected(n)`](Self::max_ejected) `= min(n − 1, ⌈n × max_ejection_percent / 100⌉)`
/// of them quarantined (counting every quarantined target, whatever put it there): at least
/// one target may always be ejected from a group of two or more (as in Envoy and gRFC A50,
/// which eject while the ejected share is *below* the maximum), and never the last one.
/// Before that, the evaluation needs `minimum_hosts` targets with enough volume, so with the
/// defaults a group smaller than 5 never ejects at all:
///
/// | targets | defaults (10 %, `minimum_hosts` 5) | 10 %, `minimum_hosts` 2 | 50 % | 100 % |
/// |--------:|-----:|-----:|-----:|-----:|
/// |       2 |    0 |    1 |    1 |    1 |
/// |       3 |    0 |    1 |    2 |    2 |
/// |       5 |    1 |    1 |    3 |    4 |
/// |      10 |    1 |    1 |    5 |    9 |
///
/// (when every target carries the volume and fails). A single target is never ejected.
///
/// # When it runs
///
/// There is no timer task: the counts since the last evaluation are judged when the first call
/// outcome arrives at least `interval` after it (so with no traffic nothing is evaluated, and
/// nothing needs to be). The outcome that triggers an evaluation counts towards the next one.
///
/// In a configuration file (feature `serde`), every field is optional and keeps its default
/// when unset.
///
/// ```
/// use quarantine_layer::OutlierEjection;
/// let policy = OutlierEjection::default();
/// assert_eq!([2, 3, 5, 10, 11].map(|n| policy.max_ejected(n)), [1, 1, 1, 1, 2]);
/// let half = OutlierEjection::default().max_ejection_percent(50);
/// assert_eq!([2, 3, 5, 10].map(|n| half.max_ejected(n)), [1, 2, 3, 5]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct OutlierEjection {
    /// How often the counts are judged. Default 10 s. More than zero.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub interval: Duration,
    /// A target is an outlier when more than this percentage of its calls failed. Default 85.
    /// From 0 to 100 (100 never ejects).
    pub failure_percentage_threshold: u32,
    /// The calls a target must have carried in the interval to be judged. Default 50. At
    /// least 1.
    pub request_volume: u64,
    /// How many targets must have carried `request_volume` calls for any to be judged.
    /// Default 5. At least 1.
    pub minimum_hosts: usize,
    /// The most of the group that may be quarantined after an ejection, in percent. Default
    /// 10. From 1 to 100. See the small-cluster rule above.
    pub max_ejection_percent: u32,
    /// The codes that count as failures for the percentage. Default
    /// [`FailureCodes::breaker_default`] (quarantine's codes plus `INTERNAL`, `UNKNOWN`,
    /// `DATA_LOSS`, `RESOURCE_EXHAUSTED`): with quarantine's own codes a single failure already
    /// quarantines, so the percentage is most useful for the codes that do not. Must not be
    /// empty or contain `OK`.
    pub failure_codes: FailureCodes,
}

impl Default for OutlierEjection {
    fn default() -> Self {
        OutlierEjection {
            interval: Duration::from_secs(10),
            failure_percentage_threshold: 85,
            request_volume: 50,
            minimum_hosts: 5,
            max_ejection_percent: 10,
            failure_codes: FailureCodes::breaker_default(),
        }
    }
}

impl OutlierEjection {
    /// Sets [`interval`](Self::interval).
    #[must_use]
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Sets [`failure_percentage_threshold`](Self::failure_percentage_threshold).
    #[must_use]
    pub fn failure_percentage_threshold(mut self, percent: u32) -> Self {
        self.failure_percentage_threshold = percent;
        self
    }

    /// Sets [`request_volume`](Self::request_volume).
    #[must_use]
    pub fn request_volume(mut self, calls: u64) -> Self {
        self.request_volume = calls;
        self
    }

    /// Sets [`minimum_hosts`](Self::minimum_hosts).
    #[must_use]
    pub fn minimum_hosts(mut self, hosts: usize) -> Self {
        self.minimum_hosts = hosts;
        self
    }

    /// Sets [`max_ejection_percent`](Self::max_ejection_percent).
    #[must_use]
    pub fn max_ejection_percent(mut self, percent: u32) -> Self {
        self.max_ejection_percent = percent;
        self
    }

    /// Sets [`failure_codes`](Self::failure_codes).
    #[must_use]
    pub fn failure_codes(mut self, codes: FailureCodes) -> Self {
        self.failure_codes = codes;
        self
    }

    /// The small-cluster rule: how many of a group of `hosts` targets may be quarantined after
    /// an ejection, `min(hosts − 1, ⌈hosts × max_ejection_percent / 100⌉)` (0 for one target).
    pub fn max_ejected(&self, hosts: usize) -> usize {
        if hosts <= 1 {
            return 0;
        }
        let pct = self.max_ejection_percent.min(100) as usize;
        (hosts * pct).div_ceil(100).min(hosts - 1)
    }

    /// Checks every field; the error names the first bad field (under `outlier_ejection.`)
    /// and its value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        positive("outlier_ejection.interval", self.interval)?;
        if self.failure_percentage_threshold > 100 {
            return Err(refused(
                "outlier_ejection.failure_percentage_threshold",
                self.failure_percentage_threshold,
                "between 0 and 100",
            ));
        }
        if self.request_volume == 0 {
            return Err(refused(
                "outlier_ejection.request_volume",
                self.request_volume,
                "at least 1",
            ));
        }
        if self.minimum_hosts == 0 {
            return Err(refused(
                "outlier_ejection.minimum_hosts",
                self.minimum_hosts,
                "at least 1",
            ));
        }
        if !(1..=100).contains(&self.max_ejection_percent) {
            return Err(refused(
                "outlier_ejection.max_ejection_percent",
                self.max_ejection_percent,
                "between 1 and 100 (turn the policy off with None)",
            ));
        }
        if self.failure_codes == FailureCodes::NONE {
            return Err(refused(
                "outlier_ejection.failure_codes",
                self.failure_codes,
                "a set of at least one code",
            ));
        }
        no_ok("outlier_ejection.failure_codes", self.failure_codes)
    }
}

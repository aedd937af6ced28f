//! The configuration file: a serde mirror of the builder.

use std::collections::BTreeMap;
use std::time::Duration;

use balance_layer::{PeakEwma, Strategy, Weights};
use breaker_layer::{BreakerConfig, OpenPeriod, SlowCalls, Window};
use endpoint_state::{FailureCodes, code_name};
use health_layer::{HealthConfig, ProbeMode, WatchBackoff};
use quarantine_layer::{OutlierEjection, QuarantineConfig};
use serde::Deserialize;
use tonic::Code;

use crate::builder::KitBuilder;
use crate::dns::DnsSettings;
use crate::error::{BuildError, InvalidConfig};
use crate::kit::Kit;
use crate::template::EndpointSettings;

/// The kit's configuration, as read from a file (TOML with [`from_toml`](Self::from_toml), or
/// any serde format). Unknown fields are refused; durations are written as humans write them
/// (`"250ms"`, `"5s"`, `"2m"`).
///
/// Exactly one of `target` (one address, or a `dns:` name) and `targets` (a list of addresses)
/// must be set. Every other block is optional and defaults as the [`KitBuilder`] does. The
/// field names follow the layers' own configurations, so an error about `breaker.open.jitter`
/// points at `[breaker.open] jitter = ...`.
///
/// ```
/// # #[cfg(feature = "toml")] {
/// use grpc_client_kit::KitConfig;
///
/// let config = KitConfig::from_toml(r#"
///     targets = ["http://10.0.0.7:50051", "http://10.0.0.8:50051"]
///     strategy = "weighted"
///
///     [weights]
///     "http://10.0.0.7:50051" = 3.0
///
///     [health]
///     mode = "watch"
///     timeout = "2s"
///
///     [breaker.trip]
///     consecutive_failures = 3
/// "#).unwrap();
/// assert!(config.builder().is_ok());
///
/// // Every invalid value is refused when the kit is built, naming the field and the value
/// // (and nothing starts).
/// let err = KitConfig::from_toml(r#"
///     targets = ["http://10.0.0.7:50051"]
///     [breaker.open]
///     jitter = 1.5
/// "#).unwrap().build().unwrap_err();
/// let err = err.invalid_config().unwrap();
/// assert_eq!((err.field(), err.value()), ("breaker.open.jitter", "1.5"));
///
/// // Unknown fields are refused as the file is read.
/// let err = KitConfig::from_toml("targets = []\ntimout = \"2s\"").unwrap_err();
/// assert!(err.to_string().contains("unknown field `timout`"), "{err}");
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KitConfig {
    /// One target: an address or a `dns:` name. Exclusive with `targets`.
    #[serde(default)]
    pub target: Option<String>,
    /// A fixed list of addresses. Exclusive with `target`.
    #[serde(default)]
    pub targets: Option<Vec<String>>,
    /// Settings of every target's endpoint (application and probe channels alike).
    #[serde(default)]
    pub endpoint: EndpointSettings,
    /// Active health checking.
    #[serde(default)]
    pub health: HealthSection,
    /// Passive quarantine.
    #[serde(default)]
    pub quarantine: QuarantineSection,
    /// The circuit breaker of every target.
    #[serde(default)]
    pub breaker: BreakerSection,
    /// How the balancer chooses: `round_robin` (default), `random`, `weighted`,
    /// `least_in_flight`, `peak_ewma`.
    #[serde(default)]
    pub strategy: StrategyName,
    /// With `strategy = "weighted"`: weight by target (a target not listed weighs 1.0).
    #[serde(default)]
    pub weights: BTreeMap<String, f64>,
    /// With `strategy = "peak_ewma"`: its parameters.
    #[serde(default)]
    pub peak_ewma: Option<PeakEwmaSection>,
    /// Whether a call waits for an eligible target instead of failing at once.
    #[serde(default)]
    pub wait_for_ready: bool,
    /// With `wait_for_ready`: the longest wait.
    #[serde(default, with = "humantime_serde")]
    pub max_wait: Option<Duration>,
    /// How long a call waits while targets are connecting (default 5 s; see
    /// [`KitBuilder::connecting_wait`]).
    #[serde(default, with = "humantime_serde")]
    pub connecting_wait: Option<Duration>,
    /// Whether a call no backend acted on is sent once more, to another target
    /// (default `true`; see [`KitBuilder::transparent_retry`]).
    #[serde(default)]
    pub transparent_retry: Option<bool>,
    /// Seed of the balancer's random choices (reproducible runs).
    #[serde(default)]
    pub seed: Option<u64>,
    /// How a `dns:` target is re-resolved.
    #[serde(default)]
    pub dns: DnsSettings,
}

/// `[health]`: the health checker's settings (unset ones keep
/// [`HealthConfig`]'s defaults).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthSection {
    /// `check` (default), `watch` or `off`.
    #[serde(default)]
    pub mode: HealthMode,
    /// Time between checks (`check` mode). `"0s"`: on-demand checks only.
    #[serde(default, with = "humantime_serde")]
    pub interval: Option<Duration>,
    /// The time one probe may take.
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    /// The longest wait between checks of a failing target.
    #[serde(default, with = "humantime_serde")]
    pub max_backoff: Option<Duration>,
    /// Spread of each wait, a fraction in `[0, 1)`.
    #[serde(default)]
    pub jitter: Option<f64>,
    /// The service name asked about (`""`: the whole server).
    #[serde(default)]
    pub service: Option<String>,
    /// Count `UNIMPLEMENTED` as healthy (default `true`, as gRPC's clients do: gRFC A17).
    #[serde(default)]
    pub unimplemented_is_healthy: Option<bool>,
    /// An HTTP/2 keepalive for probe connections only (default: none of the checker's own;
    /// see [`HealthConfig::probe_keepalive`]).
    #[serde(default, with = "humantime_serde")]
    pub probe_keepalive: Option<Duration>,
    /// At most this many probes at once.
    #[serde(default)]
    pub max_concurrent_probes: Option<usize>,
    /// How a broken `Watch` stream re-subscribes.
    #[serde(default)]
    pub watch_backoff: Option<WatchBackoffSection>,
}

/// How targets are health-checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthMode {
    /// `grpc.health.v1.Health/Check` on a schedule.
    #[default]
    Check,
    /// `grpc.health.v1.Health/Watch`: a stream per target, every change seen at once.
    Watch,
    /// No active health checking.
    Off,
}

/// `[health.watch_backoff]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchBackoffSection {
    /// The first wait.
    #[serde(default, with = "humantime_serde")]
    pub initial: Option<Duration>,
    /// Growth per retry.
    #[serde(default)]
    pub multiplier: Option<f64>,
    /// Random spread, a fraction in `[0, 1)`.
    #[serde(default)]
    pub jitter: Option<f64>,
    /// The longest wait.
    #[serde(default, with = "humantime_serde")]
    pub max: Option<Duration>,
}

/// `[quarantine]`: passive quarantine (unset fields keep [`QuarantineConfig`]'s defaults).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuarantineSection {
    /// `false` turns quarantine off. Default `true`.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// How long a first quarantine lasts.
    #[serde(default, with = "humantime_serde")]
    pub duration: Option<Duration>,
    /// The longest a repeated quarantine lasts.
    #[serde(default, with = "humantime_serde")]
    pub max_duration: Option<Duration>,
    /// Time out of quarantine that forgives one repeat.
    #[serde(default, with = "humantime_serde")]
    pub decay_after: Option<Duration>,
    /// The codes that quarantine (`["UNAVAILABLE", "DEADLINE_EXCEEDED"]`).
    #[serde(default)]
    pub failure_codes: Option<Vec<String>>,
    /// Outlier ejection by failure percentage.
    #[serde(default)]
    pub outlier_ejection: Option<OutlierSection>,
}

/// `[quarantine.outlier_ejection]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutlierSection {
    /// How often the counts are judged.
    #[serde(default, with = "humantime_serde")]
    pub interval: Option<Duration>,
    /// Ejected above this percentage of failed calls.
    #[serde(default)]
    pub failure_percentage_threshold: Option<u32>,
    /// Calls needed in an interval to be judged.
    #[serde(default)]
    pub request_volume: Option<u64>,
    /// Targets with that volume needed for any to be judged.
    #[serde(default)]
    pub minimum_hosts: Option<usize>,
    /// The most of the group that may be ejected, in percent.
    #[serde(default)]
    pub max_ejection_percent: Option<u32>,
    /// The codes that count as failures.
    #[serde(default)]
    pub failure_codes: Option<Vec<String>>,
}

/// `[breaker]`: the circuit breaker (unset fields keep [`BreakerConfig`]'s defaults).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerSection {
    /// `false` turns the breaker off. Default `true`.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// What trips it.
    #[serde(default)]
    pub trip: Option<TripSection>,
    /// Trip on slow calls too.
    #[serde(default)]
    pub slow_calls: Option<SlowCallsSection>,
    /// How long it stays open.
    #[serde(default)]
    pub open: Option<OpenSection>,
    /// Probe calls admitted half-open.
    #[serde(default)]
    pub half_open_permits: Option<u32>,
    /// The codes that count as failures.
    #[serde(default)]
    pub failure_codes: Option<Vec<String>>,
}

/// `[breaker.trip]`: `consecutive_failures = N`, or `threshold` / `window` / `min_calls` for a
/// failure rate — not both.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TripSection {
    /// Trip after this many failures in a row.
    #[serde(default)]
    pub consecutive_failures: Option<u32>,
    /// Trip when this share of the window's calls failed, in `(0, 1]`.
    #[serde(default)]
    pub threshold: Option<f64>,
    /// The calls counted: a number of calls (`100`) or a duration (`"30s"`). Default 100 calls.
    #[serde(default)]
    pub window: Option<WindowSetting>,
    /// No verdict below this many calls. Default 10.
    #[serde(default)]
    pub min_calls: Option<u32>,
}

/// A window: the last `n` calls, or the calls of the last duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum WindowSetting {
    /// The last `n` calls.
    Calls(u32),
    /// The calls that ended within this long (`"30s"`).
    Time(#[serde(with = "humantime_serde")] Duration),
}

impl From<WindowSetting> for Window {
    fn from(w: WindowSetting) -> Self {
        match w {
            WindowSetting::Calls(n) => Window::Count(n),
            WindowSetting::Time(d) => Window::Time(d),
        }
    }
}

/// `[breaker.slow_calls]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlowCallsSection {
    /// A call is slow from this long.
    #[serde(with = "humantime_serde")]
    pub threshold: Duration,
    /// Trip when this share of the window's calls were slow.
    pub rate: f64,
    /// The calls counted. Default 100 calls.
    #[serde(default)]
    pub window: Option<WindowSetting>,
    /// No verdict below this many calls. Default 10.
    #[serde(default)]
    pub min_calls: Option<u32>,
}

/// `[breaker.open]`: the open period (`base × multiplierⁿ⁻¹`, capped, jittered).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenSection {
    /// The first open period.
    #[serde(default, with = "humantime_serde")]
    pub base: Option<Duration>,
    /// Growth between repeated trips.
    #[serde(default)]
    pub multiplier: Option<f64>,
    /// The cap.
    #[serde(default, with = "humantime_serde")]
    pub max: Option<Duration>,
    /// Jitter fraction in `[0, 1)`.
    #[serde(default)]
    pub jitter: Option<f64>,
}

/// The balancing strategy's name in a configuration file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StrategyName {
    /// [`Strategy::RoundRobin`].
    #[default]
    RoundRobin,
    /// [`Strategy::Random`].
    Random,
    /// [`Strategy::Weighted`], with `weights`.
    Weighted,
    /// [`Strategy::LeastInFlight`].
    LeastInFlight,
    /// [`Strategy::PeakEwma`], with `peak_ewma`.
    PeakEwma,
}

/// `[peak_ewma]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeakEwmaSection {
    /// The estimate of a target that has not answered yet.
    #[serde(default, with = "humantime_serde")]
    pub default_rtt: Option<Duration>,
    /// The time constant of the moving average.
    #[serde(default, with = "humantime_serde")]
    pub decay: Option<Duration>,
}

impl KitConfig {
    /// Reads a TOML document. A syntax error, an unknown field or a value of the wrong type is
    /// refused here, naming the field (as a path: `health.timeout`) and showing the line.
    #[cfg(feature = "toml")]
    pub fn from_toml(document: &str) -> Result<KitConfig, InvalidConfig> {
        let de = toml::Deserializer::parse(document)
            .map_err(|e| InvalidConfig::new("(document)", "", e.to_string()))?;
        serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            let message = inner.message().to_owned();
            let value = inner
                .span()
                .and_then(|span| document.get(span))
                .unwrap_or("")
                .to_owned();
            InvalidConfig::new(field, value, message).with_source(Box::new(inner))
        })
    }

    /// A [`KitBuilder`] with these settings (adjust it further, or [`build`](KitBuilder::build)
    /// it). The values the layers check are checked by `build`; this refuses what only the
    /// file can get wrong (an unknown code name, a weight without `strategy = "weighted"`).
    pub fn builder(&self) -> Result<KitBuilder, InvalidConfig> {
        let mut b = KitBuilder::new();
        if let Some(t) = &self.target {
            b = b.target(t.clone());
        }
        if let Some(ts) = &self.targets {
            b = b.targets(ts.clone());
        }
        self.endpoint.validate()?;
        b = b.template(self.endpoint.template());
        b = match self.health.config()? {
            Some(h) => b.health(h),
            None => b.without_health(),
        };
        b = match self.quarantine.config()? {
            Some(q) => b.quarantine(q),
            None => b.without_quarantine(),
        };
        b = match self.breaker.config()? {
            Some(c) => b.breaker(c),
            None => b.without_breaker(),
        };
        let mut balance = balance_layer::BalanceConfig::new()
            .strategy(self.strategy()?)
            .wait_for_ready(self.wait_for_ready);
        if let Some(max_wait) = self.max_wait {
            balance = balance.max_wait(max_wait);
        }
        if let Some(wait) = self.connecting_wait {
            balance = balance.connecting_wait(wait);
        }
        if let Some(seed) = self.seed {
            balance = balance.seed(seed);
        }
        b = b.balance(balance);
        if let Some(retry) = self.transparent_retry {
            b = b.transparent_retry(retry);
        }
        b = b.dns(self.dns.clone());
        Ok(b)
    }

    /// Builds and starts the kit (see [`KitBuilder::build`]).
    pub fn build(&self) -> Result<Kit, BuildError> {
        self.builder()?.build()
    }

    fn strategy(&self) -> Result<Strategy, InvalidConfig> {
        if !self.weights.is_empty() && self.strategy != StrategyName::Weighted {
            return Err(InvalidConfig::new(
                "weights",
                format!("{:?}", self.weights),
                "weights are used only with strategy = \"weighted\"",
            ));
        }
        if self.peak_ewma.is_some() && self.strategy != StrategyName::PeakEwma {
            return Err(InvalidConfig::new(
                "peak_ewma",
                format!("{:?}", self.peak_ewma),
                "used only with strategy = \"peak_ewma\"",
            ));
        }
        Ok(match self.strategy {
            StrategyName::RoundRobin => Strategy::RoundRobin,
            StrategyName::Random => Strategy::Random,
            StrategyName::LeastInFlight => Strategy::LeastInFlight,
            StrategyName::Weighted => Strategy::Weighted(
                self.weights
                    .iter()
                    .map(|(t, w)| (t.as_str(), *w))
                    .collect::<Weights>(),
            ),
            StrategyName::PeakEwma => {
                let mut p = PeakEwma::default();
                if let Some(section) = &self.peak_ewma {
                    if let Some(rtt) = section.default_rtt {
                        p = p.default_rtt(rtt);
                    }
                    if let Some(decay) = section.decay {
                        p = p.decay(decay);
                    }
                }
                Strategy::PeakEwma(p)
            }
        })
    }
}

impl HealthSection {
    fn config(&self) -> Result<Option<HealthConfig>, InvalidConfig> {
        let mut c = HealthConfig::new();
        c = match self.mode {
            HealthMode::Off => return Ok(None),
            HealthMode::Check => c.mode(ProbeMode::Check),
            HealthMode::Watch => c.mode(ProbeMode::Watch),
        };
        if let Some(v) = self.interval {
            c = c.interval(v);
        }
        if let Some(v) = self.timeout {
            c = c.timeout(v);
        }
        if let Some(v) = self.max_backoff {
            c = c.max_backoff(v);
        }
        if let Some(v) = self.jitter {
            c = c.jitter(v);
        }
        if let Some(v) = &self.service {
            c = c.service(v.clone());
        }
        if let Some(keepalive) = self.probe_keepalive {
            c = c.probe_keepalive(Some(keepalive));
        }
        if let Some(v) = self.unimplemented_is_healthy {
            c = c.unimplemented_is_healthy(v);
        }
        if let Some(v) = self.max_concurrent_probes {
            c = c.max_concurrent_probes(v);
        }
        if let Some(w) = &self.watch_backoff {
            let d = WatchBackoff::default();
            c = c.watch_backoff(WatchBackoff {
                initial: w.initial.unwrap_or(d.initial),
                multiplier: w.multiplier.unwrap_or(d.multiplier),
                jitter: w.jitter.unwrap_or(d.jitter),
                max: w.max.unwrap_or(d.max),
            });
        }
        Ok(Some(c))
    }
}

impl QuarantineSection {
    fn config(&self) -> Result<Option<QuarantineConfig>, InvalidConfig> {
        if self.enabled == Some(false) {
            return Ok(None);
        }
        let mut c = QuarantineConfig::default();
        if let Some(v) = self.duration {
            c = c.duration(v);
        }
        if let Some(v) = self.max_duration {
            c = c.max_duration(v);
        }
        if let Some(v) = self.decay_after {
            c = c.decay_after(v);
        }
        if let Some(codes) = &self.failure_codes {
            c = c.failure_codes(parse_codes("quarantine.failure_codes", codes)?);
        }
        if let Some(o) = &self.outlier_ejection {
            let mut p = OutlierEjection::default();
            if let Some(v) = o.interval {
                p = p.interval(v);
            }
            if let Some(v) = o.failure_percentage_threshold {
                p = p.failure_percentage_threshold(v);
            }
            if let Some(v) = o.request_volume {
                p = p.request_volume(v);
            }
            if let Some(v) = o.minimum_hosts {
                p = p.minimum_hosts(v);
            }
            if let Some(v) = o.max_ejection_percent {
                p = p.max_ejection_percent(v);
            }
            if let Some(codes) = &o.failure_codes {
                p = p.failure_codes(parse_codes(
                    "quarantine.outlier_ejection.failure_codes",
                    codes,
                )?);
            }
            c = c.outlier_ejection(Some(p));
        }
        Ok(Some(c))
    }
}

impl BreakerSection {
    fn config(&self) -> Result<Option<BreakerConfig>, InvalidConfig> {
        if self.enabled == Some(false) {
            return Ok(None);
        }
        let mut c = BreakerConfig::default();
        if let Some(trip) = &self.trip {
            let rate =
                trip.threshold.is_some() || trip.window.is_some() || trip.min_calls.is_some();
            match (trip.consecutive_failures, rate) {
                (Some(n), false) => c = c.consecutive_failures(n),
                (Some(n), true) => {
                    return Err(InvalidConfig::new(
                        "breaker.trip.consecutive_failures",
                        n.to_string(),
                        "set either consecutive_failures or a failure rate (threshold, window, \
                         min_calls), not both",
                    ));
                }
                (None, true) => {
                    let threshold = trip.threshold.ok_or_else(|| {
                        InvalidConfig::new(
                            "breaker.trip.threshold",
                            "",
                            "a failure-rate trip needs a threshold (a fraction in (0, 1])",
                        )
                    })?;
                    let window = trip.window.map_or(Window::Count(100), Window::from);
                    c = c.failure_rate(threshold, window, trip.min_calls.unwrap_or(10));
                }
                (None, false) => {}
            }
        }
        if let Some(s) = &self.slow_calls {
            let mut slow = SlowCalls::new(s.threshold, s.rate);
            if let Some(w) = s.window {
                slow = slow.window(w.into());
            }
            if let Some(m) = s.min_calls {
                slow = slow.min_calls(m);
            }
            c = c.slow_calls(slow);
        }
        if let Some(o) = &self.open {
            let d = OpenPeriod::default();
            c = c.open_period(OpenPeriod {
                base: o.base.unwrap_or(d.base),
                multiplier: o.multiplier.unwrap_or(d.multiplier),
                max: o.max.unwrap_or(d.max),
                jitter: o.jitter.unwrap_or(d.jitter),
            });
        }
        if let Some(p) = self.half_open_permits {
            c = c.half_open_permits(p);
        }
        if let Some(codes) = &self.failure_codes {
            c = c.failure_codes(parse_codes("breaker.failure_codes", codes)?);
        }
        Ok(Some(c))
    }
}

/// Code names as gRPC writes them (`UNAVAILABLE`, case-insensitive) or their numbers.
fn parse_codes(field: &str, names: &[String]) -> Result<FailureCodes, InvalidConfig> {
    let mut codes = FailureCodes::NONE;
    for (i, name) in names.iter().enumerate() {
        let wanted = name.trim();
        let code = (0..=16).map(Code::from_i32).find(|c| {
            code_name(*c).eq_ignore_ascii_case(wanted) || (*c as i32).to_string() == wanted
        });
        match code {
            Some(code) => codes = codes.with(code),
            None => {
                return Err(InvalidConfig::new(
                    format!("{field}[{i}]"),
                    format!("{name:?}"),
                    "not a gRPC status code (UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, ...)",
                ));
            }
        }
    }
    Ok(codes)
}

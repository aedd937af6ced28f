//! The checker's configuration: a plain struct with defaults and builder-style setters,
//! validated once by [`HealthConfig::build`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use endpoint_state::time::FAR;
use endpoint_state::{Backoff, BoxError, ConfigError};
use tonic::transport::{Channel, Endpoint};

#[cfg(feature = "http-probe")]
use crate::probe::HttpProbe;
use crate::probe::{Connector, CustomProbe};

#[cfg(feature = "serde")]
mod de;

/// How the checker looks at its targets.
///
/// With the `serde` feature it deserializes from `"check"`, `"watch"`, or (with `http-probe`)
/// `{ http = { path = "/healthz", accept_status = [200, 404], require_json_key = "ok",
/// max_body = 65536 } }` (only `path` is required; see [`HttpProbe`]). A custom probe, and an
/// HTTP probe's predicate, are code: set them with [`HealthConfig::mode`].
#[derive(Debug, Clone, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum ProbeMode {
    /// `grpc.health.v1.Health/Check`, a unary call with a deadline, on each target's schedule.
    #[default]
    Check,
    /// `grpc.health.v1.Health/Watch`: one long-lived stream per target; every message is a
    /// verdict at once (`SERVING` healthy, anything else unhealthy).
    ///
    /// A stream the server ends after it has answered — a `GOAWAY` for max connection age or
    /// idleness, a graceful restart, any closed connection — is re-subscribed at once on a new
    /// connection, and the target keeps its verdict meanwhile: only evidence makes it
    /// unhealthy (the new connection refused, a status other than `SERVING`, no answer within
    /// the [`timeout`](HealthConfig::timeout)). A subscription that fails marks the target
    /// unhealthy and is retried with the [`watch_backoff`](HealthConfig::watch_backoff).
    ///
    /// A stream that stays silent for an [`interval`](HealthConfig::interval) has its
    /// connection verified with one `Check` on it: a call with data, which servers never count
    /// as an abusive ping (HTTP/2 pings without data are, beyond one every 5 minutes, on
    /// C-core, grpc-go and grpc-java servers). No answer within the timeout is evidence.
    Watch,
    /// GET a URL on each target, on its schedule. See [`HttpProbe`].
    #[cfg(feature = "http-probe")]
    Http(HttpProbe),
    /// The user's own probe, on each target's schedule.
    #[cfg_attr(feature = "serde", serde(skip))]
    Custom(CustomProbe),
}

impl ProbeMode {
    /// A custom probe from an async function of the target's name (see [`CustomProbe`]).
    pub fn custom<F, Fut>(f: F) -> Self
    where
        F: Fn(Arc<str>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        ProbeMode::Custom(CustomProbe::new(f))
    }

    /// Whether probes of this mode need an endpoint URI for each target.
    pub(crate) fn needs_endpoint(&self) -> bool {
        !matches!(self, ProbeMode::Custom(_))
    }
}

/// Builds a target's probe endpoint from its name.
pub(crate) type EndpointTemplate =
    Arc<dyn Fn(&str) -> Result<Endpoint, BoxError> + Send + Sync + 'static>;

/// The health checker's configuration. Every setter has a default; [`build`](Self::build)
/// validates the whole once and names the first bad field.
///
/// | setting | default |
/// |---|---|
/// | [`mode`](Self::mode) | [`ProbeMode::Check`] |
/// | [`interval`](Self::interval) | 30 s (0 disables the schedule: on-demand checks only) |
/// | [`timeout`](Self::timeout) | 5 s per probe |
/// | [`max_backoff`](Self::max_backoff) | 300 s |
/// | [`jitter`](Self::jitter) | 0 (no spread) |
/// | [`service`](Self::service) | `""` (the whole server) |
/// | [`unimplemented_is_healthy`](Self::unimplemented_is_healthy) | `true` (gRFC A17) |
/// | [`probe_keepalive`](Self::probe_keepalive) | `None`: the endpoint template's own (at least 1 s when set) |
/// | [`max_concurrent_probes`](Self::max_concurrent_probes) | 100 |
/// | [`watch_backoff`](Self::watch_backoff) | 1 s × 1.6, jitter 0.2, max 120 s |
/// | [`events_capacity`](Self::events_capacity) | 1024 transitions per subscriber |
/// | [`fail_fast_callbacks`](Self::fail_fast_callbacks) | `false` |
/// | [`endpoint_template`](Self::endpoint_template) | `Endpoint::from_shared(target)` |
///
/// A duration beyond any clock (`Duration::MAX` for the timeout, the interval, a backoff's
/// waits, the keepalive) is as long as anything waits: never a panic.
///
/// With the `serde` feature it deserializes from a document with the setters' names, durations
/// in humantime form (`"30s"`, `"1m 30s"`, `"250ms"`); every field is optional (a missing one
/// keeps its default), an unknown one is refused, and nothing is validated before
/// [`build`](Self::build). The endpoint template and the connector are code and keep their
/// defaults (set them after deserializing).
///
/// ```
/// # #[cfg(feature = "serde")]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use health_layer::HealthConfig;
/// let config: HealthConfig = toml::from_str(
///     r#"
///     mode = "watch"
///     timeout = "2s"
///     watch_backoff = { initial = "500ms", max = "30s" }
///     "#,
/// )?;
/// let checker = config.build()?;
/// # let _ = checker;
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "serde"))] fn main() {}
/// ```
#[derive(Clone)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct HealthConfig {
    pub(crate) mode: ProbeMode,
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub(crate) interval: Duration,
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub(crate) timeout: Duration,
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub(crate) max_backoff: Duration,
    pub(crate) jitter: f64,
    #[cfg_attr(feature = "serde", serde(deserialize_with = "de::shared_str"))]
    pub(crate) service: Arc<str>,
    pub(crate) unimplemented_is_healthy: bool,
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub(crate) probe_keepalive: Option<Duration>,
    pub(crate) max_concurrent_probes: usize,
    #[cfg_attr(feature = "serde", serde(deserialize_with = "de::watch_backoff"))]
    pub(crate) watch_backoff: Backoff,
    pub(crate) events_capacity: usize,
    pub(crate) fail_fast_callbacks: bool,
    #[cfg_attr(feature = "serde", serde(skip))]
    /// `None`: the default, `Endpoint::from_shared(target)` (whose settings the checker knows).
    pub(crate) endpoint_template: Option<EndpointTemplate>,
    #[cfg_attr(feature = "serde", serde(skip))]
    pub(crate) connector: Option<Connector>,
}

impl fmt::Debug for HealthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HealthConfig")
            .field("mode", &self.mode)
            .field("interval", &self.interval)
            .field("timeout", &self.timeout)
            .field("max_backoff", &self.max_backoff)
            .field("jitter", &self.jitter)
            .field("service", &self.service)
            .field("unimplemented_is_healthy", &self.unimplemented_is_healthy)
            .field("probe_keepalive", &self.probe_keepalive)
            .field("max_concurrent_probes", &self.max_concurrent_probes)
            .field("watch_backoff", &self.watch_backoff)
            .field("events_capacity", &self.events_capacity)
            .field("fail_fast_callbacks", &self.fail_fast_callbacks)
            .field("custom_connector", &self.connector.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            mode: ProbeMode::Check,
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
            max_backoff: Duration::from_secs(300),
            jitter: 0.0,
            service: Arc::from(""),
            unimplemented_is_healthy: true,
            probe_keepalive: None,
            max_concurrent_probes: 100,
            watch_backoff: HealthConfig::DEFAULT_WATCH_BACKOFF,
            events_capacity: 1024,
            fail_fast_callbacks: false,
            endpoint_template: None,
            connector: None,
        }
    }
}

impl HealthConfig {
    /// How targets are probed.
    pub fn get_mode(&self) -> &ProbeMode {
        &self.mode
    }

    /// The time between checks (see [`interval`](Self::interval)).
    pub fn get_interval(&self) -> Duration {
        self.interval
    }

    /// The time one probe may take.
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }

    /// The service name asked about.
    pub fn get_service(&self) -> &str {
        &self.service
    }

    /// How a broken `Watch` stream re-subscribes unless told otherwise: 1 s × 1.6, jitter 0.2,
    /// at most 120 s (gRPC's connection backoff).
    pub const DEFAULT_WATCH_BACKOFF: Backoff =
        Backoff::new(Duration::from_secs(1), 1.6, Duration::from_secs(120), 0.2);

    /// The defaults (see the table above).
    pub fn new() -> Self {
        Self::default()
    }

    /// How targets are probed.
    pub fn mode(mut self, mode: ProbeMode) -> Self {
        self.mode = mode;
        self
    }

    /// The time between a target's checks while it passes (`Check`, HTTP and custom modes),
    /// counted from the end of its last probe. In `Watch` mode, how long a stream may stay
    /// silent before its connection is verified with a `Check` on it.
    /// `Duration::ZERO` disables the schedule: each target is probed once when it is added,
    /// then only by [`check_now`](crate::HealthChecker::check_now) (and in `Watch` mode, silent
    /// streams are not verified).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// The time one probe may take (connecting included). For `Watch`, the time to connect
    /// and receive the stream's first message.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The longest wait between checks of a failing target: after n consecutive failures the
    /// next check comes `interval × 2^(n−1)` later, at most this. One success resets.
    pub fn max_backoff(mut self, max_backoff: Duration) -> Self {
        self.max_backoff = max_backoff;
        self
    }

    /// Spread each wait uniformly by ± this fraction (in `[0, 1)`), so that targets added
    /// together do not stay in step. The result never exceeds `max_backoff`.
    ///
    /// A jittered check is then moved to the nearest instant of a checker-wide grid that lies
    /// within its band (a step of at most 100 ms, and at least 2 steps across the band; a
    /// narrower band is not moved): checks drawn close together share one timer wake-up
    /// instead of waking the runtime once each (at a thousand targets checked every second,
    /// the largest saving measured: see the workspace's `BENCHMARKS.md`). Every wait stays
    /// within `interval × (1 ± jitter)`.
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// The service name asked about (`""`, the default, is the whole server). A target may
    /// override it ([`Target::service`](crate::Target::service)).
    pub fn service(mut self, service: impl Into<Arc<str>>) -> Self {
        self.service = service.into();
        self
    }

    /// Whether an `UNIMPLEMENTED` answer (a server without the health service) counts as
    /// healthy. Default `true`, as gRPC's own client health checking does (gRFC A17): a server
    /// that does not implement health checking is assumed to serve; the first such answer of
    /// each target is logged at `warn`. In `Watch` mode such a target is not subscribed again
    /// until its probe connection is replaced (gRPC restarts health checking with each new
    /// connection); its connection is still verified every interval. `false` requires the
    /// health service: `UNIMPLEMENTED` is then unhealthy.
    pub fn unimplemented_is_healthy(mut self, yes: bool) -> Self {
        self.unimplemented_is_healthy = yes;
        self
    }

    /// An HTTP/2 keepalive for probe connections only, applied over the endpoint template's
    /// own settings. Default `None`: probe connections keep whatever the template says (tonic's
    /// default: no keepalive pings), which every server accepts. At least 1 s (a build error
    /// otherwise); a value beyond any timer (`Duration::MAX`) means no ping in practice.
    ///
    /// gRPC servers (C-core, grpc-go, grpc-java) by default allow a ping without data only
    /// every 5 minutes, and answer more with `GOAWAY ENHANCE_YOUR_CALM "too_many_pings"`.
    /// When a server does, the checker follows gRFC A8: it logs it at `warn`, reconnects at
    /// once (the target keeps its verdict: this is no evidence against it) and doubles that
    /// target's interval for its new connections — starting from this value, or, when the
    /// template's own keepalive was refused (whose value cannot be read back), from 5 minutes.
    /// `Watch` mode needs no keepalive to notice a dead connection (see [`ProbeMode::Watch`]).
    pub fn probe_keepalive(mut self, interval: Option<Duration>) -> Self {
        self.probe_keepalive = interval;
        self
    }

    /// At most this many probes run at once (for `Watch`: stream set-ups). Others wait their
    /// turn; their own timeout starts when they run.
    pub fn max_concurrent_probes(mut self, n: usize) -> Self {
        self.max_concurrent_probes = n;
        self
    }

    /// How a broken `Watch` stream re-subscribes: the n-th consecutive retry (from 0) waits
    /// `min(initial × multiplierⁿ, max)`, spread by ± `jitter`; a message on the stream resets
    /// n. Default [`DEFAULT_WATCH_BACKOFF`](Self::DEFAULT_WATCH_BACKOFF).
    pub fn watch_backoff(mut self, backoff: Backoff) -> Self {
        self.watch_backoff = backoff;
        self
    }

    /// How many transitions each [`subscribe`](crate::HealthChecker::subscribe)r may fall behind by.
    /// The checker never waits for a subscriber: one that falls further behind loses the oldest
    /// transitions and learns how many on its next receive (`RecvError::Lagged`).
    pub fn events_capacity(mut self, n: usize) -> Self {
        self.events_capacity = n;
        self
    }

    /// Let a panicking transition callback fail the caller of
    /// [`stop`](crate::HealthChecker::stop) (for tests) instead of being logged and ignored. Monitoring
    /// goes on in both cases.
    pub fn fail_fast_callbacks(mut self, yes: bool) -> Self {
        self.fail_fast_callbacks = yes;
        self
    }

    /// How a target's name becomes its probe endpoint: set TLS, origin, user agent, keep-alive
    /// here. The default parses the name as a URI (`http://10.0.0.7:50051`). The endpoint's
    /// own channel is used for probes only, never for application calls.
    ///
    /// With the default template, whose settings the checker knows (tonic's defaults),
    /// plaintext `Check` probes run on the checker's own HTTP/2 connections instead of tonic
    /// `Channel`s (see the [crate docs](crate)); with a template of yours, every probe runs on
    /// a `Channel` of the endpoint it returns.
    ///
    /// Plaintext (`http://`) probe connections go through the checker's own connector, which
    /// reads the server's HTTP/2 frames (see [`probe`](crate::probe)); it applies the endpoint's
    /// TCP settings (nodelay, TCP keepalive, connect timeout) but not
    /// `Endpoint::local_address`, which tonic does not let anyone read back: give a
    /// [`connector`](Self::connector) of your own if probes must bind a local address.
    ///
    /// ```
    /// use health_layer::HealthConfig;
    /// use tonic::transport::Endpoint;
    /// let config = HealthConfig::new().endpoint_template(|target: &str| {
    ///     Ok(Endpoint::from_shared(target.to_owned())?.user_agent("my-app-health")?)
    /// });
    /// # let _ = config;
    /// ```
    pub fn endpoint_template<F>(mut self, f: F) -> Self
    where
        F: Fn(&str) -> Result<Endpoint, BoxError> + Send + Sync + 'static,
    {
        self.endpoint_template = Some(Arc::new(f));
        self
    }

    /// Connect probe channels with this function instead of [`Endpoint::connect`] (a custom
    /// connector: Unix sockets, in-memory transports, a proxy).
    pub fn connector<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Endpoint) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Channel, BoxError>> + Send + 'static,
    {
        self.connector = Some(Arc::new(move |endpoint| Box::pin(f(endpoint))));
        self
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.timeout.is_zero() {
            return Err(invalid("timeout", self.timeout, "more than zero"));
        }
        if !self.interval.is_zero() && self.max_backoff < self.interval {
            return Err(invalid(
                "max_backoff",
                self.max_backoff,
                "at least the interval",
            ));
        }
        if let Some(keepalive) = self.probe_keepalive
            && keepalive < MIN_KEEPALIVE
        {
            return Err(invalid(
                "probe_keepalive",
                keepalive,
                "at least 1 s (or None: no keepalive of the checker's own); servers answer \
                 pings more often than every 5 minutes with GOAWAY too_many_pings",
            ));
        }
        if !(self.jitter.is_finite() && (0.0..1.0).contains(&self.jitter)) {
            return Err(invalid("jitter", self.jitter, "a fraction in [0, 1)"));
        }
        if self.max_concurrent_probes == 0 || self.max_concurrent_probes > MAX_PERMITS {
            return Err(invalid(
                "max_concurrent_probes",
                self.max_concurrent_probes,
                "between 1 and 2^29",
            ));
        }
        if self.events_capacity == 0 || self.events_capacity > MAX_PERMITS {
            return Err(invalid(
                "events_capacity",
                self.events_capacity,
                "between 1 and 2^29",
            ));
        }
        self.watch_backoff.validate(CONFIG, "watch_backoff")?;
        #[cfg(feature = "http-probe")]
        if let ProbeMode::Http(probe) = &self.mode {
            probe
                .validate()
                .map_err(|e| e.within(CONFIG, "http_probe"))?;
        }
        Ok(())
    }

    /// When a target's checks come while it fails: after n failures in a row (0 after a
    /// success) the next check waits `delay(n − 1)` (saturating): `interval × 2^(n−1)`, at most
    /// `max_backoff`, spread by ± `jitter`.
    pub(crate) fn check_backoff(&self) -> Backoff {
        within_clock(Backoff::new(
            self.interval,
            2.0,
            self.max_backoff,
            self.jitter,
        ))
    }

    /// How a broken `Watch` stream re-subscribes ([`watch_backoff`](Self::watch_backoff)), its
    /// durations within what a clock holds.
    pub(crate) fn watch_retry(&self) -> Backoff {
        within_clock(self.watch_backoff)
    }
}

/// `backoff` with every duration at most [`FAR`]: a wait beyond any timer is as long as
/// anything waits, and the arithmetic on it stays finite (`Duration::MAX` overflows a
/// multiplication by a jitter factor).
fn within_clock(backoff: Backoff) -> Backoff {
    Backoff {
        initial: backoff.initial.min(FAR),
        max: backoff.max.min(FAR),
        ..backoff
    }
}

/// The configuration's name in its errors.
const CONFIG: &str = "health check";

/// A field of the health check configuration that cannot work (the value as `Debug` writes
/// it).
fn invalid(field: &'static str, value: impl fmt::Debug, expected: &'static str) -> ConfigError {
    ConfigError::new(CONFIG, field, format!("{value:?}"), expected)
}

/// The shortest HTTP/2 keepalive interval accepted: below a second a ping is no longer a
/// liveness check but load (and every gRPC server refuses it long before).
pub(crate) const MIN_KEEPALIVE: Duration = Duration::from_secs(1);

/// tokio's semaphore and broadcast channel limits, rounded down.
const MAX_PERMITS: usize = 1 << 29;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::HealthConfig;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn check_delays_double_from_the_second_failure_and_cap() {
        let backoff = HealthConfig::new()
            .interval(S(30))
            .max_backoff(S(300))
            .check_backoff();
        let d = |failures: u32| backoff.delay(failures.saturating_sub(1), 0.5);
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
        let jittered = |interval| {
            HealthConfig::new()
                .interval(interval)
                .max_backoff(S(300))
                .jitter(0.2)
                .check_backoff()
        };
        assert_eq!(jittered(S(10)).delay(0, 0.0), S(8));
        assert_eq!(jittered(S(10)).delay(0, 0.5), S(10));
        assert!(jittered(S(10)).delay(0, 0.999_999) <= S(12));
        assert!(jittered(S(300)).delay(0, 0.999) <= S(300));
    }

    #[test]
    fn watch_delays_grow_by_1_6_and_cap_at_120_s() {
        let b = endpoint_state::Backoff {
            jitter: 0.0,
            ..HealthConfig::DEFAULT_WATCH_BACKOFF
        };
        let ms = |a| b.delay(a, 0.5).as_millis();
        assert_eq!(
            [ms(0), ms(1), ms(2), ms(3), ms(10), ms(11), ms(1000)],
            [1000, 1600, 2560, 4096, 109_951, 120_000, 120_000]
        );
        let jittered = HealthConfig::DEFAULT_WATCH_BACKOFF;
        assert_eq!(jittered.delay(0, 0.0).as_millis(), 800);
        assert_eq!(jittered.delay(0, 0.5).as_millis(), 1000);
        assert!(jittered.delay(0, 0.999_999) <= Duration::from_millis(1200));
    }
}

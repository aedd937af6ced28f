//! The builder: targets, endpoint template, health, quarantine, breaker, strategy — validated
//! whole before anything starts.

use endpoint_state::ConfigError;
use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use balance_layer::{Balance, BalanceConfig, Strategy, Weights};
use breaker_layer::BreakerConfig;
use endpoint_state::FailureCodes;
use health_layer::{HealthChecker, HealthConfig};
use quarantine_layer::{QuarantineConfig, QuarantineGroup};
use tokio::sync::mpsc;
use tonic::transport::Endpoint;

use crate::discovery::Source;
use crate::dns::{DnsSettings, DnsTarget};
use crate::error::{BoxError, BuildError};
use crate::kit::Kit;
use crate::life::{KitState, Life};
use crate::per_target::{PerTargetLayers, TargetService};
use crate::registry::{NewTarget, Registry};
use crate::stack::{CHANGES_CAPACITY, KitDiscover, Request, StackFactory};
use crate::target::{Target, TargetOptions};
use crate::template::EndpointTemplate;

mod address;
#[cfg(feature = "dns")]
pub(crate) use address::resolved_address;
pub(crate) use address::{normalize, resolve_target};

/// Builds a [`Kit`]. Every setting has a default except the targets; [`build`](Self::build)
/// validates everything first and starts nothing unless all of it is valid.
///
/// | setting | default |
/// |---|---|
/// | [`target`](Self::target) / [`targets`](Self::targets) / [`discover`](Self::discover) | required: exactly one of them |
/// | [`per_target_layer`](Self::per_target_layer) | none |
/// | [`endpoint_template`](Self::endpoint_template) | the URI with tonic's defaults |
/// | [`health`](Self::health) | `Check` every 30 s, 5 s timeout ([`HealthConfig::default`]) |
/// | [`quarantine`](Self::quarantine) | 5 s after `UNAVAILABLE` / `DEADLINE_EXCEEDED` |
/// | [`breaker`](Self::breaker) | open after 5 consecutive failures, for 5 s (growing) |
/// | [`strategy`](Self::strategy) | round-robin |
/// | [`wait_for_ready`](Self::wait_for_ready) | `false`: fail at once when nothing is eligible |
/// | [`max_wait`](Self::max_wait) | none: a wait-for-ready call waits up to its deadline, or 20 s without one |
/// | [`connecting_wait`](Self::connecting_wait) | 5 s: a call made while targets are connecting waits for their first verdicts |
/// | [`transparent_retry`](Self::transparent_retry) | `true`: a call no backend acted on goes to another target |
/// | [`dns`](Self::dns) | re-resolve by TTL, between 1 s and 30 s |
/// | [`service_config`](Self::service_config) | none |
///
/// The breaker always runs in [`WhenOpen::Wait`](crate::breaker::WhenOpen::Wait) mode under the
/// kit (an open target is skipped by the balancer, and named in the error when no target is
/// left).
pub struct KitBuilder {
    target: Option<Target>,
    targets: Option<Vec<Target>>,
    /// A discovery source of the user's.
    discover: Option<Source>,
    /// The user's layers inside every target's stack.
    layers: PerTargetLayers,
    template: EndpointTemplate,
    health: Option<HealthConfig>,
    quarantine: Option<QuarantineConfig>,
    breaker: Option<BreakerConfig>,
    balance: BalanceConfig,
    dns: DnsSettings,
    transparent_retry: bool,
    /// The kit's name in its spans and metrics (`grpc.target`); `None`: its target.
    name: Option<String>,
    /// gRPC's service config, as JSON (read by `build`).
    service_config: Option<String>,
}

impl fmt::Debug for KitBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KitBuilder")
            .field("target", &self.target)
            .field("targets", &self.targets)
            .field("discover", &self.discover.is_some())
            .field("per_target_layers", &self.layers)
            .field("health", &self.health)
            .field("quarantine", &self.quarantine)
            .field("breaker", &self.breaker)
            .field("balance", &self.balance)
            .field("dns", &self.dns)
            .field("transparent_retry", &self.transparent_retry)
            .field("name", &self.name)
            .field("service_config", &self.service_config)
            .finish_non_exhaustive()
    }
}

impl Kit {
    /// A builder with the defaults: health `Check` every 30 s, quarantine 5 s, breaker after 5
    /// consecutive failures, round-robin.
    pub fn builder() -> KitBuilder {
        KitBuilder::new()
    }
}

impl Default for KitBuilder {
    fn default() -> Self {
        KitBuilder::new()
    }
}

impl KitBuilder {
    /// The defaults (see the table above); no target yet.
    pub fn new() -> Self {
        KitBuilder {
            target: None,
            targets: None,
            discover: None,
            layers: PerTargetLayers::default(),
            template: EndpointTemplate::new(),
            health: Some(HealthConfig::default()),
            quarantine: Some(QuarantineConfig::default()),
            breaker: Some(BreakerConfig::default()),
            balance: BalanceConfig::default(),
            dns: DnsSettings::default(),
            transparent_retry: true,
            name: None,
            service_config: None,
        }
    }

    /// One target: an address (`http://10.0.0.7:50051`; `10.0.0.7:50051` means `http://`) or a
    /// DNS name re-resolved as its records change (`dns:///billing.svc:50051`, see
    /// [`dns`](crate::dns)). Exclusive with [`targets`](Self::targets).
    ///
    /// The target's name — in statuses, logs, metrics, [`Kit::card`] — is the address with its
    /// scheme and host lowercased. An address with user info (`http://user:secret@host:1`) is
    /// refused: the credentials would be in every one of those.
    ///
    /// A [`Target`] carries its own options too (its health service name); for a `dns:` name,
    /// every address it resolves to shares them.
    #[must_use]
    pub fn target(mut self, target: impl Into<Target>) -> Self {
        self.target = Some(target.into());
        self
    }

    /// A fixed list of addresses (strings, or [`Target`]s with their own options). Exclusive
    /// with [`target`](Self::target) and [`discover`](Self::discover). Two addresses that
    /// differ only in the case of their scheme or host are the same target: refused as a
    /// duplicate.
    #[must_use]
    pub fn targets<I>(mut self, targets: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<Target>,
    {
        self.targets = Some(targets.into_iter().map(Into::into).collect());
        self
    }

    /// Targets from a discovery source of your own — Kubernetes EndpointSlices, Consul, a
    /// registry — as any [`tower::discover::Discover`] keyed by the target's URI (an address,
    /// named as [`targets`](Self::targets) names it), whose inserted value is the target's
    /// [`TargetOptions`] (or `()` for the defaults). A `Stream` of `Change`s is a `Discover`
    /// once mapped to `Ok` (`stream.map(Ok::<_, Infallible>)`). Exclusive with
    /// [`target`](Self::target) and [`targets`](Self::targets).
    ///
    /// The kit's discovery task applies each change as it comes: an `Insert` adds the target
    /// as [`Kit::add_target`] would (a bad address is logged, naming it, and skipped; the same
    /// target inserted again with other options replaces it); a `Remove` drains it — the
    /// balancer stops picking it at once, calls in flight on it finish, then its connections
    /// close. An error from the source is logged and the source polled again (after a short
    /// wait, growing with errors in a row, at most 5 s); when the source ends, the targets stay
    /// as they are. [`Kit::wait_until_ready`] waits for a first batch of changes. Targets are
    /// not added or removed by hand on such a kit.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use grpc_client_kit::{Kit, TargetOptions};
    /// use tower::discover::Change;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let (tx, mut rx) = tokio::sync::mpsc::channel::<Change<String, TargetOptions>>(16);
    /// let changes = futures_util::stream::poll_fn(move |cx| {
    ///     rx.poll_recv(cx).map(|change| change.map(Ok::<_, Infallible>))
    /// });
    /// let kit = Kit::builder().discover(changes).without_health().build()?;
    /// tx.send(Change::Insert("http://127.0.0.1:50051".into(), TargetOptions::new())).await?;
    /// # kit.wait_until_ready(std::time::Duration::from_secs(5)).await;
    /// # assert_eq!(kit.targets().len(), 1);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn discover<D>(mut self, discover: D) -> Self
    where
        D: tower::discover::Discover + Send + 'static,
        D::Key: AsRef<str>,
        D::Service: Into<TargetOptions>,
        D::Error: Into<BoxError>,
    {
        self.discover = Some(Source::new(discover));
        self
    }

    /// Adds a tower layer of your own inside every target's stack: above the target's
    /// transport (its channel, whose errors name the target), below the kit's gates — breaker,
    /// quarantine, health — so that everything it returns is classified like any other outcome
    /// of that target (an error it returns counts against the target's breaker and, if its
    /// code is a quarantine code, quarantines it; a [`tonic::Status`] error keeps its code, any
    /// other error counts as `UNAVAILABLE`). Each target gets its own instance
    /// (`layer.layer(...)` once per target): a `ConcurrencyLimitLayer` limits each target on
    /// its own.
    ///
    /// The layer wraps a [`TargetService`] (type-erased) and may return any service over it
    /// whose response body carries `Bytes`. Called more than once, the first layer is the
    /// outermost, as with `ServiceBuilder`. Without any, the stack is what it always was (no
    /// box); with one, each call and response body of the layered part is boxed once.
    ///
    /// ```
    /// use grpc_client_kit::Kit;
    /// use tower::limit::ConcurrencyLimitLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let kit = Kit::builder()
    ///     .targets(["http://127.0.0.1:50051", "http://127.0.0.1:50052"])
    ///     .per_target_layer(ConcurrencyLimitLayer::new(64)) // 64 calls at once per target
    ///     .build()?;
    /// # let _ = kit;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn per_target_layer<L, B>(mut self, layer: L) -> Self
    where
        L: tower_layer::Layer<TargetService> + Send + Sync + 'static,
        L::Service: tower_service::Service<Request, Response = http::Response<B>>
            + Clone
            + Send
            + Sync
            + 'static,
        <L::Service as tower_service::Service<Request>>::Future: Send + 'static,
        <L::Service as tower_service::Service<Request>>::Error: Into<BoxError>,
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        self.layers.push(layer);
        self
    }

    /// How a target's URI becomes its tonic `Endpoint` (TLS, origin, user agent, timeouts).
    /// The same endpoint builds the application channel and the health probe's channel.
    #[must_use]
    pub fn endpoint_template<F>(mut self, f: F) -> Self
    where
        F: Fn(&str) -> Result<Endpoint, BoxError> + Send + Sync + 'static,
    {
        self.template = EndpointTemplate::from_fn(f);
        self
    }

    /// Sets the [`EndpointTemplate`] itself.
    #[must_use]
    pub fn template(mut self, template: EndpointTemplate) -> Self {
        self.template = template;
        self
    }

    /// Active health checking: mode (`Check`, `Watch`), interval, timeout, service name,
    /// unimplemented policy, ... (its endpoint template is not used: probes use the kit's).
    #[must_use]
    pub fn health(mut self, config: HealthConfig) -> Self {
        self.health = Some(config);
        self
    }

    /// No active health checking: every target counts as healthy (quarantine and the breaker
    /// still apply).
    #[must_use]
    pub fn without_health(mut self) -> Self {
        self.health = None;
        self
    }

    /// Passive quarantine.
    #[must_use]
    pub fn quarantine(mut self, config: QuarantineConfig) -> Self {
        self.quarantine = Some(config);
        self
    }

    /// No passive quarantine (failed calls never take a target out;
    /// [`report_failure`](crate::quarantine::QuarantineGroup::report_failure) still works).
    #[must_use]
    pub fn without_quarantine(mut self) -> Self {
        self.quarantine = None;
        self
    }

    /// The circuit breaker of every target (its `when_open` is always `Wait` under the kit).
    #[must_use]
    pub fn breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = Some(config);
        self
    }

    /// No circuit breaker (every target's breaker is disabled: calls pass, nothing counted).
    #[must_use]
    pub fn without_breaker(mut self) -> Self {
        self.breaker = None;
        self
    }

    /// How the balancer chooses among eligible targets. Weights are keyed by target name
    /// (the address as written, with `http://` added when it had no scheme).
    #[must_use]
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.balance.strategy = strategy;
        self
    }

    /// Whether a call made while no target is eligible waits for one (up to its own deadline
    /// and [`max_wait`](Self::max_wait)) instead of failing at once.
    #[must_use]
    pub fn wait_for_ready(mut self, wait: bool) -> Self {
        self.balance.wait_for_ready = wait;
        self
    }

    /// Whether a call the backend provably did not act on — connecting to its target was
    /// refused, the target's connection closed before taking the request, or the backend
    /// refused its stream (`GOAWAY` naming an earlier last stream, `REFUSED_STREAM`) — is sent
    /// once more, to another eligible target, instead of failing (gRPC's "transparent retry").
    /// Default `true`.
    ///
    /// A call the backend may have acted on (reset, broken pipe, any status it returned) is
    /// never sent again; nor is one whose request body was longer than 64 KiB once sent. The
    /// cost on every call is keeping the request's headers (one clone) and its body's frames
    /// (shared, not copied) until it completes — never longer: when the call ends (answered,
    /// failed or dropped) what it kept is dropped, and a client stream's producer sees its
    /// channel close. All the calls of one kit keep at most 64 MiB of body frames together; a
    /// call whose frames do not fit goes without transparent retry.
    #[must_use]
    pub fn transparent_retry(mut self, retry: bool) -> Self {
        self.transparent_retry = retry;
        self
    }

    /// How long a call waits while targets are *connecting* (no health verdict yet, or a
    /// `dns:` name not resolved yet) and none is eligible, before it fails — as gRPC queues
    /// calls while a channel connects. The call's own deadline bounds it too, and it fails at
    /// once when every target has evidence against it. Default 5 s, the default probe timeout
    /// (by then every target has a first verdict): raise it with the probe timeout.
    /// `Duration::ZERO` never waits.
    #[must_use]
    pub fn connecting_wait(mut self, wait: Duration) -> Self {
        self.balance.connecting_wait = wait;
        self
    }

    /// With [`wait_for_ready`](Self::wait_for_ready): a cap on how long any call waits for an
    /// eligible target — its own deadline, when sooner, ends the wait first. Not set by default:
    /// a call waits up to its own deadline, as gRPC's wait-for-ready does, and a call without a
    /// deadline up to [`BalanceConfig::DEFAULT_MAX_WAIT`] (20 s), so that none waits forever. A
    /// duration beyond any clock (`Duration::MAX`) is as long as anything waits.
    #[must_use]
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.balance.max_wait = Some(max_wait);
        self
    }

    /// The whole balancer configuration (strategy, wait-for-ready, seed).
    #[must_use]
    pub fn balance(mut self, config: BalanceConfig) -> Self {
        self.balance = config;
        self
    }

    /// The kit's name in its `debug` spans and its metrics (the `grpc.target` label: see the
    /// `metrics` module, with the `metrics` feature): tells two kits of one process apart.
    /// Default: the kit's target as configured — the `dns:` URI, the one address, or the
    /// addresses joined with `,`.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// How a DNS target is re-resolved.
    #[must_use]
    pub fn dns(mut self, settings: DnsSettings) -> Self {
        self.dns = settings;
        self
    }

    /// The channel described in gRPC's standard service config JSON — the document a team's
    /// other gRPC clients already use (gRPC's `doc/service_config.md`): the load-balancing
    /// policy (`loadBalancingConfig`, which sets the [`strategy`](Self::strategy)), the health
    /// service name (`healthCheckConfig.serviceName`), and per method (`methodConfig`) its
    /// `timeout`, `waitForReady`, `maxRequestMessageBytes` and `maxResponseMessageBytes`.
    /// `retryPolicy`, `hedgingPolicy` and `retryThrottling` apply as gRFC A6 says (see
    /// [`RetryPolicy`](crate::service_config::RetryPolicy) and
    /// [`HedgingPolicy`](crate::service_config::HedgingPolicy)). One call's
    /// [`CallOptions`](crate::CallOptions) combine with its method's settings (as gRPC's
    /// per-call options do). A `loadBalancingConfig` replaces the strategy, whichever was set
    /// first; a `healthCheckConfig` sets the [`health`](Self::health) service name (ignored,
    /// with a warning, when health checking is off).
    ///
    /// Read by [`build`](Self::build): invalid JSON or an invalid value fails it, naming the
    /// JSON path and the value (`service_config.methodConfig[0].timeout = "abc": expected a
    /// duration like "1.5s"`). Calling it again replaces the document.
    ///
    /// ```
    /// use std::time::Duration;
    /// use grpc_client_kit::Kit;
    /// use test_backends::Backends;
    /// use test_backends::pb::{Ping, test_service_client::TestServiceClient};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backends = Backends::start(2).await?;
    /// let kit = Kit::builder()
    ///     .targets(backends.uris())
    ///     .service_config(r#"{
    ///         "loadBalancingConfig": [{ "round_robin": {} }],
    ///         "healthCheckConfig": { "serviceName": "" },
    ///         "methodConfig": [{
    ///             "name": [{ "service": "gck.test.v1.TestService", "method": "Unary" }],
    ///             "timeout": "0.1s",
    ///             "waitForReady": true
    ///         }]
    ///     }"#)
    ///     .build()?;
    /// assert!(kit.wait_until_ready(Duration::from_secs(5)).await);
    /// let mut client = TestServiceClient::new(kit.channel());
    /// client.unary(Ping::default()).await?;
    ///
    /// // No target serves: `Unary` waits for one (waitForReady), until its deadline (timeout).
    /// for b in backends.iter() {
    ///     b.set_serving(false).await;
    ///     kit.checker().unwrap().check_now(&b.uri()).await?;
    /// }
    /// let status = client.unary(Ping::default()).await.unwrap_err();
    /// assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    /// assert!(status.message().ends_with("unhealthy (NOT_SERVING) (waited 0.1 s)"));
    ///
    /// let err = Kit::builder()
    ///     .targets(backends.uris())
    ///     .service_config(r#"{"methodConfig": [{"name": [{}], "timeout": "abc"}]}"#)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     "invalid grpc-client-kit configuration: service_config.methodConfig[0].timeout = \
    ///      \"abc\": expected a duration like \"1.5s\"",
    /// );
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn service_config(mut self, json: impl Into<String>) -> Self {
        self.service_config = Some(json.into());
        self
    }

    /// Validates everything, then starts the kit: the targets' channels (connected lazily), the
    /// health checker, the balancer's task and, for a DNS target, the resolver's task. On error
    /// nothing has started (no task, no connection, no probe).
    ///
    /// Must be called inside a tokio runtime (checked after the configuration).
    pub fn build(mut self) -> Result<Kit, BuildError> {
        // 1. Validate everything; nothing below starts anything.
        let spec = self.target_spec()?;
        let service_config = crate::service_config::for_kit(self.service_config.as_deref())?;
        if let Some(service) = service_config
            .as_ref()
            .and_then(|c| c.health_check_service_name())
        {
            match self.health.take() {
                Some(health) => self.health = Some(health.service(service)),
                None => tracing::warn!(
                    service,
                    "service config: healthCheckConfig is ignored: health checking is off"
                ),
            }
        }
        let name: Arc<str> = match &self.name {
            Some(name) => Arc::from(name.as_str()),
            None => spec.name(),
        };
        let checker: Option<HealthChecker> = match self.health {
            Some(config) => Some(
                config
                    .build()
                    .map_err(|e| e.within(crate::error::CONFIG, "health"))?,
            ),
            None => None,
        };
        let quarantine = self.quarantine.unwrap_or_else(|| {
            QuarantineConfig::default()
                .failure_codes(FailureCodes::NONE)
                .outlier_ejection(None)
        });
        let group = QuarantineGroup::new(quarantine)
            .map_err(|e| e.within(crate::error::CONFIG, "quarantine"))?;
        let breaker_enabled = self.breaker.is_some();
        let breaker = self
            .breaker
            .unwrap_or_default()
            .when_open(breaker_layer::WhenOpen::Wait);
        breaker
            .validate()
            .map_err(|e| e.within(crate::error::CONFIG, "breaker"))?;
        let mut balance = self.balance;
        if let Some(policy) = service_config.as_ref().and_then(|c| c.load_balancing()) {
            balance.strategy = crate::service_config::strategy(policy, &balance.strategy)?;
        }
        if let Strategy::Weighted(weights) = &balance.strategy {
            balance.strategy = Strategy::Weighted(normalize_weights(weights, &spec)?);
        }
        balance
            .validate()
            .map_err(|e| e.within(crate::error::CONFIG, ""))?;
        self.dns.validate()?;
        // 2. Start.
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime)?;
        #[cfg(feature = "dns")]
        let resolver = match &spec {
            TargetSpec::Dns(target, _) => Some(crate::dns::resolver(target)?),
            TargetSpec::Static(_) | TargetSpec::Discover => None,
        };
        let (changes_tx, changes_rx) = mpsc::channel(CHANGES_CAPACITY);
        // Every change of every target's card, from before the first target is added.
        #[cfg(feature = "metrics")]
        let card_events = group.peers().subscribe();
        let factory = StackFactory {
            group,
            breaker,
            breaker_enabled,
            known: self.template.settings().cloned(),
            observe: crate::observe::Observer::new(name),
            layers: std::mem::take(&mut self.layers),
        };
        let registry = Arc::new(Registry::new(
            factory,
            checker,
            self.template.clone(),
            changes_tx,
        ));
        let mut initial = Vec::new();
        let mut probes = Vec::new();
        let static_count;
        match &spec {
            TargetSpec::Static(targets) => {
                static_count = targets.len();
                for new in targets {
                    let (insert, probe) = registry.prepare(new)?;
                    initial.push(insert);
                    probes.push(probe);
                }
            }
            TargetSpec::Dns(..) | TargetSpec::Discover => static_count = 0,
        }
        if let Some(checker) = &registry.checker {
            checker.start(probes).map_err(|e| {
                ConfigError::problem(crate::error::CONFIG, "health", "", format!("{e}"))
                    .with_source(e)
            })?;
        }
        let strategy = balance.strategy.name();
        let balance = Balance::new(KitDiscover::new(initial, changes_rx), balance)
            .map_err(|e| e.within(crate::error::CONFIG, ""))?;
        let state = Arc::new(KitState::default());
        #[cfg_attr(not(any(feature = "dns", feature = "metrics")), allow(unused_mut))]
        let mut tasks = Vec::new();
        #[cfg(feature = "metrics")]
        tasks.push(crate::metrics::observe(
            &runtime,
            card_events,
            registry.factory.observe.metrics().clone(),
            balance.clone(),
        ));
        let discovered = matches!(spec, TargetSpec::Discover);
        let (resolved, dns_name) = match spec {
            TargetSpec::Static(_) => (None, None),
            TargetSpec::Discover => {
                let source = self
                    .discover
                    .take()
                    .expect("a discovery source for Discover");
                let (tx, rx) = tokio::sync::watch::channel(false);
                tasks.push(runtime.spawn(crate::discovery::run(source, registry.clone(), tx)));
                (Some(rx), None)
            }
            #[cfg(feature = "dns")]
            TargetSpec::Dns(target, options) => {
                let (tx, rx) = tokio::sync::watch::channel(false);
                let name: Arc<str> = Arc::from(target.name());
                let resolver = resolver.expect("resolver built for a DNS target");
                tasks.push(runtime.spawn(crate::dns::run(
                    target,
                    self.dns.clone(),
                    resolver,
                    registry.clone(),
                    state.clone(),
                    self.template.clone(),
                    options,
                    tx,
                )));
                (Some(rx), Some(name))
            }
            #[cfg(not(feature = "dns"))]
            TargetSpec::Dns(..) => unreachable!("refused without the dns feature"),
        };
        drop(runtime);
        tracing::info!(
            targets = static_count,
            dns = dns_name.as_deref().unwrap_or(""),
            discover = discovered,
            strategy,
            health = registry.checker.is_some(),
            "kit started"
        );
        Ok(Kit {
            life: Arc::new(Life {
                state,
                balance,
                registry,
                tasks: Mutex::new(tasks),
                resolved,
                dns_name,
                discovered,
                transparent_retry: self.transparent_retry,
                calls: service_config
                    .as_ref()
                    .filter(|c| c.applies_to_calls())
                    .map(|c| Arc::new(c.clone())),
                retries: crate::policy::Retries::for_kit(service_config.as_ref()),
                service_config: service_config.map(Arc::new),
            }),
        })
    }

    fn target_spec(&self) -> Result<TargetSpec, ConfigError> {
        if self.discover.is_some() {
            let (field, value) = match (&self.target, &self.targets) {
                (Some(one), _) => ("target", format!("{:?}", one.uri())),
                (None, Some(list)) => (
                    "targets",
                    format!("{:?}", list.iter().map(Target::uri).collect::<Vec<_>>()),
                ),
                (None, None) => return Ok(TargetSpec::Discover),
            };
            return Err(ConfigError::problem(
                crate::error::CONFIG,
                field,
                value,
                format!(
                    "set either `discover` (a discovery source) or `{field}`, not both: the \
                     source owns the set of targets"
                ),
            ));
        }
        match (&self.target, &self.targets) {
            (Some(one), Some(_)) => Err(ConfigError::problem(
                crate::error::CONFIG,
                "target",
                format!("{:?}", one.uri()),
                "set either `target` (one address or a `dns:` name) or `targets` (a list of \
                 addresses), not both",
            )),
            (None, None) => Err(ConfigError::problem(
                crate::error::CONFIG,
                "targets",
                "",
                "no target: set `target` (one address or a `dns:` name), `targets` (a list \
                 of addresses) or `discover` (a discovery source)",
            )),
            (Some(one), None) if one.uri().starts_with("dns:") => {
                let target = DnsTarget::parse(one.uri())?;
                if cfg!(feature = "dns") {
                    Ok(TargetSpec::Dns(target, one.options().clone()))
                } else {
                    Err(ConfigError::problem(
                        crate::error::CONFIG,
                        "target",
                        format!("{:?}", one.uri()),
                        "DNS targets need the `dns` cargo feature of grpc-client-kit",
                    ))
                }
            }
            (Some(one), None) => Ok(TargetSpec::Static(vec![
                self.resolve_static("target", one)?,
            ])),
            (None, Some(list)) => {
                if list.is_empty() {
                    return Err(ConfigError::problem(
                        crate::error::CONFIG,
                        "targets",
                        "[]",
                        "the list is empty: give at least one address",
                    ));
                }
                let mut seen = HashSet::new();
                let mut out = Vec::with_capacity(list.len());
                for (i, t) in list.iter().enumerate() {
                    let field = format!("targets[{i}]");
                    if t.uri().starts_with("dns:") {
                        return Err(ConfigError::problem(
                            crate::error::CONFIG,
                            field,
                            format!("{:?}", t.uri()),
                            "a `dns:` name goes in `target`, alone",
                        ));
                    }
                    let new = self.resolve_static(&field, t)?;
                    if !seen.insert(new.name.clone()) {
                        return Err(ConfigError::problem(
                            crate::error::CONFIG,
                            field,
                            format!("{:?}", t.uri()),
                            format!("{} is listed twice", new.name),
                        ));
                    }
                    out.push(new);
                }
                Ok(TargetSpec::Static(out))
            }
        }
    }

    fn resolve_static(&self, field: &str, t: &Target) -> Result<NewTarget, ConfigError> {
        resolve_target(&self.template, field, t)
    }
}

/// Targets as written by the user, resolved.
enum TargetSpec {
    Static(Vec<NewTarget>),
    #[cfg_attr(not(feature = "dns"), allow(dead_code))]
    Dns(DnsTarget, TargetOptions),
    /// From the builder's discovery source.
    Discover,
}

impl TargetSpec {
    /// The kit's default name: the `dns:` URI, the addresses joined with `,`, or `discover`.
    fn name(&self) -> Arc<str> {
        match self {
            TargetSpec::Static(list) => {
                let names: Vec<&str> = list.iter().map(|new| &*new.name).collect();
                Arc::from(names.join(","))
            }
            TargetSpec::Dns(target, _) => Arc::from(target.name()),
            TargetSpec::Discover => Arc::from("discover"),
        }
    }
}

/// Weights keyed as targets are named; for a fixed list, a weight for a target that is not in
/// it is refused (a typo would silently weigh nothing).
fn normalize_weights(weights: &Weights, spec: &TargetSpec) -> Result<Weights, ConfigError> {
    let mut out = Weights::new();
    for (target, weight) in weights.iter() {
        let name = if target.is_empty() {
            String::new()
        } else {
            normalize(target)
        };
        if let TargetSpec::Static(list) = spec
            && !name.is_empty()
            && !list.iter().any(|new| *new.name == *name)
        {
            return Err(ConfigError::problem(
                crate::error::CONFIG,
                format!("weights[{target}]"),
                weight.to_string(),
                "not one of the targets",
            ));
        }
        out = out.weight(name, weight);
    }
    Ok(out)
}

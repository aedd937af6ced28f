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

use crate::dns::{DnsSettings, DnsTarget};
use crate::error::{BoxError, BuildError};
use crate::kit::Kit;
use crate::life::{KitState, Life};
use crate::registry::Registry;
use crate::stack::{CHANGES_CAPACITY, KitDiscover, StackFactory};
use crate::template::EndpointTemplate;

mod address;
pub(crate) use address::{normalize, resolve_address};

/// Builds a [`Kit`]. Every setting has a default except the targets; [`build`](Self::build)
/// validates everything first and starts nothing unless all of it is valid.
///
/// | setting | default |
/// |---|---|
/// | [`target`](Self::target) / [`targets`](Self::targets) | required: exactly one of them |
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
///
/// The breaker always runs in [`WhenOpen::Wait`](crate::breaker::WhenOpen::Wait) mode under the
/// kit (an open target is skipped by the balancer, and named in the error when no target is
/// left).
pub struct KitBuilder {
    target: Option<String>,
    targets: Option<Vec<String>>,
    template: EndpointTemplate,
    health: Option<HealthConfig>,
    quarantine: Option<QuarantineConfig>,
    breaker: Option<BreakerConfig>,
    balance: BalanceConfig,
    dns: DnsSettings,
    transparent_retry: bool,
    /// The kit's name in its spans and metrics (`grpc.target`); `None`: its target.
    name: Option<String>,
}

impl fmt::Debug for KitBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KitBuilder")
            .field("target", &self.target)
            .field("targets", &self.targets)
            .field("health", &self.health)
            .field("quarantine", &self.quarantine)
            .field("breaker", &self.breaker)
            .field("balance", &self.balance)
            .field("dns", &self.dns)
            .field("transparent_retry", &self.transparent_retry)
            .field("name", &self.name)
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
            template: EndpointTemplate::new(),
            health: Some(HealthConfig::default()),
            quarantine: Some(QuarantineConfig::default()),
            breaker: Some(BreakerConfig::default()),
            balance: BalanceConfig::default(),
            dns: DnsSettings::default(),
            transparent_retry: true,
            name: None,
        }
    }

    /// One target: an address (`http://10.0.0.7:50051`; `10.0.0.7:50051` means `http://`) or a
    /// DNS name re-resolved as its records change (`dns:///billing.svc:50051`, see
    /// [`dns`](crate::dns)). Exclusive with [`targets`](Self::targets).
    ///
    /// The target's name — in statuses, logs, metrics, [`Kit::card`] — is the address with its
    /// scheme and host lowercased. An address with user info (`http://user:secret@host:1`) is
    /// refused: the credentials would be in every one of those.
    #[must_use]
    pub fn target(mut self, target: impl Into<String>) -> Self {
        self.target = Some(target.into());
        self
    }

    /// A fixed list of addresses. Exclusive with [`target`](Self::target). Two addresses that
    /// differ only in the case of their scheme or host are the same target: refused as a
    /// duplicate.
    #[must_use]
    pub fn targets<I>(mut self, targets: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.targets = Some(targets.into_iter().map(Into::into).collect());
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

    /// Validates everything, then starts the kit: the targets' channels (connected lazily), the
    /// health checker, the balancer's task and, for a DNS target, the resolver's task. On error
    /// nothing has started (no task, no connection, no probe).
    ///
    /// Must be called inside a tokio runtime (checked after the configuration).
    pub fn build(self) -> Result<Kit, BuildError> {
        // 1. Validate everything; nothing below starts anything.
        let spec = self.target_spec()?;
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
            TargetSpec::Dns(target) => Some(crate::dns::resolver(target)?),
            TargetSpec::Static(_) => None,
        };
        let (changes_tx, changes_rx) = mpsc::channel(CHANGES_CAPACITY);
        // Every change of every target's card, from before the first target is added.
        #[cfg(feature = "metrics")]
        let card_events = group.peers().subscribe();
        let factory = StackFactory {
            group,
            breaker,
            breaker_enabled,
            own_connector: self.template.is_known(),
            observe: crate::observe::Observer::new(name),
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
                for (name, endpoint) in targets {
                    let (insert, probe) = registry.prepare(name.clone(), endpoint)?;
                    initial.push(insert);
                    probes.push(probe);
                }
            }
            TargetSpec::Dns(_) => static_count = 0,
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
        let (resolved, dns_name) = match spec {
            TargetSpec::Static(_) => (None, None),
            #[cfg(feature = "dns")]
            TargetSpec::Dns(target) => {
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
                    tx,
                )));
                (Some(rx), Some(name))
            }
            #[cfg(not(feature = "dns"))]
            TargetSpec::Dns(_) => unreachable!("refused without the dns feature"),
        };
        drop(runtime);
        tracing::info!(
            targets = static_count,
            dns = dns_name.as_deref().unwrap_or(""),
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
                transparent_retry: self.transparent_retry,
            }),
        })
    }

    fn target_spec(&self) -> Result<TargetSpec, ConfigError> {
        match (&self.target, &self.targets) {
            (Some(one), Some(_)) => Err(ConfigError::problem(
                crate::error::CONFIG,
                "target",
                format!("{one:?}"),
                "set either `target` (one address or a `dns:` name) or `targets` (a list of \
                 addresses), not both",
            )),
            (None, None) => Err(ConfigError::problem(
                crate::error::CONFIG,
                "targets",
                "",
                "no target: set `target` (one address or a `dns:` name) or `targets` (a list \
                 of addresses)",
            )),
            (Some(one), None) if one.starts_with("dns:") => {
                let target = DnsTarget::parse(one)?;
                if cfg!(feature = "dns") {
                    Ok(TargetSpec::Dns(target))
                } else {
                    Err(ConfigError::problem(
                        crate::error::CONFIG,
                        "target",
                        format!("{one:?}"),
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
                    if t.starts_with("dns:") {
                        return Err(ConfigError::problem(
                            crate::error::CONFIG,
                            field,
                            format!("{t:?}"),
                            "a `dns:` name goes in `target`, alone",
                        ));
                    }
                    let (name, endpoint) = self.resolve_static(&field, t)?;
                    if !seen.insert(name.clone()) {
                        return Err(ConfigError::problem(
                            crate::error::CONFIG,
                            field,
                            format!("{t:?}"),
                            format!("{name} is listed twice"),
                        ));
                    }
                    out.push((name, endpoint));
                }
                Ok(TargetSpec::Static(out))
            }
        }
    }

    fn resolve_static(&self, field: &str, t: &str) -> Result<(Arc<str>, Endpoint), ConfigError> {
        resolve_address(&self.template, field, t)
    }
}

/// Targets as written by the user, resolved.
enum TargetSpec {
    Static(Vec<(Arc<str>, Endpoint)>),
    #[cfg_attr(not(feature = "dns"), allow(dead_code))]
    Dns(DnsTarget),
}

impl TargetSpec {
    /// The kit's default name: the `dns:` URI, or the addresses joined with `,`.
    fn name(&self) -> Arc<str> {
        match self {
            TargetSpec::Static(list) => {
                let names: Vec<&str> = list.iter().map(|(name, _)| &**name).collect();
                Arc::from(names.join(","))
            }
            TargetSpec::Dns(target) => Arc::from(target.name()),
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
            && !list.iter().any(|(n, _)| **n == *name)
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

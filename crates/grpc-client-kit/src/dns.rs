//! Targets from a DNS name, re-resolved as its records change.
//!
//! A DNS target is written as gRPC names it: `dns:[//nameserver/]host[:port]` — for example
//! `dns:///billing.default.svc.cluster.local:50051` (a Kubernetes headless service, resolved by
//! the system's resolver) or `dns://10.0.0.2:53/billing.internal:50051` (a given nameserver).
//! The port defaults to 443. Every address the name resolves to (A and AAAA records) becomes a
//! target `http://ADDRESS:PORT` (`https` with [`DnsSettings::scheme`]), health-checked like any
//! other.
//!
//! **The name stays the server's name**, as in gRPC: each address's endpoint is built by the
//! kit's endpoint template from the *name* — `http://HOST:PORT` — and only its connections go
//! to the address. So every call (and every probe) sends `:authority: HOST:PORT`, and over TLS
//! the server is verified as `HOST` (tonic takes the server name from the endpoint's URI when
//! its `ClientTlsConfig` sets no `domain_name`): a certificate for the name works, with no
//! `domain_name` to set. A template's own `origin` or `domain_name` still wins. Connections to
//! the address are made by the kit's TCP connector (which applies the endpoint's TCP settings
//! but cannot read back an `Endpoint::local_address`), or by the template's connector, asked
//! for the address in place of the host
//! ([`EndpointTemplate::from_connector_fn`](crate::EndpointTemplate::from_connector_fn)).
//!
//! The name is resolved again when the answer's TTL runs out — never sooner than
//! [`min_refresh`](DnsSettings::min_refresh) (at least 1 s) nor later than
//! [`refresh`](DnsSettings::refresh) — and the target set follows: new addresses are added at
//! once; an address is removed (its calls in flight finish) once it is **missing from two
//! answers in a row**. Resolvers often answer with a subset of the records (a multivalue
//! answer, a truncated one): an address missing from one answer keeps its target — its
//! connection, its breaker and quarantine state — rather than being removed and added back.
//!
//! An answer is taken with care: the unspecified addresses (`0.0.0.0`, `::`), which no server
//! listens on, are dropped with a warning; at most
//! [`max_addresses`](DnsSettings::max_addresses) addresses are kept (those already known
//! first, then in address order), with a warning when an answer is cut. A failed resolution,
//! or an answer with no usable address, keeps the targets already known (as gRPC clients do),
//! retries with backoff (from `min_refresh`, doubling, at most `refresh`), and is named in the
//! error of any call that finds no healthy target
//! ([`DiscoveryFailed`](crate::error::DiscoveryFailed)).

use endpoint_state::ConfigError;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

/// A DNS name and port to resolve into targets. See the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsTarget {
    name: Arc<str>,
    host: String,
    port: u16,
    nameserver: Option<SocketAddr>,
}

impl DnsTarget {
    /// Parses `dns:[//nameserver[:port]/]host[:port]`.
    ///
    /// ```
    /// use grpc_client_kit::DnsTarget;
    /// let t = DnsTarget::parse("dns://127.0.0.1:5353/billing.test:50051").unwrap();
    /// assert_eq!((t.host(), t.port()), ("billing.test", 50051));
    /// assert_eq!(t.nameserver(), Some("127.0.0.1:5353".parse().unwrap()));
    /// assert_eq!(DnsTarget::parse("dns:///billing.test").unwrap().port(), 443);
    /// assert!(DnsTarget::parse("dns:///").is_err());
    /// ```
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let bad = |why: &str| {
            ConfigError::problem(
                crate::error::CONFIG,
                "target",
                format!("{s:?}"),
                why.to_owned(),
            )
        };
        let rest = s
            .strip_prefix("dns:")
            .ok_or_else(|| bad("a DNS target starts with `dns:`"))?;
        let (nameserver, rest) = match rest.strip_prefix("//") {
            Some(after) => {
                let (authority, rest) = after.split_once('/').ok_or_else(|| {
                    bad("expected `dns://NAMESERVER/HOST[:PORT]` (or `dns:///HOST[:PORT]`)")
                })?;
                let nameserver = if authority.is_empty() {
                    None
                } else if let Ok(addr) = authority.parse::<SocketAddr>() {
                    Some(addr)
                } else if let Ok(ip) = authority.parse::<IpAddr>() {
                    Some(SocketAddr::new(ip, 53))
                } else {
                    return Err(bad(
                        "the nameserver must be an IP address, with an optional port",
                    ));
                };
                (nameserver, rest)
            }
            None => (None, rest),
        };
        let (host, port) = split_host_port(rest).ok_or_else(|| bad("expected HOST[:PORT]"))?;
        if host.is_empty() {
            return Err(bad("the host name is empty"));
        }
        Ok(DnsTarget {
            name: Arc::from(s),
            host: host.to_owned(),
            port,
            nameserver,
        })
    }

    /// The target as written (`dns:///billing.svc:50051`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host name resolved.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port of every resolved target.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The nameserver asked, or `None` for the system's resolver configuration.
    pub fn nameserver(&self) -> Option<SocketAddr> {
        self.nameserver
    }
}

impl fmt::Display for DnsTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

fn split_host_port(s: &str) -> Option<(&str, u16)> {
    if let Some(v6) = s.strip_prefix('[') {
        let (host, rest) = v6.split_once(']')?;
        return match rest.strip_prefix(':') {
            Some(port) => Some((host, port.parse().ok()?)),
            None if rest.is_empty() => Some((host, 443)),
            None => None,
        };
    }
    match s.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => Some((host, port.parse().ok()?)),
        Some(_) => None,
        None => Some((s, 443)),
    }
}

/// How a DNS target is re-resolved (the `[dns]` block of a [`KitConfig`](crate::KitConfig)).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsSettings {
    /// The longest time between two resolutions (and the longest retry wait). Default 30 s.
    #[serde(default = "default_refresh", with = "humantime_serde")]
    pub refresh: Duration,
    /// The shortest time between two resolutions, whatever the TTL (and the first retry wait
    /// after a failure). Default 1 s.
    #[serde(default = "default_min_refresh", with = "humantime_serde")]
    pub min_refresh: Duration,
    /// The scheme of the resolved targets' URIs: `http` (default) or `https`.
    #[serde(default = "default_scheme")]
    pub scheme: String,
    /// The most addresses taken from one answer (default 1024): each is a target with its own
    /// connections, probes and card. Those already known are kept first; the rest of a longer
    /// answer is dropped with a warning.
    #[serde(default = "default_max_addresses")]
    pub max_addresses: usize,
}

/// The shortest [`DnsSettings::min_refresh`] accepted: 1 s. A TTL-0 answer (common for
/// headless services) is re-resolved every `min_refresh`; below a second that is a query loop
/// against the resolver, for no gain — no change of records needs a faster reaction than the
/// health checker's (gRPC's own DNS resolvers wait 30 s between resolutions).
pub const MIN_REFRESH_FLOOR: Duration = Duration::from_secs(1);

/// How many answers in a row an address must be missing from before its target is removed.
#[cfg(feature = "dns")]
const MISSES_TO_REMOVE: u32 = 2;

fn default_max_addresses() -> usize {
    1024
}

fn default_refresh() -> Duration {
    Duration::from_secs(30)
}

fn default_min_refresh() -> Duration {
    Duration::from_secs(1)
}

fn default_scheme() -> String {
    "http".to_owned()
}

impl Default for DnsSettings {
    fn default() -> Self {
        DnsSettings {
            refresh: default_refresh(),
            min_refresh: default_min_refresh(),
            scheme: default_scheme(),
            max_addresses: default_max_addresses(),
        }
    }
}

impl DnsSettings {
    /// Sets [`refresh`](Self::refresh).
    #[must_use]
    pub fn refresh(mut self, refresh: Duration) -> Self {
        self.refresh = refresh;
        self
    }

    /// Sets [`min_refresh`](Self::min_refresh).
    #[must_use]
    pub fn min_refresh(mut self, min_refresh: Duration) -> Self {
        self.min_refresh = min_refresh;
        self
    }

    /// Sets [`scheme`](Self::scheme).
    #[must_use]
    pub fn scheme(mut self, scheme: impl Into<String>) -> Self {
        self.scheme = scheme.into();
        self
    }

    /// Sets [`max_addresses`](Self::max_addresses).
    #[must_use]
    pub fn max_addresses(mut self, max: usize) -> Self {
        self.max_addresses = max;
        self
    }

    /// Checks every field; the error names the first bad one and its value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.min_refresh < MIN_REFRESH_FLOOR {
            return Err(ConfigError::problem(
                crate::error::CONFIG,
                "dns.min_refresh",
                format!("{:?}", self.min_refresh),
                "must be at least 1 s: a TTL-0 answer is re-resolved every min_refresh, and \
                 below a second that is a query loop against the resolver",
            ));
        }
        if self.max_addresses == 0 {
            return Err(ConfigError::problem(
                crate::error::CONFIG,
                "dns.max_addresses",
                "0",
                "must be at least 1",
            ));
        }
        if self.refresh < self.min_refresh {
            return Err(ConfigError::problem(
                crate::error::CONFIG,
                "dns.refresh",
                format!("{:?}", self.refresh),
                format!("must be at least dns.min_refresh ({:?})", self.min_refresh),
            ));
        }
        if self.scheme != "http" && self.scheme != "https" {
            return Err(ConfigError::problem(
                crate::error::CONFIG,
                "dns.scheme",
                format!("{:?}", self.scheme),
                "must be \"http\" or \"https\"",
            ));
        }
        Ok(())
    }

    /// The retry wait after `failures` failures in a row.
    #[cfg(feature = "dns")]
    fn retry_after(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(20);
        self.min_refresh
            .checked_mul(1 << exp)
            .map_or(self.refresh, |d| d.min(self.refresh))
    }
}

/// The target name of a resolved address.
#[cfg(feature = "dns")]
pub(crate) fn target_uri(scheme: &str, addr: SocketAddr) -> Arc<str> {
    Arc::from(format!("{scheme}://{addr}"))
}

/// The URI every address of `target` is built from: the name itself (`scheme://HOST:PORT`).
#[cfg(feature = "dns")]
pub(crate) fn host_uri(scheme: &str, target: &DnsTarget) -> String {
    if target.host.contains(':') {
        format!("{scheme}://[{}]:{}", target.host, target.port)
    } else {
        format!("{scheme}://{}:{}", target.host, target.port)
    }
}

#[cfg(feature = "dns")]
pub(crate) use running::{resolver, run};

#[cfg(feature = "dns")]
mod running {
    use super::*;

    use std::collections::{BTreeSet, HashMap, HashSet};

    use hickory_resolver::config::{
        ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig,
    };
    use hickory_resolver::net::runtime::TokioRuntimeProvider;
    use tokio::sync::watch;

    use crate::builder::resolved_address;
    use crate::life::KitState;
    use crate::registry::Registry;
    use crate::target::TargetOptions;
    use crate::template::EndpointTemplate;

    pub(crate) type Resolver = hickory_resolver::TokioResolver;

    /// Builds the resolver for `target` (nothing is started).
    pub(crate) fn resolver(target: &DnsTarget) -> Result<Resolver, ConfigError> {
        let mut builder = match target.nameserver {
            Some(ns) => {
                let mut udp = ConnectionConfig::udp();
                udp.port = ns.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = ns.port();
                let config = ResolverConfig::from_parts(
                    None,
                    vec![],
                    vec![NameServerConfig::new(ns.ip(), true, vec![udp, tcp])],
                );
                let mut builder =
                    Resolver::builder_with_config(config, TokioRuntimeProvider::default());
                builder.options_mut().use_hosts_file = ResolveHosts::Never;
                builder
            }
            None => Resolver::builder_tokio().map_err(|e| {
                ConfigError::problem(
                    crate::error::CONFIG,
                    "target",
                    format!("{:?}", target.name()),
                    format!("cannot read the system's DNS configuration: {e}"),
                )
                .with_source(e)
            })?,
        };
        // The kit schedules its own resolutions (by TTL); a cache would only hide changes.
        builder.options_mut().cache_size = 0;
        builder.build().map_err(|e| {
            ConfigError::problem(
                crate::error::CONFIG,
                "target",
                format!("{:?}", target.name()),
                format!("cannot build a DNS resolver: {e}"),
            )
            .with_source(e)
        })
    }

    /// The DNS task: resolve, update the targets, sleep until the TTL (bounded), again.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn run(
        target: DnsTarget,
        settings: DnsSettings,
        resolver: Resolver,
        registry: Arc<Registry>,
        state: Arc<KitState>,
        template: EndpointTemplate,
        options: TargetOptions,
        resolved: watch::Sender<bool>,
    ) {
        let mut failures: u32 = 0;
        let mut answers = Answers::default();
        loop {
            let outcome = match resolver.lookup_ip(target.host.as_str()).await {
                Ok(lookup) => {
                    let ips: Vec<IpAddr> = lookup.iter().collect();
                    match answers.usable(&target, &ips) {
                        Some(addrs) => {
                            let ttl = lookup
                                .valid_until()
                                .saturating_duration_since(std::time::Instant::now());
                            Ok((addrs, ttl))
                        }
                        None => Err(format!("no usable address for {}", target.host)),
                    }
                }
                Err(e) => Err(e.to_string()),
            };
            let wait = match outcome {
                Ok((addrs, ttl)) => {
                    if failures > 0 {
                        tracing::info!(name = %target, addresses = addrs.len(), "DNS resolution works again");
                    }
                    failures = 0;
                    state.clear_dns_failure();
                    sync(
                        &target,
                        &settings,
                        &registry,
                        &template,
                        &options,
                        &addrs,
                        &mut answers,
                    )
                    .await;
                    resolved.send_replace(true);
                    ttl.clamp(settings.min_refresh, settings.refresh)
                }
                Err(reason) => {
                    failures = failures.saturating_add(1);
                    let known = registry.names().len();
                    if failures == 1 {
                        tracing::warn!(name = %target, error = %reason, known_targets = known, "DNS resolution failed; keeping the targets known");
                    } else {
                        tracing::debug!(name = %target, error = %reason, failures, "DNS resolution still failing");
                    }
                    state.set_dns_failure(target.name.clone(), Arc::from(reason));
                    settings.retry_after(failures)
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// What the task remembers between answers: how many answers in a row each known target
    /// has been missing from, and what the last answer's warnings were about (each warned once
    /// while it lasts).
    #[derive(Debug, Default)]
    pub(super) struct Answers {
        missed: HashMap<Arc<str>, u32>,
        unspecified: BTreeSet<IpAddr>,
        cut: usize,
    }

    impl Answers {
        /// The answer's usable addresses: without the unspecified ones (warned about). `None`
        /// when none is left.
        pub(super) fn usable(
            &mut self,
            target: &DnsTarget,
            ips: &[IpAddr],
        ) -> Option<BTreeSet<SocketAddr>> {
            let (unspecified, usable): (BTreeSet<IpAddr>, BTreeSet<IpAddr>) =
                ips.iter().partition(|ip| ip.is_unspecified());
            if !unspecified.is_empty() && unspecified != self.unspecified {
                tracing::warn!(name = %target, addresses = ?unspecified, "DNS answered with an unspecified address, which no server listens on; dropped");
            }
            self.unspecified = unspecified;
            let addrs: BTreeSet<SocketAddr> = usable
                .into_iter()
                .map(|ip| SocketAddr::new(ip, target.port))
                .collect();
            (!addrs.is_empty()).then_some(addrs)
        }

        /// What an answer (its target names) changes, given the targets known: the names to
        /// add (at most `max` targets in all, the known ones first) and those to remove (missing
        /// from [`MISSES_TO_REMOVE`] answers in a row).
        pub(super) fn plan(
            &mut self,
            target: &DnsTarget,
            known: &[Arc<str>],
            answer: BTreeSet<Arc<str>>,
            max: usize,
        ) -> Plan {
            let known_set: HashSet<&Arc<str>> = known.iter().collect();
            let mut remove = Vec::new();
            let mut kept = 0usize;
            for name in known {
                if answer.contains(name) {
                    self.missed.remove(name);
                    kept += 1;
                    continue;
                }
                let missed = self.missed.entry(name.clone()).or_insert(0);
                *missed += 1;
                if *missed >= MISSES_TO_REMOVE {
                    self.missed.remove(name);
                    remove.push(name.clone());
                } else {
                    kept += 1;
                }
            }
            // Counts of targets no longer known (removed by the kit's shutdown) are forgotten.
            self.missed.retain(|name, _| known_set.contains(name));
            let new: Vec<Arc<str>> = answer
                .into_iter()
                .filter(|name| !known_set.contains(name))
                .collect();
            let room = max.saturating_sub(kept);
            let cut = new.len().saturating_sub(room);
            if cut > 0 && cut != self.cut {
                tracing::warn!(name = %target, dropped = cut, max_addresses = max, "DNS answer has more addresses than dns.max_addresses; the rest are dropped");
            }
            self.cut = cut;
            let add = new.into_iter().take(room).collect();
            Plan { add, remove }
        }
    }

    /// What one answer changes.
    #[derive(Debug, PartialEq, Eq)]
    pub(super) struct Plan {
        pub(super) add: Vec<Arc<str>>,
        pub(super) remove: Vec<Arc<str>>,
    }

    /// Makes the registry's targets follow the resolved addresses (see [`Answers::plan`]).
    async fn sync(
        target: &DnsTarget,
        settings: &DnsSettings,
        registry: &Registry,
        template: &EndpointTemplate,
        options: &TargetOptions,
        addrs: &BTreeSet<SocketAddr>,
        answers: &mut Answers,
    ) {
        let by_name: HashMap<Arc<str>, SocketAddr> = addrs
            .iter()
            .map(|a| (target_uri(&settings.scheme, *a), *a))
            .collect();
        let answer: BTreeSet<Arc<str>> = by_name.keys().cloned().collect();
        let plan = answers.plan(target, &registry.names(), answer, settings.max_addresses);
        for name in &plan.remove {
            registry.remove(name).await;
        }
        let host_uri = host_uri(&settings.scheme, target);
        for name in plan.add {
            let address = by_name[&name];
            match resolved_address(template, name.clone(), &host_uri, address, options) {
                Ok(new) => {
                    registry.add(new).await;
                }
                Err(error) => {
                    tracing::warn!(name = %target, backend = %name, %error, "the endpoint template refused a resolved address");
                }
            }
        }
    }
}

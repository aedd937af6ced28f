//! Targets from a DNS name, re-resolved as its records change.
//!
//! A DNS target is written as gRPC names it: `dns:[//nameserver/]host[:port]` — for example
//! `dns:///billing.default.svc.cluster.local:50051` (a Kubernetes headless service, resolved by
//! the system's resolver) or `dns://10.0.0.2:53/billing.internal:50051` (a given nameserver).
//! The port defaults to 443. Every address the name resolves to (A and AAAA records) becomes a
//! target `http://ADDRESS:PORT` (`https` with [`DnsSettings::scheme`]), built with the kit's
//! endpoint template and health-checked like any other.
//!
//! The name is resolved again when the answer's TTL runs out — never sooner than
//! [`min_refresh`](DnsSettings::min_refresh) nor later than [`refresh`](DnsSettings::refresh)
//! — and the target set follows: new addresses are added, vanished ones removed (their calls in
//! flight finish). A failed resolution, or an answer with no address, keeps the targets already
//! known (as gRPC clients do), retries with backoff (from `min_refresh`, doubling, at most
//! `refresh`), and is named in the error of any call that finds no healthy target
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

    /// Checks every field; the error names the first bad one and its value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.min_refresh.is_zero() {
            return Err(ConfigError::problem(
                crate::error::CONFIG,
                "dns.min_refresh",
                format!("{:?}", self.min_refresh),
                "must be more than zero",
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

#[cfg(feature = "dns")]
pub(crate) use running::{resolver, run};

#[cfg(feature = "dns")]
mod running {
    use super::*;

    use std::collections::BTreeSet;

    use hickory_resolver::config::{
        ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig,
    };
    use hickory_resolver::net::runtime::TokioRuntimeProvider;
    use tokio::sync::watch;

    use crate::life::KitState;
    use crate::registry::Registry;
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
        resolved: watch::Sender<bool>,
    ) {
        let mut failures: u32 = 0;
        loop {
            let outcome = match resolver.lookup_ip(target.host.as_str()).await {
                Ok(lookup) => {
                    let addrs: BTreeSet<SocketAddr> = lookup
                        .iter()
                        .map(|ip| SocketAddr::new(ip, target.port))
                        .collect();
                    if addrs.is_empty() {
                        Err(format!("no address for {}", target.host))
                    } else {
                        let ttl = lookup
                            .valid_until()
                            .saturating_duration_since(std::time::Instant::now());
                        Ok((addrs, ttl))
                    }
                }
                Err(e) => Err(e.to_string()),
            };
            let wait = match outcome {
                Ok((addrs, ttl)) => {
                    if failures > 0 {
                        tracing::info!(name = %target, addresses = addrs.len(), "grpc-client-kit: DNS resolution works again");
                    }
                    failures = 0;
                    state.clear_dns_failure();
                    sync(&target, &settings, &registry, &template, &addrs).await;
                    resolved.send_replace(true);
                    ttl.clamp(settings.min_refresh, settings.refresh)
                }
                Err(reason) => {
                    failures = failures.saturating_add(1);
                    let known = registry.names().len();
                    if failures == 1 {
                        tracing::warn!(name = %target, error = %reason, known_targets = known, "grpc-client-kit: DNS resolution failed; keeping the targets known");
                    } else {
                        tracing::debug!(name = %target, error = %reason, failures, "grpc-client-kit: DNS resolution still failing");
                    }
                    state.set_dns_failure(target.name.clone(), Arc::from(reason));
                    settings.retry_after(failures)
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Makes the registry's targets the resolved addresses.
    async fn sync(
        target: &DnsTarget,
        settings: &DnsSettings,
        registry: &Registry,
        template: &EndpointTemplate,
        addrs: &BTreeSet<SocketAddr>,
    ) {
        let wanted: BTreeSet<Arc<str>> = addrs
            .iter()
            .map(|a| target_uri(&settings.scheme, *a))
            .collect();
        for name in registry.names() {
            if !wanted.contains(&name) {
                registry.remove(&name).await;
            }
        }
        for name in wanted {
            if registry.contains(&name) {
                continue;
            }
            match template.endpoint(&name) {
                Ok(endpoint) => registry.add(name, &endpoint).await,
                Err(error) => {
                    tracing::warn!(name = %target, target = %name, %error, "grpc-client-kit: the endpoint template refused a resolved address");
                }
            }
        }
    }
}

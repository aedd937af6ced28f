//! The configuration file: the kit's own keys, and each layer's configuration read by the
//! layer itself (their `serde` features), so that a setting is described once, where it lives.

mod claim;

use balance_layer::BalanceConfig;
use breaker_layer::BreakerConfig;
use endpoint_state::ConfigError;
use health_layer::HealthConfig;
use quarantine_layer::QuarantineConfig;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, de};

use crate::builder::KitBuilder;
use crate::dns::DnsSettings;
use crate::error::BuildError;
#[cfg(feature = "toml")]
use crate::error::CONFIG;
use crate::kit::Kit;
use crate::template::EndpointSettings;
use claim::{Claim, Switched};

/// The kit's configuration, as read from a file (TOML with [`from_toml`](Self::from_toml), or
/// any serde format). Unknown fields are refused; durations are written as humans write them
/// (`"250ms"`, `"5s"`, `"2m"`).
///
/// Exactly one of `target` (one address, or a `dns:` name) and `targets` (a list of addresses)
/// must be set. Every other block is optional and defaults as the [`KitBuilder`] does:
///
/// * `[health]` is a [`HealthConfig`], `[quarantine]` a [`QuarantineConfig`], `[breaker]` a
///   [`BreakerConfig`], each read by its own crate (see their docs for every field); in each,
///   `enabled = false` turns that layer off;
/// * the balancer's settings — `strategy`, `[weights]`, `[peak_ewma]`, `wait_for_ready`,
///   `max_wait`, `connecting_wait`, `seed` — stand at the top level, a [`BalanceConfig`];
/// * `[endpoint]` ([`EndpointSettings`]), `[dns]` ([`DnsSettings`]), `transparent_retry` and
///   `name` (in spans and metrics, see [`KitBuilder::name`]) are the kit's own;
/// * `service_config` is gRPC's service config, its JSON in a string (a TOML multi-line
///   literal string, `'''{ ... }'''`, takes it as written; see
///   [`KitBuilder::service_config`]). Its `loadBalancingConfig`, when it has one, replaces
///   `strategy`.
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
/// let err = KitConfig::from_toml("targets = []\n[health]\ntimout = \"2s\"").unwrap_err();
/// assert!(err.to_string().contains("unknown field `timout`"), "{err}");
/// # }
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct KitConfig {
    /// One target: an address or a `dns:` name. Exclusive with `targets`.
    pub target: Option<String>,
    /// A fixed list of addresses. Exclusive with `target`.
    pub targets: Option<Vec<String>>,
    /// Settings of every target's endpoint (application and probe channels alike).
    pub endpoint: EndpointSettings,
    /// Active health checking; `None` when `[health] enabled = false`.
    pub health: Option<HealthConfig>,
    /// Passive quarantine; `None` when `[quarantine] enabled = false`.
    pub quarantine: Option<QuarantineConfig>,
    /// Every target's breaker; `None` when `[breaker] enabled = false`.
    pub breaker: Option<BreakerConfig>,
    /// The balancer: the top-level `strategy`, `[weights]`, `[peak_ewma]`, `wait_for_ready`,
    /// `max_wait`, `connecting_wait` and `seed`.
    pub balance: BalanceConfig,
    /// Whether a call no backend acted on is sent once more, to another target
    /// (default `true`; see [`KitBuilder::transparent_retry`]).
    pub transparent_retry: Option<bool>,
    /// How a `dns:` target is re-resolved.
    pub dns: DnsSettings,
    /// The kit's name in its spans and metrics (see [`KitBuilder::name`]).
    pub name: Option<String>,
    /// gRPC's service config as JSON (see [`KitBuilder::service_config`]).
    pub service_config: Option<String>,
}

/// The top-level keys that are the kit's own (every other one is the balancer's).
const OWN: &[&str] = &[
    "target",
    "targets",
    "endpoint",
    "health",
    "quarantine",
    "breaker",
    "transparent_retry",
    "dns",
    "name",
    "service_config",
];

impl<'de> Deserialize<'de> for KitConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(KitVisitor)
    }
}

struct KitVisitor;

impl<'de> Visitor<'de> for KitVisitor {
    type Value = KitConfig;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the grpc-client-kit configuration (a table)")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<KitConfig, A::Error> {
        let mut config = KitConfig {
            health: Some(HealthConfig::default()),
            quarantine: Some(QuarantineConfig::default()),
            breaker: Some(BreakerConfig::default()),
            ..KitConfig::default()
        };
        let own = |key: &str| OWN.contains(&key);
        let take = |key: &str, map: &mut A| -> Result<(), A::Error> {
            match key {
                "target" => config.target = Some(map.next_value()?),
                "targets" => config.targets = Some(map.next_value()?),
                "endpoint" => config.endpoint = map.next_value()?,
                "health" => config.health = map.next_value::<Switched<_>>()?.0,
                "quarantine" => config.quarantine = map.next_value::<Switched<_>>()?.0,
                "breaker" => config.breaker = map.next_value::<Switched<_>>()?.0,
                "transparent_retry" => config.transparent_retry = Some(map.next_value()?),
                "dns" => config.dns = map.next_value()?,
                "name" => config.name = Some(map.next_value()?),
                "service_config" => config.service_config = Some(map.next_value()?),
                other => return Err(de::Error::unknown_field(other, OWN)),
            }
            Ok(())
        };
        let balance = BalanceConfig::deserialize(serde::de::value::MapAccessDeserializer::new(
            Claim::new(map, own, take),
        ))?;
        config.balance = balance;
        Ok(config)
    }
}

impl KitConfig {
    /// Reads a TOML document. A syntax error, an unknown field or a value of the wrong type is
    /// refused here, naming the field (as a path: `health.timeout`) and the value as written.
    #[cfg(feature = "toml")]
    pub fn from_toml(document: &str) -> Result<KitConfig, ConfigError> {
        let de = toml::Deserializer::parse(document).map_err(|e| {
            ConfigError::problem(CONFIG, "(document)", "", e.to_string()).with_source(e)
        })?;
        serde_path_to_error::deserialize(de).map_err(|e| {
            let mut field = e.path().to_string();
            let inner = e.into_inner();
            let mut value = inner
                .span()
                .and_then(|span| document.get(span))
                .unwrap_or("")
                .to_owned();
            let message = inner.message().to_owned();
            // A problem of the whole document that names a top-level key (`weights` without
            // `strategy = "weighted"`) is that key's.
            if field == "."
                && let Some(key) = message
                    .strip_prefix('`')
                    .and_then(|m| m.split_once('`'))
                    .map(|(key, _)| key)
                && let Ok(table) = document.parse::<toml::Table>()
                && let Some(written) = table.get(key)
            {
                field = key.to_owned();
                value = written.to_string();
            }
            ConfigError::problem(CONFIG, field, value, message).with_source(inner)
        })
    }

    /// A [`KitBuilder`] with these settings (adjust it further, or [`build`](KitBuilder::build)
    /// it). Values are checked by `build`.
    pub fn builder(&self) -> Result<KitBuilder, ConfigError> {
        let mut b = KitBuilder::new();
        if let Some(t) = &self.target {
            b = b.target(t.clone());
        }
        if let Some(ts) = &self.targets {
            b = b.targets(ts.clone());
        }
        self.endpoint.validate()?;
        b = b.template(self.endpoint.template());
        b = match &self.health {
            Some(h) => b.health(h.clone()),
            None => b.without_health(),
        };
        b = match &self.quarantine {
            Some(q) => b.quarantine(q.clone()),
            None => b.without_quarantine(),
        };
        b = match &self.breaker {
            Some(c) => b.breaker(c.clone()),
            None => b.without_breaker(),
        };
        b = b.balance(self.balance.clone());
        if let Some(retry) = self.transparent_retry {
            b = b.transparent_retry(retry);
        }
        if let Some(name) = &self.name {
            b = b.name(name.clone());
        }
        if let Some(json) = &self.service_config {
            b = b.service_config(json.clone());
        }
        Ok(b.dns(self.dns.clone()))
    }

    /// Builds and starts the kit (see [`KitBuilder::build`]).
    pub fn build(&self) -> Result<Kit, BuildError> {
        self.builder()?.build()
    }
}

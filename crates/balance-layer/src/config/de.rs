//! The configuration as a file writes it (the `serde` feature): every field by its name in
//! [`BalanceConfig`], durations as humans write them (`"250ms"`, `"5s"`), unknown fields
//! refused. Values are checked by [`BalanceConfig::validate`] when the balancer is built, as
//! for a configuration built in code; reading refuses only what has no place in the struct
//! (`weights` without `strategy = "weighted"`, `peak_ewma` without `strategy = "peak_ewma"`).
//!
//! ```toml
//! strategy = "weighted"           # round_robin (default), random, weighted,
//!                                 # least_in_flight, peak_ewma
//! wait_for_ready = true
//! max_wait = "2s"
//! connecting_wait = "5s"
//! seed = 7
//!
//! [weights]
//! "http://10.0.0.7:50051" = 3.0
//!
//! # with strategy = "peak_ewma":
//! # [peak_ewma]
//! # default_rtt = "30ms"
//! # decay = "10s"
//! ```

use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::{BalanceConfig, PeakEwma, Strategy, Weights};

/// A strategy's name in a file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum StrategyName {
    #[default]
    RoundRobin,
    Random,
    Weighted,
    LeastInFlight,
    PeakEwma,
}

impl StrategyName {
    fn parse<E: de::Error>(name: &str) -> Result<Self, E> {
        StrategyName::deserialize(de::value::StrDeserializer::<E>::new(name))
    }

    /// The strategy with its parameters (their defaults when not given).
    fn with(self, weights: Option<Weights>, peak_ewma: Option<PeakEwma>) -> Strategy {
        match self {
            StrategyName::RoundRobin => Strategy::RoundRobin,
            StrategyName::Random => Strategy::Random,
            StrategyName::LeastInFlight => Strategy::LeastInFlight,
            StrategyName::Weighted => Strategy::Weighted(weights.unwrap_or_default()),
            StrategyName::PeakEwma => Strategy::PeakEwma(peak_ewma.unwrap_or_default()),
        }
    }
}

/// The fields of a [`BalanceConfig`] as a file writes them.
const FIELDS: &[&str] = &[
    "strategy",
    "weights",
    "peak_ewma",
    "wait_for_ready",
    "max_wait",
    "connecting_wait",
    "seed",
];

/// Reads the flat form above: `strategy` by name, with `[weights]` or `[peak_ewma]` beside
/// it.
///
/// ```
/// use std::time::Duration;
/// use balance_layer::{BalanceConfig, Strategy};
///
/// let config: BalanceConfig = toml::from_str(r#"
///     strategy = "weighted"
///     max_wait = "2s"
///     wait_for_ready = true
///
///     [weights]
///     "http://10.0.0.7:50051" = 3.0
/// "#).unwrap();
/// let Strategy::Weighted(weights) = &config.strategy else { panic!() };
/// assert_eq!(weights.get("http://10.0.0.7:50051"), Some(3.0));
/// assert_eq!(config.max_wait, Some(Duration::from_secs(2)));
/// assert!(config.validate().is_ok());
/// ```
impl<'de> Deserialize<'de> for BalanceConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ConfigVisitor)
    }
}

struct ConfigVisitor;

impl<'de> Visitor<'de> for ConfigVisitor {
    type Value = BalanceConfig;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the balancer's settings")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BalanceConfig, A::Error> {
        let mut strategy: Option<StrategyName> = None;
        let (mut weights, mut peak_ewma) = (None, None);
        let mut config = BalanceConfig::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "strategy" => strategy = Some(map.next_value()?),
                // A strategy's parameters are refused where they stand (so that the error
                // points at them) when the strategy read before them is another one; when
                // the strategy comes after them (keys need not come in a file's order), at
                // the end.
                "weights" => {
                    weights = Some(map.next_value_seed(Parameters::new(
                        "weights",
                        StrategyName::Weighted,
                        strategy,
                    ))?)
                }
                "peak_ewma" => {
                    peak_ewma = Some(map.next_value_seed(Parameters::new(
                        "peak_ewma",
                        StrategyName::PeakEwma,
                        strategy,
                    ))?)
                }
                "wait_for_ready" => config.wait_for_ready = map.next_value()?,
                "max_wait" => {
                    config.max_wait = Some(
                        map.next_value::<humantime_serde::Serde<Duration>>()?
                            .into_inner(),
                    )
                }
                "connecting_wait" => {
                    config.connecting_wait = map
                        .next_value::<humantime_serde::Serde<Duration>>()?
                        .into_inner()
                }
                "seed" => config.seed = Some(map.next_value()?),
                other => return Err(de::Error::unknown_field(other, FIELDS)),
            }
        }
        // The strategy may come after its parameters (in formats other than TOML).
        let strategy = strategy.unwrap_or_default();
        if weights.as_ref().is_some_and(|w: &Weights| !w.is_empty())
            && strategy != StrategyName::Weighted
        {
            return Err(de::Error::custom(only_with(
                "weights",
                StrategyName::Weighted,
            )));
        }
        if peak_ewma.is_some() && strategy != StrategyName::PeakEwma {
            return Err(de::Error::custom(only_with(
                "peak_ewma",
                StrategyName::PeakEwma,
            )));
        }
        config.strategy = strategy.with(weights, peak_ewma);
        Ok(config)
    }
}

fn only_with(field: &str, strategy: StrategyName) -> String {
    let name = match strategy {
        StrategyName::Weighted => "weighted",
        _ => "peak_ewma",
    };
    format!("`{field}` is used only with strategy = \"{name}\"")
}

/// A strategy's parameters (`weights`, `peak_ewma`), refused as they are read when the
/// strategy already read is another one.
struct Parameters<T> {
    field: &'static str,
    belongs_to: StrategyName,
    strategy: Option<StrategyName>,
    value: std::marker::PhantomData<T>,
}

impl<T> Parameters<T> {
    fn new(field: &'static str, belongs_to: StrategyName, strategy: Option<StrategyName>) -> Self {
        Parameters {
            field,
            belongs_to,
            strategy,
            value: std::marker::PhantomData,
        }
    }
}

impl<'de, T: Deserialize<'de>> de::DeserializeSeed<'de> for Parameters<T> {
    type Value = T;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<T, D::Error> {
        match self.strategy {
            Some(s) if s != self.belongs_to => {
                Err(de::Error::custom(only_with(self.field, self.belongs_to)))
            }
            _ => T::deserialize(deserializer),
        }
    }
}

/// A strategy on its own: its name (`"random"`; `"weighted"` and `"peak_ewma"` with their
/// defaults), or a table of one entry, the name and its parameters
/// (`{ weighted = { "b0" = 2.0 } }`, `{ peak_ewma = { decay = "5s" } }`).
impl<'de> Deserialize<'de> for Strategy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrategyVisitor)
    }
}

struct StrategyVisitor;

impl<'de> Visitor<'de> for StrategyVisitor {
    type Value = Strategy;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a strategy's name, or a table of one entry: the name and its parameters")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<Strategy, E> {
        Ok(StrategyName::parse(name)?.with(None, None))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Strategy, A::Error> {
        let Some(name) = map.next_key::<String>()? else {
            return Err(de::Error::invalid_length(0, &self));
        };
        let strategy = match StrategyName::parse(&name)? {
            StrategyName::Weighted => Strategy::Weighted(map.next_value()?),
            StrategyName::PeakEwma => Strategy::PeakEwma(map.next_value()?),
            other => {
                map.next_value::<NoParameters>()?;
                other.with(None, None)
            }
        };
        if map.next_key::<IgnoredAny>()?.is_some() {
            return Err(de::Error::custom("expected one strategy, found more"));
        }
        Ok(strategy)
    }
}

/// The parameters of a strategy that has none: an empty table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoParameters {}

/// A table of target names and weights (`"10.0.0.1:50051" = 2.0`), in the order written.
impl<'de> Deserialize<'de> for Weights {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(WeightsVisitor)
    }
}

struct WeightsVisitor;

impl<'de> Visitor<'de> for WeightsVisitor {
    type Value = Weights;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a table of target names and weights")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Weights, A::Error> {
        let mut weights = Weights::new();
        while let Some((target, weight)) = map.next_entry::<String, f64>()? {
            weights = weights.weight(target, weight);
        }
        Ok(weights)
    }
}

/// The fields of [`PeakEwma`] as a file writes them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PeakEwmaFields {
    #[serde(default, with = "humantime_serde")]
    default_rtt: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    decay: Option<Duration>,
}

/// `{ default_rtt = "30ms", decay = "10s" }`, each defaulting as [`PeakEwma::new`].
impl<'de> Deserialize<'de> for PeakEwma {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let f = PeakEwmaFields::deserialize(deserializer)?;
        let defaults = PeakEwma::default();
        Ok(PeakEwma {
            default_rtt: f.default_rtt.unwrap_or(defaults.default_rtt),
            decay: f.decay.unwrap_or(defaults.decay),
        })
    }
}

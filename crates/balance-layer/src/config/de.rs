//! The configuration as a file writes it (the `serde` feature): every field by its name in
//! [`BalanceConfig`], durations as humans write them (`"250ms"`, `"5s"`), unknown fields
//! refused. Values are checked by [`BalanceConfig::validate`] when the balancer is built, as
//! for a configuration built in code; reading refuses only what has no place in the struct
//! (`weights` without `strategy = "weighted"`, `peak_ewma` without `strategy = "peak_ewma"`,
//! `pick_first` and `ring_hash` without their strategies).
//!
//! ```toml
//! strategy = "weighted"           # round_robin (default), random, weighted,
//!                                 # least_in_flight, peak_ewma, pick_first, ring_hash
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
//!
//! # with strategy = "pick_first":
//! # [pick_first]
//! # shuffle_address_list = true     # default false
//!
//! # with strategy = "ring_hash":
//! # [ring_hash]
//! # min_ring_size = 1024            # defaults: 1024, 8388608 (capped at 4096 positions)
//! # max_ring_size = 8388608
//! # request_hash_header = "x-user-id"   # default: none (a random endpoint per call)
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
    PickFirst,
    RingHash,
}

impl StrategyName {
    fn parse<E: de::Error>(name: &str) -> Result<Self, E> {
        StrategyName::deserialize(de::value::StrDeserializer::<E>::new(name))
    }

    /// The name as a file writes it.
    fn as_str(self) -> &'static str {
        match self {
            StrategyName::RoundRobin => "round_robin",
            StrategyName::Random => "random",
            StrategyName::Weighted => "weighted",
            StrategyName::LeastInFlight => "least_in_flight",
            StrategyName::PeakEwma => "peak_ewma",
            StrategyName::PickFirst => "pick_first",
            StrategyName::RingHash => "ring_hash",
        }
    }

    /// The strategy with its parameters (their defaults when not given).
    fn with(self, given: Given) -> Strategy {
        match self {
            StrategyName::RoundRobin => Strategy::RoundRobin,
            StrategyName::Random => Strategy::Random,
            StrategyName::LeastInFlight => Strategy::LeastInFlight,
            StrategyName::Weighted => Strategy::Weighted(given.weights.unwrap_or_default()),
            StrategyName::PeakEwma => Strategy::PeakEwma(given.peak_ewma.unwrap_or_default()),
            StrategyName::PickFirst => given.pick_first.unwrap_or_default().into_strategy(),
            StrategyName::RingHash => given.ring_hash.unwrap_or_default().into_strategy(),
        }
    }
}

/// The strategies' parameters a file gave (each beside `strategy`, in a table of its name).
#[derive(Default)]
struct Given {
    weights: Option<Weights>,
    peak_ewma: Option<PeakEwma>,
    pick_first: Option<PickFirstFields>,
    ring_hash: Option<RingHashFields>,
}

/// The fields of [`Strategy::PickFirst`] as a file writes them.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PickFirstFields {
    #[serde(default)]
    shuffle_address_list: bool,
}

impl PickFirstFields {
    fn into_strategy(self) -> Strategy {
        Strategy::PickFirst {
            shuffle_address_list: self.shuffle_address_list,
        }
    }
}

/// The fields of [`Strategy::RingHash`] as a file writes them, each defaulting as
/// [`Strategy::ring_hash`].
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RingHashFields {
    #[serde(default)]
    min_ring_size: Option<u64>,
    #[serde(default)]
    max_ring_size: Option<u64>,
    #[serde(default)]
    request_hash_header: Option<String>,
}

impl RingHashFields {
    fn into_strategy(self) -> Strategy {
        Strategy::RingHash {
            min_ring_size: self
                .min_ring_size
                .unwrap_or(Strategy::DEFAULT_MIN_RING_SIZE),
            max_ring_size: self
                .max_ring_size
                .unwrap_or(Strategy::DEFAULT_MAX_RING_SIZE),
            request_hash_header: self.request_hash_header,
        }
    }
}

/// The fields of a [`BalanceConfig`] as a file writes them.
const FIELDS: &[&str] = &[
    "strategy",
    "weights",
    "peak_ewma",
    "pick_first",
    "ring_hash",
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
        let mut given = Given::default();
        let mut config = BalanceConfig::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "strategy" => strategy = Some(map.next_value()?),
                // A strategy's parameters are refused where they stand (so that the error
                // points at them) when the strategy read before them is another one; when
                // the strategy comes after them (keys need not come in a file's order), at
                // the end.
                "weights" => {
                    given.weights = Some(map.next_value_seed(Parameters::new(
                        "weights",
                        StrategyName::Weighted,
                        strategy,
                    ))?)
                }
                "peak_ewma" => {
                    given.peak_ewma = Some(map.next_value_seed(Parameters::new(
                        "peak_ewma",
                        StrategyName::PeakEwma,
                        strategy,
                    ))?)
                }
                "pick_first" => {
                    given.pick_first = Some(map.next_value_seed(Parameters::new(
                        "pick_first",
                        StrategyName::PickFirst,
                        strategy,
                    ))?)
                }
                "ring_hash" => {
                    given.ring_hash = Some(map.next_value_seed(Parameters::new(
                        "ring_hash",
                        StrategyName::RingHash,
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
        let misplaced = [
            (
                given.weights.as_ref().is_some_and(|w| !w.is_empty()),
                "weights",
                StrategyName::Weighted,
            ),
            (
                given.peak_ewma.is_some(),
                "peak_ewma",
                StrategyName::PeakEwma,
            ),
            (
                given.pick_first.is_some(),
                "pick_first",
                StrategyName::PickFirst,
            ),
            (
                given.ring_hash.is_some(),
                "ring_hash",
                StrategyName::RingHash,
            ),
        ];
        for (present, field, belongs_to) in misplaced {
            if present && strategy != belongs_to {
                return Err(de::Error::custom(only_with(field, belongs_to)));
            }
        }
        config.strategy = strategy.with(given);
        Ok(config)
    }
}

fn only_with(field: &str, strategy: StrategyName) -> String {
    format!(
        "`{field}` is used only with strategy = \"{}\"",
        strategy.as_str()
    )
}

/// A strategy's parameters (`weights`, `peak_ewma`, `pick_first`, `ring_hash`), refused as
/// they are read when the strategy already read is another one.
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

/// A strategy on its own: its name (`"random"`; `"weighted"`, `"peak_ewma"`, `"pick_first"`
/// and `"ring_hash"` with their defaults), or a table of one entry, the name and its
/// parameters (`{ weighted = { "b0" = 2.0 } }`, `{ peak_ewma = { decay = "5s" } }`,
/// `{ pick_first = { shuffle_address_list = true } }`,
/// `{ ring_hash = { request_hash_header = "x-user-id" } }`).
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
        Ok(StrategyName::parse(name)?.with(Given::default()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Strategy, A::Error> {
        let Some(name) = map.next_key::<String>()? else {
            return Err(de::Error::invalid_length(0, &self));
        };
        let strategy = match StrategyName::parse(&name)? {
            StrategyName::Weighted => Strategy::Weighted(map.next_value()?),
            StrategyName::PeakEwma => Strategy::PeakEwma(map.next_value()?),
            StrategyName::PickFirst => map.next_value::<PickFirstFields>()?.into_strategy(),
            StrategyName::RingHash => map.next_value::<RingHashFields>()?.into_strategy(),
            other => {
                map.next_value::<NoParameters>()?;
                other.with(Given::default())
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

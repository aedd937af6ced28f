//! The balancer's configuration: a plain struct with defaults and builder-style setters,
//! validated once when the balancer (or its layer) is built. With the `serde` feature it is
//! also read from a configuration file ([`de`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use endpoint_state::ConfigError;

#[cfg(feature = "serde")]
mod de;

/// The configuration's name in a [`ConfigError`].
const CONFIG: &str = "balancer";

/// How the balancer chooses among eligible endpoints. Every strategy picks in O(1).
///
/// | strategy | file name | chooses | cost per pick |
/// |---|---|---|---|
/// | [`RoundRobin`](Strategy::RoundRobin) (default) | `round_robin` | each eligible endpoint in turn | O(1) |
/// | [`Random`](Strategy::Random) | `random` | uniformly at random | O(1) |
/// | [`Weighted`](Strategy::Weighted) | `weighted` | in proportion to [`Weights`] | O(1) |
/// | [`LeastInFlight`](Strategy::LeastInFlight) | `least_in_flight` | the less busy of two | O(1) |
/// | [`PeakEwma`](Strategy::PeakEwma) | `peak_ewma` | the faster of two | O(1) |
/// | [`PickFirst`](Strategy::PickFirst) | `pick_first` | one endpoint for every call, the next on failure | O(1) |
/// | [`RingHash`](Strategy::RingHash) | `ring_hash` | the endpoint of the request's hash on a consistent-hash ring | O(1) |
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum Strategy {
    /// Each eligible endpoint in turn, shared by every clone of the balancer: `k × n`
    /// sequential calls over `n` eligible endpoints give each exactly `k`.
    #[default]
    RoundRobin,
    /// Uniformly at random (a per-clone generator; see [`BalanceConfig::seed`]).
    Random,
    /// In proportion to each target's weight (see [`Weights`]). The choice follows a
    /// golden-ratio low-discrepancy sequence (shared by every clone) over an alias table: O(1)
    /// per pick, deterministic, and each target's share converges on its weight far faster
    /// than with independent random draws (40,000 picks at 1:2:1 land within a few calls of
    /// 10,000/20,000/10,000).
    Weighted(Weights),
    /// Power of two choices on the number of calls in flight: of two endpoints drawn at
    /// random, the one with fewer calls in flight (a call is in flight until its response
    /// future completes or is dropped).
    LeastInFlight,
    /// Power of two choices on peak-EWMA latency × (calls in flight + 1).
    PeakEwma(PeakEwma),
    /// gRPC's default policy, `pick_first`: every call goes to one endpoint, the first
    /// eligible one in discovery order, for as long as it stays eligible; when it stops being
    /// eligible (its card shuts it, its service fails, discovery removes it), calls go to the
    /// first eligible endpoint in order again.
    ///
    /// As gRPC's `pick_first` does, it is **sticky**: when an endpoint earlier in the order
    /// becomes eligible again, calls stay on the current one until it fails (gRPC stays
    /// connected to the address it has and reconnects from the top of its list only when that
    /// connection is lost). An endpoint inserted by discovery does not take over either.
    /// Calls wait for the current endpoint's readiness rather than spill onto others (gRPC
    /// queues calls on the one connection it has).
    ///
    /// With `shuffle_address_list` (gRFC A62), the order is shuffled each time discovery
    /// changes the set of endpoints — once per batch of changes the balancer takes in — with
    /// the balancer's generator: with [`BalanceConfig::seed`], the same changes give the same
    /// order on every run. Use it to spread many clients that all see the addresses in the
    /// same order over different endpoints.
    PickFirst {
        /// Shuffle the order of the endpoints at every change of the set (default `false`).
        shuffle_address_list: bool,
    },
    /// Consistent hashing, gRPC's `ring_hash` (gRFCs A42 and A76): a ring of positions, each
    /// owned by one endpoint; a request goes to the owner of its hash's position, so that
    /// requests with the same hash go to the same endpoint (a cache's affinity, a session's
    /// stickiness).
    ///
    /// * **The request's hash** is, in this order: a [`RequestHash`](crate::RequestHash)
    ///   extension on the request; else the XXH64 of the header named
    ///   `request_hash_header`, its values joined by `,` (gRFC A76); else — no extension, no
    ///   header configured, or the header absent or empty — a random hash, which sends the
    ///   call to a random endpoint (gRFC A76). Requests expose them through
    ///   [`RequestHashKey`](crate::RequestHashKey), implemented for `http::Request` and
    ///   `tonic::Request`.
    /// * **The ring** is a table of `M` positions, `M` set by the configuration alone (see
    ///   *its size*). Each position belongs to the endpoint that scores highest on it
    ///   (rendezvous hashing): endpoint `e`'s score of position `s` (counted from 0) is
    ///   SplitMix64's output function of `XXH64(e) + (s + 1) × 0x9E3779B97F4A7C15`
    ///   (wrapping), `e` being the target as [`Weights`] names it; on a tie the lesser name
    ///   wins. A request of hash `h` lands on position `⌊h × M / 2^64⌋`. The table holds
    ///   every endpoint discovery has inserted — eligible or not — and depends neither on
    ///   the order discovery gave them in nor on the client: every client that sees the same
    ///   endpoints builds the same table.
    /// * **Which keys move.** A key lands on the same endpoint for as long as that endpoint
    ///   stays eligible. A key whose position belongs to an endpoint that is not eligible
    ///   goes on round the table, position by position, to the first whose owner is; it comes
    ///   back when its endpoint does. An endpoint inserted takes exactly the positions where
    ///   it outscores their owner, and nothing else moves: about `1/(n+1)` of the keys when it
    ///   joins `n` endpoints (3 to 4 endpoints: about a quarter), all of them to it. An
    ///   endpoint removed gives back exactly its own positions, each to the next best
    ///   score on it: only its keys move. This holds at any number of endpoints: the table's
    ///   size never changes with them.
    /// * **Its size.** `M` is [`RING_SIZE_CAP`](Strategy::RING_SIZE_CAP) (4,096, gRPC's
    ///   default `ring_size_cap`) brought within `min_ring_size..=max_ring_size`, both
    ///   first capped at `RING_SIZE_CAP`, as gRPC caps them: so 4,096 unless
    ///   `max_ring_size` is smaller, then `max_ring_size`. Each endpoint owns about `M / n`
    ///   positions, the share of each varying as a binomial count (three endpoints on 4,096
    ///   positions: 1,365 each, give or take 30). With more endpoints than positions, some
    ///   own none (at 10,000 endpoints on 4,096 positions, about a third own one or more):
    ///   they get keys only when no endpoint that owns a position is eligible, then by the
    ///   hash among the eligible ones.
    /// * **Cost.** The table is kept by the balancer's background task and updated when
    ///   discovery changes the set of endpoints, never on a call: each endpoint inserted or
    ///   removed costs O(M) scores (an insert scores every position; a removal rescores
    ///   only its own positions, against every endpoint). When as many endpoints come and go
    ///   in one batch as there are after it (the first batch, for one), the table is built
    ///   afresh instead, O(M × n): tens of milliseconds at 10,000 endpoints. Memory: 12 bytes
    ///   a position for the task's table, 4 for the ring and 4 for each snapshot's view of it
    ///   (80 KiB at 4,096 positions). Each change of eligibility costs one pass over the
    ///   table, O(M). A pick is O(1): a multiplication and a read or two.
    /// * **When it picks.** The hash is known only when the request is: `poll_ready` checks
    ///   that some endpoint is eligible (or waits, as with other strategies) and reserves
    ///   none; `call` chooses the endpoint, and the response future waits for that
    ///   endpoint's readiness before it sends the request (gRPC queues a pick on a
    ///   connecting endpoint the same way).
    ///
    /// [`Strategy::ring_hash`] gives the defaults (1,024 and 8,388,608, gRFC A42's; no
    /// header).
    RingHash {
        /// The least number of positions on the ring (default 1,024; at least 1, at most
        /// `max_ring_size`). Capped at [`RING_SIZE_CAP`](Strategy::RING_SIZE_CAP). Always
        /// met: the ring has `RING_SIZE_CAP` positions, or `max_ring_size` if that is fewer.
        min_ring_size: u64,
        /// The most positions on the ring (default 8,388,608, which is also the largest
        /// value accepted). Capped at [`RING_SIZE_CAP`](Strategy::RING_SIZE_CAP): the ring
        /// has that many positions, or `max_ring_size` when it is smaller.
        max_ring_size: u64,
        /// The header whose value is the request's hash key (gRFC A76), or `None`. A valid
        /// gRPC metadata name (lowercase letters, digits, `-`, `_`, `.`; upper case is read
        /// as lower case), not a binary one (`-bin`).
        request_hash_header: Option<String>,
    },
}

impl Strategy {
    /// The default [`min_ring_size`](Strategy::RingHash::min_ring_size): 1,024 (gRFC A42).
    pub const DEFAULT_MIN_RING_SIZE: u64 = 1024;
    /// The default [`max_ring_size`](Strategy::RingHash::max_ring_size): 8,388,608
    /// (gRFC A42), which is also the largest value accepted.
    pub const DEFAULT_MAX_RING_SIZE: u64 = 8 * 1024 * 1024;
    /// The most positions a ring has, whatever its sizes say, and the number it has unless
    /// `max_ring_size` is smaller: 4,096, the default `ring_size_cap` of gRPC's own
    /// implementations. It bounds the ring's memory (about 80 KiB in all) and the cost of
    /// each change of the endpoints. (gRFC A42's sizes allow 8 Mi positions: 96 MiB for the
    /// table alone — no place for it in a client.)
    pub const RING_SIZE_CAP: u64 = 4096;

    /// [`Strategy::RingHash`] with its defaults: ring sizes of 1,024 to 8,388,608 (capped at
    /// [`RING_SIZE_CAP`](Self::RING_SIZE_CAP): a ring of 4,096 positions), no request hash
    /// header.
    ///
    /// ```
    /// use balance_layer::{BalanceConfig, Strategy};
    /// let Strategy::RingHash { min_ring_size, max_ring_size, request_hash_header } =
    ///     Strategy::ring_hash()
    /// else {
    ///     unreachable!()
    /// };
    /// assert_eq!((min_ring_size, max_ring_size), (1024, 8_388_608));
    /// assert_eq!(request_hash_header, None);
    ///
    /// // Hash on the `x-user-id` header of each call.
    /// let config = BalanceConfig::new().strategy(Strategy::RingHash {
    ///     min_ring_size,
    ///     max_ring_size,
    ///     request_hash_header: Some("x-user-id".into()),
    /// });
    /// assert!(config.validate().is_ok());
    /// ```
    pub fn ring_hash() -> Strategy {
        Strategy::RingHash {
            min_ring_size: Self::DEFAULT_MIN_RING_SIZE,
            max_ring_size: Self::DEFAULT_MAX_RING_SIZE,
            request_hash_header: None,
        }
    }

    /// [`Strategy::PickFirst`] in discovery order (no shuffle), gRPC's default policy.
    ///
    /// ```
    /// use balance_layer::Strategy;
    /// assert!(matches!(
    ///     Strategy::pick_first(),
    ///     Strategy::PickFirst { shuffle_address_list: false }
    /// ));
    /// ```
    pub fn pick_first() -> Strategy {
        Strategy::PickFirst {
            shuffle_address_list: false,
        }
    }

    /// Short name for logs and errors (`round_robin`, `random`, `weighted`,
    /// `least_in_flight`, `peak_ewma`, `pick_first`, `ring_hash`).
    pub fn name(&self) -> &'static str {
        match self {
            Strategy::RoundRobin => "round_robin",
            Strategy::Random => "random",
            Strategy::Weighted(_) => "weighted",
            Strategy::LeastInFlight => "least_in_flight",
            Strategy::PeakEwma(_) => "peak_ewma",
            Strategy::PickFirst { .. } => "pick_first",
            Strategy::RingHash { .. } => "ring_hash",
        }
    }
}

/// Checks [`Strategy::RingHash`]'s fields.
fn validate_ring_hash(
    min_ring_size: u64,
    max_ring_size: u64,
    request_hash_header: Option<&str>,
) -> Result<(), ConfigError> {
    let limit = Strategy::DEFAULT_MAX_RING_SIZE;
    for (field, value) in [
        ("ring_hash.min_ring_size", min_ring_size),
        ("ring_hash.max_ring_size", max_ring_size),
    ] {
        if value == 0 {
            return Err(ConfigError::new(CONFIG, field, value, "at least 1"));
        }
        if value > limit {
            return Err(ConfigError::new(
                CONFIG,
                field,
                value,
                format!("at most {limit} (gRFC A42's limit)"),
            ));
        }
    }
    if min_ring_size > max_ring_size {
        return Err(ConfigError::new(
            CONFIG,
            "ring_hash.min_ring_size",
            min_ring_size,
            format!("at most ring_hash.max_ring_size ({max_ring_size})"),
        ));
    }
    if let Some(header) = request_hash_header {
        crate::hash::header_name(header).map_err(|expected| {
            ConfigError::new(
                CONFIG,
                "ring_hash.request_hash_header",
                format!("{header:?}"),
                expected,
            )
        })?;
    }
    Ok(())
}

/// Weights by target, for [`Strategy::Weighted`].
///
/// A target is matched by its discovery key's `Display` form (for tonic-style discovery keyed
/// by address, the address). A target missing from the weights counts `1.0`. Every weight must
/// be finite and not negative, their total finite too, and at least one listed weight must be
/// above zero: the balancer refuses to build otherwise, naming the target and the value. When every
/// *eligible* target weighs zero, the choice is uniform among them.
///
/// ```
/// use balance_layer::Weights;
/// let weights = Weights::new().weight("10.0.0.1:50051", 2.0).weight("10.0.0.2:50051", 1.0);
/// assert_eq!(weights.get("10.0.0.1:50051"), Some(2.0));
/// assert_eq!(weights.get("10.0.0.3:50051"), None); // counts 1.0
/// ```
#[derive(Clone, Default, PartialEq)]
pub struct Weights {
    by_target: HashMap<Arc<str>, f64>,
    /// Insertion order, so that validation reports the first bad entry the user wrote.
    order: Vec<Arc<str>>,
}

impl Weights {
    /// No weights: every target counts `1.0`.
    pub fn new() -> Self {
        Weights::default()
    }

    /// This set with `target` weighing `weight` (replacing an earlier weight for it).
    #[must_use]
    pub fn weight(mut self, target: impl Into<Arc<str>>, weight: f64) -> Self {
        let target = target.into();
        if self.by_target.insert(target.clone(), weight).is_none() {
            self.order.push(target);
        }
        self
    }

    /// The weight given for `target`, if any.
    pub fn get(&self, target: &str) -> Option<f64> {
        self.by_target.get(target).copied()
    }

    /// The weight a target of this name counts for: its own, or `1.0`.
    pub fn weight_of(&self, target: &str) -> f64 {
        self.get(target).unwrap_or(1.0)
    }

    /// Every `(target, weight)`, in the order they were given.
    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> + '_ {
        self.order.iter().map(|t| (&**t, self.by_target[t]))
    }

    /// How many targets have a weight.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether no target has a weight.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    fn validate(&self) -> Result<(), ConfigError> {
        for (target, weight) in self.iter() {
            let field = || format!("weights[{target}]");
            if target.is_empty() {
                return Err(ConfigError::new(
                    CONFIG,
                    "weights",
                    format!("\"\" = {weight}"),
                    "a named target",
                ));
            }
            if weight.is_nan() {
                return Err(ConfigError::new(CONFIG, field(), "NaN", "a number"));
            }
            if weight.is_infinite() {
                return Err(ConfigError::new(CONFIG, field(), weight, "a finite weight"));
            }
            if weight < 0.0 {
                return Err(ConfigError::new(
                    CONFIG,
                    field(),
                    weight,
                    "a weight that is not negative",
                ));
            }
        }
        let total: f64 = self.iter().map(|(_, w)| w).sum();
        if total.is_infinite() {
            let listed = self
                .iter()
                .map(|(t, w)| format!("{t} = {w:e}"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(ConfigError::new(
                CONFIG,
                "weights",
                listed,
                "weights whose total is a finite number (these add up to infinity; a weight is \
                 a share, and an unlisted target counts 1.0)",
            ));
        }
        if !self.is_empty() && self.iter().all(|(_, w)| w == 0.0) {
            let listed = self
                .iter()
                .map(|(t, w)| format!("{t} = {w}"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(ConfigError::new(
                CONFIG,
                "weights",
                listed,
                "at least one weight above zero (these add up to zero)",
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for Weights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<T: Into<Arc<str>>> FromIterator<(T, f64)> for Weights {
    fn from_iter<I: IntoIterator<Item = (T, f64)>>(iter: I) -> Self {
        iter.into_iter()
            .fold(Weights::new(), |w, (t, x)| w.weight(t, x))
    }
}

/// Parameters of [`Strategy::PeakEwma`].
///
/// Each endpoint keeps a latency estimate: a slower response than the estimate replaces it
/// at once (the peak); a faster one pulls it down with a weight that grows with the time since
/// the last update (`1 - e^(-elapsed/decay)`). Between responses the estimate decays towards
/// zero with the same time constant, so an endpoint that has been avoided for a while gets
/// tried again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeakEwma {
    /// The estimate of an endpoint that has not answered yet. Default 30 ms.
    pub default_rtt: Duration,
    /// The time constant of the moving average. Default 10 s.
    pub decay: Duration,
}

impl Default for PeakEwma {
    fn default() -> Self {
        PeakEwma {
            default_rtt: Duration::from_millis(30),
            decay: Duration::from_secs(10),
        }
    }
}

impl PeakEwma {
    /// The defaults (30 ms, 10 s).
    pub fn new() -> Self {
        PeakEwma::default()
    }

    /// Sets [`default_rtt`](Self::default_rtt).
    #[must_use]
    pub fn default_rtt(mut self, rtt: Duration) -> Self {
        self.default_rtt = rtt;
        self
    }

    /// Sets [`decay`](Self::decay).
    #[must_use]
    pub fn decay(mut self, decay: Duration) -> Self {
        self.decay = decay;
        self
    }
}

/// The balancer's configuration.
///
/// ```
/// use std::time::Duration;
/// use balance_layer::{BalanceConfig, Strategy, Weights};
/// let config = BalanceConfig::new()
///     .strategy(Strategy::Weighted(Weights::new().weight("b0", 3.0)))
///     .wait_for_ready(true)
///     .max_wait(Duration::from_secs(2));
/// assert!(config.validate().is_ok());
///
/// let bad = BalanceConfig::new().strategy(Strategy::Weighted(Weights::new().weight("b2", -1.0)));
/// assert_eq!(
///     bad.validate().unwrap_err().to_string(),
///     "invalid balancer configuration: weights[b2] = -1: expected a weight that is not negative",
/// );
/// ```
#[derive(Debug, Clone)]
pub struct BalanceConfig {
    /// How to choose among eligible endpoints. Default: [`Strategy::RoundRobin`].
    pub strategy: Strategy,
    /// When no endpoint is eligible: `false` (default) fails the call at once with
    /// [`NoHealthyTargets`](crate::error::NoHealthyTargets); `true` makes the call wait for
    /// one to become eligible, up to the request's own deadline (see
    /// [`RequestDeadline`](crate::RequestDeadline)) or [`max_wait`](Self::max_wait),
    /// whichever is sooner. A request's [`WaitForReady`](crate::WaitForReady) extension
    /// overrides it for that call.
    pub wait_for_ready: bool,
    /// With [`wait_for_ready`](Self::wait_for_ready): a cap on how long a call waits for an
    /// eligible endpoint. Default `None`: a call whose request carries a deadline waits up to
    /// that deadline, as gRPC's wait-for-ready does, and a call without one waits up to
    /// [`DEFAULT_MAX_WAIT`](Self::DEFAULT_MAX_WAIT) (20 s), so that no call waits forever.
    /// `Some(d)`: no call waits longer than `d`, whatever its deadline.
    pub max_wait: Option<Duration>,
    /// How long a call waits while targets are *connecting* — no endpoint is eligible, and some
    /// endpoint's card has no health verdict yet ([`HealthVerdict::Unknown`]), or discovery has
    /// found no endpoint yet — for the first verdicts, before it fails. gRPC queues calls the
    /// same way while a channel connects. The call's own deadline bounds it too; it fails at
    /// once when every endpoint has evidence against it (nothing is connecting any more).
    /// Default 5 s (a health checker's default probe timeout: by then every target has a
    /// verdict); `Duration::ZERO` never waits. Independent of
    /// [`wait_for_ready`](Self::wait_for_ready), which waits longer and for any reason.
    ///
    /// [`HealthVerdict::Unknown`]: endpoint_state::HealthVerdict::Unknown
    pub connecting_wait: Duration,
    /// Seed of the per-clone random generators (random, least-loaded, ring hash's random
    /// hashes) and of pick-first's shuffles. Default `None`: seeded from the process's
    /// randomness. With a seed, a balancer and its clones draw the same sequences on every run
    /// (clone `i` uses a sequence derived from the seed and `i`).
    pub seed: Option<u64>,
}

impl Default for BalanceConfig {
    fn default() -> Self {
        BalanceConfig {
            strategy: Strategy::default(),
            wait_for_ready: false,
            max_wait: None,
            connecting_wait: DEFAULT_CONNECTING_WAIT,
            seed: None,
        }
    }
}

/// The default [`BalanceConfig::connecting_wait`].
pub(crate) const DEFAULT_CONNECTING_WAIT: Duration = Duration::from_secs(5);

impl BalanceConfig {
    /// How long a wait-for-ready call whose request carries no deadline waits, when
    /// [`max_wait`](Self::max_wait) is not set: 20 s, gRPC's minimum connect timeout — time for
    /// a target to be reconnected and probed.
    pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(20);

    /// The defaults: round-robin; fail at once when nothing is eligible, except while targets
    /// are connecting (up to 5 s).
    pub fn new() -> Self {
        BalanceConfig::default()
    }

    /// Sets [`strategy`](Self::strategy).
    #[must_use]
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Sets [`wait_for_ready`](Self::wait_for_ready).
    #[must_use]
    pub fn wait_for_ready(mut self, wait: bool) -> Self {
        self.wait_for_ready = wait;
        self
    }

    /// Sets [`max_wait`](Self::max_wait).
    #[must_use]
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    /// Sets [`connecting_wait`](Self::connecting_wait).
    #[must_use]
    pub fn connecting_wait(mut self, wait: Duration) -> Self {
        self.connecting_wait = wait;
        self
    }

    /// Sets [`seed`](Self::seed).
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Checks every field; the error names the field and the value. The balancer and its
    /// layer call this when they are built.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match &self.strategy {
            Strategy::Weighted(weights) => weights.validate()?,
            Strategy::PeakEwma(p) => {
                for (field, value) in [
                    ("peak_ewma.default_rtt", p.default_rtt),
                    ("peak_ewma.decay", p.decay),
                ] {
                    if value.is_zero() {
                        return Err(ConfigError::new(
                            CONFIG,
                            field,
                            format!("{value:?}"),
                            "more than zero",
                        ));
                    }
                }
            }
            Strategy::RingHash {
                min_ring_size,
                max_ring_size,
                request_hash_header,
            } => validate_ring_hash(
                *min_ring_size,
                *max_ring_size,
                request_hash_header.as_deref(),
            )?,
            Strategy::RoundRobin
            | Strategy::Random
            | Strategy::LeastInFlight
            | Strategy::PickFirst { .. } => {}
        }
        if let Some(wait) = self.max_wait
            && !self.wait_for_ready
        {
            tracing::warn!(
                max_wait = ?wait,
                "max_wait is set but wait_for_ready is off; it has no effect"
            );
        }
        Ok(())
    }
}

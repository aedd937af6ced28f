//! The state every clone of a balancer shares: the eligible set (an atomically swapped
//! snapshot), the strategy's counters, and each endpoint's load.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use endpoint_state::rng::{self, Rng};
use endpoint_state::sync::lock;
use endpoint_state::{BreakerState, EndpointCard, HealthVerdict, LineKind, Peers};
use futures_util::task::AtomicWaker;
use http::HeaderName;
use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;
use tokio::time::Instant;

use crate::alias::Alias;
use crate::config::{BalanceConfig, Strategy, Weights};
use crate::error::{LISTED, NoHealthyTargets, Skip, SkippedTarget};
use crate::inflight::{Counter, Loads};
use crate::ring::RingView;

/// The validated configuration, in the shape the request path reads it.
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) kind: Kind,
    pub(crate) weights: Weights,
    pub(crate) ewma_default_ns: f64,
    pub(crate) ewma_decay_ns: f64,
    pub(crate) wait_for_ready: bool,
    pub(crate) max_wait: Option<Duration>,
    pub(crate) connecting_wait: Duration,
    pub(crate) seed: u64,
    /// Pick-first: shuffle the order at every change of the set.
    pub(crate) shuffle: bool,
    /// Ring hash: the least and most points on the ring, both capped.
    pub(crate) ring_min: usize,
    pub(crate) ring_max: usize,
    /// Ring hash: the header that carries the request's hash key.
    pub(crate) hash_header: Option<HeaderName>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    RoundRobin,
    Random,
    Weighted,
    LeastInFlight,
    PeakEwma,
    PickFirst,
    RingHash,
}

impl Kind {
    /// Whether calls in flight are counted (the least-loaded strategies read them).
    pub(crate) fn tracks_load(self) -> bool {
        matches!(self, Kind::LeastInFlight | Kind::PeakEwma)
    }
}

impl Settings {
    /// `config` must have been validated.
    pub(crate) fn from_config(config: &BalanceConfig) -> Self {
        let (kind, weights, ewma) = match &config.strategy {
            Strategy::RoundRobin => (Kind::RoundRobin, Weights::new(), Default::default()),
            Strategy::Random => (Kind::Random, Weights::new(), Default::default()),
            Strategy::Weighted(w) => (Kind::Weighted, w.clone(), Default::default()),
            Strategy::LeastInFlight => (Kind::LeastInFlight, Weights::new(), Default::default()),
            Strategy::PeakEwma(p) => (Kind::PeakEwma, Weights::new(), *p),
            Strategy::PickFirst { .. } => (Kind::PickFirst, Weights::new(), Default::default()),
            Strategy::RingHash { .. } => (Kind::RingHash, Weights::new(), Default::default()),
        };
        let shuffle = matches!(
            config.strategy,
            Strategy::PickFirst {
                shuffle_address_list: true
            }
        );
        let (ring_min, ring_max, hash_header) = match &config.strategy {
            Strategy::RingHash {
                min_ring_size,
                max_ring_size,
                request_hash_header,
            } => {
                let cap = |size: u64| size.min(Strategy::RING_SIZE_CAP) as usize;
                let header = request_hash_header
                    .as_deref()
                    .map(|h| crate::hash::header_name(h).expect("validated: a valid header name"));
                (cap(*min_ring_size), cap(*max_ring_size), header)
            }
            _ => (0, 0, None),
        };
        Settings {
            kind,
            weights,
            ewma_default_ns: ewma.default_rtt.as_nanos() as f64,
            ewma_decay_ns: ewma.decay.as_nanos() as f64,
            wait_for_ready: config.wait_for_ready,
            max_wait: config.max_wait,
            connecting_wait: config.connecting_wait,
            seed: config.seed.unwrap_or_else(rng::random_seed),
            shuffle,
            ring_min,
            ring_max,
            hash_header,
        }
    }
}

/// Keeps a hot counter on its own cache line, away from the read-mostly fields.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

/// Stops the background task when the last balancer handle is dropped.
pub(crate) struct Owner<K, S> {
    pub(crate) shared: Arc<Shared<K, S>>,
}

impl<K, S> Drop for Owner<K, S> {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.driver.wake();
    }
}

pub(crate) struct Shared<K, S> {
    pub(crate) snapshot: ArcSwap<Snapshot<K, S>>,
    /// Bumped after each new snapshot is stored, before waiters are notified.
    pub(crate) generation: AtomicU64,
    /// Woken (all waiters) after every new snapshot.
    pub(crate) changed: Arc<Notify>,
    pub(crate) settings: Settings,
    /// Round-robin position, or the index into the weighted sequence.
    pub(crate) cursor: Padded<AtomicU64>,
    clones: AtomicU64,
    /// Wakes the driver: pickers set `dirty` when they saw a stale snapshot or a failed
    /// endpoint; the last handle sets `closed`.
    pub(crate) driver: AtomicWaker,
    pub(crate) dirty: AtomicBool,
    pub(crate) closed: AtomicBool,
    pub(crate) epoch: Instant,
    /// The peer set of endpoints whose cards had none when they were inserted: the balancer's
    /// endpoints are each other's peers (see [`endpoint_state::peers`]).
    pub(crate) peers: Peers,
}

impl<K, S> Shared<K, S> {
    pub(crate) fn new(settings: Settings) -> Self {
        Shared {
            snapshot: ArcSwap::from_pointee(Snapshot::empty()),
            generation: AtomicU64::new(0),
            changed: Arc::new(Notify::new()),
            settings,
            cursor: Padded(AtomicU64::new(0)),
            clones: AtomicU64::new(0),
            driver: AtomicWaker::new(),
            dirty: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            epoch: Instant::now(),
            peers: Peers::new(),
        }
    }

    /// A generator for a new clone: deterministic per clone ordinal when seeded.
    pub(crate) fn clone_rng(&self) -> Rng {
        let ordinal = self.clones.fetch_add(1, Ordering::Relaxed);
        Rng::new(rng::mix(
            self.settings.seed ^ ordinal.wrapping_mul(0xA076_1D64_78BD_642F),
        ))
    }

    /// Asks the driver to rebuild the snapshot soon.
    pub(crate) fn kick(&self) {
        self.dirty.store(true, Ordering::Release);
        self.driver.wake();
    }

    /// Takes `endpoint` out after its service failed `poll_ready`, and has the set rebuilt.
    pub(crate) fn fail(&self, endpoint: &Endpoint<K, S>, error: &crate::error::BoxError) {
        if endpoint.mark_failed(&error.to_string()) {
            tracing::warn!(
                backend = %endpoint.name,
                %error,
                "endpoint failed poll_ready; out of rotation until discovery inserts it again"
            );
        }
        self.kick();
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Chooses a position in `snap.picks` (non-empty) with the configured strategy: O(1).
    /// (Ring hash chooses in `call`, with the request's hash: see [`crate::ring`].)
    pub(crate) fn choose(&self, snap: &Snapshot<K, S>, rng: &mut Rng) -> usize {
        let n = snap.picks.len();
        debug_assert!(n > 0);
        match self.settings.kind {
            Kind::PickFirst => snap.first.min(n - 1),
            Kind::RingHash => rng.below(n),
            Kind::RoundRobin => (self.cursor.0.fetch_add(1, Ordering::Relaxed) % n as u64) as usize,
            Kind::Random => rng.below(n),
            Kind::Weighted => {
                let k = self.cursor.0.fetch_add(1, Ordering::Relaxed);
                match &snap.alias {
                    Some(table) => table.pick(rng::weyl(k)),
                    // Every eligible target weighs zero: uniform among them.
                    None => ((u128::from(rng::weyl(k)) * n as u128) >> 64) as usize,
                }
            }
            Kind::LeastInFlight | Kind::PeakEwma => {
                if n == 1 {
                    return 0;
                }
                let a = rng.below(n);
                let mut b = rng.below(n - 1);
                if b >= a {
                    b += 1;
                }
                if self.settings.kind == Kind::LeastInFlight {
                    debug_assert_eq!(snap.loads.len(), n, "a count for each endpoint");
                    // Two reads in the snapshot's table of counts: neither endpoint is read.
                    return if snap.loads.at(b) < snap.loads.at(a) {
                        b
                    } else {
                        a
                    };
                }
                let now = self.nanos_now();
                let (ea, eb) = (&snap.picks[a], &snap.picks[b]);
                let (la, lb) = (
                    ea.ewma_cost(now, &self.settings),
                    eb.ewma_cost(now, &self.settings),
                );
                if lb < la { b } else { a }
            }
        }
    }

    /// `Ready` once the eligible set is newer than generation `seen`; otherwise `Pending`,
    /// woken when it changes. `listener` is the caller's subscription, made before looking
    /// (so that a change in between is not lost) and kept while it waits.
    pub(crate) fn poll_newer_than(
        &self,
        seen: u64,
        listener: &mut Option<Pin<Box<OwnedNotified>>>,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        loop {
            let waiting =
                listener.get_or_insert_with(|| Box::pin(self.changed.clone().notified_owned()));
            if self.generation() > seen {
                *listener = None;
                return Poll::Ready(());
            }
            match waiting.as_mut().poll(cx) {
                // Notified: the generation has moved (checked at the top).
                Poll::Ready(()) => *listener = None,
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Nanoseconds since this balancer was built (its own monotonic clock).
    pub(crate) fn nanos_now(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.epoch)
            .as_nanos() as u64
    }
}

pub(crate) const LIVE: u8 = 0;
pub(crate) const FAILED: u8 = 1;
pub(crate) const REMOVED: u8 = 2;

/// One discovered endpoint: its prototype service (cloned for each call), its card, and its
/// load.
///
/// `repr(C)` keeps the fields a pick reads of the endpoint it chose (state, card, spares, the
/// counter of calls in flight) first, next to the reference count: with thousands of
/// endpoints picked at random, the chosen one then costs one or two cache lines. (The
/// least-in-flight comparison itself reads no endpoint: see [`crate::inflight`].)
#[repr(C)]
pub(crate) struct Endpoint<K, S> {
    state: AtomicU8,
    pub(crate) card: Option<EndpointCard>,
    /// Calls in flight, in the balancer's table of counts (least-loaded strategies only).
    in_flight: Option<Counter>,
    /// Clones of `service` that have made a call (so are unready), kept for the next picks of
    /// this endpoint: a pick takes one instead of cloning the service — for a stack of layers
    /// over a tonic `Channel`, a dozen reference counts every caller shares. At most
    /// [`SPARES`]; emptied when the endpoint is removed or fails. Never waited on: a pick
    /// that finds it busy clones.
    spares: Mutex<Spares<S>>,
    /// Peak-EWMA estimate (f64 bits, nanoseconds) and when it was last updated
    /// (nanoseconds on the balancer's clock).
    rtt_ns: AtomicU64,
    rtt_at: AtomicU64,
    pub(crate) service: S,
    pub(crate) weight: f64,
    pub(crate) name: Arc<str>,
    pub(crate) key: K,
    failure: OnceLock<Arc<str>>,
}

/// The most spare service clones an endpoint keeps (about the calls in flight to it at once).
const SPARES: usize = 32;

/// An endpoint's spare services: the first in place, in the endpoint's own memory (a caller
/// that makes one call at a time on an endpoint never reads further), the others in a list.
struct Spares<S> {
    first: Option<S>,
    more: Vec<S>,
}

impl<S> Spares<S> {
    fn pop(&mut self) -> Option<S> {
        self.more.pop().or_else(|| self.first.take())
    }

    fn push(&mut self, service: S) {
        if self.first.is_none() {
            self.first = Some(service);
        } else {
            self.more.push(service);
        }
    }

    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.more.len()
    }
}

impl<K, S> Endpoint<K, S> {
    pub(crate) fn new(
        key: K,
        name: Arc<str>,
        service: S,
        card: Option<EndpointCard>,
        in_flight: Option<Counter>,
        settings: &Settings,
        now_ns: u64,
    ) -> Self {
        Endpoint {
            key,
            weight: settings.weights.weight_of(&name),
            name,
            service,
            card,
            state: AtomicU8::new(LIVE),
            failure: OnceLock::new(),
            in_flight,
            rtt_ns: AtomicU64::new(settings.ewma_default_ns.to_bits()),
            rtt_at: AtomicU64::new(now_ns),
            // Room for a few, made here rather than on a call's path.
            spares: Mutex::new(Spares {
                first: None,
                more: Vec::with_capacity(4),
            }),
        }
    }

    /// A service of this endpoint to reserve: a spare if one is free, else a clone.
    #[inline]
    pub(crate) fn service(&self) -> S
    where
        S: Clone,
    {
        if let Ok(mut spares) = self.spares.try_lock()
            && let Some(spare) = spares.pop()
        {
            return spare;
        }
        self.service.clone()
    }

    /// Takes back a service that has made its call, for a later pick (dropped if the endpoint
    /// is out, or the spares are full or busy).
    #[inline]
    pub(crate) fn give_back(&self, service: S) {
        // The state is read under the lock: `mark_removed` and `mark_failed` change it before
        // they take the lock to empty the spares, so a spare given back is either seen by
        // that emptying or not kept at all.
        if let Ok(mut spares) = self.spares.try_lock()
            && spares.len() < SPARES
            && self.state.load(Ordering::Acquire) == LIVE
        {
            spares.push(service);
        }
    }

    /// Drops the spares (the endpoint is out of rotation: let its connection go).
    fn clear_spares(&self) {
        let mut spares = lock(&self.spares);
        let taken = (spares.first.take(), std::mem::take(&mut spares.more));
        drop(spares);
        drop(taken);
    }

    /// Whether the endpoint may be picked now: still discovered, not failed, and its card
    /// (if any) eligible — or, in a set built while passive signals are ignored (no endpoint
    /// was eligible), shut by passive signals only. A few atomic loads; no lock.
    pub(crate) fn admits(&self, ignoring_passive: bool) -> bool {
        self.admits_with(self.card.as_ref(), ignoring_passive)
    }

    /// [`admits`](Self::admits), with `card` the endpoint's own card reached another way
    /// (see [`Snapshot::admits`]).
    #[inline]
    fn admits_with(&self, card: Option<&EndpointCard>, ignoring_passive: bool) -> bool {
        if self.state.load(Ordering::Acquire) != LIVE {
            return false;
        }
        match card {
            None => true,
            Some(card) => card.is_eligible() || (ignoring_passive && card.passively_blocked()),
        }
    }

    /// Whether an endpoint reserved with a ready service is still ours: as
    /// [`admits`](Self::admits), except that a half-open breaker whose every probe permit is
    /// taken does not count against it — the permit taken may be the one its ready service
    /// holds (a breaker admits a call only with a permit in hand).
    pub(crate) fn still_admits(&self, ignoring_passive: bool) -> bool {
        if self.admits(ignoring_passive) {
            return true;
        }
        self.state.load(Ordering::Acquire) == LIVE
            && self.card.as_ref().is_some_and(|card| {
                card.breaker_state() == BreakerState::HalfOpen { busy: true }
                    && card.is_eligible_ignoring(&[LineKind::Breaker])
            })
    }

    /// Whether the endpoint's card has no health verdict yet (a checker's first probe is
    /// pending).
    pub(crate) fn connecting(&self) -> bool {
        self.state.load(Ordering::Acquire) == LIVE
            && self
                .card
                .as_ref()
                .is_some_and(|c| c.health_verdict() == HealthVerdict::Unknown)
    }

    pub(crate) fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    pub(crate) fn mark_removed(&self) {
        self.state.store(REMOVED, Ordering::Release);
        self.clear_spares();
    }

    /// Takes the endpoint out after its service failed `poll_ready`. Returns whether this
    /// call was the one that did it.
    pub(crate) fn mark_failed(&self, error: &str) -> bool {
        let first = self.failure.set(Arc::from(error)).is_ok();
        let _ = self
            .state
            .compare_exchange(LIVE, FAILED, Ordering::AcqRel, Ordering::Acquire);
        self.clear_spares();
        first
    }

    /// Calls in flight (always 0 for strategies that do not count them).
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.as_ref().map_or(0, Counter::get)
    }

    /// Its counter's position in the balancer's table of counts, if it has one.
    pub(crate) fn counter_index(&self) -> Option<u32> {
        self.in_flight.as_ref().map(Counter::index)
    }

    /// Counts a call made (a no-op for strategies that do not count them).
    pub(crate) fn start_call(&self) {
        if let Some(counter) = &self.in_flight {
            counter.add();
        }
    }

    /// Counts a call finished or dropped: exactly once per [`start_call`](Self::start_call).
    pub(crate) fn end_call(&self) {
        if let Some(counter) = &self.in_flight {
            counter.sub();
        }
    }

    /// The estimate decayed towards zero since its last update, times (in flight + 1).
    fn ewma_cost(&self, now_ns: u64, settings: &Settings) -> f64 {
        let rtt = f64::from_bits(self.rtt_ns.load(Ordering::Relaxed));
        let at = self.rtt_at.load(Ordering::Relaxed);
        let elapsed = now_ns.saturating_sub(at) as f64;
        let decayed = rtt * (-elapsed / settings.ewma_decay_ns).exp();
        decayed * (self.in_flight() as f64 + 1.0)
    }

    /// Folds one observed round-trip time into the peak-EWMA estimate.
    pub(crate) fn observe_rtt(&self, rtt_ns: f64, now_ns: u64, settings: &Settings) {
        let at = self.rtt_at.swap(now_ns, Ordering::Relaxed);
        let elapsed = now_ns.saturating_sub(at) as f64;
        let w = (-elapsed / settings.ewma_decay_ns).exp();
        let _ = self
            .rtt_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                let est = f64::from_bits(bits);
                let next = if rtt_ns > est {
                    rtt_ns
                } else {
                    est * w + rtt_ns * (1.0 - w)
                };
                Some(next.to_bits())
            });
    }

    /// Why this endpoint cannot be used now (for [`NoHealthyTargets`]).
    fn skip(&self) -> SkippedTarget {
        let why = if self.state() == FAILED {
            Skip::Failed(
                self.failure
                    .get()
                    .cloned()
                    .unwrap_or_else(|| Arc::from("poll_ready failed")),
            )
        } else {
            match self.card.as_ref().map(EndpointCard::eligibility) {
                Some(Err(ineligible)) => Skip::Ineligible(ineligible),
                _ => Skip::NotReady,
            }
        };
        SkippedTarget {
            target: self.name.clone(),
            why,
        }
    }
}

/// What discovery has said so far.
#[derive(Debug, Clone)]
pub(crate) enum Discovery {
    Running,
    Ended,
    Failed(Arc<str>),
}

/// One immutable view of the endpoints, swapped whole when anything changes.
pub(crate) struct Snapshot<K, S> {
    pub(crate) generation: u64,
    /// The endpoints to pick from: the eligible ones or, when none is, those that passive
    /// signals alone shut and whose peers are all out too (the rule of
    /// [`endpoint_state::peers`]).
    pub(crate) picks: Box<[Arc<Endpoint<K, S>>]>,
    /// The card of each of `picks` (the same card, not a copy): a pick reads the card of the
    /// endpoint it chose from here, at the same time as the endpoint, rather than after it.
    pub(crate) cards: Box<[Option<EndpointCard>]>,
    /// Whether `picks` ignores passive signals.
    pub(crate) ignoring_passive: bool,
    /// Whether some endpoint is *connecting* (no health verdict yet), or discovery has found
    /// nothing yet: a call that finds nothing eligible may wait for the first verdicts.
    pub(crate) connecting: bool,
    /// For the least-loaded strategies: the calls in flight on each of `picks`, read without
    /// reading the endpoints (empty for the other strategies).
    pub(crate) loads: Loads,
    /// For the weighted strategy: the alias table over `picks`' weights (`None`: uniform).
    pub(crate) alias: Option<Alias>,
    /// For pick-first: the position in `picks` of the endpoint every call goes to (`picks`
    /// is in pick-first order).
    pub(crate) first: usize,
    /// For ring hash: the ring over `all`, with the eligible points of this snapshot.
    pub(crate) ring: Option<RingView>,
    /// Every endpoint, in discovery order.
    pub(crate) all: Box<[Arc<Endpoint<K, S>>]>,
    pub(crate) discovery: Discovery,
    /// Where the next [`any_admits_now`](Self::any_admits_now) starts reading, when there are
    /// more endpoints than it reads.
    pub(crate) recheck_from: AtomicUsize,
}

impl<K, S> Snapshot<K, S> {
    /// The references to the cards of `picks` a pick reads (the snapshot's `cards`).
    pub(crate) fn cards_of(picks: &[Arc<Endpoint<K, S>>]) -> Box<[Option<EndpointCard>]> {
        picks.iter().map(|e| e.card.clone()).collect()
    }

    /// Whether `picks[i]` may be picked now ([`Endpoint::admits`]). With thousands of
    /// endpoints, the endpoint and its card are each a cache miss: its card is read through
    /// this snapshot's reference, so that the two misses overlap instead of the endpoint's
    /// delaying the card's.
    #[inline]
    pub(crate) fn admits(&self, i: usize) -> bool {
        self.picks[i].admits_with(self.cards[i].as_ref(), self.ignoring_passive)
    }

    pub(crate) fn empty() -> Self {
        Snapshot {
            generation: 0,
            picks: Box::new([]),
            cards: Box::new([]),
            ignoring_passive: false,
            connecting: true,
            loads: Loads::none(),
            alias: None,
            first: 0,
            ring: None,
            all: Box::new([]),
            discovery: Discovery::Running,
            recheck_from: AtomicUsize::new(0),
        }
    }

    /// Whether any endpoint would be admitted right now, looking past this snapshot (which
    /// may be a moment stale: the driver rebuilds it on every card change). Only on the path
    /// that is about to report failure, and bounded: it reads at most [`RECHECK`] endpoints
    /// (all of them when there are no more; otherwise the next ones in turn, each rejected call
    /// looking further on), plus, for an endpoint that passive signals alone shut, whether its
    /// peer set has an eligible member (once per set).
    pub(crate) fn any_admits_now(&self) -> bool {
        let n = self.all.len();
        let (start, count) = if n <= RECHECK {
            (0, n)
        } else {
            (
                self.recheck_from.fetch_add(RECHECK, Ordering::Relaxed) % n,
                RECHECK,
            )
        };
        let mut sets: Vec<(Peers, bool)> = Vec::new();
        (0..count).any(|i| {
            let endpoint = &self.all[(start + i) % n];
            if endpoint.admits(false) {
                return true;
            }
            // The rule of `endpoint_state::peers`: shut by passive signals alone, and no
            // member of its peer set eligible.
            let Some(card) = endpoint.card.as_ref().filter(|_| endpoint.state() == LIVE) else {
                return false;
            };
            if !card.passively_blocked() {
                return false;
            }
            let Some(peers) = card.peers() else {
                return false;
            };
            match sets.iter().find(|(p, _)| p.same_set(&peers)) {
                Some((_, ignores)) => *ignores,
                None => {
                    let ignores = peers.ignores_passive_signals();
                    sets.push((peers, ignores));
                    ignores
                }
            }
        })
    }

    /// The error for a call that found nothing to pick: the first [`LISTED`] endpoints read,
    /// the rest counted (the cost of a rejected call does not grow with the number of targets).
    pub(crate) fn no_healthy_targets(
        &self,
        waited: Option<Duration>,
        caller_deadline: bool,
    ) -> NoHealthyTargets {
        let targets: Vec<SkippedTarget> = self.all.iter().take(LISTED).map(|e| e.skip()).collect();
        let unlisted = self.all.len() - targets.len();
        let note: Option<Arc<str>> = match (&self.discovery, self.all.is_empty()) {
            (Discovery::Failed(e), _) => Some(format!("discovery failed: {e}").into()),
            (Discovery::Ended, true) => Some("discovery ended without any target".into()),
            (Discovery::Running, true) => Some("no targets discovered yet".into()),
            _ => None,
        };
        NoHealthyTargets::new(targets, unlisted, note, waited, caller_deadline)
    }
}

/// How many endpoints a call that found nothing to pick reads to see whether the snapshot
/// lags the cards (see [`Snapshot::any_admits_now`]).
const RECHECK: usize = 64;

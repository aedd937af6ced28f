//! The background task that keeps the eligible set exact: it drives discovery, watches every
//! card, and wakes at the next quarantine or open-breaker deadline; after any of these it
//! rebuilds the snapshot the request path reads.
//!
//! Why a task: discovery must make progress while no request is in flight (an endpoint
//! inserted at 3 a.m. must be there for the first call at 9), and card changes must update the
//! set without a request to notice them. The request path never waits for this task: it reads
//! the last snapshot lock-free and double-checks the chosen endpoint's card itself, so a
//! change is honoured at once even before the task has rebuilt the set. The task stops when
//! the last handle on the balancer is dropped.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};

use endpoint_state::rng::{self, Rng};
use endpoint_state::{BreakerState, Changed, HasCard, Peers};
use futures_util::future::{AbortHandle, Abortable, Aborted};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::futures::OwnedNotified;
use tokio::time::{Instant, Sleep};
use tower::discover::{Change, Discover};

use crate::alias::Alias;
use crate::error::BoxError;
use crate::inflight::{Counters, Loads};
use crate::ring::{self, Ring, RingView, Table};
use crate::shared::{Discovery, Endpoint, Kind, REMOVED, Shared, Snapshot};

/// Changes taken from discovery in one go before the task yields to others.
const DISCOVERY_BUDGET: usize = 1024;

struct Entry<K, S> {
    endpoint: Arc<Endpoint<K, S>>,
    watch: Option<AbortHandle>,
}

/// Completes when its endpoint's card changes (`true`) or when the endpoint is gone (`false`).
struct Watch<K, S> {
    endpoint: Arc<Endpoint<K, S>>,
    changed: Abortable<Changed>,
}

impl<K, S> Future for Watch<K, S> {
    type Output = (Arc<Endpoint<K, S>>, bool);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let fired = match Pin::new(&mut self.changed).poll(cx) {
            Poll::Ready(Ok(())) => true,
            Poll::Ready(Err(Aborted)) => false,
            Poll::Pending => return Poll::Pending,
        };
        Poll::Ready((self.endpoint.clone(), fired))
    }
}

pub(crate) struct Driver<D: Discover> {
    discover: Pin<Box<D>>,
    shared: Arc<Shared<D::Key, D::Service>>,
    discovery: Discovery,
    entries: HashMap<D::Key, Entry<D::Key, D::Service>>,
    /// Discovery order; removed endpoints are dropped from it at the next rebuild.
    order: Vec<Arc<Endpoint<D::Key, D::Service>>>,
    watches: FuturesUnordered<Watch<D::Key, D::Service>>,
    /// The peer sets of the endpoints' cards, each with a subscription to members leaving it
    /// (a member that leaves may have been the only eligible one: the rule must be asked
    /// again).
    sets: Vec<(Peers, Pin<Box<OwnedNotified>>)>,
    timer: Option<Pin<Box<Sleep>>>,
    timer_at: Option<Instant>,
    /// Whether discovery has inserted any endpoint yet (before that, calls wait for it as for
    /// targets that are connecting).
    delivered: bool,
    /// Whether discovery has inserted or removed an endpoint since the last rebuild.
    set_changed: bool,
    /// Pick-first: the endpoints in the order calls go to them (discovery order, or shuffled
    /// at every change of the set), and the one calls go to now (sticky while it is picked).
    first_order: Vec<Arc<Endpoint<D::Key, D::Service>>>,
    current: Option<Arc<Endpoint<D::Key, D::Service>>>,
    /// Pick-first's shuffles (seeded from the balancer's seed).
    rng: Rng,
    /// Ring hash: the table of positions, kept between changes of the set (made at the
    /// first), and the ring over `order` it gave at the last change.
    table: Option<Table>,
    ring: Option<Arc<Ring>>,
    /// Least-loaded strategies: the table of the endpoints' counts of calls in flight.
    counters: Counters,
}

impl<D: Discover> fmt::Debug for Driver<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("endpoints", &self.entries.len())
            .field("watches", &self.watches.len())
            .field("timer_at", &self.timer_at)
            .finish_non_exhaustive()
    }
}

impl<D> Driver<D>
where
    D: Discover,
    D::Key: Hash + Eq + Clone + fmt::Display,
    D::Service: HasCard,
    D::Error: Into<BoxError>,
{
    pub(crate) fn new(discover: D, shared: Arc<Shared<D::Key, D::Service>>) -> Self {
        // Its own sequence, apart from the clones' (which mix the seed with their ordinal).
        let rng = Rng::new(rng::mix(shared.settings.seed ^ 0x5348_5546_464C_4521));
        Driver {
            discover: Box::pin(discover),
            shared,
            discovery: Discovery::Running,
            entries: HashMap::new(),
            order: Vec::new(),
            watches: FuturesUnordered::new(),
            sets: Vec::new(),
            timer: None,
            timer_at: None,
            delivered: false,
            set_changed: false,
            first_order: Vec::new(),
            current: None,
            rng,
            table: None,
            ring: None,
            counters: Counters::default(),
        }
    }

    /// Takes whatever discovery has ready now and publishes the first snapshot, so that a
    /// balancer is usable as soon as it is built. No timer is armed here (that needs the
    /// task's context).
    pub(crate) fn prime(&mut self) {
        let mut cx = Context::from_waker(Waker::noop());
        self.poll_discovery(&mut cx);
        self.rebuild();
    }

    /// The task's body: runs until the last handle is dropped.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.shared.driver.register(cx.waker());
        let mut timer_fired = false;
        loop {
            if self.shared.closed.load(Ordering::Acquire) {
                tracing::debug!("last handle dropped; discovery stops");
                return Poll::Ready(());
            }
            let mut dirty = timer_fired | self.shared.dirty.swap(false, Ordering::AcqRel);
            let (changed, exhausted) = self.poll_discovery(cx);
            dirty |= changed;
            dirty |= self.poll_watches(cx);
            dirty |= self.poll_sets(cx);
            if dirty {
                self.rebuild();
            }
            // Register on the timer for the earliest deadline (or learn it has passed).
            timer_fired = self.arm_timer(cx);
            if timer_fired {
                continue;
            }
            if exhausted {
                // More discovery may be ready: let other tasks run, then come back.
                cx.waker().wake_by_ref();
            }
            return Poll::Pending;
        }
    }

    /// Returns (anything changed, budget exhausted with more possibly ready).
    fn poll_discovery(&mut self, cx: &mut Context<'_>) -> (bool, bool) {
        let mut changed = false;
        for _ in 0..DISCOVERY_BUDGET {
            if !matches!(self.discovery, Discovery::Running) {
                return (changed, false);
            }
            match self.discover.as_mut().poll_discover(cx) {
                Poll::Pending => return (changed, false),
                Poll::Ready(Some(Ok(Change::Insert(key, service)))) => {
                    self.insert(key, service);
                    changed = true;
                }
                Poll::Ready(Some(Ok(Change::Remove(key)))) => {
                    self.remove(&key);
                    changed = true;
                }
                Poll::Ready(Some(Err(error))) => {
                    let error: BoxError = error.into();
                    tracing::warn!(%error, "discovery failed; keeping the endpoints it found");
                    self.discovery = Discovery::Failed(error.to_string().into());
                    changed = true;
                }
                Poll::Ready(None) => {
                    tracing::debug!("discovery ended; keeping the endpoints it found");
                    self.discovery = Discovery::Ended;
                    changed = true;
                }
            }
        }
        (changed, true)
    }

    fn insert(&mut self, key: D::Key, service: D::Service) {
        self.delivered = true;
        self.set_changed = true;
        // The endpoint this one replaces goes first, so that a card inserted again leaves the
        // balancer's peer set with the old endpoint and joins it again with the new.
        if let Some(old) = self.entries.remove(&key) {
            self.retire(old);
        }
        let name: Arc<str> = key.to_string().into();
        let card = service.card().cloned();
        if let Some(card) = &card
            && card.peers().is_none()
        {
            // A card in no peer set: this balancer's endpoints are its peers.
            self.shared.peers.add(card);
        }
        // Its own counter, at zero (the one it replaces keeps counting its calls down).
        let in_flight = self
            .shared
            .settings
            .kind
            .tracks_load()
            .then(|| self.counters.counter());
        let endpoint = Arc::new(Endpoint::new(
            key.clone(),
            name,
            service,
            card,
            in_flight,
            &self.shared.settings,
            self.shared.nanos_now(),
        ));
        // Subscribe before the next rebuild reads the card: a change in between is not lost.
        let watch = endpoint.card.as_ref().map(|card| {
            let (changed, handle) = futures_util::future::abortable(card.changed());
            self.watches.push(Watch {
                endpoint: endpoint.clone(),
                changed,
            });
            handle
        });
        tracing::debug!(backend = %endpoint.name, carded = watch.is_some(), "endpoint inserted");
        self.order.push(endpoint.clone());
        self.entries.insert(key, Entry { endpoint, watch });
    }

    fn remove(&mut self, key: &D::Key) {
        if let Some(old) = self.entries.remove(key) {
            tracing::debug!(backend = %old.endpoint.name, "endpoint removed");
            self.set_changed = true;
            self.retire(old);
        }
    }

    /// Takes an endpoint out of rotation. Calls already made on it keep their own clone of
    /// its service and finish normally.
    fn retire(&self, entry: Entry<D::Key, D::Service>) {
        entry.endpoint.mark_removed();
        if let Some(card) = &entry.endpoint.card {
            // Only if it is in this balancer's own set (a no-op otherwise).
            self.shared.peers.remove_card(card);
        }
        if let Some(watch) = entry.watch {
            watch.abort();
        }
    }

    /// Returns whether any card changed. Re-subscribes each fired watch before the rebuild
    /// that follows reads the card.
    fn poll_watches(&mut self, cx: &mut Context<'_>) -> bool {
        let mut changed = false;
        while let Poll::Ready(Some((endpoint, fired))) = self.watches.poll_next_unpin(cx) {
            if !fired || endpoint.state() == REMOVED {
                continue;
            }
            changed = true;
            let Some(card) = endpoint.card.as_ref() else {
                continue;
            };
            let (watch, handle) = futures_util::future::abortable(card.changed());
            if let Some(entry) = self.entries.get_mut(&endpoint.key)
                && Arc::ptr_eq(&entry.endpoint, &endpoint)
            {
                entry.watch = Some(handle);
                self.watches.push(Watch {
                    endpoint,
                    changed: watch,
                });
            }
        }
        changed
    }

    /// Returns whether a member left one of the peer sets in use (re-subscribing to it).
    fn poll_sets(&mut self, cx: &mut Context<'_>) -> bool {
        let mut left = false;
        for (peers, notified) in &mut self.sets {
            while notified.as_mut().poll(cx).is_ready() {
                left = true;
                *notified = Box::pin(peers.member_left());
            }
        }
        left
    }

    /// Keeps one subscription per distinct peer set of the endpoints' cards.
    fn track_sets(&mut self) {
        let mut sets: Vec<(Peers, Pin<Box<OwnedNotified>>)> = Vec::new();
        for endpoint in &self.order {
            let Some(peers) = endpoint.card.as_ref().and_then(|c| c.peers()) else {
                continue;
            };
            if sets.iter().any(|(p, _)| p.same_set(&peers)) {
                continue;
            }
            match self.sets.iter().position(|(p, _)| p.same_set(&peers)) {
                Some(i) => sets.push(self.sets.swap_remove(i)),
                None => {
                    let notified = Box::pin(peers.member_left());
                    sets.push((peers, notified));
                }
            }
        }
        self.sets = sets;
    }

    /// Arms the timer at the earliest deadline found by the last rebuild. Returns `true` when
    /// that deadline has already passed (rebuild again).
    fn arm_timer(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(at) = self.timer_at else {
            return false;
        };
        let timer = match &mut self.timer {
            Some(timer) => {
                if timer.deadline() != at {
                    timer.as_mut().reset(at);
                }
                timer
            }
            None => self.timer.insert(Box::pin(tokio::time::sleep_until(at))),
        };
        if timer.as_mut().poll(cx).is_ready() {
            self.timer_at = None;
            return true;
        }
        false
    }

    /// After discovery changed the set of endpoints: pick-first's order (shuffled once per
    /// change, gRFC A62), ring hash's ring.
    fn set_was_changed(&mut self, kind: Kind) {
        match kind {
            Kind::PickFirst => {
                self.first_order.clone_from(&self.order);
                if self.shared.settings.shuffle {
                    // Fisher-Yates.
                    for i in (1..self.first_order.len()).rev() {
                        let j = self.rng.below(i + 1);
                        self.first_order.swap(i, j);
                    }
                }
            }
            Kind::RingHash => {
                let settings = &self.shared.settings;
                let table = self.table.get_or_insert_with(|| {
                    Table::new(ring::table_size(settings.ring_min, settings.ring_max))
                });
                let ring = table.update(self.order.iter().map(|e| &e.name));
                tracing::debug!(
                    endpoints = self.order.len(),
                    positions = ring.len(),
                    owning = ring.owning(),
                    "hash ring updated"
                );
                self.ring = Some(Arc::new(ring));
            }
            _ => {}
        }
    }

    /// Pick-first: the position in `picks` (in pick-first order) of the endpoint calls go to —
    /// the current one while it is picked; otherwise the first.
    fn stick(&mut self, picks: &[Arc<Endpoint<D::Key, D::Service>>]) -> usize {
        let kept = self
            .current
            .as_ref()
            .and_then(|current| picks.iter().position(|e| Arc::ptr_eq(e, current)));
        let first = kept.unwrap_or(0);
        let next = picks.get(first);
        let moved = match (&self.current, next) {
            (Some(a), Some(b)) => !Arc::ptr_eq(a, b),
            (None, None) => false,
            _ => true,
        };
        if moved {
            match next {
                Some(next) => tracing::info!(backend = %next.name, "pick_first: calls go here now"),
                None => tracing::debug!("pick_first: no endpoint to send calls to"),
            }
        }
        self.current = next.cloned();
        first
    }

    /// Recomputes the eligible set from every card and publishes it. O(endpoints); runs once
    /// per batch of changes, never on the request path.
    ///
    /// The set is the eligible endpoints; when there is none, the endpoints that the one rule
    /// of [`endpoint_state::peers`] admits anyway (shut by passive signals only, and no peer
    /// eligible) — the same question each endpoint's quarantine and breaker gates ask, so the
    /// balancer never picks an endpoint whose gate stays shut.
    fn rebuild(&mut self) {
        let now = Instant::now();
        if self.order.len() != self.entries.len() {
            self.order.retain(|e| e.state() != REMOVED);
        }
        let mut strict = Vec::with_capacity(self.order.len());
        let mut blocked = Vec::new();
        let mut next: Option<Instant> = None;
        let mut connecting = !self.delivered && matches!(self.discovery, Discovery::Running);
        let kind = self.shared.settings.kind;
        let set_changed = std::mem::take(&mut self.set_changed);
        if set_changed {
            self.set_was_changed(kind);
        }
        // Pick-first picks in its own order; the others in discovery order.
        let walk = if kind == Kind::PickFirst {
            &self.first_order
        } else {
            &self.order
        };
        for endpoint in walk {
            if endpoint.admits(false) {
                strict.push(endpoint.clone());
                continue;
            }
            connecting |= endpoint.connecting();
            if endpoint.admits(true) {
                blocked.push(endpoint.clone());
            }
            if let Some(card) = &endpoint.card {
                // Lines that reopen with time alone: wake then.
                let quarantine = card.quarantine_state().until.filter(|u| *u > now);
                // (A half-open breaker with every permit taken reopens when a permit is given
                // back: a change of its card, which wakes this task.)
                let breaker = match card.breaker_state() {
                    BreakerState::Open { until } if until > now => Some(until),
                    _ => None,
                };
                for at in quarantine.into_iter().chain(breaker) {
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
        }
        self.track_sets();
        let ignoring_passive = strict.is_empty() && !blocked.is_empty();
        let picks = if ignoring_passive {
            // Each blocked endpoint is admitted when its own peer set ignores passive signals
            // (no member is eligible; a set may reach beyond this balancer). The rule is
            // `Peers::ignores_passive_signals`, asked once per set.
            let mut sets: Vec<(Peers, bool)> = Vec::new();
            blocked.retain(|e| {
                let Some(peers) = e.card.as_ref().and_then(|c| c.peers()) else {
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
            });
            blocked
        } else {
            strict
        };
        let ignoring_passive = ignoring_passive && !picks.is_empty();
        let alias = if kind == Kind::Weighted {
            let weights: Vec<f64> = picks.iter().map(|e| e.weight).collect();
            Alias::new(&weights)
        } else {
            None
        };
        let loads = if kind.tracks_load() {
            self.counters
                .loads(picks.iter().filter_map(|e| e.counter_index()))
        } else {
            Loads::none()
        };
        let first = if kind == Kind::PickFirst {
            self.stick(&picks)
        } else {
            0
        };
        let ring = match &self.ring {
            Some(ring) if kind == Kind::RingHash => {
                Some(RingView::new(ring.clone(), &self.order, &picks))
            }
            _ => None,
        };
        let previous = self.shared.snapshot.load();
        let generation = previous.generation + 1;
        if previous.picks.is_empty() != picks.is_empty()
            || ignoring_passive != previous.ignoring_passive
        {
            if picks.is_empty() {
                tracing::info!(targets = self.order.len(), "no eligible endpoint");
            } else if ignoring_passive {
                tracing::info!(
                    admitted = picks.len(),
                    "every endpoint that health admits is quarantined or its breaker \
                     open; ignoring them (passive signals never empty the choice)"
                );
            } else {
                tracing::info!(eligible = picks.len(), "eligible endpoints again");
            }
        }
        tracing::trace!(
            generation,
            eligible = picks.len(),
            targets = self.order.len(),
            "eligible set rebuilt"
        );
        drop(previous);
        self.shared.snapshot.store(Arc::new(Snapshot {
            generation,
            cards: Snapshot::cards_of(&picks),
            picks: picks.into_boxed_slice(),
            ignoring_passive,
            connecting,
            loads,
            alias,
            first,
            ring,
            all: self.order.clone().into_boxed_slice(),
            discovery: self.discovery.clone(),
            recheck_from: Default::default(),
        }));
        self.shared.generation.store(generation, Ordering::Release);
        self.shared.changed.notify_waiters();
        self.timer_at = next;
    }
}

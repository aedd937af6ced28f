//! A `tower::discover::Discover` filter: only healthy endpoints are discovered.
//!
//! [`HealthFilter`] wraps any `Discover` of endpoints and hands on an `Insert` only while the
//! endpoint's target is healthy, a `Remove` when it stops being healthy, and the `Insert` again
//! when it recovers. So any balancer that takes a `Discover` — tower's
//! `balance::p2c::Balance`, or tonic's own [`Channel::balance_channel`] through
//! [`drive_balance_channel`] — is driven by the checker without the rest of the kit.
//!
//! [`Channel::balance_channel`]: tonic::transport::Channel::balance_channel

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::future::poll_fn;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use endpoint_state::{CardEvent, EndpointCard, HealthVerdict};
use futures_core::Stream;
use pin_project_lite::pin_project;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tonic::transport::Endpoint;
use tower::discover::{Change, Discover};

use crate::checker::{HealthChecker, Target};

/// Maps a discovered endpoint to the checker target that says whether it is healthy.
type TargetOf<K, S> = Box<dyn FnMut(&K, &S) -> Target + Send>;

struct Known<S> {
    target: Arc<str>,
    /// `None` when the target could not be added to the checker: never healthy.
    card: Option<EndpointCard>,
    service: S,
    /// Whether an `Insert` for it is out (not yet followed by a `Remove`).
    inserted: bool,
    /// Whether the key is queued for a look.
    queued: bool,
}

impl<S> Known<S> {
    fn healthy(&self) -> bool {
        self.card
            .as_ref()
            .is_some_and(|c| c.health_verdict() == HealthVerdict::Healthy)
    }
}

pin_project! {
    /// A `Discover` that passes on only healthy endpoints. See the [module docs](self).
    ///
    /// Each discovered endpoint is mapped to a target of the checker (added to it if it is not
    /// there, and removed with the endpoint); the filter follows the checker's transitions and
    /// re-reads the cards, so it never misses a change, even if it falls behind the
    /// transition stream. It keeps running after the inner discover ends (health still
    /// changes) and ends when both the inner discover and the checker have ended. Errors of
    /// the inner discover are passed on; the filter adds none.
    ///
    /// Memory is bounded by the number of discovered keys: pending changes are coalesced per
    /// key.
    pub struct HealthFilter<D>
    where
        D: Discover,
    {
        #[pin]
        discover: D,
        checker: HealthChecker,
        target_of: TargetOf<D::Key, D::Service>,
        transitions: BroadcastStream<CardEvent>,
        known: HashMap<D::Key, Known<D::Service>>,
        by_target: HashMap<Arc<str>, Vec<D::Key>>,
        // Targets the filter added to the checker (and removes with their last key).
        added: HashSet<Arc<str>>,
        queue: VecDeque<D::Key>,
        discover_done: bool,
        checker_done: bool,
    }
}

impl<D> fmt::Debug for HealthFilter<D>
where
    D: Discover,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HealthFilter")
            .field("known", &self.known.len())
            .field(
                "inserted",
                &self.known.values().filter(|k| k.inserted).count(),
            )
            .field("discover_done", &self.discover_done)
            .field("checker_done", &self.checker_done)
            .finish_non_exhaustive()
    }
}

impl<D> HealthFilter<D>
where
    D: Discover,
    D::Key: Clone + Eq + Hash + fmt::Display,
    D::Service: Clone,
{
    /// Filters `discover` by `checker`: the target of each endpoint is its key in words
    /// (`key.to_string()`), probed with the checker's endpoint template.
    pub fn new(discover: D, checker: HealthChecker) -> Self {
        Self::with_targets(discover, checker, |key: &D::Key, _: &D::Service| {
            Target::new(key.to_string())
        })
    }
}

impl<D> HealthFilter<D>
where
    D: Discover<Service = Endpoint>,
    D::Key: Clone + Eq + Hash + fmt::Display,
{
    /// Filters a discover of tonic [`Endpoint`]s: the target is the key in words, probed with
    /// its own channel built from the discovered endpoint (same TLS, origin and timeouts as
    /// the application's connection, but never the same channel).
    pub fn tonic_endpoints(discover: D, checker: HealthChecker) -> Self {
        Self::with_targets(discover, checker, |key: &D::Key, endpoint: &Endpoint| {
            Target::new(key.to_string()).endpoint(endpoint.clone())
        })
    }
}

impl<D> HealthFilter<D>
where
    D: Discover,
    D::Key: Clone + Eq + Hash,
    D::Service: Clone,
{
    /// Filters `discover` by `checker`, mapping each endpoint to its target with `target_of`.
    pub fn with_targets<F>(discover: D, checker: HealthChecker, target_of: F) -> Self
    where
        F: FnMut(&D::Key, &D::Service) -> Target + Send + 'static,
    {
        // Subscribe before reading any card: a transition after this point is seen, one before
        // is already on the card.
        let transitions = BroadcastStream::new(checker.subscribe());
        HealthFilter {
            discover,
            checker,
            target_of: Box::new(target_of),
            transitions,
            known: HashMap::new(),
            by_target: HashMap::new(),
            added: HashSet::new(),
            queue: VecDeque::new(),
            discover_done: false,
            checker_done: false,
        }
    }

    /// The checker that judges the endpoints.
    pub fn checker(&self) -> &HealthChecker {
        &self.checker
    }

    /// The inner discover.
    pub fn get_ref(&self) -> &D {
        &self.discover
    }

    /// The inner discover, mutably.
    pub fn get_mut(&mut self) -> &mut D {
        &mut self.discover
    }

    /// The inner discover, unwrapped.
    pub fn into_inner(self) -> D {
        self.discover
    }
}

type Out<D> = Change<<D as Discover>::Key, <D as Discover>::Service>;

impl<D> Stream for HealthFilter<D>
where
    D: Discover,
    D::Key: Clone + Eq + Hash,
    D::Service: Clone,
{
    type Item = Result<Out<D>, D::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        loop {
            // 1. Keys whose health may have changed.
            while let Some(key) = this.queue.pop_front() {
                let Some(known) = this.known.get_mut(&key) else {
                    continue;
                };
                known.queued = false;
                let healthy = known.healthy();
                if healthy && !known.inserted {
                    known.inserted = true;
                    return Poll::Ready(Some(Ok(Change::Insert(key, known.service.clone()))));
                }
                if !healthy && known.inserted {
                    known.inserted = false;
                    return Poll::Ready(Some(Ok(Change::Remove(key))));
                }
            }

            // 2. The checker's transitions.
            if !*this.checker_done {
                match Pin::new(&mut *this.transitions).poll_next(cx) {
                    Poll::Ready(Some(Ok(t))) => {
                        if let Some(keys) = this.by_target.get(&t.target) {
                            for key in keys {
                                enqueue(this.known, this.queue, key);
                            }
                        }
                        continue;
                    }
                    Poll::Ready(Some(Err(BroadcastStreamRecvError::Lagged(missed)))) => {
                        tracing::debug!(missed, "health filter fell behind; re-reading every card");
                        let keys: Vec<_> = this.known.keys().cloned().collect();
                        for key in &keys {
                            enqueue(this.known, this.queue, key);
                        }
                        continue;
                    }
                    Poll::Ready(None) => *this.checker_done = true,
                    Poll::Pending => {}
                }
            }

            // 3. The inner discover.
            if !*this.discover_done {
                match this.discover.as_mut().poll_discover(cx) {
                    Poll::Ready(Some(Ok(Change::Insert(key, service)))) => {
                        let target = (this.target_of)(&key, &service);
                        let name: Arc<str> = target.name().into();
                        // The same key again replaces its service; if it keeps its target,
                        // the target stays registered (and owned) as it was.
                        let old = this.known.remove(&key);
                        let was_inserted = old.as_ref().is_some_and(|o| o.inserted);
                        if let Some(old) = old.filter(|old| old.target != name) {
                            unlist(this.by_target, this.added, this.checker, &key, &old.target);
                        }
                        let card = if let Some(card) = this.checker.card(&name) {
                            Some(card)
                        } else {
                            match this.checker.add_target(target) {
                                Ok(card) => {
                                    this.added.insert(name.clone());
                                    Some(card)
                                }
                                Err(error) => {
                                    tracing::warn!(backend = %name, %error, "discovered endpoint cannot be health-checked; it will not be used");
                                    None
                                }
                            }
                        };
                        let keys = this.by_target.entry(name.clone()).or_default();
                        if !keys.contains(&key) {
                            keys.push(key.clone());
                        }
                        let mut known = Known {
                            target: name,
                            card,
                            service,
                            inserted: false,
                            queued: false,
                        };
                        if known.healthy() {
                            known.inserted = true;
                            let out = Change::Insert(key.clone(), known.service.clone());
                            this.known.insert(key, known);
                            return Poll::Ready(Some(Ok(out)));
                        }
                        this.known.insert(key.clone(), known);
                        if was_inserted {
                            return Poll::Ready(Some(Ok(Change::Remove(key))));
                        }
                        continue;
                    }
                    Poll::Ready(Some(Ok(Change::Remove(key)))) => {
                        if forget(this.known, this.by_target, this.added, this.checker, &key) {
                            return Poll::Ready(Some(Ok(Change::Remove(key))));
                        }
                        continue;
                    }
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                    Poll::Ready(None) => {
                        *this.discover_done = true;
                        continue;
                    }
                    Poll::Pending => {}
                }
            }

            if *this.discover_done && *this.checker_done {
                return Poll::Ready(None);
            }
            return Poll::Pending;
        }
    }
}

fn enqueue<K: Clone + Eq + Hash, S>(
    known: &mut HashMap<K, Known<S>>,
    queue: &mut VecDeque<K>,
    key: &K,
) {
    if let Some(k) = known.get_mut(key)
        && !k.queued
    {
        k.queued = true;
        queue.push_back(key.clone());
    }
}

/// Forgets a key (removing its target from the checker if the filter added it and no other
/// key uses it). Returns whether an `Insert` for it was out.
fn forget<K: Clone + Eq + Hash, S>(
    known: &mut HashMap<K, Known<S>>,
    by_target: &mut HashMap<Arc<str>, Vec<K>>,
    added: &mut HashSet<Arc<str>>,
    checker: &HealthChecker,
    key: &K,
) -> bool {
    match known.remove(key) {
        Some(old) => {
            unlist(by_target, added, checker, key, &old.target);
            old.inserted
        }
        None => false,
    }
}

/// Takes `key` off `target`'s list, and the target off the checker if the filter added it and
/// no other key uses it.
fn unlist<K: Eq + Hash>(
    by_target: &mut HashMap<Arc<str>, Vec<K>>,
    added: &mut HashSet<Arc<str>>,
    checker: &HealthChecker,
    key: &K,
    target: &Arc<str>,
) {
    if let Some(keys) = by_target.get_mut(target) {
        keys.retain(|k| k != key);
        if keys.is_empty() {
            by_target.remove(target);
            if added.remove(target) {
                checker.remove_target(target);
            }
        }
    }
}

/// Drives tonic's [`Channel::balance_channel`] from a [`HealthFilter`] of endpoints: every
/// change the filter emits is sent to the channel's change sender, so the balanced channel
/// only ever holds healthy endpoints.
///
/// Runs until the filter ends (`Ok`), the filter's inner discover fails (`Err`), or the
/// balanced channel is dropped (`Ok`). Spawn it next to the channel. The sender is bounded:
/// when the channel is slow to take changes, this waits (and so does the filter; the cards
/// keep the current verdicts, so nothing is lost).
///
/// [`Channel::balance_channel`]: tonic::transport::Channel::balance_channel
pub async fn drive_balance_channel<D>(
    filter: HealthFilter<D>,
    changes: tokio::sync::mpsc::Sender<tonic::transport::channel::Change<D::Key, Endpoint>>,
) -> Result<(), D::Error>
where
    D: Discover<Service = Endpoint>,
    D::Key: Clone + Eq + Hash,
{
    let mut filter = std::pin::pin!(filter);
    while let Some(change) = poll_fn(|cx| filter.as_mut().poll_next(cx)).await {
        let change = match change? {
            Change::Insert(key, endpoint) => {
                tonic::transport::channel::Change::Insert(key, endpoint)
            }
            Change::Remove(key) => tonic::transport::channel::Change::Remove(key),
        };
        if changes.send(change).await.is_err() {
            return Ok(());
        }
    }
    Ok(())
}

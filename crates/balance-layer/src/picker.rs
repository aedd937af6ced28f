//! One clone's picking: at most one endpoint reserved in `poll_ready` for `call`, chosen by the
//! strategy from the eligible set, and the endpoints it waits on while none is ready.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use endpoint_state::rng::Rng;
use tokio::sync::futures::OwnedNotified;
use tower_service::Service;

use crate::error::BoxError;
use crate::shared::{Endpoint, Kind, Shared, Snapshot};

/// How many endpoints one `poll_ready` tries before it waits (on every one it tried that was
/// eligible but not ready, and on the next change of the eligible set).
const ATTEMPTS: usize = 4;

/// An endpoint a clone has chosen, with its own clone of the endpoint's service.
pub(crate) struct Reserved<K, S> {
    pub(crate) endpoint: Arc<Endpoint<K, S>>,
    pub(crate) service: S,
    pub(crate) ignoring_passive: bool,
}

enum Slot<K, S> {
    /// Nothing chosen.
    Empty,
    /// Chosen and ready: `call` uses it.
    Ready(Reserved<K, S>),
    /// The endpoints tried were eligible but not ready: waiting on them (kept in
    /// `Picker::waiting`) and on the eligible set.
    Waiting,
    /// `poll_ready` found nothing eligible: `call` reports it (or waits).
    Unavailable,
    /// Ring hash: something is eligible, and `call` chooses with the request's hash.
    Deferred,
}

impl<K, S> Slot<K, S> {
    fn describe(&self) -> &'static str {
        match self {
            Slot::Empty => "nothing",
            Slot::Ready(_) => "ready endpoint",
            Slot::Waiting => "endpoints not ready yet",
            Slot::Unavailable => "nothing eligible",
            Slot::Deferred => "a choice by the request's hash",
        }
    }
}

pub(crate) enum Taken<K, S> {
    Endpoint(Reserved<K, S>),
    Nothing,
    NotReady,
    /// Ring hash: choose by the request's hash (something was eligible in `poll_ready`).
    Deferred,
}

pub(crate) enum Picked {
    /// An endpoint is reserved and ready (or, for ring hash, the choice is left to `call`).
    Endpoint,
    /// Nothing is eligible.
    Nothing,
}

/// One clone's choosing state: at most one reserved endpoint, its generator, and (only while
/// it waits) the endpoints it waits on and a subscription to changes of the eligible set.
pub(crate) struct Picker<K, S> {
    pub(crate) shared: Arc<Shared<K, S>>,
    slot: Slot<K, S>,
    /// While `slot` is `Waiting`: the endpoints tried that were not ready, each registered
    /// with this clone's waker. At most `ATTEMPTS`; the buffer is kept for reuse.
    waiting: Vec<Reserved<K, S>>,
    rng: Rng,
    listener: Option<Pin<Box<OwnedNotified>>>,
    /// The generation of the snapshot the last decision was made on.
    pub(crate) seen: u64,
    /// Endpoints this clone picks only when no other is eligible (a call sent again after
    /// they did not take it). Empty, without an allocation, on the common path.
    avoid: Vec<Arc<str>>,
}

impl<K, S> Picker<K, S> {
    pub(crate) fn new(shared: Arc<Shared<K, S>>) -> Self {
        Picker {
            rng: shared.clone_rng(),
            shared,
            slot: Slot::Empty,
            waiting: Vec::new(),
            listener: None,
            seen: 0,
            avoid: Vec::new(),
        }
    }

    /// From now on, picks the endpoint named `target` (as well as those avoided already) only
    /// when no other is eligible. An endpoint reserved already is let go if it is that one.
    pub(crate) fn avoid(&mut self, target: Arc<str>) {
        if let Slot::Ready(reserved) = &self.slot
            && reserved.endpoint.name == target
        {
            self.slot = Slot::Empty;
        }
        if !self.avoid.contains(&target) {
            self.avoid.push(target);
        }
    }

    /// The endpoints this clone avoids (empty if none).
    pub(crate) fn avoided(&self) -> &[Arc<str>] {
        &self.avoid
    }

    /// A random request hash (ring hash, for a request that has none), from this clone's
    /// generator.
    pub(crate) fn random_hash(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// The names of the endpoints this clone has chosen and waits on to become ready.
    pub(crate) fn waiting_for(&self) -> Vec<Arc<str>> {
        self.waiting
            .iter()
            .map(|r| r.endpoint.name.clone())
            .collect()
    }

    /// The strategy's choice, moved on to the next endpoint not avoided when it is one to
    /// avoid (kept when every endpoint is).
    fn choose(&mut self, snap: &Snapshot<K, S>) -> usize {
        let n = snap.picks.len();
        let i = self.shared.choose(snap, &mut self.rng);
        if self.avoid.is_empty() || n < 2 {
            return i;
        }
        (0..n)
            .map(|k| (i + k) % n)
            .find(|&j| !self.avoid.contains(&snap.picks[j].name))
            .unwrap_or(i)
    }

    /// What this clone holds, in words (for `Debug`).
    pub(crate) fn describe(&self) -> &'static str {
        self.slot.describe()
    }

    /// Takes what `poll_pick` reserved, for `call`.
    pub(crate) fn take(&mut self) -> Taken<K, S> {
        match std::mem::replace(&mut self.slot, Slot::Empty) {
            Slot::Ready(reserved) => Taken::Endpoint(reserved),
            Slot::Unavailable => Taken::Nothing,
            Slot::Deferred => Taken::Deferred,
            other => {
                self.slot = other;
                Taken::NotReady
            }
        }
    }

    /// `Ready` once the eligible set is newer than the one the last decision saw; otherwise
    /// `Pending`, woken when it changes. Subscribes first and looks second, so a change in
    /// between is not lost.
    pub(crate) fn poll_set_change(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.shared
            .poll_newer_than(self.seen, &mut self.listener, cx)
    }

    fn settle(&mut self, slot: Slot<K, S>, picked: Picked) -> Poll<Result<Picked, BoxError>> {
        self.slot = slot;
        self.waiting.clear();
        self.listener = None;
        Poll::Ready(Ok(picked))
    }

    fn fail(&self, endpoint: &Endpoint<K, S>, error: BoxError) {
        self.shared.fail(endpoint, &error);
    }

    /// Polls the endpoints this clone waits on; `Some` with the first that is ready.
    fn poll_waiting<Req>(&mut self, cx: &mut Context<'_>) -> Option<Reserved<K, S>>
    where
        S: Service<Req>,
        S::Error: Into<BoxError>,
    {
        let mut i = 0;
        while i < self.waiting.len() {
            let reserved = &mut self.waiting[i];
            if !reserved.endpoint.still_admits(reserved.ignoring_passive) {
                self.waiting.swap_remove(i);
                continue;
            }
            match reserved.service.poll_ready(cx) {
                Poll::Ready(Ok(())) => return Some(self.waiting.swap_remove(i)),
                Poll::Ready(Err(e)) => {
                    let reserved = self.waiting.swap_remove(i);
                    self.fail(&reserved.endpoint, e.into());
                }
                Poll::Pending => i += 1,
            }
        }
        None
    }

    /// Reserves a ready, eligible endpoint (`Picked::Endpoint`), or learns that nothing is
    /// eligible (`Picked::Nothing`). `Pending` while every endpoint tried is eligible but not
    /// ready, woken by any of them becoming ready or by a change of the eligible set.
    pub(crate) fn poll_pick<Req>(&mut self, cx: &mut Context<'_>) -> Poll<Result<Picked, BoxError>>
    where
        S: Service<Req> + Clone,
        S::Error: Into<BoxError>,
    {
        loop {
            match std::mem::replace(&mut self.slot, Slot::Empty) {
                Slot::Ready(reserved) => {
                    // Asked again: still ours if its card still admits it (a busy half-open
                    // breaker may be busy with this very reservation's permit).
                    if reserved.endpoint.still_admits(reserved.ignoring_passive) {
                        return self.settle(Slot::Ready(reserved), Picked::Endpoint);
                    }
                }
                Slot::Waiting => {
                    if let Some(ready) = self.poll_waiting::<Req>(cx) {
                        return self.settle(Slot::Ready(ready), Picked::Endpoint);
                    }
                    if !self.waiting.is_empty() {
                        self.slot = Slot::Waiting;
                        ready!(self.poll_set_change(cx));
                        // The set changed: choose again.
                        self.slot = Slot::Empty;
                    }
                    self.waiting.clear();
                }
                Slot::Empty | Slot::Unavailable | Slot::Deferred => {}
            }

            let snap = self.shared.snapshot.load();
            self.seen = snap.generation;
            let n = snap.picks.len();
            if n == 0 {
                if snap.any_admits_now() {
                    // The snapshot lags the cards: have it rebuilt, and wait for that.
                    drop(snap);
                    self.shared.kick();
                    ready!(self.poll_set_change(cx));
                    continue;
                }
                return self.settle(Slot::Unavailable, Picked::Nothing);
            }
            let attempts = match self.shared.settings.kind {
                // The request's hash chooses, in `call`.
                Kind::RingHash => return self.settle(Slot::Deferred, Picked::Endpoint),
                // Every call goes to the one endpoint, and waits for it (no spill-over).
                Kind::PickFirst => 1,
                _ => n.min(ATTEMPTS),
            };

            let mut stale = false;
            for _ in 0..attempts {
                let i = self.choose(&snap);
                let endpoint = &snap.picks[i];
                if !snap.admits(i) {
                    // Its card changed since the snapshot was built.
                    stale = true;
                    continue;
                }
                // One of the endpoint's spare services, or a clone.
                let mut reserved = Reserved {
                    endpoint: endpoint.clone(),
                    service: endpoint.service(),
                    ignoring_passive: snap.ignoring_passive,
                };
                match reserved.service.poll_ready(cx) {
                    Poll::Ready(Ok(())) => {
                        if stale {
                            self.shared.kick();
                        }
                        return self.settle(Slot::Ready(reserved), Picked::Endpoint);
                    }
                    Poll::Ready(Err(e)) => {
                        self.fail(endpoint, e.into());
                        stale = true;
                    }
                    // Keep it: its readiness will wake this clone.
                    Poll::Pending => self.waiting.push(reserved),
                }
            }
            drop(snap);
            if stale {
                self.shared.kick();
            }
            self.slot = Slot::Waiting;
            ready!(self.poll_set_change(cx));
            self.slot = Slot::Empty;
            self.waiting.clear();
        }
    }
}

//! The balancer service and the per-clone picking logic.

use std::fmt;
use std::future::{Future, poll_fn};
use std::hash::Hash;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};

use endpoint_state::HasCard;
use tokio::sync::futures::OwnedNotified;
use tower::discover::Discover;
use tower_service::Service;

use crate::config::BalanceConfig;
use crate::deadline::RequestDeadline;
use crate::driver::Driver;
use crate::error::{BoxError, InvalidConfig};
use crate::future::{ResponseFuture, Wait};
use crate::rng::Rng;
use crate::shared::{Endpoint, Settings, Shared};

/// How many endpoints one `poll_ready` tries before it waits (on every one it tried that was
/// eligible but not ready, and on the next change of the eligible set).
const ATTEMPTS: usize = 4;

/// A load balancer over a [`Discover`] of endpoint services that picks, per request, one
/// *eligible* and *ready* endpoint in O(1).
///
/// Built by [`Balance::new`] or [`BalanceLayer`](crate::BalanceLayer). Cloning is cheap (a few
/// atomic increments, no allocation): every clone shares the eligible set and the strategy's state, and each
/// reserves its own endpoint — `poll_ready` picks one and polls a clone of its service until
/// it is ready; `call` sends the request there. There is no worker task on the request path.
/// After a call, that (now unready) clone goes back to the endpoint for a later pick, so
/// steady traffic does not clone services; an endpoint's spares go when it is removed.
///
/// A background task, spawned when the balancer is built and stopped when the last clone is
/// dropped, drives discovery and keeps the eligible set in step with every endpoint's
/// [`EndpointCard`](endpoint_state::EndpointCard) (see the [crate docs](crate)).
///
/// When nothing is eligible, `poll_ready` still returns `Ready` (a transient condition is
/// never an `Err` from `poll_ready`), and the call fails at once with
/// [`NoHealthyTargets`](crate::error::NoHealthyTargets) — or, with
/// [`wait_for_ready`](BalanceConfig::wait_for_ready), its response future waits for an
/// eligible endpoint up to the request's deadline.
///
/// `Req` is the request type, as in tower's own balancer (it lets `ready()` and `call` infer
/// it).
pub struct Balance<D: Discover, Req> {
    picker: Picker<D::Key, D::Service>,
    owner: Arc<Owner<D::Key, D::Service>>,
    _req: PhantomData<fn(Req)>,
}

/// Stops the background task when the last balancer handle is dropped.
pub(crate) struct Owner<K, S> {
    shared: Arc<Shared<K, S>>,
}

impl<K, S> Drop for Owner<K, S> {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.driver.wake();
    }
}

impl<D, Req> Balance<D, Req>
where
    D: Discover + Send + 'static,
    D::Key: Hash + Eq + Clone + fmt::Display + Send + Sync + 'static,
    D::Service: HasCard + Clone + Send + Sync + 'static,
    D::Error: Into<BoxError>,
{
    /// Validates `config`, takes the endpoints `discover` has ready now, and spawns the task
    /// that drives discovery from then on.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime (the background task is spawned with `tokio::spawn`).
    pub fn new(discover: D, config: BalanceConfig) -> Result<Self, InvalidConfig> {
        config.validate()?;
        Ok(Self::with_settings(
            discover,
            Settings::from_config(&config),
        ))
    }

    pub(crate) fn with_settings(discover: D, settings: Settings) -> Self {
        let shared = Arc::new(Shared::new(settings));
        let mut driver = Driver::new(discover, shared.clone());
        driver.prime();
        tokio::spawn(poll_fn(move |cx| driver.poll(cx)));
        Balance {
            picker: Picker::new(shared.clone()),
            owner: Arc::new(Owner { shared }),
            _req: PhantomData,
        }
    }
}

impl<D: Discover, Req> Balance<D, Req> {
    /// The names (discovery keys) of the endpoints currently picked from: the eligible ones,
    /// or, when none is, those eligible but for quarantine.
    pub fn eligible_targets(&self) -> Vec<Arc<str>> {
        let snap = self.picker.shared.snapshot.load();
        snap.picks.iter().map(|e| e.name.clone()).collect()
    }

    /// The names of every endpoint discovery has inserted and not removed, in discovery order.
    pub fn targets(&self) -> Vec<Arc<str>> {
        let snap = self.picker.shared.snapshot.load();
        snap.all.iter().map(|e| e.name.clone()).collect()
    }

    /// Whether the balancer is ignoring passive signals — quarantine and open breakers —
    /// because every endpoint that health admits is shut by them (they narrow the choice; they
    /// never empty it: see [`endpoint_state::peers`]).
    pub fn ignoring_passive_signals(&self) -> bool {
        self.picker.shared.snapshot.load().ignoring_passive
    }

    /// A future that completes the next time the balancer takes in a change — an endpoint
    /// inserted or removed, or a card that made one eligible or ineligible — after this call.
    ///
    /// Create it *before* reading [`eligible_targets`](Self::eligible_targets) or
    /// [`targets`](Self::targets): a change that lands between the read and the first poll
    /// still completes it, so a caller waiting for a condition never misses one.
    pub fn changed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        Arc::clone(&self.picker.shared.changed).notified_owned()
    }

    /// How many calls are in flight on the endpoint named `target` (counted by the
    /// least-loaded strategies only; `None` for an unknown target).
    pub fn in_flight(&self, target: &str) -> Option<usize> {
        let snap = self.picker.shared.snapshot.load();
        snap.all
            .iter()
            .find(|e| &*e.name == target)
            .map(|e| e.in_flight())
    }
}

impl<D: Discover, Req> Clone for Balance<D, Req> {
    /// A new handle on the same balancer; it starts unready (it has reserved nothing).
    fn clone(&self) -> Self {
        Balance {
            picker: Picker::new(self.picker.shared.clone()),
            owner: self.owner.clone(),
            _req: PhantomData,
        }
    }
}

impl<D: Discover, Req> fmt::Debug for Balance<D, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let snap = self.picker.shared.snapshot.load();
        f.debug_struct("Balance")
            .field("strategy", &self.picker.shared.settings.kind)
            .field("eligible", &snap.picks.len())
            .field("targets", &snap.all.len())
            .field("ignoring_passive", &snap.ignoring_passive)
            .field("reserved", &self.picker.slot.describe())
            .finish()
    }
}

impl<D, Req> Service<Req> for Balance<D, Req>
where
    D: Discover,
    D::Service: Service<Req> + Clone,
    <D::Service as Service<Req>>::Error: Into<BoxError>,
    Req: RequestDeadline,
{
    type Response = <D::Service as Service<Req>>::Response;
    type Error = BoxError;
    type Future = ResponseFuture<D::Key, D::Service, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Nothing eligible is not an error here: the call reports it (or waits).
        ready!(self.picker.poll_pick::<Req>(cx))?;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let taken = self.picker.take();
        let shared = &self.picker.shared;
        match taken {
            Taken::Endpoint(reserved) => {
                let (future, endpoint, service) = ResponseFuture::called(shared, reserved, req);
                endpoint.give_back(service);
                future
            }
            Taken::Nothing if shared.settings.wait_for_ready => {
                ResponseFuture::waiting(shared.clone(), self.owner.clone(), req, Wait::ForReady)
            }
            Taken::Nothing
                if !shared.settings.connecting_wait.is_zero()
                    && shared.snapshot.load().connecting =>
            {
                ResponseFuture::waiting(shared.clone(), self.owner.clone(), req, Wait::Connecting)
            }
            Taken::Nothing => ResponseFuture::failed(
                shared
                    .snapshot
                    .load()
                    .no_healthy_targets(None, false)
                    .into(),
            ),
            Taken::NotReady => panic!("Balance::call called before poll_ready returned Ready"),
        }
    }
}

/// An endpoint a clone has chosen, with its own clone of the endpoint's service.
pub(crate) struct Reserved<K, S> {
    pub(crate) endpoint: Arc<Endpoint<K, S>>,
    pub(crate) service: S,
    ignoring_passive: bool,
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
}

impl<K, S> Slot<K, S> {
    fn describe(&self) -> &'static str {
        match self {
            Slot::Empty => "nothing",
            Slot::Ready(_) => "ready endpoint",
            Slot::Waiting => "endpoints not ready yet",
            Slot::Unavailable => "nothing eligible",
        }
    }
}

pub(crate) enum Taken<K, S> {
    Endpoint(Reserved<K, S>),
    Nothing,
    NotReady,
}

pub(crate) enum Picked {
    /// An endpoint is reserved and ready.
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
        }
    }

    /// Takes what `poll_pick` reserved, for `call`.
    pub(crate) fn take(&mut self) -> Taken<K, S> {
        match std::mem::replace(&mut self.slot, Slot::Empty) {
            Slot::Ready(reserved) => Taken::Endpoint(reserved),
            Slot::Unavailable => Taken::Nothing,
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
        loop {
            let listener = self
                .listener
                .get_or_insert_with(|| Box::pin(self.shared.changed.clone().notified_owned()));
            if self.shared.generation() > self.seen {
                self.listener = None;
                return Poll::Ready(());
            }
            match listener.as_mut().poll(cx) {
                // Notified: the generation has moved (checked at the top).
                Poll::Ready(()) => self.listener = None,
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn settle(&mut self, slot: Slot<K, S>, picked: Picked) -> Poll<Result<Picked, BoxError>> {
        self.slot = slot;
        self.waiting.clear();
        self.listener = None;
        Poll::Ready(Ok(picked))
    }

    fn fail(&self, endpoint: &Endpoint<K, S>, error: BoxError) {
        if endpoint.mark_failed(&error.to_string()) {
            tracing::warn!(
                target = %endpoint.name,
                %error,
                "balance: endpoint failed poll_ready; out of rotation until discovery inserts it again"
            );
        }
        self.shared.kick();
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
            if !reserved.endpoint.admits(reserved.ignoring_passive) {
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
                    // Asked again: still ours if its card still admits it.
                    if reserved.endpoint.admits(reserved.ignoring_passive) {
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
                Slot::Empty | Slot::Unavailable => {}
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

            let mut stale = false;
            for _ in 0..n.min(ATTEMPTS) {
                let endpoint = &snap.picks[self.shared.choose(&snap, &mut self.rng)];
                if !endpoint.admits(snap.ignoring_passive) {
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

//! The balancer service: its handles, and `poll_ready` and `call` on a clone's picker.

use std::fmt;
use std::future::poll_fn;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use endpoint_state::{ConfigError, HasCard};
use tower::discover::Discover;
use tower_service::Service;

use crate::config::BalanceConfig;
use crate::deadline::RequestDeadline;
use crate::driver::Driver;
use crate::error::BoxError;
use crate::future::{ResponseFuture, Wait};
use crate::picker::{Picker, Taken};
use crate::shared::{Owner, Settings, Shared};

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
    pub fn new(discover: D, config: BalanceConfig) -> Result<Self, ConfigError> {
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
            .field("reserved", &self.picker.describe())
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

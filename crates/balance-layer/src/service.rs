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
use crate::future::ResponseFuture;
use crate::hash::RequestHashKey;
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

    /// From now on, this handle picks the endpoint named `target` only when no other endpoint
    /// is eligible — for a call sent again after `target` did not take it, which should land
    /// elsewhere whenever it can. Calls add up: after `avoid("a")` and `avoid("b")` the handle
    /// picks `c` while `c` is eligible, and `a` or `b` only when nothing else is. A clone does
    /// not inherit them.
    pub fn avoid(&mut self, target: impl Into<Arc<str>>) {
        self.picker.avoid(target.into());
    }

    /// The endpoints this handle has chosen and is waiting on, because each is eligible but its
    /// service is not ready yet (`poll_ready` returned `Pending`): empty when it is not waiting
    /// on any.
    pub fn waiting_for(&self) -> Vec<Arc<str>> {
        self.picker.waiting_for()
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
    Req: RequestDeadline + RequestHashKey,
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
            Taken::Endpoint(reserved) => ResponseFuture::called(shared, reserved, req),
            Taken::Deferred => {
                // Ring hash: the request's hash chooses the endpoint.
                let shared = shared.clone();
                let hash = req
                    .request_hash(shared.settings.hash_header.as_ref())
                    .unwrap_or_else(|| self.picker.random_hash());
                let avoid = self.picker.avoided().to_vec();
                ResponseFuture::hashed(shared, self.owner.clone(), hash, avoid, req)
            }
            // Waits (wait-for-ready, the call's or the balancer's; targets connecting) or
            // fails with `NoHealthyTargets`.
            Taken::Nothing => ResponseFuture::nothing_eligible(shared, &self.owner, req),
            Taken::NotReady => panic!("Balance::call called before poll_ready returned Ready"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::{Ready, ready};
    use std::time::Duration;

    use futures_util::StreamExt;
    use tokio_stream::wrappers::ReceiverStream;
    use tower::ServiceExt;
    use tower::discover::Change;

    use super::*;
    use crate::config::Strategy;
    use crate::{NoCard, WithoutCards};

    type Req = http::Request<()>;

    /// An endpoint that answers its name and the `grpc-timeout` its request carried.
    #[derive(Clone)]
    struct Named(Arc<str>);

    impl Service<Req> for Named {
        type Response = (Arc<str>, Option<Duration>);
        type Error = Infallible;
        type Future = Ready<Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: Req) -> Self::Future {
            ready(Ok((self.0.clone(), req.time_budget())))
        }
    }

    type Changes = (
        tokio::sync::mpsc::Sender<Change<String, NoCard<Named>>>,
        Balance<WithoutCards<ChangeStream>, Req>,
    );
    type ChangeStream = futures_util::stream::Map<
        ReceiverStream<Change<String, NoCard<Named>>>,
        fn(Change<String, NoCard<Named>>) -> Result<Change<String, NoCard<Named>>, Infallible>,
    >;

    fn balancer(config: BalanceConfig) -> Changes {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let changes: ChangeStream = ReceiverStream::new(rx).map(Ok as fn(_) -> _);
        (
            tx,
            Balance::new(WithoutCards::new(changes), config).unwrap(),
        )
    }

    async fn insert(tx: &tokio::sync::mpsc::Sender<Change<String, NoCard<Named>>>, name: &str) {
        let svc = NoCard::new(Named(Arc::from(name)));
        tx.send(Change::Insert(name.to_owned(), svc)).await.unwrap();
    }

    /// One call with a default request: the name of the endpoint picked.
    async fn pick(balance: &mut Balance<WithoutCards<ChangeStream>, Req>) -> Arc<str> {
        balance
            .ready()
            .await
            .unwrap()
            .call(Req::default())
            .await
            .unwrap()
            .0
    }

    /// Lets the balancer's task take in what was sent (paused clock: no time passes).
    async fn settle<D: Discover, R>(balance: &Balance<D, R>, n: usize) {
        for _ in 0..1000 {
            if balance.targets().len() == n {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the balancer did not take in {n} endpoints");
    }

    #[tokio::test(start_paused = true)]
    async fn an_avoided_endpoint_is_picked_only_when_no_other_is_eligible() {
        for strategy in [
            Strategy::RoundRobin,
            Strategy::Random,
            Strategy::LeastInFlight,
        ] {
            let (tx, mut balance) = balancer(BalanceConfig::new().strategy(strategy).seed(7));
            for name in ["a", "b", "c"] {
                insert(&tx, name).await;
            }
            settle(&balance, 3).await;
            balance.avoid("b");
            for _ in 0..100 {
                let name = pick(&mut balance).await;
                assert_ne!(&*name, "b");
            }
            // Alone, it is picked after all.
            tx.send(Change::Remove("a".into())).await.unwrap();
            tx.send(Change::Remove("c".into())).await.unwrap();
            settle(&balance, 1).await;
            let name = pick(&mut balance).await;
            assert_eq!(&*name, "b");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn endpoints_avoided_add_up() {
        for strategy in [
            Strategy::RoundRobin,
            Strategy::Random,
            Strategy::LeastInFlight,
            Strategy::ring_hash(),
        ] {
            let (tx, mut balance) =
                balancer(BalanceConfig::new().strategy(strategy.clone()).seed(3));
            for name in ["a", "b", "c", "d"] {
                insert(&tx, name).await;
            }
            settle(&balance, 4).await;
            balance.avoid("a");
            balance.avoid("c");
            balance.avoid("a");
            for _ in 0..100 {
                let name = pick(&mut balance).await;
                assert!(&*name == "b" || &*name == "d", "{strategy:?}: {name}");
            }
            // Every endpoint avoided: any may be picked.
            balance.avoid("b");
            balance.avoid("d");
            let name = pick(&mut balance).await;
            assert!(["a", "b", "c", "d"].contains(&&*name), "{name}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_waited_for_an_endpoint_carries_the_budget_left() {
        let (tx, mut balance) = balancer(BalanceConfig::new().wait_for_ready(true));
        settle(&balance, 0).await;
        let req = http::Request::builder()
            .header("grpc-timeout", "1S")
            .body(())
            .unwrap();
        let call = balance.ready().await.unwrap().call(req);
        let call = tokio::spawn(call);
        tokio::time::sleep(Duration::from_millis(400)).await;
        insert(&tx, "late").await;
        let (name, budget) = call.await.unwrap().unwrap();
        assert_eq!(&*name, "late");
        // The call waited 400 ms of its second: it goes on with what is left.
        assert_eq!(budget, Some(Duration::from_millis(600)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_says_whether_it_waits_for_ready_over_the_balancers_setting() {
        for configured in [false, true] {
            let (tx, mut balance) = balancer(
                BalanceConfig::new()
                    .wait_for_ready(configured)
                    .connecting_wait(Duration::ZERO),
            );
            settle(&balance, 0).await;
            let with = |wait: bool| {
                let mut req = http::Request::builder()
                    .header("grpc-timeout", "1S")
                    .body(())
                    .unwrap();
                req.extensions_mut().insert(crate::WaitForReady(wait));
                req
            };
            // The call that says it does not wait fails at once, whatever the balancer says.
            let error = balance
                .ready()
                .await
                .unwrap()
                .call(with(false))
                .await
                .unwrap_err();
            assert!(error.is::<crate::error::NoHealthyTargets>(), "{error}");
            // The call that says it waits is answered by the endpoint that comes.
            let call = tokio::spawn(balance.ready().await.unwrap().call(with(true)));
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(!call.is_finished(), "configured {configured}");
            insert(&tx, "late").await;
            let (name, _) = call.await.unwrap().unwrap();
            assert_eq!(&*name, "late");
        }
    }
}

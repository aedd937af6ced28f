//! Endpoints with and without a state card.
//!
//! The balancer reads each endpoint's [`EndpointCard`] through [`HasCard`], which every layer
//! of the kit implements. For plain services that have no card (a bare tonic `Channel`, a
//! `service_fn`), wrap each in [`NoCard`] — or the whole discovery stream in
//! [`WithoutCards`] — and every endpoint counts as eligible (its readiness still applies).
//! [`WithCard`] attaches a card that something else writes (a health checker you run
//! yourself, for instance). Both are a [`PlainEndpoint`], which differs only in its card.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use endpoint_state::{EndpointCard, HasCard};
use futures_core::Stream;
use pin_project_lite::pin_project;
use tower::discover::{Change, Discover};
use tower_service::Service;

/// A plain service as an endpoint of the balancer, with the card `C` the balancer reads for it:
/// none (`()`, [`NoCard`]) or an [`EndpointCard`] ([`WithCard`]). The service itself is not
/// gated by the card; its own `poll_ready` still decides when it is picked.
#[derive(Clone, Debug, Default)]
pub struct PlainEndpoint<S, C> {
    inner: S,
    card: C,
}

/// A plain service seen by the balancer as an endpoint without a card: always eligible,
/// picked only when its own `poll_ready` is ready.
pub type NoCard<S> = PlainEndpoint<S, ()>;

/// A plain service with a card attached: the balancer reads the card for eligibility (and
/// names it in errors); the service itself is not gated by it.
pub type WithCard<S> = PlainEndpoint<S, EndpointCard>;

impl<S> NoCard<S> {
    /// Wrap `inner`.
    pub fn new(inner: S) -> Self {
        PlainEndpoint { inner, card: () }
    }
}

impl<S> WithCard<S> {
    /// Attach `card` to `inner`.
    pub fn new(inner: S, card: EndpointCard) -> Self {
        PlainEndpoint { inner, card }
    }
}

impl<S, C> PlainEndpoint<S, C> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwrap.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S> HasCard for NoCard<S> {
    fn card(&self) -> Option<&EndpointCard> {
        None
    }
}

impl<S> HasCard for WithCard<S> {
    fn card(&self) -> Option<&EndpointCard> {
        Some(&self.card)
    }
}

impl<S: Service<R>, R, C> Service<R> for PlainEndpoint<S, C> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> S::Future {
        self.inner.call(req)
    }
}

pin_project! {
    /// Wraps a [`Discover`] of plain services so that each inserted service is a
    /// [`NoCard`] endpoint.
    ///
    /// ```
    /// use balance_layer::{Balance, BalanceConfig, WithoutCards};
    /// use tower::discover::ServiceList;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let svc = tower::service_fn(|x: u32| async move { Ok::<_, std::convert::Infallible>(x) });
    /// let discover = WithoutCards::new(ServiceList::new(vec![svc]));
    /// let balance = Balance::<_, u32>::new(discover, BalanceConfig::new()).unwrap();
    /// # let _ = balance; }
    /// ```
    pub struct WithoutCards<D> {
        #[pin]
        inner: D,
    }
}

impl<D> WithoutCards<D> {
    /// Wrap `inner`.
    pub fn new(inner: D) -> Self {
        WithoutCards { inner }
    }

    /// The wrapped discovery.
    pub fn get_ref(&self) -> &D {
        &self.inner
    }

    /// The wrapped discovery, mutably.
    pub fn get_mut(&mut self) -> &mut D {
        &mut self.inner
    }

    /// Unwrap.
    pub fn into_inner(self) -> D {
        self.inner
    }
}

impl<D> fmt::Debug for WithoutCards<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WithoutCards").finish_non_exhaustive()
    }
}

impl<D: Discover> Stream for WithoutCards<D> {
    type Item = Result<Change<D::Key, NoCard<D::Service>>, D::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.project().inner.poll_discover(cx).map(|change| {
            change.map(|result| {
                result.map(|change| match change {
                    Change::Insert(key, svc) => Change::Insert(key, NoCard::new(svc)),
                    Change::Remove(key) => Change::Remove(key),
                })
            })
        })
    }
}

//! A layer that classifies every call of the service below it.

use std::task::{Context, Poll};

use http::Response;

use super::body::ClassifiedBody;
use super::future::ResponseFuture;
use super::outcome::OnOutcome;
use crate::error::BoxError;

/// A `tower` layer that classifies every call of the service below it and hands each outcome
/// to a clone of `on_outcome`. The layers that count outcomes (breaker, quarantine) use
/// [`ResponseFuture`] directly; this one is for anyone else who wants to observe outcomes
/// (metrics, logs, tests).
///
/// ```
/// use endpoint_state::{ClassifyLayer, Outcome};
/// use tower::ServiceBuilder;
/// # fn wrap(channel: tonic::transport::Channel) {
/// let svc = ServiceBuilder::new()
///     .layer(ClassifyLayer::new(|outcome: Outcome| println!("{outcome:?}")))
///     .service(channel);
/// # let _ = svc; }
/// ```
#[derive(Clone, Debug)]
pub struct ClassifyLayer<O> {
    on_outcome: O,
}

impl<O> ClassifyLayer<O> {
    /// Report every call's outcome to a clone of `on_outcome`.
    pub fn new(on_outcome: O) -> Self {
        ClassifyLayer { on_outcome }
    }
}

impl<S, O: Clone> tower_layer::Layer<S> for ClassifyLayer<O> {
    type Service = Classify<S, O>;
    fn layer(&self, inner: S) -> Self::Service {
        Classify {
            inner,
            on_outcome: self.on_outcome.clone(),
        }
    }
}

/// The service made by [`ClassifyLayer`].
#[derive(Clone, Debug)]
pub struct Classify<S, O> {
    inner: S,
    on_outcome: O,
}

impl<S, O> Classify<S, O> {
    /// Wrap `inner`.
    pub fn new(inner: S, on_outcome: O) -> Self {
        Classify { inner, on_outcome }
    }

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

impl<S, O, ReqB, ResB> tower_service::Service<http::Request<ReqB>> for Classify<S, O>
where
    S: tower_service::Service<http::Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    O: OnOutcome + Clone,
{
    type Response = Response<ClassifiedBody<ResB, O>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, O>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        ResponseFuture::new(self.inner.call(req), Some(self.on_outcome.clone()))
    }
}

impl<S: crate::HasCard, O> crate::HasCard for Classify<S, O> {
    fn card(&self) -> Option<&crate::EndpointCard> {
        self.inner.card()
    }
}

//! One target's stack — channel → classification → breaker → quarantine → health gate — and
//! the discovery stream that hands the stacks to the balancer.

use endpoint_state::ConfigError;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use breaker_layer::{Breaker, BreakerConfig, BreakerHandle, BreakerLayer};
use endpoint_state::{ClassifiedBody, EndpointCard};
use futures_core::Stream;
use health_layer::Health;
use pin_project_lite::pin_project;
use quarantine_layer::{Quarantine, QuarantineGroup};
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};
use tower::discover::Change;
use tower_layer::Layer;
use tower_service::Service;

use crate::error::{BoxError, TransportError};

/// What a generated tonic client sends.
pub(crate) type Request = http::Request<tonic::body::Body>;

/// The bottom of a target's stack: its channel, with transport errors named after the target.
#[cfg(not(feature = "metrics"))]
pub(crate) type Leaf = Labeled<Channel>;
/// The bottom of a target's stack: its channel, with transport errors named after the target,
/// and every call's outcome counted.
#[cfg(feature = "metrics")]
pub(crate) type Leaf = endpoint_state::Classify<Labeled<Channel>, crate::metrics::CallMetrics>;

#[cfg(not(feature = "metrics"))]
pub(crate) type LeafBody = tonic::body::Body;
#[cfg(feature = "metrics")]
pub(crate) type LeafBody = ClassifiedBody<tonic::body::Body, crate::metrics::CallMetrics>;

/// One target's whole stack, as the balancer holds it.
pub(crate) type Stack = Health<Quarantine<Breaker<Leaf>>>;

/// The response body of a stack.
pub(crate) type StackBody = quarantine_layer::future::ResponseBody<
    ClassifiedBody<LeafBody, breaker_layer::future::Recorder>,
>;

/// A change of the target set, as the balancer takes it.
pub(crate) type TargetChange = Change<Arc<str>, Stack>;

/// Wraps a target's channel so that a transport error (which tonic would report without the
/// target, and often as `UNKNOWN`) becomes a [`TransportError`] naming it.
#[derive(Clone)]
pub(crate) struct Labeled<S> {
    inner: S,
    target: Arc<str>,
}

impl<S> Labeled<S> {
    pub(crate) fn new(inner: S, target: Arc<str>) -> Self {
        Labeled { inner, target }
    }
}

impl<S> fmt::Debug for Labeled<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Labeled")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl<S, B, ResB> Service<http::Request<B>> for Labeled<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<ResB>;
    type Error = BoxError;
    type Future = LabeledFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| TransportError::wrap(&self.target, e.into()))
    }

    #[inline]
    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        LabeledFuture {
            inner: self.inner.call(req),
            target: self.target.clone(),
        }
    }
}

pin_project! {
    /// The response future of [`Labeled`].
    pub(crate) struct LabeledFuture<F> {
        #[pin]
        inner: F,
        target: Arc<str>,
    }
}

impl<F, T, E> Future for LabeledFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let out = ready!(this.inner.poll(cx));
        Poll::Ready(out.map_err(|e| TransportError::wrap(this.target, e.into())))
    }
}

/// Builds targets' stacks: one card per target, shared by its breaker, its quarantine and its
/// health gate (and written by the checker).
pub(crate) struct StackFactory {
    pub(crate) group: QuarantineGroup,
    pub(crate) breaker: BreakerConfig,
    pub(crate) breaker_enabled: bool,
    #[cfg(feature = "metrics")]
    pub(crate) metrics: crate::metrics::KitMetrics,
}

impl fmt::Debug for StackFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StackFactory")
            .field("breaker_enabled", &self.breaker_enabled)
            .finish_non_exhaustive()
    }
}

impl StackFactory {
    /// Builds the stack of `target` over a lazily connected channel from `endpoint` (this
    /// spawns the channel's worker: call it only once everything is validated).
    pub(crate) fn make(
        &self,
        target: &Arc<str>,
        endpoint: &Endpoint,
        card: &EndpointCard,
    ) -> Result<(Stack, BreakerHandle), ConfigError> {
        let breaker = BreakerLayer::new(card.clone(), self.breaker.clone())
            .map_err(|e| e.within(crate::error::CONFIG, "breaker"))?;
        let handle = breaker.handle();
        if !self.breaker_enabled {
            handle.disable();
        }
        let channel = endpoint.connect_lazy();
        let leaf = Labeled::new(channel, target.clone());
        #[cfg(feature = "metrics")]
        let leaf = endpoint_state::Classify::new(leaf, self.metrics.call_metrics(target));
        let stack = Health::new(
            self.group.layer(card.clone()).layer(breaker.layer(leaf)),
            card.clone(),
        );
        Ok((stack, handle))
    }
}

/// The balancer's discovery: the targets known at build time, then every change the kit sends
/// (DNS re-resolution, shutdown). The channel is bounded ([`CHANGES_CAPACITY`]); a sender
/// waits while it is full (the balancer's task drains it).
pub(crate) struct KitDiscover {
    initial: VecDeque<TargetChange>,
    changes: mpsc::Receiver<TargetChange>,
}

/// How many target changes may wait for the balancer before a sender waits.
pub(crate) const CHANGES_CAPACITY: usize = 64;

impl KitDiscover {
    pub(crate) fn new(initial: Vec<TargetChange>, changes: mpsc::Receiver<TargetChange>) -> Self {
        KitDiscover {
            initial: initial.into(),
            changes,
        }
    }
}

impl fmt::Debug for KitDiscover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KitDiscover")
            .field("initial", &self.initial.len())
            .finish_non_exhaustive()
    }
}

impl Stream for KitDiscover {
    type Item = Result<TargetChange, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(change) = self.initial.pop_front() {
            return Poll::Ready(Some(Ok(change)));
        }
        self.changes.poll_recv(cx).map(|c| c.map(Ok))
    }
}

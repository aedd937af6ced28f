//! The user's layers inside every target's stack ([`KitBuilder::per_target_layer`]): above the
//! target's transport (its channel, with errors named and attempts observed), below the kit's
//! gates (breaker, quarantine, health), so that what they return is classified like any other
//! outcome of the target.
//!
//! Without a layer of the user's, a target's transport is its leaf as it is: no box, one match
//! per poll. With one, the leaf and the user's service over it are each boxed (one allocation
//! per call and per response body for the user's service), so that the kit's types stay the
//! same whatever the layer.
//!
//! [`KitBuilder::per_target_layer`]: crate::KitBuilder::per_target_layer

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tonic::Status;
use tower::util::BoxCloneSyncService;
use tower_layer::Layer;
use tower_service::Service;

use crate::error::BoxError;
use crate::stack::{Leaf, LeafBody, Request};

/// The service a [`per_target_layer`](crate::KitBuilder::per_target_layer) wraps: one target's
/// transport — its channel, whose errors name the target — type-erased. A layer that keeps the
/// response as it is (`ConcurrencyLimitLayer`, `RateLimitLayer`, `map_request`, a counting or
/// header-adding layer of your own) fits as it is.
pub type TargetService = BoxCloneSyncService<Request, http::Response<tonic::body::Body>, BoxError>;

type Wrap = dyn Fn(TargetService) -> TargetService + Send + Sync;

/// The user's layers, in the order given (the first is the outermost, as with
/// `ServiceBuilder`).
#[derive(Clone, Default)]
pub(crate) struct PerTargetLayers {
    layers: Vec<Arc<Wrap>>,
}

impl fmt::Debug for PerTargetLayers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerTargetLayers")
            .field("layers", &self.layers.len())
            .finish()
    }
}

impl PerTargetLayers {
    /// Adds `layer` inside those already added.
    pub(crate) fn push<L, B>(&mut self, layer: L)
    where
        L: Layer<TargetService> + Send + Sync + 'static,
        L::Service: Service<Request, Response = http::Response<B>> + Clone + Send + Sync + 'static,
        <L::Service as Service<Request>>::Future: Send + 'static,
        <L::Service as Service<Request>>::Error: Into<BoxError>,
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        self.layers.push(Arc::new(move |inner: TargetService| {
            let wrapped = layer.layer(inner);
            BoxCloneSyncService::new(Boxed(wrapped))
        }));
    }

    /// A target's transport: its leaf, under the user's layers if any.
    pub(crate) fn transport(&self, leaf: Leaf) -> Transport {
        if self.layers.is_empty() {
            return Transport::Direct(leaf);
        }
        let mut service = BoxCloneSyncService::new(Boxed(leaf));
        for wrap in self.layers.iter().rev() {
            service = wrap(service);
        }
        Transport::Layered(service)
    }
}

/// A service whose response body is boxed into tonic's body, and whose error is a `BoxError`.
#[derive(Clone)]
struct Boxed<S>(S);

impl<S, B> Service<Request> for Boxed<S>
where
    S: Service<Request, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = BoxError;
    type Future =
        Pin<Box<dyn Future<Output = Result<http::Response<tonic::body::Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let future = self.0.call(req);
        Box::pin(async move {
            let response = future.await.map_err(Into::into)?;
            Ok(response.map(tonic::body::Body::new))
        })
    }
}

/// One target's transport, as its breaker wraps it: the leaf, or the user's layers over it.
#[derive(Clone)]
pub(crate) enum Transport {
    Direct(Leaf),
    Layered(TargetService),
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::Direct(leaf) => f.debug_tuple("Direct").field(leaf).finish(),
            Transport::Layered(_) => f.debug_tuple("Layered").finish_non_exhaustive(),
        }
    }
}

impl Service<Request> for Transport {
    type Response = http::Response<TransportBody>;
    type Error = BoxError;
    type Future = TransportFuture;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self {
            Transport::Direct(leaf) => leaf.poll_ready(cx),
            Transport::Layered(service) => service.poll_ready(cx),
        }
    }

    #[inline]
    fn call(&mut self, req: Request) -> TransportFuture {
        match self {
            Transport::Direct(leaf) => TransportFuture::Direct {
                future: leaf.call(req),
            },
            Transport::Layered(service) => TransportFuture::Layered {
                future: service.call(req),
            },
        }
    }
}

type LeafFuture = <Leaf as Service<Request>>::Future;
type LayeredFuture = <TargetService as Service<Request>>::Future;

pin_project! {
    /// The response future of a [`Transport`].
    #[project = TransportFutureProj]
    pub(crate) enum TransportFuture {
        Direct { #[pin] future: LeafFuture },
        Layered { #[pin] future: LayeredFuture },
    }
}

impl Future for TransportFuture {
    type Output = Result<http::Response<TransportBody>, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            TransportFutureProj::Direct { future } => future
                .poll(cx)
                .map_ok(|r| r.map(|body| TransportBody::Direct { body })),
            TransportFutureProj::Layered { future } => future
                .poll(cx)
                .map_ok(|r| r.map(|body| TransportBody::Layered { body })),
        }
    }
}

pin_project! {
    /// The response body of a [`Transport`].
    #[project = TransportBodyProj]
    pub(crate) enum TransportBody {
        Direct { #[pin] body: LeafBody },
        Layered { #[pin] body: tonic::body::Body },
    }
}

impl fmt::Debug for TransportBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportBody::Direct { .. } => f.write_str("TransportBody::Direct"),
            TransportBody::Layered { .. } => f.write_str("TransportBody::Layered"),
        }
    }
}

impl Body for TransportBody {
    type Data = Bytes;
    type Error = Status;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        match self.project() {
            TransportBodyProj::Direct { body } => body.poll_frame(cx),
            TransportBodyProj::Layered { body } => body.poll_frame(cx),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match self {
            TransportBody::Direct { body } => body.is_end_stream(),
            TransportBody::Layered { body } => body.is_end_stream(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match self {
            TransportBody::Direct { body } => body.size_hint(),
            TransportBody::Layered { body } => body.size_hint(),
        }
    }
}

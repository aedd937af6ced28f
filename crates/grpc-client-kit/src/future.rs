//! The kit channel's response future and body.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use balance_layer::{Balance, NoHealthyTargets};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tonic::Status;
use tower_service::Service;

use crate::error::{BoxError, DiscoveryFailed, KitShutDown, TransportError};
use crate::life::KitState;
use crate::retry::Unsent;
use crate::stack::{KitDiscover, Request, Stack, StackBody};

type Inner = balance_layer::future::ResponseFuture<Arc<str>, Stack, Request>;

pin_project! {
    /// The response future of [`KitChannel`](crate::KitChannel): the balancer's future, with
    /// its errors made into gRPC statuses that name the target(s).
    pub struct ResponseFuture {
        #[pin]
        state: State,
    }
}

pin_project! {
    #[project = StateProj]
    enum State {
        Called {
            #[pin]
            inner: Inner,
            notes: Option<Arc<KitState>>,
            retry: Option<Unsent>,
        },
        // The first attempt reached no backend (or one that refused it): choosing a target for
        // the second.
        Repicking {
            balance: Balance<KitDiscover, Request>,
            request: Option<Request>,
            notes: Option<Arc<KitState>>,
        },
        Refused {
            error: Option<BoxError>,
        },
    }
}

impl ResponseFuture {
    pub(crate) fn called(
        inner: Inner,
        notes: Option<Arc<KitState>>,
        retry: Option<Unsent>,
    ) -> Self {
        ResponseFuture {
            state: State::Called {
                inner,
                notes,
                retry,
            },
        }
    }

    pub(crate) fn refused(error: BoxError) -> Self {
        ResponseFuture {
            state: State::Refused { error: Some(error) },
        }
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            State::Called { inner, .. } => f.debug_tuple("ResponseFuture").field(inner).finish(),
            State::Repicking { balance, .. } => {
                f.debug_tuple("ResponseFuture").field(balance).finish()
            }
            State::Refused { error } => f.debug_tuple("ResponseFuture").field(error).finish(),
        }
    }
}

impl Future for ResponseFuture {
    type Output = Result<http::Response<ResponseBody>, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let next = match state.as_mut().project() {
                StateProj::Called {
                    inner,
                    notes,
                    retry,
                } => match ready!(inner.poll(cx)) {
                    Ok(response) => {
                        return Poll::Ready(Ok(response.map(|inner| ResponseBody { inner })));
                    }
                    Err(e) => {
                        let again = retry.take().and_then(|r| r.again(&*e));
                        let Some((request, shared)) = again else {
                            return Poll::Ready(Err(map_error(e, notes.as_deref())));
                        };
                        tracing::debug!(
                            error = %e,
                            "grpc-client-kit: no backend acted on the call; sending it to another target"
                        );
                        #[cfg(feature = "metrics")]
                        crate::metrics::transparent_retry();
                        // A rare path: carry the kit's state whatever it was at the call, so
                        // that a retry meeting a shut-down kit or a failing DNS name says so.
                        State::Repicking {
                            balance: shared.life.balance.clone(),
                            request: Some(request),
                            notes: Some(shared.life.state.clone()),
                        }
                    }
                },
                StateProj::Repicking {
                    balance,
                    request,
                    notes,
                } => {
                    if let Err(e) = ready!(balance.poll_ready(cx)) {
                        return Poll::Ready(Err(map_error(e, notes.as_deref())));
                    }
                    let request = request.take().expect("a request to send again");
                    State::Called {
                        inner: balance.call(request),
                        notes: notes.take(),
                        retry: None,
                    }
                }
                StateProj::Refused { error } => {
                    return Poll::Ready(Err(error
                        .take()
                        .expect("ResponseFuture polled after completion")));
                }
            };
            state.set(next);
        }
    }
}

/// Makes sure an error carries a `Status` (tonic would otherwise report `UNKNOWN`), and adds
/// what the kit knows: a failing DNS name, a shut-down kit.
pub(crate) fn map_error(error: BoxError, notes: Option<&KitState>) -> BoxError {
    if let (Some(state), Some(no_healthy)) = (notes, error.downcast_ref::<NoHealthyTargets>()) {
        if state.is_shut_down() {
            return Box::new(KitShutDown::new());
        }
        if let Some((name, reason)) = state.dns_failure() {
            let code = no_healthy.status().code();
            return Box::new(DiscoveryFailed::new(name, reason, error, code));
        }
    }
    let mut cur: Option<&(dyn Error + 'static)> = Some(&*error);
    while let Some(e) = cur {
        if e.is::<Status>() {
            return error;
        }
        cur = e.source();
    }
    TransportError::wrap(&Arc::from("grpc-client-kit"), error)
}

pin_project! {
    /// The response body of [`KitChannel`](crate::KitChannel): the target's own body, read
    /// through the breaker's and quarantine's classification (which learn the call's final
    /// status from its trailers). Not boxed.
    pub struct ResponseBody {
        #[pin]
        inner: StackBody,
    }
}

impl fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody").finish_non_exhaustive()
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Status;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.project().inner.poll_frame(cx)
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

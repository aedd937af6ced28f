//! The breaker's response future and the outcome recorder its response body carries.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use endpoint_state::classify;
use endpoint_state::{BoxError, ClassifiedBody, OnOutcome, Outcome};
use http::Response;
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::error::BreakerOpen;
use crate::state::{Permit, Shared};

/// Hands one call's outcome to its breaker: counted in the closed state, deciding in the
/// half-open state, ignored when the caller gave up (a probe's permit then goes back).
///
/// It travels with the call — in the [`ResponseFuture`], then in the response body
/// (`ClassifiedBody<B, Recorder>`) until the final status arrives in the trailers — and
/// reports exactly once.
pub struct Recorder {
    kind: Kind,
    started: Option<Instant>,
}

enum Kind {
    Closed {
        shared: Arc<Shared>,
        generation: u64,
    },
    Probe(Permit),
    /// Admitted while open because no peer was eligible.
    Degraded {
        shared: Arc<Shared>,
        generation: u64,
    },
}

impl Recorder {
    pub(crate) fn closed(shared: Arc<Shared>, generation: u64) -> Self {
        let started = shared.timed.then(Instant::now);
        Recorder {
            kind: Kind::Closed { shared, generation },
            started,
        }
    }

    pub(crate) fn degraded(shared: Arc<Shared>, generation: u64) -> Self {
        Recorder {
            kind: Kind::Degraded { shared, generation },
            started: None,
        }
    }

    pub(crate) fn probe(permit: Permit) -> Self {
        let started = permit.shared().timed.then(Instant::now);
        Recorder {
            kind: Kind::Probe(permit),
            started,
        }
    }
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Closed { generation, .. } => f
                .debug_struct("Recorder")
                .field("closed_generation", generation)
                .finish(),
            Kind::Probe(permit) => f.debug_struct("Recorder").field("probe", permit).finish(),
            Kind::Degraded { generation, .. } => f
                .debug_struct("Recorder")
                .field("degraded_generation", generation)
                .finish(),
        }
    }
}

impl OnOutcome for Recorder {
    fn on_outcome(self, outcome: Outcome) {
        let duration = self.started.map(|s| s.elapsed());
        match self.kind {
            Kind::Closed { shared, generation } => {
                shared.record_closed(generation, &outcome, duration)
            }
            Kind::Probe(permit) => {
                let shared = Arc::clone(permit.shared());
                shared.record_probe(permit, &outcome, duration)
            }
            Kind::Degraded { shared, generation } => shared.record_degraded(generation, &outcome),
        }
    }
}

pin_project! {
    /// The response future of the `Breaker` service: the inner call, classified, or a call
    /// refused by a fail-fast breaker.
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Called {
            #[pin]
            inner: classify::ResponseFuture<F, Recorder>,
        },
        Refused {
            error: Option<BreakerOpen>,
        },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn called(inner: F, recorder: Option<Recorder>) -> Self {
        ResponseFuture {
            state: State::Called {
                inner: classify::ResponseFuture::new(inner, recorder),
            },
        }
    }

    pub(crate) fn refused(error: BreakerOpen) -> Self {
        ResponseFuture {
            state: State::Refused { error: Some(error) },
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            State::Called { inner } => f.debug_tuple("ResponseFuture").field(inner).finish(),
            State::Refused { error } => f.debug_tuple("ResponseFuture").field(error).finish(),
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Response<ClassifiedBody<B, Recorder>>, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Called { inner } => inner.poll(cx),
            StateProj::Refused { error } => Poll::Ready(Err(Box::new(
                error
                    .take()
                    .expect("breaker ResponseFuture polled after completion"),
            ))),
        }
    }
}

//! What the kit tells of each call: a `debug` span per call (method, backend picked, attempt,
//! status), and with the `metrics` feature gRPC's call and attempt metrics (see
//! `crate::metrics`).
//!
//! A call's [`CallTrace`] is made where the call enters the kit's channel, and travels down to
//! the backend's connection in the request's extensions ([`Traced`]): there each attempt is
//! seen ([`Observed`]) with its outcome, classified from its error, headers or trailers. The
//! call ends once, with the first of: the kit's future failing, the attempt's status when a
//! backend answered (an answered call is never sent again), or the caller dropping the call
//! (`CANCELLED`).
//!
//! Nothing is made when nothing listens: without the `metrics` feature and without a
//! subscriber that takes `debug` spans of this crate, a call carries no trace, and an attempt
//! costs one look into the request's extensions.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::task::{Context, Poll};

use endpoint_state::{
    ClassifiedBody, EndpointCard, OnOutcome, Outcome, OutcomeSource, ResponseFuture, code_name,
};
use tonic::Code;
use tower_service::Service;
use tracing::Span;

use crate::error::BoxError;
use crate::stack::Request;

/// One kit's observer: its name (the `grpc.target` of its spans and metrics) and metrics.
pub(crate) struct Observer {
    target: Arc<str>,
    #[cfg(feature = "metrics")]
    metrics: crate::metrics::KitMetrics,
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl Observer {
    /// The observer of the kit named `target` (with the `metrics` feature, this describes the
    /// metrics to the recorder installed now).
    pub(crate) fn new(target: Arc<str>) -> Self {
        Observer {
            #[cfg(feature = "metrics")]
            metrics: crate::metrics::KitMetrics::new(target.clone()),
            target,
        }
    }

    /// The kit's metrics.
    #[cfg(feature = "metrics")]
    pub(crate) fn metrics(&self) -> &crate::metrics::KitMetrics {
        &self.metrics
    }

    /// A call enters the kit: its trace, unless nothing listens.
    #[inline]
    pub(crate) fn call(&self, req: &Request) -> Option<Arc<CallTrace>> {
        let path = req.uri().path();
        let span = tracing::debug_span!(
            "grpc.call",
            grpc.method = path.strip_prefix('/').unwrap_or(path),
            grpc.target = &*self.target,
            backend = tracing::field::Empty,
            attempt = tracing::field::Empty,
            grpc.status = tracing::field::Empty,
        );
        if span.is_disabled() && !cfg!(feature = "metrics") {
            return None;
        }
        Some(Arc::new(CallTrace {
            span,
            attempts: AtomicU32::new(0),
            ended: AtomicBool::new(false),
            deferred: AtomicBool::new(false),
            #[cfg(feature = "metrics")]
            meter: self.metrics.call(req),
        }))
    }

    /// Wraps the connection of `backend` (whose card is `card`) to see every attempt sent to it.
    pub(crate) fn leaf<S>(&self, inner: S, backend: &Arc<str>, card: &EndpointCard) -> Observed<S> {
        #[cfg(not(feature = "metrics"))]
        let _ = card;
        Observed {
            inner,
            backend: backend.clone(),
            #[cfg(feature = "metrics")]
            meter: self.metrics.backend(backend, card),
        }
    }

    /// `backend` was removed.
    pub(crate) fn forget(&self, backend: &str) {
        #[cfg(feature = "metrics")]
        self.metrics.forget(backend);
        #[cfg(not(feature = "metrics"))]
        let _ = backend;
    }
}

/// One call, as its span and metrics see it.
pub(crate) struct CallTrace {
    span: Span,
    attempts: AtomicU32,
    ended: AtomicBool,
    /// A retry policy may send the call again after an answer: the kit's future, not the
    /// attempt's status, ends the call while this is set.
    deferred: AtomicBool,
    #[cfg(feature = "metrics")]
    meter: crate::metrics::CallMeter,
}

impl fmt::Debug for CallTrace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallTrace")
            .field("attempts", &self.attempts.load(Ordering::Relaxed))
            .field("ended", &self.ended.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl CallTrace {
    /// The call's span.
    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// The call ended with `code` (only the first end counts).
    pub(crate) fn end(&self, code: Code) {
        if self.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        self.span.record("grpc.status", code_name(code));
        #[cfg(feature = "metrics")]
        self.meter.ended(code);
    }

    /// The call is sent again, to another backend.
    pub(crate) fn retried(&self) {
        #[cfg(feature = "metrics")]
        self.meter.retried();
    }

    /// The call is sent again under its method's retry policy.
    pub(crate) fn policy_retried(&self) {
        #[cfg(feature = "metrics")]
        self.meter.policy_retried();
    }

    /// The call is sent again to another backend, hedged.
    pub(crate) fn hedged(&self) {
        #[cfg(feature = "metrics")]
        self.meter.hedged();
    }

    /// Whether an answer ends the call (`false` while a retry policy may still send it again).
    pub(crate) fn defer(&self, deferred: bool) {
        self.deferred.store(deferred, Ordering::Release);
    }
}

/// The extension that takes a call's trace down to the backend's connection.
#[derive(Clone)]
pub(crate) struct Traced(pub(crate) Arc<CallTrace>);

/// Holds a call's trace above the balancer (in the kit's response future, then its body):
/// a call dropped before its end ends `CANCELLED`.
#[derive(Debug, Default)]
pub(crate) struct CallGuard(Option<Arc<CallTrace>>);

impl CallGuard {
    pub(crate) fn new(trace: Option<Arc<CallTrace>>) -> Self {
        CallGuard(trace)
    }

    pub(crate) fn trace(&self) -> Option<&Arc<CallTrace>> {
        self.0.as_ref()
    }

    /// Enters the call's span, while polling.
    #[inline]
    pub(crate) fn enter(&self) -> Option<tracing::span::Entered<'_>> {
        self.0.as_ref().map(|t| t.span.enter())
    }

    /// Runs `f` in the call's span.
    #[inline]
    pub(crate) fn in_span<R>(&self, f: impl FnOnce() -> R) -> R {
        let _entered = self.enter();
        f()
    }

    /// The call ended with `code`.
    pub(crate) fn end(&mut self, code: Code) {
        if let Some(trace) = self.0.take() {
            trace.end(code);
        }
    }

    /// Hands the trace on (to the response body).
    pub(crate) fn take(&mut self) -> CallGuard {
        CallGuard(self.0.take())
    }

    /// Sends the trace down with `req`, a next attempt of the call.
    pub(crate) fn attach(&self, req: &mut Request) {
        if let Some(trace) = &self.0 {
            req.extensions_mut().insert(Traced(trace.clone()));
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.end(Code::Cancelled);
    }
}

/// A backend's connection, seen by the kit's observer: each call sent to it is an attempt.
#[derive(Clone)]
pub(crate) struct Observed<S> {
    inner: S,
    backend: Arc<str>,
    #[cfg(feature = "metrics")]
    meter: Arc<crate::metrics::BackendMeter>,
}

impl<S> fmt::Debug for Observed<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observed")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl<S, B, ResB> Service<http::Request<B>> for Observed<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<ClassifiedBody<ResB, AttemptEnd>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, AttemptEnd>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let attempt = req
            .extensions()
            .get::<Traced>()
            .map(|Traced(trace)| self.attempt(trace.clone()));
        ResponseFuture::new(self.inner.call(req), attempt)
    }
}

impl<S> Observed<S> {
    fn attempt(&self, trace: Arc<CallTrace>) -> AttemptEnd {
        let n = trace.attempts.fetch_add(1, Ordering::Relaxed) + 1;
        trace.span.record("backend", &*self.backend);
        trace.span.record("attempt", n);
        #[cfg(feature = "metrics")]
        let start = self.meter.attempt_started(&trace.meter);
        AttemptEnd {
            trace,
            #[cfg(feature = "metrics")]
            meter: self.meter.clone(),
            #[cfg(feature = "metrics")]
            start,
        }
    }
}

/// Receives an attempt's outcome.
pub(crate) struct AttemptEnd {
    trace: Arc<CallTrace>,
    #[cfg(feature = "metrics")]
    meter: Arc<crate::metrics::BackendMeter>,
    #[cfg(feature = "metrics")]
    start: tokio::time::Instant,
}

impl fmt::Debug for AttemptEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptEnd").finish_non_exhaustive()
    }
}

impl OnOutcome for AttemptEnd {
    fn on_outcome(self, outcome: Outcome) {
        let (code, answered) = match outcome.status() {
            Some(status) => (status.code, status.source != OutcomeSource::ServiceError),
            // The caller gave up; the kit's guard ends the call.
            None => (Code::Cancelled, false),
        };
        #[cfg(feature = "metrics")]
        self.meter
            .attempt_ended(&self.trace.meter, self.start, code);
        // A backend answered: the call is not sent again, this is its status. (An error is
        // the kit's to judge: it may send the call again, or fail it.)
        if answered && !self.trace.deferred.load(Ordering::Acquire) {
            self.trace.end(code);
        }
    }
}

//! One target's stack — channel → classification → breaker → quarantine → health gate — and
//! the discovery stream that hands the stacks to the balancer.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use balance_layer::RequestDeadline;
use breaker_layer::{Breaker, BreakerConfig, BreakerHandle, BreakerLayer};
use endpoint_state::time::{self, Secs};
use endpoint_state::{CallStatus, ClassifiedBody, ConfigError, EndpointCard, NotGrpcResponse};
use futures_core::Stream;
use health_layer::Health;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use quarantine_layer::{Quarantine, QuarantineGroup};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tonic::transport::Channel;
use tonic::{Code, Status};
use tower::discover::Change;
use tower_layer::Layer;
use tower_service::Service;

use crate::error::{BoxError, DeadlineExceeded, TransportError};
use crate::per_target::{PerTargetLayers, Transport, TransportBody};
use crate::registry::NewTarget;

/// What a generated tonic client sends.
pub(crate) type Request = http::Request<tonic::body::Body>;

/// The bottom of a target's stack: its channel, with transport errors named after the target,
/// and every attempt seen by the kit's observer (span, metrics: `crate::observe`).
pub(crate) type Leaf = crate::observe::Observed<Labeled<Conn>>;

pub(crate) type LeafBody =
    ClassifiedBody<LabeledBody<tonic::body::Body>, crate::observe::AttemptEnd>;

/// One target's whole stack, as the balancer holds it: its gates over its transport (the leaf,
/// under the user's per-target layers if any: [`crate::per_target`]).
pub(crate) type Stack = Health<Quarantine<Breaker<Transport>>>;

/// The response body of a stack.
pub(crate) type StackBody = quarantine_layer::future::ResponseBody<
    ClassifiedBody<TransportBody, breaker_layer::future::Recorder>,
>;

/// A change of the target set, as the balancer takes it.
pub(crate) type TargetChange = Change<Arc<str>, Stack>;

/// What the kit knows of one target's connection, shared by every clone of its leaf: to say,
/// when a call's deadline passes, whether it was still connecting.
#[derive(Debug)]
pub(crate) struct Link {
    target: Arc<str>,
    /// Whether the target has answered a call since its channel was made or its connection
    /// last failed.
    answered: AtomicBool,
}

impl Link {
    fn new(target: Arc<str>) -> Self {
        Link {
            target,
            answered: AtomicBool::new(false),
        }
    }

    /// Read before written: the common case (already so) dirties no cache line.
    fn set_answered(&self, answered: bool) {
        if self.answered.load(Ordering::Relaxed) != answered {
            self.answered.store(answered, Ordering::Relaxed);
        }
    }

    /// Where a call sent to this target is while it has no response yet. The kit does not see
    /// tonic's connection, only answers: a target that has not answered since its channel was
    /// made or its connection last failed is taken to be connecting (an address that drops
    /// SYNs, a host that is gone); one that has is taken to be slow to answer.
    fn waiting(&self) -> &'static str {
        if self.answered.load(Ordering::Relaxed) {
            "no response yet"
        } else {
            "connecting"
        }
    }
}

/// A call's deadline, read from its `grpc-timeout` when the kit takes it (or sends it on).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    pub(crate) at: Instant,
    /// How long the call had when the deadline was read.
    pub(crate) budget: Duration,
}

impl Deadline {
    /// The deadline `req` carries, if any.
    #[inline]
    pub(crate) fn of<R: RequestDeadline>(req: &R) -> Option<Self> {
        let budget = req.time_budget()?;
        Some(Deadline {
            at: time::after(budget),
            budget,
        })
    }

    /// What is left of it.
    pub(crate) fn left(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// The error of a call whose deadline passed while it was `doing` (`waiting for
    /// http://10.0.0.7:50051: connecting`).
    pub(crate) fn exceeded(&self, doing: fmt::Arguments<'_>) -> BoxError {
        Box::new(DeadlineExceeded::new(self.budget, doing))
    }
}

/// Asks the target's [`Labeled`] to name itself on the response ([`AnsweredBy`]): a call
/// under a retry policy, which names the targets it tried.
/// A hedged attempt's also holds a slot where the target it went to is written when the
/// call reaches it.
#[derive(Debug, Clone, Default)]
pub(crate) struct TrackTarget(pub(crate) Option<Arc<std::sync::OnceLock<Arc<str>>>>);

/// The target that answered, on a response whose request asked ([`TrackTarget`]).
#[derive(Debug, Clone)]
pub(crate) struct AnsweredBy(pub(crate) Arc<str>);

/// A deadline as the messages say it: `300 ms` below a second, `1.5 s` above.
pub(crate) struct Waited(pub(crate) Duration);

impl fmt::Display for Waited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 < Duration::from_secs(1) {
            write!(f, "{} ms", self.0.as_millis())
        } else {
            Secs(self.0).fmt(f)
        }
    }
}

/// Wraps a target's channel so that every way a call to it fails names it: a transport error
/// (which tonic would report without the target, and often as `UNKNOWN`) becomes a
/// [`TransportError`]; a response that is not gRPC, a [`NotGrpcResponse`]; an error while the body is
/// read, `UNAVAILABLE` naming it. And it holds the call's deadline from the moment the call
/// reaches the target's channel — connecting included, which tonic's own timer does not
/// cover — to the end of the body: [`DeadlineExceeded`], counted against the target.
#[derive(Clone)]
pub(crate) struct Labeled<S> {
    inner: S,
    link: Arc<Link>,
}

impl<S> Labeled<S> {
    pub(crate) fn new(inner: S, target: Arc<str>) -> Self {
        Labeled {
            inner,
            link: Arc::new(Link::new(target)),
        }
    }
}

impl<S> fmt::Debug for Labeled<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Labeled")
            .field("target", &self.link.target)
            .finish_non_exhaustive()
    }
}

impl<S, B, ResB> Service<http::Request<B>> for Labeled<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<LabeledBody<ResB>>;
    type Error = BoxError;
    type Future = LabeledFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| TransportError::wrap(&self.link.target, e.into()))
    }

    #[inline]
    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // The deadline the kit's channel read when the call entered it, or the request's own.
        let deadline = req
            .extensions()
            .get::<Deadline>()
            .copied()
            .or_else(|| Deadline::of(&req));
        let track = match req.extensions().get::<TrackTarget>() {
            Some(TrackTarget(slot)) => {
                if let Some(slot) = slot {
                    let _ = slot.set(self.link.target.clone());
                }
                true
            }
            None => false,
        };
        LabeledFuture {
            inner: self.inner.call(req),
            link: Some(self.link.clone()),
            deadline,
            timer: None,
            track,
        }
    }
}

pin_project! {
    /// The response future of [`Labeled`].
    pub(crate) struct LabeledFuture<F> {
        #[pin]
        inner: F,
        link: Option<Arc<Link>>,
        deadline: Option<Deadline>,
        // Made the first time the call has to wait.
        #[pin]
        timer: Option<Sleep>,
        // The request asked for the target's name on the response.
        track: bool,
    }
}

impl<F, ResB, E> Future for LabeledFuture<F>
where
    F: Future<Output = Result<http::Response<ResB>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<http::Response<LabeledBody<ResB>>, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let out = match this.inner.poll(cx) {
            Poll::Ready(out) => out,
            Poll::Pending => {
                if let Some(deadline) = this.deadline
                    && expired(this.timer.as_mut(), deadline, cx)
                {
                    let link = this.link.as_deref().expect("polled after completion");
                    let (target, waiting) = (&link.target, link.waiting());
                    return Poll::Ready(Err(
                        deadline.exceeded(format_args!("waiting for {target}: {waiting}"))
                    ));
                }
                return Poll::Pending;
            }
        };
        let link = this.link.take().expect("polled after completion");
        Poll::Ready(match out {
            Ok(response) => {
                link.set_answered(true);
                if let Some(not_grpc) = NotGrpcResponse::check(&link.target, &response) {
                    return Poll::Ready(Err(Box::new(not_grpc)));
                }
                let deadline = *this.deadline;
                let mut response = response;
                if let Some(deadline) = &deadline {
                    cancelled_at_deadline(&link.target, deadline, response.headers_mut());
                }
                // A trailers-only response (a status: what a retry policy judges) names its
                // target too; a response with headers only when asked (hedging).
                if *this.track || response.headers().contains_key(&GRPC_STATUS) {
                    response
                        .extensions_mut()
                        .insert(AnsweredBy(link.target.clone()));
                }
                Ok(response.map(|inner| LabeledBody {
                    inner,
                    link,
                    deadline,
                    timer: None,
                    done: false,
                }))
            }
            Err(e) => {
                let error = TransportError::wrap(&link.target, e.into());
                if error.downcast_ref::<TransportError>().is_some() {
                    link.set_answered(false);
                }
                Err(error)
            }
        })
    }
}

/// Whether `deadline` has passed: polls the timer, made on the first call (a call answered
/// before it ever waits never touches the runtime's timer).
pub(crate) fn expired(
    mut timer: Pin<&mut Option<Sleep>>,
    deadline: &Deadline,
    cx: &mut Context<'_>,
) -> bool {
    if timer.is_none() {
        timer.set(Some(tokio::time::sleep_until(deadline.at)));
    }
    timer
        .as_pin_mut()
        .is_some_and(|sleep| sleep.poll(cx).is_ready())
}

pin_project! {
    /// The response body of [`Labeled`]: the channel's body, whose errors name the target and
    /// which ends at the call's deadline.
    pub(crate) struct LabeledBody<B> {
        #[pin]
        inner: B,
        link: Arc<Link>,
        deadline: Option<Deadline>,
        #[pin]
        timer: Option<Sleep>,
        // The deadline passed: the body ended with that error.
        done: bool,
    }
}

impl<B> fmt::Debug for LabeledBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LabeledBody")
            .field("target", &self.link.target)
            .finish_non_exhaustive()
    }
}

impl<B> Body for LabeledBody<B>
where
    B: Body<Error = Status>,
{
    type Data = B::Data;
    type Error = Status;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, Status>>> {
        let mut this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Err(status))) => Poll::Ready(Some(Err(relabel(this.link, status)))),
            Poll::Ready(Some(Ok(mut frame))) => {
                if let Some(deadline) = this.deadline
                    && let Some(trailers) = frame.trailers_mut()
                {
                    cancelled_at_deadline(&this.link.target, deadline, trailers);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                if let Some(deadline) = this.deadline
                    && expired(this.timer.as_mut(), deadline, cx)
                {
                    *this.done = true;
                    let target = &this.link.target;
                    let error = deadline.exceeded(format_args!("reading the response of {target}"));
                    return Poll::Ready(Some(Err(Status::from_error(error))));
                }
                Poll::Pending
            }
            other => other,
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A server's `CANCELLED` that arrives once the call's deadline has passed is the deadline's
/// doing — the server gave up as the deadline it was sent ran out (tonic's server answers so) —
/// and the caller sees `DEADLINE_EXCEEDED`, as it would had the kit's own timer fired first:
/// which of the two comes first is a race the caller should not see. A `CANCELLED` before the
/// deadline is the server's own, and stays.
fn cancelled_at_deadline(target: &str, deadline: &Deadline, headers: &mut http::HeaderMap) {
    if headers.get(&GRPC_STATUS).map(http::HeaderValue::as_bytes) != Some(b"1")
        || !deadline.left().is_zero()
    {
        return;
    }
    let said = tonic::Status::from_header_map(headers)
        .map(|s| s.message().to_owned())
        .unwrap_or_default();
    let status = Status::deadline_exceeded(format!(
        "deadline exceeded after {}: {target} cancelled the call as it ran out ({said})",
        Waited(deadline.budget)
    ));
    headers.remove(&GRPC_STATUS);
    headers.remove(&GRPC_MESSAGE);
    // Fails only on a message that cannot be encoded, which this one (our words and the
    // server's, already decoded from a header) always can.
    let _ = status.add_header(headers);
}

/// `grpc-status`, as a ready header name (a string key is parsed on every lookup).
pub(crate) static GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: http::HeaderName = http::HeaderName::from_static("grpc-message");

/// An error while the body is read names the target; a reset the server sent keeps the code
/// gRPC maps it to, any other transport failure (a connection reset, an h2 protocol error) is
/// `UNAVAILABLE` (`DEADLINE_EXCEEDED` for a local timeout) — never tonic's `UNKNOWN`.
fn relabel(link: &Link, status: Status) -> Status {
    let cause: &(dyn Error + 'static) = status.source().unwrap_or(&status);
    let (code, message) = if reset_by_server(cause) {
        (status.code(), status.message().to_owned())
    } else {
        link.set_answered(false);
        let call = CallStatus::from_error(cause);
        let code = if call.code == Code::DeadlineExceeded {
            Code::DeadlineExceeded
        } else {
            Code::Unavailable
        };
        (code, call.message)
    };
    let mut named = Status::new(code, format!("{}: {message}", link.target));
    named.set_source(Arc::new(status));
    named
}

/// Whether the server reset the stream (`RST_STREAM` with a reason gRPC maps to a code).
fn reset_by_server(error: &(dyn Error + 'static)) -> bool {
    let mut cur = Some(error);
    while let Some(e) = cur {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.is_reset() && h2.is_remote();
        }
        cur = e.source();
    }
    false
}

/// Builds targets' stacks: one card per target, shared by its breaker, its quarantine and its
/// health gate (and written by the checker).
pub(crate) struct StackFactory {
    pub(crate) group: QuarantineGroup,
    pub(crate) breaker: BreakerConfig,
    pub(crate) breaker_enabled: bool,
    /// The settings of the kit's own template, when targets use one: they are then connected
    /// by the kit's own connector ([`crate::connect`]), which tells a connection that failed
    /// before the server spoke, and a plaintext one is called through the kit's own HTTP/2
    /// client ([`crate::http2`]); otherwise by tonic's.
    pub(crate) known: Option<Arc<crate::template::EndpointSettings>>,
    /// The kit's span and metrics of calls (`crate::observe`).
    pub(crate) observe: crate::observe::Observer,
    /// The user's layers, inside every target's gates.
    pub(crate) layers: PerTargetLayers,
}

impl fmt::Debug for StackFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StackFactory")
            .field("breaker_enabled", &self.breaker_enabled)
            .field("layers", &self.layers)
            .finish_non_exhaustive()
    }
}

impl StackFactory {
    /// Builds the stack of `new` over a lazily connected channel (this spawns the channel's
    /// worker: call it only once everything is validated).
    pub(crate) fn make(
        &self,
        new: &NewTarget,
        card: &EndpointCard,
    ) -> Result<(Stack, BreakerHandle), ConfigError> {
        let target = &new.name;
        let breaker = BreakerLayer::new(card.clone(), self.breaker.clone())
            .map_err(|e| e.within(crate::error::CONFIG, "breaker"))?;
        let handle = breaker.handle();
        if !self.breaker_enabled {
            handle.disable();
        }
        let channel = self.conn(new);
        let leaf = self
            .observe
            .leaf(Labeled::new(channel, target.clone()), target, card);
        let transport = self.layers.transport(leaf);
        let stack = Health::new(
            self.group
                .layer(card.clone())
                .layer(breaker.layer(transport)),
            card.clone(),
        );
        Ok((stack, handle))
    }

    /// A target's connection, lazily made: the kit's own HTTP/2 client ([`crate::http2`]) for
    /// a plaintext target of a template the kit made, else a tonic `Channel` ([`channel`]).
    fn conn(&self, new: &NewTarget) -> Conn {
        if let (Some(settings), None) = (&self.known, &new.connector) {
            let connector = crate::connect::Connector::to(&new.endpoint, new.address);
            if let Some(client) = crate::http2::Http2Client::new(&new.endpoint, settings, connector)
            {
                return Conn::Kit(client);
            }
        }
        Conn::Tonic(channel(new, self.known.is_some()))
    }
}

/// A target's connection: the kit's own HTTP/2 client, or a tonic `Channel`.
#[derive(Debug, Clone)]
pub(crate) enum Conn {
    Kit(crate::http2::Http2Client),
    Tonic(Channel),
}

impl Service<Request> for Conn {
    type Response = http::Response<tonic::body::Body>;
    type Error = BoxError;
    type Future = ConnFuture;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self {
            Conn::Kit(client) => client.poll_ready(cx),
            Conn::Tonic(channel) => channel.poll_ready(cx).map_err(Into::into),
        }
    }

    #[inline]
    fn call(&mut self, req: Request) -> ConnFuture {
        match self {
            Conn::Kit(client) => ConnFuture::Kit {
                inner: client.call(req),
            },
            Conn::Tonic(channel) => ConnFuture::Tonic {
                inner: channel.call(req),
            },
        }
    }
}

pin_project! {
    /// The response future of [`Conn`].
    #[project = ConnFutureProj]
    pub(crate) enum ConnFuture {
        Kit { #[pin] inner: crate::http2::Http2Future },
        Tonic { #[pin] inner: tonic::transport::channel::ResponseFuture },
    }
}

impl Future for ConnFuture {
    type Output = Result<http::Response<tonic::body::Body>, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            ConnFutureProj::Kit { inner } => inner.poll(cx),
            ConnFutureProj::Tonic { inner } => inner.poll(cx).map_err(Into::into),
        }
    }
}

/// A target's tonic channel, lazily connected: through the user's connector when its
/// template has one; through the kit's own ([`crate::connect`]) when the kit knows every
/// setting of the endpoint, or the connection must go to a resolved address rather than the
/// endpoint's host (a `dns:` target); otherwise through tonic's.
fn channel(new: &NewTarget, own_connector: bool) -> Channel {
    match (&new.connector, new.address) {
        (Some(connector), address) => new
            .endpoint
            .connect_with_connector_lazy(crate::connect::redirected(connector.clone(), address)),
        (None, Some(address)) => crate::connect::channel(&new.endpoint, Some(address)),
        (None, None) if own_connector => crate::connect::channel(&new.endpoint, None),
        (None, None) => new.endpoint.connect_lazy(),
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

#[cfg(test)]
mod cancelled_tests {
    use super::*;

    fn cancelled() -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        Status::cancelled("Timeout expired")
            .add_header(&mut headers)
            .unwrap();
        headers
    }

    fn code(headers: &http::HeaderMap) -> Code {
        Status::from_header_map(headers).unwrap().code()
    }

    #[tokio::test(start_paused = true)]
    async fn a_servers_cancelled_is_its_own_until_the_deadline_has_passed() {
        let deadline = Deadline {
            at: Instant::now() + Duration::from_millis(300),
            budget: Duration::from_millis(300),
        };
        // Before the deadline: the server's own word.
        let mut before = cancelled();
        cancelled_at_deadline("http://b0:1", &deadline, &mut before);
        assert_eq!(code(&before), Code::Cancelled);

        // Once it has passed: the deadline's doing.
        tokio::time::advance(Duration::from_millis(300)).await;
        let mut after = cancelled();
        cancelled_at_deadline("http://b0:1", &deadline, &mut after);
        let status = Status::from_header_map(&after).unwrap();
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert_eq!(
            status.message(),
            "deadline exceeded after 300 ms: http://b0:1 cancelled the call as it ran out \
             (Timeout expired)"
        );

        // Any other status passes untouched.
        let mut unavailable = http::HeaderMap::new();
        Status::unavailable("down")
            .add_header(&mut unavailable)
            .unwrap();
        cancelled_at_deadline("http://b0:1", &deadline, &mut unavailable);
        assert_eq!(code(&unavailable), Code::Unavailable);
    }
}

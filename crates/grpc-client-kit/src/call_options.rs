//! One call's options, and how the kit applies them (with the service config's method
//! settings) where it takes the call: its deadline, whether it waits for ready, and its message
//! size limits.

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use balance_layer::{RequestDeadline, WaitForReady};
use bytes::Bytes;
use endpoint_state::classify::{MessagePrefixes, Prefix};
use endpoint_state::sync::lock;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tonic::Status;

use crate::service_config::ServiceConfig;
use crate::stack::Request;

/// Options of one call, as gRPC's per-call options: with what the kit and its
/// [service config](crate::KitBuilder::service_config) say for the call's method, they decide
/// whether it waits for ready, its deadline and its message size limits. A request
/// extension: set it on the request before the call.
///
/// ```
/// use std::time::Duration;
/// use grpc_client_kit::CallOptions;
/// # use test_backends::pb::Ping;
///
/// let mut request = tonic::Request::new(Ping::default());
/// request.extensions_mut().insert(
///     CallOptions::new()
///         .wait_for_ready(true)
///         .timeout(Duration::from_secs(2)),
/// );
/// // client.unary(request).await
/// ```
///
/// As gRPC combines a call's options with the service config:
///
/// * `wait_for_ready`: whether the call waits (up to its deadline) for an eligible target when
///   none is, instead of failing at once with `UNAVAILABLE`. **Overrides** the method's
///   `waitForReady` and [`KitBuilder::wait_for_ready`](crate::KitBuilder::wait_for_ready).
/// * `timeout`: the call's deadline, as tonic's `Request::set_timeout` sets one. The
///   **soonest** of the two (when both are set) and the method's `timeout` ends the call.
/// * `max_request_message_bytes`, `max_response_message_bytes`: the longest message the call
///   sends or accepts; the **smaller** of this and the method's `maxRequestMessageBytes` /
///   `maxResponseMessageBytes` holds. A longer message fails the call with
///   `RESOURCE_EXHAUSTED` naming the limit (a request message over it is not sent). The
///   length is the message's as it is on the wire: for a compressed message, its compressed
///   length (gRPC measures the uncompressed one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallOptions {
    /// Whether the call waits for an eligible target; `None`: as the method (or kit) says.
    pub wait_for_ready: Option<bool>,
    /// The call's deadline; the method's `timeout`, when sooner, ends it first.
    pub timeout: Option<Duration>,
    /// The longest request message; the method's `maxRequestMessageBytes`, when smaller,
    /// holds.
    pub max_request_message_bytes: Option<u32>,
    /// The longest response message; the method's `maxResponseMessageBytes`, when smaller,
    /// holds.
    pub max_response_message_bytes: Option<u32>,
}

impl CallOptions {
    /// No option set: the method's settings (and the kit's) apply.
    pub fn new() -> Self {
        CallOptions::default()
    }

    /// Sets [`wait_for_ready`](Self::wait_for_ready).
    #[must_use]
    pub fn wait_for_ready(mut self, wait: bool) -> Self {
        self.wait_for_ready = Some(wait);
        self
    }

    /// Sets [`timeout`](Self::timeout).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets [`max_request_message_bytes`](Self::max_request_message_bytes).
    #[must_use]
    pub fn max_request_message_bytes(mut self, bytes: u32) -> Self {
        self.max_request_message_bytes = Some(bytes);
        self
    }

    /// Sets [`max_response_message_bytes`](Self::max_response_message_bytes).
    #[must_use]
    pub fn max_response_message_bytes(mut self, bytes: u32) -> Self {
        self.max_response_message_bytes = Some(bytes);
        self
    }
}

/// Applies the call's options and its method's settings to the request as the kit takes it,
/// so that every later layer sees them: its deadline (`grpc-timeout`), its wait-for-ready (the
/// balancer's [`WaitForReady`] extension) and its request message limit (the body is read
/// through one). Returns what the response side enforces, if anything.
#[inline]
pub(crate) fn prepare(req: &mut Request, config: Option<&ServiceConfig>) -> Option<Box<Limits>> {
    let options = req.extensions().get::<CallOptions>();
    if options.is_none() && config.is_none() {
        return None;
    }
    let method = config.and_then(|c| c.method(req.uri().path()));
    let pick = |call: Option<&CallOptions>| {
        let mut out = CallOptions::default();
        if let Some(m) = method {
            out.wait_for_ready = m.wait_for_ready;
            out.timeout = m.timeout;
            out.max_request_message_bytes = m.max_request_message_bytes;
            out.max_response_message_bytes = m.max_response_message_bytes;
        }
        if let Some(c) = call {
            // The call's own wait-for-ready overrides; of two limits, the smaller holds.
            out.wait_for_ready = c.wait_for_ready.or(out.wait_for_ready);
            out.timeout = smaller(c.timeout, out.timeout);
            out.max_request_message_bytes =
                smaller(c.max_request_message_bytes, out.max_request_message_bytes);
            out.max_response_message_bytes =
                smaller(c.max_response_message_bytes, out.max_response_message_bytes);
        }
        out
    };
    let chosen = pick(options);
    if let Some(timeout) = chosen.timeout {
        // The call's own deadline, when sooner, stands.
        if req.time_budget().is_none_or(|own| own > timeout) {
            req.set_time_budget(timeout);
        }
    }
    if let Some(wait) = chosen.wait_for_ready {
        req.extensions_mut().insert(WaitForReady(wait));
    }
    if chosen.max_request_message_bytes.is_none() && chosen.max_response_message_bytes.is_none() {
        return None;
    }
    let method: Arc<str> = Arc::from(req.uri().path());
    let request = chosen.max_request_message_bytes.map(|max| {
        let oversize = Arc::new(Oversize::default());
        let body = std::mem::take(req.body_mut());
        *req.body_mut() = tonic::body::Body::new(LimitedRequest {
            inner: body,
            prefixes: MessagePrefixes::new(),
            max,
            method: method.clone(),
            oversize: oversize.clone(),
            failed: false,
        });
        oversize
    });
    let response = chosen.max_response_message_bytes.map(|max| ResponseLimit {
        max,
        prefixes: MessagePrefixes::new(),
    });
    Some(Box::new(Limits {
        request,
        response,
        method,
    }))
}

/// The smaller of two limits, or the one given.
fn smaller<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A call's message size limits, as its response future and body enforce them.
pub(crate) struct Limits {
    /// Set when the request body met a message over its limit.
    request: Option<Arc<Oversize>>,
    response: Option<ResponseLimit>,
    method: Arc<str>,
}

impl fmt::Debug for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limits")
            .field("method", &self.method)
            .field("response", &self.response.as_ref().map(|r| r.max))
            .finish_non_exhaustive()
    }
}

struct ResponseLimit {
    max: u32,
    prefixes: MessagePrefixes,
}

impl Limits {
    /// The status the call ends with because its request had a message over the limit, once
    /// the request body met one (the waker is woken when it does).
    pub(crate) fn request_refused(&self, cx: &mut Context<'_>) -> Option<Status> {
        self.request.as_ref()?.poll(cx)
    }

    /// Reads a response data frame: the status the call ends with if it holds the start of a
    /// message over the limit.
    pub(crate) fn check_response(&mut self, data: &Bytes) -> Option<Status> {
        let limit = self.response.as_mut()?;
        let max = limit.max;
        let over = limit.prefixes.read(data, |prefix| match prefix {
            Prefix::Length(n) if n > max => Err(n),
            _ => Ok(()),
        });
        let n = over.err()?;
        // Read no further: the body ends here.
        self.response = None;
        Some(Status::resource_exhausted(format!(
            "{}: response message of {n} bytes is larger than the limit of {max} bytes \
             (maxResponseMessageBytes)",
            self.method
        )))
    }
}

/// Where the request body tells the response side that it refused a message.
#[derive(Default)]
struct Oversize {
    status: OnceLock<Status>,
    waker: Mutex<Option<Waker>>,
}

impl Oversize {
    fn set(&self, status: Status) {
        let _ = self.status.set(status);
        if let Some(waker) = lock(&self.waker).take() {
            waker.wake();
        }
    }

    fn poll(&self, cx: &mut Context<'_>) -> Option<Status> {
        if let Some(status) = self.status.get() {
            return Some(status.clone());
        }
        {
            let mut waker = lock(&self.waker);
            if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *waker = Some(cx.waker().clone());
            }
        }
        // Set between the first look and the waker's registration.
        self.status.get().cloned()
    }
}

pin_project! {
    /// A request body read through a limit on its messages' lengths: the first message over
    /// it ends the body with `RESOURCE_EXHAUSTED`, before any of its bytes are sent, and tells
    /// the call's response side.
    struct LimitedRequest {
        #[pin]
        inner: tonic::body::Body,
        prefixes: MessagePrefixes,
        max: u32,
        method: Arc<str>,
        oversize: Arc<Oversize>,
        failed: bool,
    }
}

impl Body for LimitedRequest {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.project();
        if *this.failed {
            return Poll::Ready(None);
        }
        let frame = match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        if let Some(data) = frame.data_ref() {
            let max = *this.max;
            let over = this.prefixes.read(data, |prefix| match prefix {
                Prefix::Length(n) if n > max => Err(n),
                _ => Ok(()),
            });
            if let Err(n) = over {
                *this.failed = true;
                let status = Status::resource_exhausted(format!(
                    "{}: request message of {n} bytes is larger than the limit of {max} bytes \
                     (maxRequestMessageBytes); it was not sent",
                    this.method
                ));
                this.oversize.set(status.clone());
                return Poll::Ready(Some(Err(status)));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

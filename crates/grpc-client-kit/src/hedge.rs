//! gRPC's hedging policy (gRFC A6): the same call sent to several targets, one more after
//! each `hedgingDelay` while none has answered; the first response headers win and the other
//! attempts are cancelled (dropped: an abandoned attempt counts neither for nor against its
//! target). A status not in `nonFatalStatusCodes` ends the call at once with that status; a
//! non-fatal one ends its attempt only, and the next goes at once (or after the server's
//! pushback; a negative or malformed pushback stops hedging).
//!
//! Every attempt needs the whole request: the call's body is read first, when it is ready at
//! once (a unary call's is), and kept, shared, in the kit's replay budget. A body that is not
//! ready at once (a client stream: its caller may wait for an answer before it goes on), longer
//! than the replay limit, that does not fit in the budget, or that ends with trailers or an
//! error, is sent once, unhedged.

use std::collections::VecDeque;
use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use balance_layer::{Balance, RequestDeadline};
use bytes::Bytes;
use endpoint_state::CallStatus;
use http::{HeaderMap, Method, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;
use tonic::Code;
use tower_service::Service;

use crate::error::BoxError;
use crate::life::Life;
use crate::observe::CallGuard;
use crate::policy::{MAX_ATTEMPTS, PREVIOUS_ATTEMPTS, Throttle, pushback, trailers_only};
use crate::retry::REPLAY_LIMIT;
use crate::service_config::HedgingPolicy;
use crate::stack::{Deadline, KitDiscover, Request, Stack, StackBody, TrackTarget};

type Inner = balance_layer::future::ResponseFuture<Arc<str>, Stack, Request>;

/// An attempt in flight, and the slot where the target it went to is written.
type InFlight = (Pin<Box<Inner>>, Arc<OnceLock<Arc<str>>>);

/// One hedged call: its request, kept whole, and its attempts.
pub(crate) struct Hedge {
    policy: Arc<HedgingPolicy>,
    max: u32,
    throttle: Option<Arc<Throttle>>,
    life: Arc<Life>,
    head: Head,
    body: Source,
    /// Attempts sent so far.
    sent: u32,
    /// The balancer handle the next attempt waits on.
    launching: Option<Balance<KitDiscover, Request>>,
    /// The attempts in flight, each with the target it went to (once known).
    in_flight: Vec<InFlight>,
    /// When the next attempt goes (`None`: not scheduled).
    next_at: Option<Pin<Box<Sleep>>>,
    /// A pushback said not to hedge any more.
    stopped: bool,
    /// The targets the attempts went to, in order.
    tried: Vec<Arc<str>>,
    /// The last non-fatal failure: the call's outcome if no attempt succeeds.
    last: Option<Result<http::Response<StackBody>, BoxError>>,
}

impl fmt::Debug for Hedge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hedge")
            .field("sent", &self.sent)
            .field("max", &self.max)
            .field("in_flight", &self.in_flight.len())
            .field("tried", &self.tried)
            .finish_non_exhaustive()
    }
}

/// A request's head, kept to send it to every attempt.
struct Head {
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    wait: Option<balance_layer::WaitForReady>,
    hash: Option<balance_layer::RequestHash>,
}

/// The request body, as far as it has been read.
enum Source {
    /// Being read: the frames so far, and the rest.
    Reading {
        body: tonic::body::Body,
        frames: Vec<Bytes>,
        len: usize,
    },
    /// Read whole: every attempt sends these frames (their bytes held in the kit's budget).
    Whole { frames: Arc<[Bytes]>, charge: usize },
    /// Too long, or not plain data: sent once, what was read then the rest.
    Once(Option<tonic::body::Body>),
}

impl Hedge {
    /// A hedged call of `req` under `policy`: the first attempt goes on `balance` (a handle
    /// that may already hold a reserved target).
    pub(crate) fn new(
        req: Request,
        policy: Arc<HedgingPolicy>,
        throttle: Option<Arc<Throttle>>,
        life: Arc<Life>,
        balance: Balance<KitDiscover, Request>,
    ) -> Box<Self> {
        let (parts, body) = req.into_parts();
        let head = Head {
            method: parts.method,
            uri: parts.uri,
            version: parts.version,
            headers: parts.headers,
            wait: parts.extensions.get().copied(),
            hash: parts.extensions.get().copied(),
        };
        let max = policy.max_attempts.clamp(1, MAX_ATTEMPTS);
        let mut hedge = Box::new(Hedge {
            policy,
            max,
            throttle,
            life,
            head,
            body: Source::Reading {
                body,
                frames: Vec::new(),
                len: 0,
            },
            sent: 0,
            launching: None,
            in_flight: Vec::new(),
            next_at: None,
            stopped: false,
            tried: Vec::new(),
            last: None,
        });
        // The first attempt's request is made once the body is read.
        hedge.launching = Some(balance);
        hedge
    }

    /// The targets of the attempts in flight, joined, if known.
    pub(crate) fn tried(&self) -> Option<String> {
        let names: Vec<&str> = self
            .in_flight
            .iter()
            .filter_map(|(_, slot)| slot.get().map(|t| &**t))
            .collect();
        (!names.is_empty()).then(|| names.join(", "))
    }

    /// The targets the attempts went to, for the caller's message.
    pub(crate) fn note(&self) -> Option<String> {
        if self.sent < 2 || self.tried.is_empty() {
            return None;
        }
        Some(format!("(attempts: {})", self.tried.join(", ")))
    }

    /// Reads the request body to its end if it is ready at once, or gives up on keeping it.
    fn read_body(&mut self, cx: &mut Context<'_>) {
        let Source::Reading { body, frames, len } = &mut self.body else {
            return;
        };
        loop {
            let Poll::Ready(frame) = Pin::new(&mut *body).poll_frame(cx) else {
                // Not ready at once (a client stream, whose caller may wait for an answer
                // before it goes on): not hedged, sent once without waiting.
                self.once();
                return;
            };
            match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if *len + data.len() <= REPLAY_LIMIT => {
                        *len += data.len();
                        frames.push(data);
                    }
                    Ok(data) => {
                        frames.push(data);
                        break self.once();
                    }
                    Err(frame) => {
                        // Trailers: not kept; sent once as they came.
                        let rest = std::mem::take(body);
                        let mut all: VecDeque<Result<Frame<Bytes>, tonic::Status>> =
                            frames.drain(..).map(|d| Ok(Frame::data(d))).collect();
                        all.push_back(Ok(frame));
                        self.body = Source::Once(Some(tonic::body::Body::new(Frames {
                            frames: all,
                            rest: Some(rest),
                        })));
                        break;
                    }
                },
                Some(Err(status)) => {
                    // The caller's body failed: the one attempt sends what was read, then
                    // the error.
                    let mut all: VecDeque<Result<Frame<Bytes>, tonic::Status>> =
                        frames.drain(..).map(|d| Ok(Frame::data(d))).collect();
                    all.push_back(Err(status));
                    self.body = Source::Once(Some(tonic::body::Body::new(Frames {
                        frames: all,
                        rest: None,
                    })));
                    break;
                }
                None => {
                    let kept = *len;
                    if self.life.state.replay.take(kept) {
                        let frames: Arc<[Bytes]> = std::mem::take(frames).into();
                        self.body = Source::Whole {
                            frames,
                            charge: kept,
                        };
                    } else {
                        self.once();
                    }
                    break;
                }
            }
        }
    }

    /// The body cannot be kept whole: it goes once, what was read then the rest.
    fn once(&mut self) {
        if let Source::Reading { body, frames, .. } = &mut self.body {
            let rest = std::mem::take(body);
            let all = frames.drain(..).map(|d| Ok(Frame::data(d))).collect();
            self.body = Source::Once(Some(tonic::body::Body::new(Frames {
                frames: all,
                rest: Some(rest),
            })));
        }
        self.max = 1;
    }

    /// The request of the next attempt, if the body allows one more.
    fn request(&mut self) -> Option<(Request, Arc<OnceLock<Arc<str>>>)> {
        let body = match &mut self.body {
            Source::Whole { frames, .. } => tonic::body::Body::new(Frames {
                frames: frames.iter().cloned().map(|d| Ok(Frame::data(d))).collect(),
                rest: None,
            }),
            Source::Once(body) => body.take()?,
            Source::Reading { .. } => return None,
        };
        let mut req = http::Request::new(body);
        *req.method_mut() = self.head.method.clone();
        *req.uri_mut() = self.head.uri.clone();
        *req.version_mut() = self.head.version;
        *req.headers_mut() = self.head.headers.clone();
        if self.sent > 0 {
            req.headers_mut()
                .insert(PREVIOUS_ATTEMPTS, http::HeaderValue::from(self.sent));
        }
        if let Some(wait) = self.head.wait {
            req.extensions_mut().insert(wait);
        }
        if let Some(hash) = self.head.hash {
            req.extensions_mut().insert(hash);
        }
        let slot = Arc::new(OnceLock::new());
        req.extensions_mut()
            .insert(TrackTarget(Some(Arc::clone(&slot))));
        Some((req, slot))
    }

    /// Whether another attempt may go: attempts left, no pushback against, the throttle.
    fn may_send(&self) -> bool {
        self.sent < self.max
            && !self.stopped
            && (self.sent == 0 || self.throttle.as_ref().is_none_or(|t| t.allows()))
    }

    /// Schedules the next attempt after `delay` (at once for none: no timer, whose
    /// millisecond ticks would let the first attempt win before a zero delay passed).
    fn schedule(&mut self, delay: Duration) {
        if !self.may_send() || self.launching.is_some() {
            return;
        }
        if delay.is_zero() {
            self.next_at = None;
            self.launch_next();
            return;
        }
        match &mut self.next_at {
            Some(sleep) => sleep.as_mut().reset(tokio::time::Instant::now() + delay),
            None => self.next_at = Some(Box::pin(tokio::time::sleep(delay))),
        }
    }

    /// The next attempt waits for a target: one that no earlier attempt went to, while there
    /// is one eligible.
    fn launch_next(&mut self) {
        let mut balance = self.life.balance.clone();
        let in_flight = self.in_flight.iter().filter_map(|(_, t)| t.get());
        for target in self.tried.iter().chain(in_flight) {
            balance.avoid(Arc::clone(target));
        }
        self.launching = Some(balance);
    }

    /// Drives the call: `Ready` with the winning response, or the call's final failure.
    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        deadline: Option<&Deadline>,
        trace: &CallGuard,
    ) -> Poll<Result<http::Response<StackBody>, BoxError>> {
        self.read_body(cx);
        loop {
            let mut progressed = false;
            // The next attempt's time has come: it waits for a target.
            if let Some(sleep) = &mut self.next_at
                && sleep.as_mut().poll(cx).is_ready()
            {
                self.next_at = None;
                if self.may_send() && self.launching.is_none() {
                    self.launch_next();
                }
            }
            // An attempt waiting for a target.
            if let Some(balance) = &mut self.launching {
                match balance.poll_ready(cx) {
                    Poll::Pending => {}
                    Poll::Ready(ready) => {
                        let Some(mut balance) = self.launching.take() else {
                            return Poll::Pending;
                        };
                        progressed = true;
                        match ready {
                            Err(e) => {
                                let e = crate::future::map_error(e, Some(&self.life.state));
                                if let Some(out) = self.failed(Err(e)) {
                                    return Poll::Ready(out);
                                }
                            }
                            Ok(()) => {
                                if let Some((mut req, slot)) = self.request() {
                                    if let Some(deadline) = deadline {
                                        req.set_time_budget(deadline.left());
                                        req.extensions_mut().insert(*deadline);
                                    }
                                    trace.attach(&mut req);
                                    if self.sent > 0
                                        && let Some(trace) = trace.trace()
                                    {
                                        trace.hedged();
                                    }
                                    self.sent += 1;
                                    let inner = Box::pin(balance.call(req));
                                    if let Some(target) = slot.get() {
                                        self.tried.push(Arc::clone(target));
                                    }
                                    self.in_flight.push((inner, slot));
                                    self.schedule(self.policy.hedging_delay);
                                }
                            }
                        }
                    }
                }
            }
            // The attempts in flight.
            let mut i = 0;
            while i < self.in_flight.len() {
                let Poll::Ready(out) = self.in_flight[i].0.as_mut().poll(cx) else {
                    i += 1;
                    continue;
                };
                self.in_flight.swap_remove(i);
                progressed = true;
                if let Some(out) = self.failed(out) {
                    // The call is decided: the other attempts are cancelled.
                    self.in_flight.clear();
                    self.launching = None;
                    return Poll::Ready(out);
                }
            }
            if self.in_flight.is_empty() && self.launching.is_none() && !self.may_send() {
                // Nothing in flight and nothing more to send: the last failure is the call's.
                self.next_at = None;
                let last = self.last.take().unwrap_or_else(|| {
                    Err(Box::new(tonic::Status::unavailable("no attempt was sent")))
                });
                return Poll::Ready(last);
            }
            if self.in_flight.is_empty() && self.launching.is_none() && self.next_at.is_none() {
                // Attempts left, none scheduled (the last one failed): the next goes now.
                self.schedule(Duration::ZERO);
                progressed = true;
            }
            if !progressed {
                return Poll::Pending;
            }
        }
    }

    /// An attempt ended: `Some` when that decides the call (a response, a fatal status),
    /// `None` when the other attempts go on.
    fn failed(
        &mut self,
        out: Result<http::Response<StackBody>, BoxError>,
    ) -> Option<Result<http::Response<StackBody>, BoxError>> {
        let (code, headers) = match &out {
            Ok(response) => match trailers_only(response.headers()) {
                None | Some(Code::Ok) => {
                    if let Some(throttle) = &self.throttle {
                        throttle.success();
                    }
                    return Some(out);
                }
                Some(code) => (code, Some(response.headers())),
            },
            Err(e) => (status_code(&**e), None),
        };
        if !self.policy.non_fatal_status_codes.contains(&code) {
            return Some(out);
        }
        if let Some(throttle) = &self.throttle {
            throttle.failure();
        }
        match pushback(headers) {
            Ok(Some(delay)) => {
                self.next_at = None;
                self.schedule(delay);
            }
            Ok(None) => {
                // The next attempt goes at once.
                self.next_at = None;
                self.schedule(Duration::ZERO);
            }
            Err(()) => self.stopped = true,
        }
        self.last = Some(out);
        None
    }
}

impl Drop for Hedge {
    fn drop(&mut self) {
        if let Source::Whole { charge, .. } = &self.body {
            self.life.state.replay.give(*charge);
        }
    }
}

/// The code of an attempt's error.
fn status_code(error: &(dyn Error + 'static)) -> Code {
    CallStatus::from_error(error).code
}

/// A request body of kept frames (and, sent once, the rest of the original).
struct Frames {
    frames: VecDeque<Result<Frame<Bytes>, tonic::Status>>,
    rest: Option<tonic::body::Body>,
}

impl Body for Frames {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        if let Some(frame) = self.frames.pop_front() {
            return Poll::Ready(Some(frame));
        }
        match &mut self.rest {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        if self.rest.is_some() {
            return SizeHint::default();
        }
        let len: usize = self
            .frames
            .iter()
            .map(|f| match f {
                Ok(f) => f.data_ref().map_or(0, Bytes::len),
                Err(_) => 0,
            })
            .sum();
        SizeHint::with_exact(len as u64)
    }
}

//! The kit channel's response future and body.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use balance_layer::{Balance, NoHealthyTargets, RequestDeadline};
use bytes::Bytes;
use endpoint_state::{BreakerState, CallStatus};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tonic::Status;
use tower_service::Service;

use crate::call_options::Limits;
use crate::error::{BoxError, DiscoveryFailed, KitShutDown, TransportError};
use crate::hedge::Hedge;
use crate::life::{KitState, Life};
use crate::observe::CallGuard;
use crate::policy::{Attempts, PREVIOUS_ATTEMPTS, Verdict};
use crate::retry::Unsent;
use crate::stack::{AnsweredBy, Deadline, KitDiscover, Request, Stack, StackBody, expired};

type Inner = balance_layer::future::ResponseFuture<Arc<str>, Stack, Request>;

pin_project! {
    /// The response future of [`KitChannel`](crate::KitChannel): the balancer's future, with
    /// its errors made into gRPC statuses that name the target(s); or, when no target was
    /// ready at once, a wait for one bounded by the call's deadline first.
    pub struct ResponseFuture {
        #[pin]
        state: State,
        // The call's deadline, read when the kit took the call: the kit's own timer while the
        // call waits above the balancer, and what a request sent later carries.
        deadline: Option<Deadline>,
        #[pin]
        timer: Option<Sleep>,
        // The call's span and metrics: handed to the body with the response.
        trace: CallGuard,
        // The call's message size limits (a service config's, or its `CallOptions`'): handed
        // to the body with the response.
        limits: Option<Box<Limits>>,
        // The call's attempts under its method's retry policy, if it has one.
        policy: Option<Box<Attempts>>,
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
            // The attempt failed while its request body was still below (the connection had
            // not dropped it yet): its error, kept while the body comes back to be sent again.
            parked: Option<Box<BodyWait>>,
            // Whether the call has waited so once (it does not wait twice for one attempt).
            waited: bool,
        },
        // No target was ready when the call was made, or the first attempt reached no backend
        // (or one that refused it): waiting for the balancer to reserve a ready target.
        Waiting {
            waiting: Box<Waiting>,
        },
        // A hedged call: its attempts (rare: boxed).
        Hedging {
            hedge: Box<Hedge>,
            notes: Arc<KitState>,
        },
        // A retry policy's backoff (or the server's pushback) before the next attempt.
        Backoff {
            sleep: Pin<Box<Sleep>>,
            waiting: Box<Waiting>,
        },
        Refused {
            error: Option<BoxError>,
        },
    }
}

/// The longest a failed attempt waits for its request body to come back before the call
/// decides without it (the connection drops a body within microseconds of the stream's end;
/// this bounds a connection task that is slow to run).
const BODY_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// A failed attempt's error, kept while its request body comes back (a rare path: boxed).
struct BodyWait {
    error: BoxError,
    cap: Pin<Box<Sleep>>,
}

/// A call waiting for a ready target (a rare path: boxed to keep the future small).
struct Waiting {
    balance: Balance<KitDiscover, Request>,
    request: Option<Request>,
    life: Arc<Life>,
    retry: Option<Unsent>,
    /// Whether this is the call's second attempt.
    again: bool,
}

impl ResponseFuture {
    pub(crate) fn called(
        inner: Inner,
        notes: Option<Arc<KitState>>,
        retry: Option<Unsent>,
        deadline: Option<Deadline>,
        trace: CallGuard,
        limits: Option<Box<Limits>>,
        policy: Option<Box<Attempts>>,
    ) -> Self {
        ResponseFuture {
            state: State::Called {
                inner,
                notes,
                retry,
                parked: None,
                waited: false,
            },
            deadline,
            timer: None,
            trace,
            limits,
            policy,
        }
    }

    pub(crate) fn waiting(
        balance: Balance<KitDiscover, Request>,
        request: Request,
        life: Arc<Life>,
        retry: Option<Unsent>,
        trace: CallGuard,
        limits: Option<Box<Limits>>,
        policy: Option<Box<Attempts>>,
    ) -> Self {
        // Read from the request sent on, whose `grpc-timeout` is the call's.
        let deadline = Deadline::of(&request);
        let waiting = Waiting {
            balance,
            request: Some(request),
            life,
            retry,
            again: false,
        };
        ResponseFuture {
            state: State::Waiting {
                waiting: Box::new(waiting),
            },
            deadline,
            timer: None,
            trace,
            limits,
            policy,
        }
    }

    pub(crate) fn hedging(
        hedge: Box<Hedge>,
        life: Arc<Life>,
        deadline: Option<Deadline>,
        trace: CallGuard,
        limits: Option<Box<Limits>>,
    ) -> Self {
        ResponseFuture {
            state: State::Hedging {
                hedge,
                notes: Arc::clone(&life.state),
            },
            deadline,
            timer: None,
            trace,
            limits,
            policy: None,
        }
    }

    pub(crate) fn refused(error: BoxError, trace: CallGuard) -> Self {
        ResponseFuture {
            state: State::Refused { error: Some(error) },
            deadline: None,
            timer: None,
            trace,
            limits: None,
            policy: None,
        }
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            State::Called { inner, .. } => f.debug_tuple("ResponseFuture").field(inner).finish(),
            State::Waiting { waiting } | State::Backoff { waiting, .. } => f
                .debug_tuple("ResponseFuture")
                .field(&waiting.balance)
                .finish(),
            State::Hedging { hedge, .. } => f.debug_tuple("ResponseFuture").field(hedge).finish(),
            State::Refused { error } => f.debug_tuple("ResponseFuture").field(error).finish(),
        }
    }
}

impl Future for ResponseFuture {
    type Output = Result<http::Response<ResponseBody>, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        // The call's span, entered while polling (a clone of the trace's handle: the trace
        // itself goes to the body with the response).
        let held = this.trace.trace().cloned();
        let _entered = held.as_ref().map(|t| t.span().enter());
        // The request had a message over its limit: the call ends here, the attempt below is
        // dropped (no target is blamed for it).
        if let Some(status) = this.limits.as_deref().and_then(|l| l.request_refused(cx)) {
            this.state.set(State::Refused { error: None });
            return failed(this.trace, Box::new(status));
        }
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Called {
                    inner,
                    notes,
                    retry,
                    parked,
                    waited,
                } => {
                    let result = match parked.take() {
                        Some(mut wait) => {
                            let back = retry
                                .as_ref()
                                .is_none_or(|r| r.poll_body_back(cx).is_ready());
                            if !back && wait.cap.as_mut().poll(cx).is_pending() {
                                if let Some(deadline) = this.deadline
                                    && expired(this.timer.as_mut(), deadline, cx)
                                {
                                    return failed(
                                        this.trace,
                                        map_error(wait.error, notes.as_deref()),
                                    );
                                }
                                *parked = Some(wait);
                                return Poll::Pending;
                            }
                            Err(wait.error)
                        }
                        None => ready!(inner.poll(cx)),
                    };
                    match result {
                        Ok(mut response) if let Some(attempts) = this.policy.as_deref_mut() => {
                            let code = crate::policy::trailers_only(response.headers());
                            if code.is_some() {
                                // A status: the target is named for the next attempt to avoid it,
                                // and for the caller's message.
                                let target = response.extensions().get::<AnsweredBy>();
                                attempts.tried(target.map(|a| a.0.clone()));
                            }
                            let verdict = match code {
                                Some(code) => attempts.judge(code, Some(response.headers())),
                                None => {
                                    attempts.committed();
                                    Verdict::Commit
                                }
                            };
                            let next = match verdict {
                                Verdict::Retry(delay) => again_after(
                                    delay,
                                    attempts,
                                    retry,
                                    this.deadline.as_ref(),
                                    this.trace,
                                ),
                                Verdict::Commit => None,
                            };
                            if let Some(next) = next {
                                // Not committed: this attempt's answer is dropped.
                                drop(response);
                                next
                            } else {
                                drop(retry.take());
                                if let Some(trace) = this.trace.trace() {
                                    trace.defer(false);
                                }
                                if let Some(code) = code {
                                    if let Some(note) = attempts.note() {
                                        crate::policy::append_note(response.headers_mut(), &note);
                                    }
                                    // The attempt's status, deferred, is the call's.
                                    this.trace.end(code);
                                }
                                let trace = this.trace.take();
                                let limits = this.limits.take();
                                return Poll::Ready(Ok(response.map(|inner| ResponseBody {
                                    inner: Some(inner),
                                    trace,
                                    limits,
                                })));
                            }
                        }
                        Ok(response) => {
                            // The call is answered: nothing will be sent again.
                            drop(retry.take());
                            let trace = this.trace.take();
                            let limits = this.limits.take();
                            return Poll::Ready(Ok(response.map(|inner| ResponseBody {
                                inner: Some(inner),
                                trace,
                                limits,
                            })));
                        }
                        Err(_)
                            if let Some(status) =
                                this.limits.as_deref().and_then(|l| l.request_refused(cx)) =>
                        {
                            return failed(this.trace, Box::new(status));
                        }
                        // The attempt may be sent again, but its body is still below: wait for it
                        // to come back (the connection drops it as the stream ends), then decide.
                        Err(e)
                            if !*waited
                                && retry.as_ref().is_some_and(Unsent::body_out)
                                && (this.policy.is_some() || Unsent::not_acted_on(&*e)) =>
                        {
                            *waited = true;
                            *parked = Some(Box::new(BodyWait {
                                error: e,
                                cap: Box::pin(tokio::time::sleep(BODY_WAIT)),
                            }));
                            continue;
                        }
                        Err(e) if let Some(attempts) = this.policy.as_deref_mut() => {
                            attempts.tried(failed_target(&*e));
                            let time_left = this.deadline.is_none_or(|d| !d.left().is_zero());
                            let transparent = !attempts.transparent_used
                                && time_left
                                && retry.as_ref().is_some_and(|r| r.life().transparent_retry)
                                && Unsent::not_acted_on(&*e);
                            let resent = if transparent {
                                retry.as_mut().and_then(Unsent::resend)
                            } else {
                                None
                            };
                            if let Some(mut request) = resent {
                                // No backend acted on it: sent again at once, not counted against
                                // the policy's attempts (gRFC A6).
                                attempts.transparent_used = true;
                                if let Some(trace) = this.trace.trace() {
                                    trace.retried();
                                }
                                let Some(unsent) = retry.take() else {
                                    return failed(this.trace, map_error(e, notes.as_deref()));
                                };
                                let life = Arc::clone(unsent.life());
                                let mut balance = life.balance.clone();
                                if let Some(target) = failed_target(&*e) {
                                    balance.avoid(target);
                                }
                                if attempts.made() > 1 {
                                    set_previous(&mut request, attempts.made() - 1);
                                }
                                State::Waiting {
                                    waiting: Box::new(Waiting {
                                        balance,
                                        request: Some(request),
                                        life,
                                        retry: Some(unsent),
                                        again: true,
                                    }),
                                }
                            } else {
                                let code = CallStatus::from_error(&*e).code;
                                let next = match attempts.judge(code, None) {
                                    Verdict::Retry(delay) => again_after(
                                        delay,
                                        attempts,
                                        retry,
                                        this.deadline.as_ref(),
                                        this.trace,
                                    ),
                                    Verdict::Commit => None,
                                };
                                match next {
                                    Some(next) => next,
                                    None => {
                                        drop(retry.take());
                                        let error = map_error(e, notes.as_deref());
                                        let error = match attempts.note() {
                                            Some(note) => noted(error, &note),
                                            None => error,
                                        };
                                        return failed(this.trace, error);
                                    }
                                }
                            }
                        }
                        Err(e) => {
                            let again = retry.take().and_then(|r| r.again(&*e));
                            let Some((request, life)) = again else {
                                return failed(this.trace, map_error(e, notes.as_deref()));
                            };
                            if this.deadline.is_some_and(|d| d.left().is_zero()) {
                                // No time left to send it again: the first attempt's error.
                                return failed(this.trace, map_error(e, notes.as_deref()));
                            }
                            tracing::debug!(
                                error = %e,
                                "no backend acted on the call; sending it to another target"
                            );
                            if let Some(trace) = this.trace.trace() {
                                trace.retried();
                            }
                            let mut balance = life.balance.clone();
                            if let Some(target) = failed_target(&*e) {
                                balance.avoid(target);
                            }
                            // A rare path: carry the kit's state whatever it was at the call, so
                            // that a retry meeting a shut-down kit or a failing DNS name says so.
                            State::Waiting {
                                waiting: Box::new(Waiting {
                                    balance,
                                    request: Some(request),
                                    life,
                                    retry: None,
                                    again: true,
                                }),
                            }
                        }
                    }
                }
                StateProj::Waiting { waiting } => {
                    let Waiting {
                        balance,
                        request,
                        life,
                        retry,
                        ..
                    } = &mut **waiting;
                    match balance.poll_ready(cx) {
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(e)) => {
                            return failed(this.trace, map_error(e, Some(&life.state)));
                        }
                        Poll::Pending => {
                            if let Some(deadline) = this.deadline
                                && expired(this.timer.as_mut(), deadline, cx)
                            {
                                return failed(this.trace, waiting.exceeded(deadline));
                            }
                            return Poll::Pending;
                        }
                    }
                    let mut request = request.take().expect("a request to send");
                    if let Some(deadline) = this.deadline {
                        // Time passed since the call was made: it goes with what is left.
                        let left = deadline.left();
                        if left.is_zero() {
                            return failed(this.trace, waiting.exceeded(deadline));
                        }
                        request.set_time_budget(left);
                        // The target's leaf holds the same deadline, and names the budget the
                        // caller gave (not what was left when the call reached it).
                        request.extensions_mut().insert(*deadline);
                    }
                    this.trace.attach(&mut request);
                    State::Called {
                        inner: balance.call(request),
                        notes: Some(life.state.clone()),
                        retry: retry.take(),
                        parked: None,
                        waited: false,
                    }
                }
                StateProj::Hedging { hedge, notes } => {
                    let out = match hedge.poll(cx, this.deadline.as_ref(), this.trace) {
                        Poll::Ready(out) => out,
                        Poll::Pending => {
                            if let Some(deadline) = this.deadline
                                && expired(this.timer.as_mut(), deadline, cx)
                            {
                                let doing = match hedge.tried() {
                                    Some(tried) => format!("waiting for {tried}"),
                                    None => "waiting for an eligible target".to_owned(),
                                };
                                return failed(
                                    this.trace,
                                    deadline.exceeded(format_args!("{doing}")),
                                );
                            }
                            return Poll::Pending;
                        }
                    };
                    if let Some(trace) = this.trace.trace() {
                        trace.defer(false);
                    }
                    let note = hedge.note();
                    match out {
                        Ok(mut response) => {
                            if let Some(code) = crate::policy::trailers_only(response.headers()) {
                                if let Some(note) = &note {
                                    crate::policy::append_note(response.headers_mut(), note);
                                }
                                this.trace.end(code);
                            }
                            let trace = this.trace.take();
                            let limits = this.limits.take();
                            return Poll::Ready(Ok(response.map(|inner| ResponseBody {
                                inner: Some(inner),
                                trace,
                                limits,
                            })));
                        }
                        Err(e) => {
                            let error = map_error(e, Some(notes));
                            let error = match note {
                                Some(note) => noted(error, &note),
                                None => error,
                            };
                            return failed(this.trace, error);
                        }
                    }
                }
                StateProj::Backoff { sleep, waiting } => {
                    ready!(sleep.as_mut().poll(cx));
                    let waiting = std::mem::replace(
                        waiting,
                        Box::new(Waiting {
                            balance: Balance::clone(&waiting.balance),
                            request: None,
                            life: Arc::clone(&waiting.life),
                            retry: None,
                            again: true,
                        }),
                    );
                    State::Waiting { waiting }
                }
                StateProj::Refused { error } => {
                    let error = error
                        .take()
                        .expect("ResponseFuture polled after completion");
                    return failed(this.trace, error);
                }
            };
            this.state.set(next);
        }
    }
}

/// Sets up a retry policy's next attempt, to be sent after `delay`: `None` when it cannot be
/// (the request did not come back whole to be sent again, or the deadline comes first).
fn again_after(
    delay: std::time::Duration,
    attempts: &mut Attempts,
    retry: &mut Option<Unsent>,
    deadline: Option<&Deadline>,
    trace: &CallGuard,
) -> Option<State> {
    if deadline.is_some_and(|d| d.left() <= delay) {
        return None;
    }
    let mut request = retry.as_mut()?.resend()?;
    let unsent = retry.take()?;
    let life = Arc::clone(unsent.life());
    let mut balance = life.balance.clone();
    for target in attempts.targets() {
        balance.avoid(Arc::clone(target));
    }
    set_previous(&mut request, attempts.made());
    attempts.sent_again();
    if let Some(trace) = trace.trace() {
        trace.policy_retried();
    }
    tracing::debug!(
        attempt = attempts.made(),
        delay_ms = delay.as_millis() as u64,
        "retryable status; sending the call again under its retry policy"
    );
    Some(State::Backoff {
        sleep: Box::pin(tokio::time::sleep(delay)),
        waiting: Box::new(Waiting {
            balance,
            request: Some(request),
            life,
            retry: Some(unsent),
            again: true,
        }),
    })
}

/// Tells the backend how many attempts of the call came before this one.
fn set_previous(request: &mut Request, previous: u32) {
    request
        .headers_mut()
        .insert(PREVIOUS_ATTEMPTS, http::HeaderValue::from(previous));
}

/// The final status of a call a retry policy sent more than once, its message naming the
/// targets tried.
fn noted(error: BoxError, note: &str) -> BoxError {
    let status = Status::from_error(error);
    Box::new(Status::new(
        status.code(),
        format!("{} {note}", status.message()),
    ))
}

/// The call failed: its status ends its trace.
fn failed(
    trace: &mut CallGuard,
    error: BoxError,
) -> Poll<Result<http::Response<ResponseBody>, BoxError>> {
    trace.end(CallStatus::from_error(&*error).code);
    Poll::Ready(Err(error))
}

impl Waiting {
    /// The error of a call whose deadline passed while it waited for a ready target: the
    /// targets it waited on, and why each was not ready when the kit can tell.
    fn exceeded(&self, deadline: &Deadline) -> BoxError {
        let names = self.balance.waiting_for();
        let mut targets = String::new();
        for name in &names {
            if !targets.is_empty() {
                targets.push_str(", ");
            }
            targets.push_str(name);
            let half_open = self
                .life
                .registry
                .card(name)
                .is_some_and(|c| matches!(c.breaker_state(), BreakerState::HalfOpen { .. }));
            if half_open {
                targets.push_str(" (breaker half-open, every probe permit taken)");
            }
        }
        if targets.is_empty() {
            targets.push_str("an eligible target");
        }
        let again = if self.again {
            " to send the call again"
        } else {
            ""
        };
        deadline.exceeded(format_args!("waiting for {targets} to be ready{again}"))
    }
}

/// The target a failed attempt went to, as its error names it.
fn failed_target(error: &(dyn Error + 'static)) -> Option<Arc<str>> {
    let mut cur = Some(error);
    while let Some(e) = cur {
        if let Some(transport) = e.downcast_ref::<TransportError>() {
            return Some(Arc::from(transport.target()));
        }
        cur = e.source();
    }
    None
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
    /// status from its trailers). Not boxed. Its [`Default`] is an empty body (what tonic's
    /// `with_interceptor` asks of a channel's body).
    #[derive(Default)]
    pub struct ResponseBody {
        #[pin]
        inner: Option<StackBody>,
        // The call's trace, when its status is still to come: dropped before, the call was
        // cancelled.
        trace: CallGuard,
        // The call's message size limits, if it has any.
        limits: Option<Box<Limits>>,
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
        let mut this = self.project();
        let entered = this.trace.enter();
        let Some(limits) = this.limits.as_deref_mut() else {
            return match this.inner.as_pin_mut() {
                Some(inner) => inner.poll_frame(cx),
                None => Poll::Ready(None),
            };
        };
        let over = match limits.request_refused(cx) {
            Some(status) => status,
            None => {
                let Some(inner) = this.inner.as_mut().as_pin_mut() else {
                    return Poll::Ready(None);
                };
                let frame = ready!(inner.poll_frame(cx));
                let over = match &frame {
                    Some(Ok(f)) => f.data_ref().and_then(|data| limits.check_response(data)),
                    _ => None,
                };
                match over {
                    Some(status) => status,
                    None => return Poll::Ready(frame),
                }
            }
        };
        // A message over a limit: the body ends with it, and what is left of the response is
        // dropped unread (which blames no target).
        this.inner.set(None);
        *this.limits = None;
        drop(entered);
        this.trace.end(over.code());
        Poll::Ready(Some(Err(over)))
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

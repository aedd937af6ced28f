use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use endpoint_state::{
    BoxError, BreakerState, ClassifiedBody, ConfigError, EndpointCard, HasCard, PassiveCheck,
    PassiveGate, PassiveOpened,
};
use tokio::sync::futures::OwnedNotified;
use tokio::time::Instant;
use tower_service::Service;

use crate::config::{BreakerConfig, WhenOpen};
use crate::error::BreakerOpen;
use crate::future::{Recorder, ResponseFuture};
use crate::handle::BreakerHandle;
use crate::state::{Permit, Shared};
use crate::word::Mode;

/// A circuit breaker over one endpoint's service (typically a tonic `Channel`), at the HTTP
/// level: it reads every call's gRPC outcome and decides admission in `poll_ready`.
///
/// * **Closed**: calls pass and their outcomes are counted.
/// * **Open**: `poll_ready` is `Pending` until the open period ends (a timer wakes the task
///   then) — or, in fail-fast mode, ready with a call that fails with [`BreakerOpen`]. An open
///   breaker is a *passive* signal: when the endpoint's card belongs to a
///   [`Peers`](endpoint_state::Peers) set (a quarantine group's, or a balancer's) and no peer
///   is eligible, calls are admitted anyway — passive signals never empty the choice — and a
///   success of such a call closes the breaker.
/// * **Half-open**: `poll_ready` takes one of the bounded probe permits and holds it; `call`
///   hands it to the call, whose outcome decides. A service, response future or body dropped
///   before the outcome gives its permit back. A service never holds two permits.
///
/// `poll_ready` never returns an error of its own: an open breaker is a transient condition,
/// and tower treats an `Err` from `poll_ready` as final. Errors of the inner service pass
/// through. A clone shares the breaker and starts unready. A call admitted just before a
/// transition (readiness is a snapshot) still goes out, but its outcome is not counted in the
/// new state.
pub struct Breaker<S> {
    inner: S,
    shared: Arc<Shared>,
    gate: PassiveGate,
    permit_wait: Option<Pin<Box<OwnedNotified>>>,
    admission: Option<Admission>,
}

/// What `poll_ready` decided for the next `call`.
#[derive(Debug)]
enum Admission {
    /// Closed: pass and count the outcome in this generation.
    Counted { generation: u64 },
    /// Disabled: pass, count nothing.
    Uncounted,
    /// Half-open: pass with this probe permit.
    Probe(Permit),
    /// Open, but no peer is eligible: pass (passive signals never empty the choice); a
    /// success closes the breaker.
    Degraded { generation: u64 },
    /// Fail fast: refuse the call.
    Refuse { state: BreakerState },
}

impl<S> Breaker<S> {
    /// A breaker of its own over `inner` (the same as `BreakerLayer::new(card, config)?.layer(inner)`).
    pub fn new(inner: S, card: EndpointCard, config: BreakerConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Breaker::from_shared(
            inner,
            Arc::new(Shared::new(card, config)),
        ))
    }

    pub(crate) fn from_shared(inner: S, shared: Arc<Shared>) -> Self {
        Breaker {
            inner,
            gate: PassiveGate::new(shared.card.clone()),
            shared,
            permit_wait: None,
            admission: None,
        }
    }

    /// The operator's handle on this breaker.
    pub fn handle(&self) -> BreakerHandle {
        BreakerHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the service (a held permit goes back to the breaker).
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// Decides admission: `Ready` with a decision, or `Pending` with the task's waker on the
    /// card (every transition), the open period's timer and, while half-open with every
    /// permit taken, the breaker's permit-release notification.
    fn admit(&mut self, cx: &mut Context<'_>) -> Poll<Admission> {
        loop {
            let w = self.shared.load();
            let refused = match w.mode() {
                Mode::Closed => {
                    return Poll::Ready(Admission::Counted {
                        generation: w.generation(),
                    });
                }
                Mode::Disabled => return Poll::Ready(Admission::Uncounted),
                Mode::HalfOpen => {
                    if let Some(permit) = self.shared.try_take_permit(w) {
                        self.permit_wait = None;
                        return Poll::Ready(Admission::Probe(permit));
                    }
                    BreakerState::HalfOpen
                }
                Mode::Open => {
                    let until = self.shared.open_until();
                    if Instant::now() >= until {
                        self.shared.begin_half_open(w.generation());
                        continue;
                    }
                    BreakerState::Open { until }
                }
                Mode::ForcedOpen => BreakerState::ForcedOpen,
            };

            if self.shared.config.when_open == WhenOpen::FailFast {
                self.permit_wait = None;
                if matches!(refused, BreakerState::Open { .. })
                    && self.shared.card.admission() == endpoint_state::Admission::Degraded
                {
                    return Poll::Ready(Admission::Degraded {
                        generation: w.generation(),
                    });
                }
                return Poll::Ready(Admission::Refuse { state: refused });
            }

            if w.mode() == Mode::HalfOpen && self.permit_wait.is_none() {
                // Subscribe to permit releases, then look again: a release between the look
                // above and the subscription is seen by the next look.
                self.permit_wait = Some(Box::pin(
                    Arc::clone(&self.shared.permits_freed).notified_owned(),
                ));
                continue;
            }

            let shared = &self.shared;
            match self.gate.poll_open(cx, |_| gate_check(shared)) {
                Poll::Ready(PassiveOpened::Degraded) => {
                    let now = self.shared.load();
                    if now.mode() == Mode::Open {
                        self.permit_wait = None;
                        return Poll::Ready(Admission::Degraded {
                            generation: now.generation(),
                        });
                    }
                    continue;
                }
                // The state changed, or the open period is over.
                Poll::Ready(_) => continue,
                Poll::Pending => {}
            }
            if let Some(wait) = &mut self.permit_wait
                && wait.as_mut().poll(cx).is_ready()
            {
                self.permit_wait = None;
                continue;
            }
            tracing::trace!(target = %self.shared.card.target(), state = %refused, "breaker: waiting");
            return Poll::Pending;
        }
    }
}

/// The gate's view of the breaker's word: what would let a waiter try again. An open period
/// is a passive signal: the gate admits the call anyway when no peer is eligible.
fn gate_check(shared: &Shared) -> PassiveCheck {
    let w = shared.load();
    match w.mode() {
        Mode::Closed | Mode::Disabled => PassiveCheck::Open,
        Mode::HalfOpen if w.permits() > 0 => PassiveCheck::Open,
        Mode::HalfOpen | Mode::ForcedOpen => PassiveCheck::Shut,
        Mode::Open => PassiveCheck::Passive(Some(shared.open_until())),
    }
}

impl<S, ReqB, ResB> Service<http::Request<ReqB>> for Breaker<S>
where
    S: Service<http::Request<ReqB>, Response = http::Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<ClassifiedBody<ResB, Recorder>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // A permit still current is kept: never take a second one. Anything else is decided
        // afresh (a stale permit, from a half-open period that is over, is dropped here).
        let keep = matches!(&self.admission, Some(Admission::Probe(p)) if p.is_current());
        if !keep {
            self.admission = None;
            let admission = ready!(self.admit(cx));
            self.admission = Some(admission);
        }
        if let Some(Admission::Refuse { .. }) = self.admission {
            return Poll::Ready(Ok(()));
        }
        match self.inner.poll_ready(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(())),
            Poll::Ready(Err(e)) => {
                self.admission = None;
                Poll::Ready(Err(e.into()))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        let admission = self
            .admission
            .take()
            .expect("Breaker::call without a ready poll_ready (call poll_ready first)");
        match admission {
            Admission::Counted { generation } => {
                let recorder = Recorder::closed(Arc::clone(&self.shared), generation);
                ResponseFuture::called(self.inner.call(req), Some(recorder))
            }
            Admission::Uncounted => ResponseFuture::called(self.inner.call(req), None),
            Admission::Probe(permit) => {
                let recorder = Recorder::probe(permit);
                ResponseFuture::called(self.inner.call(req), Some(recorder))
            }
            Admission::Degraded { generation } => {
                tracing::debug!(
                    target = %self.shared.card.target(),
                    "breaker: open, but no peer is eligible; call admitted"
                );
                let recorder = Recorder::degraded(Arc::clone(&self.shared), generation);
                ResponseFuture::called(self.inner.call(req), Some(recorder))
            }
            Admission::Refuse { state } => {
                let error = BreakerOpen::new(
                    self.shared.card.target_arc(),
                    state,
                    Instant::now(),
                    self.shared.card.breaker().reason.clone(),
                );
                tracing::debug!(target = %self.shared.card.target(), %error, "breaker: call refused");
                ResponseFuture::refused(error)
            }
        }
    }
}

impl<S: Clone> Clone for Breaker<S> {
    /// The same breaker over a clone of the inner service; the clone starts unready.
    fn clone(&self) -> Self {
        Breaker::from_shared(self.inner.clone(), Arc::clone(&self.shared))
    }
}

impl<S: fmt::Debug> fmt::Debug for Breaker<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("breaker", &self.shared)
            .field("admission", &self.admission)
            .field("inner", &self.inner)
            .finish()
    }
}

impl<S> HasCard for Breaker<S> {
    fn card(&self) -> Option<&EndpointCard> {
        Some(&self.shared.card)
    }
}

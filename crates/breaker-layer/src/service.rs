use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use endpoint_state::{
    BoxError, BreakerState, ClassifiedBody, ConfigError, EndpointCard, HasCard, PassiveCheck,
    PassiveGate, PassiveOpened,
};
use tokio::time::Instant;
use tower_service::Service;

use crate::config::{BreakerConfig, WhenOpen};
use crate::error::BreakerOpen;
use crate::future::{Recorder, ResponseFuture};
use crate::handle::BreakerHandle;
use crate::state::{Permit, Shared};
use crate::word::{Mode, Word};

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
///   before the outcome gives its permit back. A service never holds two permits. While every
///   permit is taken (a probe that is a long stream holds its permit until its trailers) the
///   card says so ([`BreakerState::HalfOpen`] `{ busy: true }`): the endpoint is not eligible,
///   and nobody queues for the permit — like an open breaker, it is a passive signal: calls go
///   to eligible peers, or are admitted anyway (without a permit) when no peer is eligible.
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
    /// Open, or half-open with every permit taken, but no peer is eligible: pass (passive
    /// signals never empty the choice) without a permit; a success closes the breaker.
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
    /// card (every transition, and every permit given back while half-open), the open
    /// period's timer, and the witness peer that takes the calls meanwhile.
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
                        return Poll::Ready(Admission::Probe(permit));
                    }
                    BreakerState::HalfOpen { busy: true }
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
                if refused != BreakerState::ForcedOpen
                    && self.shared.card.admission() == endpoint_state::Admission::Degraded
                {
                    return Poll::Ready(Admission::Degraded {
                        generation: w.generation(),
                    });
                }
                return Poll::Ready(Admission::Refuse { state: refused });
            }

            let shared = &self.shared;
            match self.gate.poll_open(cx, |_| gate_check(shared)) {
                Poll::Ready(PassiveOpened::Degraded) => {
                    let now = self.shared.load();
                    if passively_shut(now) {
                        return Poll::Ready(Admission::Degraded {
                            generation: now.generation(),
                        });
                    }
                    continue;
                }
                // The state changed, a permit is free, or the open period is over.
                Poll::Ready(_) => continue,
                Poll::Pending => {}
            }
            tracing::trace!(backend = %self.shared.card.target(), state = %refused, "waiting");
            return Poll::Pending;
        }
    }
}

/// Whether the word shuts calls out by a passive signal: open, or half-open with every probe
/// permit taken (a long stream may hold its permit for minutes: the calls go elsewhere, or
/// are admitted anyway when no peer is eligible).
fn passively_shut(w: Word) -> bool {
    match w.mode() {
        Mode::Open => true,
        Mode::HalfOpen => w.permits() == 0,
        _ => false,
    }
}

/// The gate's view of the breaker's word: what would let a waiter try again. An open period
/// and a half-open breaker with every permit taken are passive signals: the gate admits the
/// call anyway when no peer is eligible.
fn gate_check(shared: &Shared) -> PassiveCheck {
    let w = shared.load();
    match w.mode() {
        Mode::Closed | Mode::Disabled => PassiveCheck::Open,
        Mode::HalfOpen if w.permits() > 0 => PassiveCheck::Open,
        Mode::HalfOpen => PassiveCheck::Passive(None),
        Mode::ForcedOpen => PassiveCheck::Shut,
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
                    backend = %self.shared.card.target(),
                    "open, but no peer is eligible; call admitted"
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
                tracing::debug!(backend = %self.shared.card.target(), %error, "call refused");
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

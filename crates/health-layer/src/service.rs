//! `Health<S>`: a readiness gate on the card's health line.

use std::fmt;
use std::task::{Context, Poll, ready};

use endpoint_state::{EndpointCard, Gate, GateCheck, HasCard};
use tower_service::Service;

/// A service that is ready only while its endpoint's health verdict admits calls.
///
/// `poll_ready` returns `Pending` while the card says unknown or unhealthy, with a waker that
/// fires when the card changes (never an error: an unhealthy endpoint is a transient
/// condition, and tower treats an `Err` from `poll_ready` as final). Once open it is exactly the
/// inner service: same response, same future, same error. A clone starts unready.
pub struct Health<S> {
    inner: S,
    gate: Gate,
}

impl<S> Health<S> {
    /// Gates `inner` on `card`'s health line.
    pub fn new(inner: S, card: EndpointCard) -> Self {
        Health {
            inner,
            gate: Gate::new(card),
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone> Clone for Health<S> {
    fn clone(&self) -> Self {
        Health {
            inner: self.inner.clone(),
            // A fresh gate: the clone has reserved nothing and starts unready.
            gate: self.gate.clone(),
        }
    }
}

impl<S> fmt::Debug for Health<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let card = self.gate.card();
        f.debug_struct("Health")
            .field("target", &card.target())
            .field("verdict", &card.health_verdict())
            .finish_non_exhaustive()
    }
}

fn health_line(card: &EndpointCard) -> GateCheck {
    if card.health_admits() {
        GateCheck::Open
    } else {
        GateCheck::Shut
    }
}

impl<S, R> Service<R> for Health<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        ready!(self.gate.poll_open(cx, health_line));
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> S::Future {
        self.inner.call(req)
    }
}

impl<S> HasCard for Health<S> {
    fn card(&self) -> Option<&EndpointCard> {
        Some(self.gate.card())
    }
}

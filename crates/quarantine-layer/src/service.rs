//! The service: a readiness gate on the quarantine line, and classification of every call.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use endpoint_state::{BoxError, EndpointCard, HasCard, PassiveCheck, PassiveGate, PassiveOpened};
use tokio::time::Instant;
use tower_service::Service;

use crate::future::{RecordOutcome, ResponseBody, ResponseFuture};
use crate::group::{Binding, QuarantineGroup};

/// One endpoint's service under quarantine (made by a `QuarantineLayer`, or [`Quarantine::new`]).
///
/// `poll_ready` is `Pending` while the endpoint is quarantined and another member of its group
/// is eligible, and wakes when the quarantine ends (one reused timer), when its card changes,
/// or when the last eligible peer stops being eligible or leaves the group — then quarantine
/// is ignored and it is ready. It is never an `Err` for quarantine. Every call is classified
/// (service error, trailers-only headers, trailers) and its outcome handed to the group.
///
/// A clone starts unready (its own gate); the layer holds no permit, so dropping a service or
/// a response future releases nothing but its subscriptions.
pub struct Quarantine<S> {
    inner: S,
    binding: Arc<Binding>,
    /// Shut while quarantined and an eligible peer takes the calls.
    gate: PassiveGate,
    /// What the last successful `poll_ready` decided, for the next `call`.
    admission: Option<Admission>,
}

#[derive(Debug, Clone, Copy)]
enum Admission {
    /// Not quarantined.
    Normal,
    /// Quarantined until the instant, but no other member was eligible: quarantine ignored.
    Degraded(Instant),
}

impl<S> Quarantine<S> {
    /// Wraps `inner`, the service of the endpoint whose card is `card`, in `group` (the card
    /// is added to the group if it is not a member yet).
    pub fn new(inner: S, group: &QuarantineGroup, card: EndpointCard) -> Self {
        Quarantine::from_binding(inner, group.bind(card))
    }

    pub(crate) fn from_binding(inner: S, binding: Arc<Binding>) -> Self {
        Quarantine {
            inner,
            gate: PassiveGate::new(binding.card().clone()),
            binding,
            admission: None,
        }
    }

    /// The endpoint's card.
    pub fn card(&self) -> &EndpointCard {
        self.binding.card()
    }

    /// The group the endpoint belongs to.
    pub fn group(&self) -> QuarantineGroup {
        self.binding.group()
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// `Ready` once quarantine admits calls; see the type's docs.
    fn poll_admitted(&mut self, cx: &mut Context<'_>) -> Poll<Admission> {
        let mut until = None;
        let opened = std::task::ready!(self.gate.poll_open(cx, |card| {
            until = card
                .quarantine_state()
                .until
                .filter(|u| *u > Instant::now());
            match until {
                Some(at) => PassiveCheck::Passive(Some(at)),
                None => PassiveCheck::Open,
            }
        }));
        Poll::Ready(match (opened, until) {
            (PassiveOpened::Degraded, Some(until)) => Admission::Degraded(until),
            _ => Admission::Normal,
        })
    }
}

impl<S: Clone> Clone for Quarantine<S> {
    /// A clone starts unready, with its own (fresh) gate.
    fn clone(&self) -> Self {
        Quarantine {
            inner: self.inner.clone(),
            binding: self.binding.clone(),
            gate: self.gate.clone(),
            admission: None,
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Quarantine<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quarantine")
            .field("target", &self.binding.card().target())
            .field("gate", &self.gate)
            .field("admission", &self.admission)
            .field("inner", &self.inner)
            .finish()
    }
}

impl<S> HasCard for Quarantine<S> {
    fn card(&self) -> Option<&EndpointCard> {
        Some(self.binding.card())
    }
}

impl<S, ReqB, ResB> Service<http::Request<ReqB>> for Quarantine<S>
where
    S: Service<http::Request<ReqB>, Response = http::Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<ResponseBody<ResB>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let admission = std::task::ready!(self.poll_admitted(cx));
        self.admission = Some(admission);
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        let degraded = match self.admission.take() {
            Some(Admission::Degraded(until)) => Some(until),
            Some(Admission::Normal) | None => None,
        };
        ResponseFuture::new(
            self.inner.call(req),
            Some(RecordOutcome::new(self.binding.clone(), degraded)),
        )
    }
}

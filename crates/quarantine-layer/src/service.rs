//! The service: a readiness gate on the quarantine line, and classification of every call.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use endpoint_state::classify::BoxError;
use endpoint_state::{Changed, EndpointCard, Gate, HasCard};
use tokio::sync::futures::OwnedNotified;
use tokio::time::Instant;
use tower_service::Service;

use crate::future::{RecordOutcome, ResponseBody, ResponseFuture};
use crate::group::{Binding, CheckOut, QuarantineGroup};

/// One endpoint's service under quarantine (made by [`QuarantineLayer`](crate::QuarantineLayer)).
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
    gate: Gate,
    /// While shut: the eligible peer that keeps this endpoint shut, watched for changes.
    watch: Option<Watch>,
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

/// The subscriptions of a shut endpoint besides its own card and timer (those are the gate's).
struct Watch {
    witness: EndpointCard,
    version: u64,
    witness_changed: Changed,
    member_left: Pin<Box<OwnedNotified>>,
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
            gate: Gate::new(binding.card().clone()),
            binding,
            watch: None,
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
        loop {
            let Quarantine {
                gate,
                binding,
                watch,
                ..
            } = self;
            let group = &binding.group;
            let mut out = CheckOut::default();
            let hint = watch.as_ref().map(|w| (&w.witness, w.version));
            if gate
                .poll_open(cx, |card| group.check(card, hint, &mut out))
                .is_ready()
            {
                *watch = None;
                return Poll::Ready(match out.degraded {
                    Some(until) => Admission::Degraded(until),
                    None => Admission::Normal,
                });
            }
            // Shut: the gate waits on the card and the quarantine's end. Wait also on the peer
            // that keeps it shut, and on members leaving: when the last eligible peer goes,
            // quarantine is ignored.
            let (witness, version) = out
                .witness
                .take()
                .expect("the check shuts the gate only with an eligible peer");
            let same = watch
                .as_ref()
                .is_some_and(|w| w.version == version && w.witness.same_card(&witness));
            if !same {
                let w = watch.insert(Watch {
                    witness_changed: witness.changed(),
                    member_left: Box::pin(group.member_left()),
                    witness,
                    version,
                });
                // Subscribed; look again, so that a change in between is not lost.
                if !group.witness_holds(&w.witness, w.version) {
                    continue;
                }
            }
            let w = watch.as_mut().expect("watching while shut");
            if Pin::new(&mut w.witness_changed).poll(cx).is_ready()
                || w.member_left.as_mut().poll(cx).is_ready()
            {
                *watch = None;
                continue;
            }
            return Poll::Pending;
        }
    }
}

impl<S: Clone> Clone for Quarantine<S> {
    /// A clone starts unready, with its own (fresh) gate.
    fn clone(&self) -> Self {
        Quarantine {
            inner: self.inner.clone(),
            binding: self.binding.clone(),
            gate: self.gate.clone(),
            watch: None,
            admission: None,
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Quarantine<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quarantine")
            .field("target", &self.binding.card().target())
            .field("gate", &self.gate)
            .field(
                "kept_shut_by",
                &self.watch.as_ref().map(|w| w.witness.target()),
            )
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

//! The balancer's response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use endpoint_state::time;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::BalanceConfig;
use crate::deadline::{RequestDeadline, waits_for_ready};
use crate::dispatch::{Dispatch, Dispatched};
use crate::error::BoxError;
use crate::hash::RequestHashKey;
use crate::picker::{Picked, Picker, Reserved, Taken};
use crate::shared::{Endpoint, Kind, Owner, Shared};

pin_project! {
    /// The response future of [`Balance`](crate::Balance): the chosen endpoint's own future,
    /// or — with wait-for-ready while nothing is eligible — a wait for an eligible endpoint
    /// followed by its future, or an immediate
    /// [`NoHealthyTargets`](crate::error::NoHealthyTargets). Under
    /// [`Strategy::RingHash`](crate::Strategy::RingHash) it first waits for the endpoint
    /// the request's hash chose to be ready, then sends the request there.
    ///
    /// Dropping it releases what it holds (the endpoint's in-flight count, a reserved
    /// endpoint while waiting).
    pub struct ResponseFuture<K, S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<K, S, Req>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<K, S, Req>
    where
        S: Service<Req>,
    {
        Called {
            #[pin]
            future: S::Future,
            load: Option<Load<K, S>>,
        },
        Waiting {
            waiter: Box<Waiter<K, S, Req>>,
        },
        // Boxed (and only made when the chosen endpoint is not ready at once): the request and
        // a reserved service inline would make every call's future, whatever its strategy,
        // hundreds of bytes larger, moved with every call.
        Hashed {
            dispatch: Box<Dispatch<K, S, Req>>,
            owner: Arc<Owner<K, S>>,
        },
        Failed {
            error: Option<BoxError>,
        },
    }
}

impl<K, S, Req> fmt::Debug for ResponseFuture<K, S, Req>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Called { .. } => "called",
            State::Waiting { .. } => "waiting for an eligible endpoint",
            State::Hashed { .. } => "waiting for the endpoint of the request's hash",
            State::Failed { .. } => "failed",
        };
        let mut f = f.debug_struct("ResponseFuture");
        f.field("state", &state);
        if let State::Hashed { dispatch, .. } = &self.state {
            f.field("endpoint", &dispatch.chosen());
        }
        f.finish()
    }
}

/// Counts a call in flight on its endpoint (least-loaded strategies) and, for peak-EWMA,
/// times it.
struct Load<K, S> {
    endpoint: Arc<Endpoint<K, S>>,
    /// The balancer's state and the start time, when the latency is measured.
    timed: Option<(Arc<Shared<K, S>>, u64)>,
}

impl<K, S> Load<K, S> {
    /// Counts a call just made on `endpoint` (kept, for the count down, by the future).
    fn start(shared: &Arc<Shared<K, S>>, endpoint: Arc<Endpoint<K, S>>) -> Option<Self> {
        let kind = shared.settings.kind;
        if !kind.tracks_load() {
            return None;
        }
        endpoint.start_call();
        let timed =
            (kind == crate::shared::Kind::PeakEwma).then(|| (shared.clone(), shared.nanos_now()));
        Some(Load { endpoint, timed })
    }

    fn finish(self) {
        if let Some((shared, started)) = &self.timed {
            let now = shared.nanos_now();
            self.endpoint
                .observe_rtt(now.saturating_sub(*started) as f64, now, &shared.settings);
        }
    }
}

impl<K, S> Drop for Load<K, S> {
    fn drop(&mut self) {
        self.endpoint.end_call();
    }
}

/// Why a call made while nothing was eligible waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Wait-for-ready: for any endpoint to become eligible, up to the deadline.
    ForReady,
    /// Targets are connecting (no health verdict yet): for the first verdicts, up to the
    /// deadline and `connecting_wait`; it fails as soon as nothing is connecting any more.
    Connecting,
    /// `poll_ready` found nothing eligible, but something is by the time of `call` (the first
    /// verdicts landed in between): it picks again, as `poll_ready` would have, up to the
    /// deadline (or the default bound of a call without one); it fails as soon as nothing is
    /// eligible or connecting.
    Repick,
}

/// A call made while nothing was eligible, waiting for an endpoint.
struct Waiter<K, S, Req> {
    picker: Picker<K, S>,
    /// Keeps the balancer's discovery running while the call waits.
    owner: Arc<Owner<K, S>>,
    req: Option<Req>,
    deadline: Option<Pin<Box<Sleep>>>,
    /// Whether the deadline is the request's own (rather than `max_wait`).
    caller_deadline: bool,
    /// The request's own budget, if it carried one: the request goes on with what is left.
    budget: Option<Duration>,
    /// Writes what is left of the budget into the request.
    set_budget: fn(&mut Req, Duration),
    started: Instant,
    wait: Wait,
    /// Ring hash: the request's hash.
    hash: u64,
}

impl<K, S, Req> ResponseFuture<K, S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    /// Calls the reserved endpoint's service, and gives the service back to its endpoint
    /// (unready, for the endpoint's next pick).
    pub(crate) fn called(shared: &Arc<Shared<K, S>>, reserved: Reserved<K, S>, req: Req) -> Self {
        let Reserved {
            endpoint,
            mut service,
            ..
        } = reserved;
        let future = service.call(req);
        endpoint.give_back(service);
        ResponseFuture {
            state: State::Called {
                future,
                load: Load::start(shared, endpoint),
            },
        }
    }

    fn call_state(
        shared: &Arc<Shared<K, S>>,
        reserved: Reserved<K, S>,
        req: Req,
    ) -> State<K, S, Req> {
        let Reserved {
            endpoint,
            mut service,
            ..
        } = reserved;
        State::Called {
            future: service.call(req),
            load: Load::start(shared, endpoint),
        }
    }

    /// A ring-hash call: the endpoint for `hash` is chosen and, when it is ready at once (the
    /// common case), called now; otherwise the future waits for it (and allocates for that).
    pub(crate) fn hashed(
        shared: Arc<Shared<K, S>>,
        owner: Arc<Owner<K, S>>,
        hash: u64,
        avoid: Vec<Arc<str>>,
        req: Req,
    ) -> Self
    where
        S: Clone,
        Req: RequestDeadline + RequestHashKey,
    {
        let mut dispatch = Dispatch::new(shared, hash, avoid, req);
        // A no-op waker: a dispatch that has to wait is polled again, with the caller's
        // waker, by this future (every poll registers the waker it is given).
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let state = match dispatch.poll(&mut cx) {
            Poll::Ready(Dispatched::Called { future, endpoint }) => State::Called {
                load: Load::start(&dispatch.shared, endpoint),
                future,
            },
            Poll::Ready(Dispatched::Nothing(req)) => {
                Self::nothing_eligible(&dispatch.shared, &owner, req).state
            }
            Poll::Pending => State::Hashed {
                dispatch: Box::new(dispatch),
                owner,
            },
        };
        ResponseFuture { state }
    }

    /// A call that found nothing eligible: it waits (with wait-for-ready, or while targets are
    /// connecting) or fails at once with `NoHealthyTargets`.
    pub(crate) fn nothing_eligible(
        shared: &Arc<Shared<K, S>>,
        owner: &Arc<Owner<K, S>>,
        req: Req,
    ) -> Self
    where
        Req: RequestDeadline + RequestHashKey,
    {
        let settings = &shared.settings;
        let snapshot = shared.snapshot.load();
        if waits_for_ready(&req, settings.wait_for_ready) {
            Self::waiting(shared.clone(), owner.clone(), req, Wait::ForReady)
        } else if !snapshot.picks.is_empty() || snapshot.any_admits_now() {
            // Decided on an older set: something is eligible now.
            Self::waiting(shared.clone(), owner.clone(), req, Wait::Repick)
        } else if !settings.connecting_wait.is_zero() && snapshot.connecting {
            Self::waiting(shared.clone(), owner.clone(), req, Wait::Connecting)
        } else {
            Self::failed(snapshot.no_healthy_targets(None, false).into())
        }
    }

    pub(crate) fn failed(error: BoxError) -> Self {
        ResponseFuture {
            state: State::Failed { error: Some(error) },
        }
    }

    pub(crate) fn waiting(
        shared: Arc<Shared<K, S>>,
        owner: Arc<Owner<K, S>>,
        req: Req,
        wait: Wait,
    ) -> Self
    where
        Req: RequestDeadline + RequestHashKey,
    {
        let started = Instant::now();
        let budget = req.time_budget();
        let cap = match wait {
            // Without a cap, a call's own deadline bounds its wait; a call without one
            // waits the default bound, never forever.
            Wait::ForReady | Wait::Repick => match (shared.settings.max_wait, budget) {
                (None, None) => Some(BalanceConfig::DEFAULT_MAX_WAIT),
                (cap, _) => cap,
            },
            Wait::Connecting => Some(shared.settings.connecting_wait),
        };
        let (limit, caller_deadline) = match (budget, cap) {
            (Some(b), Some(m)) if m < b => (Some(m), false),
            (Some(b), _) => (Some(b), true),
            (None, m) => (m, false),
        };
        // A limit too far to represent ends in the far future: no limit in practice.
        let deadline = limit.map(|d| Box::pin(tokio::time::sleep_until(time::after(d))));
        tracing::debug!(limit = ?limit, ?wait, "nothing eligible; waiting");
        let mut picker = Picker::new(shared);
        let hash = if picker.shared.settings.kind == Kind::RingHash {
            req.request_hash(picker.shared.settings.hash_header.as_ref())
                .unwrap_or_else(|| picker.random_hash())
        } else {
            0
        };
        ResponseFuture {
            state: State::Waiting {
                waiter: Box::new(Waiter {
                    picker,
                    owner,
                    req: Some(req),
                    deadline,
                    caller_deadline,
                    budget,
                    set_budget: <Req as RequestDeadline>::set_time_budget,
                    started,
                    wait,
                    hash,
                }),
            },
        }
    }
}

impl<K, S, Req> Future for ResponseFuture<K, S, Req>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    Req: RequestDeadline + RequestHashKey,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Called { future, load } => {
                    let output = ready!(future.poll(cx));
                    if let Some(load) = load.take() {
                        load.finish();
                    }
                    return Poll::Ready(output.map_err(Into::into));
                }
                StateProj::Failed { error } => {
                    return Poll::Ready(Err(error
                        .take()
                        .expect("ResponseFuture polled after completion")));
                }
                StateProj::Hashed { dispatch, owner } => {
                    let next = match ready!(dispatch.poll(cx)) {
                        Dispatched::Called { future, endpoint } => State::Called {
                            load: Load::start(&dispatch.shared, endpoint),
                            future,
                        },
                        // Every endpoint stopped being eligible while the call waited for
                        // its own: as for a call that found nothing eligible.
                        Dispatched::Nothing(req) => {
                            Self::nothing_eligible(&dispatch.shared, owner, req).state
                        }
                    };
                    this.state.set(next);
                }
                StateProj::Waiting { waiter } => {
                    ready!(waiter.poll_endpoint(cx))?;
                    let mut req = waiter.req.take().expect("request taken once");
                    let reserved = match waiter.picker.take() {
                        Taken::Endpoint(reserved) => reserved,
                        Taken::Deferred => {
                            // Ring hash: something is eligible now; the request's hash chooses.
                            if let Some(budget) = waiter.budget {
                                let left = budget.saturating_sub(waiter.started.elapsed());
                                (waiter.set_budget)(&mut req, left);
                            }
                            let shared = waiter.picker.shared.clone();
                            let avoid = waiter.picker.avoided().to_vec();
                            let next = State::Hashed {
                                dispatch: Box::new(Dispatch::new(shared, waiter.hash, avoid, req)),
                                owner: waiter.owner.clone(),
                            };
                            this.state.set(next);
                            continue;
                        }
                        _ => unreachable!(
                            "poll_endpoint returned Ready(Ok) with an endpoint reserved"
                        ),
                    };
                    if let Some(budget) = waiter.budget {
                        // The wait spent part of the caller's deadline: the request carries
                        // what is left, not the whole of it again.
                        let left = budget.saturating_sub(waiter.started.elapsed());
                        (waiter.set_budget)(&mut req, left);
                    }
                    let shared = waiter.picker.shared.clone();
                    tracing::debug!(
                        backend = %reserved.endpoint.name,
                        waited = ?waiter.started.elapsed(),
                        "an endpoint became eligible; the waiting call proceeds"
                    );
                    let next = Self::call_state(&shared, reserved, req);
                    this.state.set(next);
                }
            }
        }
    }
}

impl<K, S, Req> Waiter<K, S, Req> {
    /// `Ready(Ok)` once an endpoint is reserved and ready; `Err` at the deadline.
    fn poll_endpoint(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>>
    where
        S: Service<Req> + Clone,
        S::Error: Into<BoxError>,
    {
        loop {
            match self.picker.poll_pick::<Req>(cx) {
                Poll::Ready(Ok(Picked::Endpoint)) => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(Picked::Nothing)) => {
                    if self.wait != Wait::ForReady {
                        let snapshot = self.picker.shared.snapshot.load();
                        if snapshot.generation == self.picker.seen && !snapshot.connecting {
                            // Every target has a verdict now, and none admits the call.
                            let error =
                                snapshot.no_healthy_targets(Some(self.started.elapsed()), false);
                            tracing::debug!(%error, "targets connected; none eligible");
                            return Poll::Ready(Err(error.into()));
                        }
                    }
                    if self.picker.poll_set_change(cx).is_ready() {
                        continue;
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {}
            }
            if let Some(deadline) = &mut self.deadline
                && deadline.as_mut().poll(cx).is_ready()
            {
                let waited: Duration = self.started.elapsed();
                let error = self
                    .picker
                    .shared
                    .snapshot
                    .load()
                    .no_healthy_targets(Some(waited), self.caller_deadline);
                tracing::debug!(%error, "wait for ready ran out");
                return Poll::Ready(Err(error.into()));
            }
            return Poll::Pending;
        }
    }
}

//! The kit's channel: the balancer, as a generated client takes it.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use balance_layer::Balance;
use tower_service::Service;

use crate::error::{BoxError, KitShutDown};
use crate::future::{ResponseBody, ResponseFuture};
use crate::hedge::Hedge;
use crate::life::Life;
use crate::observe::CallGuard;
use crate::policy::CallPolicy;
use crate::retry::{Retrier, Unsent};
use crate::stack::{Deadline, KitDiscover, Request};

/// The kit's channel: give it to a generated client like a tonic `Channel`
/// (`GreeterClient::new(kit.channel())`).
///
/// Cheap to clone, and every clone shares the kit's balancer: `poll_ready` picks an eligible,
/// ready target (in O(1)) and reserves it, `call` sends the request there — no `Buffer`, no
/// worker task between the caller and the target's connection. A clone starts unready.
///
/// **A call's deadline bounds its whole life in the kit.** `poll_ready` does not wait: when
/// no eligible target is ready at once (every one it tried is busy, or a half-open breaker's
/// probe permits are all taken), it is ready anyway and the call waits for a target inside its
/// response future, where its deadline (`grpc-timeout`, which tonic's `Request::set_timeout`
/// sets) is known. From then on the deadline holds everywhere: waiting for a target, waiting
/// for an eligible one (wait-for-ready, connecting), connecting to it (which tonic's own timer
/// does not cover), its response and its body. When it passes, the call fails with
/// `DEADLINE_EXCEEDED` naming the target(s) and where the call was (`deadline exceeded after
/// 300 ms waiting for http://10.0.0.7:50051: connecting`). A call sent on after waiting, or
/// sent again by the transparent retry, carries what is left of its deadline in its
/// `grpc-timeout`, never the whole of it again.
///
/// **Transparent retry** keeps a call's request body until the call ends, never longer, and
/// the request bytes all calls of a kit keep for it are capped at 64 MiB: a call beyond that
/// goes without transparent retry once its body is read.
///
/// Every error reaches the client as a proper gRPC status naming the target(s) (see
/// [`error`](crate::error)). Each channel is a handle on the kit: the kit keeps running while
/// any channel or kit handle lives.
pub struct KitChannel {
    balance: Balance<KitDiscover, Request>,
    life: Arc<Life>,
    /// What `poll_ready` left for `call`.
    next: Next,
    /// What this handle's calls keep for a transparent retry.
    retrier: Retrier,
}

/// What `poll_ready` decided for the next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Not polled since the last call: the call waits for a target in its future.
    Unready,
    /// The balancer reserved a ready target (or found none eligible): `call` goes to it.
    Reserved,
    /// The targets tried were not ready: the call takes the balancer handle, which waits for
    /// one in the call's future, bounded by its deadline.
    Wait,
    /// The kit is shut down: `call` refuses without touching the balancer.
    Refuse,
}

impl KitChannel {
    pub(crate) fn new(life: Arc<Life>) -> Self {
        KitChannel {
            balance: life.balance.clone(),
            life,
            next: Next::Unready,
            retrier: Retrier::default(),
        }
    }
}

impl Clone for KitChannel {
    fn clone(&self) -> Self {
        KitChannel::new(self.life.clone())
    }
}

impl fmt::Debug for KitChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KitChannel")
            .field("balance", &self.balance)
            .field("shut_down", &self.life.state.is_shut_down())
            .finish()
    }
}

impl Service<Request> for KitChannel {
    type Response = http::Response<ResponseBody>;
    type Error = BoxError;
    type Future = ResponseFuture;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.life.state.is_shut_down() {
            self.next = Next::Refuse;
            return Poll::Ready(Ok(()));
        }
        self.next = match self.balance.poll_ready(cx) {
            Poll::Ready(Ok(())) => Next::Reserved,
            Poll::Ready(Err(e)) => {
                return Poll::Ready(Err(crate::future::map_error(e, Some(&self.life.state))));
            }
            // Not without the call's deadline: the call's future waits.
            Poll::Pending => Next::Wait,
        };
        Poll::Ready(Ok(()))
    }

    #[inline]
    fn call(&mut self, mut req: Request) -> ResponseFuture {
        let next = std::mem::replace(&mut self.next, Next::Unready);
        // The call's options and its method's settings (deadline, wait-for-ready, message
        // limits), applied before anything else reads the request.
        let limits = crate::call_options::prepare(&mut req, self.life.calls.as_deref());
        let trace = CallGuard::new(self.life.registry.factory.observe.call(&req));
        if next == Next::Refuse {
            return ResponseFuture::refused(Box::new(KitShutDown::new()), trace);
        }
        // The method's retry policy (gRFC A6), if it has one: the call keeps its request to
        // send again, and names the targets its attempts went to.
        let policy = match &self.life.retries {
            Some(retries) => retries.for_call(req.uri().path()),
            None => None,
        };
        if policy.is_some()
            && let Some(trace) = trace.trace()
        {
            trace.defer(true);
        }
        let policy = match policy {
            Some(CallPolicy::Retry(attempts)) => Some(attempts),
            Some(CallPolicy::Hedge(hedging, throttle)) => {
                // The balancer handle (and the target it reserved, if any) takes the first
                // attempt; this handle starts afresh.
                let balance = std::mem::replace(&mut self.balance, self.life.balance.clone());
                let deadline = Deadline::of(&req);
                let hedge = Hedge::new(req, hedging, throttle, self.life.clone(), balance);
                return ResponseFuture::hedging(hedge, self.life.clone(), deadline, trace, limits);
            }
            None => None,
        };
        let retry = self.life.transparent_retry || policy.is_some();
        if next == Next::Reserved {
            let state = &self.life.state;
            // Only while something is amiss (DNS failing, shutting down) does a call carry the
            // kit's state, to explain an error: the common path clones nothing.
            let notes = state.has_notes().then(|| state.clone());
            if !retry {
                let mut req = req;
                trace.attach(&mut req);
                let inner = trace.in_span(|| self.balance.call(req));
                return ResponseFuture::called(inner, notes, None, None, trace, limits, None);
            }
            let deadline = Deadline::of(&req);
            let (mut req, unsent) = Unsent::split(req, &mut self.retrier, &self.life);
            trace.attach(&mut req);
            let inner = trace.in_span(|| self.balance.call(req));
            return ResponseFuture::called(
                inner,
                notes,
                Some(unsent),
                deadline,
                trace,
                limits,
                policy,
            );
        }
        // The balancer handle, waiting on the targets it tried, goes with the call; this
        // handle starts afresh.
        let balance = std::mem::replace(&mut self.balance, self.life.balance.clone());
        let (req, unsent) = if retry {
            let (req, unsent) = Unsent::split(req, &mut self.retrier, &self.life);
            (req, Some(unsent))
        } else {
            (req, None)
        };
        ResponseFuture::waiting(
            balance,
            req,
            self.life.clone(),
            unsent,
            trace,
            limits,
            policy,
        )
    }
}

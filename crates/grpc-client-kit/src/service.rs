//! The kit's channel: the balancer, as a generated client takes it.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use balance_layer::Balance;
use tower_service::Service;

use crate::error::{BoxError, KitShutDown};
use crate::future::{ResponseBody, ResponseFuture};
use crate::life::Life;
use crate::retry::{Retrier, Unsent};
use crate::stack::{KitDiscover, Request};

/// The kit's channel: give it to a generated client like a tonic `Channel`
/// (`GreeterClient::new(kit.channel())`).
///
/// Cheap to clone, and every clone shares the kit's balancer: `poll_ready` picks an eligible,
/// ready target (in O(1)) and reserves it, `call` sends the request there — no `Buffer`, no
/// worker task between the caller and the target's connection. A clone starts unready.
///
/// Every error reaches the client as a proper gRPC status naming the target(s) (see
/// [`error`](crate::error)). Each channel is a handle on the kit: the kit keeps running while
/// any channel or kit handle lives.
pub struct KitChannel {
    balance: Balance<KitDiscover, Request>,
    life: Arc<Life>,
    /// `poll_ready` saw the kit shut down: `call` refuses without touching the balancer.
    refuse: bool,
    /// What this handle's calls keep for a transparent retry.
    retrier: Retrier,
}

impl KitChannel {
    pub(crate) fn new(life: Arc<Life>) -> Self {
        KitChannel {
            balance: life.balance.clone(),
            life,
            refuse: false,
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
            self.refuse = true;
            return Poll::Ready(Ok(()));
        }
        self.balance
            .poll_ready(cx)
            .map_err(|e| crate::future::map_error(e, Some(&self.life.state)))
    }

    #[inline]
    fn call(&mut self, req: Request) -> ResponseFuture {
        if std::mem::take(&mut self.refuse) {
            return ResponseFuture::refused(Box::new(KitShutDown::new()));
        }
        let state = &self.life.state;
        // Only while something is amiss (DNS failing, shutting down) does a call carry the
        // kit's state, to explain an error: the common path clones nothing.
        let notes = state.has_notes().then(|| state.clone());
        if self.life.transparent_retry {
            let (req, unsent) = Unsent::split(req, &mut self.retrier, &self.life);
            ResponseFuture::called(self.balance.call(req), notes, Some(unsent))
        } else {
            ResponseFuture::called(self.balance.call(req), notes, None)
        }
    }
}

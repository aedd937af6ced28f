//! A ring-hash call between `call` and its endpoint: the endpoint chosen by the request's
//! hash, polled ready in the response future, then called.
//!
//! Ring hash cannot reserve an endpoint in `poll_ready`, which does not see the request: the
//! choice is made in `call`, and this waits for the chosen endpoint's readiness the way gRPC
//! queues a pick on a connecting subchannel. If the endpoint stops being eligible (or fails,
//! or is removed) meanwhile, the request goes to the next one on the ring for its hash.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use tokio::sync::futures::OwnedNotified;
use tower_service::Service;

use crate::error::BoxError;
use crate::picker::Reserved;
use crate::ring;
use crate::shared::{Endpoint, Shared};

/// What a dispatch comes to.
pub(crate) enum Dispatched<K, S, Req>
where
    S: Service<Req>,
{
    /// The request was sent to `endpoint`.
    Called {
        future: S::Future,
        endpoint: Arc<Endpoint<K, S>>,
    },
    /// Nothing is eligible any more: the request is handed back (to fail, or to wait).
    Nothing(Req),
}

/// A ring-hash call on its way to an endpoint.
pub(crate) struct Dispatch<K, S, Req> {
    pub(crate) shared: Arc<Shared<K, S>>,
    hash: u64,
    avoid: Vec<Arc<str>>,
    /// The endpoint chosen, with its own service.
    chosen: Option<Reserved<K, S>>,
    req: Option<Req>,
    /// The generation of the snapshot of the last choice, and a subscription to the next.
    seen: u64,
    listener: Option<Pin<Box<OwnedNotified>>>,
}

impl<K, S, Req> Dispatch<K, S, Req> {
    pub(crate) fn new(
        shared: Arc<Shared<K, S>>,
        hash: u64,
        avoid: Vec<Arc<str>>,
        req: Req,
    ) -> Self {
        Dispatch {
            shared,
            hash,
            avoid,
            chosen: None,
            req: Some(req),
            seen: 0,
            listener: None,
        }
    }

    /// The endpoint chosen, if any (for logs).
    pub(crate) fn chosen(&self) -> Option<&Arc<str>> {
        self.chosen.as_ref().map(|r| &r.endpoint.name)
    }

    /// Chooses (again) on the latest snapshot. `Ready(true)`: chosen; `Ready(false)`: nothing
    /// is eligible; `Pending`: the snapshot lags the cards, and the driver is rebuilding it.
    fn choose(&mut self, cx: &mut Context<'_>) -> Poll<bool>
    where
        S: Clone,
    {
        loop {
            let snap = self.shared.snapshot.load();
            self.seen = snap.generation;
            if let Some(endpoint) = ring::pick(&snap, self.hash, &self.avoid) {
                self.chosen = Some(Reserved {
                    endpoint: endpoint.clone(),
                    service: endpoint.service(),
                    ignoring_passive: snap.ignoring_passive,
                });
                return Poll::Ready(true);
            }
            if snap.picks.is_empty() && !snap.any_admits_now() {
                return Poll::Ready(false);
            }
            // Cards changed since the snapshot was built: have it rebuilt, and wait for it.
            drop(snap);
            self.shared.kick();
            ready!(
                self.shared
                    .poll_newer_than(self.seen, &mut self.listener, cx)
            );
        }
    }

    /// Sends the request once the chosen endpoint is ready.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Dispatched<K, S, Req>>
    where
        S: Service<Req> + Clone,
        S::Error: Into<BoxError>,
    {
        loop {
            if self.chosen.is_none() && !ready!(self.choose(cx)) {
                let req = self.req.take().expect("dispatch polled after completion");
                return Poll::Ready(Dispatched::Nothing(req));
            }
            let chosen = self.chosen.as_mut().expect("chosen above");
            if !chosen.endpoint.still_admits(chosen.ignoring_passive) {
                // Its card shut it (or it was removed) while the call waited: choose again.
                self.chosen = None;
                continue;
            }
            match chosen.service.poll_ready(cx) {
                Poll::Ready(Ok(())) => {
                    let Reserved {
                        endpoint,
                        mut service,
                        ..
                    } = self.chosen.take().expect("chosen above");
                    let req = self.req.take().expect("dispatch polled after completion");
                    let future = service.call(req);
                    endpoint.give_back(service);
                    return Poll::Ready(Dispatched::Called { future, endpoint });
                }
                Poll::Ready(Err(error)) => {
                    self.shared.fail(&chosen.endpoint, &error.into());
                    self.chosen = None;
                }
                Poll::Pending => {
                    // Woken by the endpoint's readiness, or by a change of the eligible set
                    // (the endpoint removed: choose again).
                    ready!(
                        self.shared
                            .poll_newer_than(self.seen, &mut self.listener, cx)
                    );
                    self.seen = self.shared.generation();
                }
            }
        }
    }
}

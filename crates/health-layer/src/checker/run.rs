//! A target's life: one task per target, probing on its own schedule (`Check`, HTTP and custom
//! modes), or following its `Watch` stream and re-subscribing when it breaks.

use std::sync::Arc;
use std::time::Duration;

use endpoint_state::rng;
use endpoint_state::sync::lock;
use endpoint_state::time::{Secs, after, far_future};
use tokio::time::Instant;
use tonic::{Code, Status};

use super::publish::Evidence;
use super::shared::Shared;
use super::target::Entry;
use crate::config::ProbeMode;
use crate::probe::{Dial, ProbeError, ServingStatus, Verifying, Via, run_custom, serving_status};

/// How a `Watch` subscription ended.
enum WatchEnd {
    /// The stream had answered, then ended, or its connection did: the server closed it. No
    /// evidence against the target.
    Closed(ProbeError),
    /// The subscription failed before any answer: evidence.
    Failed(ProbeError),
    /// A silent stream's connection did not answer a `Check` within the timeout: evidence.
    Silent(ProbeError),
}

impl WatchEnd {
    fn error(&self) -> &ProbeError {
        match self {
            WatchEnd::Closed(e) | WatchEnd::Failed(e) | WatchEnd::Silent(e) => e,
        }
    }
}

/// When a stream that is silent from now on gets its connection verified (never, with
/// interval 0).
fn quiet_until(interval: Duration) -> Instant {
    if interval.is_zero() {
        return far_future();
    }
    after(interval)
}

impl Shared {
    fn dial(&self) -> Dial<'_> {
        Dial {
            limit: self.config.timeout,
            connector: self.config.connector.as_ref(),
        }
    }

    /// The wait before the `attempt`-th consecutive re-subscription (from 0).
    fn watch_delay(&self, attempt: u32) -> Duration {
        self.config.watch_retry().delay(attempt, rng::unit())
    }

    pub(super) fn spawn(self: &Arc<Self>, runtime: &tokio::runtime::Handle, entry: &Arc<Entry>) {
        let shared = self.clone();
        let e = entry.clone();
        let task = if self.is_watch() {
            runtime.spawn(async move { shared.watch_loop(e).await })
        } else {
            runtime.spawn(async move { shared.schedule_loop(e).await })
        };
        *lock(&entry.task) = Some(task);
    }

    /// One probe of the target by the configured mode (`Watch` mode: one `Check`, on a
    /// connection of its own).
    pub(super) async fn probe(&self, entry: &Entry) -> Result<(), ProbeError> {
        let limit = self.config.timeout;
        match &self.config.mode {
            ProbeMode::Check | ProbeMode::Watch => {
                entry
                    .link
                    .check(self.dial(), after(limit), self.is_watch())
                    .await
            }
            #[cfg(feature = "http-probe")]
            ProbeMode::Http(http) => {
                let endpoint = entry.link.endpoint().expect("HTTP mode resolves endpoints");
                http.probe(&entry.name, endpoint.uri(), limit).await
            }
            ProbeMode::Custom(custom) => run_custom(custom, &entry.name, limit).await,
        }
    }

    pub(super) async fn probe_and_publish(&self, entry: &Entry) {
        let _turn = entry.probing.lock().await;
        let result = {
            let _permit = self.probes.acquire().await.expect("never closed");
            self.probe(entry).await
        };
        let evidence = self.judge(entry, result);
        self.publish(entry, evidence, true);
    }

    /// A target's life in `Check`, HTTP and custom modes: wait for its own next-check instant
    /// (or a change of it), probe, publish; again.
    async fn schedule_loop(self: Arc<Self>, entry: Arc<Entry>) {
        let sleep = tokio::time::sleep_until(Instant::now());
        let mut sleep = std::pin::pin!(sleep);
        loop {
            let notified = entry.reschedule.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let next = lock(&entry.schedule).next_check;
            match next {
                None => {
                    notified.await;
                    continue;
                }
                Some(at) => {
                    sleep.as_mut().reset(at);
                    tokio::select! {
                        biased;
                        () = &mut notified => continue,
                        () = sleep.as_mut() => {}
                    }
                }
            }
            self.probe_and_publish(&entry).await;
        }
    }

    /// A target's life in `Watch` mode: subscribe on a new connection, publish every message;
    /// when the server ends a stream that had answered (or closes its connection),
    /// re-subscribe at once keeping the verdict; when a subscription fails, publish the
    /// evidence and retry after the backoff.
    async fn watch_loop(self: Arc<Self>, entry: Arc<Entry>) {
        let initial = self.config.watch_retry().initial;
        // Consecutive re-subscriptions without a message in between.
        let mut attempt: u32 = 0;
        // When the last immediate re-subscription was made.
        let mut last_quick: Option<Instant> = None;
        loop {
            let end = self.watch_stream(&entry, &mut attempt).await;
            let error = end.error();
            tracing::debug!(backend = %entry.name, error = %error.reason(), attempt, "health watch stream ended");
            let unimplemented = error.code() == Some(Code::Unimplemented);
            let keep = matches!(end, WatchEnd::Failed(_))
                && unimplemented
                && self.config.unimplemented_is_healthy;
            if !keep {
                entry.link.connection_done(error);
            }
            match end {
                WatchEnd::Closed(_) => {
                    // No evidence against the target: the server closed a stream that had
                    // answered (max connection age or idleness, a restart, too many pings).
                    // Once per `initial` at most, so that a server that closes every stream
                    // at once costs one subscription per `initial` (1 s), not a loop.
                    let now = Instant::now();
                    if last_quick.is_none_or(|t| now.saturating_duration_since(t) >= initial) {
                        last_quick = Some(now);
                        continue;
                    }
                    let delay = self.watch_delay(attempt);
                    attempt = attempt.saturating_add(1);
                    tokio::time::sleep(delay).await;
                    last_quick = Some(Instant::now());
                }
                WatchEnd::Failed(error) | WatchEnd::Silent(error) => {
                    if keep {
                        let evidence = self.judge(&entry, Err(error));
                        self.publish(&entry, evidence, false);
                        // gRFC A17: no `Watch` again on this connection; a new one restarts it.
                        attempt = 0;
                        self.hold_without_watch(&entry).await;
                        continue;
                    }
                    let evidence = self.judge(&entry, Err(error));
                    self.publish(&entry, evidence, true);
                    // The health protocol says a client should not retry a `Watch` that is
                    // UNIMPLEMENTED; we retry only at the longest backoff, so that a server that
                    // gains the health service is watched again eventually.
                    let delay = if unimplemented {
                        self.config.watch_retry().max
                    } else {
                        self.watch_delay(attempt)
                    };
                    attempt = attempt.saturating_add(1);
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// One `Watch` subscription on a new connection, until it ends. The first message must come
    /// within the probe timeout; after that, a stream silent for an interval has its connection
    /// verified with a `Check` on it.
    async fn watch_stream(&self, entry: &Entry, attempt: &mut u32) -> WatchEnd {
        let link = &entry.link;
        let permit = self.probes.acquire().await.expect("never closed");
        let limit = self.config.timeout;
        let deadline = after(limit);
        let (channel, mut stream) = match link.subscribe(self.dial(), deadline).await {
            Ok(subscribed) => subscribed,
            Err(e) => return WatchEnd::Failed(e),
        };
        let mut permit = Some(permit);
        let mut answered = false;
        let interval = self.config.interval;
        let quiet = tokio::time::sleep_until(far_future());
        let mut quiet = std::pin::pin!(quiet);
        let mut verify: Option<Verifying<'_>> = None;
        loop {
            let next = tokio::select! {
                biased;
                next = stream.message() => next,
                () = tokio::time::sleep_until(deadline), if permit.is_some() => {
                    return WatchEnd::Failed(link.rpc_error(Status::deadline_exceeded(format!(
                        "no Watch message within {}",
                        Secs(limit)
                    ))));
                }
                () = quiet.as_mut(), if answered && verify.is_none() => {
                    verify = Some(link.verify(Via::Channel(channel.clone()), limit));
                    continue;
                }
                result = async { verify.as_mut().expect("guarded").await }, if verify.is_some() => {
                    verify = None;
                    match result {
                        Err(e) if e.code() == Some(Code::DeadlineExceeded) && !e.connection_ended() => {
                            return WatchEnd::Silent(e);
                        }
                        Err(e) if e.connection_ended() => return WatchEnd::Closed(e),
                        // The server answered: the connection is alive.
                        _ => {}
                    }
                    quiet.as_mut().reset(quiet_until(interval));
                    continue;
                }
            };
            permit = None;
            let ended = |e: ProbeError| {
                if answered {
                    WatchEnd::Closed(e)
                } else {
                    WatchEnd::Failed(e)
                }
            };
            match next {
                Ok(Some(response)) => {
                    answered = true;
                    *attempt = 0;
                    // A message proves the connection alive.
                    verify = None;
                    quiet.as_mut().reset(quiet_until(interval));
                    let evidence = match serving_status(response.status) {
                        ServingStatus::Serving => Evidence::Healthy { note: None },
                        status => Evidence::against(&link.not_serving(status)),
                    };
                    // The stream is the probe and it is fine: keep its channel.
                    self.publish(entry, evidence, false);
                }
                Ok(None) => {
                    return ended(
                        link.rpc_error(Status::unavailable("the server ended the Watch stream")),
                    );
                }
                Err(status) => return ended(link.stream_error(status)),
            }
        }
    }

    /// A target whose server answered `Watch` with `UNIMPLEMENTED` (counted as healthy): no
    /// new `Watch` on this connection (gRFC A17). Every interval one `Check` verifies the
    /// connection (any answer will do). Returns when the connection has ended (the caller
    /// subscribes again on a new one, as gRPC restarts health checking with each connection),
    /// or after a verification found no answer within the timeout (published as evidence,
    /// and waited out by the backoff).
    async fn hold_without_watch(&self, entry: &Entry) {
        let interval = self.config.interval;
        if interval.is_zero() {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(interval).await;
            let Some(conn) = entry.link.kept() else {
                return;
            };
            let result = {
                let _permit = self.probes.acquire().await.expect("never closed");
                entry.link.verify(conn.via, self.config.timeout).await
            };
            match result {
                // Still no health service: the connection is alive.
                Err(e) if e.code() == Some(Code::Unimplemented) => {}
                Err(e) if e.connection_ended() => {
                    entry.link.connection_done(&e);
                    return;
                }
                Err(e) if e.code() == Some(Code::DeadlineExceeded) => {
                    // The connection goes before the evidence is published.
                    entry.link.connection_done(&e);
                    let evidence = self.judge(entry, Err(e));
                    self.publish(entry, evidence, false);
                    tokio::time::sleep(self.watch_delay(0)).await;
                    return;
                }
                // The server answers health checks now (or fails them): watch it again, on a
                // new connection.
                _ => {
                    entry.link.close();
                    return;
                }
            }
        }
    }
}

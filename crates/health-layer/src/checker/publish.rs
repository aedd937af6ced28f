//! From a probe's result to the card: judging the evidence, publishing the verdict (the card's
//! health line is its one owner), scheduling the next check, and telling the subscribers and
//! callbacks of a transition.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use endpoint_state::sync::lock;
use endpoint_state::{CardEvent, HealthVerdict, LineState, rng, text};
use tokio::time::Instant;
use tonic::Code;

use super::shared::Shared;
use super::target::Entry;
use crate::probe::{ProbeError, ProbeFailure};

/// What a probe result means for the target.
#[derive(Debug, Clone)]
pub(super) enum Evidence {
    Healthy { note: Option<Arc<str>> },
    Unhealthy { reason: Arc<str> },
}

impl Evidence {
    /// A probe failure's evidence against the target. The reason quotes the server (a status
    /// message, an HTTP body) and is kept bounded, like every reason on a card
    /// ([`text::MAX_REASON`] characters).
    pub(super) fn against(error: &ProbeError) -> Self {
        Evidence::Unhealthy {
            reason: text::reason(&error.reason()),
        }
    }
}

impl Shared {
    /// Whether a failure is an `UNIMPLEMENTED` that counts as healthy (gRFC A17).
    pub(super) fn unimplemented_passes(&self, error: &ProbeError) -> bool {
        self.config.unimplemented_is_healthy
            && matches!(error.failure(), ProbeFailure::Rpc { status, .. } if status.code() == Code::Unimplemented)
    }

    pub(super) fn judge(&self, entry: &Entry, result: Result<(), ProbeError>) -> Evidence {
        match result {
            Ok(()) => Evidence::Healthy { note: None },
            Err(e) if self.unimplemented_passes(&e) => {
                if !entry.unimplemented_logged.swap(true, Ordering::AcqRel) {
                    tracing::warn!(
                        backend = %entry.name,
                        service = %entry.link.service(),
                        "the server has no grpc.health.v1 health service (UNIMPLEMENTED): \
                         counted as healthy, as gRPC's client health checking does (gRFC A17); \
                         unimplemented_is_healthy(false) requires the service"
                    );
                }
                Evidence::Healthy {
                    note: Some("UNIMPLEMENTED: no health service; counted as healthy".into()),
                }
            }
            Err(e) => Evidence::against(&e),
        }
    }

    /// Publishes a probe's evidence: schedule, card, transition (stream and callbacks). A
    /// failed probe's channel is dropped first, so nothing that reacts to the result can reuse
    /// the broken connection.
    pub(super) fn publish(&self, entry: &Entry, evidence: Evidence, drop_channel_on_failure: bool) {
        if drop_channel_on_failure && matches!(evidence, Evidence::Unhealthy { .. }) {
            entry.link.close();
        }
        let transition = {
            let mut schedule = lock(&entry.schedule);
            if entry.removed.load(Ordering::Acquire) || self.is_stopped() {
                return;
            }
            schedule.last_check = Some(SystemTime::now());
            let (verdict, reason) = match evidence {
                Evidence::Healthy { note } => {
                    schedule.failures = 0;
                    (HealthVerdict::Healthy, note)
                }
                Evidence::Unhealthy { reason } => {
                    schedule.failures = schedule.failures.saturating_add(1);
                    (HealthVerdict::Unhealthy, Some(reason))
                }
            };
            schedule.next_check = self.next_check(schedule.failures);
            let event = entry.card.set_health(verdict, reason);
            if event
                .as_ref()
                .is_some_and(|e| e.from == LineState::Health(HealthVerdict::Unknown))
            {
                self.progress.notify_waiters();
            }
            // A new reason for the same verdict is a change of the card, not a transition.
            let transition = event.filter(CardEvent::is_transition);
            if let Some(t) = &transition
                && let Some(tx) = &*lock(&self.events)
            {
                // No receiver is fine; a full receiver loses its oldest item, never us.
                let _ = tx.send(t.clone());
            }
            transition
        };
        entry.reschedule.notify_waiters();
        if let Some(t) = transition {
            match t.to {
                LineState::Health(HealthVerdict::Healthy) => {
                    tracing::info!(backend = %t.target, from = %t.from, "target healthy")
                }
                _ => tracing::info!(
                    backend = %t.target,
                    from = %t.from,
                    reason = t.reason.as_deref().unwrap_or(""),
                    "target unhealthy"
                ),
            }
            self.run_callbacks(&t);
        }
    }

    /// The next scheduled check after `failures` failures in a row (none in `Watch` mode or
    /// with interval 0).
    fn next_check(&self, failures: u32) -> Option<Instant> {
        if self.config.interval.is_zero() || self.is_watch() {
            return None;
        }
        let backoff = self.config.check_backoff();
        let n = failures.saturating_sub(1);
        let delay = backoff.delay(n, rng::unit());
        let (low, high) = backoff.bounds(n);
        Some(self.grid.place(Instant::now(), delay, low, high))
    }

    fn run_callbacks(&self, t: &CardEvent) {
        let callbacks = lock(&self.callbacks).clone();
        for callback in callbacks {
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| callback(t))) {
                let message = crate::probe::panic_message(&*payload);
                tracing::error!(backend = %t.target, panic = %message, "health transition callback panicked");
                if self.config.fail_fast_callbacks {
                    lock(&self.panic).get_or_insert(payload);
                }
            }
        }
    }
}

//! Per-target counters through the `metrics` facade (cargo feature `metrics`).
//!
//! | metric | labels | counts |
//! |---|---|---|
//! | `grpc_client_kit_calls_total` | `target` | calls sent to the target (finished or abandoned) |
//! | `grpc_client_kit_call_failures_total` | `target`, `code` | calls that ended with a status other than `OK` |
//! | `grpc_client_kit_quarantines_total` | `target` | quarantines started (renewals not counted) |
//! | `grpc_client_kit_breaker_transitions_total` | `target`, `to` | breaker transitions (`open`, `half_open`, `closed`, `forced_open`, `disabled`) |
//! | `grpc_client_kit_health_transitions_total` | `target`, `to` | health verdict changes (`healthy`, `unhealthy`, `unknown`) |
//! | `grpc_client_kit_transparent_retries_total` | | calls no backend acted on (never sent, or refused), sent again to another target |

use std::fmt;
use std::sync::Arc;

use endpoint_state::{
    BreakerState, CardEvent, HealthVerdict, LineState, OnOutcome, Outcome, code_name,
};
use metrics::Counter;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tonic::Code;

const CALLS: &str = "grpc_client_kit_calls_total";
const FAILURES: &str = "grpc_client_kit_call_failures_total";
const QUARANTINES: &str = "grpc_client_kit_quarantines_total";
const BREAKER: &str = "grpc_client_kit_breaker_transitions_total";
const HEALTH: &str = "grpc_client_kit_health_transitions_total";
const RETRIES: &str = "grpc_client_kit_transparent_retries_total";

/// Counts one transparent retry.
pub(crate) fn transparent_retry() {
    metrics::counter!(RETRIES).increment(1);
}

/// Registers the kit's metrics' descriptions; hands out per-target counters.
#[derive(Clone)]
pub(crate) struct KitMetrics(());

impl Default for KitMetrics {
    fn default() -> Self {
        metrics::describe_counter!(CALLS, "Calls sent to a target (finished or abandoned).");
        metrics::describe_counter!(
            FAILURES,
            "Calls that ended with a status other than OK, by code."
        );
        metrics::describe_counter!(QUARANTINES, "Quarantines started (renewals not counted).");
        metrics::describe_counter!(BREAKER, "Circuit breaker transitions, by new state.");
        metrics::describe_counter!(HEALTH, "Health verdict changes, by new verdict.");
        metrics::describe_counter!(
            RETRIES,
            "Calls no backend acted on (never sent, or refused), sent again to another target."
        );
        KitMetrics(())
    }
}

impl fmt::Debug for KitMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KitMetrics")
    }
}

impl KitMetrics {
    /// The per-call listener of `target` (one counter handle, shared by every call).
    pub(crate) fn call_metrics(&self, target: &Arc<str>) -> CallMetrics {
        CallMetrics {
            inner: Arc::new(TargetCounters {
                target: target.clone(),
                calls: metrics::counter!(CALLS, "target" => target.clone()),
            }),
        }
    }
}

/// Counts the changes of every target's card — health and breaker transitions, quarantines
/// started — from the kit's peer set, one event stream for all of them, until it ends.
/// Subscribe before the first target is added, so that none is missed.
pub(crate) fn observe(
    runtime: &tokio::runtime::Handle,
    mut events: broadcast::Receiver<CardEvent>,
) -> JoinHandle<()> {
    runtime.spawn(async move {
        loop {
            match events.recv().await {
                Ok(event) => count(&event),
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            }
        }
    })
}

fn count(event: &CardEvent) {
    if !event.is_transition() {
        return;
    }
    let target = event.target.clone();
    match (event.from, event.to) {
        (_, LineState::Health(to)) => {
            metrics::counter!(HEALTH, "target" => target, "to" => verdict_name(to)).increment(1)
        }
        (_, LineState::Breaker(to)) => {
            metrics::counter!(BREAKER, "target" => target, "to" => breaker_name(to)).increment(1)
        }
        // A quarantine starts when the line had none in force; moving the end of one that is
        // still in force is a renewal.
        (LineState::Quarantine(from), LineState::Quarantine(to))
            if to.until.is_some() && !from.active_at(event.at) =>
        {
            metrics::counter!(QUARANTINES, "target" => target).increment(1)
        }
        _ => {}
    }
}

fn breaker_name(state: BreakerState) -> &'static str {
    match state {
        BreakerState::Closed => "closed",
        BreakerState::Open { .. } => "open",
        BreakerState::HalfOpen => "half_open",
        BreakerState::ForcedOpen => "forced_open",
        BreakerState::Disabled => "disabled",
    }
}

fn verdict_name(verdict: HealthVerdict) -> &'static str {
    match verdict {
        HealthVerdict::Healthy => "healthy",
        HealthVerdict::Unhealthy => "unhealthy",
        HealthVerdict::Unknown => "unknown",
        HealthVerdict::NotChecked => "not_checked",
    }
}

struct TargetCounters {
    target: Arc<str>,
    calls: Counter,
}

/// Counts one target's calls and failures (a listener of the core's outcome classification).
#[derive(Clone)]
pub(crate) struct CallMetrics {
    inner: Arc<TargetCounters>,
}

impl fmt::Debug for CallMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallMetrics")
            .field("target", &self.inner.target)
            .finish()
    }
}

impl OnOutcome for CallMetrics {
    fn on_outcome(self, outcome: Outcome) {
        self.inner.calls.increment(1);
        if let Outcome::Completed(status) = outcome
            && status.code != Code::Ok
        {
            metrics::counter!(FAILURES, "target" => self.inner.target.clone(), "code" => code_name(status.code))
                .increment(1);
        }
    }
}

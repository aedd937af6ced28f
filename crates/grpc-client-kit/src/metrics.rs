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

use breaker_layer::BreakerHandle;
use endpoint_state::{BreakerState, EndpointCard, HealthVerdict, OnOutcome, Outcome, code_name};
use health_layer::HealthChecker;
use metrics::Counter;
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

    /// Watches `target`'s card (quarantines) and breaker (transitions) until aborted.
    pub(crate) fn observe(
        &self,
        target: &Arc<str>,
        card: &EndpointCard,
        breaker: &BreakerHandle,
    ) -> JoinHandle<()> {
        let target = target.clone();
        let card = card.clone();
        let mut events = breaker.subscribe();
        let quarantines = metrics::counter!(QUARANTINES, "target" => target.clone());
        tokio::spawn(async move {
            let mut last_until = card.quarantine().state.until;
            let mut breaker_open = true;
            loop {
                let changed = card.changed();
                let line = card.quarantine();
                if let Some(until) = line.state.until
                    && Some(until) != last_until
                    && last_until.is_none_or(|prev| prev <= line.since)
                {
                    quarantines.increment(1);
                }
                last_until = line.state.until;
                tokio::select! {
                    () = changed => {}
                    event = events.recv(), if breaker_open => match event {
                        Ok(t) => metrics::counter!(BREAKER, "target" => target.clone(), "to" => breaker_name(t.to)).increment(1),
                        Err(RecvError::Lagged(_)) => {}
                        Err(RecvError::Closed) => breaker_open = false,
                    },
                }
            }
        })
    }
}

/// Subscribes to the checker's transitions (before it starts, so that none is missed).
pub(crate) fn subscribe_health(checker: &HealthChecker) -> HealthEvents {
    HealthEvents(checker.subscribe())
}

/// The checker's transitions, subscribed to and not yet counted.
pub(crate) struct HealthEvents(tokio::sync::broadcast::Receiver<health_layer::Transition>);

/// Counts health transitions from the checker's stream until it ends.
pub(crate) fn observe_health(
    runtime: &tokio::runtime::Handle,
    events: HealthEvents,
) -> JoinHandle<()> {
    let mut events = events.0;
    runtime.spawn(async move {
        loop {
            match events.recv().await {
                Ok(t) => metrics::counter!(HEALTH, "target" => t.target.clone(), "to" => verdict_name(t.to))
                    .increment(1),
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            }
        }
    })
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

//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (cargo feature `metrics`):
//! gRPC's own per-call and per-attempt instruments, named as
//! [gRFC A66](https://github.com/grpc/proposal/blob/master/A66-otel-stats.md) and the
//! OpenTelemetry RPC conventions name them, and the kit's own.
//!
//! Install any `metrics` recorder (an exporter) before building the kit; the kit describes
//! every metric (type, unit, help text) when it is built. Nothing is recorded without the
//! feature, and with it but no recorder, recording is a no-op.
//!
//! | metric | type | unit | labels | meaning |
//! |---|---|---|---|---|
//! | `grpc.client.attempt.started` | counter | count | `grpc.method`, `grpc.target` | Attempts started: each time the kit sends a call to a backend (a transparent retry, a retry policy's retry, or a hedge is another attempt). |
//! | `grpc.client.attempt.duration` | histogram | seconds | `grpc.method`, `grpc.target`, `grpc.status` | Time from sending an attempt to a backend to its status (trailers, error, or the caller giving up). |
//! | `grpc.client.call.duration` | histogram | seconds | `grpc.method`, `grpc.target`, `grpc.status` | Time from the call reaching the kit's channel to its status, as the caller sees it: waits for a target and every attempt included. |
//! | `grpc_client_kit.attempts` | counter | count | `grpc.target`, `grpc_client_kit.backend`, `grpc.status` | Attempts ended, per backend and status. |
//! | `grpc_client_kit.transparent_retries` | counter | count | `grpc.method`, `grpc.target` | Calls no backend acted on (never sent, or refused), sent again to another backend. |
//! | `grpc_client_kit.retries` | counter | count | `grpc.method`, `grpc.target` | Attempts sent again under a method's retry policy (gRFC A6) after a retryable status. |
//! | `grpc_client_kit.hedges` | counter | count | `grpc.method`, `grpc.target` | Hedged attempts sent under a method's hedging policy (gRFC A6), the first attempt not counted. |
//! | `grpc_client_kit.targets.known` | gauge | count | `grpc.target` | Backends the balancer knows (configured, or found by DNS). |
//! | `grpc_client_kit.targets.eligible` | gauge | count | `grpc.target` | Backends the balancer picks from now. |
//! | `grpc_client_kit.breaker.state` | gauge | — | `grpc.target`, `grpc_client_kit.backend` | A backend's circuit breaker: -1 disabled, 0 closed, 1 half-open, 2 open, 3 forced open. |
//! | `grpc_client_kit.breaker.transitions` | counter | count | `grpc.target`, `grpc_client_kit.backend`, `grpc_client_kit.state` | Breaker transitions, by new state (`closed`, `half_open`, `open`, `forced_open`, `disabled`). |
//! | `grpc_client_kit.health.transitions` | counter | count | `grpc.target`, `grpc_client_kit.backend`, `grpc_client_kit.state` | Health verdict changes, by new verdict (`healthy`, `unhealthy`, `unknown`, `not_checked`). |
//! | `grpc_client_kit.quarantines` | counter | count | `grpc.target`, `grpc_client_kit.backend` | Quarantines started (renewals of one in force not counted). |
//!
//! The same table is [`METRICS`], for code (a dashboard generator, a test).
//!
//! # Labels and their cardinality
//!
//! * **`grpc.target`** is the kit's name: [`KitBuilder::name`](crate::KitBuilder::name) (or
//!   `name` in the configuration file) when set; otherwise the kit's target as configured —
//!   the `dns:` URI (`dns:///billing.svc:50051`), the one address, or the list of addresses
//!   joined with `,` (as gRPC's own `ipv4:` targets list them). One value per kit; it also tells
//!   two kits of one process apart, so give kits over the same target different names.
//! * **`grpc.method`** is the full method name (`pkg.Service/Method`, no leading `/`) of calls
//!   made by a generated client (tonic's codegen marks them); any other call — a hand-built
//!   path through `tonic::client::Grpc` — is recorded as `other`, as A66 says of generic
//!   methods, so that no caller can blow up the series. Generated methods are bounded by the
//!   code; the kit still stops naming new ones after [`MAX_METHODS`] (`other` beyond).
//! * **`grpc.status`** is the code's canonical name (`OK`, `UNAVAILABLE`, ...): 17 values. A
//!   call or attempt the caller gave up on is `CANCELLED`.
//! * **`grpc_client_kit.backend`** is a backend's name as the kit writes it everywhere
//!   (`http://10.0.0.7:50051`): the configured addresses, or those a DNS name resolves to —
//!   at most `dns.max_addresses` (default 1024) at a time, and a backend is removed only
//!   once missing from two answers in a row, so a resolver answering with subsets does not
//!   churn series.
//!
//! # What is an attempt, what is a call
//!
//! A *call* is what the caller sees: it starts when the call reaches the kit's channel and
//! ends when its status is known (an error, trailers at the end of the response body, or the
//! caller dropping the call). An *attempt* is one send to a backend: it starts when the
//! balancer hands the call to a backend's connection (its pick, in O(1), comes just before)
//! and ends with that backend's answer. A call the kit sends again after a backend provably
//! did not act on it ([transparent retry](crate::KitBuilder::transparent_retry)) has two
//! attempts; a call that found no eligible backend has none (only its `call.duration`, with
//! `UNAVAILABLE`). A call a method's retry policy sends again has one attempt per send,
//! each counted for its own backend, and one `grpc_client_kit.retries` per retry; a hedged call
//! has one attempt per hedge, and one `grpc_client_kit.hedges` per hedge after the first
//! attempt (the attempts it cancels end `CANCELLED` in the attempt metrics, and count neither
//! for nor against their backends in the breaker and quarantine).
//!
//! # Histograms in Prometheus
//!
//! `metrics-exporter-prometheus` renders histograms as summaries unless given buckets: use
//! [`LATENCY_BUCKETS`] (A66's) for the two durations, and `with_recommended_naming(true)` for
//! Prometheus' names (`grpc_client_attempt_duration_seconds_bucket`,
//! `grpc_client_attempt_started_total`; dots become `_`). The example `prometheus` does both.
//!
//! # Removed backends
//!
//! The `metrics` facade cannot delete a series: that is the exporter's business. Once a
//! backend is removed (by the DNS task, or at shutdown) the kit never writes its series again
//! — not even for its calls still in flight — so an exporter that drops idle series lets them
//! go (`metrics-exporter-prometheus`: `PrometheusBuilder::idle_timeout`; `metrics-util`:
//! `Recency`). A breaker state gauge is not rewritten while the state holds: let idle series
//! go for counters and histograms only (`MetricKindMask::COUNTER | MetricKindMask::HISTOGRAM`),
//! or a closed breaker's series would go too.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ::metrics::{Counter, SharedString, Unit};
use arc_swap::ArcSwap;
use endpoint_state::sync::lock;
use endpoint_state::{BreakerState, CardEvent, EndpointCard, HealthVerdict, LineState, code_name};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::Code;

use crate::stack::{KitDiscover, Request};

/// `grpc.method`: the full method name, `pkg.Service/Method`, or `other`.
pub const METHOD: &str = "grpc.method";
/// `grpc.target`: the kit's name (by default, its target as configured).
pub const TARGET: &str = "grpc.target";
/// `grpc.status`: the canonical name of the status code (`OK`, `UNAVAILABLE`).
pub const STATUS: &str = "grpc.status";
/// `grpc_client_kit.backend`: one backend's name (`http://10.0.0.7:50051`).
pub const BACKEND: &str = "grpc_client_kit.backend";
/// `grpc_client_kit.state`: the new state of a transition.
pub const STATE: &str = "grpc_client_kit.state";

/// How many distinct generated methods a kit names in `grpc.method` before it records `other`.
pub const MAX_METHODS: usize = 1024;

/// The latency buckets of gRFC A66 (seconds), for an exporter that needs them
/// (`PrometheusBuilder::set_buckets_for_metric`).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005,
    0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13, 0.16,
    0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0,
];

/// The kind of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricKind {
    /// Only goes up.
    Counter,
    /// A value that is set.
    Gauge,
    /// A distribution of observed values.
    Histogram,
}

impl MetricKind {
    /// `counter`, `gauge` or `histogram`.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }
}

/// One metric the kit records: a row of the table above.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct MetricSpec {
    /// Its name, as given to the `metrics` facade.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// Its unit, if it has one.
    pub unit: Option<Unit>,
    /// The labels every one of its series carries.
    pub labels: &'static [&'static str],
    /// What it measures (also its description to the recorder).
    pub description: &'static str,
}

/// `grpc.client.attempt.started`.
pub const ATTEMPT_STARTED: &str = "grpc.client.attempt.started";
/// `grpc.client.attempt.duration`.
pub const ATTEMPT_DURATION: &str = "grpc.client.attempt.duration";
/// `grpc.client.call.duration`.
pub const CALL_DURATION: &str = "grpc.client.call.duration";
/// `grpc_client_kit.attempts`.
pub const ATTEMPTS: &str = "grpc_client_kit.attempts";
/// `grpc_client_kit.transparent_retries`.
pub const TRANSPARENT_RETRIES: &str = "grpc_client_kit.transparent_retries";
/// `grpc_client_kit.retries`.
pub const RETRIES: &str = "grpc_client_kit.retries";
/// `grpc_client_kit.hedges`.
pub const HEDGES: &str = "grpc_client_kit.hedges";
/// `grpc_client_kit.targets.known`.
pub const TARGETS_KNOWN: &str = "grpc_client_kit.targets.known";
/// `grpc_client_kit.targets.eligible`.
pub const TARGETS_ELIGIBLE: &str = "grpc_client_kit.targets.eligible";
/// `grpc_client_kit.breaker.state`.
pub const BREAKER_STATE: &str = "grpc_client_kit.breaker.state";
/// `grpc_client_kit.breaker.transitions`.
pub const BREAKER_TRANSITIONS: &str = "grpc_client_kit.breaker.transitions";
/// `grpc_client_kit.health.transitions`.
pub const HEALTH_TRANSITIONS: &str = "grpc_client_kit.health.transitions";
/// `grpc_client_kit.quarantines`.
pub const QUARANTINES: &str = "grpc_client_kit.quarantines";

/// Every metric the kit records (the table above, for code).
pub const METRICS: &[MetricSpec] = &[
    MetricSpec {
        name: ATTEMPT_STARTED,
        kind: MetricKind::Counter,
        unit: Some(Unit::Count),
        labels: &[METHOD, TARGET],
        description: "Attempts started: each time the kit sends a call to a backend (a transparent retry, a retry policy's retry, or a hedge is another attempt).",
    },
    MetricSpec {
        name: ATTEMPT_DURATION,
        kind: MetricKind::Histogram,
        unit: Some(Unit::Seconds),
        labels: &[METHOD, TARGET, STATUS],
        description: "Time from sending an attempt to a backend to its status (trailers, error, or the caller giving up).",
    },
    MetricSpec {
        name: CALL_DURATION,
        kind: MetricKind::Histogram,
        unit: Some(Unit::Seconds),
        labels: &[METHOD, TARGET, STATUS],
        description: "Time from the call reaching the kit's channel to its status, as the caller sees it: waits for a target and every attempt included.",
    },
    MetricSpec {
        name: ATTEMPTS,
        kind: MetricKind::Counter,
        unit: Some(Unit::Count),
        labels: &[TARGET, BACKEND, STATUS],
        description: "Attempts ended, per backend and status.",
    },
    MetricSpec {
        name: TRANSPARENT_RETRIES,
        kind: MetricKind::Counter,
        unit: Some(Unit::Count),
        labels: &[METHOD, TARGET],
        description: "Calls no backend acted on (never sent, or refused), sent again to another backend.",
    },
    MetricSpec {
        name: RETRIES,
        kind: MetricKind::Counter,
        unit: Some(Unit::Count),
        labels: &[METHOD, TARGET],
        description: "Attempts sent again under a method's retry policy (gRFC A6) after a retryable status.",
    },
    MetricSpec {
        name: HEDGES,
        kind: MetricKind::Counter,
        unit: Some(Unit::Count),
        labels: &[METHOD, TARGET],
        description: "Hedged attempts sent under a method's hedging policy (gRFC A6), the first attempt not counted.",
    },
    MetricSpec {
        name: TARGETS_KNOWN,
        kind: MetricKind::Gauge,
        unit: Some(Unit::Count),
        labels: &[TARGET],
        description: "Backends the balancer knows (configured, or found by DNS).",
    },
    MetricSpec {
        name: TARGETS_ELIGIBLE,
        kind: MetricKind::Gauge,
        unit: Some(Unit::Count),
        labels: &[TARGET],
        description: "Backends the balancer picks from now.",
    },
    MetricSpec {
        name: BREAKER_STATE,
        kind: MetricKind::Gauge,
        unit: None,
        labels: &[TARGET, BACKEND],
        description: "A backend's circuit breaker: -1 disabled, 0 closed, 1 half-open, 2 open, 3 forced open.",
    },
    MetricSpec {
        name: BREAKER_TRANSITIONS,
        kind: MetricKind::Counter,
        unit: Some(Unit::Count),
        labels: &[TARGET, BACKEND, STATE],
        description: "Breaker transitions, by new state (`closed`, `half_open`, `open`, `forced_open`, `disabled`).",
    },
    MetricSpec {
        name: HEALTH_TRANSITIONS,
        kind: MetricKind::Counter,
        unit: Some(Unit::Count),
        labels: &[TARGET, BACKEND, STATE],
        description: "Health verdict changes, by new verdict (`healthy`, `unhealthy`, `unknown`, `not_checked`).",
    },
    MetricSpec {
        name: QUARANTINES,
        kind: MetricKind::Counter,
        unit: Some(Unit::Count),
        labels: &[TARGET, BACKEND],
        description: "Quarantines started (renewals of one in force not counted).",
    },
];

/// Describes every metric of [`METRICS`] — kind, unit, help text — to the recorder installed
/// now. The kit does it when it is built; call it yourself to have the descriptions before.
pub fn describe() {
    ::metrics::with_recorder(|recorder| {
        for m in METRICS {
            let key = ::metrics::KeyName::from_const_str(m.name);
            let help = SharedString::const_str(m.description);
            match m.kind {
                MetricKind::Counter => recorder.describe_counter(key, m.unit, help),
                MetricKind::Gauge => recorder.describe_gauge(key, m.unit, help),
                MetricKind::Histogram => recorder.describe_histogram(key, m.unit, help),
            }
        }
    });
}

/// The value of [`BREAKER_STATE`] for a state.
pub fn breaker_state_value(state: BreakerState) -> f64 {
    match state {
        BreakerState::Disabled => -1.0,
        BreakerState::Closed => 0.0,
        BreakerState::HalfOpen { .. } => 1.0,
        BreakerState::Open { .. } => 2.0,
        BreakerState::ForcedOpen => 3.0,
    }
}

fn breaker_name(state: BreakerState) -> &'static str {
    match state {
        BreakerState::Closed => "closed",
        BreakerState::Open { .. } => "open",
        BreakerState::HalfOpen { .. } => "half_open",
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

/// One kit's metrics: its `grpc.target` label, the method names it has seen, and its
/// backends' series (silenced once a backend is removed).
#[derive(Clone)]
pub(crate) struct KitMetrics {
    inner: Arc<Inner>,
}

struct Inner {
    target: SharedString,
    /// Method path (`/pkg.Service/Method`) → its label; read per call without a lock,
    /// replaced whole (under `grow`) when a new method shows up.
    methods: ArcSwap<HashMap<Box<str>, SharedString>>,
    grow: Mutex<()>,
    backends: Mutex<HashMap<Arc<str>, Arc<BackendMeter>>>,
}

impl fmt::Debug for KitMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KitMetrics")
            .field("target", &&*self.inner.target)
            .finish_non_exhaustive()
    }
}

const OTHER: SharedString = SharedString::const_str("other");

impl KitMetrics {
    /// The metrics of the kit named `target`; describes every metric to the recorder.
    pub(crate) fn new(target: Arc<str>) -> Self {
        describe();
        KitMetrics {
            inner: Arc::new(Inner {
                target: SharedString::from(target),
                methods: ArcSwap::default(),
                grow: Mutex::new(()),
                backends: Mutex::default(),
            }),
        }
    }

    /// A call starts: its meter (start time and labels).
    pub(crate) fn call(&self, req: &Request) -> CallMeter {
        CallMeter {
            start: Instant::now(),
            method: self.method(req),
            kit: self.clone(),
        }
    }

    /// The `grpc.method` of `req`: its path when a generated client made it, else `other`.
    fn method(&self, req: &Request) -> SharedString {
        let Some(generated) = req.extensions().get::<tonic::GrpcMethod<'static>>() else {
            return OTHER;
        };
        let path = req.uri().path();
        if let Some(label) = self.inner.methods.load().get(path) {
            return label.clone();
        }
        let _grow = lock(&self.inner.grow);
        let methods = self.inner.methods.load_full();
        if let Some(label) = methods.get(path) {
            return label.clone();
        }
        if methods.len() >= MAX_METHODS {
            return OTHER;
        }
        let label = SharedString::from(Arc::<str>::from(format!(
            "{}/{}",
            generated.service(),
            generated.method()
        )));
        let mut grown = HashMap::clone(&methods);
        grown.insert(Box::from(path), label.clone());
        self.inner.methods.store(Arc::new(grown));
        label
    }

    /// The series of `backend`, whose breaker writes `card`: its breaker state gauge is set
    /// now. Replaces (and silences) an earlier backend of that name.
    pub(crate) fn backend(&self, backend: &Arc<str>, card: &EndpointCard) -> Arc<BackendMeter> {
        let meter = Arc::new(BackendMeter {
            backend: SharedString::from(backend.clone()),
            kit: self.clone(),
            removed: AtomicBool::new(false),
        });
        self.breaker_gauge(backend.clone())
            .set(breaker_state_value(card.breaker_state()));
        if let Some(old) = lock(&self.inner.backends).insert(backend.clone(), meter.clone()) {
            old.removed.store(true, Ordering::Relaxed);
        }
        meter
    }

    /// `backend` was removed: its series are not written again.
    pub(crate) fn forget(&self, backend: &str) {
        if let Some(old) = lock(&self.inner.backends).remove(backend) {
            old.removed.store(true, Ordering::Relaxed);
        }
    }

    fn is_current(&self, backend: &str) -> bool {
        lock(&self.inner.backends).contains_key(backend)
    }

    fn target(&self) -> SharedString {
        self.inner.target.clone()
    }

    fn breaker_gauge(&self, backend: Arc<str>) -> ::metrics::Gauge {
        ::metrics::gauge!(BREAKER_STATE, TARGET => self.target(), BACKEND => backend)
    }

    fn per_backend(&self, name: &'static str, backend: &Arc<str>) -> Counter {
        ::metrics::counter!(name, TARGET => self.target(), BACKEND => backend.clone())
    }

    /// Counts one card change: health and breaker transitions, quarantines started.
    fn count(&self, event: &CardEvent) {
        if !event.is_transition() || !self.is_current(&event.target) {
            return;
        }
        let backend = event.target.clone();
        match (event.from, event.to) {
            (_, LineState::Health(to)) => ::metrics::counter!(
                HEALTH_TRANSITIONS,
                TARGET => self.target(),
                BACKEND => backend,
                STATE => verdict_name(to)
            )
            .increment(1),
            (_, LineState::Breaker(to)) => {
                self.breaker_gauge(backend.clone())
                    .set(breaker_state_value(to));
                ::metrics::counter!(
                    BREAKER_TRANSITIONS,
                    TARGET => self.target(),
                    BACKEND => backend,
                    STATE => breaker_name(to)
                )
                .increment(1);
            }
            // A quarantine starts when the line had none in force; moving the end of one
            // that is still in force is a renewal.
            (LineState::Quarantine(from), LineState::Quarantine(to))
                if to.until.is_some() && !from.active_at(event.at) =>
            {
                self.per_backend(QUARANTINES, &backend).increment(1);
            }
            _ => {}
        }
    }
}

/// A call being measured: when it reached the kit, and its method's label.
pub(crate) struct CallMeter {
    start: Instant,
    method: SharedString,
    kit: KitMetrics,
}

impl fmt::Debug for CallMeter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallMeter")
            .field("method", &&*self.method)
            .finish_non_exhaustive()
    }
}

impl CallMeter {
    /// The call ended with `code`.
    pub(crate) fn ended(&self, code: Code) {
        ::metrics::histogram!(
            CALL_DURATION,
            METHOD => self.method.clone(),
            TARGET => self.kit.target(),
            STATUS => code_name(code)
        )
        .record(self.start.elapsed().as_secs_f64());
    }

    /// A hedged attempt of the call is sent.
    pub(crate) fn hedged(&self) {
        ::metrics::counter!(
            HEDGES,
            METHOD => self.method.clone(),
            TARGET => self.kit.target()
        )
        .increment(1);
    }

    /// The call is sent again under its method's retry policy.
    pub(crate) fn policy_retried(&self) {
        ::metrics::counter!(
            RETRIES,
            METHOD => self.method.clone(),
            TARGET => self.kit.target()
        )
        .increment(1);
    }

    /// The call is sent again (transparent retry).
    pub(crate) fn retried(&self) {
        ::metrics::counter!(
            TRANSPARENT_RETRIES,
            METHOD => self.method.clone(),
            TARGET => self.kit.target()
        )
        .increment(1);
    }
}

/// One backend's series.
pub(crate) struct BackendMeter {
    backend: SharedString,
    kit: KitMetrics,
    /// Set when the backend is removed: nothing is written for it any more.
    removed: AtomicBool,
}

impl fmt::Debug for BackendMeter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendMeter")
            .field("backend", &&*self.backend)
            .finish_non_exhaustive()
    }
}

impl BackendMeter {
    /// An attempt of `call` starts on this backend: when.
    pub(crate) fn attempt_started(&self, call: &CallMeter) -> Instant {
        ::metrics::counter!(
            ATTEMPT_STARTED,
            METHOD => call.method.clone(),
            TARGET => self.kit.target()
        )
        .increment(1);
        Instant::now()
    }

    /// An attempt of `call` started at `start` ended with `code`.
    pub(crate) fn attempt_ended(&self, call: &CallMeter, start: Instant, code: Code) {
        ::metrics::histogram!(
            ATTEMPT_DURATION,
            METHOD => call.method.clone(),
            TARGET => self.kit.target(),
            STATUS => code_name(code)
        )
        .record(start.elapsed().as_secs_f64());
        if self.removed.load(Ordering::Relaxed) {
            return;
        }
        ::metrics::counter!(
            ATTEMPTS,
            TARGET => self.kit.target(),
            BACKEND => self.backend.clone(),
            STATUS => code_name(code)
        )
        .increment(1);
    }
}

/// Keeps the kit's gauges and transition counters: counts every card change from the kit's
/// peer set (one event stream for all of them), and sets the target gauges each time the
/// balancer takes in a change, until the kit stops. Subscribe before the first target is
/// added, so that none is missed.
pub(crate) fn observe(
    runtime: &tokio::runtime::Handle,
    mut events: broadcast::Receiver<CardEvent>,
    metrics: KitMetrics,
    balance: balance_layer::Balance<KitDiscover, Request>,
) -> JoinHandle<()> {
    runtime.spawn(async move {
        let known = ::metrics::gauge!(TARGETS_KNOWN, TARGET => metrics.target());
        let eligible = ::metrics::gauge!(TARGETS_ELIGIBLE, TARGET => metrics.target());
        let mut events_open = true;
        loop {
            // Made before reading, so that a change between the read and the wait is seen.
            let changed = balance.changed();
            known.set(balance.targets().len() as f64);
            eligible.set(balance.eligible_targets().len() as f64);
            tokio::select! {
                () = changed => {}
                event = events.recv(), if events_open => match event {
                    Ok(event) => metrics.count(&event),
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => events_open = false,
                },
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The module's table and [`METRICS`] say the same: each row of one is a row of the other.
    #[test]
    fn the_documented_table_is_metrics() {
        let source = include_str!("metrics.rs");
        let rows: Vec<&str> = source
            .lines()
            .filter_map(|l| l.strip_prefix("//! | `"))
            .collect();
        assert_eq!(rows.len(), METRICS.len(), "one documented row per metric");
        for m in METRICS {
            let unit = match m.unit {
                Some(unit) => unit.as_str(),
                None => "—",
            };
            let labels: Vec<String> = m.labels.iter().map(|l| format!("`{l}`")).collect();
            let row = format!(
                "{}` | {} | {unit} | {} | {} |",
                m.name,
                m.kind.as_str(),
                labels.join(", "),
                m.description
            );
            assert!(rows.contains(&row.as_str()), "not documented as\n| `{row}");
        }
    }

    fn request(path: &'static str, generated: bool) -> Request {
        let mut req = http::Request::builder()
            .uri(path)
            .body(tonic::body::Body::empty())
            .unwrap();
        if generated {
            let (service, method) = path[1..].split_once('/').unwrap();
            req.extensions_mut()
                .insert(tonic::GrpcMethod::new(service, method));
        }
        req
    }

    #[test]
    fn generated_methods_are_named_and_other_calls_are_other() {
        let kit = KitMetrics::new(Arc::from("kit"));
        let named = kit.method(&request("/pkg.Svc/Get", true));
        assert_eq!(&*named, "pkg.Svc/Get");
        // Seen again: the same label.
        assert_eq!(&*kit.method(&request("/pkg.Svc/Get", true)), "pkg.Svc/Get");
        // A hand-built path (no generated client said what it is): `other`.
        assert_eq!(&*kit.method(&request("/pkg.Svc/Anything", false)), "other");
    }

    #[test]
    fn a_kit_names_at_most_max_methods() {
        let kit = KitMetrics::new(Arc::from("kit"));
        for i in 0..MAX_METHODS {
            let path: &'static str = Box::leak(format!("/pkg.Svc/M{i}").into_boxed_str());
            assert_ne!(&*kit.method(&request(path, true)), "other");
        }
        assert_eq!(&*kit.method(&request("/pkg.Svc/OneMore", true)), "other");
        // Those named stay named.
        assert_eq!(&*kit.method(&request("/pkg.Svc/M0", true)), "pkg.Svc/M0");
    }

    #[test]
    fn breaker_states_are_ordered_by_how_shut_they_are() {
        let values: Vec<f64> = [
            BreakerState::Disabled,
            BreakerState::Closed,
            BreakerState::HalfOpen { busy: false },
            BreakerState::ForcedOpen,
        ]
        .into_iter()
        .map(breaker_state_value)
        .collect();
        assert_eq!(values, [-1.0, 0.0, 1.0, 3.0]);
    }
}

//! The `metrics` feature, read back through `metrics-util`'s debugging recorder after a
//! scripted run against real test servers: calls, a failure that quarantines its backend, a
//! breaker that opens, a transparent retry in a second kit — and every series checked against
//! the documented table ([`grpc_client_kit::metrics::METRICS`]): name, type, unit, labels.
//! Run with `cargo test -p grpc-client-kit --features metrics --test metrics`.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use grpc_client_kit::Kit;
use grpc_client_kit::breaker::BreakerConfig;
use grpc_client_kit::metrics::{self as m, METRICS, MetricKind};
use grpc_client_kit::quarantine::QuarantineConfig;
use metrics_util::MetricKind as RecordedKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::{eventually, watch};
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tonic::Code;

const UNARY: &str = "gck.test.v1.TestService/Unary";

type Labels = BTreeMap<String, String>;

/// Everything recorded so far. A debugging snapshot drains counters and histograms, so the
/// deltas are added up here. It drains gauges too (a gauge not set since the last snapshot
/// reads 0): a gauge here is the last value it was seen set to, where a 0 after the first
/// reading is taken for "not set since" — enough for this script, whose gauges never go back
/// to 0 once they left it.
struct Seen {
    snap: Snapshotter,
    /// (name, kind, labels) → counter total, histogram samples, or gauge value.
    series: BTreeMap<(String, &'static str, Labels), Value>,
}

#[derive(Debug, Clone, Default)]
struct Value {
    count: u64,
    samples: Vec<f64>,
    gauge: Option<f64>,
}

impl Seen {
    fn new(snap: Snapshotter) -> Self {
        Seen {
            snap,
            series: BTreeMap::new(),
        }
    }

    /// Takes a snapshot in, checking each series against the documented table.
    fn update(&mut self) {
        for (key, unit, description, value) in self.snap.snapshot().into_vec() {
            let kind = key.kind();
            let key = key.key();
            let name = key.name();
            if !name.starts_with("grpc.") && !name.starts_with("grpc_client_kit") {
                continue;
            }
            let spec = METRICS
                .iter()
                .find(|s| s.name == name)
                .unwrap_or_else(|| panic!("{name} is recorded but not in METRICS"));
            let kind = match kind {
                RecordedKind::Counter => MetricKind::Counter,
                RecordedKind::Gauge => MetricKind::Gauge,
                RecordedKind::Histogram => MetricKind::Histogram,
            };
            assert_eq!(kind, spec.kind, "{name}: type");
            assert_eq!(unit, spec.unit, "{name}: unit");
            assert_eq!(
                description.as_deref(),
                Some(spec.description),
                "{name}: description"
            );
            let labels: Labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let keys: BTreeSet<&str> = labels.keys().map(String::as_str).collect();
            let documented: BTreeSet<&str> = spec.labels.iter().copied().collect();
            assert_eq!(keys, documented, "{name}: labels");
            let entry = self
                .series
                .entry((name.to_owned(), kind.as_str(), labels))
                .or_default();
            match value {
                DebugValue::Counter(n) => entry.count += n,
                DebugValue::Histogram(samples) => {
                    entry.count += samples.len() as u64;
                    entry
                        .samples
                        .extend(samples.into_iter().map(|s| s.into_inner()));
                }
                DebugValue::Gauge(v) => {
                    if v.into_inner() != 0.0 || entry.gauge.is_none() {
                        entry.gauge = Some(v.into_inner());
                    }
                }
            }
        }
    }

    /// The series of `name` whose labels include `labels`.
    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Value> + 'a {
        self.series
            .iter()
            .filter(move |((n, _, l), _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, value)| value)
    }

    /// Counter total, or histogram sample count, over the matching series.
    fn count(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.update();
        self.matching(name, labels).map(|v| v.count).sum()
    }

    /// The value of the one matching gauge.
    fn gauge(&mut self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.update();
        let values: Vec<f64> = self
            .matching(name, labels)
            .filter_map(|v| v.gauge)
            .collect();
        assert!(values.len() <= 1, "{name} {labels:?}: {values:?}");
        values.first().copied()
    }

    fn names(&self) -> BTreeSet<&str> {
        self.series.keys().map(|(n, _, _)| n.as_str()).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_run_records_every_documented_metric_as_documented() {
    let recorder = DebuggingRecorder::new();
    let mut seen = Seen::new(recorder.snapshotter());
    recorder.install().unwrap();

    // Kit "checkout": three backends, Watch health checking; a quarantine or an open breaker
    // lasts the whole test.
    let backends = Backends::start(3).await.unwrap();
    let u = backends.uris();
    let kit = Kit::builder()
        .name("checkout")
        .targets(u.clone())
        .health(watch())
        .quarantine(
            QuarantineConfig::default()
                .duration(Duration::from_secs(120))
                .max_duration(Duration::from_secs(120)),
        )
        .breaker(
            BreakerConfig::default()
                .consecutive_failures(2)
                .open_base(Duration::from_secs(120))
                .open_max(Duration::from_secs(120)),
        )
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
    let mut client = TestServiceClient::new(kit.channel());
    let checkout = [(m::TARGET, "checkout")];

    // Calls: two per backend.
    for _ in 0..6 {
        client.unary(Ping::default()).await.unwrap();
    }
    let ok = [
        (m::TARGET, "checkout"),
        (m::METHOD, UNARY),
        (m::STATUS, "OK"),
    ];
    assert_eq!(seen.count(m::CALL_DURATION, &ok), 6);
    assert_eq!(seen.count(m::ATTEMPT_DURATION, &ok), 6);
    assert_eq!(
        seen.count(
            m::ATTEMPT_STARTED,
            &[(m::TARGET, "checkout"), (m::METHOD, UNARY)]
        ),
        6
    );
    for backend in &u {
        let labels = [(m::BACKEND, backend.as_str()), (m::STATUS, "OK")];
        assert_eq!(seen.count(m::ATTEMPTS, &labels), 2, "{backend}");
        let healthy = [(m::BACKEND, backend.as_str()), (m::STATE, "healthy")];
        assert_eq!(seen.count(m::HEALTH_TRANSITIONS, &healthy), 1, "{backend}");
        let closed = [(m::TARGET, "checkout"), (m::BACKEND, backend.as_str())];
        assert_eq!(
            seen.gauge(m::BREAKER_STATE, &closed),
            Some(0.0),
            "{backend}"
        );
    }
    assert!(
        eventually(Duration::from_secs(5), || seen
            .gauge(m::TARGETS_ELIGIBLE, &checkout)
            == Some(3.0))
        .await
    );
    assert_eq!(seen.gauge(m::TARGETS_KNOWN, &checkout), Some(3.0));

    // One failure: UNAVAILABLE from b0, which quarantines it.
    backends[0].fail_next(1, Code::Unavailable);
    let mut failed = Vec::new();
    for _ in 0..3 {
        if let Err(status) = client.unary(Ping::default()).await {
            failed.push(status.code());
        }
    }
    assert_eq!(failed, [Code::Unavailable]);
    let unavailable = [(m::TARGET, "checkout"), (m::STATUS, "UNAVAILABLE")];
    assert_eq!(seen.count(m::CALL_DURATION, &unavailable), 1);
    assert_eq!(seen.count(m::ATTEMPT_DURATION, &unavailable), 1);
    let b0_unavailable = [(m::BACKEND, u[0].as_str()), (m::STATUS, "UNAVAILABLE")];
    assert_eq!(seen.count(m::ATTEMPTS, &b0_unavailable), 1);
    let b0 = [(m::TARGET, "checkout"), (m::BACKEND, u[0].as_str())];
    assert!(
        eventually(Duration::from_secs(5), || seen.count(m::QUARANTINES, &b0)
            == 1)
        .await
    );

    // One breaker opens: two INTERNAL in a row from b1 (not a quarantine failure).
    backends[1].fail_next(2, Code::Internal);
    let mut failed = Vec::new();
    for _ in 0..4 {
        if let Err(status) = client.unary(Ping::default()).await {
            failed.push(status.code());
        }
    }
    assert_eq!(failed, [Code::Internal, Code::Internal]);
    let b1 = [(m::TARGET, "checkout"), (m::BACKEND, u[1].as_str())];
    let b1_open = [(m::BACKEND, u[1].as_str()), (m::STATE, "open")];
    assert!(
        eventually(Duration::from_secs(5), || seen
            .count(m::BREAKER_TRANSITIONS, &b1_open)
            == 1)
        .await
    );
    assert!(
        eventually(Duration::from_secs(5), || seen.gauge(m::BREAKER_STATE, &b1)
            == Some(2.0))
        .await
    );
    assert_eq!(seen.gauge(m::BREAKER_STATE, &b0), Some(0.0), "one failure");
    // b0 quarantined, b1 open: b2 is left.
    assert!(
        eventually(Duration::from_secs(5), || seen
            .gauge(m::TARGETS_ELIGIBLE, &checkout)
            == Some(1.0))
        .await
    );
    assert_eq!(seen.gauge(m::TARGETS_KNOWN, &checkout), Some(3.0));
    assert_eq!(seen.count(m::CALL_DURATION, &ok), 6 + 2 + 2);
    let internal = [(m::TARGET, "checkout"), (m::STATUS, "INTERNAL")];
    assert_eq!(seen.count(m::CALL_DURATION, &internal), 2);
    assert_eq!(seen.count(m::ATTEMPT_STARTED, &checkout), 13);
    assert_eq!(seen.count(m::TRANSPARENT_RETRIES, &checkout), 0);

    // A second kit, "fallback", told apart by its name: its first backend is gone, so its
    // first call is refused there and sent again to the other (two attempts, one call).
    let others = Backends::start(2).await.unwrap();
    others[0].stop().await;
    let o = others.uris();
    let fallback_kit = Kit::builder()
        .name("fallback")
        .targets(o.clone())
        .without_health()
        .build()
        .unwrap();
    let mut fallback_client = TestServiceClient::new(fallback_kit.channel());
    fallback_client.unary(Ping::default()).await.unwrap();
    let fallback = [(m::TARGET, "fallback")];
    assert_eq!(seen.count(m::TRANSPARENT_RETRIES, &fallback), 1);
    assert_eq!(seen.count(m::ATTEMPT_STARTED, &fallback), 2);
    assert_eq!(seen.count(m::CALL_DURATION, &fallback), 1);
    let refused = [(m::BACKEND, o[0].as_str()), (m::STATUS, "UNAVAILABLE")];
    assert_eq!(seen.count(m::ATTEMPTS, &refused), 1);
    let answered = [(m::BACKEND, o[1].as_str()), (m::STATUS, "OK")];
    assert_eq!(seen.count(m::ATTEMPTS, &answered), 1);
    // The first kit's series did not move.
    assert_eq!(seen.count(m::ATTEMPT_STARTED, &checkout), 13);
    assert!(
        eventually(Duration::from_secs(5), || seen
            .gauge(m::TARGETS_KNOWN, &fallback)
            == Some(2.0))
        .await
    );

    // A third kit, "retrying", whose methods have a retry policy (gRFC A6): its backend
    // answers UNAVAILABLE once, and the call is sent again (two attempts, each counted for
    // its backend, one retry; the call itself ends OK).
    let third = Backends::start(1).await.unwrap();
    let r = third.uris();
    third[0].fail_next(1, Code::Unavailable);
    let retrying_kit = Kit::builder()
        .name("retrying")
        .targets(r.clone())
        .without_health()
        .service_config(
            r#"{"methodConfig": [{"name": [{"service": "gck.test.v1.TestService"}],
                "retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.001s",
                    "maxBackoff": "0.001s", "backoffMultiplier": 1,
                    "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
        )
        .build()
        .unwrap();
    TestServiceClient::new(retrying_kit.channel())
        .unary(Ping::default())
        .await
        .unwrap();
    let retrying = [(m::TARGET, "retrying")];
    assert_eq!(seen.count(m::RETRIES, &retrying), 1);
    assert_eq!(seen.count(m::ATTEMPT_STARTED, &retrying), 2);
    let retried_ok = [(m::TARGET, "retrying"), (m::STATUS, "OK")];
    assert_eq!(seen.count(m::CALL_DURATION, &retrying), 1);
    assert_eq!(seen.count(m::CALL_DURATION, &retried_ok), 1);
    let r_unavailable = [(m::BACKEND, r[0].as_str()), (m::STATUS, "UNAVAILABLE")];
    assert_eq!(seen.count(m::ATTEMPTS, &r_unavailable), 1);
    let r_ok = [(m::BACKEND, r[0].as_str()), (m::STATUS, "OK")];
    assert_eq!(seen.count(m::ATTEMPTS, &r_ok), 1);
    assert_eq!(seen.count(m::RETRIES, &checkout), 0);

    // A fourth kit, "hedging", whose methods are hedged with no delay: both attempts go at
    // once (one hedge: both backends take 100 ms to answer, so the second attempt goes
    // before the first one is answered), the first answer wins and the call ends OK once.
    let pair = Backends::start(2).await.unwrap();
    for b in pair.iter() {
        b.set_delay(Duration::from_millis(100));
    }
    let hedging_kit = Kit::builder()
        .name("hedging")
        .targets(pair.uris())
        .without_health()
        .service_config(
            r#"{"methodConfig": [{"name": [{"service": "gck.test.v1.TestService"}],
                "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0s"}}]}"#,
        )
        .build()
        .unwrap();
    TestServiceClient::new(hedging_kit.channel())
        .unary(Ping::default())
        .await
        .unwrap();
    let hedging = [(m::TARGET, "hedging")];
    assert_eq!(seen.count(m::HEDGES, &hedging), 1);
    assert_eq!(seen.count(m::ATTEMPT_STARTED, &hedging), 2);
    let hedged_ok = [(m::TARGET, "hedging"), (m::STATUS, "OK")];
    assert_eq!(seen.count(m::CALL_DURATION, &hedging), 1);
    assert_eq!(seen.count(m::CALL_DURATION, &hedged_ok), 1);
    assert_eq!(seen.count(m::HEDGES, &checkout), 0);

    // Every documented metric was recorded (and each recorded one matched the table).
    let names = seen.names();
    for spec in METRICS {
        assert!(names.contains(spec.name), "{} never recorded", spec.name);
    }
    // Durations are in seconds: this run's calls took well under a minute each.
    for v in seen.matching(m::CALL_DURATION, &[]) {
        assert!(v.samples.iter().all(|s| (0.0..60.0).contains(s)), "{v:?}");
    }
}

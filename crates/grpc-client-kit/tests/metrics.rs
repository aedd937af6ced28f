//! The `metrics` feature: per-target calls, failures, quarantines, breaker and health
//! transitions, read back through a debugging recorder.
//! Run with `cargo test -p grpc-client-kit --features metrics --test metrics`.

mod support;

use std::time::Duration;

use grpc_client_kit::Kit;
use grpc_client_kit::health::{HealthConfig, ProbeMode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::eventually;
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tonic::Code;

/// Counter totals: a debugging snapshot drains the counters, so the deltas are summed here.
struct Totals {
    snap: Snapshotter,
    seen: Vec<(String, Labels, u64)>,
}

type Labels = Vec<(String, String)>;

impl Totals {
    fn get(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        for (key, _, _, value) in self.snap.snapshot().into_vec() {
            let DebugValue::Counter(n) = value else {
                continue;
            };
            let key = key.key();
            let labels: Labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            match self
                .seen
                .iter_mut()
                .find(|(k, l, _)| k == key.name() && *l == labels)
            {
                Some(entry) => entry.2 += n,
                None => self.seen.push((key.name().to_owned(), labels, n)),
            }
        }
        self.seen
            .iter()
            .filter(|(k, l, _)| {
                k == name
                    && labels
                        .iter()
                        .all(|(lk, lv)| l.iter().any(|(a, b)| a == lk && b == lv))
            })
            .map(|(_, _, n)| n)
            .sum()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_target_counters_follow_calls_failures_and_transitions() {
    let recorder = DebuggingRecorder::new();
    let mut totals = Totals {
        snap: recorder.snapshotter(),
        seen: Vec::new(),
    };
    recorder.install().unwrap();

    let backends = Backends::start(2).await.unwrap();
    let (u0, u1) = (backends[0].uri(), backends[1].uri());
    let kit = Kit::builder()
        .targets(backends.uris())
        .health(HealthConfig::new().mode(ProbeMode::Watch))
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
    let mut client = TestServiceClient::new(kit.channel());
    for _ in 0..10 {
        client.unary(Ping::default()).await.unwrap();
    }
    let calls = "grpc_client_kit_calls_total";
    assert_eq!(totals.get(calls, &[("target", &u0)]), 5);
    assert_eq!(totals.get(calls, &[("target", &u1)]), 5);
    let health = "grpc_client_kit_health_transitions_total";
    assert!(
        eventually(Duration::from_secs(5), || totals
            .get(health, &[("target", &u0), ("to", "healthy")])
            == 1)
        .await
    );

    // A failure: counted by code, and it quarantines its target.
    backends[0].fail_next(1, Code::Unavailable);
    let mut failed = 0;
    for _ in 0..2 {
        if client.unary(Ping::default()).await.is_err() {
            failed += 1;
        }
    }
    assert_eq!(failed, 1);
    let failures = "grpc_client_kit_call_failures_total";
    assert_eq!(
        totals.get(failures, &[("target", &u0), ("code", "UNAVAILABLE")]),
        1
    );
    assert_eq!(totals.get(failures, &[("target", &u1)]), 0);
    let quarantines = "grpc_client_kit_quarantines_total";
    assert!(
        eventually(Duration::from_secs(5), || totals
            .get(quarantines, &[("target", &u0)])
            == 1)
        .await
    );
    // Renewing a quarantine in force is not a new one.
    kit.quarantine().report_failure(&u0, None).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(totals.get(quarantines, &[("target", &u0)]), 1);

    // Breaker transitions, by new state.
    let breaker = kit.breaker(&u1).unwrap();
    breaker.force_open(None);
    breaker.reset();
    let transitions = "grpc_client_kit_breaker_transitions_total";
    assert!(
        eventually(Duration::from_secs(5), || {
            totals.get(transitions, &[("target", &u1), ("to", "forced_open")]) == 1
                && totals.get(transitions, &[("target", &u1), ("to", "closed")]) == 1
        })
        .await
    );

    // Health transitions.
    backends[1].set_serving(false).await;
    assert!(
        eventually(Duration::from_secs(5), || totals
            .get(health, &[("target", &u1), ("to", "unhealthy")])
            == 1)
        .await
    );
}

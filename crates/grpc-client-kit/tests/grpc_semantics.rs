//! The kit does what gRPC's own clients do: a call made while targets are still connecting
//! waits for them (gRFC A17's client health checking queues calls while the first answer is
//! pending), and passive signals — quarantine, open breakers — never cut the client off from
//! targets that health says serve. Real backends on loopback.

mod support;

use std::time::{Duration, Instant};

use grpc_client_kit::Kit;
use grpc_client_kit::health::HealthConfig;
use support::watch;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::{Backends, BlackHole};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_call_right_after_build_waits_for_the_first_verdicts() {
    for health in [HealthConfig::default(), watch()] {
        let backends = Backends::start(3).await.unwrap();
        let kit = Kit::builder()
            .targets(backends.uris())
            .health(health.clone())
            .build()
            .unwrap();
        // No wait_until_ready: the targets are connecting, not down.
        let mut client = TestServiceClient::new(kit.channel());
        let pong = client.unary(Ping::default()).await.unwrap().into_inner();
        assert!(pong.backend.starts_with('b'), "{pong:?}");
        kit.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_fails_at_once_when_every_target_has_evidence_against_it() {
    // Refused connections are evidence within milliseconds: the call does not wait for the
    // connecting bound (5 s).
    let backends = Backends::start(2).await.unwrap();
    for b in backends.iter() {
        b.stop().await;
    }
    let kit = Kit::builder().targets(backends.uris()).build().unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    let started = Instant::now();
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status.message().contains("connect failed"),
        "{}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_for_connecting_targets_ends_by_its_own_deadline() {
    // A black hole never answers the first probe (its timeout is 5 s): a call with a 300 ms
    // deadline ends at its deadline, saying why.
    let hole = BlackHole::start().await.unwrap();
    let kit = Kit::builder().target(hole.uri()).build().unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    let mut request = tonic::Request::new(Ping::default());
    request.set_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let status = client.unary(request).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("health unknown"),
        "{}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_that_each_fail_six_calls_then_recover_cost_a_sequential_caller_those_calls_only()
{
    // Quarantine (UNAVAILABLE) and breakers (5 in a row) take every target out in turn; passive
    // signals never empty the choice, so every call still reaches a backend: exactly the 18
    // injected failures are lost, and the next call succeeds.
    for code in [Code::Unavailable, Code::Internal] {
        let backends = Backends::start(3).await.unwrap();
        let kit = Kit::builder()
            .targets(backends.uris())
            .health(watch())
            .build()
            .unwrap();
        assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
        for b in backends.iter() {
            b.fail_next(6, code);
        }
        let mut client = TestServiceClient::new(kit.channel());
        let mut outcomes = Vec::new();
        for _ in 0..19 {
            outcomes.push(client.unary(Ping::default()).await.map_err(|s| s.code()));
        }
        let failed: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
        assert_eq!(failed.len(), 18, "{code:?}: {outcomes:?}");
        assert!(
            failed.iter().all(|c| **c == code),
            "every failure is the backend's own, none the kit's: {outcomes:?}"
        );
        assert!(outcomes[18].is_ok(), "{code:?}: the 19th call succeeds");
        assert_eq!(backends.total_hits(), 19, "every call reached a backend");
        for _ in 0..10 {
            client.unary(Ping::default()).await.unwrap();
        }
        kit.shutdown().await;
    }
}

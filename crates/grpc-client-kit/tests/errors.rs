//! Every error the kit produces reaches a generated client as a `Status` with the right code
//! and a message naming the target(s) and why — never `UNKNOWN`. Real backends on loopback.

mod support;

use std::time::Duration;

use grpc_client_kit::Kit;
use grpc_client_kit::breaker::BreakerConfig;
use support::{eventually, ready_watch_kit, watch};
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tonic::Code;
use tonic::transport::Endpoint;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_healthy_target_is_unavailable_naming_every_target_and_why() {
    let backends = Backends::start(3).await.unwrap();
    let kit = ready_watch_kit(&backends).await;
    for b in backends.iter() {
        b.set_serving(false).await;
    }
    assert!(eventually(Duration::from_secs(5), || kit.eligible_targets().is_empty()).await);
    let mut client = TestServiceClient::new(kit.channel());
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    let message = status.message();
    assert!(message.starts_with("no healthy targets: "), "{message}");
    for uri in backends.uris() {
        assert!(
            message.contains(&format!("{uri}: unhealthy (NOT_SERVING)")),
            "{message}"
        );
    }
    assert_eq!(backends.total_hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_is_unavailable_naming_the_target_and_when_it_retries() {
    // An open breaker refuses only beside other reasons: here b1 is not serving, and b0's
    // breaker is open while its health check is failing too.
    let backends = Backends::start(2).await.unwrap();
    let kit = ready_watch_kit(&backends).await;
    let (u0, u1) = (backends[0].uri(), backends[1].uri());
    backends[1].set_serving(false).await;
    assert!(
        eventually(Duration::from_secs(5), || kit.eligible_targets()
            == [u0.clone().into()])
        .await
    );
    backends[0].fail_always(Some(Code::Internal));
    let mut client = TestServiceClient::new(kit.channel());
    for _ in 0..5 {
        let status = client.unary(Ping::default()).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::Internal,
            "the backend's own status passes through"
        );
    }
    assert!(matches!(
        kit.card(&u0).unwrap().breaker_state(),
        grpc_client_kit::state::BreakerState::Open { .. }
    ));
    backends[0].set_serving(false).await;
    assert!(
        eventually(Duration::from_secs(5), || {
            kit.card(&u0).unwrap().health().state
                == grpc_client_kit::health::HealthVerdict::Unhealthy
        })
        .await
    );
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let message = status.message();
    assert!(
        message.contains(&format!(
            "{u0}: unhealthy (NOT_SERVING); breaker open, retry in "
        )),
        "{message}"
    );
    assert!(
        message.contains("after 5 consecutive failures (last: INTERNAL"),
        "{message}"
    );
    assert!(
        message.contains(&format!("{u1}: unhealthy (NOT_SERVING)")),
        "{message}"
    );
    assert_eq!(backends[0].hits(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_never_cuts_off_a_target_that_health_says_serves() {
    // One target, its breaker open: passive signals never empty the choice, so calls still
    // reach it (rather than failing with "no target"), and the first success closes it.
    let backends = Backends::start(1).await.unwrap();
    backends[0].fail_always(Some(Code::Internal));
    let kit = Kit::builder()
        .targets(backends.uris())
        .without_health()
        .breaker(BreakerConfig::default().consecutive_failures(3))
        .build()
        .unwrap();
    let uri = backends[0].uri();
    let mut client = TestServiceClient::new(kit.channel());
    for _ in 0..4 {
        let status = client.unary(Ping::default()).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::Internal,
            "the backend answered: {status:?}"
        );
    }
    assert_eq!(
        backends[0].hits(),
        4,
        "the open breaker let the 4th call through"
    );
    assert!(matches!(
        kit.card(&uri).unwrap().breaker_state(),
        grpc_client_kit::state::BreakerState::Open { .. }
    ));
    backends[0].fail_always(None);
    client.unary(Ping::default()).await.unwrap();
    assert_eq!(
        kit.card(&uri).unwrap().breaker_state(),
        grpc_client_kit::state::BreakerState::Closed,
        "a success of a call admitted that way closes the breaker"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_open_breaker_is_unavailable_naming_the_target() {
    // An operator's forced-open breaker is not a passive signal: it holds.
    let backends = Backends::start(1).await.unwrap();
    let kit = Kit::builder()
        .targets(backends.uris())
        .without_health()
        .build()
        .unwrap();
    let uri = backends[0].uri();
    kit.breaker(&uri)
        .unwrap()
        .force_open(Some("maintenance".into()));
    let mut client = TestServiceClient::new(kit.channel());
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let message = status.message();
    assert!(
        message.contains(&format!("{uri}: breaker forced open after maintenance")),
        "{message}"
    );
    assert_eq!(backends[0].hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantine_alone_never_refuses_and_is_named_when_it_adds_to_another_reason() {
    let backends = Backends::start(2).await.unwrap();
    let kit = ready_watch_kit(&backends).await;
    let (u0, u1) = (backends[0].uri(), backends[1].uri());
    let group = kit.quarantine();
    group
        .report_failure_with_reason(&u0, Some(Duration::from_secs(60)), "UNAVAILABLE: test")
        .unwrap();
    group
        .report_failure_with_reason(&u1, Some(Duration::from_secs(60)), "UNAVAILABLE: test")
        .unwrap();
    // Every target quarantined and nothing else wrong: quarantine is ignored, calls go on.
    let mut client = TestServiceClient::new(kit.channel());
    for _ in 0..10 {
        client.unary(Ping::default()).await.unwrap();
    }
    // Quarantined, and unhealthy too: now nothing is eligible, and the status says both.
    group
        .report_failure_with_reason(&u0, Some(Duration::from_secs(60)), "UNAVAILABLE: test")
        .unwrap();
    backends[0].set_serving(false).await;
    backends[1].set_serving(false).await;
    assert!(eventually(Duration::from_secs(5), || kit.eligible_targets().is_empty()).await);
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status
            .message()
            .contains(&format!("{u0}: unhealthy (NOT_SERVING); quarantined ")),
        "{}",
        status.message()
    );
    assert!(
        status.message().contains("after UNAVAILABLE: test"),
        "{}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transport_error_is_unavailable_naming_the_target() {
    let backends = Backends::start(1).await.unwrap();
    let uri = backends[0].uri();
    backends[0].stop().await;
    let kit = Kit::builder()
        .targets([uri.clone()])
        .without_health()
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().starts_with(&format!("{uri}: ")),
        "{}",
        status.message()
    );
    assert!(
        status.message().contains("onnection refused"),
        "{}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_timeout_is_deadline_exceeded_naming_the_target() {
    let backends = Backends::start(1).await.unwrap();
    backends[0].set_delay(Duration::from_secs(5));
    let uri = backends[0].uri();
    let kit = Kit::builder()
        .targets([uri.clone()])
        .without_health()
        .endpoint_template(|uri: &str| {
            Ok(Endpoint::from_shared(uri.to_owned())?.timeout(Duration::from_millis(100)))
        })
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().starts_with(&format!("{uri}: ")),
        "{}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shut_down_kit_is_unavailable() {
    let backends = Backends::start(1).await.unwrap();
    let kit = Kit::builder()
        .targets(backends.uris())
        .health(watch())
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
    client.unary(Ping::default()).await.unwrap();
    kit.shutdown().await;
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status.message().contains("shut down"),
        "{}",
        status.message()
    );
    assert_eq!(backends[0].hits(), 1);
}

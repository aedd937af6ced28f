//! `Check` semantics against real tonic servers on loopback: every answer mapped, every error
//! kept in the target's status record.

mod support;

use std::time::Duration;

use health_layer::{HealthChecker, HealthVerdict, Target, TargetStatus};
use test_backends::{Backend, BlackHole, ServingStatus};

fn checker() -> HealthChecker {
    HealthChecker::builder()
        .interval(Duration::ZERO) // on-demand only: each test drives its probes
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

async fn probe(checker: &HealthChecker, target: impl Into<Target>) -> TargetStatus {
    let target = target.into();
    let name = target.name().to_owned();
    checker.add_target(target).unwrap();
    checker.check_now(&name).await.unwrap()
}

fn assert_unhealthy(status: &TargetStatus, error_prefix: &str) {
    assert_eq!(status.verdict, HealthVerdict::Unhealthy, "{status:?}");
    let error = status.last_error.as_deref().unwrap_or("");
    assert!(
        error.starts_with(error_prefix),
        "{error:?} should start with {error_prefix:?}"
    );
    assert_eq!(status.consecutive_failures, 1);
    assert!(status.last_check.is_some());
    assert!(!status.channel_open, "a failed probe drops its channel");
}

#[tokio::test]
async fn serving_is_healthy_and_the_record_says_so() {
    let b = Backend::start("b0").await.unwrap();
    let checker = checker();
    checker.start(Vec::<&str>::new()).unwrap();
    let before = std::time::SystemTime::now();
    let status = probe(&checker, b.uri()).await;
    assert_eq!(status.verdict, HealthVerdict::Healthy);
    assert_eq!(status.last_error, None);
    assert_eq!(status.consecutive_failures, 0);
    assert!(status.last_check.unwrap() >= before);
    assert_eq!(status.next_check, None, "interval 0");
    assert!(status.channel_open, "a passing probe keeps its channel");
    assert_eq!(
        checker.card(&b.uri()).unwrap().health_verdict(),
        HealthVerdict::Healthy
    );
    assert_eq!(b.health_checks(), 1);
    checker.stop().await;
}

#[tokio::test]
async fn not_serving_is_unhealthy() {
    let b = Backend::start("b0").await.unwrap();
    b.set_serving(false).await;
    let checker = checker();
    checker.start(Vec::<&str>::new()).unwrap();
    let status = probe(&checker, b.uri()).await;
    assert_unhealthy(&status, "NOT_SERVING");
    let card = checker.card(&b.uri()).unwrap();
    assert_eq!(
        card.eligibility().unwrap_err().to_string(),
        format!("{}: unhealthy (NOT_SERVING)", b.uri())
    );
    checker.stop().await;
}

#[tokio::test]
async fn an_unknown_service_is_unhealthy_and_the_error_says_so() {
    let b = Backend::start("b0").await.unwrap();
    let checker = checker();
    checker.start(Vec::<&str>::new()).unwrap();
    let status = probe(&checker, Target::new(b.uri()).service("no.such.Service")).await;
    assert_unhealthy(
        &status,
        "NOT_FOUND: unknown service \"no.such.Service\" (service not registered)",
    );

    // A known service name, set per target or for the whole checker.
    b.set_service_status("my.Service", ServingStatus::Serving)
        .await;
    let named = HealthChecker::builder()
        .interval(Duration::ZERO)
        .service("my.Service")
        .build()
        .unwrap();
    named.start(Vec::<&str>::new()).unwrap();
    assert_eq!(probe(&named, b.uri()).await.verdict, HealthVerdict::Healthy);
    checker.stop().await;
    named.stop().await;
}

#[tokio::test]
async fn unimplemented_is_unhealthy_by_default_and_healthy_with_the_option() {
    let (uri, server) = support::server_without_health().await;
    let checker = checker();
    checker.start(Vec::<&str>::new()).unwrap();
    let status = probe(&checker, uri.as_str()).await;
    assert_unhealthy(
        &status,
        "UNIMPLEMENTED: the server has no grpc.health.v1.Health service",
    );

    let lenient = HealthChecker::builder()
        .interval(Duration::ZERO)
        .unimplemented_is_healthy(true)
        .build()
        .unwrap();
    lenient.start(Vec::<&str>::new()).unwrap();
    let status = probe(&lenient, uri.as_str()).await;
    assert_eq!(status.verdict, HealthVerdict::Healthy);
    assert_eq!(status.last_error, None);
    assert_eq!(
        lenient.card(&uri).unwrap().health().reason.as_deref(),
        Some("UNIMPLEMENTED: no health service; counted as healthy")
    );
    checker.stop().await;
    lenient.stop().await;
    server.abort();
}

#[tokio::test]
async fn no_answer_in_time_is_deadline_exceeded() {
    let hole = BlackHole::start().await.unwrap();
    let checker = HealthChecker::builder()
        .interval(Duration::ZERO)
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    let started = std::time::Instant::now();
    let status = probe(&checker, hole.uri()).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded by the timeout"
    );
    assert_unhealthy(&status, "DEADLINE_EXCEEDED: no answer within 0.3 s");
    assert!(hole.connections_accepted() >= 1, "it did connect");
    checker.stop().await;
}

#[tokio::test]
async fn a_refused_connection_is_unavailable_with_the_os_error() {
    let uri = support::refused_uri();
    let checker = checker();
    checker.start(Vec::<&str>::new()).unwrap();
    let status = probe(&checker, uri.as_str()).await;
    assert_unhealthy(&status, "UNAVAILABLE: connect failed:");
    let error = status.last_error.unwrap();
    assert!(error.contains("Connection refused"), "{error}");
    checker.stop().await;
}

#[tokio::test]
async fn check_once_tells_connection_failures_from_rpc_failures() {
    use health_layer::probe::{self, ProbeFailure};
    use tonic::transport::Endpoint;

    let b = Backend::start("b0").await.unwrap();
    let endpoint = Endpoint::from_shared(b.uri()).unwrap();
    let t = Duration::from_secs(2);
    assert_eq!(
        probe::check_once(&endpoint, "", t).await.unwrap(),
        probe::ServingStatus::Serving
    );
    b.set_serving(false).await;
    assert_eq!(
        probe::check_once(&endpoint, "", t).await.unwrap(),
        probe::ServingStatus::NotServing
    );

    let err = probe::check_once(&endpoint, "nope", t).await.unwrap_err();
    assert!(err.is_rpc() && !err.is_connect());
    assert_eq!(err.code(), Some(tonic::Code::NotFound));
    assert!(matches!(err.failure(), ProbeFailure::Rpc { .. }));

    let refused = Endpoint::from_shared(support::refused_uri()).unwrap();
    let err = probe::check_once(&refused, "", t).await.unwrap_err();
    assert!(err.is_connect() && !err.is_rpc(), "{err}");
    assert!(
        err.to_string()
            .starts_with("health probe of http://127.0.0.1:")
    );

    let hole = BlackHole::start().await.unwrap();
    let slow = Endpoint::from_shared(hole.uri())
        .unwrap()
        .connect_timeout(t);
    let err = probe::check_once(&slow, "", Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(err.is_rpc(), "{err}");
    assert_eq!(err.code(), Some(tonic::Code::DeadlineExceeded));
    // The status is in the error's source chain, where tonic looks for it.
    let status = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<tonic::Status>())
        .unwrap();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
}

//! `Check` semantics against real tonic servers on loopback: every answer mapped, every error
//! kept in the target's status record. Each test runs twice: with targets of the default
//! endpoint template (probed on the checker's own HTTP/2 connections, `mod direct`) and with
//! each target given a tonic `Endpoint` (probed on tonic `Channel`s, `mod channel`): the two
//! must see the same.

mod support;

use std::time::Duration;

use health_layer::{HealthChecker, HealthVerdict, Target, TargetStatus};
use test_backends::{Backend, BlackHole, ServingStatus};

fn checker() -> HealthChecker {
    HealthChecker::builder()
        .interval(Duration::ZERO) // no schedule: each target is probed once, when added
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// Which probe connection a test's targets get.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Via {
    /// The default endpoint template: the checker's own HTTP/2 connection.
    Direct,
    /// An `Endpoint` given with the target: a tonic `Channel`.
    Channel,
}

/// Adds a target and returns its status after the one probe made when it is added.
async fn probe(via: Via, checker: &HealthChecker, target: impl Into<Target>) -> TargetStatus {
    let mut target = target.into();
    let name = target.name().to_owned();
    if via == Via::Channel {
        target = target.endpoint(tonic::transport::Endpoint::from_shared(name.clone()).unwrap());
    }
    checker.add_target(target).unwrap();
    assert!(
        checker.wait_until_ready(Duration::from_secs(10)).await,
        "{name} was probed when added"
    );
    checker.status(&name).unwrap()
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

async fn serving_is_healthy_and_the_record_says_so(via: Via) {
    let b = Backend::start("b0").await.unwrap();
    let checker = checker();
    checker.start(Vec::<&str>::new()).unwrap();
    let before = std::time::SystemTime::now();
    let status = probe(via, &checker, b.uri()).await;
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
    // Which connection carried it: the checker's own, or a tonic `Channel`.
    let agent = last_agent(&b);
    let expected = match via {
        Via::Direct => "health-layer/",
        Via::Channel => "tonic/",
    };
    assert!(agent.starts_with(expected), "{via:?}: {agent}");
    checker.stop().await;
}

async fn not_serving_is_unhealthy(via: Via) {
    let b = Backend::start("b0").await.unwrap();
    b.set_serving(false).await;
    let checker = checker();
    checker.start(Vec::<&str>::new()).unwrap();
    let status = probe(via, &checker, b.uri()).await;
    assert_unhealthy(&status, "NOT_SERVING");
    let card = checker.card(&b.uri()).unwrap();
    assert_eq!(
        card.eligibility().unwrap_err().to_string(),
        format!("{}: unhealthy (NOT_SERVING)", b.uri())
    );
    checker.stop().await;
}

async fn an_unknown_service_is_unhealthy_and_the_error_says_so(via: Via) {
    let b = Backend::start("b0").await.unwrap();
    let checker = checker();
    checker.start(Vec::<&str>::new()).unwrap();
    let status = probe(
        via,
        &checker,
        Target::new(b.uri()).service("no.such.Service"),
    )
    .await;
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
    assert_eq!(
        probe(via, &named, b.uri()).await.verdict,
        HealthVerdict::Healthy
    );
    checker.stop().await;
    named.stop().await;
}

async fn unimplemented_is_healthy_by_default_as_grpc_does_and_unhealthy_when_required(via: Via) {
    // gRFC A17: a server without the health service is assumed to serve.
    let (uri, server) = support::server_without_health().await;
    let checker = checker();
    checker.start(Vec::<&str>::new()).unwrap();
    let status = probe(via, &checker, uri.as_str()).await;
    assert_eq!(status.verdict, HealthVerdict::Healthy, "{status:?}");
    assert_eq!(status.last_error, None);
    assert_eq!(
        checker.card(&uri).unwrap().health().reason.as_deref(),
        Some("UNIMPLEMENTED: no health service; counted as healthy")
    );
    assert!(checker.card(&uri).unwrap().is_eligible());

    // `unimplemented_is_healthy(false)` requires the service.
    let strict = HealthChecker::builder()
        .interval(Duration::ZERO)
        .unimplemented_is_healthy(false)
        .build()
        .unwrap();
    strict.start(Vec::<&str>::new()).unwrap();
    let status = probe(via, &strict, uri.as_str()).await;
    assert_unhealthy(
        &status,
        "UNIMPLEMENTED: the server has no grpc.health.v1.Health service",
    );
    checker.stop().await;
    strict.stop().await;
    server.abort();
}

async fn a_black_hole_is_a_connection_failure_within_the_timeout(via: Via) {
    // Accepts TCP, never answers: not connected until the server has sent its HTTP/2
    // settings, so this is a failure to connect (as grpc_health_probe says), not an RPC's.
    let hole = BlackHole::start().await.unwrap();
    let checker = HealthChecker::builder()
        .interval(Duration::ZERO)
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    let started = std::time::Instant::now();
    let status = probe(via, &checker, hole.uri()).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded by the timeout"
    );
    assert_unhealthy(&status, "UNAVAILABLE: no connection within 0.3 s");
    assert!(hole.connections_accepted() >= 1, "it did connect");
    checker.stop().await;
}

async fn a_kept_connection_the_server_closed_is_made_again_and_is_no_evidence(via: Via) {
    let b = Backend::start("b0").await.unwrap();
    let checker = checker();
    checker.start(Vec::<&str>::new()).unwrap();
    let name = b.uri();
    assert_eq!(
        probe(via, &checker, name.as_str()).await.verdict,
        HealthVerdict::Healthy
    );
    assert_eq!(b.connections_accepted(), 1);

    // Reset under the kept connection (a restart), then closed with a `GOAWAY` (a graceful
    // stop): each time the next check is made on a new connection, and passes.
    b.restart().await.unwrap();
    let status = checker.check_now(&name).await.unwrap();
    assert_eq!(status.verdict, HealthVerdict::Healthy, "{status:?}");
    assert_eq!(status.consecutive_failures, 0);
    b.stop_graceful(Duration::from_millis(100)).await;
    b.restart().await.unwrap();
    let status = checker.check_now(&name).await.unwrap();
    assert_eq!(status.verdict, HealthVerdict::Healthy, "{status:?}");
    assert_eq!(status.consecutive_failures, 0);
    assert!(status.channel_open);
    assert_eq!(b.connections_accepted(), 3, "one new connection each time");
    assert_eq!(b.health_checks(), 3);
    checker.stop().await;
}

/// The user agent of the backend's last request.
fn last_agent(b: &Backend) -> String {
    let headers = b.last_request_headers().unwrap();
    headers["user-agent"].to_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_keepalive_or_a_connector_keeps_a_default_template_target_on_a_channel() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tonic::transport::{Channel, Endpoint};

    let b = Backend::start("b0").await.unwrap();
    let counting = |calls: Arc<AtomicUsize>| {
        move |endpoint: Endpoint| {
            calls.fetch_add(1, Ordering::Relaxed);
            async move { Ok::<Channel, _>(endpoint.connect().await?) }
        }
    };

    // The checker's keepalive: only a `Channel` pings.
    let keepalive = HealthChecker::builder()
        .interval(Duration::ZERO)
        .probe_keepalive(Some(Duration::from_secs(300)))
        .build()
        .unwrap();
    keepalive.start(Vec::<&str>::new()).unwrap();
    let status = probe(Via::Direct, &keepalive, b.uri()).await;
    assert_eq!(status.verdict, HealthVerdict::Healthy, "{status:?}");
    assert!(last_agent(&b).starts_with("tonic/"), "{}", last_agent(&b));
    keepalive.stop().await;

    // The checker's connector, then a target's own: each is called for the connection.
    let calls = Arc::new(AtomicUsize::new(0));
    let connecting = HealthChecker::builder()
        .interval(Duration::ZERO)
        .connector(counting(calls.clone()))
        .build()
        .unwrap();
    connecting.start(Vec::<&str>::new()).unwrap();
    let status = probe(Via::Direct, &connecting, b.uri()).await;
    assert_eq!(status.verdict, HealthVerdict::Healthy, "{status:?}");
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    assert!(last_agent(&b).starts_with("tonic/"), "{}", last_agent(&b));
    connecting.stop().await;

    let calls = Arc::new(AtomicUsize::new(0));
    let checker = checker();
    checker.start(Vec::<&str>::new()).unwrap();
    let target = Target::new(b.uri()).connector(counting(calls.clone()));
    let status = probe(Via::Direct, &checker, target).await;
    assert_eq!(status.verdict, HealthVerdict::Healthy, "{status:?}");
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    assert!(last_agent(&b).starts_with("tonic/"), "{}", last_agent(&b));
    checker.stop().await;
}

/// A TCP server that answers every connection with `reply` (and then closes it).
async fn answering(reply: &'static [u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut first = [0u8; 24];
                let _ = socket.read(&mut first).await;
                let _ = socket.write_all(reply).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    uri
}

async fn a_port_that_speaks_no_grpc_is_unhealthy_and_the_reason_says_what_it_speaks(via: Via) {
    let http1 = answering(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").await;
    // What a TLS server answers to plaintext: an alert record.
    let tls = answering(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46]).await;
    let checker = checker();
    checker.start(Vec::<&str>::new()).unwrap();
    let status = probe(via, &checker, http1.as_str()).await;
    assert_unhealthy(&status, "UNAVAILABLE: connect failed: ");
    let error = status.last_error.unwrap();
    assert!(error.contains("it looks like an HTTP/1 server"), "{error}");

    let status = probe(via, &checker, tls.as_str()).await;
    assert_unhealthy(&status, "UNAVAILABLE: connect failed: ");
    let error = status.last_error.unwrap();
    assert!(
        error.contains("it looks like a TLS server (the endpoint is plaintext)"),
        "{error}"
    );
    checker.stop().await;
}

async fn a_refused_connection_is_unavailable_with_the_os_error(via: Via) {
    let uri = support::refused_uri();
    let checker = checker();
    checker.start(Vec::<&str>::new()).unwrap();
    let status = probe(via, &checker, uri.as_str()).await;
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
        .connect_timeout(Duration::from_millis(200));
    let err = probe::check_once(&slow, "", t).await.unwrap_err();
    assert!(err.is_connect(), "a black hole never connects: {err}");
    assert_eq!(err.code(), Some(tonic::Code::Unavailable));

    // An RPC failure keeps its status in the error's source chain, where tonic looks for it.
    let err = probe::check_once(&endpoint, "nope", t).await.unwrap_err();
    let status = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<tonic::Status>())
        .unwrap();
    assert_eq!(status.code(), tonic::Code::NotFound);
}

/// Each test above, on both kinds of probe connection.
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod direct {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::Via::Direct).await
            })*
        }
        mod channel {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::Via::Channel).await
            })*
        }
    };
}

on_both!(
    serving_is_healthy_and_the_record_says_so,
    not_serving_is_unhealthy,
    an_unknown_service_is_unhealthy_and_the_error_says_so,
    unimplemented_is_healthy_by_default_as_grpc_does_and_unhealthy_when_required,
    a_black_hole_is_a_connection_failure_within_the_timeout,
    a_port_that_speaks_no_grpc_is_unhealthy_and_the_reason_says_what_it_speaks,
    a_refused_connection_is_unavailable_with_the_os_error,
    a_kept_connection_the_server_closed_is_made_again_and_is_no_evidence,
);

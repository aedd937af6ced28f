//! stop, stop_graceful, restart, black_hole, BlackHole, drop.

use std::io::ErrorKind;
use std::time::Duration;

use endpoint_state::error::cause_ref;
use test_backends::pb::{Ping, Pong, SERVICE_NAME};
use test_backends::{Backend, BlackHole, Mode, ServingStatus as Set};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::{channel, check, endpoint, eventually, health_client, test_client, unary};

async fn assert_refused(addr: std::net::SocketAddr) {
    let err = TcpStream::connect(addr)
        .await
        .expect_err("connect should fail");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
}

/// Whether the error chain of `status` holds an I/O "connection reset" (the server's RST).
fn is_connection_reset(status: &tonic::Status) -> bool {
    cause_ref::<std::io::Error>(status).is_some_and(|io| io.kind() == ErrorKind::ConnectionReset)
}

/// A backend whose calls take `delay`, and one call to it in flight (it has reached the server).
async fn slow_call_in_flight(
    delay: Duration,
) -> (Backend, JoinHandle<Result<Pong, tonic::Status>>) {
    let backend = Backend::start("b0").await.unwrap();
    backend.set_delay(delay);
    let mut client = test_client(backend.uri()).await;
    let call = tokio::spawn(async move { unary(&mut client, "slow").await });
    eventually("the slow call reached the server", || async {
        backend.hits() == 1
    })
    .await;
    (backend, call)
}

#[tokio::test]
async fn stop_refuses_new_connections() {
    let backend = Backend::start("b0").await.unwrap();
    TcpStream::connect(backend.addr()).await.unwrap();

    backend.stop().await;

    assert_eq!(backend.mode().await, Mode::Stopped);
    assert_refused(backend.addr()).await;
    let err = endpoint(backend.uri()).connect().await.unwrap_err();
    assert!(err.to_string().contains("transport"), "{err}");
}

#[tokio::test]
async fn stop_fails_an_in_flight_call_promptly() {
    let (backend, call) = slow_call_in_flight(Duration::from_secs(10)).await;

    let stopped_at = Instant::now();
    backend.stop().await;
    let result = tokio::time::timeout(Duration::from_secs(2), call)
        .await
        .expect("the in-flight call should end promptly")
        .unwrap();

    let status = result.expect_err("the in-flight call must fail, not complete");
    assert!(
        is_connection_reset(&status),
        "expected a reset connection, got {status:?}"
    );
    assert!(stopped_at.elapsed() < Duration::from_secs(2));
    // stop() returns only once every connection is gone.
    assert_eq!(backend.open_connections(), 0);
}

#[tokio::test]
async fn restart_serves_on_the_same_port_and_keeps_health() {
    let backend = Backend::start("b0").await.unwrap();
    let addr = backend.addr();
    backend.set_serving(false).await;
    backend
        .set_service_status(SERVICE_NAME, Set::NotServing)
        .await;

    backend.stop().await;
    assert_refused(addr).await;
    backend.restart().await.unwrap();

    assert_eq!(backend.addr(), addr);
    assert_eq!(backend.mode().await, Mode::Serving);
    let mut health = health_client(backend.uri()).await;
    assert_eq!(
        check(&mut health, "").await.unwrap(),
        ServingStatus::NotServing
    );
    assert_eq!(
        check(&mut health, SERVICE_NAME).await.unwrap(),
        ServingStatus::NotServing
    );
    let mut client = test_client(backend.uri()).await;
    assert_eq!(unary(&mut client, "x").await.unwrap().backend, "b0");
}

#[tokio::test]
async fn restart_while_serving_resets_connections_and_serves_again() {
    let backend = Backend::start("b0").await.unwrap();
    let mut client = test_client(backend.uri()).await;
    unary(&mut client, "before").await.unwrap();
    assert_eq!(backend.connections_accepted(), 1);

    backend.restart().await.unwrap();

    assert_eq!(backend.open_connections(), 0);
    // The old channel reconnects on its own to the same port.
    eventually("the old channel works again", || {
        let mut client = client.clone();
        async move { unary(&mut client, "after").await.is_ok() }
    })
    .await;
    assert!(backend.connections_accepted() >= 2);
}

#[tokio::test]
async fn black_hole_accepts_tcp_but_never_answers() {
    let backend = Backend::start("b0").await.unwrap();
    backend.black_hole().await.unwrap();
    assert_eq!(backend.mode().await, Mode::BlackHole);

    TcpStream::connect(backend.addr())
        .await
        .expect("TCP connect to a black hole succeeds");
    let status = call_with_200ms_timeout(backend.uri()).await;
    assert_eq!(status.code(), Code::Cancelled, "{status:?}");
    assert_eq!(backend.hits(), 0);

    backend.restart().await.unwrap();
    let mut client = test_client(backend.uri()).await;
    assert_eq!(unary(&mut client, "back").await.unwrap().backend, "b0");
}

#[tokio::test]
async fn bare_black_hole_times_out_and_stops() {
    let hole = BlackHole::start().await.unwrap();
    let _tcp = TcpStream::connect(hole.addr()).await.unwrap();

    let status = call_with_200ms_timeout(hole.uri()).await;

    assert_eq!(status.code(), Code::Cancelled, "{status:?}");
    assert!(hole.connections_accepted() >= 2);
    let addr = hole.addr();
    hole.stop().await;
    assert_refused(addr).await;
}

/// A unary call with a 200 ms deadline (enforced by the client); returns its error.
async fn call_with_200ms_timeout(uri: String) -> tonic::Status {
    let channel = endpoint(uri)
        .timeout(Duration::from_millis(200))
        .connect_lazy();
    let mut client = test_backends::pb::test_service_client::TestServiceClient::new(channel);
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(3), client.unary(Ping::default()))
        .await
        .expect("the client's own timeout should fire first");
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(200), "{elapsed:?}");
    result.expect_err("a black hole never answers")
}

#[tokio::test]
async fn stop_graceful_lets_in_flight_calls_finish() {
    let (backend, call) = slow_call_in_flight(Duration::from_millis(300)).await;

    backend.stop_graceful(Duration::from_secs(5)).await;

    let pong = call.await.unwrap().expect("a graceful stop drains");
    assert_eq!(pong.payload, "slow");
    assert_eq!(backend.mode().await, Mode::Stopped);
    assert_refused(backend.addr()).await;
}

#[tokio::test]
async fn stop_graceful_kills_what_is_left_after_the_grace() {
    let (backend, call) = slow_call_in_flight(Duration::from_secs(10)).await;

    let started = Instant::now();
    backend.stop_graceful(Duration::from_millis(100)).await;

    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(call.await.unwrap().is_err());
    assert_eq!(backend.open_connections(), 0);
}

#[tokio::test]
async fn dropping_the_last_handle_stops_the_server() {
    let backend = Backend::start("b0").await.unwrap();
    let addr = backend.addr();
    let _channel = channel(backend.uri()).await;

    drop(backend);

    eventually("the port refuses connections", || async {
        TcpStream::connect(addr).await.is_err()
    })
    .await;
}

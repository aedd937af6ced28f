//! Plain tonic clients for the interop tests, and small assertions.

use std::error::Error;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::{Ping, Pong};
use tokio::net::TcpStream;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Upper bound for waiting on something external (a call, a reconnect).
pub(crate) const EVENTUALLY: Duration = Duration::from_secs(10);

/// An endpoint for `uri` with connect and call timeouts, so that nothing hangs a test.
pub(crate) fn endpoint(uri: &str) -> Endpoint {
    Endpoint::from_shared(uri.to_owned())
        .expect("a valid uri")
        .connect_timeout(Duration::from_secs(2))
        .timeout(EVENTUALLY)
}

/// A channel connected to `uri` (panics if it cannot connect).
pub(crate) async fn channel(uri: &str) -> Channel {
    endpoint(uri)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect {uri}: {e}"))
}

/// One `Unary` call.
pub(crate) async fn unary(
    client: &mut TestServiceClient<Channel>,
    payload: &str,
) -> Result<Pong, Status> {
    let ping = Ping {
        payload: payload.to_owned(),
    };
    client.unary(ping).await.map(tonic::Response::into_inner)
}

/// One health `Check` of `service`.
pub(crate) async fn check(
    client: &mut HealthClient<Channel>,
    service: &str,
) -> Result<ServingStatus, Status> {
    let request = HealthCheckRequest {
        service: service.to_owned(),
    };
    Ok(client.check(request).await?.into_inner().status())
}

/// A TCP connect to `127.0.0.1:port` is refused.
pub(crate) async fn assert_refused(port: u16) {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let err = TcpStream::connect(addr).await.expect_err("connect refused");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
}

/// The status, then every error in its source chain, one per line.
pub(crate) fn error_chain(status: &Status) -> String {
    let mut text = format!("{:?}: {:?}", status.code(), status.message());
    let mut source = status.source();
    while let Some(error) = source {
        text.push_str(&format!("\n  caused by: {error}"));
        source = error.source();
    }
    text
}

/// `1.23 s`.
pub(crate) fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// `value` in `[low, high]`, with a message naming `what`.
pub(crate) fn assert_within(what: &str, value: Duration, low: Duration, high: Duration) {
    assert!(
        low <= value && value <= high,
        "{what}: {} not within [{}, {}]",
        secs(value),
        secs(low),
        secs(high)
    );
}

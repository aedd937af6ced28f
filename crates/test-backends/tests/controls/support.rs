//! Client helpers shared by the tests.

use std::future::Future;
use std::time::Duration;

use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::{Ping, Pong};
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Upper bound for waiting on an external event (a socket closing, a task noticing).
pub(crate) const EVENTUALLY: Duration = Duration::from_secs(5);

/// An endpoint for `uri` with a connect timeout, so nothing in a test can hang forever.
pub(crate) use test_backends::fixture::endpoint;

/// A connected channel to `uri`.
pub(crate) async fn channel(uri: String) -> Channel {
    endpoint(uri).connect().await.expect("connect")
}

/// A test-service client on a fresh connection to `uri`.
pub(crate) async fn test_client(uri: String) -> TestServiceClient<Channel> {
    TestServiceClient::new(channel(uri).await)
}

/// A health client on a fresh connection to `uri`.
pub(crate) async fn health_client(uri: String) -> HealthClient<Channel> {
    HealthClient::new(channel(uri).await)
}

/// One unary call.
pub(crate) async fn unary(
    client: &mut TestServiceClient<Channel>,
    payload: &str,
) -> Result<Pong, tonic::Status> {
    let ping = Ping {
        payload: payload.to_owned(),
    };
    client.unary(ping).await.map(tonic::Response::into_inner)
}

/// One health `Check` of `service`.
pub(crate) async fn check(
    client: &mut HealthClient<Channel>,
    service: &str,
) -> Result<ServingStatus, tonic::Status> {
    let request = HealthCheckRequest {
        service: service.to_owned(),
    };
    let response = client.check(request).await?.into_inner();
    Ok(response.status())
}

/// Polls `condition` every 10 ms until it holds; panics with `what` after [`EVENTUALLY`].
pub(crate) async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + EVENTUALLY;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {EVENTUALLY:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

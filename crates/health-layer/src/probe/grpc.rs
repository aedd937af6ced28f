//! The gRPC probe, one call at a time: connect, ask `grpc.health.v1.Health/Check` or start
//! `Watch`, and say what was seen.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use endpoint_state::error::error_chain as chain;
use endpoint_state::time::{FAR, Secs, after};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use super::connect::connect_until;
use super::error::{ConnectionEnd, ProbeError, ProbeFailure};

/// A health status as `grpc.health.v1` defines it (`SERVICE_UNKNOWN` is only sent on `Watch`).
pub use tonic_health::pb::health_check_response::ServingStatus;

/// Connects to `endpoint` now (not lazily), within `limit`: for a plaintext (`http://`)
/// endpoint, connected means the server has sent its HTTP/2 settings (an address that accepts
/// TCP and never answers fails here, and one that answers HTTP/1 or TLS says so); TLS and other
/// endpoints connect as tonic does. The endpoint's own connect timeout applies too.
pub async fn connect(endpoint: &Endpoint, limit: Duration) -> Result<Channel, ProbeError> {
    let target: Arc<str> = endpoint.uri().to_string().into();
    let connections = Arc::default();
    Ok(
        connect_until(&target, endpoint, None, after(limit), limit, &connections)
            .await?
            .0,
    )
}

/// Connects to `endpoint` and asks `grpc.health.v1.Health/Check` about `service` once.
///
/// The connection is bounded by the endpoint's connect timeout if it has one (otherwise by
/// `timeout`), the RPC by `timeout` (sent to the server as the call's deadline too). The
/// channel is closed when this returns.
///
/// `Ok` carries whatever the server answered (`SERVING`, `NOT_SERVING`, `UNKNOWN`); `Err` says
/// whether the connection ([`ProbeError::is_connect`]) or the RPC ([`ProbeError::is_rpc`])
/// failed.
pub async fn check_once(
    endpoint: &Endpoint,
    service: &str,
    timeout: Duration,
) -> Result<ServingStatus, ProbeError> {
    let target: Arc<str> = endpoint.uri().to_string().into();
    let connect_limit = endpoint.get_connect_timeout().unwrap_or(timeout);
    let connections = Arc::default();
    let deadline = after(connect_limit);
    let channel = connect_until(
        &target,
        endpoint,
        None,
        deadline,
        connect_limit,
        &connections,
    )
    .await?
    .0;
    let request = tonic::Request::new(HealthCheckRequest {
        service: service.to_owned(),
    });
    check_on(channel, &target, request, timeout).await
}

/// Asks `grpc.health.v1.Health/Check` once on an existing channel. `request` may carry
/// metadata (headers); its deadline is set to `timeout`. `target` names the endpoint in
/// errors.
pub async fn check_on(
    channel: Channel,
    target: &str,
    request: tonic::Request<HealthCheckRequest>,
    timeout: Duration,
) -> Result<ServingStatus, ProbeError> {
    check_with(&mut HealthClient::new(channel), target, request, timeout).await
}

/// [`check_on`] with a client of your own (one that compresses, say).
pub async fn check_with(
    client: &mut HealthClient<Channel>,
    target: &str,
    mut request: tonic::Request<HealthCheckRequest>,
    timeout: Duration,
) -> Result<ServingStatus, ProbeError> {
    let service: Arc<str> = request.get_ref().service.as_str().into();
    // tonic refuses (panics on) a deadline it cannot write in `grpc-timeout`'s 8 digits of
    // hours: one beyond any timer is no deadline in practice.
    request.set_timeout(timeout.min(FAR));
    let answer = tokio::time::timeout(timeout, client.check(request)).await;
    check_outcome(
        answer.map(|a| a.map(|response| response.get_ref().status)),
        target,
        service,
        timeout,
    )
}

/// What a `Check` about `service` on `target` within `timeout` came to: its answer's raw serving
/// status, a status, or no answer in time (`Err(Elapsed)`). Errors name the target and the
/// service; a status made locally from a timeout is `DEADLINE_EXCEEDED`, a broken connection
/// `UNAVAILABLE` (and says how the connection ended).
pub(crate) fn check_outcome(
    answer: Result<Result<i32, Status>, tokio::time::error::Elapsed>,
    target: impl Into<Arc<str>>,
    service: Arc<str>,
    timeout: Duration,
) -> Result<ServingStatus, ProbeError> {
    let rpc_error = |status: Status| ProbeError::new(target, ProbeFailure::Rpc { service, status });
    match answer {
        Ok(Ok(status)) => Ok(serving_status(status)),
        Ok(Err(status)) => {
            let status = local_timeout_is_deadline(status, timeout);
            let ended = ConnectionEnd::of(&status);
            Err(rpc_error(transport_is_unavailable(status)).with_end(ended))
        }
        Err(_) => Err(rpc_error(Status::deadline_exceeded(format!(
            "no answer within {}",
            Secs(timeout)
        )))),
    }
}

/// A status made on this side from a transport failure (it has a `source`; a status sent by the
/// server never does) that is not already a timeout or `UNAVAILABLE`: the connection broke, which
/// is `UNAVAILABLE` (tonic says `UNKNOWN` or `INTERNAL` for a reset or an h2 error).
pub(crate) fn transport_is_unavailable(status: Status) -> Status {
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => status,
        _ => match status.source() {
            Some(source) => Status::unavailable(format!("connection broken: {}", chain(source))),
            None => status,
        },
    }
}

/// tonic reports its own client-side timeout (the request's `timeout`) as
/// `CANCELLED: Timeout expired`; it is a `DEADLINE_EXCEEDED` (no answer within `timeout`).
pub fn local_timeout_is_deadline(status: Status, timeout: Duration) -> Status {
    if status.code() == Code::Cancelled && status.message() == tonic::TimeoutExpired(()).to_string()
    {
        Status::deadline_exceeded(format!("no answer within {}", Secs(timeout)))
    } else {
        status
    }
}

/// An unknown enum value counts as `UNKNOWN` (never as serving).
pub fn serving_status(raw: i32) -> ServingStatus {
    ServingStatus::try_from(raw).unwrap_or(ServingStatus::Unknown)
}

/// Starts `grpc.health.v1.Health/Watch` about `service`, waiting at most until `deadline` for
/// the response headers (`limit` is how long that was, for the error).
pub(crate) async fn watch_on(
    channel: Channel,
    target: &Arc<str>,
    service: &Arc<str>,
    deadline: Instant,
    limit: Duration,
) -> Result<tonic::Streaming<HealthCheckResponse>, ProbeError> {
    let mut client = HealthClient::new(channel);
    let request = tonic::Request::new(HealthCheckRequest {
        service: service.to_string(),
    });
    let rpc_error = |status: Status| {
        ProbeError::new(
            target.clone(),
            ProbeFailure::Rpc {
                service: service.clone(),
                status,
            },
        )
    };
    match tokio::time::timeout_at(deadline, client.watch(request)).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => {
            let ended = ConnectionEnd::of(&status);
            Err(rpc_error(transport_is_unavailable(status)).with_end(ended))
        }
        Err(_) => Err(rpc_error(Status::deadline_exceeded(format!(
            "no answer to Watch within {}",
            Secs(limit)
        )))),
    }
}

//! Probes: one look at a target, and what it found.
//!
//! The checker runs these on the probe's own channel, never on an application channel. They
//! are also usable alone: [`check_once`] connects to one endpoint, asks
//! `grpc.health.v1.Health/Check` once and says what it saw, with a [`ProbeError`] that keeps
//! connection failures ([`ProbeFailure::Connect`]) apart from RPC failures
//! ([`ProbeFailure::Rpc`]) — what a `grpc_health_probe`-style command needs for its exit code.
//!
//! ```no_run
//! use std::time::Duration;
//! use health_layer::probe::{self, ServingStatus};
//! use tonic::transport::Endpoint;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let endpoint = Endpoint::from_static("http://127.0.0.1:50051")
//!     .connect_timeout(Duration::from_secs(1));
//! match probe::check_once(&endpoint, "", Duration::from_secs(1)).await {
//!     Ok(ServingStatus::Serving) => println!("serving"),
//!     Ok(other) => println!("not serving: {}", other.as_str_name()),
//!     Err(e) if e.is_connect() => println!("cannot connect: {e}"),
//!     Err(e) => println!("health RPC failed: {e}"),
//! }
//! # }
//! ```

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::error::BoxError;

mod connect;
#[cfg(feature = "http-probe")]
mod http_probe;
pub(crate) use connect::{ProbeConn, connect_until};
#[cfg(feature = "http-probe")]
pub use http_probe::{HttpAnswer, HttpProbe};

/// A health status as `grpc.health.v1` defines it (`SERVICE_UNKNOWN` is only sent on `Watch`).
pub use tonic_health::pb::health_check_response::ServingStatus;

/// Seconds with one decimal, as operators read them.
pub(crate) struct Secs(pub(crate) Duration);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.1} s", self.0.as_secs_f64())
    }
}

pub(crate) use endpoint_state::error_chain as chain;

/// What a probe found wrong. See [`ProbeError`].
#[derive(Debug)]
#[non_exhaustive]
pub enum ProbeFailure {
    /// No connection: refused, unreachable, name resolution, TLS handshake, or no connection
    /// within the time allowed.
    Connect {
        /// `Some(limit)` when the connection was not up within `limit`.
        timed_out: Option<Duration>,
        /// The transport's error, when there was one.
        source: Option<BoxError>,
    },
    /// Connected, but the health RPC failed: a gRPC status from the server (`UNIMPLEMENTED`,
    /// `NOT_FOUND` for an unknown service name, ...), a local deadline (`DEADLINE_EXCEEDED`),
    /// or the connection failing mid-call (`UNAVAILABLE`).
    Rpc {
        /// The service name asked about.
        service: Arc<str>,
        /// The status.
        status: Status,
    },
    /// The server answered, and the answer is not `SERVING`.
    NotServing {
        /// The service name asked about.
        service: Arc<str>,
        /// What it answered.
        status: ServingStatus,
    },
    /// A probe without phases of its own (HTTP, custom) did not finish in time.
    TimedOut {
        /// The time allowed.
        after: Duration,
    },
    /// The HTTP probe's answer did not satisfy its predicate, or the request failed.
    Http {
        /// The URL requested.
        url: String,
        /// The HTTP status, when an answer came.
        status: Option<http::StatusCode>,
        /// Why the answer does not count as healthy.
        reason: String,
    },
    /// A custom probe's error.
    Custom(BoxError),
}

/// A probe of one target did not see it serving.
///
/// Displays as `health probe of http://127.0.0.1:50051 failed: NOT_SERVING`; [`reason`] gives
/// the part after the colon, which is what the checker keeps as the target's last error.
///
/// [`reason`]: ProbeError::reason
#[derive(Debug)]
pub struct ProbeError {
    target: Arc<str>,
    failure: ProbeFailure,
    /// How the probe's connection ended, when a transport error on an established
    /// connection ended the probe.
    ended: Option<ConnectionEnd>,
}

/// How a probe's connection ended, read from the transport error's chain (see
/// [`endpoint_state::transport`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnectionEnd {
    /// `GOAWAY ENHANCE_YOUR_CALM "too_many_pings"`: this client pings too often (gRFC A8).
    TooManyPings,
    /// Any other transport failure: a `GOAWAY` (max connection age or idle, a graceful
    /// stop), a reset, a refused reconnect.
    Broken,
}

impl ConnectionEnd {
    /// What the status of a failed RPC says about its connection: `None` for a status the
    /// server sent (or a local timeout), which says nothing about the connection.
    pub(crate) fn of(status: &Status) -> Option<Self> {
        let source = status.source()?;
        if endpoint_state::transport::too_many_pings(source) {
            Some(ConnectionEnd::TooManyPings)
        } else {
            Some(ConnectionEnd::Broken)
        }
    }
}

impl ProbeError {
    /// A probe error of `target`.
    pub fn new(target: impl Into<Arc<str>>, failure: ProbeFailure) -> Self {
        ProbeError {
            target: target.into(),
            failure,
            ended: None,
        }
    }

    pub(crate) fn with_end(mut self, ended: Option<ConnectionEnd>) -> Self {
        self.ended = ended;
        self
    }

    /// Whether a transport failure of an established connection (rather than the server's
    /// answer, or a timeout) ended the probe: the connection is gone, and a new one may well
    /// work (a `GOAWAY` for max connection age or idleness, a reset).
    pub fn connection_ended(&self) -> bool {
        self.ended.is_some()
    }

    /// Whether the server closed the probe's connection with `GOAWAY ENHANCE_YOUR_CALM`
    /// `"too_many_pings"` (gRFC A8): the client's HTTP/2 keepalive pings came more often than
    /// the server allows.
    pub fn is_too_many_pings(&self) -> bool {
        self.ended == Some(ConnectionEnd::TooManyPings)
    }

    /// The target probed.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// What went wrong.
    pub fn failure(&self) -> &ProbeFailure {
        &self.failure
    }

    /// Whether no connection could be made (`grpc_health_probe` exit code 2).
    pub fn is_connect(&self) -> bool {
        matches!(self.failure, ProbeFailure::Connect { .. })
    }

    /// Whether the health RPC failed after connecting, or timed out (exit code 3).
    pub fn is_rpc(&self) -> bool {
        matches!(
            self.failure,
            ProbeFailure::Rpc { .. } | ProbeFailure::TimedOut { .. }
        )
    }

    /// The gRPC status of an RPC failure.
    pub fn status(&self) -> Option<&Status> {
        match &self.failure {
            ProbeFailure::Rpc { status, .. } => Some(status),
            _ => None,
        }
    }

    /// The gRPC code that best describes the failure: the RPC's own code, `UNAVAILABLE` for a
    /// connection failure, `DEADLINE_EXCEEDED` for a timeout; `None` for an answer that is not
    /// `SERVING` and for HTTP and custom failures.
    pub fn code(&self) -> Option<Code> {
        match &self.failure {
            ProbeFailure::Rpc { status, .. } => Some(status.code()),
            ProbeFailure::Connect { .. } => Some(Code::Unavailable),
            ProbeFailure::TimedOut { .. } => Some(Code::DeadlineExceeded),
            _ => None,
        }
    }

    /// The failure in words, without the target: `NOT_SERVING`,
    /// `UNAVAILABLE: connect failed: tcp connect error: Connection refused (os error 111)`,
    /// `NOT_FOUND: unknown service "x" (service not registered)`, ...
    pub fn reason(&self) -> String {
        match &self.failure {
            ProbeFailure::Connect { timed_out, source } => match (timed_out, source) {
                (Some(limit), _) => format!("UNAVAILABLE: no connection within {}", Secs(*limit)),
                (None, Some(source)) => {
                    format!("UNAVAILABLE: connect failed: {}", chain(&**source))
                }
                (None, None) => "UNAVAILABLE: connect failed".to_owned(),
            },
            ProbeFailure::Rpc { service, status } => rpc_reason(service, status),
            ProbeFailure::NotServing { service, status } => {
                if *status == ServingStatus::ServiceUnknown {
                    format!(
                        "SERVICE_UNKNOWN: the server does not know service {:?}",
                        &**service
                    )
                } else {
                    status.as_str_name().to_owned()
                }
            }
            ProbeFailure::TimedOut { after } => {
                format!("DEADLINE_EXCEEDED: no answer within {}", Secs(*after))
            }
            ProbeFailure::Http {
                url,
                status,
                reason,
            } => match status {
                Some(s) => format!("GET {url}: HTTP {s}: {reason}"),
                None => format!("GET {url}: {reason}"),
            },
            ProbeFailure::Custom(e) => chain(&**e),
        }
    }
}

fn rpc_reason(service: &str, status: &Status) -> String {
    let code = endpoint_state::code_name(status.code());
    let mut out = code.to_owned();
    match status.code() {
        Code::NotFound => {
            out.push_str(&format!(": unknown service {service:?}"));
            if !status.message().is_empty() {
                out.push_str(&format!(" ({})", status.message()));
            }
            return out;
        }
        Code::Unimplemented => {
            out.push_str(": the server has no grpc.health.v1.Health service");
            if !status.message().is_empty() {
                out.push_str(&format!(" ({})", status.message()));
            }
            return out;
        }
        _ => {}
    }
    if !status.message().is_empty() {
        out.push_str(": ");
        out.push_str(status.message());
    }
    if let Some(source) = status.source() {
        let more = chain(source);
        if !out.ends_with(&more) {
            out.push_str(": ");
            out.push_str(&more);
        }
    }
    out
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "health probe of {} failed: {}",
            self.target,
            self.reason()
        )
    }
}

impl Error for ProbeError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match &self.failure {
            ProbeFailure::Connect {
                source: Some(s), ..
            } => Some(&**s),
            ProbeFailure::Rpc { status, .. } => Some(status),
            ProbeFailure::Custom(e) => Some(&**e),
            _ => None,
        }
    }
}

/// Connects to `endpoint` now (not lazily), within `limit`: for a plaintext (`http://`)
/// endpoint, connected means the server has sent its HTTP/2 settings (an address that accepts
/// TCP and never answers fails here, and one that answers HTTP/1 or TLS says so); TLS and other
/// endpoints connect as tonic does. The endpoint's own connect timeout applies too.
pub async fn connect(endpoint: &Endpoint, limit: Duration) -> Result<Channel, ProbeError> {
    let target: Arc<str> = endpoint.uri().to_string().into();
    let deadline = Instant::now().checked_add(limit).unwrap_or_else(far_future);
    let connections = Arc::default();
    Ok(
        connect_until(&target, endpoint, deadline, limit, &connections)
            .await?
            .channel,
    )
}

/// An instant no timer reaches.
pub(crate) fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(60 * 60 * 24 * 365 * 30)
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
    let deadline = Instant::now()
        .checked_add(connect_limit)
        .unwrap_or_else(far_future);
    let connections = Arc::default();
    let channel = connect_until(&target, endpoint, deadline, connect_limit, &connections)
        .await?
        .channel;
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
    mut request: tonic::Request<HealthCheckRequest>,
    timeout: Duration,
) -> Result<ServingStatus, ProbeError> {
    let service: Arc<str> = request.get_ref().service.as_str().into();
    request.set_timeout(timeout);
    let mut client = HealthClient::new(channel);
    let answer = tokio::time::timeout(timeout, client.check(request)).await;
    let rpc_error = |status: Status| {
        ProbeError::new(
            target,
            ProbeFailure::Rpc {
                service: service.clone(),
                status,
            },
        )
    };
    match answer {
        Ok(Ok(response)) => Ok(serving_status(response.get_ref().status)),
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

/// tonic reports its own client-side timeout as `CANCELLED: Timeout expired`; it is a deadline.
fn local_timeout_is_deadline(status: Status, timeout: Duration) -> Status {
    if status.code() == Code::Cancelled && status.message() == tonic::TimeoutExpired(()).to_string()
    {
        Status::deadline_exceeded(format!("no answer within {}", Secs(timeout)))
    } else {
        status
    }
}

/// An unknown enum value counts as `UNKNOWN` (never as serving).
pub(crate) fn serving_status(raw: i32) -> ServingStatus {
    ServingStatus::try_from(raw).unwrap_or(ServingStatus::Unknown)
}

/// Starts `grpc.health.v1.Health/Watch` about `service`, waiting at most until `deadline` for
/// the response headers.
pub(crate) async fn watch_on(
    channel: Channel,
    target: &Arc<str>,
    service: &Arc<str>,
    deadline: Instant,
    limit: Duration,
) -> Result<tonic::Streaming<tonic_health::pb::HealthCheckResponse>, ProbeError> {
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

/// The future a [`CustomProbe`] returns.
pub type ProbeFuture = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'static>>;

/// Any probe the user writes: given the target's name, succeed when it is healthy.
///
/// The checker bounds it by the probe timeout ([`ProbeFailure::TimedOut`]). An error that is a
/// [`ProbeError`] is kept as it is (so a custom probe may call [`check_on`]); any other error
/// becomes [`ProbeFailure::Custom`].
///
/// ```
/// use health_layer::probe::CustomProbe;
/// let probe = CustomProbe::new(|target: std::sync::Arc<str>| async move {
///     if target.ends_with(":1") { Err("port 1 is never healthy".into()) } else { Ok(()) }
/// });
/// # let _ = probe;
/// ```
#[derive(Clone)]
pub struct CustomProbe {
    f: Arc<dyn Fn(Arc<str>) -> ProbeFuture + Send + Sync>,
}

impl CustomProbe {
    /// A probe from an async function of the target's name.
    pub fn new<F, Fut>(f: F) -> Self
    where
        F: Fn(Arc<str>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        CustomProbe {
            f: Arc::new(move |target| Box::pin(f(target))),
        }
    }

    pub(crate) fn call(&self, target: Arc<str>) -> ProbeFuture {
        (self.f)(target)
    }
}

impl fmt::Debug for CustomProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomProbe").finish_non_exhaustive()
    }
}

/// Runs a custom probe with a time limit, turning its error into a [`ProbeError`].
pub(crate) async fn run_custom(
    probe: &CustomProbe,
    target: &Arc<str>,
    limit: Duration,
) -> Result<(), ProbeError> {
    match tokio::time::timeout(limit, probe.call(target.clone())).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(match e.downcast::<ProbeError>() {
            Ok(probe_error) => *probe_error,
            Err(other) => ProbeError::new(target.clone(), ProbeFailure::Custom(other)),
        }),
        Err(_) => Err(ProbeError::new(
            target.clone(),
            ProbeFailure::TimedOut { after: limit },
        )),
    }
}

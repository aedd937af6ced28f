//! What a probe found wrong: [`ProbeError`] and its [`ProbeFailure`], in the words the checker
//! keeps as a target's reason.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use endpoint_state::BoxError;
use endpoint_state::error::error_chain as chain;
use endpoint_state::time::Secs;
use tonic::{Code, Status};
use tonic_health::pb::health_check_response::ServingStatus;

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
    let about = match status.code() {
        Code::NotFound => format!(": unknown service {service:?}"),
        Code::Unimplemented => ": the server has no grpc.health.v1.Health service".to_owned(),
        _ => {
            let text = status_text(status);
            if !text.is_empty() {
                out.push_str(": ");
                out.push_str(&text);
            }
            return out;
        }
    };
    out.push_str(&about);
    if !status.message().is_empty() {
        out.push_str(&format!(" ({})", status.message()));
    }
    out
}

/// A status's message followed by its cause (the transport error's chain, for a status made on
/// this side from a broken connection), without repeating what the message already says:
/// `connection broken: h2 protocol error: ...`.
pub fn status_text(status: &Status) -> String {
    let mut text = status.message().to_owned();
    if let Some(source) = status.source() {
        let more = chain(source);
        if !text.ends_with(&more) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&more);
        }
    }
    text
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

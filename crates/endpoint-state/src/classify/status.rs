//! A call's gRPC status, wherever it was found, and the names of the codes.

use std::error::Error;
use std::fmt;

use http::HeaderMap;
use tonic::Code;

use crate::error::error_chain;

/// `grpc-status`, as a ready header name (a string key would be parsed on every lookup).
static GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");

/// The canonical gRPC name of a code, as it appears in specs and logs (`UNAVAILABLE`).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The code a configuration names: by gRPC's name (`"UNAVAILABLE"`, any case) or by number
/// (`"14"`); `None` for anything else.
///
/// ```
/// use endpoint_state::classify::code_by_name;
/// assert_eq!(code_by_name("unavailable"), Some(tonic::Code::Unavailable));
/// assert_eq!(code_by_name("4"), Some(tonic::Code::DeadlineExceeded));
/// assert_eq!(code_by_name("17"), None);
/// ```
pub fn code_by_name(name: &str) -> Option<Code> {
    let wanted = name.trim();
    (0..=16)
        .map(Code::from_i32)
        .find(|c| code_name(*c).eq_ignore_ascii_case(wanted) || (*c as i32).to_string() == wanted)
}

/// Where an outcome was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OutcomeSource {
    /// The service returned `Err` instead of a response (a transport error or a timeout).
    ServiceError,
    /// `grpc-status` in the response headers: a trailers-only response.
    Headers,
    /// No `grpc-status` in the headers and an HTTP status other than 200, mapped as gRPC
    /// specifies.
    HttpStatus,
    /// `grpc-status` in the trailers at the end of the body.
    Trailers,
    /// The body failed while being read (connection reset, h2 error).
    BodyError,
    /// The body ended without a `grpc-status` (a protocol violation; counted as `UNKNOWN`
    /// as tonic does).
    MissingStatus,
    /// The response is not gRPC: `200 OK` with a `content-type` other than
    /// `application/grpc[+…|;…]` (an HTML page from a proxy, say). Counted as gRPC maps the
    /// HTTP status (`UNKNOWN` for 200), as grpc-go and grpc-java report it.
    NotGrpc,
    /// The response said gRPC, but its data is no gRPC message the client can decode (a
    /// compression flag other than 0 and 1, or a compressed message without `grpc-encoding`):
    /// counted as `INTERNAL`, as tonic's decoder reports it.
    Malformed,
}

/// The status a finished call ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallStatus {
    /// The gRPC code (`Ok` for success).
    pub code: Code,
    /// The status message or, for transport errors, the error chain in words.
    pub message: String,
    /// Where the status was found.
    pub source: OutcomeSource,
}

impl CallStatus {
    /// A status with no message.
    pub fn new(code: Code, source: OutcomeSource) -> Self {
        CallStatus {
            code,
            message: String::new(),
            source,
        }
    }

    /// The status of a call whose service returned `err`.
    ///
    /// The error chain is searched for a `tonic::Status` (its code is kept, except the
    /// `CANCELLED` tonic makes of its own local timeout — a status caused by a
    /// `tonic::TimeoutExpired` — which is `DEADLINE_EXCEEDED`; a server's own `CANCELLED` stays
    /// `CANCELLED`, whatever its message says), and for a timeout (`tonic::TimeoutExpired`,
    /// tower's and tokio's `Elapsed`: `DEADLINE_EXCEEDED`); anything else is a transport
    /// failure: `UNAVAILABLE`. The message is the whole chain.
    pub fn from_error(err: &(dyn Error + 'static)) -> Self {
        let message = error_chain(err);
        let mut cur = Some(err);
        while let Some(e) = cur {
            if let Some(not_grpc) = e.downcast_ref::<NotGrpcResponse>() {
                return not_grpc.call_status().clone();
            }
            if let Some(status) = e.downcast_ref::<tonic::Status>() {
                let local_timeout =
                    status.code() == Code::Cancelled && status.source().is_some_and(is_timeout);
                return CallStatus {
                    code: if local_timeout {
                        Code::DeadlineExceeded
                    } else {
                        status.code()
                    },
                    message: status.message().to_owned(),
                    source: OutcomeSource::ServiceError,
                };
            }
            if is_timeout_error(e) {
                return CallStatus {
                    code: Code::DeadlineExceeded,
                    message,
                    source: OutcomeSource::ServiceError,
                };
            }
            cur = e.source();
        }
        CallStatus {
            code: Code::Unavailable,
            message,
            source: OutcomeSource::ServiceError,
        }
    }

    /// The status carried by `grpc-status` (and `grpc-message`) in `headers`, if any.
    pub fn from_headers(headers: &HeaderMap, source: OutcomeSource) -> Option<Self> {
        let value = headers.get(&GRPC_STATUS)?;
        let code = value
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .map(Code::from_i32)
            .unwrap_or(Code::Unknown);
        if code == Code::Ok {
            // The common case: no message to decode, nothing to allocate.
            return Some(CallStatus::new(Code::Ok, source));
        }
        let message = tonic::Status::from_header_map(headers)
            .map(|s| s.message().to_owned())
            .unwrap_or_default();
        Some(CallStatus {
            code,
            message,
            source,
        })
    }

    /// The gRPC mapping of an HTTP status that came without `grpc-status`.
    pub fn from_http_status(status: http::StatusCode) -> Self {
        let code = match status.as_u16() {
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502 | 503 | 504 => Code::Unavailable,
            _ => Code::Unknown,
        };
        CallStatus {
            code,
            message: format!("HTTP status {} without grpc-status", status.as_u16()),
            source: OutcomeSource::HttpStatus,
        }
    }
}

impl CallStatus {
    /// The status of a response that is not gRPC: HTTP `status` with a `content_type` other
    /// than gRPC's. Its code is what gRPC maps the HTTP status to (`UNKNOWN` for 200, `UNAVAILABLE`
    /// for 503), as grpc-go and grpc-java report it; the message names both (the content type
    /// clipped: a server chose it).
    pub fn not_grpc(status: http::StatusCode, content_type: &[u8]) -> Self {
        let mut this = CallStatus::from_http_status(status);
        let content_type = String::from_utf8_lossy(content_type);
        this.message = format!(
            "not a gRPC response: HTTP status {}, content-type {:?}",
            status.as_u16(),
            crate::text::clip(&content_type, 64)
        );
        this.source = OutcomeSource::NotGrpc;
        this
    }

    /// The status of `response` when its headers show it is not a gRPC response: no
    /// `grpc-status`, and a `content-type` that is not `application/grpc[+…|;…]` (an HTML page
    /// from a proxy: [`not_grpc`](Self::not_grpc)) or an HTTP status other than 200
    /// ([`from_http_status`](Self::from_http_status)). `None` for a gRPC response (a response
    /// without a `content-type` is taken for one, as tonic takes it). The one rule every layer
    /// of the kit uses.
    pub fn of_non_grpc_response<B>(response: &http::Response<B>) -> Option<Self> {
        let headers = response.headers();
        if headers.contains_key(&GRPC_STATUS) {
            return None;
        }
        if let Some(content_type) = headers.get(http::header::CONTENT_TYPE)
            && !is_grpc_content_type(content_type.as_bytes())
        {
            return Some(CallStatus::not_grpc(
                response.status(),
                content_type.as_bytes(),
            ));
        }
        (response.status() != http::StatusCode::OK)
            .then(|| CallStatus::from_http_status(response.status()))
    }

    /// The status of a reply whose data the client cannot decode (`what` says why): `INTERNAL`,
    /// as tonic's decoder reports it.
    pub fn malformed(what: impl fmt::Display) -> Self {
        CallStatus {
            code: Code::Internal,
            message: format!("malformed gRPC message: {what}"),
            source: OutcomeSource::Malformed,
        }
    }
}

/// Whether `err` or its chain is a local timeout (tonic's `TimeoutExpired`, tower's or
/// tokio's `Elapsed`).
fn is_timeout(err: &(dyn Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if is_timeout_error(e) {
            return true;
        }
        cur = e.source();
    }
    false
}

fn is_timeout_error(e: &(dyn Error + 'static)) -> bool {
    e.is::<tonic::TimeoutExpired>()
        || e.is::<tower::timeout::error::Elapsed>()
        || e.is::<tokio::time::error::Elapsed>()
}

/// Whether a `content-type` says gRPC: `application/grpc`, alone or followed by `+` (a
/// subtype such as `+proto`) or `;` (parameters), case aside — grpc-go's rule.
pub(crate) fn is_grpc_content_type(value: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    value.len() >= GRPC.len()
        && value[..GRPC.len()].eq_ignore_ascii_case(GRPC)
        && matches!(value.get(GRPC.len()), None | Some(b'+' | b';'))
}

/// A call's error when the target answered with something that is not a gRPC response (see
/// [`CallStatus::of_non_grpc_response`]): an HTML page from a proxy, a load balancer's `503`.
///
/// A transport that checks responses (the kit's does, for every target) fails the call with
/// it; its [`source`](Error::source) is the [`tonic::Status`] a generated client receives,
/// whose message names the target. [`CallStatus::from_error`] finds it, with its
/// [`OutcomeSource`] (`NotGrpc` or `HttpStatus`), so that every layer judges it the same way.
///
/// ```
/// use endpoint_state::classify::{CallStatus, NotGrpcResponse, OutcomeSource};
///
/// let page = http::Response::builder()
///     .header("content-type", "text/html")
///     .body(())
///     .unwrap();
/// let err = NotGrpcResponse::check("http://10.0.0.7:8080", &page).unwrap();
/// assert_eq!(err.status().code(), tonic::Code::Unknown);
/// assert_eq!(
///     err.to_string(),
///     "http://10.0.0.7:8080: not a gRPC response: HTTP status 200, content-type \"text/html\"",
/// );
/// assert_eq!(CallStatus::from_error(&err).source, OutcomeSource::NotGrpc);
/// ```
#[derive(Debug)]
pub struct NotGrpcResponse {
    call: CallStatus,
    status: tonic::Status,
}

impl NotGrpcResponse {
    /// `Some` when `response` (from `target`) is not a gRPC response.
    pub fn check<B>(target: &str, response: &http::Response<B>) -> Option<Self> {
        let call = CallStatus::of_non_grpc_response(response)?;
        let status = tonic::Status::new(call.code, format!("{target}: {}", call.message));
        Some(NotGrpcResponse { call, status })
    }

    /// How the call ended, as the layers judge it.
    pub fn call_status(&self) -> &CallStatus {
        &self.call
    }

    /// The status a gRPC client receives.
    pub fn status(&self) -> &tonic::Status {
        &self.status
    }
}

impl fmt::Display for NotGrpcResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.status.message())
    }
}

impl Error for NotGrpcResponse {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.status)
    }
}

impl fmt::Display for CallStatus {
    /// `UNAVAILABLE: connection refused`, or just `UNAVAILABLE` without a message.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(code_name(self.code))?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

pub(crate) fn missing_status() -> CallStatus {
    CallStatus {
        code: Code::Unknown,
        message: "stream ended without a grpc-status".to_owned(),
        source: OutcomeSource::MissingStatus,
    }
}

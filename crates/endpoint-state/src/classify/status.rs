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

/// Where an outcome was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// The error chain is searched for a `tonic::Status` (its code is kept, except tonic's own
    /// `CANCELLED: Timeout expired`, which is a local timeout), and for a timeout
    /// (`tonic::TimeoutExpired`, tower's and tokio's `Elapsed`: `DEADLINE_EXCEEDED`); anything
    /// else is a transport failure: `UNAVAILABLE`. The message is the whole chain.
    pub fn from_error(err: &(dyn Error + 'static)) -> Self {
        let message = error_chain(err);
        let mut cur = Some(err);
        while let Some(e) = cur {
            if let Some(status) = e.downcast_ref::<tonic::Status>() {
                let code = if status.code() == Code::Cancelled
                    && status.message() == tonic::TimeoutExpired(()).to_string()
                {
                    Code::DeadlineExceeded
                } else {
                    status.code()
                };
                return CallStatus {
                    code,
                    message: status.message().to_owned(),
                    source: OutcomeSource::ServiceError,
                };
            }
            if e.is::<tonic::TimeoutExpired>()
                || e.is::<tower::timeout::error::Elapsed>()
                || e.is::<tokio::time::error::Elapsed>()
            {
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

//! The kit's errors.
//!
//! Every error a call through a [`KitChannel`](crate::KitChannel) can end with reaches a
//! generated tonic client as a proper gRPC [`Status`] — never `UNKNOWN` — whose message names
//! the target(s) and why:
//!
//! | condition | error | code |
//! |---|---|---|
//! | no target is eligible (unhealthy, breaker open, ...) | [`NoHealthyTargets`](crate::balance::NoHealthyTargets) | `UNAVAILABLE` (`DEADLINE_EXCEEDED` when a wait-for-ready call ran out its own deadline) |
//! | ... and the DNS name cannot be resolved | [`DiscoveryFailed`] | `UNAVAILABLE` |
//! | a transport error on the chosen target (refused, reset, ...) | [`TransportError`] | `UNAVAILABLE` (`DEADLINE_EXCEEDED` for a local timeout) |
//! | the target answered with something that is not gRPC (a proxy's HTML page, a `503` without `grpc-status`) | [`NotGrpcResponse`] | gRPC's mapping of the HTTP status: `UNKNOWN` for 200, `UNAVAILABLE` for 502/503/504, ... |
//! | the call's deadline passed inside the kit (connecting, waiting for headers, reading the body) | [`DeadlineExceeded`] | `DEADLINE_EXCEEDED` |
//! | the server answered `CANCELLED` once the call's deadline had passed (it gave up as the deadline ran out) | the server's status, rewritten | `DEADLINE_EXCEEDED` (a `CANCELLED` before the deadline stays) |
//! | the kit was shut down | [`KitShutDown`] | `UNAVAILABLE` |
//!
//! Each is a typed error whose [`source`](Error::source) is the matching [`Status`]: tonic finds
//! it by walking the chain. Statuses a backend answers with pass through untouched.
//!
//! Building a kit fails with [`BuildError`]: an [`InvalidConfig`] naming the field and the value,
//! and nothing started.

use endpoint_state::ConfigError;
use std::error::Error;
use std::fmt;
use std::sync::Arc;

use endpoint_state::CallStatus;
use tonic::{Code, Status};

/// tower's usual boxed error.
pub use endpoint_state::BoxError;
pub use endpoint_state::NotGrpcResponse;

/// A configuration value the kit refuses: the core's [`ConfigError`], naming the field (as a
/// path in the configuration file, `breaker.open.jitter`) and the value. Nothing was started.
///
/// Displays as `invalid grpc-client-kit configuration: breaker.open.jitter = 1.5: expected a
/// fraction in [0, 1)`; a layer's own error is its [`source`](Error::source).
pub type InvalidConfig = ConfigError;

/// The kit's configuration's name in its errors (`invalid grpc-client-kit configuration: ...`).
pub(crate) const CONFIG: &str = "grpc-client-kit";

/// [`KitBuilder::build`](crate::KitBuilder::build) refused to build: nothing was started (no
/// task, no connection, no probe).
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// A setting is invalid.
    InvalidConfig(InvalidConfig),
    /// `build` was called outside a tokio runtime (the kit's tasks need one).
    NoRuntime,
}

impl BuildError {
    /// The invalid setting, if that is what failed.
    pub fn invalid_config(&self) -> Option<&ConfigError> {
        match self {
            BuildError::InvalidConfig(e) => Some(e),
            BuildError::NoRuntime => None,
        }
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::InvalidConfig(e) => e.fmt(f),
            BuildError::NoRuntime => {
                f.write_str("grpc-client-kit must be built inside a tokio runtime")
            }
        }
    }
}

impl Error for BuildError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            BuildError::InvalidConfig(e) => Some(e),
            BuildError::NoRuntime => None,
        }
    }
}

impl From<ConfigError> for BuildError {
    fn from(e: InvalidConfig) -> Self {
        BuildError::InvalidConfig(e)
    }
}

/// A call failed in the transport to its target (connection refused or reset, an HTTP/2 error,
/// a local timeout) — an error tonic would otherwise report without the target, and often as
/// `UNKNOWN`.
///
/// Displays as `http://10.0.0.7:50051: transport error: ... Connection refused`; a generated
/// client sees `UNAVAILABLE` (or `DEADLINE_EXCEEDED` for a local timeout, which tonic itself
/// reports as `CANCELLED`) with the same message. The original error is
/// [`cause`](Self::cause), and the status's own source.
#[derive(Debug)]
pub struct TransportError {
    target: Arc<str>,
    status: Status,
    cause: Arc<dyn Error + Send + Sync + 'static>,
}

impl TransportError {
    /// Wraps `error` unless a [`Status`] is already in its chain (tonic finds that one).
    pub(crate) fn wrap(target: &Arc<str>, error: BoxError) -> BoxError {
        let mut cur: Option<&(dyn Error + 'static)> = Some(&*error);
        while let Some(e) = cur {
            if e.is::<Status>() {
                return error;
            }
            cur = e.source();
        }
        // A call the server did not process (a stream refused while it closes a connection)
        // is marked so, so that no layer counts it against the backend.
        let error: BoxError = if endpoint_state::transport::not_processed(&*error) {
            Box::new(endpoint_state::NotProcessed::new(error))
        } else {
            error
        };
        let call = CallStatus::from_error(&*error);
        let code = if call.code == Code::DeadlineExceeded {
            Code::DeadlineExceeded
        } else {
            Code::Unavailable
        };
        let cause: Arc<dyn Error + Send + Sync + 'static> = Arc::from(error);
        let message = if code == Code::DeadlineExceeded {
            // tonic's own timer (an endpoint `timeout`, or the call's deadline) fired: say so,
            // not "transport error".
            format!("{target}: deadline exceeded ({})", call.message)
        } else {
            format!("{target}: {}", call.message)
        };
        let mut status = Status::new(code, message);
        status.set_source(cause.clone());
        Box::new(TransportError {
            target: target.clone(),
            status,
            cause,
        })
    }

    /// The target the call went to.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The status a gRPC client receives.
    pub fn status(&self) -> &Status {
        &self.status
    }

    /// The transport's own error.
    pub fn cause(&self) -> &(dyn Error + Send + Sync + 'static) {
        &*self.cause
    }
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.status.message())
    }
}

impl Error for TransportError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.status)
    }
}

/// No target could take the call and the kit's DNS name cannot be resolved: the message says
/// both (`DNS resolution of dns:///billing.svc:50051 failed: ...; no healthy targets: ...`).
/// A generated client sees `UNAVAILABLE`.
#[derive(Debug)]
pub struct DiscoveryFailed {
    name: Arc<str>,
    reason: Arc<str>,
    inner: BoxError,
    status: Status,
}

impl DiscoveryFailed {
    pub(crate) fn new(name: Arc<str>, reason: Arc<str>, inner: BoxError, code: Code) -> Self {
        let status = Status::new(
            code,
            format!("DNS resolution of {name} failed: {reason}; {inner}"),
        );
        DiscoveryFailed {
            name,
            reason,
            inner,
            status,
        }
    }

    /// The DNS target (`dns:///billing.svc:50051`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Why the last resolution failed.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The balancer's own error (a [`NoHealthyTargets`](crate::balance::NoHealthyTargets)).
    pub fn no_healthy_targets(&self) -> &(dyn Error + Send + Sync + 'static) {
        &*self.inner
    }

    /// The status a gRPC client receives.
    pub fn status(&self) -> &Status {
        &self.status
    }
}

impl fmt::Display for DiscoveryFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.status.message())
    }
}

impl Error for DiscoveryFailed {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.status)
    }
}

/// The kit was [shut down](crate::Kit::shutdown): its channels take no more calls. A generated
/// client sees `UNAVAILABLE`.
#[derive(Debug)]
pub struct KitShutDown {
    status: Status,
}

impl KitShutDown {
    pub(crate) fn new() -> Self {
        KitShutDown {
            status: Status::unavailable("grpc-client-kit was shut down: no calls are accepted"),
        }
    }

    /// The status a gRPC client receives.
    pub fn status(&self) -> &Status {
        &self.status
    }
}

impl fmt::Display for KitShutDown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.status.message())
    }
}

impl Error for KitShutDown {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.status)
    }
}

/// A call's deadline passed inside the kit — while its target was connecting, while waiting
/// for response headers, or while reading the body — naming the target and where the call was:
/// `deadline exceeded after 300 ms waiting for http://10.0.0.7:50051: connecting`. A generated
/// client receives `DEADLINE_EXCEEDED` with that message (its [`source`](Error::source)).
///
/// The kit holds a call's deadline (its `grpc-timeout`) from the moment the call enters the
/// channel, which tonic's own timer does not: an address that drops SYNs cannot hold a call
/// past its deadline.
#[derive(Debug)]
pub struct DeadlineExceeded {
    status: Status,
}

impl DeadlineExceeded {
    pub(crate) fn new(budget: std::time::Duration, doing: fmt::Arguments<'_>) -> Self {
        let message = format!(
            "deadline exceeded after {} {doing}",
            crate::stack::Waited(budget)
        );
        DeadlineExceeded {
            status: Status::deadline_exceeded(message),
        }
    }

    /// The status a gRPC client receives.
    pub fn status(&self) -> &Status {
        &self.status
    }
}

impl fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.status.message())
    }
}

impl Error for DeadlineExceeded {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.status)
    }
}

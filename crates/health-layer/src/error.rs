//! Errors of the health checker's API. Probe failures are in [`crate::probe`].

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use crate::probe::ProbeError;

/// The boxed error type used where a cause of any type is kept (the kit's one, from
/// [`endpoint_state`]).
#[doc(no_inline)]
pub use endpoint_state::BoxError;

/// A configuration value that cannot work, found when the checker was built (the kit's one,
/// from [`endpoint_state`]; the configuration is `"health check"`).
///
/// Displays as `invalid health check configuration: timeout = 0ns: expected more than zero`.
#[doc(no_inline)]
pub use endpoint_state::ConfigError;

/// Why the checker cannot say whether a target is healthy: no checker runs that will ever
/// produce a verdict for it. See [`NotRunning::cause`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NotRunningCause {
    /// The checker was built but [`start`](crate::HealthChecker::start) was never called.
    NotStarted,
    /// The checker was stopped (explicitly, or because its last handle was dropped).
    Stopped,
    /// The target was never added to this checker (or was removed from it).
    UnknownTarget,
}

/// The target has no verdict and no running checker will ever produce one.
///
/// Returned instead of "unhealthy" so that an unstarted checker does not look like a cluster
/// that is down. Displays as
/// `no health verdict for http://10.0.0.7:50051: the health checker was never started`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotRunning {
    /// The target asked about.
    pub target: Arc<str>,
    /// Why no verdict will come.
    pub cause: NotRunningCause,
}

impl fmt::Display for NotRunning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.cause {
            NotRunningCause::NotStarted => "the health checker was never started",
            NotRunningCause::Stopped => "the health checker was stopped",
            NotRunningCause::UnknownTarget => "it is not a target of this health checker",
        };
        write!(f, "no health verdict for {}: {why}", self.target)
    }
}

impl Error for NotRunning {}

/// A target whose probe endpoint cannot be built (for example a name that is not a URI, with the
/// default endpoint template).
#[derive(Debug)]
pub struct InvalidTarget {
    /// The target as given.
    pub target: Arc<str>,
    source: BoxError,
}

impl InvalidTarget {
    pub(crate) fn new(target: Arc<str>, source: impl Into<BoxError>) -> Self {
        InvalidTarget {
            target,
            source: source.into(),
        }
    }
}

impl fmt::Display for InvalidTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid health check target {}: {}",
            self.target, self.source
        )
    }
}

impl Error for InvalidTarget {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.source)
    }
}

/// [`add_target_checked`](crate::HealthChecker::add_target_checked) refused a target: its
/// first probe did not see it serving, and nothing was stored.
#[derive(Debug)]
pub struct TargetRefused {
    /// The target refused.
    pub target: Arc<str>,
    /// What the probe found.
    pub error: RefusedBecause,
}

/// Why [`TargetRefused`] refused a target.
#[derive(Debug)]
pub enum RefusedBecause {
    /// The target could not be probed at all.
    Invalid(InvalidTarget),
    /// The first probe failed.
    Probe(ProbeError),
    /// The checker was stopped.
    Stopped,
}

impl fmt::Display for TargetRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.error {
            RefusedBecause::Invalid(e) => write!(f, "refused target {}: {e}", self.target),
            RefusedBecause::Probe(e) => {
                write!(f, "refused target {}: first probe failed: {e}", self.target)
            }
            RefusedBecause::Stopped => write!(
                f,
                "refused target {}: the health checker was stopped",
                self.target
            ),
        }
    }
}

impl Error for TargetRefused {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match &self.error {
            RefusedBecause::Invalid(e) => Some(e),
            RefusedBecause::Probe(e) => Some(e),
            RefusedBecause::Stopped => None,
        }
    }
}

/// [`start`](crate::HealthChecker::start) could not start the checker.
#[derive(Debug)]
pub enum StartError {
    /// One of the targets is invalid; nothing was started.
    InvalidTarget(InvalidTarget),
    /// The checker was already stopped; a stopped checker does not start again.
    Stopped,
    /// `start` was called outside a tokio runtime.
    NoRuntime,
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::InvalidTarget(e) => write!(f, "cannot start the health checker: {e}"),
            StartError::Stopped => f.write_str(
                "cannot start the health checker: it was stopped (build a new one instead)",
            ),
            StartError::NoRuntime => {
                f.write_str("cannot start the health checker outside a tokio runtime")
            }
        }
    }
}

impl Error for StartError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            StartError::InvalidTarget(e) => Some(e),
            _ => None,
        }
    }
}

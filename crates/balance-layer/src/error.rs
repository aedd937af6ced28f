//! The balancer's errors. A configuration it refuses is an
//! [`endpoint_state::ConfigError`] (configuration `balancer`).

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use endpoint_state::Ineligible;
use endpoint_state::time::Secs;
use tonic::{Code, Status};

/// The error type of [`Balance`](crate::Balance): an endpoint's own error, or
/// [`NoHealthyTargets`]. The kit's one boxed error type
/// ([`endpoint_state::BoxError`]).
#[doc(no_inline)]
pub use endpoint_state::BoxError;

/// Why one target was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Skip {
    /// Its state card shuts it (health, quarantine, breaker), with every reason.
    Ineligible(Ineligible),
    /// Its service failed `poll_ready` (tower treats that as final): out until discovery
    /// inserts it again.
    Failed(Arc<str>),
    /// Eligible, but its service did not become ready in time.
    NotReady,
}

/// One target and why the balancer could not use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedTarget {
    /// The target's name (its discovery key).
    pub target: Arc<str>,
    /// Why it was skipped.
    pub why: Skip,
}

impl fmt::Display for SkippedTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.why {
            // The card's own summary already starts with the target's name.
            Skip::Ineligible(why) => write!(f, "{why}"),
            Skip::Failed(error) => write!(f, "{}: failed: {error}", self.target),
            Skip::NotReady => write!(f, "{}: eligible but not ready", self.target),
        }
    }
}

/// How many targets the message lists before it summarises the rest (the message travels in
/// a `grpc-message` header, which must stay small).
const LISTED: usize = 32;

/// No endpoint could take the call: every target is listed with the reason it was skipped.
///
/// A generated tonic client sees it as `UNAVAILABLE` (or `DEADLINE_EXCEEDED` when a
/// wait-for-ready call ran out its own deadline): the matching [`tonic::Status`] is this
/// error's [`source`](Error::source), which is where tonic looks.
///
/// Displays as `no healthy targets: b0: unhealthy (NOT_SERVING); b1: quarantined 3.2 s more
/// after UNAVAILABLE: connection refused` (the first 32 targets, then a count of the rest;
/// [`targets`](Self::targets) has them all).
#[derive(Debug)]
pub struct NoHealthyTargets {
    targets: Vec<SkippedTarget>,
    note: Option<Arc<str>>,
    waited: Option<Duration>,
    status: Status,
}

impl NoHealthyTargets {
    pub(crate) fn new(
        targets: Vec<SkippedTarget>,
        note: Option<Arc<str>>,
        waited: Option<Duration>,
        caller_deadline: bool,
    ) -> Self {
        let mut this = NoHealthyTargets {
            targets,
            note,
            waited,
            status: Status::unavailable(""),
        };
        let code = if caller_deadline {
            Code::DeadlineExceeded
        } else {
            Code::Unavailable
        };
        this.status = Status::new(code, this.to_string());
        this
    }

    /// Every target the balancer knows, each with the reason it was skipped.
    pub fn targets(&self) -> &[SkippedTarget] {
        &self.targets
    }

    /// How long the call waited for an eligible endpoint (wait-for-ready), if it did.
    pub fn waited(&self) -> Option<Duration> {
        self.waited
    }

    /// The status a gRPC client receives: `UNAVAILABLE`, or `DEADLINE_EXCEEDED` when a
    /// wait-for-ready call reached the deadline its request carried.
    pub fn status(&self) -> &Status {
        &self.status
    }
}

impl fmt::Display for NoHealthyTargets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no healthy targets: ")?;
        if self.targets.is_empty() {
            f.write_str(self.note.as_deref().unwrap_or("no targets"))?;
        } else {
            for (i, t) in self.targets.iter().take(LISTED).enumerate() {
                if i > 0 {
                    f.write_str("; ")?;
                }
                write!(f, "{t}")?;
            }
            if self.targets.len() > LISTED {
                write!(f, "; and {} more", self.targets.len() - LISTED)?;
            }
            if let Some(note) = &self.note {
                write!(f, " ({note})")?;
            }
        }
        if let Some(waited) = self.waited {
            write!(f, " (waited {})", Secs(waited))?;
        }
        Ok(())
    }
}

impl Error for NoHealthyTargets {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.status)
    }
}

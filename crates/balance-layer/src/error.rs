//! The balancer's errors. A configuration it refuses is an
//! [`endpoint_state::ConfigError`] (configuration `balancer`).

use std::error::Error;
use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::time::Duration;

use endpoint_state::Ineligible;
use endpoint_state::text;
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

/// How many targets a call that finds nothing eligible reads and lists (the first ones, in
/// discovery order); the rest are counted, not read: a rejected call costs the same with ten
/// targets or ten thousand.
pub(crate) const LISTED: usize = 16;

/// The most bytes of a [`NoHealthyTargets`] message (it travels in a `grpc-message` header,
/// which must stay small, and in logs).
pub const MAX_MESSAGE: usize = 4 * 1024;

/// The most characters of one target's reasons in the message, and of the note.
const TARGET_CHARS: usize = 400;
const NOTE_CHARS: usize = 160;

/// Bytes kept free for the end of the message: `; and N more`, the note, the time waited.
const TAIL: usize = 32 + (NOTE_CHARS * 4 + 8) + 32;

/// No endpoint could take the call: the first targets (in discovery order) are listed with
/// the reason each was skipped, and the rest counted.
///
/// A generated tonic client sees it as `UNAVAILABLE` (or `DEADLINE_EXCEEDED` when a
/// wait-for-ready call ran out its own deadline): the matching [`tonic::Status`] is this
/// error's [`source`](Error::source), which is where tonic looks.
///
/// Displays as `no healthy targets: b0: unhealthy (NOT_SERVING); b1: quarantined 3.2 s more
/// after UNAVAILABLE: connection refused`, then `; and 9984 more` when there are more targets
/// than it read or than fit: at most 16 targets are read per rejected call, and the message
/// is at most [`MAX_MESSAGE`] bytes.
#[derive(Debug)]
pub struct NoHealthyTargets {
    targets: Vec<SkippedTarget>,
    unlisted: usize,
    note: Option<Arc<str>>,
    waited: Option<Duration>,
    status: Status,
}

impl NoHealthyTargets {
    /// `targets` were read (at most [`LISTED`]); `unlisted` more were not.
    pub(crate) fn new(
        targets: Vec<SkippedTarget>,
        unlisted: usize,
        note: Option<Arc<str>>,
        waited: Option<Duration>,
        caller_deadline: bool,
    ) -> Self {
        let mut this = NoHealthyTargets {
            targets,
            unlisted,
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

    /// The targets read for this error — the first ones the balancer knows, in discovery
    /// order, at most 16 — each with the reason it was skipped.
    pub fn targets(&self) -> &[SkippedTarget] {
        &self.targets
    }

    /// How many more targets the balancer knows, beyond [`targets`](Self::targets) (not read).
    pub fn unlisted(&self) -> usize {
        self.unlisted
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

    /// The message, within [`MAX_MESSAGE`] bytes.
    fn render(&self) -> String {
        let mut out = String::from("no healthy targets: ");
        let note = self.note.as_deref().map(|n| text::clip(n, NOTE_CHARS));
        if self.targets.is_empty() && self.unlisted == 0 {
            out.push_str(note.as_deref().unwrap_or("no targets"));
        } else {
            let mut shown = 0;
            for target in &self.targets {
                let item = target.to_string();
                let item = text::clip(&item, TARGET_CHARS);
                if shown > 0 && out.len() + 2 + item.len() + TAIL > MAX_MESSAGE {
                    break;
                }
                if shown > 0 {
                    out.push_str("; ");
                }
                out.push_str(&item);
                shown += 1;
            }
            let more = self.targets.len() - shown + self.unlisted;
            if more > 0 {
                let _ = write!(out, "; and {more} more");
            }
            if let Some(note) = note {
                let _ = write!(out, " ({note})");
            }
        }
        if let Some(waited) = self.waited {
            let _ = write!(out, " (waited {})", Secs(waited));
        }
        out
    }
}

impl fmt::Display for NoHealthyTargets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

impl Error for NoHealthyTargets {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skipped(name: &str, why: &str) -> SkippedTarget {
        SkippedTarget {
            target: name.into(),
            why: Skip::Failed(why.into()),
        }
    }

    #[test]
    fn the_message_is_bounded_whatever_the_targets_say() {
        let long = "é".repeat(5_000);
        let targets: Vec<_> = (0..LISTED)
            .map(|i| skipped(&format!("b{i}"), &long))
            .collect();
        let note: Arc<str> = format!("discovery failed: {long}").into();
        let e = NoHealthyTargets::new(targets, 10_000, Some(note), Some(Duration::MAX), false);
        let message = e.to_string();
        assert!(message.len() <= MAX_MESSAGE, "{} bytes", message.len());
        assert!(
            message.starts_with("no healthy targets: b0: failed: éé"),
            "{message}"
        );
        assert!(message.contains(" more (discovery failed: éé"), "{message}");
        assert!(message.ends_with(" s)"), "{message}");
        assert_eq!(e.status().message(), message);
        // Every target read and listed, when they fit.
        let targets: Vec<_> = (0..3)
            .map(|i| skipped(&format!("b{i}"), "NOT_SERVING"))
            .collect();
        let e = NoHealthyTargets::new(targets, 0, None, None, false);
        assert_eq!(
            e.to_string(),
            "no healthy targets: b0: failed: NOT_SERVING; b1: failed: NOT_SERVING; \
             b2: failed: NOT_SERVING"
        );
        let e = NoHealthyTargets::new(
            Vec::new(),
            0,
            Some("no targets discovered yet".into()),
            None,
            false,
        );
        assert_eq!(
            e.to_string(),
            "no healthy targets: no targets discovered yet"
        );
    }
}

//! The members of a group: each endpoint's card, its repeat count and its outlier counters.

use std::fmt;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use endpoint_state::EndpointCard;
use tokio::time::Instant;

/// A snapshot of the members, in the order they were added; rebuilt on the first read after a
/// change.
pub(crate) struct Members {
    pub(crate) list: Vec<Arc<Member>>,
}

/// One member: its card, its repeat count and its outlier counters.
pub(crate) struct Member {
    pub(crate) card: EndpointCard,
    /// Its place in the group's order (when it was added).
    pub(crate) seq: u64,
    pub(crate) strikes: Mutex<Strikes>,
    /// Calls in the current outlier interval that did not fail (by the policy's codes).
    pub(crate) successes: AtomicU64,
    /// Calls in the current outlier interval that failed (by the policy's codes).
    pub(crate) failures: AtomicU64,
}

impl Member {
    pub(crate) fn new(card: EndpointCard, seq: u64) -> Self {
        Member {
            card,
            seq,
            strikes: Mutex::default(),
            successes: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }
}

/// How many quarantines in a row a target has had, and when the last one ended (or ends).
#[derive(Debug, Default)]
pub(crate) struct Strikes {
    pub(crate) count: u32,
    pub(crate) last_end: Option<Instant>,
}

impl Strikes {
    /// The count after the decay earned since the last quarantine ended: one per full
    /// `period` out of quarantine.
    pub(crate) fn decayed(&self, now: Instant, period: Duration) -> u32 {
        match self.last_end {
            Some(end) if now > end => {
                let periods = (now - end).as_nanos() / period.as_nanos().max(1);
                self.count
                    .saturating_sub(u32::try_from(periods).unwrap_or(u32::MAX))
            }
            _ => self.count,
        }
    }
}

/// What started a quarantine, for the logs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Cause {
    Call,
    Reported,
    Outlier,
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cause::Call => "failed call",
            Cause::Reported => "reported failure",
            Cause::Outlier => "outlier ejection",
        })
    }
}

//! The breaker's errors: a refused call ([`BreakerOpen`]) and a bad configuration
//! ([`ConfigError`], the kit's one configuration error, with `config() == "breaker"`).

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

#[doc(no_inline)]
pub use endpoint_state::ConfigError;
use endpoint_state::time::Secs;
use endpoint_state::{BreakerState, Reason};
use tokio::time::Instant;

/// A call refused by a fail-fast breaker (`WhenOpen::FailFast`).
///
/// Its `source()` is a `tonic::Status` with code `UNAVAILABLE` and the same message, so a
/// generated tonic client reports the call as `UNAVAILABLE` (not `UNKNOWN`), naming the target
/// and when the breaker will let a call through again:
///
/// `b1: breaker open, retry in 4.2 s (after 5 consecutive failures (last: UNAVAILABLE: connection refused))`
pub struct BreakerOpen {
    target: Arc<str>,
    state: BreakerState,
    retry_in: Option<Duration>,
    reason: Option<Reason>,
    status: tonic::Status,
}

impl BreakerOpen {
    pub(crate) fn new(
        target: Arc<str>,
        state: BreakerState,
        now: Instant,
        reason: Option<Reason>,
    ) -> Self {
        let retry_in = match state {
            BreakerState::Open { until } => Some(until.saturating_duration_since(now)),
            _ => None,
        };
        let mut this = BreakerOpen {
            target,
            state,
            retry_in,
            reason,
            status: tonic::Status::unavailable(""),
        };
        this.status = tonic::Status::unavailable(this.to_string());
        this
    }

    /// The endpoint whose breaker refused the call.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The breaker's state when it refused the call (`Open`, `HalfOpen` with every probe
    /// permit taken, or `ForcedOpen`).
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// How long until the breaker admits a probe call, when it will on its own.
    pub fn retry_in(&self) -> Option<Duration> {
        self.retry_in
    }

    /// Why the breaker is open, as published on the card.
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// The `UNAVAILABLE` status a tonic client turns this error into.
    pub fn status(&self) -> &tonic::Status {
        &self.status
    }
}

impl fmt::Debug for BreakerOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerOpen")
            .field("target", &self.target)
            .field("state", &self.state)
            .field("retry_in", &self.retry_in)
            .field("reason", &self.reason)
            .finish()
    }
}

impl fmt::Display for BreakerOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: breaker ", self.target)?;
        match (self.state, self.retry_in) {
            (BreakerState::Open { .. }, Some(d)) => write!(f, "open, retry in {}", Secs(d))?,
            (BreakerState::HalfOpen { .. }, _) => {
                f.write_str("half-open, probe calls in flight; retry when they finish")?
            }
            (BreakerState::ForcedOpen, _) => {
                f.write_str("forced open by an operator; no retry until it is released")?
            }
            (state, _) => write!(f, "{state}")?,
        }
        if let Some(reason) = &self.reason {
            write!(f, " (after {reason})")?;
        }
        Ok(())
    }
}

impl Error for BreakerOpen {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.status)
    }
}

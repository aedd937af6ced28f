//! The lines of a card: what each layer publishes, and the state of each line.

use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;

/// Why a line is in its state, in words an operator can act on
/// (for example `UNAVAILABLE: connection refused`).
pub type Reason = Arc<str>;

/// One line of the card: the state a layer published, why, and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line<T> {
    /// The state itself.
    pub state: T,
    /// Why the line is in this state, if the writer said.
    pub reason: Option<Reason>,
    /// When the state was published (monotonic clock).
    pub since: Instant,
}

/// The health checker's verdict about an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HealthVerdict {
    /// No health checker watches this endpoint: the health line never shuts the gate.
    ///
    /// This is the state of a fresh card, so that a user who takes only the breaker or only
    /// quarantine is not blocked by a checker they never started.
    NotChecked,
    /// A checker watches this endpoint but no probe has produced evidence yet. Not eligible:
    /// an endpoint is healthy only after a probe saw it serving.
    Unknown,
    /// The last probe saw the endpoint serving.
    Healthy,
    /// The last probe failed or saw the endpoint not serving.
    Unhealthy,
}

impl HealthVerdict {
    /// Whether this verdict lets calls through.
    pub fn admits(self) -> bool {
        matches!(self, HealthVerdict::NotChecked | HealthVerdict::Healthy)
    }
}

impl fmt::Display for HealthVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HealthVerdict::NotChecked => "not checked",
            HealthVerdict::Unknown => "health unknown",
            HealthVerdict::Healthy => "healthy",
            HealthVerdict::Unhealthy => "unhealthy",
        })
    }
}

/// Quarantine's state: out of rotation until an instant, or not quarantined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quarantine {
    /// The end of the quarantine; `None` when the endpoint is not quarantined.
    pub until: Option<Instant>,
}

impl Quarantine {
    /// Not quarantined.
    pub const NONE: Quarantine = Quarantine { until: None };

    /// Whether the quarantine is still in force at `now`.
    pub fn active_at(&self, now: Instant) -> bool {
        matches!(self.until, Some(until) if until > now)
    }
}

/// The circuit breaker's state as published on the card.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls flow; outcomes are counted.
    Closed,
    /// Calls are refused until `until`, when the breaker goes half-open.
    Open {
        /// When the breaker will admit probe calls again.
        until: Instant,
    },
    /// A bounded number of probe calls may pass; their outcome decides.
    HalfOpen {
        /// Every probe permit is taken by a call in flight (a long stream holds its permit
        /// until its trailers): no other call is admitted until one is given back, so the
        /// endpoint is not eligible meanwhile. The breaker publishes the change each way.
        busy: bool,
    },
    /// An operator holds the breaker open: no call passes until released.
    ForcedOpen,
    /// An operator disabled the breaker: every call passes and nothing is counted.
    Disabled,
}

impl BreakerState {
    /// Whether the breaker would admit a call at `now`: closed, disabled, half-open with a
    /// free probe permit (the breaker itself takes it), or open with its period over.
    pub fn admits_at(&self, now: Instant) -> bool {
        match self {
            BreakerState::Closed | BreakerState::Disabled => true,
            BreakerState::HalfOpen { busy } => !busy,
            BreakerState::Open { until } => *until <= now,
            BreakerState::ForcedOpen => false,
        }
    }

    /// Whether the state is a *passive* signal shutting calls out at `now`: an open period
    /// not over yet, or a half-open breaker whose every permit is taken. (A passive signal
    /// narrows the choice, never empties it: see [`peers`](crate::peers).) An operator's
    /// forced-open breaker is not passive.
    pub fn passively_shut_at(&self, now: Instant) -> bool {
        match self {
            BreakerState::Open { until } => *until > now,
            BreakerState::HalfOpen { busy } => *busy,
            _ => false,
        }
    }
}

impl fmt::Display for BreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BreakerState::Closed => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen { busy: false } => "half-open",
            BreakerState::HalfOpen { busy: true } => "half-open, every probe permit taken",
            BreakerState::ForcedOpen => "forced open",
            BreakerState::Disabled => "disabled",
        })
    }
}

/// The health line of a card.
pub type HealthLine = Line<HealthVerdict>;
/// The quarantine line of a card.
pub type QuarantineLine = Line<Quarantine>;
/// The breaker line of a card.
pub type BreakerLine = Line<BreakerState>;

/// Which line of the card.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LineKind {
    /// The health checker's line.
    Health,
    /// Passive quarantine's line.
    Quarantine,
    /// The circuit breaker's line.
    Breaker,
}

impl fmt::Display for LineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LineKind::Health => "health",
            LineKind::Quarantine => "quarantine",
            LineKind::Breaker => "breaker",
        })
    }
}

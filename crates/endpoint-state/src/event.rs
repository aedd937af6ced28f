//! One event vocabulary: every change of a line of a card — a health verdict, a quarantine, a
//! breaker's state — is a [`CardEvent`], whichever layer wrote it. Metrics, logs and callbacks
//! all observe the same stream: on one card ([`EndpointCard::subscribe`](crate::EndpointCard::subscribe)), or on every card of
//! a peer set ([`Peers::subscribe`](crate::Peers::subscribe)).

use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;

use crate::line::{BreakerState, HealthVerdict, LineKind, Quarantine, Reason};

/// The state of one line, as an event carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LineState {
    /// The health line's verdict.
    Health(HealthVerdict),
    /// The quarantine line.
    Quarantine(Quarantine),
    /// The breaker line.
    Breaker(BreakerState),
}

impl LineState {
    /// Which line.
    pub fn line(&self) -> LineKind {
        match self {
            LineState::Health(_) => LineKind::Health,
            LineState::Quarantine(_) => LineKind::Quarantine,
            LineState::Breaker(_) => LineKind::Breaker,
        }
    }
}

impl fmt::Display for LineState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineState::Health(v) => write!(f, "{v}"),
            LineState::Quarantine(Quarantine { until: Some(_) }) => f.write_str("quarantined"),
            LineState::Quarantine(Quarantine { until: None }) => f.write_str("not quarantined"),
            LineState::Breaker(b) => write!(f, "breaker {b}"),
        }
    }
}

/// A change of one line of a card: `{ line, from, to, reason, at }`, and the target's name.
///
/// Every effective write of a line is one event (a write that changes neither the state nor
/// the reason is none). [`is_transition`](Self::is_transition) tells a change of state from a
/// change of reason alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardEvent {
    /// The card's target.
    pub target: Arc<str>,
    /// Which line changed.
    pub line: LineKind,
    /// Its state before.
    pub from: LineState,
    /// Its state now.
    pub to: LineState,
    /// Why (the writer's reason for the new state).
    pub reason: Option<Reason>,
    /// When it was written (monotonic clock).
    pub at: Instant,
}

impl CardEvent {
    /// Whether the state changed (not only its reason): a move of the line's state machine.
    /// A half-open breaker whose probe permits are all taken, or one given back
    /// ([`BreakerState::HalfOpen`] `{ busy }`), is a change of the card — an event, since its
    /// eligibility changed — but no transition: the breaker is half-open throughout.
    pub fn is_transition(&self) -> bool {
        match (self.from, self.to) {
            (
                LineState::Breaker(BreakerState::HalfOpen { .. }),
                LineState::Breaker(BreakerState::HalfOpen { .. }),
            ) => false,
            (from, to) => from != to,
        }
    }
}

impl fmt::Display for CardEvent {
    /// `b1: healthy -> unhealthy (NOT_SERVING)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} -> {}", self.target, self.from, self.to)?;
        if let Some(r) = &self.reason {
            write!(f, " ({r})")?;
        }
        Ok(())
    }
}

/// How many events a subscriber of one card may fall behind by (see
/// [`EndpointCard::subscribe`](crate::EndpointCard::subscribe)).
pub const CARD_EVENTS: usize = 64;

/// How many events a subscriber of a peer set may fall behind by (see
/// [`Peers::subscribe`](crate::Peers::subscribe)).
pub const PEER_EVENTS: usize = 1024;

//! Eligibility: a whole card read at once, and every reason an endpoint is not eligible.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::line::{
    BreakerLine, BreakerState, HealthLine, HealthVerdict, LineKind, QuarantineLine, Reason,
};
use crate::time::Secs;

/// Every line of a card, read at one moment each.
#[derive(Debug, Clone)]
pub struct CardSnapshot {
    /// The endpoint's name.
    pub target: Arc<str>,
    /// The card's version, read before the lines.
    pub version: u64,
    /// The health line.
    pub health: Arc<HealthLine>,
    /// The quarantine line.
    pub quarantine: Arc<QuarantineLine>,
    /// The breaker line.
    pub breaker: Arc<BreakerLine>,
}

impl CardSnapshot {
    /// `Ok` when every line admits calls at `now`; otherwise every reason it does not.
    pub fn eligibility_at(&self, now: Instant) -> Result<(), Ineligible> {
        let mut blocks = Vec::new();
        if !self.health.state.admits() {
            blocks.push(Block::Health {
                verdict: self.health.state,
                reason: self.health.reason.clone(),
            });
        }
        if let Some(until) = self.quarantine.state.until.filter(|u| *u > now) {
            blocks.push(Block::Quarantined {
                remaining: until - now,
                reason: self.quarantine.reason.clone(),
            });
        }
        if !self.breaker.state.admits_at(now) {
            let retry_in = match self.breaker.state {
                BreakerState::Open { until } => Some(until.saturating_duration_since(now)),
                _ => None,
            };
            blocks.push(Block::Breaker {
                state: self.breaker.state,
                retry_in,
                reason: self.breaker.reason.clone(),
            });
        }
        if blocks.is_empty() {
            Ok(())
        } else {
            Err(Ineligible {
                target: self.target.clone(),
                blocks,
            })
        }
    }
}

/// One reason an endpoint is not eligible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// The health line shuts the gate.
    Health {
        /// The verdict ([`HealthVerdict::Unknown`] or [`HealthVerdict::Unhealthy`]).
        verdict: HealthVerdict,
        /// The checker's reason.
        reason: Option<Reason>,
    },
    /// Quarantine shuts the gate for a while.
    Quarantined {
        /// How long the quarantine has left.
        remaining: Duration,
        /// What put the endpoint in quarantine.
        reason: Option<Reason>,
    },
    /// The breaker refuses calls.
    Breaker {
        /// The breaker's state.
        state: BreakerState,
        /// When it will admit a probe call again, if it will on its own.
        retry_in: Option<Duration>,
        /// What tripped it.
        reason: Option<Reason>,
    },
}

impl Block {
    /// Which line this block comes from.
    pub fn line(&self) -> LineKind {
        match self {
            Block::Health { .. } => LineKind::Health,
            Block::Quarantined { .. } => LineKind::Quarantine,
            Block::Breaker { .. } => LineKind::Breaker,
        }
    }
}

impl fmt::Display for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Block::Health { verdict, reason } => {
                write!(f, "{verdict}")?;
                if let Some(r) = reason {
                    write!(f, " ({r})")?;
                }
                Ok(())
            }
            Block::Quarantined { remaining, reason } => {
                write!(f, "quarantined {} more", Secs(*remaining))?;
                if let Some(r) = reason {
                    write!(f, " after {r}")?;
                }
                Ok(())
            }
            Block::Breaker {
                state,
                retry_in,
                reason,
            } => {
                write!(f, "breaker {state}")?;
                if let Some(d) = retry_in {
                    write!(f, ", retry in {}", Secs(*d))?;
                }
                match (state, reason) {
                    // Half-open's reason says how it came to probe: no "after".
                    (BreakerState::HalfOpen { .. }, Some(r)) => write!(f, " ({r})")?,
                    (_, Some(r)) => write!(f, " after {r}")?,
                    (_, None) => {}
                }
                Ok(())
            }
        }
    }
}

/// Why an endpoint is not eligible now: its name and every line that shuts it.
///
/// Displays as `b2: quarantined 3.2 s more after UNAVAILABLE: connection refused`
/// (several blocks are joined with `; `).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ineligible {
    /// The endpoint's name.
    pub target: Arc<str>,
    /// Every reason, in card order (health, quarantine, breaker). Never empty.
    pub blocks: Vec<Block>,
}

impl Ineligible {
    /// Whether `line` is among the reasons.
    pub fn blocked_by(&self, line: LineKind) -> bool {
        self.blocks.iter().any(|b| b.line() == line)
    }
}

impl fmt::Display for Ineligible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.target)?;
        for (i, b) in self.blocks.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{b}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Ineligible {}

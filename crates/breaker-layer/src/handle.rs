//! The operator's handle on a breaker, and the stream of its line's events.

use std::fmt;
use std::sync::Arc;

use endpoint_state::{BreakerLine, BreakerState, CardEvent, EndpointCard, Reason};
use tokio::sync::broadcast;

use crate::state::Shared;

/// The operator's handle on one endpoint's breaker: read its state, force it open, disable
/// it, reset it, and watch its transitions. Cheap to clone; every clone acts on the same
/// breaker as every `Breaker` service made by the same layer.
///
/// ```
/// use breaker_layer::{BreakerConfig, BreakerLayer};
/// use endpoint_state::{BreakerState, EndpointCard, LineState};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let card = EndpointCard::new("b1");
/// let layer = BreakerLayer::new(card.clone(), BreakerConfig::default()).unwrap();
/// let handle = layer.handle();
/// let mut events = handle.subscribe();
///
/// handle.force_open(Some("draining b1 for maintenance".into()));
/// assert_eq!(card.breaker_state(), BreakerState::ForcedOpen);
/// let event = events.recv().await.unwrap();
/// assert_eq!(
///     (event.from, event.to),
///     (LineState::Breaker(BreakerState::Closed), LineState::Breaker(BreakerState::ForcedOpen)),
/// );
/// assert_eq!(event.reason.as_deref(), Some("draining b1 for maintenance"));
/// assert_eq!(event.to_string(), "b1: breaker closed -> breaker forced open (draining b1 for maintenance)");
///
/// handle.reset();
/// assert_eq!(handle.state(), BreakerState::Closed);
/// # }
/// ```
#[derive(Clone)]
pub struct BreakerHandle {
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for BreakerHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BreakerHandle").field(&self.shared).finish()
    }
}

impl BreakerHandle {
    /// The breaker's state as published on the card. An `Open { until }` whose instant has
    /// passed turns `HalfOpen` when the next call asks to be admitted.
    pub fn state(&self) -> BreakerState {
        self.shared.card.breaker_state()
    }

    /// The card's breaker line: state, reason and since when.
    pub fn line(&self) -> Arc<BreakerLine> {
        self.shared.card.breaker()
    }

    /// The endpoint's card.
    pub fn card(&self) -> &EndpointCard {
        &self.shared.card
    }

    /// Holds the breaker open until [`reset`](Self::reset): no call passes (waiting or
    /// failing fast, as configured) and nothing is counted.
    pub fn force_open(&self, reason: Option<Reason>) {
        self.shared.force_open(reason);
    }

    /// Lets every call pass and counts nothing until [`reset`](Self::reset).
    pub fn disable(&self) {
        self.shared.disable(None);
    }

    /// Closes the breaker, forgets every count and the backoff (from any state: this also
    /// releases a forced-open or disabled breaker).
    pub fn reset(&self) {
        self.shared.reset(None);
    }

    /// The breaker's transitions from now on, as the card's events of its breaker line
    /// ([`CardEvent`]: `{ line, from, to, reason, at }`, the same events that
    /// [`EndpointCard::subscribe`] and [`Peers::subscribe`](endpoint_state::Peers::subscribe)
    /// carry for every line). Each transition that changes the card's breaker line is one
    /// event; its reason is the card's (`5 consecutive failures (last: UNAVAILABLE: connection
    /// refused)`).
    ///
    /// The channel is bounded (`events_capacity`, default 64) and never slows the breaker: a
    /// subscriber that falls behind by more than that loses the oldest events, and its next
    /// `recv` returns `Err(RecvError::Lagged(n))` with the number it missed before going on
    /// with the oldest event still held. The stream ends (`RecvError::Closed`) when the
    /// layer, every service and every handle are dropped.
    pub fn subscribe(&self) -> broadcast::Receiver<CardEvent> {
        self.shared.subscribe()
    }
}

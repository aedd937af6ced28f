//! `HealthLayer`: wraps a service in a [`Health`] gate on one endpoint's card.

use endpoint_state::EndpointCard;
use tower_layer::Layer;

use crate::service::Health;

/// Wraps each service in [`Health`], gated on `card`'s health line: `poll_ready` is `Pending`
/// while the verdict does not admit calls. Get the card from
/// [`HealthChecker::card`](crate::HealthChecker::card) (or give the checker yours).
#[derive(Clone, Debug)]
pub struct HealthLayer {
    card: EndpointCard,
}

impl HealthLayer {
    /// A layer gating on `card`.
    pub fn new(card: EndpointCard) -> Self {
        HealthLayer { card }
    }

    /// The card it gates on.
    pub fn card(&self) -> &EndpointCard {
        &self.card
    }
}

impl<S> Layer<S> for HealthLayer {
    type Service = Health<S>;

    fn layer(&self, inner: S) -> Health<S> {
        Health::new(inner, self.card.clone())
    }
}

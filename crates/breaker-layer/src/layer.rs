use std::fmt;
use std::sync::Arc;

use endpoint_state::{ConfigError, EndpointCard};
use tower_layer::Layer;

use crate::config::BreakerConfig;
use crate::handle::BreakerHandle;
use crate::service::Breaker;
use crate::state::Shared;

/// Wraps a service (one endpoint's channel) in a [`Breaker`].
///
/// A layer *is* one endpoint's breaker: every service it makes, and every clone of it and of
/// them, share one state machine and publish on the one card the layer was built with. Build
/// one layer per endpoint.
#[derive(Clone)]
pub struct BreakerLayer {
    shared: Arc<Shared>,
}

impl fmt::Debug for BreakerLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerLayer")
            .field("breaker", &self.shared)
            .field("config", &self.shared.config)
            .finish()
    }
}

impl BreakerLayer {
    /// A closed breaker for the endpoint of `card`, after checking `config`.
    ///
    /// The error names the first invalid field and its value; nothing has been written to
    /// the card then.
    pub fn new(card: EndpointCard, config: BreakerConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(BreakerLayer {
            shared: Arc::new(Shared::new(card, config)),
        })
    }

    /// The operator's handle on this breaker.
    pub fn handle(&self) -> BreakerHandle {
        BreakerHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// The endpoint's card.
    pub fn card(&self) -> &EndpointCard {
        &self.shared.card
    }

    /// The configuration in force.
    pub fn config(&self) -> &BreakerConfig {
        &self.shared.config
    }
}

impl<S> Layer<S> for BreakerLayer {
    type Service = Breaker<S>;

    fn layer(&self, inner: S) -> Breaker<S> {
        Breaker::from_shared(inner, Arc::clone(&self.shared))
    }
}

//! The balancer as a `tower` layer over a discovery stream.

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;

use endpoint_state::{ConfigError, HasCard};
use tower::discover::Discover;
use tower_layer::Layer;

use crate::config::BalanceConfig;
use crate::error::BoxError;
use crate::service::Balance;
use crate::shared::Settings;

/// Builds a [`Balance`] over the [`Discover`] it is applied to.
///
/// The configuration is validated once, by [`BalanceLayer::new`]; applying the layer cannot
/// fail. Applying it spawns the balancer's background task, so it must happen inside a Tokio
/// runtime.
///
/// `Req` is the request type of the balancers it builds (usually inferred).
pub struct BalanceLayer<Req> {
    config: Arc<BalanceConfig>,
    _req: PhantomData<fn(Req)>,
}

impl<Req> Clone for BalanceLayer<Req> {
    fn clone(&self) -> Self {
        BalanceLayer {
            config: self.config.clone(),
            _req: PhantomData,
        }
    }
}

impl<Req> BalanceLayer<Req> {
    /// Validates `config` (the error names the field and the value).
    pub fn new(config: BalanceConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(BalanceLayer {
            config: Arc::new(config),
            _req: PhantomData,
        })
    }

    /// The configuration every balancer built by this layer uses.
    pub fn config(&self) -> &BalanceConfig {
        &self.config
    }
}

impl<Req> fmt::Debug for BalanceLayer<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BalanceLayer")
            .field("strategy", &self.config.strategy.name())
            .field("wait_for_ready", &self.config.wait_for_ready)
            .finish_non_exhaustive()
    }
}

impl<D, Req> Layer<D> for BalanceLayer<Req>
where
    D: Discover + Send + 'static,
    D::Key: Hash + Eq + Clone + fmt::Display + Send + Sync + 'static,
    D::Service: HasCard + Clone + Send + Sync + 'static,
    D::Error: Into<BoxError>,
{
    type Service = Balance<D, Req>;

    fn layer(&self, discover: D) -> Balance<D, Req> {
        Balance::with_settings(discover, Settings::from_config(&self.config))
    }
}

//! The layer: one per endpoint stack, bound to the endpoint's card and its group.

use std::fmt;
use std::sync::Arc;

use endpoint_state::EndpointCard;
use tower_layer::Layer;

use crate::group::{Binding, QuarantineGroup};
use crate::service::Quarantine;

/// Puts one endpoint's service under its group's quarantine. Build it with
/// [`QuarantineGroup::layer`] or [`QuarantineLayer::new`].
///
/// Cloning is cheap; every service the layer (or a clone) makes acts on the same card and
/// the same group.
#[derive(Clone)]
pub struct QuarantineLayer {
    binding: Arc<Binding>,
}

impl QuarantineLayer {
    /// A layer for the endpoint whose card is `card`, in `group` (added to it if it is not a
    /// member yet).
    pub fn new(group: &QuarantineGroup, card: EndpointCard) -> Self {
        QuarantineLayer {
            binding: group.bind(card),
        }
    }

    /// The endpoint's card.
    pub fn card(&self) -> &EndpointCard {
        self.binding.card()
    }
}

impl QuarantineGroup {
    /// The layer for one endpoint's stack, adding `card` to the group if it is not a member.
    /// Same as [`QuarantineLayer::new`].
    pub fn layer(&self, card: EndpointCard) -> QuarantineLayer {
        QuarantineLayer::new(self, card)
    }
}

impl fmt::Debug for QuarantineLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuarantineLayer")
            .field("target", &self.binding.card().target())
            .finish()
    }
}

impl<S> Layer<S> for QuarantineLayer {
    type Service = Quarantine<S>;

    fn layer(&self, inner: S) -> Quarantine<S> {
        Quarantine::from_binding(inner, self.binding.clone())
    }
}

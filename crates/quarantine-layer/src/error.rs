//! Errors of the quarantine layer.
//!
//! The layer never fails a call of its own: a quarantined endpoint is `Pending` in `poll_ready`
//! (a transient condition), and a call's own error passes through untouched (boxed). What can
//! fail is building a group from a bad configuration ([`ConfigError`], the kit's one
//! configuration error, with `config() == "quarantine"`: nothing was started) and naming a
//! target the group does not hold ([`UnknownTarget`]).

use std::fmt;
use std::sync::Arc;

#[doc(no_inline)]
pub use endpoint_state::ConfigError;

/// The former name of [`ConfigError`] (a configuration value refused when the group was
/// built); the same type.
#[deprecated(note = "the kit has one configuration error: use `ConfigError`")]
pub type InvalidConfig = ConfigError;

/// A target named in a call to the group is not one of its members.
///
/// Displays as `quarantine group has no target 10.0.0.9:50051`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownTarget {
    target: Arc<str>,
}

impl UnknownTarget {
    pub(crate) fn new(target: &str) -> Self {
        UnknownTarget {
            target: target.into(),
        }
    }

    /// The name that was not found.
    pub fn target(&self) -> &str {
        &self.target
    }
}

impl fmt::Display for UnknownTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "quarantine group has no target {}", self.target)
    }
}

impl std::error::Error for UnknownTarget {}

//! Errors of the quarantine layer.
//!
//! The layer never fails a call of its own: a quarantined endpoint is `Pending` in `poll_ready`
//! (a transient condition), and a call's own error passes through untouched (boxed). What can
//! fail is building a group from a bad configuration ([`InvalidConfig`]) and naming a target the
//! group does not hold ([`UnknownTarget`]).

use std::fmt;
use std::sync::Arc;

/// A configuration value was refused when the group was built. Nothing was started.
///
/// Displays as `invalid quarantine config: max_duration = 1s: must be at least duration (5s)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidConfig {
    field: &'static str,
    value: String,
    rule: String,
}

impl InvalidConfig {
    pub(crate) fn new(
        field: &'static str,
        value: impl fmt::Debug,
        rule: impl Into<String>,
    ) -> Self {
        InvalidConfig {
            field,
            value: format!("{value:?}"),
            rule: rule.into(),
        }
    }

    /// The field, as a path from [`QuarantineConfig`](crate::QuarantineConfig)
    /// (`outlier_ejection.max_ejection_percent`).
    pub fn field(&self) -> &str {
        self.field
    }

    /// The refused value, as written with `{:?}`.
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid quarantine config: {} = {}: {}",
            self.field, self.value, self.rule
        )
    }
}

impl std::error::Error for InvalidConfig {}

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

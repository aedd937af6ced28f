//! The response future and body of the `Quarantine` service.
//!
//! Both are the core crate's classifying wrappers ([`endpoint_state::ResponseFuture`],
//! [`endpoint_state::ClassifiedBody`]) with this layer's listener, [`RecordOutcome`]: the
//! outcome is read from the service's error, a trailers-only response, or the trailers at the
//! end of the body, and handed to the group exactly once. A call dropped before its end
//! counts neither way.

use std::fmt;
use std::sync::Arc;

use endpoint_state::{OnOutcome, Outcome};
use tokio::time::Instant;

use crate::group::Binding;

/// The future returned by the `Quarantine` service's `call`.
pub type ResponseFuture<F> = endpoint_state::ResponseFuture<F, RecordOutcome>;

/// The response body of the `Quarantine` service: the inner body, classified at its
/// end.
pub type ResponseBody<B> = endpoint_state::ClassifiedBody<B, RecordOutcome>;

/// Hands one call's outcome to its group: a failure code quarantines the endpoint (or renews
/// its quarantine), and a success of a call admitted while the endpoint's quarantine was
/// ignored lifts it.
pub struct RecordOutcome {
    binding: Arc<Binding>,
    degraded: Option<Instant>,
}

impl RecordOutcome {
    pub(crate) fn new(binding: Arc<Binding>, degraded: Option<Instant>) -> Self {
        RecordOutcome { binding, degraded }
    }
}

impl fmt::Debug for RecordOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordOutcome")
            .field("target", &self.binding.card().target())
            .field("admitted_while_ignored", &self.degraded.is_some())
            .finish()
    }
}

impl OnOutcome for RecordOutcome {
    fn on_outcome(self, outcome: Outcome) {
        self.binding.record(outcome, self.degraded);
    }
}

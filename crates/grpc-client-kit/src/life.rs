//! What a kit owns and shares with its channels: the balancer, the registry of targets, the
//! background tasks, and the state the request path reads to explain an error.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use balance_layer::Balance;
use endpoint_state::sync::lock;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::registry::Registry;
use crate::stack::{KitDiscover, Request};

const SHUT_DOWN: u8 = 1;
#[cfg_attr(not(feature = "dns"), allow(dead_code))]
const DNS_FAILING: u8 = 2;

/// What the request path shares: what it may need to explain an error (read only when an
/// error is mapped), and the budget of the bytes its calls keep for a transparent retry.
#[derive(Debug, Default)]
pub(crate) struct KitState {
    flags: AtomicU8,
    dns: Mutex<Option<(Arc<str>, Arc<str>)>>,
    pub(crate) replay: ReplayBudget,
}

impl KitState {
    #[inline]
    pub(crate) fn is_shut_down(&self) -> bool {
        self.flags.load(Ordering::Acquire) & SHUT_DOWN != 0
    }

    /// Whether an error might need a note (one atomic load per call).
    #[inline]
    pub(crate) fn has_notes(&self) -> bool {
        self.flags.load(Ordering::Acquire) != 0
    }

    pub(crate) fn dns_failure(&self) -> Option<(Arc<str>, Arc<str>)> {
        lock(&self.dns).clone()
    }

    #[cfg_attr(not(feature = "dns"), allow(dead_code))]
    pub(crate) fn set_dns_failure(&self, name: Arc<str>, reason: Arc<str>) {
        *lock(&self.dns) = Some((name, reason));
        self.flags.fetch_or(DNS_FAILING, Ordering::AcqRel);
    }

    #[cfg_attr(not(feature = "dns"), allow(dead_code))]
    pub(crate) fn clear_dns_failure(&self) {
        *lock(&self.dns) = None;
        self.flags.fetch_and(!DNS_FAILING, Ordering::AcqRel);
    }

    pub(crate) fn shut_down(&self) -> bool {
        self.flags.fetch_or(SHUT_DOWN, Ordering::AcqRel) & SHUT_DOWN == 0
    }
}

/// The most request body bytes all the calls of one kit keep to send again, together: 64 MiB
/// (a thousand calls at the most one call keeps,
/// [`REPLAY_LIMIT`](crate::retry::REPLAY_LIMIT)). Calls beyond it go without transparent retry once
/// their body is read.
pub(crate) const REPLAY_BUDGET: usize = 64 * 1024 * 1024;

/// The bytes a kit's calls keep for replay, counted against a limit.
#[derive(Debug)]
pub(crate) struct ReplayBudget {
    used: AtomicUsize,
    limit: usize,
}

impl Default for ReplayBudget {
    fn default() -> Self {
        ReplayBudget {
            used: AtomicUsize::new(0),
            limit: REPLAY_BUDGET,
        }
    }
}

impl ReplayBudget {
    /// Takes `n` bytes of the budget, if they fit.
    pub(crate) fn take(&self, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        let before = self.used.fetch_add(n, Ordering::AcqRel);
        if before.saturating_add(n) <= self.limit {
            return true;
        }
        self.used.fetch_sub(n, Ordering::AcqRel);
        false
    }

    /// Gives `n` bytes back.
    pub(crate) fn give(&self, n: usize) {
        if n > 0 {
            self.used.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// How many bytes calls keep now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// Everything a kit owns; dropped (and its tasks and checker stopped) with its last handle.
pub(crate) struct Life {
    pub(crate) state: Arc<KitState>,
    pub(crate) balance: Balance<KitDiscover, Request>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) tasks: Mutex<Vec<JoinHandle<()>>>,
    /// `Some` for a DNS target: becomes `true` after the first successful resolution.
    pub(crate) resolved: Option<watch::Receiver<bool>>,
    pub(crate) dns_name: Option<Arc<str>>,
    /// Whether the targets come from a discovery source (`KitBuilder::discover`).
    pub(crate) discovered: bool,
    /// Whether a call no backend acted on is sent again to another target.
    pub(crate) transparent_retry: bool,
    /// The service config, when its methods have settings the kit applies to calls.
    pub(crate) calls: Option<Arc<crate::service_config::ServiceConfig>>,
    /// The methods' retry policies and the kit's retry throttle, when a method has one.
    pub(crate) retries: Option<Arc<crate::policy::Retries>>,
    /// The service config as given (for [`Kit::service_config`](crate::Kit::service_config)).
    pub(crate) service_config: Option<Arc<crate::service_config::ServiceConfig>>,
}

impl Drop for Life {
    fn drop(&mut self) {
        // The tasks hold clones of the checker: aborting them lets it stop with this handle.
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
        tracing::debug!("kit dropped: tasks and probes stop");
    }
}

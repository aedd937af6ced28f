//! What a kit owns and shares with its channels: the balancer, the registry of targets, the
//! background tasks, and the state the request path reads to explain an error.

use std::sync::atomic::{AtomicU8, Ordering};
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

/// What the request path may need to explain an error: read only when an error is mapped.
#[derive(Debug, Default)]
pub(crate) struct KitState {
    flags: AtomicU8,
    dns: Mutex<Option<(Arc<str>, Arc<str>)>>,
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

/// Everything a kit owns; dropped (and its tasks and checker stopped) with its last handle.
pub(crate) struct Life {
    pub(crate) state: Arc<KitState>,
    pub(crate) balance: Balance<KitDiscover, Request>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) tasks: Mutex<Vec<JoinHandle<()>>>,
    /// `Some` for a DNS target: becomes `true` after the first successful resolution.
    pub(crate) resolved: Option<watch::Receiver<bool>>,
    pub(crate) dns_name: Option<Arc<str>>,
    /// Whether a call no backend acted on is sent again to another target.
    pub(crate) transparent_retry: bool,
}

impl Drop for Life {
    fn drop(&mut self) {
        // The tasks hold clones of the checker: aborting them lets it stop with this handle.
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
        tracing::debug!("grpc-client-kit dropped: tasks and probes stop");
    }
}

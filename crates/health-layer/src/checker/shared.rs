//! What every handle of a checker and every target's task share: the configuration, the
//! lifecycle, the targets, the transition stream and callbacks, and the probe permits.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use endpoint_state::sync::{lock, read, write};
use endpoint_state::{CardEvent, EndpointCard};
use tokio::sync::{Notify, Semaphore, broadcast};
use tokio::time::Instant;
use tonic::transport::Endpoint;

use super::grid::Grid;
use super::target::{Entry, Target};
use crate::config::{HealthConfig, ProbeMode};
use crate::error::InvalidTarget;
use crate::probe::ProbeLink;

pub(super) enum Lifecycle {
    NotStarted,
    Running(tokio::runtime::Handle),
    Stopped,
}

pub(super) type Callback = Arc<dyn Fn(&CardEvent) + Send + Sync>;

pub(super) struct Shared {
    pub(super) config: HealthConfig,
    pub(super) lifecycle: Mutex<Lifecycle>,
    targets: RwLock<HashMap<Arc<str>, Arc<Entry>>>,
    /// The transitions' stream (`None` once stopped: its end).
    pub(super) events: Mutex<Option<broadcast::Sender<CardEvent>>>,
    pub(super) callbacks: Mutex<Vec<Callback>>,
    pub(super) probes: Semaphore,
    /// Woken when a target gets its first verdict, is removed, or the checker stops.
    pub(super) progress: Notify,
    /// Whether a [`NotRunning`](crate::NotRunning) of each cause has been logged at `warn`.
    pub(super) warned: [AtomicBool; 3],
    /// The first panic of a transition callback, with `fail_fast_callbacks`.
    pub(super) panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Where jittered checks are placed, so that checks due together share a wake-up.
    pub(super) grid: Grid,
}

impl Shared {
    pub(super) fn new(config: HealthConfig) -> Self {
        let (events, _) = broadcast::channel(config.events_capacity);
        let probes = Semaphore::new(config.max_concurrent_probes);
        Shared {
            config,
            lifecycle: Mutex::new(Lifecycle::NotStarted),
            targets: RwLock::default(),
            events: Mutex::new(Some(events)),
            callbacks: Mutex::default(),
            probes,
            progress: Notify::new(),
            warned: Default::default(),
            panic: Mutex::default(),
            grid: Grid::new(Instant::now()),
        }
    }

    pub(super) fn read_targets(&self) -> RwLockReadGuard<'_, HashMap<Arc<str>, Arc<Entry>>> {
        read(&self.targets)
    }

    pub(super) fn write_targets(&self) -> RwLockWriteGuard<'_, HashMap<Arc<str>, Arc<Entry>>> {
        write(&self.targets)
    }

    pub(super) fn entry(&self, target: &str) -> Option<Arc<Entry>> {
        self.read_targets().get(target).cloned()
    }

    pub(super) fn is_running(&self) -> bool {
        matches!(*lock(&self.lifecycle), Lifecycle::Running(_))
    }

    pub(super) fn is_stopped(&self) -> bool {
        matches!(*lock(&self.lifecycle), Lifecycle::Stopped)
    }

    /// Whether targets are watched (`Watch` mode) rather than checked on a schedule.
    pub(super) fn is_watch(&self) -> bool {
        matches!(self.config.mode, ProbeMode::Watch)
    }

    /// Marks the checker stopped, closes the event stream, forgets the callbacks and ends
    /// every target's task (aborted; not awaited). Returns the entries, which stay readable.
    pub(super) fn shut_down(&self) -> Vec<Arc<Entry>> {
        let was = std::mem::replace(&mut *lock(&self.lifecycle), Lifecycle::Stopped);
        let entries: Vec<_> = self.read_targets().values().cloned().collect();
        for entry in &entries {
            if let Some(task) = lock(&entry.task).as_ref() {
                task.abort();
            }
            entry.link.close();
        }
        drop(lock(&self.events).take());
        lock(&self.callbacks).clear();
        self.progress.notify_waiters();
        if matches!(was, Lifecycle::Running(_)) {
            tracing::info!(targets = entries.len(), "health checker stopped");
        }
        entries
    }

    /// Builds a target's entry (nothing is stored or written yet).
    pub(super) fn resolve(&self, target: Target) -> Result<Arc<Entry>, InvalidTarget> {
        let Target {
            name,
            endpoint,
            card,
            service,
            connector,
            address,
        } = target;
        // The default template's endpoints have tonic's defaults, which the checker knows.
        let known_endpoint = endpoint.is_none() && self.config.endpoint_template.is_none();
        let endpoint = match endpoint {
            Some(e) => Some(e),
            None if self.config.mode.needs_endpoint() => Some(
                match &self.config.endpoint_template {
                    Some(template) => template(&name),
                    None => Endpoint::from_shared(name.to_string()).map_err(Into::into),
                }
                .map_err(|e| InvalidTarget::new(name.clone(), e))?,
            ),
            None => None,
        };
        #[cfg(feature = "http-probe")]
        if let (ProbeMode::Http(http), Some(endpoint)) = (&self.config.mode, &endpoint) {
            http.url_for(endpoint.uri())
                .map_err(|e| InvalidTarget::new(name.clone(), e))?;
        }
        // Each target is probed once when it is added, even with interval 0 (then only on
        // demand); `Watch` mode subscribes instead.
        let first_check = (!self.is_watch()).then(Instant::now);
        let link = ProbeLink::new(
            name.clone(),
            endpoint,
            service.unwrap_or_else(|| self.config.service.clone()),
            self.config.probe_keepalive,
        )
        .with_transport(connector, address)
        .with_known_endpoint(known_endpoint);
        Ok(Arc::new(Entry::new(
            name.clone(),
            card.unwrap_or_else(|| EndpointCard::new(name)),
            link,
            first_check,
        )))
    }
}

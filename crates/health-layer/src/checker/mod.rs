//! The active health checker: its API. A target's record is in [`target`], what all handles
//! share in [`shared`], a target's task in [`run`], and what becomes of a probe's result in
//! [`publish`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use endpoint_state::sync::lock;
use endpoint_state::time::after;
use endpoint_state::{CardEvent, EndpointCard, HealthVerdict};
use tokio::sync::broadcast;

use crate::config::HealthConfig;
use crate::error::{
    ConfigError, InvalidTarget, NotRunning, NotRunningCause, RefusedBecause, StartError,
    TargetRefused,
};
use crate::layer::HealthLayer;

mod grid;
mod publish;
mod run;
mod shared;
mod target;

use shared::{Lifecycle, Shared};
pub use target::{Target, TargetStatus};

/// The user's handle; the checker stops when the last one is dropped.
struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        let entries = self.shared.shut_down();
        if !entries.is_empty() {
            tracing::debug!(
                targets = entries.len(),
                "health checker dropped: probes stopped"
            );
        }
        if lock(&self.shared.panic).take().is_some() {
            tracing::error!(
                "a health transition callback panicked (fail-fast); the checker was dropped \
                 without stop(), so the panic cannot be propagated"
            );
        }
    }
}

impl HealthConfig {
    /// Validates the configuration and builds a checker (not started; see
    /// [`HealthChecker::start`]).
    pub fn build(self) -> Result<HealthChecker, ConfigError> {
        self.validate()?;
        Ok(HealthChecker::from_config(self))
    }
}

/// The active health checker. Cheap to clone: every clone is the same checker, and it stops
/// when the last clone is dropped (or at [`stop`](Self::stop)).
///
/// Each target has its own task, its own probe channel and its own next-check instant on
/// tokio's monotonic clock: a slow or black-holed target never delays another. Verdicts are
/// written to each target's [`EndpointCard`] health line, which is what [`HealthLayer`] and a
/// balancer read.
///
/// ```no_run
/// use std::time::Duration;
/// use health_layer::{HealthChecker, ProbeMode};
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let checker = HealthChecker::builder()
///     .mode(ProbeMode::Watch)
///     .timeout(Duration::from_secs(2))
///     .build()?;
/// checker.start(["http://10.0.0.7:50051", "http://10.0.0.8:50051"])?;
/// if !checker.wait_until_ready(Duration::from_secs(5)).await {
///     eprintln!("some targets have no verdict yet");
/// }
/// let mut transitions = checker.subscribe();
/// while let Ok(t) = transitions.recv().await {
///     println!("{t}"); // http://10.0.0.7:50051: healthy -> unhealthy (NOT_SERVING)
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct HealthChecker {
    handle: Arc<Handle>,
}

impl fmt::Debug for HealthChecker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &*lock(&self.handle.shared.lifecycle) {
            Lifecycle::NotStarted => "not started",
            Lifecycle::Running(_) => "running",
            Lifecycle::Stopped => "stopped",
        };
        f.debug_struct("HealthChecker")
            .field("state", &state)
            .field("targets", &self.shared().read_targets().len())
            .field("config", &self.shared().config)
            .finish()
    }
}

impl HealthChecker {
    /// A configuration with defaults, to adjust and [`build`](HealthConfig::build).
    pub fn builder() -> HealthConfig {
        HealthConfig::default()
    }

    /// Builds a checker from `config` (validated; not started).
    pub fn new(config: HealthConfig) -> Result<Self, ConfigError> {
        config.build()
    }

    pub(crate) fn from_config(config: HealthConfig) -> Self {
        HealthChecker {
            handle: Arc::new(Handle {
                shared: Arc::new(Shared::new(config)),
            }),
        }
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    /// The configuration the checker was built with.
    pub fn config(&self) -> &HealthConfig {
        &self.shared().config
    }

    /// Adds `targets` and starts checking every target (those added before too): the first
    /// probes run at once, concurrently (within
    /// [`max_concurrent_probes`](HealthConfig::max_concurrent_probes)). Must be called within a
    /// tokio runtime, whose tasks then run the probes. Calling it again while running only
    /// adds targets. If a target is invalid, nothing is added and nothing starts.
    pub fn start<I>(&self, targets: I) -> Result<(), StartError>
    where
        I: IntoIterator,
        I::Item: Into<Target>,
    {
        let shared = self.shared();
        let entries = targets
            .into_iter()
            .map(|t| shared.resolve(t.into()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(StartError::InvalidTarget)?;
        let mut lifecycle = lock(&shared.lifecycle);
        let runtime = match &*lifecycle {
            Lifecycle::Stopped => return Err(StartError::Stopped),
            Lifecycle::Running(rt) => rt.clone(),
            Lifecycle::NotStarted => {
                let rt =
                    tokio::runtime::Handle::try_current().map_err(|_| StartError::NoRuntime)?;
                *lifecycle = Lifecycle::Running(rt.clone());
                rt
            }
        };
        let mut map = shared.write_targets();
        for entry in entries {
            if !map.contains_key(&entry.name) {
                entry.card.set_health(HealthVerdict::Unknown, None);
                map.insert(entry.name.clone(), entry);
            }
        }
        for entry in map.values() {
            if lock(&entry.task).is_none() {
                shared.spawn(&runtime, entry);
            }
        }
        tracing::info!(targets = map.len(), mode = ?shared.config.mode, "health checker started");
        Ok(())
    }

    /// Adds a target and returns its card (the existing one if the target is already there).
    /// The card's health line says [`HealthVerdict::Unknown`] until the first probe. While
    /// running, its first probe runs at once; before [`start`](Self::start), when the checker
    /// starts. A stopped checker stores it but never probes it.
    pub fn add_target(&self, target: impl Into<Target>) -> Result<EndpointCard, InvalidTarget> {
        let shared = self.shared();
        let entry = shared.resolve(target.into())?;
        let lifecycle = lock(&shared.lifecycle);
        let mut map = shared.write_targets();
        if let Some(existing) = map.get(&entry.name) {
            return Ok(existing.card.clone());
        }
        entry.card.set_health(HealthVerdict::Unknown, None);
        map.insert(entry.name.clone(), entry.clone());
        if let Lifecycle::Running(rt) = &*lifecycle {
            shared.spawn(rt, &entry);
        }
        tracing::debug!(backend = %entry.name, "health check target added");
        Ok(entry.card.clone())
    }

    /// Probes a target once and adds it only if the probe passes; otherwise refuses it and
    /// stores nothing (its card, if one was given, is not written). An accepted target starts
    /// healthy, with its next check one interval later. A target already present is returned
    /// as it is.
    pub async fn add_target_checked(
        &self,
        target: impl Into<Target>,
    ) -> Result<EndpointCard, TargetRefused> {
        let shared = self.shared();
        let target = target.into();
        let refuse = |name: &Arc<str>, error| TargetRefused {
            target: name.clone(),
            error,
        };
        if shared.is_stopped() {
            return Err(refuse(&target.name, RefusedBecause::Stopped));
        }
        if let Some(existing) = shared.entry(&target.name) {
            return Ok(existing.card.clone());
        }
        let entry = shared
            .resolve(target)
            .map_err(|e| refuse(&e.target.clone(), RefusedBecause::Invalid(e)))?;
        let result = {
            let _permit = shared.probes.acquire().await.expect("never closed");
            shared.probe(&entry).await
        };
        let evidence = match result {
            Err(e) if !shared.unimplemented_passes(&e) => {
                entry.link.close();
                tracing::info!(backend = %entry.name, error = %e.reason(), "health check target refused");
                return Err(refuse(&entry.name, RefusedBecause::Probe(e)));
            }
            other => shared.judge(&entry, other),
        };
        {
            let lifecycle = lock(&shared.lifecycle);
            if matches!(*lifecycle, Lifecycle::Stopped) {
                return Err(refuse(&entry.name, RefusedBecause::Stopped));
            }
            let mut map = shared.write_targets();
            if let Some(existing) = map.get(&entry.name) {
                return Ok(existing.card.clone());
            }
            entry.card.set_health(HealthVerdict::Unknown, None);
            map.insert(entry.name.clone(), entry.clone());
        }
        shared.publish(&entry, evidence, true);
        if let Lifecycle::Running(rt) = &*lock(&shared.lifecycle)
            && !entry.removed.load(Ordering::Acquire)
            && lock(&entry.task).is_none()
        {
            shared.spawn(rt, &entry);
        }
        Ok(entry.card.clone())
    }

    /// Removes a target: its task ends and its probe channel closes at once. Returns whether it
    /// was there. Its card keeps the last verdict.
    pub fn remove_target(&self, target: &str) -> bool {
        let shared = self.shared();
        let removed = shared.write_targets().remove(target);
        match removed {
            Some(entry) => {
                entry.close();
                shared.progress.notify_waiters();
                tracing::debug!(backend = %entry.name, "health check target removed");
                true
            }
            None => false,
        }
    }

    /// Whether `target` is one of the checker's targets.
    pub fn contains(&self, target: &str) -> bool {
        self.shared().entry(target).is_some()
    }

    /// The names of every target.
    pub fn targets(&self) -> Vec<Arc<str>> {
        self.shared().read_targets().keys().cloned().collect()
    }

    /// The target's card, shared with the endpoint's other layers.
    pub fn card(&self, target: &str) -> Option<EndpointCard> {
        self.shared().entry(target).map(|e| e.card.clone())
    }

    /// A [`HealthLayer`] gating on the target's card.
    pub fn layer(&self, target: &str) -> Option<HealthLayer> {
        self.card(target).map(HealthLayer::new)
    }

    /// Whether the checker is running (started and not stopped).
    pub fn is_running(&self) -> bool {
        self.shared().is_running()
    }

    /// Whether the target is healthy: `Ok(true)` only after a probe saw it serving.
    ///
    /// A target without a verdict yet is `Ok(false)` while the checker runs. When no checker
    /// runs that will ever produce one — never started, stopped, or not a target — the answer
    /// is [`NotRunning`] (not "unhealthy"), and the first such answer for each cause logs a
    /// warning naming it.
    pub fn is_healthy(&self, target: &str) -> Result<bool, NotRunning> {
        let shared = self.shared();
        let cause = match shared.entry(target) {
            Some(entry) => match entry.verdict() {
                HealthVerdict::Healthy => return Ok(true),
                HealthVerdict::Unhealthy => return Ok(false),
                _ => match &*lock(&shared.lifecycle) {
                    Lifecycle::Running(_) => return Ok(false),
                    Lifecycle::NotStarted => NotRunningCause::NotStarted,
                    Lifecycle::Stopped => NotRunningCause::Stopped,
                },
            },
            None => NotRunningCause::UnknownTarget,
        };
        let error = NotRunning {
            target: target.into(),
            cause,
        };
        let flag = &shared.warned[cause as usize];
        if !flag.swap(true, Ordering::AcqRel) {
            tracing::warn!(backend = %target, %error, "health asked of a target no checker will ever probe");
        } else {
            tracing::debug!(backend = %target, %error, "health asked of a target no checker will ever probe");
        }
        Err(error)
    }

    /// What the checker knows about `target`.
    pub fn status(&self, target: &str) -> Option<TargetStatus> {
        self.shared().entry(target).map(|e| e.status())
    }

    /// Every target's status.
    pub fn statuses(&self) -> Vec<TargetStatus> {
        let entries: Vec<_> = self.shared().read_targets().values().cloned().collect();
        entries.iter().map(|e| e.status()).collect()
    }

    /// Waits until every target has a verdict (healthy or unhealthy): `true` then, `false`
    /// when `timeout` passes first or when the checker is not running.
    pub async fn wait_until_ready(&self, timeout: Duration) -> bool {
        let shared = self.shared();
        // Saturating: `Duration::MAX` waits as long as anything can.
        let deadline = after(timeout);
        loop {
            let notified = shared.progress.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if !shared.is_running() {
                return false;
            }
            let all = shared
                .read_targets()
                .values()
                .all(|e| e.verdict() != HealthVerdict::Unknown);
            if all {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// Probes the target now and publishes the result like a scheduled probe (status, card,
    /// transition, callbacks, next check). In `Watch` mode this is one `Check` call. Returns
    /// the status after publishing.
    pub async fn check_now(&self, target: &str) -> Result<TargetStatus, NotRunning> {
        let shared = self.shared();
        let not_running = |cause| NotRunning {
            target: target.into(),
            cause,
        };
        let entry = shared
            .entry(target)
            .ok_or_else(|| not_running(NotRunningCause::UnknownTarget))?;
        if shared.is_stopped() {
            return Err(not_running(NotRunningCause::Stopped));
        }
        shared.probe_and_publish(&entry).await;
        Ok(entry.status())
    }

    /// A stream of transitions: one [`CardEvent`] of the health line per change of a target's
    /// verdict ([`is_transition`](CardEvent::is_transition)), never a repeat — not a new reason
    /// for the same verdict, which the card's own [`subscribe`](EndpointCard::subscribe) also
    /// shows.
    ///
    /// Each subscriber has its own bounded buffer
    /// ([`events_capacity`](HealthConfig::events_capacity)); the checker never waits for it. A
    /// subscriber that falls further behind loses the oldest transitions and is told how many
    /// (`RecvError::Lagged(n)`) on its next `recv`, then continues with the oldest kept; the
    /// cards always hold the current verdicts. After [`stop`](Self::stop) the stream ends
    /// (`RecvError::Closed`).
    pub fn subscribe(&self) -> broadcast::Receiver<CardEvent> {
        match &*lock(&self.shared().events) {
            Some(tx) => tx.subscribe(),
            None => broadcast::channel(1).1,
        }
    }

    /// Calls `callback` on every transition (the events of [`subscribe`](Self::subscribe)), in
    /// the task that published it (keep it short and non-blocking). A callback that panics is
    /// caught and logged, and monitoring goes on; with
    /// [`fail_fast_callbacks`](HealthConfig::fail_fast_callbacks) the first panic is also
    /// re-raised by [`stop`](Self::stop).
    ///
    /// A callback that holds a clone of this checker keeps it alive: call `stop` to end it.
    pub fn on_transition<F>(&self, callback: F)
    where
        F: Fn(&CardEvent) + Send + Sync + 'static,
    {
        lock(&self.shared().callbacks).push(Arc::new(callback));
    }

    /// Stops the checker: every probe task ends and every probe channel is closed by the time
    /// this returns; subscribers see the end of their stream. Targets and their last statuses
    /// stay readable. Calling it again does nothing.
    ///
    /// # Panics
    ///
    /// With [`fail_fast_callbacks`](HealthConfig::fail_fast_callbacks), re-raises the first
    /// panic of a transition callback.
    pub async fn stop(&self) {
        let shared = self.shared();
        let entries = shared.shut_down();
        let tasks: Vec<_> = entries
            .iter()
            .filter_map(|e| lock(&e.task).take())
            .collect();
        for task in tasks {
            let _ = task.await;
        }
        for entry in &entries {
            entry.link.close();
        }
        if let Some(payload) = lock(&shared.panic).take() {
            std::panic::resume_unwind(payload);
        }
    }
}

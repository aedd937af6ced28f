//! The active health checker: targets, their schedules, probes, verdicts and transitions.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime};

use endpoint_state::{EndpointCard, HealthVerdict};
use tokio::sync::{Notify, Semaphore, broadcast};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;

use crate::config::{HealthConfig, ProbeMode};
use crate::error::{
    ConfigError, InvalidTarget, NotRunning, NotRunningCause, RefusedBecause, StartError,
    TargetRefused,
};
use crate::layer::HealthLayer;
use crate::probe::far_future;
use crate::probe::{self, ConnectionEnd, ProbeConn, ProbeError, ProbeFailure, ServingStatus};
use crate::schedule;

/// Locks a mutex, carrying on after a panic elsewhere (every critical section here leaves the
/// data whole).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A target to check: its name, and optionally its own probe endpoint, card and service name.
///
/// Anything that converts into a `String` is a target with defaults:
/// `checker.add_target("http://10.0.0.7:50051")`.
///
/// ```
/// use endpoint_state::EndpointCard;
/// use health_layer::Target;
/// use tonic::transport::Endpoint;
///
/// let card = EndpointCard::new("b1");
/// let target = Target::new("b1")
///     .endpoint(Endpoint::from_static("http://127.0.0.1:50051"))
///     .card(card.clone())
///     .service("my.package.Service");
/// # let _ = target;
/// ```
#[derive(Clone, Debug)]
pub struct Target {
    name: Arc<str>,
    endpoint: Option<Endpoint>,
    card: Option<EndpointCard>,
    service: Option<Arc<str>>,
}

impl Target {
    /// A target named `name`; its probe endpoint comes from the checker's endpoint template.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Target {
            name: name.into(),
            endpoint: None,
            card: None,
            service: None,
        }
    }

    /// Probe this endpoint instead of the template's (its own channel is created from it; the
    /// endpoint itself is only a configuration).
    pub fn endpoint(mut self, endpoint: Endpoint) -> Self {
        self.endpoint = Some(endpoint);
        self
    }

    /// Write verdicts into this card (shared with the endpoint's other layers) instead of a
    /// new one.
    pub fn card(mut self, card: EndpointCard) -> Self {
        self.card = Some(card);
        self
    }

    /// Ask about this service name instead of the checker's.
    pub fn service(mut self, service: impl Into<Arc<str>>) -> Self {
        self.service = Some(service.into());
        self
    }

    /// The target's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl From<&str> for Target {
    fn from(name: &str) -> Self {
        Target::new(name)
    }
}

impl From<String> for Target {
    fn from(name: String) -> Self {
        Target::new(name)
    }
}

impl From<Arc<str>> for Target {
    fn from(name: Arc<str>) -> Self {
        Target::new(name)
    }
}

impl From<&String> for Target {
    fn from(name: &String) -> Self {
        Target::new(name.as_str())
    }
}

/// A change of a target's verdict (never a repeat of the same verdict).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The target.
    pub target: Arc<str>,
    /// The verdict before.
    pub from: HealthVerdict,
    /// The verdict now.
    pub to: HealthVerdict,
    /// Why (the probe's error when unhealthy).
    pub reason: Option<Arc<str>>,
    /// When it was published (wall clock, for people).
    pub at: SystemTime,
}

/// What the checker knows about one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetStatus {
    /// The target.
    pub target: Arc<str>,
    /// [`HealthVerdict::Unknown`] until the first probe, then `Healthy` or `Unhealthy`.
    pub verdict: HealthVerdict,
    /// The last probe's error, when it failed.
    pub last_error: Option<Arc<str>>,
    /// When the last probe finished (wall clock), if any.
    pub last_check: Option<SystemTime>,
    /// Probes failed in a row (0 after a success).
    pub consecutive_failures: u32,
    /// When the next scheduled probe runs (`None`: no schedule, as in `Watch` mode or with
    /// interval 0).
    pub next_check: Option<Instant>,
    /// Whether the target holds a gRPC probe channel now (kept between passing probes, dropped
    /// as soon as one fails; always `false` for HTTP and custom probes, which keep nothing).
    pub channel_open: bool,
    /// The HTTP/2 keepalive interval of the target's new probe connections, when the checker
    /// sets one: [`probe_keepalive`](crate::HealthConfig::probe_keepalive), doubled each time
    /// the server refused it with `GOAWAY too_many_pings` (gRFC A8). `None`: the endpoint
    /// template's own.
    pub probe_keepalive: Option<Duration>,
    /// Probe connections made for the target so far (counting the probe channel's own
    /// reconnections, for plaintext endpoints): how often servers closed them (max connection
    /// age or idleness, a restart) or probes failed.
    pub connections: u64,
}

/// What a probe result means for the target.
#[derive(Debug, Clone)]
enum Evidence {
    Healthy { note: Option<Arc<str>> },
    Unhealthy { reason: Arc<str> },
}

struct EntryState {
    verdict: HealthVerdict,
    last_error: Option<Arc<str>>,
    last_check: Option<SystemTime>,
    failures: u32,
    next_check: Option<Instant>,
}

/// One target inside the checker.
struct Entry {
    name: Arc<str>,
    card: EndpointCard,
    endpoint: Option<Endpoint>,
    service: Arc<str>,
    state: Mutex<EntryState>,
    /// The probe connection, kept between passing probes.
    channel: Mutex<Option<ProbeConn>>,
    /// Woken whenever the target's next check instant changes.
    reschedule: Notify,
    task: Mutex<Option<JoinHandle<()>>>,
    removed: AtomicBool,
    /// The HTTP/2 keepalive of this target's new probe connections, when the checker sets one:
    /// [`HealthConfig::probe_keepalive`], doubled on each `too_many_pings` (gRFC A8).
    keepalive: Mutex<Option<Duration>>,
    /// Whether an `UNIMPLEMENTED` counted as healthy has been logged for this target.
    unimplemented_logged: AtomicBool,
    /// Probe connections made for the target (see [`TargetStatus::connections`]).
    connections: Arc<AtomicU64>,
    /// Held while a probe of the target runs: a scheduled probe and `check_now` take turns
    /// (one connection, one result at a time).
    probing: tokio::sync::Mutex<()>,
}

impl Entry {
    fn status(&self) -> TargetStatus {
        let st = lock(&self.state);
        TargetStatus {
            target: self.name.clone(),
            verdict: st.verdict,
            last_error: st.last_error.clone(),
            last_check: st.last_check,
            consecutive_failures: st.failures,
            next_check: st.next_check,
            channel_open: lock(&self.channel).is_some(),
            probe_keepalive: *lock(&self.keepalive),
            connections: self.connections.load(Ordering::Relaxed),
        }
    }

    fn verdict(&self) -> HealthVerdict {
        lock(&self.state).verdict
    }

    /// Ends the target's task and drops its channel at once.
    fn close(&self) {
        self.removed.store(true, Ordering::Release);
        if let Some(task) = lock(&self.task).take() {
            task.abort();
        }
        drop(lock(&self.channel).take());
        self.reschedule.notify_waiters();
    }
}

enum Lifecycle {
    NotStarted,
    Running(tokio::runtime::Handle),
    Stopped,
}

type Callback = Arc<dyn Fn(&Transition) + Send + Sync>;

struct Shared {
    config: HealthConfig,
    lifecycle: Mutex<Lifecycle>,
    targets: RwLock<HashMap<Arc<str>, Arc<Entry>>>,
    events: Mutex<Option<broadcast::Sender<Transition>>>,
    callbacks: Mutex<Vec<Callback>>,
    probes: Semaphore,
    /// Woken when a target gets its first verdict, is removed, or the checker stops.
    progress: Notify,
    warned: [AtomicBool; 3],
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

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
///     println!("{}: {} -> {} ({:?})", t.target, t.from, t.to, t.reason);
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
        let (events, _) = broadcast::channel(config.events_capacity);
        let probes = Semaphore::new(config.max_concurrent_probes);
        HealthChecker {
            handle: Arc::new(Handle {
                shared: Arc::new(Shared {
                    config,
                    lifecycle: Mutex::new(Lifecycle::NotStarted),
                    targets: RwLock::default(),
                    events: Mutex::new(Some(events)),
                    callbacks: Mutex::default(),
                    probes,
                    progress: Notify::new(),
                    warned: Default::default(),
                    panic: Mutex::default(),
                }),
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
        tracing::debug!(target = %entry.name, "health check target added");
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
                drop(lock(&entry.channel).take());
                tracing::info!(target = %entry.name, error = %e.reason(), "health check target refused");
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
                tracing::debug!(target = %entry.name, "health check target removed");
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
            tracing::warn!(target = %target, %error, "health asked of a target no checker will ever probe");
        } else {
            tracing::debug!(target = %target, %error, "health asked of a target no checker will ever probe");
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
        let deadline = Instant::now() + timeout;
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

    /// A stream of transitions: one item per change of a target's verdict, never a repeat.
    ///
    /// Each subscriber has its own bounded buffer
    /// ([`events_capacity`](HealthConfig::events_capacity)); the checker never waits for it. A
    /// subscriber that falls further behind loses the oldest transitions and is told how many
    /// (`RecvError::Lagged(n)`) on its next `recv`, then continues with the oldest kept; the
    /// cards always hold the current verdicts. After [`stop`](Self::stop) the stream ends
    /// (`RecvError::Closed`).
    pub fn subscribe(&self) -> broadcast::Receiver<Transition> {
        match &*lock(&self.shared().events) {
            Some(tx) => tx.subscribe(),
            None => broadcast::channel(1).1,
        }
    }

    /// Calls `callback` on every transition, in the task that published it (keep it short and
    /// non-blocking). A callback that panics is caught and logged, and monitoring goes on;
    /// with [`fail_fast_callbacks`](HealthConfig::fail_fast_callbacks) the first panic is also
    /// re-raised by [`stop`](Self::stop).
    ///
    /// A callback that holds a clone of this checker keeps it alive: call `stop` to end it.
    pub fn on_transition<F>(&self, callback: F)
    where
        F: Fn(&Transition) + Send + Sync + 'static,
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
            drop(lock(&entry.channel).take());
        }
        if let Some(payload) = lock(&shared.panic).take() {
            std::panic::resume_unwind(payload);
        }
    }
}

impl Shared {
    fn read_targets(&self) -> std::sync::RwLockReadGuard<'_, HashMap<Arc<str>, Arc<Entry>>> {
        self.targets.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_targets(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<Arc<str>, Arc<Entry>>> {
        self.targets.write().unwrap_or_else(|p| p.into_inner())
    }

    fn entry(&self, target: &str) -> Option<Arc<Entry>> {
        self.read_targets().get(target).cloned()
    }

    fn is_running(&self) -> bool {
        matches!(*lock(&self.lifecycle), Lifecycle::Running(_))
    }

    fn is_stopped(&self) -> bool {
        matches!(*lock(&self.lifecycle), Lifecycle::Stopped)
    }

    /// Marks the checker stopped, closes the event stream, forgets the callbacks and ends
    /// every target's task (aborted; not awaited). Returns the entries, which stay readable.
    fn shut_down(&self) -> Vec<Arc<Entry>> {
        let was = std::mem::replace(&mut *lock(&self.lifecycle), Lifecycle::Stopped);
        let entries: Vec<_> = self.read_targets().values().cloned().collect();
        for entry in &entries {
            if let Some(task) = lock(&entry.task).as_ref() {
                task.abort();
            }
            drop(lock(&entry.channel).take());
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
    fn resolve(&self, target: Target) -> Result<Arc<Entry>, InvalidTarget> {
        let Target {
            name,
            endpoint,
            card,
            service,
        } = target;
        let endpoint = match endpoint {
            Some(e) => Some(e),
            None if self.config.mode.needs_endpoint() => Some(
                (self.config.endpoint_template)(&name)
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
        let first_check = (!matches!(self.config.mode, ProbeMode::Watch)).then(Instant::now);
        Ok(Arc::new(Entry {
            card: card.unwrap_or_else(|| EndpointCard::new(name.clone())),
            name,
            endpoint,
            service: service.unwrap_or_else(|| self.config.service.clone()),
            state: Mutex::new(EntryState {
                verdict: HealthVerdict::Unknown,
                last_error: None,
                last_check: None,
                failures: 0,
                next_check: first_check,
            }),
            channel: Mutex::new(None),
            reschedule: Notify::new(),
            task: Mutex::new(None),
            removed: AtomicBool::new(false),
            keepalive: Mutex::new(self.config.probe_keepalive),
            unimplemented_logged: AtomicBool::new(false),
            connections: Arc::default(),
            probing: tokio::sync::Mutex::new(()),
        }))
    }

    fn spawn(self: &Arc<Self>, runtime: &tokio::runtime::Handle, entry: &Arc<Entry>) {
        let shared = self.clone();
        let e = entry.clone();
        let task = if matches!(self.config.mode, ProbeMode::Watch) {
            runtime.spawn(async move { shared.watch_loop(e).await })
        } else {
            runtime.spawn(async move { shared.schedule_loop(e).await })
        };
        *lock(&entry.task) = Some(task);
    }

    /// A target's life in `Check`, HTTP and custom modes: wait for its own next-check instant
    /// (or a change of it), probe, publish; again.
    async fn schedule_loop(self: Arc<Self>, entry: Arc<Entry>) {
        let sleep = tokio::time::sleep_until(Instant::now());
        let mut sleep = std::pin::pin!(sleep);
        loop {
            let notified = entry.reschedule.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let next = lock(&entry.state).next_check;
            match next {
                None => {
                    notified.await;
                    continue;
                }
                Some(at) => {
                    sleep.as_mut().reset(at);
                    tokio::select! {
                        biased;
                        () = &mut notified => continue,
                        () = sleep.as_mut() => {}
                    }
                }
            }
            self.probe_and_publish(&entry).await;
        }
    }

    /// A target's life in `Watch` mode: subscribe on a new connection, publish every message;
    /// when the server ends a stream that had answered (or closes its connection),
    /// re-subscribe at once keeping the verdict; when a subscription fails, publish the
    /// evidence and retry after the backoff.
    async fn watch_loop(self: Arc<Self>, entry: Arc<Entry>) {
        let initial = self.config.watch_backoff.initial;
        // Consecutive re-subscriptions without a message in between.
        let mut attempt: u32 = 0;
        // When the last immediate re-subscription was made.
        let mut last_quick: Option<Instant> = None;
        loop {
            let end = self.watch_stream(&entry, &mut attempt).await;
            let error = end.error();
            tracing::debug!(target = %entry.name, error = %error.reason(), attempt, "health watch stream ended");
            let unimplemented = error.code() == Some(Code::Unimplemented);
            let keep = matches!(end, WatchEnd::Failed(_))
                && unimplemented
                && self.config.unimplemented_is_healthy;
            if !keep {
                self.connection_done(&entry, error);
            }
            match end {
                WatchEnd::Closed(_) => {
                    // No evidence against the target: the server closed a stream that had
                    // answered (max connection age or idleness, a restart, too many pings).
                    // Once per `initial` at most, so that a server that closes every stream
                    // at once costs one subscription per `initial` (1 s), not a loop.
                    let now = Instant::now();
                    if last_quick.is_none_or(|t| now.saturating_duration_since(t) >= initial) {
                        last_quick = Some(now);
                        continue;
                    }
                    let delay = schedule::watch_delay(
                        &self.config.watch_backoff,
                        attempt,
                        schedule::unit_random(),
                    );
                    attempt = attempt.saturating_add(1);
                    tokio::time::sleep(delay).await;
                    last_quick = Some(Instant::now());
                }
                WatchEnd::Failed(error) | WatchEnd::Silent(error) => {
                    if keep {
                        let evidence = self.judge(&entry, Err(error));
                        self.publish(&entry, evidence, false);
                        // gRFC A17: no `Watch` again on this connection; a new one restarts it.
                        attempt = 0;
                        self.hold_without_watch(&entry).await;
                        continue;
                    }
                    let evidence = self.judge(&entry, Err(error));
                    self.publish(&entry, evidence, true);
                    // The health protocol says a client should not retry a `Watch` that is
                    // UNIMPLEMENTED; we retry only at the longest backoff, so that a server that
                    // gains the health service is watched again eventually.
                    let delay = if unimplemented {
                        self.config.watch_backoff.max
                    } else {
                        schedule::watch_delay(
                            &self.config.watch_backoff,
                            attempt,
                            schedule::unit_random(),
                        )
                    };
                    attempt = attempt.saturating_add(1);
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// One `Watch` subscription on a new connection, until it ends. The first message must come
    /// within the probe timeout; after that, a stream silent for an interval has its connection
    /// verified with a `Check` on it.
    async fn watch_stream(&self, entry: &Entry, attempt: &mut u32) -> WatchEnd {
        let permit = self.probes.acquire().await.expect("never closed");
        let limit = self.config.timeout;
        let deadline = Instant::now().checked_add(limit).unwrap_or_else(far_future);
        let conn = match self.connect(entry, deadline).await {
            Ok(c) => c,
            Err(e) => return WatchEnd::Failed(e),
        };
        let channel = conn.channel.clone();
        *lock(&entry.channel) = Some(conn);
        let mut stream = match probe::watch_on(
            channel.clone(),
            &entry.name,
            &entry.service,
            deadline,
            limit,
        )
        .await
        {
            Ok(s) => s,
            Err(e) => return WatchEnd::Failed(e),
        };
        let mut permit = Some(permit);
        let mut answered = false;
        let interval = self.config.interval;
        let quiet = tokio::time::sleep_until(far_future());
        let mut quiet = std::pin::pin!(quiet);
        let mut verify: Option<ProbeFuture<'_, ServingStatus>> = None;
        loop {
            let next = tokio::select! {
                biased;
                next = stream.message() => next,
                () = tokio::time::sleep_until(deadline), if permit.is_some() => {
                    return WatchEnd::Failed(ProbeError::new(
                        entry.name.clone(),
                        ProbeFailure::Rpc {
                            service: entry.service.clone(),
                            status: tonic::Status::deadline_exceeded(format!(
                                "no Watch message within {}",
                                probe::Secs(limit)
                            )),
                        },
                    ));
                }
                () = quiet.as_mut(), if answered && verify.is_none() => {
                    let request = tonic::Request::new(HealthCheckRequest {
                        service: entry.service.to_string(),
                    });
                    verify = Some(Box::pin(probe::check_on(
                        channel.clone(),
                        &entry.name,
                        request,
                        limit,
                    )));
                    continue;
                }
                result = async { verify.as_mut().expect("guarded").await }, if verify.is_some() => {
                    verify = None;
                    match result {
                        Err(e) if e.code() == Some(Code::DeadlineExceeded) && !e.connection_ended() => {
                            return WatchEnd::Silent(e);
                        }
                        Err(e) if e.connection_ended() => return WatchEnd::Closed(e),
                        // The server answered: the connection is alive.
                        _ => {}
                    }
                    quiet.as_mut().reset(quiet_until(interval));
                    continue;
                }
            };
            permit = None;
            let ended = |e: ProbeError| {
                if answered {
                    WatchEnd::Closed(e)
                } else {
                    WatchEnd::Failed(e)
                }
            };
            match next {
                Ok(Some(response)) => {
                    answered = true;
                    *attempt = 0;
                    // A message proves the connection alive.
                    verify = None;
                    quiet.as_mut().reset(quiet_until(interval));
                    let status = probe::serving_status(response.status);
                    let evidence = if status == ServingStatus::Serving {
                        Evidence::Healthy { note: None }
                    } else {
                        let e = ProbeError::new(
                            entry.name.clone(),
                            ProbeFailure::NotServing {
                                service: entry.service.clone(),
                                status,
                            },
                        );
                        Evidence::Unhealthy {
                            reason: e.reason().into(),
                        }
                    };
                    // The stream is the probe and it is fine: keep its channel.
                    self.publish(entry, evidence, false);
                }
                Ok(None) => {
                    return ended(ProbeError::new(
                        entry.name.clone(),
                        ProbeFailure::Rpc {
                            service: entry.service.clone(),
                            status: tonic::Status::unavailable("the server ended the Watch stream"),
                        },
                    ));
                }
                Err(status) => {
                    let end = ConnectionEnd::of(&status);
                    return ended(
                        ProbeError::new(
                            entry.name.clone(),
                            ProbeFailure::Rpc {
                                service: entry.service.clone(),
                                status: probe::transport_is_unavailable(status),
                            },
                        )
                        .with_end(end),
                    );
                }
            }
        }
    }

    /// A target whose server answered `Watch` with `UNIMPLEMENTED` (counted as healthy): no
    /// new `Watch` on this connection (gRFC A17). Every interval one `Check` verifies the
    /// connection (any answer will do). Returns when the connection has ended (the caller
    /// subscribes again on a new one, as gRPC restarts health checking with each connection),
    /// or after a verification found no answer within the timeout (published as evidence,
    /// and waited out by the backoff).
    async fn hold_without_watch(&self, entry: &Entry) {
        let interval = self.config.interval;
        if interval.is_zero() {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(interval).await;
            let Some(conn) = lock(&entry.channel).clone() else {
                return;
            };
            let request = tonic::Request::new(HealthCheckRequest {
                service: entry.service.to_string(),
            });
            let result = {
                let _permit = self.probes.acquire().await.expect("never closed");
                probe::check_on(conn.channel, &entry.name, request, self.config.timeout).await
            };
            match result {
                // Still no health service: the connection is alive.
                Err(e) if e.code() == Some(Code::Unimplemented) => {}
                Err(e) if e.connection_ended() => {
                    self.connection_done(entry, &e);
                    return;
                }
                Err(e) if e.code() == Some(Code::DeadlineExceeded) => {
                    // The connection goes before the evidence is published.
                    self.connection_done(entry, &e);
                    let evidence = self.judge(entry, Err(e));
                    self.publish(entry, evidence, false);
                    let delay = schedule::watch_delay(
                        &self.config.watch_backoff,
                        0,
                        schedule::unit_random(),
                    );
                    tokio::time::sleep(delay).await;
                    return;
                }
                // The server answers health checks now (or fails them): watch it again, on a
                // new connection.
                _ => {
                    drop(lock(&entry.channel).take());
                    return;
                }
            }
        }
    }

    /// The target's probe connection is done (its stream or a check on it failed, or the
    /// server closed it): drop it, and if the server's `GOAWAY` said `too_many_pings`, slow
    /// the target's pings down (gRFC A8).
    fn connection_done(&self, entry: &Entry, error: &ProbeError) {
        let conn = lock(&entry.channel).take();
        let goaway = conn.as_ref().and_then(ProbeConn::take_goaway);
        if let Some(goaway) = &goaway {
            tracing::debug!(target = %entry.name, %goaway, "health probe connection closed by the server");
        }
        if error.is_too_many_pings() || goaway.is_some_and(|g| g.is_too_many_pings()) {
            self.slow_pings(entry);
        }
    }

    /// After a check that passed on a kept channel: tonic may have reconnected it silently
    /// after the server closed the old connection. If the server did so for too many pings,
    /// slow the pings down (gRFC A8) and let the next probe connect anew with them.
    fn after_check(&self, entry: &Entry) {
        let goaway = lock(&entry.channel)
            .as_ref()
            .and_then(ProbeConn::take_goaway);
        if let Some(goaway) = goaway {
            tracing::debug!(target = %entry.name, %goaway, "health probe connection closed by the server");
            if goaway.is_too_many_pings() {
                self.slow_pings(entry);
                drop(lock(&entry.channel).take());
            }
        }
    }

    /// gRFC A8: the server closed a probe connection with `too_many_pings`. Double the
    /// target's keepalive for its new connections (from 5 minutes, what servers accept by
    /// default, when the refused value is the template's own and cannot be read back).
    fn slow_pings(&self, entry: &Entry) {
        let mut keepalive = lock(&entry.keepalive);
        let next = match *keepalive {
            Some(interval) => interval.saturating_mul(2),
            None => SERVER_PING_FLOOR,
        };
        *keepalive = Some(next);
        tracing::warn!(
            target = %entry.name,
            keepalive = ?next,
            "health probe connection closed by the server: GOAWAY too_many_pings; its new \
             connections ping at most every {} (gRFC A8)",
            probe::Secs(next)
        );
    }

    /// Connects a new probe channel for `entry`: its endpoint, with the checker's keepalive
    /// when it sets one.
    async fn connect(&self, entry: &Entry, deadline: Instant) -> Result<ProbeConn, ProbeError> {
        let mut endpoint = entry
            .endpoint
            .clone()
            .expect("gRPC probe modes always resolve an endpoint");
        if let Some(interval) = *lock(&entry.keepalive) {
            endpoint = endpoint.http2_keep_alive_interval(interval);
        }
        let endpoint = &endpoint;
        let limit = self.config.timeout;
        match &self.config.connector {
            None => {
                probe::connect_until(&entry.name, endpoint, deadline, limit, &entry.connections)
                    .await
            }
            Some(connector) => {
                match tokio::time::timeout_at(deadline, connector(endpoint.clone())).await {
                    Ok(Ok(channel)) => Ok(ProbeConn {
                        channel,
                        frames: None,
                    }),
                    Ok(Err(e)) => Err(ProbeError::new(
                        entry.name.clone(),
                        ProbeFailure::Connect {
                            timed_out: None,
                            source: Some(e),
                        },
                    )),
                    Err(_) => Err(ProbeError::new(
                        entry.name.clone(),
                        ProbeFailure::Connect {
                            timed_out: Some(limit),
                            source: None,
                        },
                    )),
                }
            }
        }
    }

    /// One probe of the target by the configured mode (`Watch` mode: one `Check`).
    async fn probe(&self, entry: &Entry) -> Result<(), ProbeError> {
        let limit = self.config.timeout;
        match &self.config.mode {
            ProbeMode::Check | ProbeMode::Watch => self.grpc_check(entry, limit).await,
            #[cfg(feature = "http-probe")]
            ProbeMode::Http(http) => {
                let endpoint = entry
                    .endpoint
                    .as_ref()
                    .expect("HTTP mode resolves endpoints");
                http.probe(&entry.name, endpoint.uri(), limit).await
            }
            ProbeMode::Custom(custom) => probe::run_custom(custom, &entry.name, limit).await,
        }
    }

    /// One `Check` on the target's kept channel (connecting one if there is none). When the
    /// kept connection turns out to be gone — the server closed it (max connection age or
    /// idleness, a restart), which says nothing against the target — the check is made once
    /// more on a new connection, within the same time limit.
    async fn grpc_check(&self, entry: &Entry, limit: Duration) -> Result<(), ProbeError> {
        let deadline = Instant::now().checked_add(limit).unwrap_or_else(far_future);
        if matches!(self.config.mode, ProbeMode::Watch) {
            // The target's connection belongs to its Watch stream: a check of its own (from
            // `check_now` or `add_target_checked`) connects, checks and lets go.
            let conn = self.connect(entry, deadline).await?;
            return self.check_on(entry, conn.channel, deadline).await;
        }
        let kept = lock(&entry.channel).clone();
        let conn = match kept {
            Some(conn) => match self.check_on(entry, conn.channel, deadline).await {
                Ok(()) => {
                    self.after_check(entry);
                    return Ok(());
                }
                Err(e) if e.connection_ended() => {
                    tracing::debug!(target = %entry.name, error = %e.reason(), "health probe connection ended; checking on a new one");
                    self.connection_done(entry, &e);
                    self.connect(entry, deadline).await?
                }
                other => return other,
            },
            None => self.connect(entry, deadline).await?,
        };
        let channel = conn.channel.clone();
        lock(&entry.channel).get_or_insert(conn);
        let result = self.check_on(entry, channel, deadline).await;
        self.after_check(entry);
        result
    }

    async fn check_on(
        &self,
        entry: &Entry,
        channel: Channel,
        deadline: Instant,
    ) -> Result<(), ProbeError> {
        let remaining = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let request = tonic::Request::new(HealthCheckRequest {
            service: entry.service.to_string(),
        });
        match probe::check_on(channel, &entry.name, request, remaining).await? {
            ServingStatus::Serving => Ok(()),
            status => Err(ProbeError::new(
                entry.name.clone(),
                ProbeFailure::NotServing {
                    service: entry.service.clone(),
                    status,
                },
            )),
        }
    }

    async fn probe_and_publish(&self, entry: &Entry) {
        let _turn = entry.probing.lock().await;
        let result = {
            let _permit = self.probes.acquire().await.expect("never closed");
            self.probe(entry).await
        };
        let evidence = self.judge(entry, result);
        self.publish(entry, evidence, true);
    }

    fn unimplemented_passes(&self, error: &ProbeError) -> bool {
        self.config.unimplemented_is_healthy
            && matches!(error.failure(), ProbeFailure::Rpc { status, .. } if status.code() == Code::Unimplemented)
    }

    fn judge(&self, entry: &Entry, result: Result<(), ProbeError>) -> Evidence {
        match result {
            Ok(()) => Evidence::Healthy { note: None },
            Err(e) if self.unimplemented_passes(&e) => {
                if !entry.unimplemented_logged.swap(true, Ordering::AcqRel) {
                    tracing::warn!(
                        target = %entry.name,
                        service = %entry.service,
                        "the server has no grpc.health.v1 health service (UNIMPLEMENTED): \
                         counted as healthy, as gRPC's client health checking does (gRFC A17); \
                         unimplemented_is_healthy(false) requires the service"
                    );
                }
                Evidence::Healthy {
                    note: Some("UNIMPLEMENTED: no health service; counted as healthy".into()),
                }
            }
            Err(e) => Evidence::Unhealthy {
                reason: e.reason().into(),
            },
        }
    }

    /// Publishes a probe's evidence: status record, next check, card, transition (stream and
    /// callbacks). A failed probe's channel is dropped first, so nothing that reacts to the
    /// result can reuse the broken connection.
    fn publish(&self, entry: &Entry, evidence: Evidence, drop_channel_on_failure: bool) {
        if drop_channel_on_failure && matches!(evidence, Evidence::Unhealthy { .. }) {
            drop(lock(&entry.channel).take());
        }
        let transition = {
            let mut st = lock(&entry.state);
            if entry.removed.load(Ordering::Acquire) || self.is_stopped() {
                return;
            }
            st.last_check = Some(SystemTime::now());
            let (verdict, reason) = match evidence {
                Evidence::Healthy { note } => {
                    st.failures = 0;
                    st.last_error = None;
                    (HealthVerdict::Healthy, note)
                }
                Evidence::Unhealthy { reason } => {
                    st.failures = st.failures.saturating_add(1);
                    st.last_error = Some(reason.clone());
                    (HealthVerdict::Unhealthy, Some(reason))
                }
            };
            st.next_check = self.next_check(st.failures);
            let from = std::mem::replace(&mut st.verdict, verdict);
            entry.card.set_health(verdict, reason.clone());
            if from == HealthVerdict::Unknown {
                self.progress.notify_waiters();
            }
            let transition = (from != verdict).then(|| Transition {
                target: entry.name.clone(),
                from,
                to: verdict,
                reason,
                at: SystemTime::now(),
            });
            if let Some(t) = &transition
                && let Some(tx) = &*lock(&self.events)
            {
                // No receiver is fine; a full receiver loses its oldest item, never us.
                let _ = tx.send(t.clone());
            }
            transition
        };
        entry.reschedule.notify_waiters();
        if let Some(t) = transition {
            match t.to {
                HealthVerdict::Healthy => {
                    tracing::info!(target = %t.target, from = %t.from, "target healthy")
                }
                _ => tracing::info!(
                    target = %t.target,
                    from = %t.from,
                    reason = t.reason.as_deref().unwrap_or(""),
                    "target unhealthy"
                ),
            }
            self.run_callbacks(&t);
        }
    }

    fn next_check(&self, failures: u32) -> Option<Instant> {
        let interval = self.config.interval;
        if interval.is_zero() || matches!(self.config.mode, ProbeMode::Watch) {
            return None;
        }
        let jitter = self.config.jitter;
        let unit = if jitter == 0.0 {
            0.5
        } else {
            schedule::unit_random()
        };
        Some(
            Instant::now()
                + schedule::check_delay(interval, self.config.max_backoff, failures, jitter, unit),
        )
    }

    fn run_callbacks(&self, t: &Transition) {
        let callbacks = lock(&self.callbacks).clone();
        for callback in callbacks {
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| callback(t))) {
                let message = panic_message(&*payload);
                tracing::error!(target = %t.target, panic = %message, "health transition callback panicked");
                if self.config.fail_fast_callbacks {
                    lock(&self.panic).get_or_insert(payload);
                }
            }
        }
    }
}

/// What gRPC servers accept by default: one ping without data every 5 minutes (C-core,
/// grpc-go, grpc-java). A8's doubling starts here when the refused keepalive was the
/// template's own.
const SERVER_PING_FLOOR: Duration = Duration::from_secs(5 * 60);

/// How a `Watch` subscription ended.
enum WatchEnd {
    /// The stream had answered, then ended, or its connection did: the server closed it. No
    /// evidence against the target.
    Closed(ProbeError),
    /// The subscription failed before any answer: evidence.
    Failed(ProbeError),
    /// A silent stream's connection did not answer a `Check` within the timeout: evidence.
    Silent(ProbeError),
}

impl WatchEnd {
    fn error(&self) -> &ProbeError {
        match self {
            WatchEnd::Closed(e) | WatchEnd::Failed(e) | WatchEnd::Silent(e) => e,
        }
    }
}

type ProbeFuture<'a, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, ProbeError>> + Send + 'a>>;

/// When a stream that is silent from now on gets its connection verified (never, with
/// interval 0).
fn quiet_until(interval: Duration) -> Instant {
    if interval.is_zero() {
        return far_future();
    }
    Instant::now()
        .checked_add(interval)
        .unwrap_or_else(far_future)
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

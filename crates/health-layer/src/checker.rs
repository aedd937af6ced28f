//! The active health checker: targets, their schedules, probes, verdicts and transitions.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
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
use crate::probe::{self, ProbeError, ProbeFailure, ServingStatus};
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
    /// The probe channel, kept between passing probes.
    channel: Mutex<Option<Channel>>,
    /// Woken whenever the target's next check instant changes.
    reschedule: Notify,
    task: Mutex<Option<JoinHandle<()>>>,
    removed: AtomicBool,
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
            other => shared.judge(other),
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
        let endpoint = match (&self.config.mode, endpoint) {
            (ProbeMode::Watch, Some(e)) => Some(
                e.http2_keep_alive_interval(WATCH_KEEPALIVE)
                    .keep_alive_timeout(self.config.timeout),
            ),
            (_, e) => e,
        };
        let first_check = (!self.config.interval.is_zero()
            && !matches!(self.config.mode, ProbeMode::Watch))
        .then(Instant::now);
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

    /// A target's life in `Watch` mode: subscribe, publish every message, and when the stream
    /// breaks mark the target unhealthy and re-subscribe after the backoff.
    async fn watch_loop(self: Arc<Self>, entry: Arc<Entry>) {
        let mut attempt: u32 = 0;
        loop {
            let error = self.watch_stream(&entry, &mut attempt).await;
            tracing::debug!(target = %entry.name, error = %error.reason(), attempt, "health watch stream ended");
            // The health protocol says a client should not retry a `Watch` that is
            // UNIMPLEMENTED; we retry only at the longest backoff, so that a server that gains
            // the health service is watched again eventually.
            let unimplemented = error.code() == Some(Code::Unimplemented);
            let evidence = self.judge(Err(error));
            self.publish(&entry, evidence, true);
            let delay = if unimplemented {
                self.config.watch_backoff.max
            } else {
                schedule::watch_delay(&self.config.watch_backoff, attempt, schedule::unit_random())
            };
            attempt = attempt.saturating_add(1);
            tokio::time::sleep(delay).await;
        }
    }

    /// One `Watch` subscription, until it breaks. Returns why it broke.
    async fn watch_stream(&self, entry: &Entry, attempt: &mut u32) -> ProbeError {
        let permit = self.probes.acquire().await.expect("never closed");
        let limit = self.config.timeout;
        let deadline = Instant::now() + limit;
        let channel = match self.connect(entry, deadline).await {
            Ok(c) => c,
            Err(e) => return e,
        };
        *lock(&entry.channel) = Some(channel.clone());
        let mut stream =
            match probe::watch_on(channel, &entry.name, &entry.service, deadline, limit).await {
                Ok(s) => s,
                Err(e) => return e,
            };
        let mut permit = Some(permit);
        loop {
            let next = if permit.is_some() {
                // The set-up (connect, headers, first message) is bounded by the timeout.
                match tokio::time::timeout_at(deadline, stream.message()).await {
                    Ok(next) => next,
                    Err(_) => {
                        return ProbeError::new(
                            entry.name.clone(),
                            ProbeFailure::Rpc {
                                service: entry.service.clone(),
                                status: tonic::Status::deadline_exceeded(format!(
                                    "no Watch message within {}",
                                    probe::Secs(limit)
                                )),
                            },
                        );
                    }
                }
            } else {
                stream.message().await
            };
            permit = None;
            match next {
                Ok(Some(response)) => {
                    *attempt = 0;
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
                    return ProbeError::new(
                        entry.name.clone(),
                        ProbeFailure::Rpc {
                            service: entry.service.clone(),
                            status: tonic::Status::unavailable("the server ended the Watch stream"),
                        },
                    );
                }
                Err(status) => {
                    return ProbeError::new(
                        entry.name.clone(),
                        ProbeFailure::Rpc {
                            service: entry.service.clone(),
                            status: probe::transport_is_unavailable(status),
                        },
                    );
                }
            }
        }
    }

    async fn connect(&self, entry: &Entry, deadline: Instant) -> Result<Channel, ProbeError> {
        let endpoint = entry
            .endpoint
            .as_ref()
            .expect("gRPC probe modes always resolve an endpoint");
        let limit = self.config.timeout;
        match &self.config.connector {
            None => probe::connect_until(&entry.name, endpoint, deadline, limit).await,
            Some(connector) => {
                match tokio::time::timeout_at(deadline, connector(endpoint.clone())).await {
                    Ok(Ok(channel)) => Ok(channel),
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

    async fn grpc_check(&self, entry: &Entry, limit: Duration) -> Result<(), ProbeError> {
        let deadline = Instant::now() + limit;
        let existing = lock(&entry.channel).clone();
        let channel = match existing {
            Some(channel) => channel,
            None => {
                let channel = self.connect(entry, deadline).await?;
                lock(&entry.channel).get_or_insert_with(|| channel.clone());
                channel
            }
        };
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
        let result = {
            let _permit = self.probes.acquire().await.expect("never closed");
            self.probe(entry).await
        };
        let evidence = self.judge(result);
        self.publish(entry, evidence, true);
    }

    fn unimplemented_passes(&self, error: &ProbeError) -> bool {
        self.config.unimplemented_is_healthy
            && matches!(error.failure(), ProbeFailure::Rpc { status, .. } if status.code() == Code::Unimplemented)
    }

    fn judge(&self, result: Result<(), ProbeError>) -> Evidence {
        match result {
            Ok(()) => Evidence::Healthy { note: None },
            Err(e) if self.unimplemented_passes(&e) => Evidence::Healthy {
                note: Some("UNIMPLEMENTED: no health service; counted as healthy".into()),
            },
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

/// How often a `Watch` connection is pinged (HTTP/2 keep-alive) so that a dead peer is found
/// within one ping plus the probe timeout rather than never.
const WATCH_KEEPALIVE: Duration = Duration::from_secs(10);

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

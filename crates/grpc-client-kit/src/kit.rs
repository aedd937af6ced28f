//! The kit: its targets, its tasks, its lifetime.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use balance_layer::Balance;
use breaker_layer::BreakerHandle;
use endpoint_state::EndpointCard;
use health_layer::{HealthChecker, Target};
use quarantine_layer::QuarantineGroup;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::Endpoint;
use tower::discover::Change;

use crate::builder::KitBuilder;
use crate::error::InvalidConfig;
use crate::service::KitChannel;
use crate::stack::{KitDiscover, Request, StackFactory, TargetChange};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

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

    fn shut_down(&self) -> bool {
        self.flags.fetch_or(SHUT_DOWN, Ordering::AcqRel) & SHUT_DOWN == 0
    }
}

/// One target the kit holds.
#[derive(Debug)]
pub(crate) struct TargetEntry {
    pub(crate) card: EndpointCard,
    pub(crate) breaker: BreakerHandle,
    /// Observes the target's card for metrics; aborted with the target.
    #[cfg(feature = "metrics")]
    pub(crate) observer: Option<JoinHandle<()>>,
}

impl Drop for TargetEntry {
    fn drop(&mut self) {
        #[cfg(feature = "metrics")]
        if let Some(observer) = self.observer.take() {
            observer.abort();
        }
    }
}

/// The targets and what adds and removes them (shared by the kit and its DNS task).
pub(crate) struct Registry {
    pub(crate) factory: StackFactory,
    pub(crate) checker: Option<HealthChecker>,
    changes: mpsc::Sender<TargetChange>,
    targets: Mutex<BTreeMap<Arc<str>, TargetEntry>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("targets", &lock(&self.targets).keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Registry {
    pub(crate) fn new(
        factory: StackFactory,
        checker: Option<HealthChecker>,
        changes: mpsc::Sender<TargetChange>,
    ) -> Self {
        Registry {
            factory,
            checker,
            changes,
            targets: Mutex::default(),
        }
    }

    /// Builds a target's card and stack and records it; returns the change that inserts it
    /// and the health checker's target (not yet added to the checker).
    pub(crate) fn prepare(
        &self,
        name: Arc<str>,
        endpoint: &Endpoint,
    ) -> Result<(TargetChange, Target), InvalidConfig> {
        let card = EndpointCard::new(name.clone());
        let (stack, breaker) = self.factory.make(&name, endpoint, &card)?;
        let target = Target::new(name.clone())
            .endpoint(endpoint.clone())
            .card(card.clone());
        #[cfg(feature = "metrics")]
        let observer = Some(self.factory.metrics.observe(&name, &card, &breaker));
        let entry = TargetEntry {
            card,
            breaker,
            #[cfg(feature = "metrics")]
            observer,
        };
        lock(&self.targets).insert(name.clone(), entry);
        Ok((Change::Insert(name, stack), target))
    }

    /// Adds a target while running: its probes start and the balancer gets its stack.
    #[cfg_attr(not(feature = "dns"), allow(dead_code))]
    pub(crate) async fn add(&self, name: Arc<str>, endpoint: &Endpoint) {
        if self.contains(&name) {
            return;
        }
        let (insert, target) = match self.prepare(name.clone(), endpoint) {
            Ok(prepared) => prepared,
            Err(error) => {
                tracing::warn!(target = %name, %error, "grpc-client-kit: cannot add target");
                return;
            }
        };
        if let Some(checker) = &self.checker
            && let Err(error) = checker.add_target(target)
        {
            tracing::warn!(target = %name, %error, "grpc-client-kit: target cannot be health-checked");
        }
        tracing::info!(target = %name, "grpc-client-kit: target added");
        let _ = self.changes.send(insert).await;
    }

    /// Removes a target: the balancer stops picking it (calls in flight finish), its probes
    /// stop and its connections close.
    pub(crate) async fn remove(&self, name: &Arc<str>) {
        let Some(entry) = lock(&self.targets).remove(name) else {
            return;
        };
        let _ = self.changes.send(Change::Remove(name.clone())).await;
        if let Some(checker) = &self.checker {
            checker.remove_target(name);
        }
        self.factory.group.remove(name);
        drop(entry);
        tracing::info!(target = %name, "grpc-client-kit: target removed");
    }

    #[cfg_attr(not(feature = "dns"), allow(dead_code))]
    pub(crate) fn contains(&self, name: &str) -> bool {
        lock(&self.targets).contains_key(name)
    }

    pub(crate) fn names(&self) -> Vec<Arc<str>> {
        lock(&self.targets).keys().cloned().collect()
    }

    fn card(&self, name: &str) -> Option<EndpointCard> {
        lock(&self.targets).get(name).map(|e| e.card.clone())
    }

    fn breaker(&self, name: &str) -> Option<BreakerHandle> {
        lock(&self.targets).get(name).map(|e| e.breaker.clone())
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

/// A running kit: targets, health checker, quarantine, breakers and the balancer over them,
/// with one [`KitChannel`] that a generated client takes like a tonic `Channel`.
///
/// Build it with [`Kit::builder`] or from a [`KitConfig`](crate::KitConfig). Cheap to clone; the
/// kit runs until [`shutdown`](Self::shutdown), or until its last handle is dropped — every
/// clone of the kit **and of its channels** is a handle, so a client that holds a channel keeps
/// the kit's health checking alive.
#[derive(Clone)]
pub struct Kit {
    pub(crate) life: Arc<Life>,
}

impl fmt::Debug for Kit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kit")
            .field("targets", &self.targets())
            .field("eligible", &self.eligible_targets())
            .field("dns", &self.life.dns_name)
            .field("shut_down", &self.life.state.is_shut_down())
            .finish()
    }
}

impl Kit {
    /// A builder with the defaults: health `Check` every 30 s, quarantine 5 s, breaker after 5
    /// consecutive failures, round-robin.
    pub fn builder() -> KitBuilder {
        KitBuilder::new()
    }

    /// The channel to hand to a generated client (`GreeterClient::new(kit.channel())`). Cheap
    /// to clone; every clone shares the balancer (there is no worker task on the request
    /// path).
    pub fn channel(&self) -> KitChannel {
        KitChannel::new(self.life.clone())
    }

    /// Waits until every target has a health verdict (after the first successful DNS
    /// resolution, for a DNS target) and the balancer picks from every target found eligible:
    /// `true` then; `false` when `timeout` passes first (a DNS name that does not resolve, a
    /// target whose first probe has not answered) or the kit is shut down. Without health
    /// checking, `true` as soon as the targets are known.
    pub async fn wait_until_ready(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        if let Some(resolved) = &self.life.resolved {
            let mut resolved = resolved.clone();
            let first = tokio::time::timeout_at(deadline, resolved.wait_for(|done| *done)).await;
            if !matches!(first, Ok(Ok(_))) {
                return false;
            }
        }
        if self.life.state.is_shut_down() {
            return false;
        }
        if let Some(checker) = &self.life.registry.checker
            && !checker
                .wait_until_ready(deadline.saturating_duration_since(Instant::now()))
                .await
        {
            return false;
        }
        // The balancer's task applies changes a moment later: wait until it picks from every
        // target the cards admit, woken by each change it takes in (subscribed before looking,
        // so none is missed).
        loop {
            let changed = self.life.balance.changed();
            if self.balancer_caught_up() {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.balancer_caught_up();
            }
        }
    }

    fn balancer_caught_up(&self) -> bool {
        let names = self.life.registry.names();
        let known = self.life.balance.targets();
        if !names.iter().all(|n| known.contains(n)) {
            return false;
        }
        let eligible: Vec<Arc<str>> = names
            .into_iter()
            .filter(|n| self.card(n).is_some_and(|c| c.is_eligible()))
            .collect();
        if eligible.is_empty() {
            return true;
        }
        let picked = self.life.balance.eligible_targets();
        picked.len() == eligible.len() && eligible.iter().all(|n| picked.contains(n))
    }

    /// Stops the kit: DNS re-resolution ends, every target is removed (its connections close
    /// once no call uses them) and the health checker stops, all by the time this returns.
    /// Calls made afterwards fail with [`KitShutDown`](crate::error::KitShutDown)
    /// (`UNAVAILABLE`). Calling it again does nothing.
    pub async fn shutdown(&self) {
        let life = &self.life;
        if !life.state.shut_down() {
            return;
        }
        let tasks: Vec<_> = lock(&life.tasks).drain(..).collect();
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
        for name in life.registry.names() {
            life.registry.remove(&name).await;
        }
        if let Some(checker) = &life.registry.checker {
            checker.stop().await;
        }
        tracing::info!("grpc-client-kit shut down");
    }

    /// The targets the kit holds now, by name.
    pub fn targets(&self) -> Vec<Arc<str>> {
        self.life.registry.names()
    }

    /// The targets the balancer picks from now (eligible ones; or, when every otherwise
    /// eligible one is quarantined, those).
    pub fn eligible_targets(&self) -> Vec<Arc<str>> {
        self.life.balance.eligible_targets()
    }

    /// A target's state card (health, quarantine and breaker lines, with reasons).
    pub fn card(&self, target: &str) -> Option<EndpointCard> {
        self.life.registry.card(target)
    }

    /// A target's breaker: force it open, disable it, reset it, watch its transitions.
    pub fn breaker(&self, target: &str) -> Option<BreakerHandle> {
        self.life.registry.breaker(target)
    }

    /// The health checker (`None` when health checking is off).
    pub fn checker(&self) -> Option<&HealthChecker> {
        self.life.registry.checker.as_ref()
    }

    /// The quarantine group of the targets (`report_failure`, `lift`, `strikes`).
    pub fn quarantine(&self) -> &QuarantineGroup {
        &self.life.registry.factory.group
    }
}

//! The kit: the handle a user holds.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use breaker_layer::BreakerHandle;
use endpoint_state::EndpointCard;
use endpoint_state::sync::lock;
use endpoint_state::time;
use health_layer::HealthChecker;
use quarantine_layer::QuarantineGroup;
use tokio::time::Instant;

use crate::life::Life;
use crate::service::KitChannel;

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
    /// checking, `true` as soon as the targets are known. Any timeout is taken, `Duration::MAX`
    /// included (it waits as long as it takes).
    pub async fn wait_until_ready(&self, timeout: Duration) -> bool {
        // A timeout too long to represent (`Duration::MAX`) waits without end in practice.
        let deadline = time::after(timeout);
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
        tracing::info!("kit shut down");
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

    /// A target's state card (health, quarantine and breaker lines, with reasons). `target` is
    /// named as in the configuration (`10.0.0.7:50051` is `http://10.0.0.7:50051`; scheme and
    /// host in any case).
    pub fn card(&self, target: &str) -> Option<EndpointCard> {
        self.life.registry.card(&crate::builder::normalize(target))
    }

    /// A target's breaker: force it open, disable it, reset it, watch its transitions.
    /// `target` is named as for [`card`](Self::card).
    pub fn breaker(&self, target: &str) -> Option<BreakerHandle> {
        self.life
            .registry
            .breaker(&crate::builder::normalize(target))
    }

    /// The health checker (`None` when health checking is off).
    pub fn checker(&self) -> Option<&HealthChecker> {
        self.life.registry.checker.as_ref()
    }

    /// The quarantine group of the targets (`report_failure`, `lift`, `strikes`).
    pub fn quarantine(&self) -> &QuarantineGroup {
        &self.life.registry.factory.group
    }

    /// The service config the kit was built with ([`KitBuilder::service_config`]), parsed:
    /// its retry and hedging policies and retry throttling, which the kit does not apply yet,
    /// are read from here.
    ///
    /// [`KitBuilder::service_config`]: crate::KitBuilder::service_config
    pub fn service_config(&self) -> Option<&crate::service_config::ServiceConfig> {
        self.life.service_config.as_deref()
    }
}

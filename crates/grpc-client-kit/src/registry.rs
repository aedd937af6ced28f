//! The kit's targets: each one's card, stack and breaker handle, and what adds and removes them
//! (the kit itself, and its DNS task).

use endpoint_state::ConfigError;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use breaker_layer::BreakerHandle;
use endpoint_state::EndpointCard;
use endpoint_state::sync::lock;
use health_layer::{HealthChecker, Target};
use tokio::sync::mpsc;
use tonic::transport::Endpoint;
use tower::discover::Change;

use crate::stack::{StackFactory, TargetChange};

/// One target the kit holds.
#[derive(Debug)]
pub(crate) struct TargetEntry {
    pub(crate) card: EndpointCard,
    pub(crate) breaker: BreakerHandle,
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
    ) -> Result<(TargetChange, Target), ConfigError> {
        let card = EndpointCard::new(name.clone());
        let (stack, breaker) = self.factory.make(&name, endpoint, &card)?;
        let target = Target::new(name.clone())
            .endpoint(endpoint.clone())
            .card(card.clone());
        let entry = TargetEntry { card, breaker };
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

    pub(crate) fn card(&self, name: &str) -> Option<EndpointCard> {
        lock(&self.targets).get(name).map(|e| e.card.clone())
    }

    pub(crate) fn breaker(&self, name: &str) -> Option<BreakerHandle> {
        lock(&self.targets).get(name).map(|e| e.breaker.clone())
    }
}

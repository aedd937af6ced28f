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

use crate::builder::{normalize, resolve_address};
use crate::error::InvalidConfig;
use crate::kit::Kit;
use crate::stack::{StackFactory, TargetChange};
use crate::template::EndpointTemplate;

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
    /// How an address the user adds becomes its endpoint.
    template: EndpointTemplate,
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
        template: EndpointTemplate,
        changes: mpsc::Sender<TargetChange>,
    ) -> Self {
        Registry {
            factory,
            checker,
            template,
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
    /// Whether it was added (`false`: it was there already, or it cannot be built, which is
    /// logged).
    pub(crate) async fn add(&self, name: Arc<str>, endpoint: &Endpoint) -> bool {
        if self.contains(&name) {
            return false;
        }
        let (insert, target) = match self.prepare(name.clone(), endpoint) {
            Ok(prepared) => prepared,
            Err(error) => {
                tracing::warn!(backend = %name, %error, "cannot add target");
                return false;
            }
        };
        if let Some(checker) = &self.checker
            && let Err(error) = checker.add_target(target)
        {
            tracing::warn!(backend = %name, %error, "target cannot be health-checked");
        }
        tracing::info!(backend = %name, "target added");
        let _ = self.changes.send(insert).await;
        true
    }

    /// Removes a target: the balancer stops picking it (calls in flight finish), its probes
    /// stop and its connections close. Whether it was there.
    pub(crate) async fn remove(&self, name: &Arc<str>) -> bool {
        let Some(entry) = lock(&self.targets).remove(name) else {
            return false;
        };
        let _ = self.changes.send(Change::Remove(name.clone())).await;
        if let Some(checker) = &self.checker {
            checker.remove_target(name);
        }
        self.factory.group.remove(name);
        self.factory.observe.forget(name);
        drop(entry);
        tracing::info!(backend = %name, "target removed");
        true
    }

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

impl Kit {
    /// Adds a target to a kit of static targets while it runs, as the builder's
    /// [`targets`](crate::KitBuilder::targets) would have: the address is checked and named
    /// the same way (scheme and host lowercased; user info refused), its endpoint comes from
    /// the kit's template, its first probe runs at once and the balancer picks it once it is
    /// eligible. `Ok(false)` when it is there already or the kit is shut down.
    ///
    /// A kit whose target is a `dns:` name takes its targets from the answers: adding one by
    /// hand is refused (field `target`).
    pub async fn add_target(&self, target: &str) -> Result<bool, InvalidConfig> {
        let life = &self.life;
        if let Some(dns) = &life.dns_name {
            return Err(ConfigError::problem(
                crate::error::CONFIG,
                "target",
                format!("{dns:?}"),
                "the targets of a kit on a `dns:` name follow its answers: they are not added \
                 or removed by hand",
            ));
        }
        let registry = &life.registry;
        let (name, endpoint) = resolve_address(&registry.template, "target", target)?;
        if life.state.is_shut_down() {
            return Ok(false);
        }
        Ok(registry.add(name, &endpoint).await)
    }

    /// Removes a target while the kit runs (named as written to
    /// [`add_target`](Self::add_target) or the builder): the balancer stops picking it at
    /// once (calls in flight finish), its probes stop and its connections close. Whether it
    /// was there. Every membership structure the kit keeps per target — the registry, the
    /// balancer's, quarantine's and the health checker's — takes a removal in O(1) or
    /// O(log n), so removing half of 10,000 targets is not a quadratic walk.
    ///
    /// A kit on a `dns:` name removes nothing by hand (`false`).
    pub async fn remove_target(&self, target: &str) -> bool {
        if self.life.dns_name.is_some() {
            return false;
        }
        let name: Arc<str> = Arc::from(normalize(target));
        self.life.registry.remove(&name).await
    }
}

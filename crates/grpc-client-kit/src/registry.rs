//! The kit's targets: each one's card, stack and breaker handle, and the one way in and out of
//! the set — [`Registry::prepare`] (the builder's targets) and [`Registry::add`] /
//! [`Registry::remove`] (while running: `Kit::add_target`, the DNS task, a discovery source).

use endpoint_state::ConfigError;
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use breaker_layer::BreakerHandle;
use endpoint_state::EndpointCard;
use endpoint_state::sync::lock;
use health_layer::{HealthChecker, Target};
use tokio::sync::mpsc;
use tonic::transport::Endpoint;
use tower::discover::Change;

use crate::builder::{normalize, resolve_target};
use crate::connect::{BoxConnector, redirected};
use crate::error::InvalidConfig;
use crate::kit::Kit;
use crate::stack::{StackFactory, TargetChange};
use crate::target::{Target as KitTarget, TargetOptions};
use crate::template::EndpointTemplate;

/// A target about to enter the kit, resolved: its name, endpoint and transport, options.
pub(crate) struct NewTarget {
    pub(crate) name: Arc<str>,
    pub(crate) endpoint: Endpoint,
    /// The template's connector, if it has one.
    pub(crate) connector: Option<BoxConnector>,
    /// Where connections go instead of the endpoint's host (a `dns:` name's address).
    pub(crate) address: Option<SocketAddr>,
    pub(crate) options: TargetOptions,
}

impl NewTarget {
    /// The health checker's view of it: the same endpoint, transport and card; its own
    /// service name when it has one.
    fn probe_target(&self, card: &EndpointCard) -> Target {
        let mut target = Target::new(self.name.clone())
            .endpoint(self.endpoint.clone())
            .card(card.clone());
        if let Some(service) = self.options.health_service_name() {
            target = target.service(service.clone());
        }
        match (&self.connector, self.address) {
            (Some(connector), address) => {
                let connector = redirected(connector.clone(), address);
                target.connector(move |endpoint: Endpoint| {
                    let connector = connector.clone();
                    async move {
                        endpoint
                            .connect_with_connector(connector)
                            .await
                            .map_err(Into::into)
                    }
                })
            }
            (None, Some(address)) => target.address(address),
            (None, None) => target,
        }
    }
}

/// One target the kit holds.
#[derive(Debug)]
pub(crate) struct TargetEntry {
    pub(crate) card: EndpointCard,
    pub(crate) breaker: BreakerHandle,
    /// Its options as given (a discovery source that inserts it again with others replaces it).
    pub(crate) options: TargetOptions,
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

    /// How an address becomes its endpoint.
    pub(crate) fn template(&self) -> &EndpointTemplate {
        &self.template
    }

    /// Builds a target's card and stack and records it; returns the change that inserts it
    /// and the health checker's target (not yet added to the checker).
    pub(crate) fn prepare(&self, new: &NewTarget) -> Result<(TargetChange, Target), ConfigError> {
        let name = new.name.clone();
        let card = EndpointCard::new(name.clone());
        let (stack, breaker) = self.factory.make(new, &card)?;
        let target = new.probe_target(&card);
        let entry = TargetEntry {
            card,
            breaker,
            options: new.options.clone(),
        };
        lock(&self.targets).insert(name.clone(), entry);
        Ok((Change::Insert(name, stack), target))
    }

    /// The options a target was added with, if it is there.
    pub(crate) fn options(&self, name: &str) -> Option<TargetOptions> {
        lock(&self.targets).get(name).map(|e| e.options.clone())
    }

    /// Adds a target while running: its probes start and the balancer gets its stack.
    /// Whether it was added (`false`: it was there already, or it cannot be built, which is
    /// logged).
    pub(crate) async fn add(&self, new: NewTarget) -> bool {
        let name = new.name.clone();
        if self.contains(&name) {
            return false;
        }
        let (insert, target) = match self.prepare(&new) {
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
    /// Takes an address (`"http://10.0.0.9:50051"`) or a [`Target`](crate::Target) with its
    /// own options (its health service name).
    ///
    /// A kit whose targets come from a `dns:` name or a [discovery
    /// source](crate::KitBuilder::discover) follows that source: adding one by hand is refused
    /// (field `target`, or `discover`).
    ///
    /// ```
    /// use grpc_client_kit::{Kit, Target};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let kit = Kit::builder().target("http://127.0.0.1:50051").without_health().build()?;
    /// assert!(kit.add_target("127.0.0.1:50052").await?);
    /// assert!(kit.add_target(Target::new("http://127.0.0.1:50053").health_service("b.v1.B")).await?);
    /// // The same target again: nothing to add.
    /// assert!(!kit.add_target("HTTP://127.0.0.1:50052").await?);
    /// // A bad address is refused, naming it.
    /// let err = kit.add_target("http://user:pw@127.0.0.1:1").await.unwrap_err();
    /// assert_eq!(err.field(), "target");
    /// # Ok(()) }
    /// ```
    pub async fn add_target(&self, target: impl Into<KitTarget>) -> Result<bool, InvalidConfig> {
        let target = target.into();
        let life = &self.life;
        if let Some(dns) = &life.dns_name {
            return Err(ConfigError::problem(
                crate::error::CONFIG,
                "target",
                format!("{:?}", target.uri()),
                format!(
                    "the targets of a kit on the `dns:` name {dns:?} follow its answers: they \
                     are not added or removed by hand"
                ),
            ));
        }
        if life.discovered {
            return Err(ConfigError::problem(
                crate::error::CONFIG,
                "discover",
                format!("{:?}", target.uri()),
                "the targets of a kit with a discovery source follow its changes: send the \
                 target as a `Change::Insert` to the source instead",
            ));
        }
        let registry = &life.registry;
        let new = resolve_target(&registry.template, "target", &target)?;
        if life.state.is_shut_down() {
            return Ok(false);
        }
        Ok(registry.add(new).await)
    }

    /// Removes a target while the kit runs (named as written to
    /// [`add_target`](Self::add_target) or the builder): the balancer stops picking it at
    /// once (calls in flight finish), its probes stop and its connections close. Whether it
    /// was there. Every membership structure the kit keeps per target — the registry, the
    /// balancer's, quarantine's and the health checker's — takes a removal in O(1) or
    /// O(log n), so removing half of 10,000 targets is not a quadratic walk.
    ///
    /// A kit on a `dns:` name or a discovery source removes nothing by hand (`false`).
    pub async fn remove_target(&self, target: &str) -> bool {
        if self.life.dns_name.is_some() || self.life.discovered {
            return false;
        }
        let name: Arc<str> = Arc::from(normalize(target));
        self.life.registry.remove(&name).await
    }
}

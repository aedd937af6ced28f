//! A target as the user names it, what the checker says about it, and the checker's record of
//! it: its card (the one owner of its verdict and reason), its probe link, and its schedule.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use endpoint_state::BoxError;
use endpoint_state::sync::lock;
use endpoint_state::{EndpointCard, HealthVerdict};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::probe::{Connector, ProbeLink};

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
#[derive(Clone)]
pub struct Target {
    pub(super) name: Arc<str>,
    pub(super) endpoint: Option<Endpoint>,
    pub(super) card: Option<EndpointCard>,
    pub(super) service: Option<Arc<str>>,
    pub(super) connector: Option<Connector>,
    pub(super) address: Option<SocketAddr>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .field("card", &self.card)
            .field("service", &self.service)
            .field("custom_connector", &self.connector.is_some())
            .field("address", &self.address)
            .finish()
    }
}

impl Target {
    /// A target named `name`; its probe endpoint comes from the checker's endpoint template.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Target {
            name: name.into(),
            endpoint: None,
            card: None,
            service: None,
            connector: None,
            address: None,
        }
    }

    /// Probe this endpoint instead of the template's (its own channel is created from it; the
    /// endpoint itself is only a configuration). The probes then run on a tonic `Channel`, with
    /// every setting of the endpoint; a target of the default template gets the checker's own,
    /// cheaper HTTP/2 connection in `Check` mode (see the [crate docs](crate)). To name a
    /// target apart from the address it is reached at, keep its URI as its name and give the
    /// [`address`](Self::address).
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

    /// Connect this target's probe channels with this function, instead of the checker's
    /// [`connector`](crate::HealthConfig::connector) or its own TCP connector: a target
    /// reached over a Unix socket, an in-memory transport or a proxy. It is given the probe
    /// endpoint (with the checker's keepalive, when it sets one) and must return a connected
    /// channel; the probe timeout bounds it.
    ///
    /// ```
    /// use health_layer::Target;
    /// use tonic::transport::Endpoint;
    /// let target = Target::new("uds:/run/billing.sock")
    ///     .endpoint(Endpoint::from_static("http://billing.local"))
    ///     .connector(|endpoint: Endpoint| async move {
    ///         // e.g. endpoint.connect_with_connector(my_unix_connector).await
    ///         Ok(endpoint.connect_lazy())
    ///     });
    /// # let _ = target;
    /// ```
    pub fn connector<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Endpoint) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Channel, BoxError>> + Send + 'static,
    {
        self.connector = Some(Arc::new(move |endpoint| Box::pin(f(endpoint))));
        self
    }

    /// Connect this target's probe connections to `address`, instead of resolving the
    /// endpoint URI's host: the endpoint keeps naming the server (its `:authority`, and the
    /// server name TLS verifies), as gRPC does for each address a name resolves to. Plaintext
    /// connections are still read by the checker's frame watcher (see [`probe`](crate::probe)).
    /// A [`connector`](Self::connector) of the target's own, when set, is used instead.
    pub fn address(mut self, address: SocketAddr) -> Self {
        self.address = Some(address);
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

/// What the checker knows about one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetStatus {
    /// The target.
    pub target: Arc<str>,
    /// [`HealthVerdict::Unknown`] until the first probe, then `Healthy` or `Unhealthy` (the
    /// card's health line: the card is the one owner of the verdict).
    pub verdict: HealthVerdict,
    /// The last probe's error, when it failed (the health line's reason while unhealthy).
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

/// When a target is checked: the checker's only record of its own (the verdict and its reason
/// are on the card).
#[derive(Debug, Default)]
pub(super) struct Schedule {
    /// When the last probe finished (wall clock), if any.
    pub(super) last_check: Option<SystemTime>,
    /// Probes failed in a row (0 after a success).
    pub(super) failures: u32,
    /// When the next scheduled probe runs, if any.
    pub(super) next_check: Option<Instant>,
}

/// One target inside the checker.
pub(super) struct Entry {
    pub(super) name: Arc<str>,
    pub(super) card: EndpointCard,
    /// Where its probes go, and its kept gRPC connection.
    pub(super) link: ProbeLink,
    pub(super) schedule: Mutex<Schedule>,
    /// Woken whenever the target's next check instant changes.
    pub(super) reschedule: Notify,
    pub(super) task: Mutex<Option<JoinHandle<()>>>,
    pub(super) removed: AtomicBool,
    /// Whether an `UNIMPLEMENTED` counted as healthy has been logged for this target.
    pub(super) unimplemented_logged: AtomicBool,
    /// Held while a probe of the target runs: a scheduled probe and `check_now` take turns
    /// (one connection, one result at a time).
    pub(super) probing: tokio::sync::Mutex<()>,
}

impl Entry {
    /// A target's record; `first_check` is when it is first probed on the schedule (`None`:
    /// not by the schedule).
    pub(super) fn new(
        name: Arc<str>,
        card: EndpointCard,
        link: ProbeLink,
        first_check: Option<Instant>,
    ) -> Self {
        Entry {
            name,
            card,
            link,
            schedule: Mutex::new(Schedule {
                next_check: first_check,
                ..Schedule::default()
            }),
            reschedule: Notify::new(),
            task: Mutex::new(None),
            removed: AtomicBool::new(false),
            unimplemented_logged: AtomicBool::new(false),
            probing: tokio::sync::Mutex::new(()),
        }
    }

    pub(super) fn status(&self) -> TargetStatus {
        let health = self.card.health();
        let schedule = lock(&self.schedule);
        TargetStatus {
            target: self.name.clone(),
            verdict: health.state,
            last_error: match health.state {
                HealthVerdict::Unhealthy => health.reason.clone(),
                _ => None,
            },
            last_check: schedule.last_check,
            consecutive_failures: schedule.failures,
            next_check: schedule.next_check,
            channel_open: self.link.is_open(),
            probe_keepalive: self.link.keepalive(),
            connections: self.link.connections(),
        }
    }

    /// The verdict, as the card says.
    pub(super) fn verdict(&self) -> HealthVerdict {
        self.card.health_verdict()
    }

    /// Ends the target's task and drops its channel at once.
    pub(super) fn close(&self) {
        self.removed.store(true, Ordering::Release);
        if let Some(task) = lock(&self.task).take() {
            task.abort();
        }
        self.link.close();
        self.reschedule.notify_waiters();
    }
}

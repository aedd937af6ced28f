//! A target as the user gives it: its address and its own options (the health service name
//! its probes ask about), however it reaches the kit — the builder's list, `Kit::add_target`,
//! a discovery source's changes, or a `dns:` name (whose options every address shares).

use std::borrow::Cow;
use std::sync::Arc;

/// A target's own options, apart from its address: what a discovery source's
/// [`Change::Insert`](tower::discover::Change::Insert) carries with the target's URI (`()` is
/// the defaults), and what [`Target`] holds beside it.
///
/// ```
/// use grpc_client_kit::TargetOptions;
/// let options = TargetOptions::new().health_service("billing.v1.Billing");
/// assert_eq!(options.get_health_service(), Some("billing.v1.Billing"));
/// assert_eq!(TargetOptions::from(()), TargetOptions::default());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TargetOptions {
    health_service: Option<Arc<str>>,
}

impl TargetOptions {
    /// The defaults: the health checker's service name.
    pub fn new() -> Self {
        TargetOptions::default()
    }

    /// The `grpc.health.v1` service name this target's probes ask about, instead of the
    /// checker's ([`HealthConfig::service`](crate::health::HealthConfig::service), `""` — the
    /// whole server — by default). Two backends that serve different services each get
    /// checked for their own.
    #[must_use]
    pub fn health_service(mut self, service: impl Into<Arc<str>>) -> Self {
        self.health_service = Some(service.into());
        self
    }

    /// The health service name set for this target, if any.
    pub fn get_health_service(&self) -> Option<&str> {
        self.health_service.as_deref()
    }

    pub(crate) fn health_service_name(&self) -> Option<&Arc<str>> {
        self.health_service.as_ref()
    }
}

impl From<()> for TargetOptions {
    fn from((): ()) -> Self {
        TargetOptions::default()
    }
}

/// One target as the user names it: an address (`http://10.0.0.7:50051`; `10.0.0.7:50051`
/// means `http://`), or for [`KitBuilder::target`](crate::KitBuilder::target) a `dns:` name,
/// with its [`TargetOptions`]. A string is a target with the defaults, so the builder's
/// [`targets`](crate::KitBuilder::targets) and [`Kit::add_target`](crate::Kit::add_target)
/// take strings and `Target`s alike.
///
/// ```
/// use grpc_client_kit::{Kit, Target};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let kit = Kit::builder()
///     .targets([
///         Target::new("http://127.0.0.1:50051").health_service("billing.v1.Billing"),
///         Target::new("http://127.0.0.1:50052").health_service("ledger.v1.Ledger"),
///     ])
///     .build()?;
/// assert_eq!(kit.targets().len(), 2);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    uri: String,
    options: TargetOptions,
}

impl Target {
    /// The target at `uri`, with the default options.
    pub fn new(uri: impl Into<String>) -> Self {
        Target {
            uri: uri.into(),
            options: TargetOptions::default(),
        }
    }

    /// The target at `uri` with `options`.
    pub fn with_options(uri: impl Into<String>, options: TargetOptions) -> Self {
        Target {
            uri: uri.into(),
            options,
        }
    }

    /// See [`TargetOptions::health_service`].
    #[must_use]
    pub fn health_service(mut self, service: impl Into<Arc<str>>) -> Self {
        self.options = self.options.health_service(service);
        self
    }

    /// The address (or `dns:` name) as written.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The target's options.
    pub fn options(&self) -> &TargetOptions {
        &self.options
    }
}

impl From<&str> for Target {
    fn from(uri: &str) -> Self {
        Target::new(uri)
    }
}

impl From<String> for Target {
    fn from(uri: String) -> Self {
        Target::new(uri)
    }
}

impl From<&String> for Target {
    fn from(uri: &String) -> Self {
        Target::new(uri.as_str())
    }
}

impl From<Box<str>> for Target {
    fn from(uri: Box<str>) -> Self {
        Target::new(uri)
    }
}

impl From<Arc<str>> for Target {
    fn from(uri: Arc<str>) -> Self {
        Target::new(&*uri)
    }
}

impl From<Cow<'_, str>> for Target {
    fn from(uri: Cow<'_, str>) -> Self {
        Target::new(uri)
    }
}

impl From<&Target> for Target {
    fn from(target: &Target) -> Self {
        target.clone()
    }
}

//! The endpoint template: how a target's address becomes a tonic `Endpoint`.

use endpoint_state::ConfigError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tonic::transport::Endpoint;

use crate::error::BoxError;

type TemplateFn = dyn Fn(&str) -> Result<Endpoint, BoxError> + Send + Sync + 'static;

/// Turns a target's URI (`http://10.0.0.7:50051`) into the tonic [`Endpoint`] its channels are
/// built from: TLS, origin, user agent, timeouts, keep-alive.
///
/// The same endpoint builds the target's application channel **and** its health checker's
/// probe channel (a separate connection, with the same settings), so a probe sees the backend
/// exactly as the application does.
///
/// ```
/// use std::time::Duration;
/// use grpc_client_kit::EndpointTemplate;
/// use tonic::transport::Endpoint;
///
/// let template = EndpointTemplate::from_fn(|uri: &str| {
///     Ok(Endpoint::from_shared(uri.to_owned())?
///         .user_agent("billing/1.4")?
///         .timeout(Duration::from_secs(2)))
/// });
/// let endpoint = template.endpoint("http://10.0.0.7:50051").unwrap();
/// assert_eq!(endpoint.uri(), "http://10.0.0.7:50051/");
/// ```
#[derive(Clone)]
pub struct EndpointTemplate {
    f: Arc<TemplateFn>,
}

impl EndpointTemplate {
    /// The default: the URI as it is, with tonic's default settings.
    pub fn new() -> Self {
        EndpointTemplate::from_fn(|uri: &str| Ok(Endpoint::from_shared(uri.to_owned())?))
    }

    /// A template from a function of the target's URI.
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(&str) -> Result<Endpoint, BoxError> + Send + Sync + 'static,
    {
        EndpointTemplate { f: Arc::new(f) }
    }

    /// The endpoint for `uri`.
    pub fn endpoint(&self, uri: &str) -> Result<Endpoint, BoxError> {
        (self.f)(uri)
    }
}

impl Default for EndpointTemplate {
    fn default() -> Self {
        EndpointTemplate::new()
    }
}

impl fmt::Debug for EndpointTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointTemplate").finish_non_exhaustive()
    }
}

/// The `[endpoint]` block of a [`KitConfig`](crate::KitConfig): the settings a configuration
/// file can give every target's endpoint. Unset fields keep tonic's defaults. (TLS needs
/// tonic's TLS features; set it with [`KitBuilder::endpoint_template`](crate::KitBuilder::endpoint_template).)
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointSettings {
    /// Deadline of every call (`Endpoint::timeout`), e.g. `"2s"`.
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    /// Deadline of establishing a connection (`Endpoint::connect_timeout`).
    #[serde(default, with = "humantime_serde")]
    pub connect_timeout: Option<Duration>,
    /// The `:authority` to send instead of the target's address (`Endpoint::origin`), e.g.
    /// `"https://api.example.com"`.
    pub origin: Option<String>,
    /// The `user-agent` header (`Endpoint::user_agent`).
    pub user_agent: Option<String>,
    /// `TCP_NODELAY` (`Endpoint::tcp_nodelay`).
    pub tcp_nodelay: Option<bool>,
    /// TCP keep-alive interval (`Endpoint::tcp_keepalive`).
    #[serde(default, with = "humantime_serde")]
    pub tcp_keepalive: Option<Duration>,
    /// HTTP/2 ping interval (`Endpoint::http2_keep_alive_interval`).
    #[serde(default, with = "humantime_serde")]
    pub http2_keep_alive_interval: Option<Duration>,
    /// How long to wait for a ping's answer (`Endpoint::keep_alive_timeout`).
    #[serde(default, with = "humantime_serde")]
    pub keep_alive_timeout: Option<Duration>,
    /// Ping even without calls in flight (`Endpoint::keep_alive_while_idle`).
    pub keep_alive_while_idle: Option<bool>,
}

impl EndpointSettings {
    /// Checks the fields tonic would refuse (`origin`, `user_agent`); the error names the field
    /// and the value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(origin) = &self.origin
            && let Err(e) = origin.parse::<http::Uri>()
        {
            return Err(ConfigError::problem(
                crate::error::CONFIG,
                "endpoint.origin",
                format!("{origin:?}"),
                format!("not a valid URI: {e}"),
            ));
        }
        if let Some(agent) = &self.user_agent
            && let Err(e) = http::HeaderValue::from_str(agent)
        {
            return Err(ConfigError::problem(
                crate::error::CONFIG,
                "endpoint.user_agent",
                format!("{agent:?}"),
                format!("not a valid header value: {e}"),
            ));
        }
        Ok(())
    }

    /// Applies every set field to `endpoint`.
    pub fn apply(&self, mut endpoint: Endpoint) -> Result<Endpoint, BoxError> {
        if let Some(t) = self.timeout {
            endpoint = endpoint.timeout(t);
        }
        if let Some(t) = self.connect_timeout {
            endpoint = endpoint.connect_timeout(t);
        }
        if let Some(origin) = &self.origin {
            endpoint = endpoint.origin(origin.parse::<http::Uri>()?);
        }
        if let Some(agent) = &self.user_agent {
            endpoint = endpoint.user_agent(agent.clone())?;
        }
        if let Some(nodelay) = self.tcp_nodelay {
            endpoint = endpoint.tcp_nodelay(nodelay);
        }
        if self.tcp_keepalive.is_some() {
            endpoint = endpoint.tcp_keepalive(self.tcp_keepalive);
        }
        if let Some(i) = self.http2_keep_alive_interval {
            endpoint = endpoint.http2_keep_alive_interval(i);
        }
        if let Some(t) = self.keep_alive_timeout {
            endpoint = endpoint.keep_alive_timeout(t);
        }
        if let Some(idle) = self.keep_alive_while_idle {
            endpoint = endpoint.keep_alive_while_idle(idle);
        }
        Ok(endpoint)
    }

    /// A template that builds each target's endpoint from its URI and these settings.
    pub fn template(&self) -> EndpointTemplate {
        let settings = self.clone();
        EndpointTemplate::from_fn(move |uri: &str| {
            settings.apply(Endpoint::from_shared(uri.to_owned())?)
        })
    }
}

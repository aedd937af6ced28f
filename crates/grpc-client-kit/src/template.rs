//! The endpoint template: how a target's address becomes a tonic `Endpoint`.

use endpoint_state::ConfigError;
use endpoint_state::time::FAR;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tonic::transport::Endpoint;

use crate::connect::{BoxConnector, box_connector};
use crate::error::BoxError;

/// What a template makes of a URI: the endpoint, and the user's connector if it has one.
type TemplateFn =
    dyn Fn(&str) -> Result<(Endpoint, Option<BoxConnector>), BoxError> + Send + Sync + 'static;

/// Turns a target's URI (`http://10.0.0.7:50051`) into the tonic [`Endpoint`] its channels are
/// built from: TLS, origin, user agent, timeouts, keep-alive.
///
/// The same endpoint builds the target's application channel **and** its health checker's
/// probe channel (a separate connection, with the same settings), so a probe sees the backend
/// exactly as the application does.
///
/// **Connect timeout.** An endpoint whose template sets no connect timeout
/// (`Endpoint::get_connect_timeout()` is `None`) gets
/// [`DEFAULT_CONNECT_TIMEOUT`](Self::DEFAULT_CONNECT_TIMEOUT) (20 s, gRPC's minimum connect
/// timeout): without one, an address that drops SYNs holds a connection
/// attempt — and every call queued on it — for the operating system's retries (about 2
/// minutes on Linux). A template's own connect timeout is kept as it is.
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
/// assert_eq!(endpoint.get_connect_timeout(), Some(Duration::from_secs(20)));
/// ```
#[derive(Clone)]
pub struct EndpointTemplate {
    f: Arc<TemplateFn>,
    /// The settings it was made from, when the kit made it ([`new`](Self::new),
    /// [`EndpointSettings`]): every setting of its endpoints is known, so the kit may connect
    /// them with its own connector and HTTP/2 client (see [`from_fn`](Self::from_fn)).
    known: Option<Arc<EndpointSettings>>,
}

impl EndpointTemplate {
    /// The connect timeout of a target whose endpoint template sets none: 20 s, gRPC's minimum
    /// connect timeout (gRPC's connection backoff spec: `MIN_CONNECT_TIMEOUT`). It bounds one
    /// connection attempt of the application channel and of the probe channel alike.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

    /// The default: the URI as it is, with tonic's default settings (and the
    /// [`DEFAULT_CONNECT_TIMEOUT`](Self::DEFAULT_CONNECT_TIMEOUT)).
    pub fn new() -> Self {
        EndpointSettings::default().template()
    }

    /// A template from a function of the target's URI.
    ///
    /// The kit connects the targets of its own templates ([`new`](Self::new), a configuration
    /// file's `[endpoint]`) with tonic's TCP connector built from the endpoint's settings, and
    /// watches each connection: when one fails before the server sent a single byte (a
    /// stopping server resetting connections still in its accept queue), no server code saw
    /// the calls on it, and they go to another target
    /// ([`transparent_retry`](crate::KitBuilder::transparent_retry)). Their plaintext targets
    /// it calls through its own HTTP/2 client, which applies every setting of the template
    /// and costs less client CPU per call than a tonic `Channel`. An endpoint from a function
    /// may set what tonic lets no one read back (its local address, its HTTP/2 settings), so
    /// the kit leaves its connections to a tonic `Channel`, as it gives them: everything else
    /// works alike, but such a call fails with `UNAVAILABLE` instead of being retried.
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(&str) -> Result<Endpoint, BoxError> + Send + Sync + 'static,
    {
        EndpointTemplate {
            f: Arc::new(move |uri: &str| Ok((f(uri)?, None))),
            known: None,
        }
    }

    /// A template whose targets are connected by a connector of your own — a Unix socket, an
    /// in-memory transport, a proxy, a tunnel: for each target's URI, its endpoint (TLS,
    /// origin, timeouts, HTTP/2 settings, as for [`from_fn`](Self::from_fn)) and the connector
    /// that makes its connections, as tonic's
    /// [`Endpoint::connect_with_connector_lazy`] takes them.
    ///
    /// The connector is used for the target's application channel **and** for its health
    /// probe connections (each a connection of its own, as always), so a probe reaches the
    /// backend exactly as calls do. tonic calls it with the endpoint's URI (and puts TLS on
    /// top of the connection for an `https` URI); for a `dns:` target, with the resolved
    /// address in place of the host (`https://10.0.0.7:443`), while the endpoint keeps the
    /// name. The connector is cloned for every channel and every connection attempt, so it
    /// should be cheap to clone (an `Arc` inside). The kit's own detection of connections that
    /// closed before the server spoke (see [`from_fn`](Self::from_fn)) is the connector's to
    /// give: without it, such a call fails with `UNAVAILABLE` instead of being retried. So is
    /// the kit's one write per request on plaintext connections (a request's `HEADERS` and
    /// first `DATA` together): wrap a plaintext connection's IO in
    /// [`state::writes::Coalesced`](crate::state::writes::Coalesced) to do the same.
    ///
    /// ```
    /// use grpc_client_kit::EndpointTemplate;
    /// use hyper_util::rt::TokioIo;
    /// use tonic::transport::Endpoint;
    ///
    /// // Each target names a Unix socket by its host: `http://billing` is /run/billing.sock.
    /// let template = EndpointTemplate::from_connector_fn(|uri: &str| {
    ///     let host = uri.parse::<http::Uri>()?.host().unwrap_or_default().to_owned();
    ///     let path = format!("/run/{host}.sock");
    ///     // The endpoint's URI names the server (`:authority: billing`).
    ///     let endpoint = Endpoint::from_shared(uri.to_owned())?;
    ///     let connector = tower::service_fn(move |_: http::Uri| {
    ///         let path = path.clone();
    ///         async move {
    ///             let stream = tokio::net::UnixStream::connect(path).await?;
    ///             Ok::<_, std::io::Error>(TokioIo::new(stream))
    ///         }
    ///     });
    ///     Ok((endpoint, connector))
    /// });
    /// assert!(template.endpoint("http://billing").is_ok());
    /// ```
    pub fn from_connector_fn<F, C>(f: F) -> Self
    where
        F: Fn(&str) -> Result<(Endpoint, C), BoxError> + Send + Sync + 'static,
        C: tower_service::Service<http::Uri> + Clone + Send + Sync + 'static,
        C::Response: hyper::rt::Read + hyper::rt::Write + Send + Unpin + 'static,
        C::Future: Send + 'static,
        C::Error: Into<BoxError>,
    {
        EndpointTemplate {
            f: Arc::new(move |uri: &str| {
                let (endpoint, connector) = f(uri)?;
                Ok((endpoint, Some(box_connector(connector))))
            }),
            known: None,
        }
    }

    /// A template of the kit's own, made from `settings`.
    fn known<F>(settings: Arc<EndpointSettings>, f: F) -> Self
    where
        F: Fn(&str) -> Result<Endpoint, BoxError> + Send + Sync + 'static,
    {
        EndpointTemplate {
            f: Arc::new(move |uri: &str| Ok((f(uri)?, None))),
            known: Some(settings),
        }
    }

    /// The settings of a template the kit made: its endpoints may be connected with the kit's
    /// own connector, and its own HTTP/2 client ([`crate::http2`]) applies them.
    pub(crate) fn settings(&self) -> Option<&Arc<EndpointSettings>> {
        self.known.as_ref()
    }

    /// The endpoint for `uri`: the template's, with
    /// [`DEFAULT_CONNECT_TIMEOUT`](Self::DEFAULT_CONNECT_TIMEOUT) when it sets no connect
    /// timeout of its own.
    ///
    /// A template [with a connector](Self::from_connector_fn) gives its endpoint here (its
    /// connector is made, and dropped).
    pub fn endpoint(&self, uri: &str) -> Result<Endpoint, BoxError> {
        Ok(self.transport(uri)?.0)
    }

    /// The endpoint for `uri` (as [`endpoint`](Self::endpoint)) and the template's connector,
    /// if it has one.
    pub(crate) fn transport(
        &self,
        uri: &str,
    ) -> Result<(Endpoint, Option<BoxConnector>), BoxError> {
        let (endpoint, connector) = (self.f)(uri)?;
        let endpoint = match endpoint.get_connect_timeout() {
            Some(_) => endpoint,
            None => endpoint.connect_timeout(Self::DEFAULT_CONNECT_TIMEOUT),
        };
        Ok((endpoint, connector))
    }
}

/// The shortest HTTP/2 keepalive interval or timeout accepted: below a second a ping is load,
/// not a liveness check, and servers answer pings more often than every 5 minutes with
/// `GOAWAY ENHANCE_YOUR_CALM "too_many_pings"` anyway (gRFC A8).
pub(crate) const MIN_KEEPALIVE: Duration = Duration::from_secs(1);

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
/// file can give every target's endpoint. Unset fields keep tonic's defaults (and the
/// [`DEFAULT_CONNECT_TIMEOUT`](EndpointTemplate::DEFAULT_CONNECT_TIMEOUT)). (TLS needs tonic's
/// TLS features; set it with
/// [`KitBuilder::endpoint_template`](crate::KitBuilder::endpoint_template).)
///
/// [`validate`](Self::validate) refuses what cannot work: a zero `timeout` or
/// `connect_timeout` (every call, or every connection, would fail at once) and an HTTP/2
/// keepalive interval or timeout under a second. A duration beyond any clock
/// (`Duration::MAX`) is as long as anything waits.
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
    /// Checks every field: the ones tonic would refuse (`origin`, `user_agent`), zero
    /// timeouts, and sub-second keepalives; the error names the field and the value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, value) in [
            ("endpoint.timeout", self.timeout),
            ("endpoint.connect_timeout", self.connect_timeout),
        ] {
            if let Some(d) = value
                && d.is_zero()
            {
                return Err(ConfigError::new(
                    crate::error::CONFIG,
                    field,
                    format!("{d:?}"),
                    "more than zero (a zero timeout fails everything at once; leave it unset \
                     for none)",
                ));
            }
        }
        for (field, value) in [
            (
                "endpoint.http2_keep_alive_interval",
                self.http2_keep_alive_interval,
            ),
            ("endpoint.keep_alive_timeout", self.keep_alive_timeout),
        ] {
            if let Some(d) = value
                && d < MIN_KEEPALIVE
            {
                return Err(ConfigError::new(
                    crate::error::CONFIG,
                    field,
                    format!("{d:?}"),
                    "at least 1 s (servers answer pings more often than every 5 minutes with \
                     GOAWAY too_many_pings)",
                ));
            }
        }
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

    /// Applies every set field to `endpoint` (a duration beyond any clock cut to
    /// [`FAR`](endpoint_state::time::FAR), as long as anything waits).
    pub fn apply(&self, mut endpoint: Endpoint) -> Result<Endpoint, BoxError> {
        if let Some(t) = self.timeout {
            endpoint = endpoint.timeout(t.min(FAR));
        }
        if let Some(t) = self.connect_timeout {
            endpoint = endpoint.connect_timeout(t.min(FAR));
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
            endpoint = endpoint.tcp_keepalive(self.tcp_keepalive.map(|t| t.min(FAR)));
        }
        if let Some(i) = self.http2_keep_alive_interval {
            endpoint = endpoint.http2_keep_alive_interval(i.min(FAR));
        }
        if let Some(t) = self.keep_alive_timeout {
            endpoint = endpoint.keep_alive_timeout(t.min(FAR));
        }
        if let Some(idle) = self.keep_alive_while_idle {
            endpoint = endpoint.keep_alive_while_idle(idle);
        }
        Ok(endpoint)
    }

    /// A template that builds each target's endpoint from its URI and these settings.
    pub fn template(&self) -> EndpointTemplate {
        let settings = Arc::new(self.clone());
        let apply = Arc::clone(&settings);
        EndpointTemplate::known(settings, move |uri: &str| {
            apply.apply(Endpoint::from_shared(uri.to_owned())?)
        })
    }
}

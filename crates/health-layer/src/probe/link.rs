//! One target's probe link: where its probes go (endpoint, service name), the gRPC connection
//! kept between passing probes, and the keepalive of its new connections, slowed down when a
//! server says `too_many_pings` (gRFC A8). The checker asks it for one look at a time and judges
//! what comes back; the link never publishes anything.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use endpoint_state::BoxError;
use endpoint_state::sync::lock;
use endpoint_state::time::{FAR, Secs};
use tokio::time::Instant;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckResponse;

use super::check_call::CheckCall;
use super::connect::{ProbeConn, Via, connect_direct, connect_failed, connect_until};
use super::error::{ConnectionEnd, ProbeError, ProbeFailure};
use super::frames::ServerFrames;
use super::grpc::{ServingStatus, transport_is_unavailable, watch_on};

/// Connects a probe channel from its endpoint (the user's
/// [`connector`](crate::HealthConfig::connector)).
pub(crate) type Connector = Arc<
    dyn Fn(Endpoint) -> Pin<Box<dyn Future<Output = Result<Channel, BoxError>> + Send>>
        + Send
        + Sync
        + 'static,
>;

/// How a link connects: the time a probe may take, and the user's connector if any.
#[derive(Clone, Copy)]
pub(crate) struct Dial<'a> {
    pub(crate) limit: Duration,
    pub(crate) connector: Option<&'a Connector>,
}

/// What gRPC servers accept by default: one ping without data every 5 minutes (C-core,
/// grpc-go, grpc-java). A8's doubling starts here when the refused keepalive was the
/// template's own.
const SERVER_PING_FLOOR: Duration = Duration::from_secs(5 * 60);

/// A verification in flight (see [`ProbeLink::verify`]).
pub(crate) type Verifying<'a> =
    Pin<Box<dyn Future<Output = Result<ServingStatus, ProbeError>> + Send + 'a>>;

/// One target's probe link. See the [module docs](self).
pub(crate) struct ProbeLink {
    target: Arc<str>,
    /// `None` for custom probes, which have no endpoint.
    endpoint: Option<Endpoint>,
    service: Arc<str>,
    /// The `Check` about `service`, encoded once.
    check: CheckCall,
    /// The gRPC connection, kept between passing probes.
    conn: Mutex<Option<ProbeConn>>,
    /// The HTTP/2 keepalive of new connections, when the checker sets one:
    /// [`probe_keepalive`](crate::HealthConfig::probe_keepalive), doubled on each
    /// `too_many_pings`.
    keepalive: Mutex<Option<Duration>>,
    /// Connections made (the channel's own reconnections too, for plaintext endpoints).
    connections: Arc<AtomicU64>,
    /// The target's own connector, used instead of the checker's.
    connector: Option<Connector>,
    /// Where connections go instead of the endpoint's host.
    address: Option<SocketAddr>,
    /// Whether the checker knows every setting of the endpoint (it comes from the default
    /// template), so that its plaintext `Check`s may go on the checker's own connection.
    known_endpoint: bool,
}

impl ProbeLink {
    pub(crate) fn new(
        target: Arc<str>,
        endpoint: Option<Endpoint>,
        service: Arc<str>,
        keepalive: Option<Duration>,
    ) -> Self {
        ProbeLink {
            target,
            endpoint,
            check: CheckCall::new(service.clone()),
            service,
            conn: Mutex::new(None),
            keepalive: Mutex::new(keepalive),
            connections: Arc::default(),
            connector: None,
            address: None,
            known_endpoint: false,
        }
    }

    /// The endpoint comes from the checker's default template: the checker knows each of its
    /// settings (tonic's defaults), so its plaintext `Check`s without an HTTP/2 keepalive go on
    /// the checker's own HTTP/2 connection ([`Direct`](super::connect::Direct)).
    pub(crate) fn with_known_endpoint(mut self, known: bool) -> Self {
        self.known_endpoint = known;
        self
    }

    /// The target's own connector, and the address its connections go to (see
    /// [`Target`](crate::Target)).
    pub(crate) fn with_transport(
        mut self,
        connector: Option<Connector>,
        address: Option<SocketAddr>,
    ) -> Self {
        self.connector = connector;
        self.address = address;
        self
    }

    /// The endpoint probed (none for custom probes).
    #[cfg(feature = "http-probe")]
    pub(crate) fn endpoint(&self) -> Option<&Endpoint> {
        self.endpoint.as_ref()
    }

    /// The service name asked about.
    pub(crate) fn service(&self) -> &Arc<str> {
        &self.service
    }

    /// Whether a gRPC connection is kept now.
    pub(crate) fn is_open(&self) -> bool {
        lock(&self.conn).is_some()
    }

    /// The kept connection, if any.
    pub(crate) fn kept(&self) -> Option<ProbeConn> {
        lock(&self.conn).clone()
    }

    /// Drops the kept connection, if any.
    pub(crate) fn close(&self) {
        drop(lock(&self.conn).take());
    }

    /// The keepalive of new connections, when the checker sets one.
    pub(crate) fn keepalive(&self) -> Option<Duration> {
        *lock(&self.keepalive)
    }

    /// Connections made so far.
    pub(crate) fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// An RPC failure of this target's health RPC.
    pub(crate) fn rpc_error(&self, status: Status) -> ProbeError {
        ProbeError::new(
            self.target.clone(),
            ProbeFailure::Rpc {
                service: self.service.clone(),
                status,
            },
        )
    }

    /// The `Watch` stream failed with `status` (the server's, or one made here from a broken
    /// connection, which says how the connection ended).
    pub(crate) fn stream_error(&self, status: Status) -> ProbeError {
        let ended = ConnectionEnd::of(&status);
        self.rpc_error(transport_is_unavailable(status))
            .with_end(ended)
    }

    /// The server answered, and not `SERVING`.
    pub(crate) fn not_serving(&self, status: ServingStatus) -> ProbeError {
        ProbeError::new(
            self.target.clone(),
            ProbeFailure::NotServing {
                service: self.service.clone(),
                status,
            },
        )
    }

    /// Connects a new probe connection for `Check`s: a plaintext endpoint of the default
    /// template without keepalive gets the checker's own HTTP/2 connection, anything else a
    /// tonic `Channel` ([`connect_channel`](Self::connect_channel)).
    pub(crate) async fn connect(
        &self,
        dial: Dial<'_>,
        deadline: Instant,
    ) -> Result<ProbeConn, ProbeError> {
        let endpoint = self.probe_endpoint();
        let direct = self.known_endpoint
            && self.keepalive().is_none()
            && self.connector.is_none()
            && dial.connector.is_none()
            && endpoint.uri().scheme_str() == Some("http");
        if direct {
            return connect_direct(
                &self.target,
                &endpoint,
                self.address,
                deadline,
                dial.limit,
                &self.connections,
            )
            .await;
        }
        let (channel, frames) = self.connect_channel(dial, deadline).await?;
        Ok(ProbeConn {
            via: Via::Channel(channel),
            frames,
        })
    }

    /// The endpoint of new connections: the target's, with the link's keepalive when it sets
    /// one.
    fn probe_endpoint(&self) -> Endpoint {
        let endpoint = self
            .endpoint
            .clone()
            .expect("gRPC probe modes always resolve an endpoint");
        match self.keepalive() {
            // hyper adds the interval to an instant: keep it within what a clock can hold.
            Some(interval) => endpoint.http2_keep_alive_interval(interval.min(FAR)),
            None => endpoint,
        }
    }

    /// Connects a new probe channel (a tonic `Channel` of the endpoint, by the target's or the
    /// checker's connector if there is one), and for a plaintext one what its server sends.
    pub(crate) async fn connect_channel(
        &self,
        dial: Dial<'_>,
        deadline: Instant,
    ) -> Result<(Channel, Option<ServerFrames>), ProbeError> {
        let endpoint = self.probe_endpoint();
        let Some(connector) = self.connector.as_ref().or(dial.connector) else {
            return connect_until(
                &self.target,
                &endpoint,
                self.address,
                deadline,
                dial.limit,
                &self.connections,
            )
            .await;
        };
        match tokio::time::timeout_at(deadline, connector(endpoint)).await {
            Ok(Ok(channel)) => Ok((channel, None)),
            Ok(Err(e)) => Err(connect_failed(&self.target, None, Some(e))),
            Err(_) => Err(connect_failed(&self.target, Some(dial.limit), None)),
        }
    }

    /// One `Check` on the kept channel (connecting one if there is none). When the kept
    /// connection turns out to be gone — the server closed it (max connection age or idleness,
    /// a restart), which says nothing against the target — the check is made once more on a
    /// new connection, by the same deadline.
    ///
    /// With `own_connection` (a `Check` in `Watch` mode, whose kept connection belongs to the
    /// stream), it connects, checks and lets go.
    pub(crate) async fn check(
        &self,
        dial: Dial<'_>,
        deadline: Instant,
        own_connection: bool,
    ) -> Result<(), ProbeError> {
        if own_connection {
            let conn = self.connect(dial, deadline).await?;
            return self.check_until(&conn.via, deadline).await;
        }
        let conn = match self.kept() {
            Some(conn) => match self.check_until(&conn.via, deadline).await {
                Ok(()) => {
                    self.after_check();
                    return Ok(());
                }
                Err(e) if e.connection_ended() => {
                    tracing::debug!(backend = %self.target, error = %e.reason(), "health probe connection ended; checking on a new one");
                    self.connection_done(&e);
                    self.connect(dial, deadline).await?
                }
                other => return other,
            },
            None => self.connect(dial, deadline).await?,
        };
        let via = conn.via.clone();
        lock(&self.conn).get_or_insert(conn);
        let result = self.check_until(&via, deadline).await;
        self.after_check();
        result
    }

    /// One `Check` through `via` by `deadline`: `SERVING` is `Ok`.
    async fn check_until(&self, via: &Via, deadline: Instant) -> Result<(), ProbeError> {
        let remaining = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        match self.check.call(via, &self.target, remaining).await? {
            ServingStatus::Serving => Ok(()),
            status => Err(self.not_serving(status)),
        }
    }

    /// One `Check` through `via` within `limit`, whatever it answers: verifies that a kept
    /// connection is alive (a call with data, which no server counts as an abusive ping).
    pub(crate) fn verify(&self, via: Via, limit: Duration) -> Verifying<'_> {
        Box::pin(async move { self.check.call(&via, &self.target, limit).await })
    }

    /// Subscribes to `Watch` on a new connection (kept by the link while the stream lives), by
    /// `deadline`: the stream and its channel.
    pub(crate) async fn subscribe(
        &self,
        dial: Dial<'_>,
        deadline: Instant,
    ) -> Result<(Channel, tonic::Streaming<HealthCheckResponse>), ProbeError> {
        let (channel, frames) = self.connect_channel(dial, deadline).await?;
        *lock(&self.conn) = Some(ProbeConn {
            via: Via::Channel(channel.clone()),
            frames,
        });
        let stream = watch_on(
            channel.clone(),
            &self.target,
            &self.service,
            deadline,
            dial.limit,
        )
        .await?;
        Ok((channel, stream))
    }

    /// The connection is done (its stream or a check on it failed, or the server closed it):
    /// drop it, and if the server's `GOAWAY` said `too_many_pings`, slow the pings down.
    pub(crate) fn connection_done(&self, error: &ProbeError) {
        let conn = lock(&self.conn).take();
        let goaway = conn.as_ref().and_then(ProbeConn::take_goaway);
        if let Some(goaway) = &goaway {
            tracing::debug!(backend = %self.target, %goaway, "health probe connection closed by the server");
        }
        if error.is_too_many_pings() || goaway.is_some_and(|g| g.is_too_many_pings()) {
            self.slow_pings();
        }
    }

    /// After a check that passed on a kept channel: tonic may have reconnected it silently
    /// after the server closed the old connection. If the server did so for too many pings,
    /// slow the pings down and let the next probe connect anew with them.
    fn after_check(&self) {
        let goaway = lock(&self.conn).as_ref().and_then(ProbeConn::take_goaway);
        if let Some(goaway) = goaway {
            tracing::debug!(backend = %self.target, %goaway, "health probe connection closed by the server");
            if goaway.is_too_many_pings() {
                self.slow_pings();
                self.close();
            }
        }
    }

    /// gRFC A8: the server closed a probe connection with `too_many_pings`. Double the
    /// keepalive of new connections (from 5 minutes, what servers accept by default, when the
    /// refused value is the template's own and cannot be read back).
    fn slow_pings(&self) {
        let mut keepalive = lock(&self.keepalive);
        let next = match *keepalive {
            Some(interval) => interval.saturating_mul(2).min(FAR),
            None => SERVER_PING_FLOOR,
        };
        *keepalive = Some(next);
        tracing::warn!(
            backend = %self.target,
            keepalive = ?next,
            "health probe connection closed by the server: GOAWAY too_many_pings; its new \
             connections ping at most every {} (gRFC A8)",
            Secs(next)
        );
    }
}

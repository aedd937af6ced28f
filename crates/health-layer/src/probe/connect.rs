//! Probe connections that know what the server said.
//!
//! Plaintext (`http://`) probe connections go through a connector that watches the server's
//! frames ([`frames`](super::frames)): **connected** means the server has spoken HTTP/2 (its
//! first frame is `SETTINGS`), so an address that accepts TCP and never answers is a connection
//! failure within the time allowed and a port that answers HTTP/1 or TLS says so; and the last
//! `GOAWAY` the server sent is kept, so the checker can tell a connection closed for too many
//! pings (double the keepalive) from any other.
//!
//! A plaintext probe connection also sends each `Check` in one write, its `HEADERS` and `DATA`
//! together, where hyper alone writes them apart
//! ([`Coalesced`](endpoint_state::writes::Coalesced)): one system call and one TCP segment per
//! check instead of two.
//!
//! TLS endpoints (`https://`, encrypted by tonic above the connector) and endpoints of other
//! schemes are connected as tonic does, without these. The connector applies the
//! endpoint's TCP settings (nodelay, keepalive, connect timeout); `Endpoint::local_address`
//! cannot be read back from tonic, so a probe connection does not bind it (give the checker a
//! [`connector`](crate::HealthConfig::connector) of your own if you need one).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use endpoint_state::BoxError;
use endpoint_state::transport::redirect_uri;
use endpoint_state::writes::Coalesced;
use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tonic::codegen::Bytes;
use tonic::transport::{Channel, Endpoint};
use tower_service::Service;

use super::error::{ProbeError, ProbeFailure};
use super::frames::{GoAway, ServerFrames, WatchedIo};

/// A connected probe channel and, for a plaintext connection, what its server has sent.
#[derive(Clone, Debug)]
pub(crate) struct ProbeConn {
    pub(crate) via: Via,
    pub(crate) frames: Option<ServerFrames>,
}

/// What a probe connection's calls go through.
#[derive(Clone, Debug)]
pub(crate) enum Via {
    /// A tonic `Channel` (TLS, connectors of the user's, endpoints the checker cannot read
    /// back, `Watch` streams).
    Channel(Channel),
    /// The checker's own HTTP/2 connection (see [`Direct`]).
    Direct(Direct),
}

/// A probe connection of the checker's own, on the `h2` crate: for plaintext endpoints of the
/// checker's default template, whose every setting the checker knows (tonic's defaults, and
/// no HTTP/2 keepalive). A `Check` is sent from the probing task itself (its `HEADERS` and
/// its `DATA` handed to the connection together, so that they normally leave in one write:
/// only a connection task already running on another worker can send the first alone) and
/// its answer read there; the connection's task only reads and writes the socket. A tonic `Channel`
/// adds a `Buffer` worker and hyper's tasks per request on top of that.
///
/// Dropping the last clone lets the connection close (once no call is open on it).
#[derive(Clone)]
pub(crate) struct Direct {
    pub(crate) send: h2::client::SendRequest<Bytes>,
    /// `http://{authority}/grpc.health.v1.Health/Check`, the endpoint's authority.
    pub(crate) check_uri: Uri,
}

impl Direct {
    /// Starts HTTP/2 on `io` (hyper's client settings) and spawns the connection's task, which
    /// ends when the connection does. `check_uri` is the `Check` request's URI.
    pub(crate) async fn open<T>(io: T, target: &Arc<str>, check_uri: Uri) -> Result<Self, h2::Error>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (send, connection) = endpoint_state::transport::http2_client()
            .handshake::<_, Bytes>(io)
            .await?;
        let name = target.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(backend = %name, error = %e, "health probe connection ended");
            }
        });
        Ok(Direct { send, check_uri })
    }
}

impl std::fmt::Debug for Direct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Direct")
            .field("check_uri", &self.check_uri)
            .finish_non_exhaustive()
    }
}

impl ProbeConn {
    /// The last `GOAWAY` the server sent on this channel's connections and not yet taken,
    /// when it can be known (plaintext connections).
    pub(crate) fn take_goaway(&self) -> Option<GoAway> {
        self.frames.as_ref().and_then(ServerFrames::take_goaway)
    }
}

/// The error of a connection that could not be made (`timed_out: None`) or not within
/// `limit` (`Some`).
pub(crate) fn connect_failed(
    target: &Arc<str>,
    timed_out: Option<Duration>,
    source: Option<BoxError>,
) -> ProbeError {
    ProbeError::new(target.clone(), ProbeFailure::Connect { timed_out, source })
}

/// Connects `endpoint` now, by `deadline` (`limit` is how long that was, for the error); to
/// `address` when given, instead of the endpoint's host. Plaintext endpoints go through the
/// frame-watching connector and count as connected once the server's `SETTINGS` frame has
/// arrived.
pub(crate) async fn connect_until(
    target: &Arc<str>,
    endpoint: &Endpoint,
    address: Option<SocketAddr>,
    deadline: Instant,
    limit: Duration,
    connections: &Arc<AtomicU64>,
) -> Result<(Channel, Option<ServerFrames>), ProbeError> {
    let failed = |source: BoxError| connect_failed(target, None, Some(source));
    let attempt = async {
        if endpoint.uri().scheme_str() != Some("http") {
            connections.fetch_add(1, Ordering::Relaxed);
            let channel = match address {
                None => endpoint.connect().await,
                Some(address) => {
                    let http = tcp_connector(endpoint);
                    endpoint
                        .connect_with_connector(tower::util::MapRequest::new(
                            http,
                            move |uri: Uri| redirect_uri(&uri, address),
                        ))
                        .await
                }
            }
            .map_err(|e| failed(Box::new(e)))?;
            return Ok((channel, None));
        }
        let frames = ServerFrames::new();
        let connector =
            WatchingConnector::new(endpoint, frames.clone(), connections.clone(), address);
        let channel = match endpoint.connect_with_connector(connector).await {
            Ok(channel) => channel,
            // Our reader's own finding says more than tonic's "transport error".
            Err(e) => {
                return Err(match frames.failure() {
                    Some(ours) => failed(Box::new(ours)),
                    None => failed(Box::new(e)),
                });
            }
        };
        frames.preface().await.map_err(|e| failed(Box::new(e)))?;
        Ok((channel, Some(frames)))
    };
    match tokio::time::timeout_at(deadline, attempt).await {
        Ok(result) => result,
        Err(_) => Err(connect_failed(target, Some(limit), None)),
    }
}

/// Connects the checker's own HTTP/2 connection to `endpoint` (plaintext, of the default
/// template: its settings are tonic's defaults but for the TCP ones, which can be read back),
/// by `deadline`; to `address` when given. Connected means the server's `SETTINGS` frame has
/// arrived, as for [`connect_until`].
pub(crate) async fn connect_direct(
    target: &Arc<str>,
    endpoint: &Endpoint,
    address: Option<SocketAddr>,
    deadline: Instant,
    limit: Duration,
    connections: &Arc<AtomicU64>,
) -> Result<ProbeConn, ProbeError> {
    let failed = |source: BoxError| connect_failed(target, None, Some(source));
    let uri = endpoint.uri();
    let check_uri = Uri::builder()
        .scheme("http")
        .authority(uri.authority().map_or("", |a| a.as_str()))
        .path_and_query(super::check_call::PATH)
        .build()
        .map_err(|e| failed(Box::new(e)))?;
    let to = match address {
        Some(address) => redirect_uri(uri, address),
        None => uri.clone(),
    };
    let mut http = tcp_connector(endpoint);
    let frames = ServerFrames::new();
    connections.fetch_add(1, Ordering::Relaxed);
    let attempt = async {
        let io = http.call(to).await.map_err(|e| failed(Box::new(e)))?;
        let direct = match Direct::open(frames.watch(io.into_inner()), target, check_uri).await {
            Ok(direct) => direct,
            Err(e) => {
                return Err(match frames.failure() {
                    Some(ours) => failed(Box::new(ours)),
                    None => failed(Box::new(e)),
                });
            }
        };
        frames.preface().await.map_err(|e| failed(Box::new(e)))?;
        Ok(ProbeConn {
            via: Via::Direct(direct),
            frames: Some(frames),
        })
    };
    match tokio::time::timeout_at(deadline, attempt).await {
        Ok(result) => result,
        Err(_) => Err(connect_failed(target, Some(limit), None)),
    }
}

/// hyper's TCP connector, configured from the endpoint as tonic configures its own, with each
/// connection's reads watched.
#[derive(Clone)]
struct WatchingConnector {
    http: HttpConnector,
    frames: ServerFrames,
    /// Counts every connection made (the channel's own reconnections too).
    connections: Arc<AtomicU64>,
    /// Where connections go instead of the endpoint's host.
    address: Option<SocketAddr>,
}

/// hyper's TCP connector with the endpoint's TCP settings, as tonic configures its own.
fn tcp_connector(endpoint: &Endpoint) -> HttpConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(endpoint.get_tcp_nodelay());
    http.set_keepalive(endpoint.get_tcp_keepalive());
    http.set_keepalive_interval(endpoint.get_tcp_keepalive_interval());
    http.set_keepalive_retries(endpoint.get_tcp_keepalive_retries());
    http.set_connect_timeout(endpoint.get_connect_timeout());
    http
}

impl WatchingConnector {
    fn new(
        endpoint: &Endpoint,
        frames: ServerFrames,
        connections: Arc<AtomicU64>,
        address: Option<SocketAddr>,
    ) -> Self {
        WatchingConnector {
            http: tcp_connector(endpoint),
            frames,
            connections,
            address,
        }
    }
}

/// A probe connection's IO: the server's frames watched, and each `Check` sent in one write
/// (its `HEADERS` and `DATA` together, where hyper alone writes them apart).
pub(crate) fn probe_io<T>(frames: &ServerFrames, io: T) -> WatchedIo<Coalesced<T>> {
    frames.watch(Coalesced::new(io))
}

impl Service<Uri> for WatchingConnector {
    type Response = TokioIo<WatchedIo<Coalesced<TcpStream>>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        self.connections.fetch_add(1, Ordering::Relaxed);
        let uri = match self.address {
            Some(address) => redirect_uri(&uri, address),
            None => uri,
        };
        let connecting = self.http.call(uri);
        let frames = self.frames.clone();
        Box::pin(async move {
            let io = connecting.await?;
            // A new connection of the same channel: its preface is to come.
            Ok(TokioIo::new(probe_io(&frames, io.into_inner())))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three `Check`s through `via`, each answered `SERVING`.
    async fn three_serving_checks(via: &Via, target: &Arc<str>) {
        let check = crate::probe::check_call::CheckCall::new("".into());
        for _ in 0..3 {
            let status = check
                .call(via, target, std::time::Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(status, crate::probe::grpc::ServingStatus::Serving);
        }
    }

    /// A `Check` on a probe connection to a real server leaves in one write: its `HEADERS` and
    /// its `DATA` together (hyper alone writes them apart: see `endpoint_state::writes`).
    #[tokio::test]
    async fn a_checks_headers_and_data_leave_in_one_write() {
        use test_backends::wire::{channel_over, record_tcp};

        let backend = test_backends::Backend::start("b0").await.unwrap();
        let (recording, writes) = record_tcp(backend.addr()).await.unwrap();
        let frames = ServerFrames::new();
        let channel = channel_over(backend.uri(), probe_io(&frames, recording))
            .await
            .unwrap();
        let target: Arc<str> = backend.uri().into();
        three_serving_checks(&Via::Channel(channel), &target).await;

        writes.assert_requests_whole(3);
    }

    /// The same on the checker's own connection: `HEADERS` and `DATA` handed over together.
    #[tokio::test]
    async fn a_direct_checks_headers_and_data_leave_in_one_write() {
        use test_backends::wire::record_tcp;

        let backend = test_backends::Backend::start("b0").await.unwrap();
        let (recording, writes) = record_tcp(backend.addr()).await.unwrap();
        let target: Arc<str> = backend.uri().into();
        let check_uri: Uri = format!("{}{}", backend.uri(), crate::probe::check_call::PATH)
            .parse()
            .unwrap();
        let direct = Direct::open(recording, &target, check_uri).await.unwrap();
        three_serving_checks(&Via::Direct(direct), &target).await;

        writes.assert_requests_whole(3);
    }
}

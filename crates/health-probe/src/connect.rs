//! Connecting the way `grpc_health_probe` does: connected means the server has spoken.
//!
//! grpc-go's blocking dial, which the original uses, returns only once the connection is
//! READY — TCP up, TLS done, and the server's HTTP/2 preface (its SETTINGS frame) received — so
//! a black-holed address (accepts TCP, never answers) fails to connect within
//! `-connect-timeout` (exit code 2) rather than failing the RPC (exit code 3). tonic's
//! `Endpoint::connect` returns as soon as TCP (and TLS) is up and the client preface is
//! written; health-layer's `probe::connect` waits for the server's SETTINGS too, but only for
//! plaintext endpoints (tonic does TLS above its connector, out of sight of the bytes).
//!
//! So this crate connects through its own connector: it dials TCP or a Unix socket, does TLS
//! itself (rustls, ALPN `h2`, `-tls-no-verify`'s own verifier, client certificates), and wraps
//! the stream in health-layer's frame watcher ([`health_layer::probe::frames`]), which sees the
//! HTTP/2 bytes in both cases: a SETTINGS frame header means connected; anything else, an early
//! close, or a read or write error means the connection failed. tonic gets a
//! plaintext-looking stream and an `https` origin for `:scheme`.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use endpoint_state::BoxError;
use endpoint_state::sync::lock;
use endpoint_state::writes::Coalesced;
use health_layer::probe::frames::{Hex, NotConnected, ServerFrames, Speaks, WatchedIo};
use health_layer::probe::{ProbeError, ProbeFailure};
use http::{HeaderValue, Uri};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::transport::{Channel, Endpoint};
use tower_service::Service;

use crate::target::{Kind, Target};
use crate::tls::TlsSetup;

/// How to reach targets: TLS or not, and the user agent.
#[derive(Debug, Clone)]
pub(crate) struct Dialer {
    pub(crate) tls: Option<TlsSetup>,
    pub(crate) user_agent: Option<HeaderValue>,
}

/// Connects to `target` and waits for the server's HTTP/2 preface, all within `limit`.
pub(crate) async fn connect(
    target: &Target,
    dialer: &Dialer,
    limit: Duration,
) -> Result<Channel, ProbeError> {
    let failed = |source: BoxError| {
        ProbeError::new(
            target.as_str(),
            ProbeFailure::Connect {
                timed_out: None,
                source: Some(source),
            },
        )
    };
    let authority = target.authority();
    let mut endpoint =
        Endpoint::from_shared(format!("http://{authority}")).map_err(|e| failed(Box::new(e)))?;
    if dialer.tls.is_some() {
        let origin: Uri = format!("https://{authority}")
            .parse()
            .map_err(|e: http::uri::InvalidUri| failed(Box::new(e)))?;
        endpoint = endpoint.origin(origin);
    }
    if let Some(user_agent) = &dialer.user_agent {
        endpoint = endpoint
            .user_agent(user_agent.clone())
            .map_err(|e| failed(Box::new(e)))?;
    }
    let connector = Connector {
        target: target.clone(),
        tls: dialer.tls.clone(),
        frames: ServerFrames::new(),
        open_failed: Arc::default(),
    };
    let (frames, open_failed) = (connector.frames.clone(), connector.open_failed.clone());
    let preface_failed = |e: Arc<NotConnected>| ConnectFailed::new(target, Stage::Preface(e));
    let attempt = async {
        let channel = match endpoint.connect_with_connector(connector).await {
            Ok(channel) => channel,
            Err(e) => {
                // Our connector's own error says more than tonic's "transport error".
                let ours = lock(&open_failed).clone();
                return Err(match (ours, frames.failure()) {
                    (Some(ours), _) => failed(Box::new(ours)),
                    (None, Some(preface)) => failed(Box::new(preface_failed(preface))),
                    (None, None) => failed(Box::new(e)),
                });
            }
        };
        match frames.preface().await {
            Ok(()) => Ok(channel),
            Err(e) => Err(failed(Box::new(preface_failed(e)))),
        }
    };
    match tokio::time::timeout(limit, attempt).await {
        Ok(result) => result,
        Err(_) => Err(ProbeError::new(
            target.as_str(),
            ProbeFailure::Connect {
                timed_out: Some(limit),
                source: None,
            },
        )),
    }
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}
type BoxIo = Box<dyn Io>;

#[derive(Clone)]
struct Connector {
    target: Target,
    tls: Option<TlsSetup>,
    /// What the server sends on each connection.
    frames: ServerFrames,
    /// Why the last connection could not be opened (dial, TLS), if it could not.
    open_failed: Arc<Mutex<Option<Arc<ConnectFailed>>>>,
}

impl Connector {
    async fn open(&self) -> Result<BoxIo, ConnectFailed> {
        let io: BoxIo = match self.target.kind() {
            Kind::Tcp { host, port } => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(|e| ConnectFailed::new(&self.target, Stage::Dial(e)))?;
                let _ = stream.set_nodelay(true);
                Box::new(stream)
            }
            #[cfg(unix)]
            Kind::Unix(path) => Box::new(
                tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|e| ConnectFailed::new(&self.target, Stage::Dial(e)))?,
            ),
            #[cfg(not(unix))]
            Kind::Unix(_) => {
                return Err(ConnectFailed::new(
                    &self.target,
                    Stage::Dial(io::Error::new(
                        io::ErrorKind::Unsupported,
                        "unix sockets are not supported on this platform",
                    )),
                ));
            }
        };
        let Some(tls) = &self.tls else {
            return Ok(io);
        };
        let name = tls
            .server_name_for(&self.target)
            .map_err(|e| ConnectFailed::new(&self.target, Stage::ServerName(e.to_string())))?;
        let stream = tokio_rustls::TlsConnector::from(Arc::clone(&tls.config))
            .connect(name, io)
            .await
            .map_err(|e| ConnectFailed::new(&self.target, Stage::Tls(e)))?;
        Ok(Box::new(stream))
    }
}

impl Service<Uri> for Connector {
    type Response = TokioIo<WatchedIo<Coalesced<BoxIo>>>;
    type Error = Arc<ConnectFailed>;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            match this.open().await {
                // Each request's HEADERS and DATA in one write (above TLS: plaintext frames).
                Ok(io) => Ok(TokioIo::new(this.frames.watch(Coalesced::new(io)))),
                Err(e) => {
                    let e = Arc::new(e);
                    *lock(&this.open_failed) = Some(Arc::clone(&e));
                    Err(e)
                }
            }
        })
    }
}

/// The connection to a target failed before the server had spoken HTTP/2: the dial, the TLS
/// handshake, or the server's first bytes. Kept as the `source` of the
/// [`ProbeError`]; a connection failure, exit code 2.
#[derive(Debug)]
pub struct ConnectFailed {
    target: String,
    stage: Stage,
}

#[derive(Debug)]
enum Stage {
    Dial(io::Error),
    ServerName(String),
    Tls(io::Error),
    /// Connected, but the server did not send its HTTP/2 preface.
    Preface(Arc<NotConnected>),
}

impl ConnectFailed {
    fn new(target: &Target, stage: Stage) -> Self {
        ConnectFailed {
            target: target.authority_for_errors(),
            stage,
        }
    }
}

/// What the first bytes look like, for a hint.
fn guess(first: &[u8]) -> &'static str {
    match Speaks::guess(first) {
        Some(Speaks::Tls) => "; it looks like a TLS server: try -tls",
        Some(Speaks::Http1) => "; it looks like an HTTP/1 server",
        None => "",
    }
}

impl fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.target;
        let preface = match &self.stage {
            Stage::Dial(e) => return write!(f, "dial {t}: {e}"),
            Stage::ServerName(e) => return write!(f, "no TLS server name for {t}: {e}"),
            Stage::Tls(e) => return write!(f, "tls handshake with {t}: {e}"),
            Stage::Preface(why) => why,
        };
        match &**preface {
            NotConnected::Read(e) => {
                write!(f, "reading the server's HTTP/2 settings from {t}: {e}")
            }
            NotConnected::Write(e) => write!(
                f,
                "{t} closed the connection before sending its HTTP/2 settings: {e}"
            ),
            NotConnected::Closed(first) if first.is_empty() => write!(
                f,
                "{t} closed the connection before sending its HTTP/2 settings"
            ),
            NotConnected::Closed(first) => write!(
                f,
                "{t} closed the connection after {} byte(s) that are not HTTP/2 ({}){}",
                first.len(),
                Hex(first),
                guess(first)
            ),
            NotConnected::NotHttp2(first) => write!(
                f,
                "{t} did not answer with HTTP/2 (first bytes: {}){}",
                Hex(first),
                guess(first)
            ),
        }
    }
}

impl Error for ConnectFailed {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match &self.stage {
            Stage::Dial(e) | Stage::Tls(e) => Some(e),
            Stage::Preface(why) => why.source(),
            Stage::ServerName(_) => None,
        }
    }
}

impl Target {
    /// `tcp 127.0.0.1:5000` or `unix /run/app.sock`, as in Go's dial errors.
    fn authority_for_errors(&self) -> String {
        match self.kind() {
            Kind::Tcp { .. } => format!("tcp {}", self.authority()),
            Kind::Unix(path) => format!("unix {}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// What the probe says of a connection whose server sent `server_sends`, then closed it.
    async fn said(server_sends: &[u8]) -> Option<String> {
        let target = Target::parse("h:1").unwrap();
        let (client, mut server) = tokio::io::duplex(64);
        let frames = ServerFrames::new();
        let mut watched = frames.watch(client);
        server.write_all(server_sends).await.unwrap();
        drop(server);
        let mut got = Vec::new();
        watched.read_to_end(&mut got).await.unwrap();
        let preface = frames.preface().await.err()?;
        Some(ConnectFailed::new(&target, Stage::Preface(preface)).to_string())
    }

    #[tokio::test]
    async fn the_servers_first_bytes_are_named_in_the_originals_words() {
        assert_eq!(said(&[0, 0, 0, 4, 0, 0, 0, 0, 0, 0xAA]).await, None);
        let text = said(b"HTTP/1.1 400 Bad Request\r\n").await.unwrap();
        assert!(
            text.starts_with("tcp h:1 did not answer with HTTP/2 (first bytes: 48 54 54 50"),
            "{text}"
        );
        assert!(text.ends_with("it looks like an HTTP/1 server"), "{text}");
        let text = said(&[0x15, 3, 3, 0, 2, 2, 0x32]).await.unwrap();
        assert_eq!(
            text,
            "tcp h:1 closed the connection after 7 byte(s) that are not HTTP/2 \
             (15 03 03 00 02 02 32); it looks like a TLS server: try -tls"
        );
        assert_eq!(
            said(&[]).await.unwrap(),
            "tcp h:1 closed the connection before sending its HTTP/2 settings"
        );
    }

    #[tokio::test]
    async fn a_write_failure_before_the_settings_is_named() {
        let target = Target::parse("h:1").unwrap();
        let (client, server) = tokio::io::duplex(64);
        let frames = ServerFrames::new();
        let mut watched = frames.watch(client);
        drop(server);
        assert!(watched.write_all(b"PRI * HTTP/2.0").await.is_err());
        let e = ConnectFailed::new(&target, Stage::Preface(frames.failure().unwrap()));
        assert!(
            e.to_string()
                .starts_with("tcp h:1 closed the connection before sending its HTTP/2 settings"),
            "{e}"
        );
    }
}

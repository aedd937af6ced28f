//! Connecting the way `grpc_health_probe` does: connected means the server has spoken.
//!
//! grpc-go's blocking dial, which the original uses, returns only once the connection is
//! READY — TCP up, TLS done, and the server's HTTP/2 preface (its SETTINGS frame) received.
//! tonic's `Endpoint::connect` (and so health-layer's `probe::connect`) returns as soon as TCP
//! (and TLS) is up and the client preface is written, so a black-holed address — accepts TCP,
//! never answers — would "connect" and then fail the RPC (exit code 3) instead of failing to
//! connect within `-connect-timeout` (exit code 2). So this crate connects through its own
//! connector, which watches the first bytes the server sends: a SETTINGS frame header means
//! connected; anything else, an early close or a read error means the connection failed.
//!
//! The connector also does TLS itself (rustls, ALPN `h2`), so that the watch sits on the
//! HTTP/2 bytes in both cases and so that `-tls-no-verify` can use its own verifier; tonic
//! gets a plaintext-looking stream and an `https` origin for `:scheme`.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use health_layer::probe::{ProbeError, ProbeFailure};
use http::{HeaderValue, Uri};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
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
    let failed = |source: Box<dyn Error + Send + Sync>| {
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
    let (preface, mut heard) = watch::channel(Preface::Waiting);
    let connector = Connector {
        target: target.clone(),
        tls: dialer.tls.clone(),
        preface: Arc::new(preface),
    };
    let attempt = async {
        let channel = match endpoint.connect_with_connector(connector).await {
            Ok(channel) => channel,
            Err(e) => {
                // Our connector's own error says more than tonic's "transport error".
                return Err(match &*heard.borrow() {
                    Preface::Failed(ours) => failed(Box::new(Arc::clone(ours))),
                    _ => failed(Box::new(e)),
                });
            }
        };
        let state = heard
            .wait_for(|p| !matches!(p, Preface::Waiting))
            .await
            .map(|p| p.clone());
        match state {
            Ok(Preface::Received) => Ok(channel),
            Ok(Preface::Failed(ours)) => Err(failed(Box::new(ours))),
            // The connection (and its watch) went away without a word.
            Ok(Preface::Waiting) | Err(_) => Err(failed(Box::new(ConnectFailed::new(
                target,
                Stage::Closed { first: Vec::new() },
            )))),
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

/// What the server has said so far.
#[derive(Debug, Clone)]
enum Preface {
    Waiting,
    Received,
    Failed(Arc<ConnectFailed>),
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}
type BoxIo = Box<dyn Io>;

#[derive(Clone)]
struct Connector {
    target: Target,
    tls: Option<TlsSetup>,
    preface: Arc<watch::Sender<Preface>>,
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
    type Response = TokioIo<PrefaceWatch<BoxIo>>;
    type Error = Arc<ConnectFailed>;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            match this.open().await {
                Ok(io) => Ok(TokioIo::new(PrefaceWatch::new(
                    io,
                    this.target.clone(),
                    Arc::clone(&this.preface),
                ))),
                Err(e) => {
                    let e = Arc::new(e);
                    this.preface.send_replace(Preface::Failed(Arc::clone(&e)));
                    Err(e)
                }
            }
        })
    }
}

/// Passes every byte through, and reports once what the server's first bytes were.
struct PrefaceWatch<T> {
    io: T,
    target: Target,
    header: Vec<u8>,
    report: Option<Arc<watch::Sender<Preface>>>,
}

/// An HTTP/2 frame header is 9 bytes; the server's first frame must be SETTINGS (RFC 9113
/// §3.4): type 0x4, no ACK flag, stream 0, a length that is a multiple of 6.
const FRAME_HEADER: usize = 9;

fn is_settings_frame(h: &[u8]) -> bool {
    let length = u32::from_be_bytes([0, h[0], h[1], h[2]]);
    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
    h[3] == 0x4 && h[4] & 0x1 == 0 && stream == 0 && length.is_multiple_of(6)
}

impl<T> PrefaceWatch<T> {
    fn new(io: T, target: Target, report: Arc<watch::Sender<Preface>>) -> Self {
        PrefaceWatch {
            io,
            target,
            header: Vec::with_capacity(FRAME_HEADER),
            report: Some(report),
        }
    }

    fn finish(&mut self, state: Preface) {
        if let Some(report) = self.report.take() {
            report.send_replace(state);
        }
    }

    fn saw(&mut self, result: &io::Result<()>, new: &[u8]) {
        match result {
            Err(e) => {
                let e = io::Error::new(e.kind(), e.to_string());
                let failure = ConnectFailed::new(&self.target, Stage::Read(e));
                self.finish(Preface::Failed(Arc::new(failure)));
            }
            Ok(()) if new.is_empty() => {
                let first = std::mem::take(&mut self.header);
                let failure = ConnectFailed::new(&self.target, Stage::Closed { first });
                self.finish(Preface::Failed(Arc::new(failure)));
            }
            Ok(()) => {
                let want = FRAME_HEADER - self.header.len();
                self.header.extend_from_slice(&new[..new.len().min(want)]);
                if self.header.len() == FRAME_HEADER {
                    if is_settings_frame(&self.header) {
                        self.finish(Preface::Received);
                    } else {
                        let first = std::mem::take(&mut self.header);
                        let failure = ConnectFailed::new(&self.target, Stage::NotHttp2 { first });
                        self.finish(Preface::Failed(Arc::new(failure)));
                    }
                }
            }
        }
    }
}

impl<T: AsyncRead + Unpin> PrefaceWatch<T> {
    /// A write failed before the server's preface: the server has closed the connection,
    /// perhaps after saying why (a TLS alert for a refused client certificate). Look once,
    /// without waiting, then report the write error if the read said nothing conclusive. The
    /// connection is dead either way, so taking its read interest away does no harm.
    fn write_failed(&mut self, e: &io::Error) {
        if self.report.is_none() {
            return;
        }
        let mut scratch = [0u8; FRAME_HEADER];
        let mut buf = ReadBuf::new(&mut scratch);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if let Poll::Ready(result) = Pin::new(&mut self.io).poll_read(&mut cx, &mut buf) {
            self.saw(&result, buf.filled());
        }
        if self.report.is_some() {
            let e = io::Error::new(e.kind(), e.to_string());
            let failure = ConnectFailed::new(&self.target, Stage::Write(e));
            self.finish(Preface::Failed(Arc::new(failure)));
        }
    }

    /// Reports a write-side error, passing the result on.
    fn check<R>(&mut self, polled: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if let Poll::Ready(Err(e)) = &polled {
            self.write_failed(e);
        }
        polled
    }
}

impl<T> Drop for PrefaceWatch<T> {
    /// Dropped before the server spoke: the connection is gone.
    fn drop(&mut self) {
        if self.report.is_some() {
            let first = std::mem::take(&mut self.header);
            let failure = ConnectFailed::new(&self.target, Stage::Closed { first });
            self.finish(Preface::Failed(Arc::new(failure)));
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for PrefaceWatch<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if this.report.is_some()
            && let Poll::Ready(result) = &polled
        {
            this.saw(result, &buf.filled()[before..]);
        }
        polled
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PrefaceWatch<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.check(polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.check(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.check(polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_shutdown(cx);
        this.check(polled)
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
    Read(io::Error),
    Write(io::Error),
    Closed { first: Vec<u8> },
    NotHttp2 { first: Vec<u8> },
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
    match first.first() {
        Some(0x15 | 0x16) => "; it looks like a TLS server: try -tls",
        _ if first.starts_with(b"HTTP/") => "; it looks like an HTTP/1 server",
        _ => "",
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

impl fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.target;
        match &self.stage {
            Stage::Dial(e) => write!(f, "dial {t}: {e}"),
            Stage::ServerName(e) => write!(f, "no TLS server name for {t}: {e}"),
            Stage::Tls(e) => write!(f, "tls handshake with {t}: {e}"),
            Stage::Read(e) => write!(f, "reading the server's HTTP/2 settings from {t}: {e}"),
            Stage::Write(e) => write!(
                f,
                "{t} closed the connection before sending its HTTP/2 settings: {e}"
            ),
            Stage::Closed { first } if first.is_empty() => write!(
                f,
                "{t} closed the connection before sending its HTTP/2 settings"
            ),
            Stage::Closed { first } => write!(
                f,
                "{t} closed the connection after {} byte(s) that are not HTTP/2 ({}){}",
                first.len(),
                hex(first),
                guess(first)
            ),
            Stage::NotHttp2 { first } => write!(
                f,
                "{t} did not answer with HTTP/2 (first bytes: {}){}",
                hex(first),
                guess(first)
            ),
        }
    }
}

impl Error for ConnectFailed {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match &self.stage {
            Stage::Dial(e) | Stage::Tls(e) | Stage::Read(e) | Stage::Write(e) => Some(e),
            _ => None,
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
    use super::*;

    #[test]
    fn recognises_a_server_settings_frame() {
        // An empty SETTINGS frame, and one with two settings.
        assert!(is_settings_frame(&[0, 0, 0, 4, 0, 0, 0, 0, 0]));
        assert!(is_settings_frame(&[0, 0, 12, 4, 0, 0, 0, 0, 0]));
        // A SETTINGS ACK, another frame type, a stream id, a bad length.
        assert!(!is_settings_frame(&[0, 0, 0, 4, 1, 0, 0, 0, 0]));
        assert!(!is_settings_frame(&[0, 0, 8, 6, 0, 0, 0, 0, 0]));
        assert!(!is_settings_frame(&[0, 0, 0, 4, 0, 0, 0, 0, 1]));
        assert!(!is_settings_frame(&[0, 0, 5, 4, 0, 0, 0, 0, 0]));
        // A TLS alert record and an HTTP/1 status line.
        assert!(!is_settings_frame(&[0x15, 3, 3, 0, 2, 2, 0x32, 0, 0]));
        assert!(!is_settings_frame(b"HTTP/1.1 "));
    }

    #[tokio::test]
    async fn the_watch_reports_settings_and_passes_bytes_through() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let target = Target::parse("h:1").unwrap();
        for (server_sends, expect_ok) in [
            (&[0u8, 0, 0, 4, 0, 0, 0, 0, 0, 0xAA][..], true),
            (&b"HTTP/1.1 400 Bad Request\r\n"[..], false),
            (&[0x15, 3, 3, 0, 2, 2, 0x32][..], false),
        ] {
            let (client, mut server) = tokio::io::duplex(64);
            let (tx, mut rx) = watch::channel(Preface::Waiting);
            let mut watched = PrefaceWatch::new(client, target.clone(), Arc::new(tx));
            // Byte by byte: the header is assembled across reads.
            for b in server_sends {
                server.write_all(&[*b]).await.unwrap();
            }
            drop(server);
            let mut got = Vec::new();
            watched.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, server_sends, "bytes pass through unchanged");
            let state = rx
                .wait_for(|p| !matches!(p, Preface::Waiting))
                .await
                .unwrap()
                .clone();
            match (state, expect_ok) {
                (Preface::Received, true) => {}
                (Preface::Failed(e), false) => {
                    let text = e.to_string();
                    assert!(text.starts_with("tcp h:1 "), "{text}");
                    if server_sends[0] == 0x15 {
                        assert!(
                            text.ends_with("it looks like a TLS server: try -tls"),
                            "{text}"
                        );
                    } else {
                        assert!(text.contains("did not answer with HTTP/2"), "{text}");
                        assert!(text.ends_with("it looks like an HTTP/1 server"), "{text}");
                    }
                }
                (other, _) => panic!("{server_sends:?}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_write_failure_or_a_drop_before_the_settings_is_a_failure() {
        use tokio::io::AsyncWriteExt;
        let target = Target::parse("h:1").unwrap();
        // The server went away before saying anything: the client's first write fails, and
        // hyper drops the connection without reading (seen with a TLS server that refused
        // the client certificate).
        let (client, server) = tokio::io::duplex(64);
        let (tx, rx) = watch::channel(Preface::Waiting);
        let mut watched = PrefaceWatch::new(client, target.clone(), Arc::new(tx));
        drop(server);
        assert!(watched.write_all(b"PRI * HTTP/2.0").await.is_err());
        assert!(
            matches!(&*rx.borrow(), Preface::Failed(_)),
            "reported at the write"
        );

        // Dropped while waiting, without any read or write error.
        let (client, _server) = tokio::io::duplex(64);
        let (tx, rx) = watch::channel(Preface::Waiting);
        let watched = PrefaceWatch::new(client, target, Arc::new(tx));
        drop(watched);
        let Preface::Failed(e) = rx.borrow().clone() else {
            panic!("not reported on drop")
        };
        assert!(
            e.to_string()
                .ends_with("before sending its HTTP/2 settings"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn an_early_close_is_a_failure() {
        use tokio::io::AsyncReadExt;
        let target = Target::parse("h:1").unwrap();
        let (client, server) = tokio::io::duplex(64);
        let (tx, rx) = watch::channel(Preface::Waiting);
        let mut watched = PrefaceWatch::new(client, target, Arc::new(tx));
        drop(server);
        let mut got = Vec::new();
        watched.read_to_end(&mut got).await.unwrap();
        let Preface::Failed(e) = rx.borrow().clone() else {
            panic!("not a failure")
        };
        assert_eq!(
            e.to_string(),
            "tcp h:1 closed the connection before sending its HTTP/2 settings"
        );
    }
}

//! Probe connections that know what the server said.
//!
//! tonic's `Endpoint::connect` returns once TCP is up and the client's preface is written, and
//! a connection the server then closes is reported to a call in flight as a broken pipe: the
//! server's `GOAWAY` — `NO_ERROR` for a max connection age or a graceful stop,
//! `ENHANCE_YOUR_CALM "too_many_pings"` for pings it does not accept (gRFC A8) — never reaches
//! the caller. So plaintext (`http://`) probe connections go through a connector that reads
//! the frame headers the server sends, as hyper reads them:
//!
//! * **connected** means the server has spoken HTTP/2 (its first frame is `SETTINGS`): an
//!   address that accepts TCP and never answers is a connection failure within the time
//!   allowed, and a port that answers HTTP/1 or TLS says so;
//! * the last `GOAWAY` the server sent is kept, so the checker can tell a connection closed
//!   for too many pings (double the keepalive) from any other.
//!
//! TLS endpoints (`https://`, encrypted by tonic above the connector) and endpoints of other
//! schemes are connected as tonic does, without these two. The connector applies the
//! endpoint's TCP settings (nodelay, keepalive, connect timeout); `Endpoint::local_address`
//! cannot be read back from tonic, so a probe connection does not bind it (give the checker a
//! [`connector`](crate::HealthConfig::connector) of your own if you need one).

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tower_service::Service;

use super::{ProbeError, ProbeFailure};
use crate::error::BoxError;

/// A `GOAWAY` frame the server sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GoAway {
    /// The last stream the server processed.
    pub(crate) last_stream_id: u32,
    /// The HTTP/2 error code (`0` `NO_ERROR`, `0xb` `ENHANCE_YOUR_CALM`, ...).
    pub(crate) code: u32,
    /// The debug data, as text (lossy; at most [`MAX_DEBUG`] bytes kept).
    pub(crate) debug: String,
}

/// The most debug data kept from a `GOAWAY`.
pub(crate) const MAX_DEBUG: usize = 256;

impl GoAway {
    /// `GOAWAY ENHANCE_YOUR_CALM "too_many_pings"`: the client pinged more often than the
    /// server allows (gRFC A8).
    pub(crate) fn is_too_many_pings(&self) -> bool {
        endpoint_state::transport::goaway_is_too_many_pings(self.code, self.debug.as_bytes())
    }

    fn code_name(&self) -> &'static str {
        match self.code {
            0x0 => "NO_ERROR",
            0x1 => "PROTOCOL_ERROR",
            0x2 => "INTERNAL_ERROR",
            0x7 => "REFUSED_STREAM",
            0x8 => "CANCEL",
            0xb => "ENHANCE_YOUR_CALM",
            _ => "error",
        }
    }
}

impl fmt::Display for GoAway {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GOAWAY {} (0x{:x})", self.code_name(), self.code)?;
        if !self.debug.is_empty() {
            write!(f, " {:?}", self.debug)?;
        }
        Ok(())
    }
}

/// What the server has sent on a probe connection: its preface, and its last `GOAWAY`.
/// Shared by the connection's reader and the checker; reset when the channel connects again.
#[derive(Clone, Debug)]
pub(crate) struct ServerFrames {
    inner: Arc<FramesInner>,
}

#[derive(Debug)]
struct FramesInner {
    preface: watch::Sender<Preface>,
    goaway: Mutex<Option<GoAway>>,
}

#[derive(Debug, Clone)]
enum Preface {
    Waiting,
    Received,
    Failed(Arc<NotConnected>),
}

impl ServerFrames {
    fn new() -> Self {
        ServerFrames {
            inner: Arc::new(FramesInner {
                preface: watch::channel(Preface::Waiting).0,
                goaway: Mutex::new(None),
            }),
        }
    }

    /// The last `GOAWAY` the server sent on this channel's connections, taken (each is
    /// handled once). Kept across tonic's own reconnections of the channel.
    pub(crate) fn take_goaway(&self) -> Option<GoAway> {
        lock(&self.inner.goaway).take()
    }

    #[cfg(test)]
    fn goaway(&self) -> Option<GoAway> {
        lock(&self.inner.goaway).clone()
    }

    fn reset(&self) {
        self.inner.preface.send_replace(Preface::Waiting);
    }

    fn settle(&self, preface: Preface) {
        self.inner.preface.send_if_modified(|now| {
            if matches!(now, Preface::Waiting) {
                *now = preface;
                true
            } else {
                false
            }
        });
    }

    /// Waits until the server has sent its preface, or failed to.
    async fn preface(&self) -> Result<(), Arc<NotConnected>> {
        let mut rx = self.inner.preface.subscribe();
        let seen = rx
            .wait_for(|p| !matches!(p, Preface::Waiting))
            .await
            .map(|p| p.clone());
        match seen {
            Ok(Preface::Received) => Ok(()),
            Ok(Preface::Failed(e)) => Err(e),
            Ok(Preface::Waiting) | Err(_) => Err(Arc::new(NotConnected::Closed(Vec::new()))),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why a connection is not a working HTTP/2 connection.
#[derive(Debug)]
pub(crate) enum NotConnected {
    /// Reading the server's first bytes failed.
    Read(io::Error),
    /// The server closed the connection before a frame (these bytes first).
    Closed(Vec<u8>),
    /// The server's first bytes are not an HTTP/2 `SETTINGS` frame.
    NotHttp2(Vec<u8>),
}

fn guess(first: &[u8]) -> &'static str {
    match first.first() {
        Some(0x15 | 0x16) => "; it looks like a TLS server (the endpoint is plaintext)",
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

impl fmt::Display for NotConnected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotConnected::Read(e) => write!(f, "reading the server's HTTP/2 settings: {e}"),
            NotConnected::Closed(first) if first.is_empty() => {
                f.write_str("the server closed the connection before sending its HTTP/2 settings")
            }
            NotConnected::Closed(first) | NotConnected::NotHttp2(first) => write!(
                f,
                "the server did not answer with HTTP/2 (first bytes: {}){}",
                hex(first),
                guess(first)
            ),
        }
    }
}

impl std::error::Error for NotConnected {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NotConnected::Read(e) => Some(e),
            _ => None,
        }
    }
}

/// A connected probe channel and, for a plaintext connection, what its server has sent.
#[derive(Clone, Debug)]
pub(crate) struct ProbeConn {
    pub(crate) channel: Channel,
    pub(crate) frames: Option<ServerFrames>,
}

impl ProbeConn {
    /// The last `GOAWAY` the server sent on this channel's connections and not yet taken,
    /// when it can be known (plaintext connections).
    pub(crate) fn take_goaway(&self) -> Option<GoAway> {
        self.frames.as_ref().and_then(ServerFrames::take_goaway)
    }
}

/// Connects `endpoint` now, by `deadline` (`limit` is how long that was, for the error).
/// Plaintext endpoints go through the frame-watching connector and count as connected once
/// the server's `SETTINGS` frame has arrived.
pub(crate) async fn connect_until(
    target: &Arc<str>,
    endpoint: &Endpoint,
    deadline: Instant,
    limit: Duration,
    connections: &Arc<AtomicU64>,
) -> Result<ProbeConn, ProbeError> {
    let failed = |source: BoxError| {
        ProbeError::new(
            target.clone(),
            ProbeFailure::Connect {
                timed_out: None,
                source: Some(source),
            },
        )
    };
    let attempt = async {
        if endpoint.uri().scheme_str() != Some("http") {
            connections.fetch_add(1, Ordering::Relaxed);
            let channel = endpoint.connect().await.map_err(|e| failed(Box::new(e)))?;
            return Ok(ProbeConn {
                channel,
                frames: None,
            });
        }
        let frames = ServerFrames::new();
        let connector = WatchingConnector::new(endpoint, frames.clone(), connections.clone());
        let channel = match endpoint.connect_with_connector(connector).await {
            Ok(channel) => channel,
            Err(e) => {
                // Our reader's own finding says more than tonic's "transport error".
                let ours = match &*frames.inner.preface.borrow() {
                    Preface::Failed(ours) => Some(ours.clone()),
                    _ => None,
                };
                return Err(match ours {
                    Some(ours) => failed(Box::new(ArcError(ours))),
                    None => failed(Box::new(e)),
                });
            }
        };
        frames
            .preface()
            .await
            .map_err(|e| failed(Box::new(ArcError(e))))?;
        Ok(ProbeConn {
            channel,
            frames: Some(frames),
        })
    };
    match tokio::time::timeout_at(deadline, attempt).await {
        Ok(result) => result,
        Err(_) => Err(ProbeError::new(
            target.clone(),
            ProbeFailure::Connect {
                timed_out: Some(limit),
                source: None,
            },
        )),
    }
}

/// An `Arc`'d error as an error (its `Display` and `source` are the inner one's).
#[derive(Debug)]
struct ArcError(Arc<NotConnected>);

impl fmt::Display for ArcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ArcError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
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
}

impl WatchingConnector {
    fn new(endpoint: &Endpoint, frames: ServerFrames, connections: Arc<AtomicU64>) -> Self {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(endpoint.get_tcp_nodelay());
        http.set_keepalive(endpoint.get_tcp_keepalive());
        http.set_keepalive_interval(endpoint.get_tcp_keepalive_interval());
        http.set_keepalive_retries(endpoint.get_tcp_keepalive_retries());
        http.set_connect_timeout(endpoint.get_connect_timeout());
        WatchingConnector {
            http,
            frames,
            connections,
        }
    }
}

impl Service<Uri> for WatchingConnector {
    type Response = TokioIo<Watched<TcpStream>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        self.connections.fetch_add(1, Ordering::Relaxed);
        let connecting = self.http.call(uri);
        let frames = self.frames.clone();
        Box::pin(async move {
            let io = connecting.await?;
            // A new connection of the same channel: its preface is to come.
            frames.reset();
            Ok(TokioIo::new(Watched::new(io.into_inner(), frames)))
        })
    }
}

/// An IO whose reads are parsed into HTTP/2 frame headers (payloads are skipped, except a
/// `GOAWAY`'s), reporting the preface and `GOAWAY`s to its [`ServerFrames`]. Writes pass
/// through.
pub(crate) struct Watched<T> {
    io: T,
    frames: ServerFrames,
    parser: Parser,
}

impl<T> Watched<T> {
    fn new(io: T, frames: ServerFrames) -> Self {
        Watched {
            io,
            frames,
            parser: Parser::default(),
        }
    }
}

const FRAME_HEADER: usize = 9;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;

/// Where the reader is in the server's byte stream.
#[derive(Default)]
struct Parser {
    header: [u8; FRAME_HEADER],
    have: usize,
    /// Payload bytes of the current frame still to come.
    skip: u32,
    /// The current frame is a `GOAWAY`: its payload, as far as kept.
    goaway: Option<Vec<u8>>,
    /// The first frame has been seen.
    started: bool,
    /// The stream is not HTTP/2: stop parsing.
    dead: bool,
}

impl Parser {
    fn feed(&mut self, mut bytes: &[u8], frames: &ServerFrames) {
        while !bytes.is_empty() && !self.dead {
            if self.skip > 0 {
                let n = (self.skip as usize).min(bytes.len());
                if let Some(payload) = &mut self.goaway {
                    let room = (8 + MAX_DEBUG).saturating_sub(payload.len());
                    payload.extend_from_slice(&bytes[..n.min(room)]);
                }
                self.skip -= n as u32;
                bytes = &bytes[n..];
                if self.skip == 0 {
                    self.end_frame(frames);
                }
                continue;
            }
            let n = (FRAME_HEADER - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have < FRAME_HEADER {
                continue;
            }
            self.have = 0;
            let h = self.header;
            let length = u32::from_be_bytes([0, h[0], h[1], h[2]]);
            let kind = h[3];
            if !self.started {
                self.started = true;
                let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                let settings =
                    kind == SETTINGS && h[4] & 0x1 == 0 && stream == 0 && length.is_multiple_of(6);
                if !settings {
                    self.dead = true;
                    frames.settle(Preface::Failed(Arc::new(NotConnected::NotHttp2(
                        h.to_vec(),
                    ))));
                    return;
                }
                frames.settle(Preface::Received);
            }
            self.goaway = (kind == GOAWAY).then(Vec::new);
            self.skip = length;
            if length == 0 {
                self.end_frame(frames);
            }
        }
    }

    fn end_frame(&mut self, frames: &ServerFrames) {
        let Some(payload) = self.goaway.take() else {
            return;
        };
        if payload.len() < 8 {
            return;
        }
        let last_stream_id =
            u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
        let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
        let debug = String::from_utf8_lossy(&payload[8..]).into_owned();
        let goaway = GoAway {
            last_stream_id,
            code,
            debug,
        };
        tracing::debug!(%goaway, "health probe connection: the server sent GOAWAY");
        *lock(&frames.inner.goaway) = Some(goaway);
    }

    /// The server's bytes ended (or could not be read) before its first frame.
    fn ended(&mut self, frames: &ServerFrames, result: &io::Result<()>) {
        if self.started || self.dead {
            return;
        }
        self.dead = true;
        let why = match result {
            Err(e) => NotConnected::Read(io::Error::new(e.kind(), e.to_string())),
            Ok(()) => NotConnected::Closed(self.header[..self.have].to_vec()),
        };
        frames.settle(Preface::Failed(Arc::new(why)));
    }
}

impl<T> Drop for Watched<T> {
    fn drop(&mut self) {
        if !self.parser.started && !self.parser.dead {
            self.parser.ended(&self.frames, &Ok(()));
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(result) = &polled {
            let new = &buf.filled()[before..];
            if result.is_err() || new.is_empty() {
                this.parser.ended(&this.frames, result);
            } else {
                this.parser.feed(new, &this.frames);
            }
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut out = len.to_be_bytes()[1..].to_vec();
        out.push(kind);
        out.push(flags);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn goaway(code: u32, debug: &str) -> Vec<u8> {
        let mut payload = 7u32.to_be_bytes().to_vec();
        payload.extend_from_slice(&code.to_be_bytes());
        payload.extend_from_slice(debug.as_bytes());
        frame(GOAWAY, 0, 0, &payload)
    }

    fn state(frames: &ServerFrames) -> &'static str {
        match &*frames.inner.preface.borrow() {
            Preface::Waiting => "waiting",
            Preface::Received => "received",
            Preface::Failed(_) => "failed",
        }
    }

    #[test]
    fn settings_first_then_a_goaway_read_byte_by_byte() {
        let frames = ServerFrames::new();
        let mut parser = Parser::default();
        let mut bytes = frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]);
        bytes.extend(frame(0x1, 0x4, 1, b"headers"));
        bytes.extend(frame(0x0, 0x0, 1, &[0u8; 1000]));
        bytes.extend(goaway(0xb, "too_many_pings"));
        for b in &bytes {
            parser.feed(std::slice::from_ref(b), &frames);
        }
        assert_eq!(state(&frames), "received");
        let g = frames.goaway().unwrap();
        assert!(g.is_too_many_pings(), "{g}");
        assert_eq!(g.last_stream_id, 7);
        assert_eq!(
            g.to_string(),
            "GOAWAY ENHANCE_YOUR_CALM (0xb) \"too_many_pings\""
        );
    }

    #[test]
    fn a_graceful_goaway_is_not_too_many_pings() {
        let frames = ServerFrames::new();
        let mut parser = Parser::default();
        let mut bytes = frame(SETTINGS, 0, 0, &[]);
        bytes.extend(goaway(0, "max_age"));
        parser.feed(&bytes, &frames);
        let g = frames.goaway().unwrap();
        assert!(!g.is_too_many_pings());
        assert_eq!(g.to_string(), "GOAWAY NO_ERROR (0x0) \"max_age\"");
    }

    #[test]
    fn http1_and_tls_answers_are_named() {
        let frames = ServerFrames::new();
        Parser::default().feed(b"HTTP/1.1 400 Bad Request\r\n", &frames);
        let Preface::Failed(e) = frames.inner.preface.borrow().clone() else {
            panic!("not failed");
        };
        assert!(
            e.to_string().ends_with("it looks like an HTTP/1 server"),
            "{e}"
        );

        let frames = ServerFrames::new();
        Parser::default().feed(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46, 0, 0], &frames);
        let Preface::Failed(e) = frames.inner.preface.borrow().clone() else {
            panic!("not failed");
        };
        assert!(e.to_string().contains("TLS server"), "{e}");
    }

    #[test]
    fn an_early_close_is_a_failure_and_a_huge_debug_is_cut() {
        let frames = ServerFrames::new();
        let mut parser = Parser::default();
        parser.ended(&frames, &Ok(()));
        assert_eq!(state(&frames), "failed");

        let frames = ServerFrames::new();
        let mut parser = Parser::default();
        let mut bytes = frame(SETTINGS, 0, 0, &[]);
        bytes.extend(goaway(2, &"x".repeat(10_000)));
        parser.feed(&bytes, &frames);
        assert_eq!(frames.goaway().unwrap().debug.len(), MAX_DEBUG);
    }
}

//! What a server says on an HTTP/2 connection before and between calls, read off the wire.
//!
//! tonic's `Endpoint::connect` returns once TCP (and TLS) is up and the client's preface is
//! written, and a connection the server then closes is reported to a call in flight as a broken
//! pipe: the server's `GOAWAY` never reaches the caller. A [`WatchedIo`] wraps a connection's
//! IO and parses the frame headers the server sends, as hyper reads them (payloads are skipped,
//! except a `GOAWAY`'s), reporting to its [`ServerFrames`]:
//!
//! * the **preface**: the server's first frame must be `SETTINGS` (RFC 9113 §3.4). Until it
//!   has come the connection is not connected: an address that accepts TCP and never answers
//!   is a connection failure, and a port that answers HTTP/1 or TLS says so ([`NotConnected`]);
//! * the last **`GOAWAY`**, so that the checker can tell a connection closed for too many pings
//!   (gRFC A8) from any other.
//!
//! The checker's plaintext probe connections are watched this way, and so are the command-line
//! probe's (`health-probe`, which does TLS itself and wraps its TLS stream):
//!
//! ```
//! use health_layer::probe::frames::ServerFrames;
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let (client, mut server) = tokio::io::duplex(64);
//! let frames = ServerFrames::new();
//! let mut io = frames.watch(client);
//! server.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap(); // an empty SETTINGS frame
//! let mut header = [0u8; 9];
//! io.read_exact(&mut header).await.unwrap(); // bytes pass through unchanged
//! assert!(frames.preface().await.is_ok());
//! # }
//! ```

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use endpoint_state::sync::lock;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

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

/// What the server has sent on a watched connection: its preface, and its last `GOAWAY`.
/// Shared (cheap to clone) by the connection's reader and whoever waits for the preface; a
/// channel that connects again watches its new connection with the same one
/// ([`watch`](Self::watch) starts the wait for the new preface).
#[derive(Clone, Debug)]
pub struct ServerFrames {
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

impl Default for ServerFrames {
    fn default() -> Self {
        ServerFrames::new()
    }
}

impl ServerFrames {
    /// Nothing heard yet.
    pub fn new() -> Self {
        ServerFrames {
            inner: Arc::new(FramesInner {
                preface: watch::channel(Preface::Waiting).0,
                goaway: Mutex::new(None),
            }),
        }
    }

    /// Watches a new connection: its server's preface is now awaited, and every byte read from
    /// `io` is parsed into frame headers. Writes pass through.
    pub fn watch<T>(&self, io: T) -> WatchedIo<T> {
        self.inner.preface.send_replace(Preface::Waiting);
        WatchedIo {
            io,
            frames: self.clone(),
            parser: Parser::default(),
        }
    }

    /// Waits until the server of the connection watched last has sent its preface (`Ok`), or
    /// has failed to (why).
    pub async fn preface(&self) -> Result<(), Arc<NotConnected>> {
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

    /// Why the connection watched last failed before its server's preface, if it has (no
    /// waiting).
    pub fn failure(&self) -> Option<Arc<NotConnected>> {
        match &*self.inner.preface.borrow() {
            Preface::Failed(e) => Some(e.clone()),
            _ => None,
        }
    }

    /// The last `GOAWAY` the server sent on the watched connections, taken (each is handled
    /// once). Kept across new connections.
    pub(crate) fn take_goaway(&self) -> Option<GoAway> {
        lock(&self.inner.goaway).take()
    }

    #[cfg(test)]
    fn goaway(&self) -> Option<GoAway> {
        lock(&self.inner.goaway).clone()
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

    fn settled(&self) -> bool {
        !matches!(*self.inner.preface.borrow(), Preface::Waiting)
    }
}

/// Why a connection is not a working HTTP/2 connection: its server did not send its preface.
#[derive(Debug)]
pub enum NotConnected {
    /// Reading the server's first bytes failed.
    Read(io::Error),
    /// Writing to the server failed before it had sent anything conclusive: it closed the
    /// connection (perhaps after saying why, as a TLS server that refuses a client certificate
    /// does).
    Write(io::Error),
    /// The server closed the connection before a whole frame (these bytes first).
    Closed(Vec<u8>),
    /// The server's first frame header (these bytes) is not an HTTP/2 `SETTINGS` frame.
    NotHttp2(Vec<u8>),
}

impl NotConnected {
    /// The server's first bytes, as far as they came (empty for read and write errors).
    pub fn first_bytes(&self) -> &[u8] {
        match self {
            NotConnected::Closed(first) | NotConnected::NotHttp2(first) => first,
            NotConnected::Read(_) | NotConnected::Write(_) => &[],
        }
    }
}

/// What a server seems to speak, judging by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speaks {
    /// A TLS record (an alert or a handshake): a TLS server, to a plaintext client.
    Tls,
    /// An HTTP/1 status line.
    Http1,
}

impl Speaks {
    /// What `first` (a server's first bytes) looks like, when it is recognisable.
    pub fn guess(first: &[u8]) -> Option<Speaks> {
        match first.first() {
            Some(0x15 | 0x16) => Some(Speaks::Tls),
            _ if first.starts_with(b"HTTP/") => Some(Speaks::Http1),
            _ => None,
        }
    }
}

/// Bytes in hex pairs (`15 03 03`), for an error message.
#[derive(Debug, Clone, Copy)]
pub struct Hex<'a>(pub &'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

fn hint(first: &[u8]) -> &'static str {
    match Speaks::guess(first) {
        Some(Speaks::Tls) => "; it looks like a TLS server (the endpoint is plaintext)",
        Some(Speaks::Http1) => "; it looks like an HTTP/1 server",
        None => "",
    }
}

impl fmt::Display for NotConnected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotConnected::Read(e) => write!(f, "reading the server's HTTP/2 settings: {e}"),
            NotConnected::Write(e) => write!(
                f,
                "the server closed the connection before sending its HTTP/2 settings: {e}"
            ),
            NotConnected::Closed(first) if first.is_empty() => {
                f.write_str("the server closed the connection before sending its HTTP/2 settings")
            }
            NotConnected::Closed(first) | NotConnected::NotHttp2(first) => write!(
                f,
                "the server did not answer with HTTP/2 (first bytes: {}){}",
                Hex(first),
                hint(first)
            ),
        }
    }
}

impl std::error::Error for NotConnected {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NotConnected::Read(e) | NotConnected::Write(e) => Some(e),
            _ => None,
        }
    }
}

/// An IO whose reads are parsed into HTTP/2 frame headers, reporting the server's preface and
/// `GOAWAY`s to its [`ServerFrames`] (made by [`ServerFrames::watch`]). Bytes pass through
/// unchanged both ways.
pub struct WatchedIo<T> {
    io: T,
    frames: ServerFrames,
    parser: Parser,
}

impl<T> fmt::Debug for WatchedIo<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchedIo")
            .field("frames", &self.frames)
            .finish_non_exhaustive()
    }
}

impl<T> WatchedIo<T> {
    /// The inner IO.
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// The inner IO, mutably (bytes read through it are not watched).
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.io
    }
}

const FRAME_HEADER: usize = 9;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;

/// Whether a 9-byte frame header is a server's first `SETTINGS` frame (RFC 9113 §3.4): type
/// 0x4, no ACK flag, stream 0, a length that is a multiple of 6.
fn is_settings_frame(h: &[u8; FRAME_HEADER]) -> bool {
    let length = u32::from_be_bytes([0, h[0], h[1], h[2]]);
    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
    h[3] == SETTINGS && h[4] & 0x1 == 0 && stream == 0 && length.is_multiple_of(6)
}

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
            if !self.started {
                self.started = true;
                if !is_settings_frame(&h) {
                    self.dead = true;
                    frames.settle(Preface::Failed(Arc::new(NotConnected::NotHttp2(
                        h.to_vec(),
                    ))));
                    return;
                }
                frames.settle(Preface::Received);
            }
            self.goaway = (h[3] == GOAWAY).then(Vec::new);
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
        tracing::debug!(%goaway, "watched connection: the server sent GOAWAY");
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

    /// What a read delivered (`new`, the bytes it added).
    fn read(&mut self, frames: &ServerFrames, result: &io::Result<()>, new: &[u8]) {
        if result.is_err() || new.is_empty() {
            self.ended(frames, result);
        } else {
            self.feed(new, frames);
        }
    }

    /// Still waiting for the server's first frame.
    fn waiting(&self) -> bool {
        !self.started && !self.dead
    }
}

impl<T> Drop for WatchedIo<T> {
    /// Dropped before the server spoke: the connection is gone.
    fn drop(&mut self) {
        if self.parser.waiting() {
            self.parser.ended(&self.frames, &Ok(()));
        }
    }
}

impl<T: AsyncRead + Unpin> WatchedIo<T> {
    /// A write failed before the server's preface: the server has closed the connection,
    /// perhaps after saying why (a TLS alert for a refused client certificate). Look once,
    /// without waiting, then report the write error if the read said nothing conclusive. The
    /// connection is dead either way, so taking its read interest away does no harm.
    fn write_failed(&mut self, e: &io::Error) {
        if !self.parser.waiting() || self.frames.settled() {
            return;
        }
        let mut scratch = [0u8; FRAME_HEADER];
        let mut buf = ReadBuf::new(&mut scratch);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if let Poll::Ready(result) = Pin::new(&mut self.io).poll_read(&mut cx, &mut buf) {
            self.parser.read(&self.frames, &result, buf.filled());
        }
        if self.parser.waiting() {
            self.parser.dead = true;
            let e = io::Error::new(e.kind(), e.to_string());
            self.frames
                .settle(Preface::Failed(Arc::new(NotConnected::Write(e))));
        }
    }

    /// Reports a write-side error, passing the result on.
    fn wrote<R>(&mut self, polled: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if let Poll::Ready(Err(e)) = &polled {
            self.write_failed(e);
        }
        polled
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WatchedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(result) = &polled {
            this.parser
                .read(&this.frames, result, &buf.filled()[before..]);
        }
        polled
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WatchedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.wrote(polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.wrote(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.wrote(polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_shutdown(cx);
        this.wrote(polled)
    }
}

#[cfg(test)]
mod tests;

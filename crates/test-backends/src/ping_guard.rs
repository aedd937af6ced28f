//! [`PingGuard`]: an HTTP/2 frame-aware TCP proxy that puts a gRPC server's ping policy
//! (gRFC A8, "too_many_pings") in front of any upstream and records every client PING.
//!
//! Each direction of a proxied connection is cut into whole HTTP/2 frames (client to server after
//! the 24-byte connection preface, server to client from the first byte) and forwarded frame by
//! frame, so that the proxy can put its own `GOAWAY` between two server frames.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::conn;

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Length of a frame header.
const HEADER_LEN: usize = 9;
/// Largest frame (header included) the proxy buffers; a longer one closes the connection. Each
/// direction therefore holds at most this much plus one read chunk.
const MAX_FRAME_LEN: usize = 16 * 1024 * 1024;
/// Smallest read: bytes reserved for one read from a socket.
const READ_CHUNK: usize = 16 * 1024;
/// Open streams tracked per connection; a client opening more closes the connection.
const MAX_TRACKED_STREAMS: usize = 10_000;
/// Entries kept by [`PingGuard::ping_log`]; the oldest are dropped beyond it.
const PING_LOG_CAPACITY: usize = 100_000;
/// The interval a server requires between pings when no call is open and pings without calls
/// are not permitted: two hours, as gRPC C-core and grpc-go (i.e. every such ping but the first
/// is a strike).
const IDLE_MIN_INTERVAL: Duration = Duration::from_secs(2 * 60 * 60);
/// How long the upstream connect may take before the client connection is dropped.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// After a GOAWAY, how long the proxy reads (and discards) what the client still sends while
/// waiting for it to close, so that closing does not reset the connection under the GOAWAY.
const GOAWAY_LINGER: Duration = Duration::from_secs(1);

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
/// `END_STREAM` on DATA and HEADERS, `ACK` on PING.
const FLAG_END_STREAM_OR_ACK: u8 = 0x1;
/// `ENHANCE_YOUR_CALM`.
const ENHANCE_YOUR_CALM: u32 = 0xb;
/// Debug data of the GOAWAY, as gRPC servers send it.
const TOO_MANY_PINGS: &[u8] = b"too_many_pings";

/// A gRPC server's policy on client PINGs (gRFC A8; C-core's
/// `GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS`, `GRPC_ARG_HTTP2_MAX_PING_STRIKES`,
/// `GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS`; grpc-go's `EnforcementPolicy`).
///
/// A client PING (without `ACK`) is a **strike** when it comes less than the allowed interval
/// after the previous client PING on the same connection. The allowed interval is
/// [`min_interval`](Self::min_interval) while a call is open (or when
/// [`permit_without_calls`](Self::permit_without_calls)), and two hours otherwise. Every
/// HEADERS or DATA frame the server sends resets the count: strikes go back to zero and the next
/// PING is not judged against the one before (C-core's "ping without data" reset, which grpc-go
/// also does). When the strikes exceed [`max_strikes`](Self::max_strikes), the client is sent
/// `GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings")` and the connection is closed. Every other
/// PING, strike or not, is forwarded (and answered by the server).
///
/// The default is gRPC's: 5 minutes, 2 strikes, no pings without calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PingPolicy {
    /// The shortest interval between two client PINGs, with no server HEADERS or DATA between
    /// them, that is not a strike.
    pub min_interval: Duration,
    /// Strikes tolerated on a connection: the strike that makes the count exceed it is punished,
    /// so `0` punishes the first one, `2` the third (grpc-go's meaning; C-core reads `0` as "no
    /// limit", which this policy does not offer).
    pub max_strikes: u32,
    /// Whether PINGs are judged against `min_interval` also when no call is open. When `false`,
    /// with no call open, every PING after the first is a strike (allowed interval: two hours).
    pub permit_without_calls: bool,
}

impl Default for PingPolicy {
    fn default() -> Self {
        Self {
            min_interval: Duration::from_secs(5 * 60),
            max_strikes: 2,
            permit_without_calls: false,
        }
    }
}

/// A TCP proxy on `127.0.0.1` in front of an HTTP/2 (gRPC, cleartext) upstream that enforces a
/// [`PingPolicy`] the way gRPC servers do and records every client PING.
///
/// Each accepted client connection gets its own upstream connection. Bytes are forwarded as
/// whole HTTP/2 frames in both directions; the proxy only watches HEADERS, DATA, RST_STREAM,
/// PING and GOAWAY frames (to track open streams and judge pings) and adds a frame of its own
/// only when a client exceeds the policy: `GOAWAY` (stream 0, last stream id = the highest
/// client stream id forwarded, `ENHANCE_YOUR_CALM`, debug data `too_many_pings`). It then
/// closes both sockets: the upstream at once, the client's by a FIN after the GOAWAY, waiting up
/// to one second for the client to close its side.
///
/// A frame longer than 16 MiB, a client that does not start with the HTTP/2 preface, or more
/// than 10 000 open streams on one connection close that connection.
///
/// Cheap to clone: all clones observe and control the same proxy. The proxy stops (listener
/// and every connection closed) on [`stop`](Self::stop) or when the last clone is dropped.
#[derive(Clone)]
pub struct PingGuard {
    inner: Arc<Inner>,
}

struct Inner {
    addr: SocketAddr,
    upstream: SocketAddr,
    policy: PingPolicy,
    stats: Arc<Stats>,
    stop: CancellationToken,
    /// The accept task; `None` once [`PingGuard::stop`] took it.
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Counters shared by the handle and every connection.
#[derive(Debug, Default)]
struct Stats {
    connections_accepted: AtomicU64,
    open_connections: AtomicU64,
    pings: AtomicU64,
    strikes: AtomicU64,
    goaways_sent: AtomicU64,
    ping_log: Mutex<VecDeque<(u64, Instant)>>,
}

impl fmt::Debug for PingGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PingGuard")
            .field("addr", &self.inner.addr)
            .field("upstream", &self.inner.upstream)
            .field("policy", &self.inner.policy)
            .field("connections_accepted", &self.connections_accepted())
            .field("open_connections", &self.open_connections())
            .field("pings", &self.pings())
            .field("goaways_sent", &self.goaways_sent())
            .finish_non_exhaustive()
    }
}

impl PingGuard {
    /// Starts a proxy on `127.0.0.1` on a free port, forwarding every connection to `upstream`
    /// under `policy`. Returns once it is accepting.
    pub async fn start(upstream: SocketAddr, policy: PingPolicy) -> io::Result<Self> {
        let listener = conn::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(Stats::default());
        let stop = CancellationToken::new();
        let task = tokio::spawn(accept(
            listener,
            upstream,
            policy,
            Arc::clone(&stats),
            stop.clone(),
        ));
        tracing::debug!(%addr, %upstream, ?policy, "ping guard listening");
        Ok(Self {
            inner: Arc::new(Inner {
                addr,
                upstream,
                policy,
                stats,
                stop,
                task: Mutex::new(Some(task)),
            }),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// `http://127.0.0.1:PORT`, ready for `tonic::transport::Endpoint::from_shared`.
    pub fn uri(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// The address every connection is forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.inner.upstream
    }

    /// The policy it enforces.
    pub fn policy(&self) -> PingPolicy {
        self.inner.policy
    }

    /// Client connections accepted since start. Connections are numbered from 0 in this order
    /// (the index in [`ping_log`](Self::ping_log)).
    pub fn connections_accepted(&self) -> u64 {
        self.inner
            .stats
            .connections_accepted
            .load(Ordering::Relaxed)
    }

    /// Client connections open now.
    pub fn open_connections(&self) -> u64 {
        self.inner.stats.open_connections.load(Ordering::Relaxed)
    }

    /// PINGs (without `ACK`) received from clients, on every connection, punished or not.
    pub fn pings(&self) -> u64 {
        self.inner.stats.pings.load(Ordering::Relaxed)
    }

    /// Strikes counted, on every connection (see [`PingPolicy`]), including the ones punished.
    pub fn strikes(&self) -> u64 {
        self.inner.stats.strikes.load(Ordering::Relaxed)
    }

    /// Every client PING (without `ACK`): the connection's index and when the proxy read it,
    /// oldest first (the last 100 000).
    pub fn ping_log(&self) -> Vec<(u64, Instant)> {
        lock(&self.inner.stats.ping_log).iter().copied().collect()
    }

    /// `GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings")` frames written (and flushed) to clients.
    pub fn goaways_sent(&self) -> u64 {
        self.inner.stats.goaways_sent.load(Ordering::Relaxed)
    }

    /// Closes the listener and every connection (abruptly, without GOAWAY); returns once they
    /// are closed. Does nothing the second time.
    pub async fn stop(&self) {
        self.inner.stop.cancel();
        let task = lock(&self.inner.task).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// Short, never-across-await locks; a panic elsewhere must not poison the test double.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Accepts until `stop`, one task per connection; then waits for every connection to close.
async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    policy: PingPolicy,
    stats: Arc<Stats>,
    stop: CancellationToken,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            // Reaps finished connections so that the set only holds open ones.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((client, _peer)) => {
                    let index = stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
                    let conn = Conn::new(index, policy, Arc::clone(&stats), stop.clone());
                    connections.spawn(conn.run(client, upstream));
                }
                // E.g. out of file descriptors: back off rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// One proxied connection.
struct Conn {
    index: u64,
    policy: PingPolicy,
    stats: Arc<Stats>,
    state: Mutex<Streams>,
    /// The whole proxy stops.
    stop: CancellationToken,
    /// This connection is closed at once (an I/O or protocol error on either side).
    abort: CancellationToken,
    /// The client exceeded the policy: the server-to-client side writes the GOAWAY.
    goaway: CancellationToken,
    /// The server-to-client side has ended (after its GOAWAY, if any).
    server_side_done: CancellationToken,
}

/// How the client-to-server side ended on its own.
enum ClientEnd {
    /// The client closed its side; the upstream was sent a FIN.
    Eof,
    /// The client exceeded the policy.
    GoAway,
}

/// How the server-to-client side ended on its own.
enum ServerEnd {
    /// The upstream closed its side; the client was sent a FIN.
    Eof,
    /// The GOAWAY was written and flushed, then the client was sent a FIN.
    GoAway,
}

impl Conn {
    fn new(index: u64, policy: PingPolicy, stats: Arc<Stats>, stop: CancellationToken) -> Self {
        Self {
            index,
            policy,
            stats,
            state: Mutex::new(Streams::default()),
            stop,
            abort: CancellationToken::new(),
            goaway: CancellationToken::new(),
            server_side_done: CancellationToken::new(),
        }
    }

    async fn run(self, client: TcpStream, upstream: SocketAddr) {
        let _open = OpenConnection::new(&self.stats);
        let connect = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(upstream));
        let upstream = match self.cut(connect).await {
            Some(Ok(Ok(upstream))) => upstream,
            Some(Ok(Err(error))) => {
                tracing::debug!(connection = self.index, %error, "ping guard: upstream refused");
                return;
            }
            Some(Err(_elapsed)) => {
                tracing::debug!(
                    connection = self.index,
                    "ping guard: upstream connect timeout"
                );
                return;
            }
            None => return,
        };
        // Best effort: latency matters more than throughput for a test double.
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let (client_r, client_w) = client.into_split();
        let (upstream_r, upstream_w) = upstream.into_split();
        tokio::join!(
            self.client_side(client_r, upstream_w),
            self.server_side(upstream_r, client_w),
        );
        tracing::debug!(connection = self.index, "ping guard: connection closed");
    }

    /// Runs `f` until the connection is aborted or the proxy stopped (then `None`).
    async fn cut<F: Future>(&self, f: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            () = self.stop.cancelled() => None,
            () = self.abort.cancelled() => None,
            out = f => Some(out),
        }
    }

    fn fail(&self, side: &str, error: &io::Error) {
        tracing::debug!(connection = self.index, side, %error, "ping guard: closing connection");
        self.abort.cancel();
    }

    async fn client_side(&self, mut client_r: OwnedReadHalf, upstream_w: OwnedWriteHalf) {
        match self
            .cut(self.client_to_server(&mut client_r, upstream_w))
            .await
        {
            Some(Ok(ClientEnd::GoAway)) => {
                // The upstream is closed (its writer dropped); let the GOAWAY go out first, then
                // wait for the client to close rather than reset the connection under it.
                if self.cut(self.server_side_done.cancelled()).await.is_some() {
                    let _ = self.cut(drain(&mut client_r)).await;
                }
            }
            Some(Ok(ClientEnd::Eof)) | None => {}
            Some(Err(error)) => self.fail("client", &error),
        }
    }

    async fn server_side(&self, mut upstream_r: OwnedReadHalf, mut client_w: OwnedWriteHalf) {
        match self
            .cut(self.server_to_client(&mut upstream_r, &mut client_w))
            .await
        {
            Some(Ok(ServerEnd::GoAway | ServerEnd::Eof)) | None => {}
            Some(Err(error)) => self.fail("server", &error),
        }
        self.server_side_done.cancel();
    }

    async fn client_to_server(
        &self,
        client_r: &mut OwnedReadHalf,
        mut upstream_w: OwnedWriteHalf,
    ) -> io::Result<ClientEnd> {
        let mut frames = FrameReader::new(true);
        while let Some(unit) = frames.next(client_r).await? {
            if let Unit::Frame(header, _) = &unit
                && self.on_client_frame(header)? == Verdict::GoAway
            {
                // Dropping `upstream_w` sends the upstream a FIN.
                return Ok(ClientEnd::GoAway);
            }
            upstream_w.write_all(unit.bytes()).await?;
        }
        upstream_w.shutdown().await?;
        Ok(ClientEnd::Eof)
    }

    async fn server_to_client(
        &self,
        upstream_r: &mut OwnedReadHalf,
        client_w: &mut OwnedWriteHalf,
    ) -> io::Result<ServerEnd> {
        let mut frames = FrameReader::new(false);
        loop {
            // Only between two frames: the GOAWAY never lands inside one.
            let unit = tokio::select! {
                biased;
                () = self.goaway.cancelled() => {
                    let last_stream = lock(&self.state).highest_client_stream;
                    client_w.write_all(&goaway_frame(last_stream)).await?;
                    client_w.flush().await?;
                    client_w.shutdown().await?;
                    self.stats.goaways_sent.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        connection = self.index,
                        last_stream,
                        "ping guard sent GOAWAY(ENHANCE_YOUR_CALM, too_many_pings)"
                    );
                    return Ok(ServerEnd::GoAway);
                }
                // Cancel-safe: a partial frame stays in `frames`.
                unit = frames.next(upstream_r) => unit?,
            };
            let Some(Unit::Frame(header, frame)) = unit else {
                client_w.shutdown().await?;
                return Ok(ServerEnd::Eof);
            };
            client_w.write_all(&frame).await?;
            lock(&self.state).on_server_frame(&header, &frame);
        }
    }

    /// Tracks streams and judges PINGs; `Verdict::GoAway` once the client exceeds the policy.
    fn on_client_frame(&self, header: &FrameHeader) -> io::Result<Verdict> {
        let is_ping = header.kind == PING && header.flags & FLAG_END_STREAM_OR_ACK == 0;
        if !is_ping {
            lock(&self.state).on_client_frame(header)?;
            return Ok(Verdict::Forward);
        }
        let now = Instant::now();
        self.stats.pings.fetch_add(1, Ordering::Relaxed);
        {
            let mut log = lock(&self.stats.ping_log);
            if log.len() == PING_LOG_CAPACITY {
                log.pop_front();
            }
            log.push_back((self.index, now));
        }
        let (strike, verdict) = lock(&self.state).on_client_ping(now, &self.policy);
        if strike {
            self.stats.strikes.fetch_add(1, Ordering::Relaxed);
        }
        if verdict == Verdict::GoAway {
            self.goaway.cancel();
        }
        tracing::trace!(
            connection = self.index,
            strike,
            ?verdict,
            "ping guard: client PING"
        );
        Ok(verdict)
    }
}

/// Keeps [`Stats::open_connections`] while a connection lives.
struct OpenConnection(Arc<Stats>);

impl OpenConnection {
    fn new(stats: &Arc<Stats>) -> Self {
        stats.open_connections.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(stats))
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open_connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Reads and discards until the client closes, for at most [`GOAWAY_LINGER`].
async fn drain(client_r: &mut OwnedReadHalf) {
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(GOAWAY_LINGER, async {
        while matches!(client_r.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// `GOAWAY(last_stream, ENHANCE_YOUR_CALM, "too_many_pings")` on stream 0.
fn goaway_frame(last_stream: u32) -> Bytes {
    let payload_len = 8 + TOO_MANY_PINGS.len();
    let mut frame = BytesMut::with_capacity(HEADER_LEN + payload_len);
    frame.put_uint(payload_len as u64, 3);
    frame.put_u8(GOAWAY);
    frame.put_u8(0);
    frame.put_u32(0);
    frame.put_u32(last_stream & 0x7fff_ffff);
    frame.put_u32(ENHANCE_YOUR_CALM);
    frame.put_slice(TOO_MANY_PINGS);
    frame.freeze()
}

/// What to do with a client frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Forward,
    GoAway,
}

/// One connection's open streams and ping accounting.
#[derive(Debug, Default)]
struct Streams {
    /// Open streams: whether the client, and the server, have ended their side.
    open: HashMap<u32, (bool, bool)>,
    /// The highest stream id the client opened (and the proxy forwarded).
    highest_client_stream: u32,
    /// The previous client PING since the server last sent HEADERS or DATA.
    last_ping: Option<Instant>,
    strikes: u32,
}

impl Streams {
    fn on_client_frame(&mut self, header: &FrameHeader) -> io::Result<()> {
        let id = header.stream;
        match header.kind {
            HEADERS => {
                if id % 2 == 1 && id > self.highest_client_stream {
                    if self.open.len() >= MAX_TRACKED_STREAMS {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "too many open streams to track",
                        ));
                    }
                    self.highest_client_stream = id;
                    self.open.insert(id, (false, false));
                }
                if header.flags & FLAG_END_STREAM_OR_ACK != 0 {
                    self.end(id, true);
                }
            }
            DATA if header.flags & FLAG_END_STREAM_OR_ACK != 0 => self.end(id, true),
            RST_STREAM => {
                self.open.remove(&id);
            }
            _ => {}
        }
        Ok(())
    }

    fn on_server_frame(&mut self, header: &FrameHeader, frame: &[u8]) {
        let id = header.stream;
        match header.kind {
            HEADERS | DATA => {
                // The server sent something: pings are judged afresh (C-core's
                // `ResetPingStrikes`, grpc-go's `resetPingStrikes`).
                self.last_ping = None;
                self.strikes = 0;
                if header.flags & FLAG_END_STREAM_OR_ACK != 0 {
                    self.end(id, false);
                }
            }
            RST_STREAM => {
                self.open.remove(&id);
            }
            GOAWAY if frame.len() >= HEADER_LEN + 4 => {
                let bytes = [frame[9], frame[10], frame[11], frame[12]];
                let last = u32::from_be_bytes(bytes) & 0x7fff_ffff;
                self.open.retain(|&id, _| id <= last);
            }
            _ => {}
        }
    }

    /// Marks one side of stream `id` ended; forgets the stream once both are.
    fn end(&mut self, id: u32, by_client: bool) {
        if let Some(ends) = self.open.get_mut(&id) {
            if by_client {
                ends.0 = true;
            } else {
                ends.1 = true;
            }
            if ends.0 && ends.1 {
                self.open.remove(&id);
            }
        }
    }

    /// Judges a client PING received at `now`: whether it is a strike, and the verdict.
    fn on_client_ping(&mut self, now: Instant, policy: &PingPolicy) -> (bool, Verdict) {
        let allowed = if self.open.is_empty() && !policy.permit_without_calls {
            IDLE_MIN_INTERVAL
        } else {
            policy.min_interval
        };
        let strike = self
            .last_ping
            .is_some_and(|previous| now.duration_since(previous) < allowed);
        self.last_ping = Some(now);
        if !strike {
            return (false, Verdict::Forward);
        }
        self.strikes = self.strikes.saturating_add(1);
        if self.strikes > policy.max_strikes {
            (true, Verdict::GoAway)
        } else {
            (true, Verdict::Forward)
        }
    }
}

/// The 9-byte header of a frame.
#[derive(Clone, Copy, Debug)]
struct FrameHeader {
    /// Payload length.
    len: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

impl FrameHeader {
    fn parse(b: &[u8]) -> Self {
        Self {
            len: (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }
}

/// What a [`FrameReader`] yields: the preface, or a whole frame (header included).
enum Unit {
    Preface(Bytes),
    Frame(FrameHeader, Bytes),
}

impl Unit {
    fn bytes(&self) -> &[u8] {
        match self {
            Unit::Preface(bytes) | Unit::Frame(_, bytes) => bytes,
        }
    }
}

/// Cuts one direction's bytes into the preface (client side only) and whole frames.
struct FrameReader {
    buf: BytesMut,
    expect_preface: bool,
}

impl FrameReader {
    fn new(expect_preface: bool) -> Self {
        Self {
            buf: BytesMut::new(),
            expect_preface,
        }
    }

    /// The next preface or frame; `None` when the peer closed between two frames. Cancel-safe.
    async fn next(&mut self, r: &mut OwnedReadHalf) -> io::Result<Option<Unit>> {
        loop {
            if let Some(unit) = self.split()? {
                return Ok(Some(unit));
            }
            let missing = self.wanted() - self.buf.len();
            self.buf.reserve(missing.max(READ_CHUNK));
            if r.read_buf(&mut self.buf).await? == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed inside a frame",
                ));
            }
        }
    }

    /// Bytes the unit at the front needs in total (known once its header is in).
    fn wanted(&self) -> usize {
        if self.expect_preface {
            PREFACE.len()
        } else if self.buf.len() < HEADER_LEN {
            HEADER_LEN
        } else {
            HEADER_LEN + FrameHeader::parse(&self.buf).len
        }
    }

    /// Takes the unit at the front if it is whole.
    fn split(&mut self) -> io::Result<Option<Unit>> {
        if self.expect_preface {
            let n = self.buf.len().min(PREFACE.len());
            if self.buf[..n] != PREFACE[..n] {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "client did not send the HTTP/2 preface",
                ));
            }
            if n < PREFACE.len() {
                return Ok(None);
            }
            self.expect_preface = false;
            return Ok(Some(Unit::Preface(self.buf.split_to(n).freeze())));
        }
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let header = FrameHeader::parse(&self.buf);
        let total = HEADER_LEN + header.len;
        if total > MAX_FRAME_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("frame of {total} bytes exceeds {MAX_FRAME_LEN}"),
            ));
        }
        if self.buf.len() < total {
            return Ok(None);
        }
        Ok(Some(Unit::Frame(header, self.buf.split_to(total).freeze())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: u8, flags: u8, stream: u32) -> FrameHeader {
        FrameHeader {
            len: 0,
            kind,
            flags,
            stream,
        }
    }

    const POLICY: PingPolicy = PingPolicy {
        min_interval: Duration::from_millis(300),
        max_strikes: 1,
        permit_without_calls: false,
    };

    #[test]
    fn goaway_frame_is_well_formed() {
        let frame = goaway_frame(7);
        let parsed = FrameHeader::parse(&frame);
        assert_eq!((parsed.kind, parsed.flags, parsed.stream), (GOAWAY, 0, 0));
        assert_eq!(parsed.len, frame.len() - HEADER_LEN);
        assert_eq!(&frame[9..13], &7u32.to_be_bytes());
        assert_eq!(&frame[13..17], &ENHANCE_YOUR_CALM.to_be_bytes());
        assert_eq!(&frame[17..], TOO_MANY_PINGS);
    }

    #[test]
    fn streams_close_when_both_sides_end_or_on_reset() {
        let mut s = Streams::default();
        s.on_client_frame(&header(HEADERS, 0, 1)).unwrap();
        s.on_client_frame(&header(DATA, FLAG_END_STREAM_OR_ACK, 1))
            .unwrap();
        s.on_client_frame(&header(HEADERS, FLAG_END_STREAM_OR_ACK, 3))
            .unwrap();
        assert_eq!(s.open.len(), 2);
        s.on_server_frame(&header(HEADERS, 0, 1), &[]);
        s.on_server_frame(&header(HEADERS, FLAG_END_STREAM_OR_ACK, 1), &[]);
        assert_eq!(s.open.len(), 1);
        s.on_server_frame(&header(RST_STREAM, 0, 3), &[]);
        assert!(s.open.is_empty());
        assert_eq!(s.highest_client_stream, 3);
    }

    #[test]
    fn strikes_count_fast_pings_and_server_data_resets_them() {
        let mut s = Streams::default();
        s.on_client_frame(&header(HEADERS, 0, 1)).unwrap();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(s.on_client_ping(at(0), &POLICY), (false, Verdict::Forward));
        assert_eq!(s.on_client_ping(at(100), &POLICY), (true, Verdict::Forward));
        s.on_server_frame(&header(DATA, 0, 1), &[]);
        assert_eq!(
            s.on_client_ping(at(200), &POLICY),
            (false, Verdict::Forward)
        );
        assert_eq!(
            s.on_client_ping(at(500), &POLICY),
            (false, Verdict::Forward)
        );
        assert_eq!(s.on_client_ping(at(600), &POLICY), (true, Verdict::Forward));
        assert_eq!(s.on_client_ping(at(700), &POLICY), (true, Verdict::GoAway));
    }

    #[test]
    fn without_calls_every_ping_after_the_first_is_a_strike_unless_permitted() {
        let t0 = Instant::now();
        let hour_later = t0 + Duration::from_secs(3600);
        let mut s = Streams::default();
        assert_eq!(s.on_client_ping(t0, &POLICY), (false, Verdict::Forward));
        assert_eq!(
            s.on_client_ping(hour_later, &POLICY),
            (true, Verdict::Forward)
        );

        let permit = PingPolicy {
            permit_without_calls: true,
            ..POLICY
        };
        let mut s = Streams::default();
        s.on_client_ping(t0, &permit);
        assert_eq!(
            s.on_client_ping(hour_later, &permit),
            (false, Verdict::Forward)
        );
    }
}

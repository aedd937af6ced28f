//! The proxy itself: the accept loop, and each connection forwarded frame by frame in both
//! directions, with the guard's GOAWAY put between two server frames when the client exceeds
//! the policy.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use endpoint_state::sync::lock;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::frame::{FLAG_END_STREAM_OR_ACK, FrameHeader, FrameReader, PING, Unit, goaway_frame};
use super::policy::{PingPolicy, Streams, Verdict};

/// Entries kept in [`Stats::ping_log`]; the oldest are dropped beyond it.
const PING_LOG_CAPACITY: usize = 100_000;
/// How long the upstream connect may take before the client connection is dropped.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// After a GOAWAY, how long the proxy reads (and discards) what the client still sends while
/// waiting for it to close, so that closing does not reset the connection under the GOAWAY.
const GOAWAY_LINGER: Duration = Duration::from_secs(1);

/// Counters shared by the handle and every connection.
#[derive(Debug, Default)]
pub(super) struct Stats {
    pub(super) connections_accepted: AtomicU64,
    pub(super) open_connections: AtomicU64,
    pub(super) pings: AtomicU64,
    pub(super) strikes: AtomicU64,
    pub(super) goaways_sent: AtomicU64,
    pub(super) ping_log: Mutex<VecDeque<(u64, Instant)>>,
}

/// Accepts until `stop`, one task per connection; then waits for every connection to close.
pub(super) async fn accept(
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

//! [`PingGuard`]: an HTTP/2 frame-aware TCP proxy that puts a gRPC server's ping policy
//! (gRFC A8, "too_many_pings") in front of any upstream and records every client PING.
//!
//! Each direction of a proxied connection is cut into whole HTTP/2 frames (client to server after
//! the 24-byte connection preface, server to client from the first byte) and forwarded frame by
//! frame, so that the proxy can put its own `GOAWAY` between two server frames.
//!
//! The handle is here; the proxying in `proxy`, the policy and each connection's accounting in
//! `policy`, the HTTP/2 framing in `frame` (each importing only the ones after it).

mod frame;
mod policy;
mod proxy;

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use endpoint_state::sync::lock;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::conn;
use proxy::{Stats, accept};

pub use policy::PingPolicy;

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

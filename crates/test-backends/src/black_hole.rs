//! A listener that accepts TCP connections and never reads from or answers them.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::conn;

/// A black hole: TCP connects succeed, and then nothing ever happens. The accepted sockets are held
/// open (never read, never written) until the black hole is stopped or dropped, so a client's
/// HTTP/2 handshake and every RPC hang until their own deadline.
///
/// Dropping it closes the listener and every held socket.
#[derive(Debug)]
pub struct BlackHole {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl BlackHole {
    /// Starts a black hole on `127.0.0.1` on a free port.
    pub async fn start() -> io::Result<Self> {
        Self::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await
    }

    /// Starts a black hole on `addr` (bound with `SO_REUSEADDR`; port 0 picks a free port).
    pub async fn bind(addr: SocketAddr) -> io::Result<Self> {
        let listener = conn::bind(addr)?;
        let addr = listener.local_addr()?;
        let accepted = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(swallow(listener, Arc::clone(&accepted)));
        Ok(Self {
            addr,
            accepted,
            task,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, ready for `tonic::transport::Endpoint::from_shared`.
    pub fn uri(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many TCP connections it has accepted.
    pub fn connections_accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Closes the listener and every held socket; returns once the port is released.
    pub async fn stop(mut self) {
        self.task.abort();
        // The task's future (listener and sockets) is dropped before the handle resolves.
        let _ = (&mut self.task).await;
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts forever and holds every socket without touching it.
async fn swallow(listener: TcpListener, accepted: Arc<AtomicU64>) {
    let mut held = Vec::new();
    loop {
        match listener.accept().await {
            Ok((socket, _peer)) => {
                accepted.fetch_add(1, Ordering::Relaxed);
                held.push(socket);
            }
            // E.g. out of file descriptors: back off rather than spin.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

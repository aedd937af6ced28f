//! An address that drops SYNs: a listener whose accept queue is full.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// How long a connect to the full queue is given before it counts as dropped.
const DROPPED_AFTER: Duration = Duration::from_millis(200);
/// The most connections made to fill the queue (a backlog of 1 holds two on Linux).
const MAX_FILL: usize = 16;

/// An address that drops SYNs, as a host behind a firewall that drops packets does, or a
/// server too overloaded to accept: a listener with a backlog of 1 that never accepts, its
/// accept queue filled by connections of its own. The kernel drops every further SYN, so a
/// client's connect hangs through its SYN retransmissions (about 127 s on Linux) unless
/// something times it out.
///
/// Dropping it (or [`stop`](Self::stop)) closes the listener and the connections that fill
/// it, releasing the port.
#[derive(Debug)]
pub struct SynDrop {
    addr: SocketAddr,
    _listener: TcpListener,
    _fill: Vec<TcpStream>,
}

impl SynDrop {
    /// Starts one on `127.0.0.1` on a free port.
    pub async fn start() -> io::Result<Self> {
        Self::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await
    }

    /// Starts one on `addr` (bound with `SO_REUSEADDR`, so a stopped backend's port can be
    /// taken). Returns once a connect to it hangs: the queue is full.
    pub async fn bind(addr: SocketAddr) -> io::Result<Self> {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        let listener = socket.listen(1)?;
        let addr = listener.local_addr()?;
        let mut fill = Vec::new();
        for _ in 0..MAX_FILL {
            match tokio::time::timeout(DROPPED_AFTER, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => fill.push(stream),
                Ok(Err(e)) => return Err(e),
                // The SYN was dropped: the queue is full.
                Err(_) => {
                    return Ok(SynDrop {
                        addr,
                        _listener: listener,
                        _fill: fill,
                    });
                }
            }
        }
        Err(io::Error::other(format!(
            "the accept queue of {addr} took {MAX_FILL} connections and is still not full"
        )))
    }

    /// The address whose SYNs are dropped.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, ready for `tonic::transport::Endpoint::from_shared`.
    pub fn uri(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Closes the listener and its connections; the port is free when this returns.
    pub fn stop(self) {
        drop(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connects_hang_until_it_is_stopped() {
        let hole = SynDrop::start().await.unwrap();
        let connect = TcpStream::connect(hole.addr());
        assert!(
            tokio::time::timeout(Duration::from_millis(300), connect)
                .await
                .is_err(),
            "a connect went through"
        );
        let addr = hole.addr();
        hole.stop();
        // The port is free again.
        crate::conn::bind(addr).unwrap();
    }
}

//! A TCP proxy in front of a backend that can freeze: every connection stops moving bytes while
//! staying open — a half-open connection, a peer that stopped reading.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::conn;

/// Bytes read from one side before they are written to the other.
const CHUNK: usize = 16 * 1024;

/// A TCP proxy on `127.0.0.1` in front of an upstream address, forwarding every connection
/// byte for byte — until [`freeze`](Self::freeze): from then on it neither reads nor writes on
/// any connection, old or new, while keeping every one of them open (connects still succeed:
/// the kernel completes them). The client's calls go out and nothing ever comes back, nor is
/// anything more read from it: a backend that froze after the connection was established.
/// [`thaw`](Self::thaw) lets the bytes move again.
///
/// When either side of a connection closes or fails, the proxy resets both (a stopped upstream
/// looks like a stopped backend, except that connecting succeeds and is then reset); an
/// upstream that refuses the connection resets the client's at once.
///
/// Dropping it (or [`stop`](Self::stop)) closes the listener and every connection.
#[derive(Debug)]
pub struct FreezeProxy {
    addr: SocketAddr,
    frozen: watch::Sender<bool>,
    accepted: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl FreezeProxy {
    /// Starts a proxy to `upstream` on `127.0.0.1`, on a free port.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = conn::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
        let addr = listener.local_addr()?;
        let (frozen, watching) = watch::channel(false);
        let accepted = Arc::new(AtomicU64::new(0));
        let counted = accepted.clone();
        let task = tokio::spawn(async move {
            // Dropped with this task: every connection's task is aborted with it.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accept = listener.accept() => match accept {
                        Ok((client, _)) => {
                            counted.fetch_add(1, Ordering::Relaxed);
                            connections.spawn(relay(client, upstream, watching.clone()));
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    },
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Ok(FreezeProxy {
            addr,
            frozen,
            accepted,
            task,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn uri(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops moving bytes on every connection, keeping them open.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Moves bytes again (what was read before the freeze goes on first).
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// Whether it is frozen.
    pub fn is_frozen(&self) -> bool {
        *self.frozen.borrow()
    }

    /// Client connections accepted so far.
    pub fn connections_accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Closes the listener and every connection; returns once the port is released.
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for FreezeProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One client connection: connects upstream and moves bytes both ways until either side ends;
/// then resets both.
async fn relay(mut client: TcpStream, upstream: SocketAddr, frozen: watch::Receiver<bool>) {
    let _ = client.set_nodelay(true);
    let mut server = match TcpStream::connect(upstream).await {
        Ok(server) => server,
        Err(_) => {
            reset(&client);
            return;
        }
    };
    let _ = server.set_nodelay(true);
    {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        tokio::select! {
            () = pump(client_read, server_write, frozen.clone()) => {}
            () = pump(server_read, client_write, frozen) => {}
        }
    }
    reset(&client);
    reset(&server);
}

/// Closes with an RST when the stream is dropped.
fn reset(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// Copies `from` to `to` while not frozen; returns when `from` ends or either side fails.
async fn pump(mut from: ReadHalf<'_>, mut to: WriteHalf<'_>, mut frozen: watch::Receiver<bool>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            // Frozen while waiting to read: stop reading (the read is cancel-safe).
            _ = frozen.wait_for(|f| *f) => continue,
        };
        // Frozen after the read: hold the bytes until thawed.
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Backend;
    use crate::pb::Ping;
    use crate::pb::test_service_client::TestServiceClient;

    fn ping(timeout: Duration) -> tonic::Request<Ping> {
        let mut request = tonic::Request::new(Ping::default());
        request.set_timeout(timeout);
        request
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_frozen_proxy_keeps_its_connections_and_moves_nothing() {
        let backend = Backend::start("b0").await.unwrap();
        let proxy = FreezeProxy::start(backend.addr()).await.unwrap();
        let channel = tonic::transport::Endpoint::from_shared(proxy.uri())
            .unwrap()
            .connect_lazy();
        let mut client = TestServiceClient::new(channel);
        let second = Duration::from_secs(1);
        client.unary(ping(second)).await.unwrap();
        proxy.freeze();
        let status = client
            .unary(ping(Duration::from_millis(200)))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Cancelled, "{status:?}"); // tonic's own timeout
        assert_eq!(backend.hits(), 1, "the frozen call reached the backend");
        proxy.thaw();
        let pong = client.unary(ping(second)).await.unwrap().into_inner();
        assert_eq!(pong.backend, "b0");
        assert_eq!(
            proxy.connections_accepted(),
            1,
            "the connection survived the freeze"
        );
    }
}

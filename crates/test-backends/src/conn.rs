//! The accept side: binding with `SO_REUSEADDR`, the incoming stream handed to tonic, and the
//! per-connection wrapper that counts connections and dies at once when the backend is stopped.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures_core::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::service::Counters;

/// Listen backlog of every listener.
const BACKLOG: u32 = 1024;

/// Binds a listener with `SO_REUSEADDR`, so that a stopped backend can bind its port again.
pub(crate) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// The connections of one serving generation, as tonic's `serve_with_incoming_shutdown` wants.
/// Owns the listener: tonic drops it (closing the port) as soon as it stops accepting.
#[derive(Debug)]
pub(crate) struct Incoming {
    listener: TcpListener,
    killed: CancellationToken,
    counters: Arc<Counters>,
}

impl Incoming {
    pub(crate) fn new(
        listener: TcpListener,
        killed: CancellationToken,
        counters: Arc<Counters>,
    ) -> Self {
        Self {
            listener,
            killed,
            counters,
        }
    }
}

impl Stream for Incoming {
    type Item = io::Result<TrackedStream>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let (stream, _peer) = ready!(this.listener.poll_accept(cx))?;
        // Best effort: latency matters more than throughput for a test double.
        let _ = stream.set_nodelay(true);
        let tracked = TrackedStream::new(stream, this.killed.clone(), Arc::clone(&this.counters));
        Poll::Ready(Some(Ok(tracked)))
    }
}

/// An accepted connection. Counts itself in `open_connections` while alive. Once the generation's
/// kill token is cancelled, every read and write fails, and the socket is set to `SO_LINGER 0`
/// so that closing it sends an RST: in-flight calls fail instead of draining.
pub(crate) struct TrackedStream {
    inner: TcpStream,
    killed: CancellationToken,
    on_kill: Pin<Box<WaitForCancellationFutureOwned>>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for TrackedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackedStream")
            .field("inner", &self.inner)
            .field("killed", &self.killed.is_cancelled())
            .finish()
    }
}

impl TrackedStream {
    fn new(inner: TcpStream, killed: CancellationToken, counters: Arc<Counters>) -> Self {
        counters.open_connections.fetch_add(1, Ordering::Relaxed);
        counters
            .connections_accepted
            .fetch_add(1, Ordering::Relaxed);
        let on_kill = Box::pin(killed.clone().cancelled_owned());
        Self {
            inner,
            killed,
            on_kill,
            counters,
        }
    }

    /// Fails if the backend was stopped; otherwise registers the task to be woken when it is.
    fn check_alive(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        // Once the token is cancelled the future is done and must not be polled again.
        if self.killed.is_cancelled() || self.on_kill.as_mut().poll(cx).is_ready() {
            // Linger 0 closes with RST and does not block on drop.
            let _ = socket2::SockRef::from(&self.inner).set_linger(Some(Duration::ZERO));
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "test backend stopped",
            ));
        }
        Ok(())
    }
}

impl Drop for TrackedStream {
    fn drop(&mut self) {
        self.counters
            .open_connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

impl AsyncRead for TrackedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_alive(cx)?;
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for TrackedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check_alive(cx)?;
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check_alive(cx)?;
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_alive(cx)?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_alive(cx)?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl Connected for TrackedStream {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

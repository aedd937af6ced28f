//! What a client writes, write by write: an IO that records the bytes of every write that
//! reaches it, and the HTTP/2 frames in them — to show which frames left together.
//!
//! ```
//! use test_backends::wire::{Recording, FRAME_DATA};
//! use tokio::io::AsyncWriteExt;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let (client, _server) = tokio::io::duplex(1024);
//! let (mut io, writes) = Recording::new(client);
//! io.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
//! io.write_all(&[0, 0, 1, FRAME_DATA, 0x1, 0, 0, 0, 1, 7]).await.unwrap();
//! let frames = writes.frames();
//! assert_eq!((frames[0].write, frames[0].kind, frames[0].stream), (1, FRAME_DATA, 1));
//! # }
//! ```

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use endpoint_state::sync::lock;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

/// The HTTP/2 frame type `DATA`.
pub const FRAME_DATA: u8 = 0x0;
/// The HTTP/2 frame type `HEADERS`.
pub const FRAME_HEADERS: u8 = 0x1;
/// The `END_STREAM` flag of `DATA` and `HEADERS`.
pub const END_STREAM: u8 = 0x1;

const PREFACE_LEN: usize = 24;

/// An IO that records every write it passes on (the bytes the inner IO accepted).
#[derive(Debug)]
pub struct Recording<T> {
    io: T,
    writes: Writes,
}

/// The writes a [`Recording`] passed on, in order.
#[derive(Debug, Clone, Default)]
pub struct Writes(Arc<Mutex<Vec<Vec<u8>>>>);

/// A frame a client wrote: which write its header began in, and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// The index of the write (0 is the first).
    pub write: usize,
    /// The frame type ([`FRAME_DATA`], [`FRAME_HEADERS`], ...).
    pub kind: u8,
    /// The frame's flags ([`END_STREAM`], ...).
    pub flags: u8,
    /// The stream (0 for the connection).
    pub stream: u32,
}

impl<T> Recording<T> {
    /// Wraps `io`; the [`Writes`] handle reads what was written.
    pub fn new(io: T) -> (Self, Writes) {
        let writes = Writes::default();
        (
            Recording {
                io,
                writes: writes.clone(),
            },
            writes,
        )
    }
}

impl Writes {
    /// How many writes so far.
    pub fn count(&self) -> usize {
        lock(&self.0).len()
    }

    /// The frames of a client's byte stream (after its 24-byte connection preface), each with
    /// the write its header began in.
    pub fn frames(&self) -> Vec<Frame> {
        let writes = lock(&self.0);
        let mut at: Vec<usize> = Vec::new(); // the write of each byte
        let mut bytes = Vec::new();
        for (i, w) in writes.iter().enumerate() {
            at.extend(std::iter::repeat_n(i, w.len()));
            bytes.extend_from_slice(w);
        }
        let mut frames = Vec::new();
        let mut pos = PREFACE_LEN;
        while pos + 9 <= bytes.len() {
            let h = &bytes[pos..pos + 9];
            let len = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
            frames.push(Frame {
                write: at[pos],
                kind: h[3],
                flags: h[4],
                stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
            });
            pos += 9 + len;
        }
        frames
    }

    /// The requests written so far, each as its `HEADERS` frame and its first `DATA` frame
    /// (`None` if none was written).
    pub fn requests(&self) -> Vec<(Frame, Option<Frame>)> {
        let frames = self.frames();
        frames
            .iter()
            .filter(|f| f.kind == FRAME_HEADERS && f.stream != 0)
            .map(|headers| {
                let data = frames
                    .iter()
                    .find(|f| f.kind == FRAME_DATA && f.stream == headers.stream)
                    .copied();
                (*headers, data)
            })
            .collect()
    }

    /// Panics unless exactly `n` requests were written, each with its first `DATA` in the same
    /// write as its `HEADERS`.
    pub fn assert_requests_whole(&self, n: usize) {
        let requests = self.requests();
        assert_eq!(requests.len(), n, "requests written: {requests:?}");
        for (headers, data) in requests {
            assert_eq!(
                headers.flags & END_STREAM,
                0,
                "a request with a body: {headers:?}"
            );
            let data = data.unwrap_or_else(|| panic!("no DATA for {headers:?}"));
            assert_eq!(
                data.write,
                headers.write,
                "stream {}: HEADERS and DATA in different writes: {:?}",
                headers.stream,
                self.frames()
            );
        }
    }
}

/// A TCP connection to `addr` (`TCP_NODELAY`, as tonic's connections), recorded.
pub async fn record_tcp(addr: SocketAddr) -> io::Result<(Recording<TcpStream>, Writes)> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    Ok(Recording::new(tcp))
}

/// A tonic channel to `uri` whose one connection is `io` (a reconnection fails).
pub async fn channel_over<T>(uri: String, io: T) -> Result<Channel, tonic::transport::Error>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let mut io = Some(hyper_util::rt::TokioIo::new(io));
    Endpoint::from_shared(uri)?
        .connect_with_connector(tower::service_fn(move |_| {
            let io = io.take().ok_or("one connection");
            async move { io }
        }))
        .await
}

impl<T: AsyncRead + Unpin> AsyncRead for Recording<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Recording<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            lock(&this.writes.0).push(buf[..n].to_vec());
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled {
            let mut written = Vec::with_capacity(n);
            for buf in bufs {
                let take = (n - written.len()).min(buf.len());
                written.extend_from_slice(&buf[..take]);
            }
            lock(&this.writes.0).push(written);
        }
        polled
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

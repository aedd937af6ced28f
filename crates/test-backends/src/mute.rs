//! A server that never speaks: it takes each connection, reads until the client's first
//! request has arrived, and resets the connection without having sent a single byte — what a
//! stopping server does to the connections left in its accept queue.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::conn;

/// The HTTP/2 client preface.
const PREFACE: usize = 24;
/// An HTTP/2 frame header: length (3), type (1), flags (1), stream (4).
const FRAME_HEADER: usize = 9;
/// The type of a `HEADERS` frame.
const HEADERS: u8 = 0x1;

/// A server on `127.0.0.1` that reads each connection until a request's `HEADERS` frame has
/// arrived, then resets it (`SO_LINGER` 0) without ever having written a byte. No server code
/// ever saw the request: a client may safely send it elsewhere.
#[derive(Debug)]
pub struct MuteServer {
    addr: SocketAddr,
    reset: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl MuteServer {
    /// Starts one on a free port.
    pub async fn start() -> io::Result<Self> {
        let listener = conn::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
        let addr = listener.local_addr()?;
        let reset = Arc::new(AtomicU64::new(0));
        let counted = reset.clone();
        let task = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((mut stream, _)) => {
                        let counted = counted.clone();
                        tokio::spawn(async move {
                            if until_a_request(&mut stream).await.is_ok() {
                                let _ = socket2::SockRef::from(&stream)
                                    .set_linger(Some(Duration::ZERO));
                                counted.fetch_add(1, Ordering::Relaxed);
                            }
                        });
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        });
        Ok(MuteServer { addr, reset, task })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn uri(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Connections reset after a request arrived on them.
    pub fn resets(&self) -> u64 {
        self.reset.load(Ordering::Relaxed)
    }
}

impl Drop for MuteServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads the client preface and frames until a `HEADERS` frame has been read whole.
async fn until_a_request(stream: &mut TcpStream) -> io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut at = PREFACE;
    loop {
        while buf.len() >= at + FRAME_HEADER {
            let header = &buf[at..at + FRAME_HEADER];
            let len =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            let kind = header[3];
            if buf.len() < at + FRAME_HEADER + len {
                break;
            }
            if kind == HEADERS {
                return Ok(());
            }
            at += FRAME_HEADER + len;
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

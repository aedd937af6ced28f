//! A port that answers every HTTP/2 request with an HTML page: a proxy's error page where a gRPC
//! server should be.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic::transport::Server;

use crate::conn::{self, Incoming};

/// The page every request gets.
pub const HTML_PAGE: &str = "<html><body><h1>502 Bad Gateway</h1></body></html>";

/// A server that answers every request to the test service and to the health service with
/// HTTP status 200, `content-type: text/html` and [`HTML_PAGE`] — no `grpc-status`: what a
/// misconfigured proxy or a captive portal says in place of a gRPC server.
///
/// Dropping it (or [`stop`](Self::stop)) closes the listener and resets every connection at
/// once.
#[derive(Debug)]
pub struct HtmlServer {
    addr: SocketAddr,
    requests: Arc<AtomicU64>,
    /// Cancelling it resets every connection and stops the server.
    kill: CancellationToken,
    task: JoinHandle<()>,
}

impl HtmlServer {
    /// Starts one on `127.0.0.1` on a free port.
    pub async fn start() -> io::Result<Self> {
        Self::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await
    }

    /// Starts one on `addr` (bound with `SO_REUSEADDR`: a stopped backend's port can be taken).
    pub async fn bind(addr: SocketAddr) -> io::Result<Self> {
        let listener = conn::bind(addr)?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(AtomicU64::new(0));
        let page = Page(requests.clone());
        let router = Server::builder()
            .add_service(Named::<TestServiceName>::new(page.clone()))
            .add_service(Named::<HealthName>::new(page));
        let kill = CancellationToken::new();
        // Connections that fail every read and write (and close with an RST) once killed.
        let incoming = Incoming::new(listener, kill.clone(), Arc::default());
        let signal = kill.clone().cancelled_owned();
        let task = tokio::spawn(async move {
            if let Err(error) = router.serve_with_incoming_shutdown(incoming, signal).await {
                tracing::warn!(%error, "html server failed");
            }
        });
        Ok(HtmlServer {
            addr,
            requests,
            kill,
            task,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn uri(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Closes the listener and resets every connection; returns once they are closed and the
    /// port is released.
    pub async fn stop(mut self) {
        self.kill.cancel();
        if tokio::time::timeout(KILL_WAIT, &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
            let _ = (&mut self.task).await;
        }
    }
}

/// How long `stop` waits for the server to end after resetting its connections.
const KILL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Drop for HtmlServer {
    fn drop(&mut self) {
        self.kill.cancel();
        self.task.abort();
    }
}

/// Answers with the page, counting requests.
#[derive(Clone, Debug)]
struct Page(Arc<AtomicU64>);

impl tower::Service<http::Request<tonic::body::Body>> for Page {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: http::Request<tonic::body::Body>) -> Self::Future {
        self.0.fetch_add(1, Ordering::Relaxed);
        let response = http::Response::builder()
            .status(http::StatusCode::OK)
            .header(http::header::CONTENT_TYPE, "text/html; charset=utf-8")
            .body(tonic::body::Body::new(Once(Some(Bytes::from_static(
                HTML_PAGE.as_bytes(),
            )))))
            .expect("a valid response");
        ready(Ok(response))
    }
}

/// One data frame.
struct Once(Option<Bytes>);

impl http_body::Body for Once {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.take().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }
}

/// A service name the router routes to the page.
trait ServiceName: Send + Sync + 'static {
    const NAME: &'static str;
}

#[derive(Debug)]
struct TestServiceName;
impl ServiceName for TestServiceName {
    const NAME: &'static str = crate::pb::SERVICE_NAME;
}

#[derive(Debug)]
struct HealthName;
impl ServiceName for HealthName {
    const NAME: &'static str = "grpc.health.v1.Health";
}

/// The page under one service name.
#[derive(Debug)]
struct Named<N> {
    page: Page,
    _name: std::marker::PhantomData<fn() -> N>,
}

impl<N> Named<N> {
    fn new(page: Page) -> Self {
        Named {
            page,
            _name: std::marker::PhantomData,
        }
    }
}

impl<N> Clone for Named<N> {
    fn clone(&self) -> Self {
        Named::new(self.page.clone())
    }
}

impl<N: ServiceName> NamedService for Named<N> {
    const NAME: &'static str = N::NAME;
}

impl<N> tower::Service<http::Request<tonic::body::Body>> for Named<N> {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.page.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        self.page.call(req)
    }
}

//! The connector of every target's channel: tonic's own TCP connector, built from the target's
//! endpoint settings, whose connections also note whether the server has sent anything yet.
//!
//! A server that stops gracefully may leave connections in its accept queue and reset them as
//! it exits (tonic does): a call sent on such a connection fails with a plain
//! `connection reset`, which says nothing of whether the server saw the call. But an HTTP/2
//! server sends its preface before it reads a request, so a connection that fails before the
//! server sent a single byte carried no call any server code saw. Such a connection fails
//! with [`CLOSED_BEFORE_SERVER_SPOKE`], which the kit's transparent retry reads
//! ([`closed_before_server_spoke`](endpoint_state::transport::closed_before_server_spoke)): the
//! call goes to another target instead of failing.
//!
//! Its connections serve the kit's own HTTP/2 client ([`crate::http2`], plaintext targets of
//! the kit's templates), whose writes already carry each request's `HEADERS` with its first
//! `DATA`, and the tonic `Channel`s the kit makes for other targets. On a `Channel`'s plaintext
//! connection (`http://`) the two leave in one write too, where hyper alone writes them apart
//! ([`Coalesced`]): a unary call costs one system call and one TCP segment instead of two, and
//! its server one wake-up.
//!
//! The connector honours every setting of the endpoint that tonic lets anyone read (TCP
//! nodelay, TCP keepalive and its interval and retries, the connect timeout; TLS and every
//! HTTP/2 setting are applied by tonic itself, as for any channel). tonic offers no way to read
//! an endpoint's local address, so an endpoint made by a template *function* (which may set
//! one) is connected by tonic's own connector instead, without this detection.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use endpoint_state::transport::{CLOSED_BEFORE_SERVER_SPOKE, redirect_uri};
use endpoint_state::writes::Coalesced;
use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};
use tower_service::Service;

use crate::error::BoxError;

/// A lazily connected channel to `endpoint` (to `address` instead of the endpoint's host, when
/// given), through [`Connector`].
pub(crate) fn channel(endpoint: &Endpoint, address: Option<SocketAddr>) -> Channel {
    endpoint.connect_with_connector_lazy(Connector::to(endpoint, address))
}

/// tonic's TCP connector with the endpoint's settings; its connections are [`Watched`].
#[derive(Clone, Debug)]
pub(crate) struct Connector {
    http: HttpConnector,
    /// Where connections go instead of the endpoint's host (a resolved `dns:` address).
    address: Option<SocketAddr>,
}

impl Connector {
    pub(crate) fn for_endpoint(endpoint: &Endpoint) -> Self {
        let mut http = HttpConnector::new();
        // https URIs too: tonic puts TLS on top of this connection.
        http.enforce_http(false);
        http.set_nodelay(endpoint.get_tcp_nodelay());
        http.set_keepalive(endpoint.get_tcp_keepalive());
        http.set_keepalive_interval(endpoint.get_tcp_keepalive_interval());
        http.set_keepalive_retries(endpoint.get_tcp_keepalive_retries());
        http.set_connect_timeout(endpoint.get_connect_timeout());
        Connector {
            http,
            address: None,
        }
    }

    /// [`for_endpoint`](Self::for_endpoint), connecting to `address` instead of the
    /// endpoint's host when given.
    pub(crate) fn to(endpoint: &Endpoint, address: Option<SocketAddr>) -> Self {
        let mut connector = Connector::for_endpoint(endpoint);
        connector.address = address;
        connector
    }

    /// A connection to `uri` for the kit's own HTTP/2 client ([`crate::http2`]), whose writes
    /// already carry each request's `HEADERS` with its first `DATA`: watched, not held.
    pub(crate) fn connect(
        &self,
        uri: Uri,
    ) -> impl Future<Output = Result<Watched, io::Error>> + Send + 'static {
        let tcp = self.clone().tcp(uri);
        async move { Ok(Watched::new(Coalesced::passthrough(tcp.await?))) }
    }

    /// A TCP connection to `uri`'s host (or to the resolved address, when one is set), with
    /// the endpoint's TCP settings.
    fn tcp(&mut self, uri: Uri) -> impl Future<Output = Result<TcpStream, io::Error>> + use<> {
        let uri = match self.address {
            Some(address) => redirect_uri(&uri, address),
            None => uri,
        };
        let connecting = self.http.call(uri);
        async move { Ok(connecting.await.map_err(into_io)?.into_inner()) }
    }
}

type Connecting = Pin<Box<dyn Future<Output = Result<TokioIo<Watched>, io::Error>> + Send>>;

impl Service<Uri> for Connector {
    type Response = TokioIo<Watched>;
    type Error = io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        self.http.poll_ready(cx).map_err(io::Error::other)
    }

    fn call(&mut self, uri: Uri) -> Connecting {
        // Plaintext HTTP/2 frames are this connection's bytes (under TLS they are records).
        let plaintext = uri.scheme_str() == Some("http");
        let tcp = self.tcp(uri);
        Box::pin(async move { Ok(TokioIo::new(Watched::new(one_write(tcp.await?, plaintext)))) })
    }
}

/// `stream`, sending each request's `HEADERS` and first `DATA` in one write when its bytes are
/// plaintext HTTP/2.
fn one_write<S>(stream: S, plaintext: bool) -> Coalesced<S> {
    if plaintext {
        Coalesced::new(stream)
    } else {
        Coalesced::passthrough(stream)
    }
}

/// hyper-util's connect error as an I/O error of the same kind (a refused connection stays
/// `ConnectionRefused`, which the kit reads as a call never sent), keeping it as the source.
fn into_io<E>(error: E) -> io::Error
where
    E: std::error::Error + Send + Sync + 'static,
{
    let kind = error
        .source()
        .and_then(|e| e.downcast_ref::<io::Error>())
        .map_or(io::ErrorKind::Other, io::Error::kind);
    io::Error::new(kind, error)
}

/// A connection that notes whether the server has sent anything yet; until it has, an error
/// or the end of the stream is reported as [`CLOSED_BEFORE_SERVER_SPOKE`].
///
/// Only a *read* error reaches every stream of an HTTP/2 connection with its words (h2 gives a
/// write error's streams a generic broken pipe), so a write that fails before the server spoke
/// is taken as written and the failure kept for the next read, which reports it: the
/// connection is dead either way, and the words reach every call on it.
///
/// Under it, a plaintext connection sends each request's `HEADERS` and first `DATA` in one
/// write ([`Coalesced`]): one system call and one TCP segment per unary call where hyper alone
/// makes two.
#[derive(Debug)]
pub(crate) struct Watched<S = Coalesced<TcpStream>> {
    stream: S,
    heard: bool,
    /// A write failed before the server spoke: the next read reports it.
    failed: bool,
}

impl<S> Watched<S> {
    fn new(stream: S) -> Self {
        Watched {
            stream,
            heard: false,
            failed: false,
        }
    }

    fn silent() -> io::Error {
        io::Error::new(io::ErrorKind::ConnectionReset, CLOSED_BEFORE_SERVER_SPOKE)
    }

    /// A write's result: an error before the server spoke is kept for the next read.
    fn wrote<T>(&mut self, result: Poll<io::Result<T>>, written: T) -> Poll<io::Result<T>> {
        match result {
            Poll::Ready(Err(_)) if !self.heard => {
                self.failed = true;
                Poll::Ready(Ok(written))
            }
            other => other,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.failed {
            return Poll::Ready(Err(Self::silent()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.heard = true;
                } else if !self.heard && buf.remaining() > 0 {
                    // The end of the stream before a single byte.
                    return Poll::Ready(Err(Self::silent()));
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(_)) if !self.heard => Poll::Ready(Err(Self::silent())),
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.failed {
            return Poll::Ready(Ok(buf.len()));
        }
        let result = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.wrote(result, buf.len())
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let len = bufs.iter().map(|b| b.len()).sum();
        if self.failed {
            return Poll::Ready(Ok(len));
        }
        let result = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.wrote(result, len)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.failed {
            return Poll::Ready(Ok(()));
        }
        let result = Pin::new(&mut self.stream).poll_flush(cx);
        self.wrote(result, ())
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A user's connector, its type erased ([`EndpointTemplate::from_connector_fn`]): a cloneable
/// service from the URI tonic asks for to a connection.
///
/// [`EndpointTemplate::from_connector_fn`]: crate::EndpointTemplate::from_connector_fn
pub(crate) type BoxConnector = tower::util::BoxCloneSyncService<Uri, BoxIo, BoxError>;

/// Erases `connector` (one box per connection made, none per call).
pub(crate) fn box_connector<C>(connector: C) -> BoxConnector
where
    C: Service<Uri> + Clone + Send + Sync + 'static,
    C::Response: hyper::rt::Read + hyper::rt::Write + Send + Unpin + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    tower::util::BoxCloneSyncService::new(Erased(connector))
}

/// `connector`, asked for `address` instead of the endpoint's host when given.
pub(crate) fn redirected(connector: BoxConnector, address: Option<SocketAddr>) -> BoxConnector {
    match address {
        None => connector,
        Some(address) => tower::util::BoxCloneSyncService::new(tower::util::MapRequest::new(
            connector,
            move |uri: Uri| redirect_uri(&uri, address),
        )),
    }
}

#[derive(Clone)]
struct Erased<C>(C);

impl<C> Service<Uri> for Erased<C>
where
    C: Service<Uri>,
    C::Response: hyper::rt::Read + hyper::rt::Write + Send + Unpin + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = BoxIo;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<BoxIo, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            let io = connecting.await.map_err(Into::into)?;
            Ok(BoxIo(Box::new(io)))
        })
    }
}

trait Io: hyper::rt::Read + hyper::rt::Write + Send + Unpin + 'static {}

impl<T: hyper::rt::Read + hyper::rt::Write + Send + Unpin + 'static> Io for T {}

/// A connection from a user's connector, its type erased.
pub(crate) struct BoxIo(Box<dyn Io>);

impl std::fmt::Debug for BoxIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoxIo").finish_non_exhaustive()
    }
}

impl hyper::rt::Read for BoxIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for BoxIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write_vectored(cx, bufs)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use test_backends::pb::{Ping, test_service_client::TestServiceClient};
    use test_backends::wire::{END_STREAM, Writes, channel_over, record_tcp};

    use super::*;

    /// A channel to `backend` over one recorded connection, watched as the kit watches its own.
    async fn recorded(backend: &test_backends::Backend, plaintext: bool) -> (Channel, Writes) {
        let (recording, writes) = record_tcp(backend.addr()).await.unwrap();
        let io = Watched::new(one_write(recording, plaintext));
        let channel = channel_over(backend.uri(), io).await.unwrap();
        (channel, writes)
    }

    #[tokio::test]
    async fn a_unary_calls_headers_and_data_leave_in_one_write() {
        let backend = test_backends::Backend::start("b0").await.unwrap();
        let (channel, writes) = recorded(&backend, true).await;
        let mut client = TestServiceClient::new(channel);
        for i in 0..3 {
            let ping = Ping {
                payload: format!("p{i}"),
            };
            let pong = client.unary(ping).await.unwrap().into_inner();
            assert_eq!(pong.payload, format!("p{i}"));
        }
        writes.assert_requests_whole(3);
    }

    #[tokio::test]
    async fn a_request_whose_body_is_not_ready_still_sends_its_headers() {
        // A client stream that never yields a message: the HEADERS cannot wait for DATA. The
        // backend answers the (unimplemented) method at its HEADERS, so the call can only end
        // if they were written.
        let backend = test_backends::Backend::start("b0").await.unwrap();
        let (channel, writes) = recorded(&backend, true).await;
        let pings = tonic::Request::new(futures_util::stream::pending::<Ping>());
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            test_backends::upload(channel, pings),
        )
        .await
        .expect("the HEADERS were written without DATA");
        assert_eq!(answer.unwrap_err().code(), tonic::Code::Unimplemented);
        let requests = writes.requests();
        assert_eq!(requests.len(), 1, "{requests:?}");
        assert_eq!(requests[0].0.flags & END_STREAM, 0, "{requests:?}");
        assert_eq!(requests[0].1, None, "no message was sent: {requests:?}");
    }

    #[tokio::test]
    async fn without_plaintext_http2_writes_pass_straight_through() {
        // Not plaintext (the kit's https connections carry TLS records): nothing is held, and
        // hyper's own order of writes shows.
        let backend = test_backends::Backend::start("b0").await.unwrap();
        let (channel, writes) = recorded(&backend, false).await;
        let mut client = TestServiceClient::new(channel);
        client.unary(Ping::default()).await.unwrap();
        let requests = writes.requests();
        let (headers, data) = requests[0];
        assert_ne!(
            Some(headers.write),
            data.map(|d| d.write),
            "hyper now writes HEADERS and DATA together by itself: the coalescer may go \
             ({requests:?})"
        );
    }
}

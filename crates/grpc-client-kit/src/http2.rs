//! The kit's own HTTP/2 connection to a plaintext target: the `h2` crate called from the
//! caller's task.
//!
//! tonic's `Channel` hands each call to a `Buffer` worker, which hands it to hyper's
//! connection task, which spawns two tasks per request (one sends the body, one waits for the
//! response) and answers through a channel. Here the caller's own task queues the request's
//! `HEADERS` and its first message on the connection, and polls the response and its body
//! itself: a unary call spawns nothing, and its `HEADERS` and `DATA` leave in one write. The
//! connection's task only writes and reads. A request body still streaming when the response
//! arrives (a bidirectional stream) is finished on a task of its own, as hyper does.
//!
//! The kit uses it for targets whose every setting it knows (its default template and a
//! configuration file's `[endpoint]`, [`EndpointSettings`]) over plaintext (`http://`), with
//! the kit's connector ([`crate::connect`]); TLS, a user's connector or a user's endpoint
//! keep tonic's `Channel`. Its behaviour is the `Channel`'s:
//!
//! * **lazy**: the first call connects; calls made while connecting wait for the connection;
//!   if it fails, each of them fails with the connection's error (a refused connection is a
//!   call [never sent](endpoint_state::transport::never_sent)), and the next call tries
//!   again. A lost connection (reset, `GOAWAY`, keepalive timeout) is replaced by the next
//!   call's;
//! * **settings**: hyper's HTTP/2 client defaults (2 MiB stream window, 5 MiB connection
//!   window, 16 KiB frames and header lists, 1 MiB send buffer;
//!   [`http2_client`](endpoint_state::transport::http2_client) says where it differs: no cap of
//!   100 streams when the server names no limit), the endpoint's TCP settings
//!   and connect timeout, and the template's `timeout` (each call's), `origin` (the
//!   `:authority` and scheme sent), `user_agent` and keepalive;
//! * **keepalive** (gRFC A8): with `http2_keep_alive_interval` set, a `PING` every interval
//!   (while calls are in flight, or always with `keep_alive_while_idle`); no answer within
//!   `keep_alive_timeout` (20 s by default, as hyper) closes the connection. A server that
//!   answers with `GOAWAY ENHANCE_YOUR_CALM "too_many_pings"` doubles the interval of the
//!   target's later connections.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use bytes::Bytes;
use endpoint_state::NotProcessed;
use endpoint_state::time::FAR;
use endpoint_state::transport::{NeverSent, too_many_pings};
use h2::client::{ResponseFuture, SendRequest};
use h2::{RecvStream, SendStream};
use http::HeaderValue;
use http::uri::{Authority, Scheme};
use http_body::{Body as _, Frame};
use tokio::time::Sleep;
use tonic::body::Body;
use tonic::transport::Endpoint;
use tower_service::Service;

use crate::connect::Connector;
use crate::error::BoxError;
use crate::template::EndpointSettings;

/// hyper's default wait for a keepalive `PING`'s answer.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The user agent sent after the template's own (tonic's `Channel` sends `tonic/<version>`).
const KIT_USER_AGENT: &str = concat!("grpc-client-kit/", env!("CARGO_PKG_VERSION"));

/// A lazily connected HTTP/2 connection to one target. Clones share the connection.
pub(crate) struct Http2Client {
    shared: Arc<Shared>,
    /// This handle's view of the connection: its generation and h2's handle.
    send: Option<(u64, SendRequest<Bytes>)>,
}

impl Clone for Http2Client {
    fn clone(&self) -> Self {
        Http2Client {
            shared: self.shared.clone(),
            send: self.send.clone(),
        }
    }
}

impl fmt::Debug for Http2Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Http2Client")
            .field("scheme", &self.shared.scheme)
            .field("authority", &self.shared.authority)
            .finish_non_exhaustive()
    }
}

struct Shared {
    connector: Connector,
    /// Where to connect.
    uri: http::Uri,
    /// What requests name (the origin, else the endpoint's URI).
    scheme: Scheme,
    authority: Authority,
    user_agent: HeaderValue,
    timeout: Option<Duration>,
    keepalive: Option<Keepalive>,
    /// Calls whose response has not ended, counted only when keepalive needs it.
    in_flight: Option<Arc<AtomicUsize>>,
    conn: Mutex<Conn>,
}

#[derive(Debug, Clone, Copy)]
struct Keepalive {
    interval: Duration,
    timeout: Duration,
    while_idle: bool,
}

/// The connection's state, one generation per attempt.
struct Conn {
    generation: u64,
    phase: Phase,
    /// The keepalive interval of the next connection (doubled by `too_many_pings`).
    interval: Option<Duration>,
}

enum Phase {
    Idle,
    Connecting(Vec<Waker>),
    Ready(SendRequest<Bytes>),
    Failed(Arc<ConnectFailed>),
}

impl Http2Client {
    /// A connection to `endpoint` with `settings` (the template's, which made the endpoint),
    /// through `connector`. `None` when the endpoint is not plaintext HTTP (tonic's `Channel`
    /// then serves it).
    pub(crate) fn new(
        endpoint: &Endpoint,
        settings: &EndpointSettings,
        connector: Connector,
    ) -> Option<Http2Client> {
        let uri = endpoint.uri().clone();
        if uri.scheme() != Some(&Scheme::HTTP) {
            return None;
        }
        let origin = match &settings.origin {
            Some(origin) => origin.parse::<http::Uri>().ok()?,
            None => uri.clone(),
        };
        let scheme = origin.scheme().cloned().unwrap_or(Scheme::HTTP);
        let authority = origin.authority()?.clone();
        let user_agent = match &settings.user_agent {
            Some(agent) => HeaderValue::from_str(&format!("{agent} {KIT_USER_AGENT}")).ok()?,
            None => HeaderValue::from_static(KIT_USER_AGENT),
        };
        let keepalive = settings
            .http2_keep_alive_interval
            .map(|interval| Keepalive {
                interval: interval.min(FAR),
                timeout: settings
                    .keep_alive_timeout
                    .unwrap_or(KEEPALIVE_TIMEOUT)
                    .min(FAR),
                while_idle: settings.keep_alive_while_idle.unwrap_or(false),
            });
        let needs_count = keepalive.is_some_and(|k| !k.while_idle);
        Some(Http2Client {
            shared: Arc::new(Shared {
                connector,
                uri,
                scheme,
                authority,
                user_agent,
                timeout: settings.timeout.map(|t| t.min(FAR)),
                keepalive,
                in_flight: needs_count.then(Default::default),
                conn: Mutex::new(Conn {
                    generation: 0,
                    phase: Phase::Idle,
                    interval: keepalive.map(|k| k.interval),
                }),
            }),
            send: None,
        })
    }
}

impl Shared {
    fn conn(&self) -> std::sync::MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connection `generation` is gone: the next call makes a new one.
    fn lost(&self, generation: u64) {
        let mut conn = self.conn();
        if conn.generation == generation && matches!(conn.phase, Phase::Ready(_)) {
            conn.phase = Phase::Idle;
        }
    }

    /// Attempt `generation` ended: wakes its waiters.
    fn settle(&self, generation: u64, phase: Phase) {
        let waiters = {
            let mut conn = self.conn();
            if conn.generation != generation {
                return;
            }
            match std::mem::replace(&mut conn.phase, phase) {
                Phase::Connecting(waiters) => waiters,
                _ => Vec::new(),
            }
        };
        waiters.into_iter().for_each(Waker::wake);
    }
}

/// Makes connection `generation` and drives it until it ends (or every handle is gone).
async fn connect(shared: Weak<Shared>, generation: u64) {
    let Some(this) = shared.upgrade() else { return };
    let keepalive = this.keepalive.map(|k| Keepalive {
        interval: this.conn().interval.unwrap_or(k.interval),
        ..k
    });
    let in_flight = this.in_flight.clone();
    let connecting = this.connector.connect(this.uri.clone());
    drop(this);
    let made = async {
        let io = connecting.await.map_err(|e| Box::new(e) as BoxError)?;
        endpoint_state::transport::http2_client()
            .handshake::<_, Bytes>(io)
            .await
            .map_err(from_h2)
    }
    .await;
    let Some(this) = shared.upgrade() else { return };
    let mut connection = match made {
        Ok((send, connection)) => {
            this.settle(generation, Phase::Ready(send));
            connection
        }
        Err(e) => {
            this.settle(generation, Phase::Failed(Arc::new(ConnectFailed(e))));
            return;
        }
    };
    drop(this);
    let ended = match keepalive {
        Some(keepalive) => {
            let pings = connection.ping_pong();
            drive_with_pings(connection, pings, keepalive, in_flight).await
        }
        None => connection.await.map_err(from_h2),
    };
    if let Some(this) = shared.upgrade() {
        if let Err(e) = &ended
            && too_many_pings(&**e)
        {
            // gRFC A8: the server allows fewer pings; ask less often from now on, and say so.
            let mut conn = this.conn();
            conn.interval = conn.interval.map(|i| i.saturating_mul(2).min(FAR));
            tracing::warn!(
                target = %this.authority,
                keepalive_interval = ?conn.interval,
                "the server closed the connection with GOAWAY too_many_pings; \
                 the keepalive interval of new connections is doubled"
            );
        }
        this.lost(generation);
    }
}

/// Drives `connection`, sending a `PING` every interval while calls are in flight (or
/// always); no answer within the timeout ends it.
async fn drive_with_pings<T>(
    connection: h2::client::Connection<T, Bytes>,
    pings: Option<h2::PingPong>,
    keepalive: Keepalive,
    in_flight: Option<Arc<AtomicUsize>>,
) -> Result<(), BoxError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    tokio::pin!(connection);
    let Some(mut pings) = pings else {
        return connection.await.map_err(from_h2);
    };
    loop {
        tokio::select! {
            ended = &mut connection => return ended.map_err(from_h2),
            () = tokio::time::sleep(keepalive.interval) => {}
        }
        let busy = in_flight
            .as_ref()
            .is_none_or(|n| n.load(Ordering::Relaxed) > 0);
        if !(keepalive.while_idle || busy) {
            continue;
        }
        tokio::select! {
            ended = &mut connection => return ended.map_err(from_h2),
            pong = pings.ping(h2::Ping::opaque()) => {
                if let Err(e) = pong {
                    return Err(from_h2(e));
                }
            }
            () = tokio::time::sleep(keepalive.timeout) => {
                return Err(Box::new(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "keepalive: no answer to a PING in time",
                )));
            }
        }
    }
}

/// A connection attempt's error, shared by the calls that waited for it.
#[derive(Debug)]
pub(crate) struct ConnectFailed(BoxError);

impl fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "connecting: {}", self.0)
    }
}

impl Error for ConnectFailed {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.0)
    }
}

impl Service<http::Request<Body>> for Http2Client {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = Http2Future;

    /// Ready at once while the connection is being made (the call waits for it, as a tonic
    /// `Channel`'s does); not ready only while the server's limit of concurrent streams is
    /// reached.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        loop {
            if let Some((generation, send)) = &mut self.send {
                match send.poll_ready(cx) {
                    Poll::Ready(Ok(())) => return Poll::Ready(Ok(())),
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(_)) => {
                        let generation = *generation;
                        self.send = None;
                        self.shared.lost(generation);
                    }
                }
            }
            let mut conn = self.shared.conn();
            if let Phase::Ready(send) = &conn.phase {
                self.send = Some((conn.generation, send.clone()));
                continue;
            }
            if !matches!(conn.phase, Phase::Connecting(_)) {
                start_connecting(&self.shared, &mut conn);
            }
            return Poll::Ready(Ok(()));
        }
    }

    fn call(&mut self, req: http::Request<Body>) -> Http2Future {
        let timer = self.shared.timeout.map(|t| Box::pin(tokio::time::sleep(t)));
        let state = match &mut self.send {
            Some((_, send)) => send_on(&self.shared, send, req),
            None => {
                let generation = self.shared.conn().generation;
                State::Connecting(Box::new(Waiting {
                    request: Some(req),
                    shared: self.shared.clone(),
                    generation,
                }))
            }
        };
        Http2Future { state, timer }
    }
}

/// Starts connection attempt `generation + 1`; calls wait for it.
fn start_connecting(shared: &Arc<Shared>, conn: &mut Conn) {
    conn.generation += 1;
    conn.phase = Phase::Connecting(Vec::new());
    tokio::spawn(connect(Arc::downgrade(shared), conn.generation));
}

/// Sends `req` on the connection `send` is a handle of.
fn send_on(shared: &Shared, send: &mut SendRequest<Bytes>, req: http::Request<Body>) -> State {
    let (mut parts, body) = req.into_parts();
    let mut uri = http::uri::Parts::from(std::mem::take(&mut parts.uri));
    uri.scheme = Some(shared.scheme.clone());
    uri.authority = Some(shared.authority.clone());
    parts.uri = match http::Uri::from_parts(uri) {
        Ok(uri) => uri,
        Err(e) => return State::Failed(Some(Box::new(e))),
    };
    strip_connection_headers(&mut parts.headers);
    match parts.headers.entry(http::header::USER_AGENT) {
        http::header::Entry::Vacant(v) => {
            v.insert(shared.user_agent.clone());
        }
        http::header::Entry::Occupied(mut o) => {
            let mut joined = o.get().as_bytes().to_vec();
            joined.push(b' ');
            joined.extend_from_slice(shared.user_agent.as_bytes());
            if let Ok(v) = HeaderValue::from_bytes(&joined) {
                o.insert(v);
            }
        }
    }
    let end = body.is_end_stream();
    match send.send_request(http::Request::from_parts(parts, ()), end) {
        Ok((response, stream)) => State::Sending {
            pump: (!end).then(|| Pump::new(body, stream)),
            response: Some(response),
            in_flight: shared.in_flight.clone().map(InFlight::new),
        },
        // The connection failed or closed before it took the request.
        Err(e) => State::Failed(Some(Box::new(NeverSent(from_h2(e))))),
    }
}

/// Removes the headers HTTP/2 forbids (RFC 9113 §8.2.2), which h2 refuses to send. A
/// generated client sends none of them: one look through the few headers it sends (names
/// compared, none hashed) comes first.
fn strip_connection_headers(headers: &mut http::HeaderMap) {
    const FORBIDDEN: [&str; 5] = [
        "connection",
        "transfer-encoding",
        "upgrade",
        "keep-alive",
        "proxy-connection",
    ];
    let forbidden = |name: &http::HeaderName, value: &HeaderValue| {
        FORBIDDEN.contains(&name.as_str()) || (name == http::header::TE && value != "trailers")
    };
    if !headers.iter().any(|(name, value)| forbidden(name, value)) {
        return;
    }
    for name in FORBIDDEN {
        headers.remove(name);
    }
    if headers
        .get(http::header::TE)
        .is_some_and(|te| te != "trailers")
    {
        headers.remove(http::header::TE);
    }
}

/// Counts a call in flight (for keepalive without `keep_alive_while_idle`) until dropped.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        InFlight(count)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request body being sent on its stream.
struct Pump {
    body: Body,
    stream: SendStream<Bytes>,
    /// The first message goes out with the `HEADERS` (h2 holds it until the stream opens).
    first: bool,
    /// The first message, kept while the body is asked whether it ends there: a unary
    /// request then goes out as one `DATA` frame that ends the stream, not two.
    lookahead: Option<Bytes>,
    /// A later message (and whether it ends the body), waiting for the stream's
    /// flow-control window: h2 would buffer whatever it is given.
    held: Option<(Bytes, bool)>,
}

impl Pump {
    fn new(body: Body, stream: SendStream<Bytes>) -> Self {
        Pump {
            body,
            stream,
            first: true,
            lookahead: None,
            held: None,
        }
    }

    /// Sends what the body has ready; `Ready(Ok)` once all of it is sent, or the stream can
    /// take no more (the server answered, or reset it: the response tells the call's fate).
    /// An error is the body's own: the stream is then reset.
    ///
    /// A unary call's body (one message, then its end) is sent whole in the first poll,
    /// without waiting for the stream to open: the connection writes it with the `HEADERS`.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        loop {
            if let Some((data, end)) = self.held.take() {
                if self.stream.capacity() < data.len() {
                    self.stream.reserve_capacity(data.len());
                    match self.stream.poll_capacity(cx) {
                        Poll::Pending => {
                            self.held = Some((data, end));
                            return Poll::Pending;
                        }
                        Poll::Ready(Some(Ok(_))) => {}
                        Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(Ok(())),
                    }
                }
                if self.stream.send_data(data, end).is_err() || end {
                    return Poll::Ready(Ok(()));
                }
            }
            let frame = match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => {
                    // The body does not end yet: the first message goes alone.
                    if let Some(data) = self.lookahead.take()
                        && self.stream.send_data(data, false).is_err()
                    {
                        return Poll::Ready(Ok(()));
                    }
                    // Nothing to send; stop if the server has reset the stream.
                    return match self.stream.poll_reset(cx) {
                        Poll::Ready(_) => Poll::Ready(Ok(())),
                        Poll::Pending => Poll::Pending,
                    };
                }
                Poll::Ready(frame) => frame,
            };
            match frame {
                None => {
                    // The first message with the end, or an empty DATA frame (which needs no
                    // window).
                    let last = self.lookahead.take().unwrap_or_default();
                    let _ = self.stream.send_data(last, true);
                    return Poll::Ready(Ok(()));
                }
                Some(Err(e)) => {
                    self.stream.send_reset(h2::Reason::CANCEL);
                    // The request's own failure, not the server's. Before its first message
                    // the server had nothing to process.
                    let nothing_sent = self.first || self.lookahead.take().is_some();
                    return Poll::Ready(Err(if nothing_sent {
                        Box::new(NotProcessed::new(e))
                    } else {
                        Box::new(e)
                    }));
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        // A second message: the first goes alone.
                        if let Some(first) = self.lookahead.take()
                            && self.stream.send_data(first, false).is_err()
                        {
                            return Poll::Ready(Ok(()));
                        }
                        let end = self.body.is_end_stream();
                        if std::mem::take(&mut self.first) {
                            if end {
                                let _ = self.stream.send_data(data, true);
                                return Poll::Ready(Ok(()));
                            }
                            self.lookahead = Some(data);
                        } else {
                            self.held = Some((data, end));
                        }
                    }
                    Err(frame) => {
                        if let Some(first) = self.lookahead.take() {
                            let _ = self.stream.send_data(first, false);
                        }
                        let _ = match frame.into_trailers() {
                            Ok(trailers) => self.stream.send_trailers(trailers),
                            Err(_) => self.stream.send_data(Bytes::new(), true),
                        };
                        return Poll::Ready(Ok(()));
                    }
                },
            }
        }
    }
}

/// A request body finished on its own task after the response arrived.
struct Finish(Pump);

impl Future for Finish {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.poll_send(cx).map(|_| ())
    }
}

/// The response future of [`Http2Client`]. Small (the futures of the layers above hold it, and
/// are moved as they are made): the rare parts (a call waiting for its connection, a timer)
/// are boxed.
pub(crate) struct Http2Future {
    state: State,
    /// The template's `timeout`, if it sets one.
    timer: Option<Pin<Box<Sleep>>>,
}

/// A call waiting for connection attempt `generation`.
struct Waiting {
    request: Option<http::Request<Body>>,
    shared: Arc<Shared>,
    generation: u64,
}

enum State {
    Connecting(Box<Waiting>),
    Sending {
        pump: Option<Pump>,
        response: Option<ResponseFuture>,
        in_flight: Option<InFlight>,
    },
    Failed(Option<BoxError>),
}

impl Future for Http2Future {
    type Output = Result<http::Response<Body>, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let polled = this.state.poll(cx);
        if polled.is_pending()
            && let Some(timer) = this.timer.as_mut()
            && timer.as_mut().poll(cx).is_ready()
        {
            this.state = State::Failed(None);
            return Poll::Ready(Err(Box::new(tower::timeout::error::Elapsed::new())));
        }
        polled
    }
}

impl State {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<http::Response<Body>, BoxError>> {
        loop {
            match self {
                State::Failed(error) => {
                    return Poll::Ready(Err(error
                        .take()
                        .unwrap_or_else(|| "polled after completion".into())));
                }
                State::Connecting(waiting) => {
                    let Waiting {
                        request,
                        shared,
                        generation,
                    } = &mut **waiting;
                    let shared = shared.clone();
                    let mut conn = shared.conn();
                    let current = conn.generation;
                    let next = match &mut conn.phase {
                        Phase::Ready(send) => {
                            let mut send = send.clone();
                            drop(conn);
                            let Some(req) = request.take() else {
                                return Poll::Ready(Err("polled after completion".into()));
                            };
                            send_on(&shared, &mut send, req)
                        }
                        Phase::Connecting(waiters) => {
                            if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                                waiters.push(cx.waker().clone());
                            }
                            *generation = conn.generation;
                            return Poll::Pending;
                        }
                        Phase::Failed(error) if current == *generation => {
                            State::Failed(Some(Box::new(Arc::clone(error))))
                        }
                        // Lost before this call had it, or an older failure: try again.
                        Phase::Idle | Phase::Failed(_) => {
                            start_connecting(&shared, &mut conn);
                            *generation = conn.generation;
                            continue;
                        }
                    };
                    *self = next;
                }
                State::Sending {
                    pump,
                    response,
                    in_flight,
                } => {
                    if let Some(p) = pump.as_mut() {
                        match p.poll_send(cx) {
                            Poll::Ready(Ok(())) => *pump = None,
                            Poll::Ready(Err(e)) => {
                                *self = State::Failed(None);
                                return Poll::Ready(Err(e));
                            }
                            Poll::Pending => {}
                        }
                    }
                    let Some(future) = response.as_mut() else {
                        return Poll::Ready(Err("polled after completion".into()));
                    };
                    let result = ready!(Pin::new(future).poll(cx));
                    *response = None;
                    let response = result.map_err(from_h2)?;
                    if let Some(pump) = pump.take() {
                        tokio::spawn(Finish(pump));
                    }
                    let in_flight = in_flight.take();
                    return Poll::Ready(Ok(response.map(|recv| {
                        Body::new(Http2Body {
                            recv,
                            data_done: false,
                            _in_flight: in_flight,
                        })
                    })));
                }
            }
        }
    }
}

/// A response body read from its h2 stream, its window given back as it is read.
struct Http2Body {
    recv: RecvStream,
    data_done: bool,
    _in_flight: Option<InFlight>,
}

impl http_body::Body for Http2Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if !self.data_done {
            match ready!(self.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(from_h2(e)))),
                None => self.data_done = true,
            }
        }
        match ready!(self.recv.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(from_h2(e)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }
}

/// An h2 error as the kit's error readers expect it (and hyper gives it): a failure of the
/// connection's I/O as that `io::Error` itself, anything else as h2's error.
fn from_h2(error: h2::Error) -> BoxError {
    if error.is_io() {
        match error.into_io() {
            Some(io) => Box::new(io),
            None => "an h2 I/O error without its cause".into(),
        }
    } else {
        Box::new(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every layer above holds this future and moves it as its own is made: kept small (a
    /// call waiting for its connection and the timer are boxed), it costs no copying.
    #[test]
    fn the_response_future_is_small() {
        assert!(
            std::mem::size_of::<Http2Future>() <= 160,
            "{} bytes",
            std::mem::size_of::<Http2Future>()
        );
    }

    /// A body that does not say it has ended until asked again (as tonic's encoder): its one
    /// message still leaves as one `DATA` frame that ends the stream, in the write of the
    /// request's `HEADERS`.
    #[tokio::test]
    async fn a_unary_request_is_one_data_frame_in_the_headers_write() {
        use test_backends::wire::{END_STREAM, FRAME_DATA, record_tcp};

        let backends = test_backends::Backends::start(1).await.unwrap();
        let (io, writes) = record_tcp(backends[0].addr()).await.unwrap();
        let (send, connection) = h2::client::Builder::new()
            .handshake::<_, Bytes>(io)
            .await
            .unwrap();
        tokio::spawn(connection);
        let mut send = send.ready().await.unwrap();
        let request = http::Request::post(format!(
            "{}{}",
            backends[0].uri(),
            test_backends::pb::UNARY_PATH
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
        let (response, stream) = send.send_request(request, false).unwrap();
        // One gRPC message: an empty `Ping`.
        let message = Ok::<_, tonic::Status>(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0])));
        let body = http_body_util::StreamBody::new(futures_util::stream::iter([message]));
        let mut pump = Pump::new(Body::new(body), stream);
        std::future::poll_fn(|cx| pump.poll_send(cx)).await.unwrap();
        let mut recv = response.await.unwrap().into_body();
        while let Some(data) = recv.data().await {
            data.unwrap();
        }
        let trailers = recv.trailers().await.unwrap().unwrap();
        assert_eq!(trailers["grpc-status"], "0", "{trailers:?}");

        let data: Vec<_> = writes
            .frames()
            .into_iter()
            .filter(|f| f.kind == FRAME_DATA && f.stream == 1)
            .collect();
        assert_eq!(data.len(), 1, "{data:?}");
        assert_eq!(data[0].flags & END_STREAM, END_STREAM);
        writes.assert_requests_whole(1);
    }

    #[test]
    fn forbidden_headers_are_removed_and_te_trailers_kept() {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        let before = headers.clone();
        strip_connection_headers(&mut headers);
        assert_eq!(headers, before);
        headers.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        strip_connection_headers(&mut headers);
        assert_eq!(headers, before);
        headers.insert(http::header::TE, HeaderValue::from_static("gzip"));
        strip_connection_headers(&mut headers);
        assert!(headers.get(http::header::TE).is_none());
    }
}

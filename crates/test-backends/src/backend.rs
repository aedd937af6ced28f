//! The backend handle: lifecycle (serve, stop, restart, black hole), health and fault controls,
//! counters.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Index;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::Server;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};
use tower::util::MapRequestLayer;

use crate::black_hole::BlackHole;
use crate::conn::{self, Incoming};
use crate::pb::SERVICE_NAME;
use crate::pb::test_service_server::TestServiceServer;
use crate::service::{Counters, Faults, TestServiceImpl};

/// How long `stop` waits for the server task after killing every connection before aborting it.
/// Killing is immediate, so this is only a safety net against a hung test.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// What a backend's port is doing right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The gRPC server (health + test service) is serving.
    Serving,
    /// Nothing listens on the port: connects are refused.
    Stopped,
    /// A [`BlackHole`] holds the port: connects succeed, nothing is ever answered.
    BlackHole,
}

/// Server settings of a [`Backend`], given to [`Backend::start_with`] and kept across
/// [`restart`](Backend::restart). The default is tonic's own default server (no connection age)
/// with the health service.
///
/// tonic's `Server` has no max-connection-idle setting and no keepalive enforcement: it answers
/// every client PING, however often (no `too_many_pings` GOAWAY), and keeps an idle connection
/// open for as long as the client does.
///
/// One tonic 0.14 quirk to know: with [`max_connection_age_grace`](Self::max_connection_age_grace)
/// set, a connection gets no GOAWAY at its maximum age; it is closed at age + grace, abruptly
/// (calls still in flight fail). Only with the age alone does it get a graceful GOAWAY at its age
/// (and is then closed once its calls have finished, however long that takes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerOptions {
    /// tonic's `Server::max_connection_age`: a connection older than this is shut down.
    /// `None` (the default): no limit.
    pub max_connection_age: Option<Duration>,
    /// tonic's `Server::max_connection_age_grace` (see the type's docs). `None` (the default):
    /// no forced close.
    pub max_connection_age_grace: Option<Duration>,
    /// Whether `grpc.health.v1.Health` is served (the default). Without it a health check gets
    /// `UNIMPLEMENTED`; the backend's health setters then change nothing anyone can see.
    pub health: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            max_connection_age: None,
            max_connection_age_grace: None,
            health: true,
        }
    }
}

impl ServerOptions {
    /// Sets [`max_connection_age`](Self::max_connection_age).
    #[must_use]
    pub fn max_connection_age(mut self, age: Duration) -> Self {
        self.max_connection_age = Some(age);
        self
    }

    /// Sets [`max_connection_age_grace`](Self::max_connection_age_grace).
    #[must_use]
    pub fn max_connection_age_grace(mut self, grace: Duration) -> Self {
        self.max_connection_age_grace = Some(grace);
        self
    }

    /// Sets [`health`](Self::health).
    #[must_use]
    pub fn health(mut self, health: bool) -> Self {
        self.health = health;
        self
    }
}

/// A handle on one real tonic server on `127.0.0.1`, with `grpc.health.v1.Health` and
/// `gck.test.v1.TestService`, fault controls and counters.
///
/// Cheap to clone: all clones control the same server. The port stays the same for the
/// backend's whole life, across [`stop`](Self::stop) and [`restart`](Self::restart). The server
/// is stopped abruptly when the last clone is dropped.
#[derive(Clone)]
pub struct Backend {
    shared: Arc<Shared>,
}

struct Shared {
    name: Arc<str>,
    addr: SocketAddr,
    /// Kept for every serving generation.
    options: ServerOptions,
    /// Created once: health statuses survive restarts.
    health: HealthReporter,
    health_server: HealthServer<HealthService>,
    faults: Arc<Faults>,
    counters: Arc<Counters>,
    /// Serialises lifecycle changes; never locked on the request path.
    state: Mutex<State>,
}

enum State {
    Serving(Running),
    Stopped,
    BlackHole(BlackHole),
}

/// One serving generation.
struct Running {
    /// Cancelling it kills every connection at once (and, through its child, stops accepting).
    kill: CancellationToken,
    /// Child of `kill`: cancelling it alone stops accepting and drains gracefully (GOAWAY).
    shutdown: CancellationToken,
    /// The server task; `None` once it has been awaited to completion.
    task: Option<JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill.cancel();
    }
}

impl Running {
    /// Waits up to `limit` for the server task to end; `true` once it has.
    async fn wait(&mut self, limit: Duration) -> bool {
        let Some(task) = self.task.as_mut() else {
            return true;
        };
        let ended = tokio::time::timeout(limit, task).await.is_ok();
        if ended {
            self.task = None;
        }
        ended
    }

    /// Kills every connection and waits until the server task has ended (port released).
    async fn kill(mut self) {
        self.kill.cancel();
        if !self.wait(KILL_WAIT).await {
            tracing::warn!("test backend did not stop in time; aborting its task");
            if let Some(task) = self.task.take() {
                task.abort();
                let _ = task.await;
            }
        }
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = self.shared.state.try_lock().map(|s| s.mode()).ok();
        f.debug_struct("Backend")
            .field("name", &self.shared.name)
            .field("addr", &self.shared.addr)
            .field("mode", &mode)
            .field("hits", &self.hits())
            .field("open_connections", &self.open_connections())
            .finish_non_exhaustive()
    }
}

impl State {
    fn mode(&self) -> Mode {
        match self {
            State::Serving(_) => Mode::Serving,
            State::Stopped => Mode::Stopped,
            State::BlackHole(_) => Mode::BlackHole,
        }
    }

    /// Leaves the current mode; returns once the port is released.
    async fn leave(&mut self) {
        match std::mem::replace(self, State::Stopped) {
            State::Serving(running) => running.kill().await,
            State::BlackHole(hole) => hole.stop().await,
            State::Stopped => {}
        }
    }
}

impl Backend {
    /// Starts a backend named `name` on `127.0.0.1` on a free port. Health is `SERVING` for `""`
    /// and for `gck.test.v1.TestService`.
    pub async fn start(name: impl Into<String>) -> io::Result<Self> {
        Self::start_with(name, ServerOptions::default()).await
    }

    /// As [`start`](Self::start), with server settings, kept across restarts.
    pub async fn start_with(name: impl Into<String>, options: ServerOptions) -> io::Result<Self> {
        let listener = conn::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
        let addr = listener.local_addr()?;
        let health = HealthReporter::new();
        health.set_service_status("", ServingStatus::Serving).await;
        health
            .set_service_status(SERVICE_NAME, ServingStatus::Serving)
            .await;
        let health_server = HealthServer::new(HealthService::from_health_reporter(health.clone()));
        let shared = Arc::new(Shared {
            name: Arc::from(name.into()),
            addr,
            options,
            health,
            health_server,
            faults: Arc::default(),
            counters: Arc::default(),
            state: Mutex::new(State::Stopped),
        });
        *shared.state.lock().await = State::Serving(shared.serve(listener));
        Ok(Self { shared })
    }

    /// The backend's name, e.g. `"b0"`; every reply carries it in `Pong::backend`.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The server settings it was started with.
    pub fn options(&self) -> &ServerOptions {
        &self.shared.options
    }

    /// The address it serves on; the same for its whole life.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `http://127.0.0.1:PORT`, ready for `tonic::transport::Endpoint::from_shared`.
    pub fn uri(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// What the port is doing now.
    pub async fn mode(&self) -> Mode {
        self.shared.state.lock().await.mode()
    }

    // ----- lifecycle -----

    /// Stops abruptly: every open connection is closed at once with an RST (in-flight calls fail,
    /// nothing drains), pending delayed calls end, and the listener is closed. Returns once the
    /// port refuses connections. Also leaves black-hole mode. Does nothing if already stopped.
    pub async fn stop(&self) {
        self.shared.state.lock().await.leave().await;
    }

    /// Stops gracefully: stops accepting (the port refuses connections at once), sends GOAWAY on
    /// every connection and lets in-flight calls finish. Connections still open after `grace`
    /// (e.g. a health `Watch`, which never ends) are then killed as in [`stop`](Self::stop).
    /// Returns once every connection is closed.
    pub async fn stop_graceful(&self, grace: Duration) {
        let mut state = self.shared.state.lock().await;
        if let State::Serving(running) = &mut *state {
            running.shutdown.cancel();
            // Drained or not, `leave` below finishes the job: kill whatever is left and wait.
            running.wait(grace).await;
        }
        state.leave().await;
    }

    /// Serves again on the same port (from any mode; when serving, this is a [`stop`](Self::stop)
    /// then a start). Health statuses, faults and counters are kept. Returns once the port is
    /// bound and accepting.
    pub async fn restart(&self) -> io::Result<()> {
        let mut state = self.shared.state.lock().await;
        state.leave().await;
        let listener = conn::bind(self.shared.addr)?;
        *state = State::Serving(self.shared.serve(listener));
        Ok(())
    }

    /// Stops (as [`stop`](Self::stop)) and puts a [`BlackHole`] on the same port: connects succeed,
    /// nothing is ever answered. [`restart`](Self::restart) returns to normal. Returns once the
    /// black hole is listening.
    pub async fn black_hole(&self) -> io::Result<()> {
        let mut state = self.shared.state.lock().await;
        state.leave().await;
        *state = State::BlackHole(BlackHole::bind(self.shared.addr).await?);
        Ok(())
    }

    // ----- health -----

    /// Sets the health of the whole server (service name `""`): `SERVING` or `NOT_SERVING`.
    /// Survives restarts. Does not touch per-service statuses.
    pub async fn set_serving(&self, serving: bool) {
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        self.set_service_status("", status).await;
    }

    /// Sets the health of one service name (any name; unknown names are added). Watchers are
    /// notified. Survives restarts.
    pub async fn set_service_status(&self, service_name: &str, status: ServingStatus) {
        self.shared
            .health
            .set_service_status(service_name, status)
            .await;
    }

    /// The backend's health reporter, for anything the setters above do not cover.
    pub fn health_reporter(&self) -> HealthReporter {
        self.shared.health.clone()
    }

    // ----- faults -----

    /// Delays every test-service call (unary, and each stream before its first message) by
    /// `delay` before it is answered or failed. `Duration::ZERO` turns it off.
    pub fn set_delay(&self, delay: Duration) {
        self.shared.faults.set_delay(delay);
    }

    /// The next `n` test-service calls fail with `code` (which should not be `Ok`): unary as a
    /// trailers-only error, server-stream with one message and then the error in the trailers.
    /// Replaces any previous `fail_next`; `n = 0` clears it.
    pub fn fail_next(&self, n: u64, code: Code) {
        self.shared.faults.fail_next(n, code);
    }

    /// Every test-service call fails with `code` until called with `None`. Takes precedence over
    /// [`fail_next`](Self::fail_next), whose count it does not consume.
    pub fn fail_always(&self, code: Option<Code>) {
        self.shared.faults.fail_always(code);
    }

    /// Injected failures (of [`fail_next`](Self::fail_next) and
    /// [`fail_always`](Self::fail_always)) carry `grpc-retry-pushback-ms: value` (gRFC A6's
    /// server pushback; any text, to test malformed ones) until called with `None`.
    pub fn set_pushback(&self, value: Option<&str>) {
        self.shared.faults.set_pushback(value);
    }

    // ----- counters -----

    /// Test-service calls received (both methods; answered or failed).
    pub fn hits(&self) -> u64 {
        self.shared.counters.hits.load(Ordering::Relaxed)
    }

    /// Requests received on the HTTP/2 path `path`, of any service, e.g.
    /// [`pb::UNARY_PATH`](crate::pb::UNARY_PATH) or
    /// [`pb::HEALTH_CHECK_PATH`](crate::pb::HEALTH_CHECK_PATH).
    pub fn hits_for(&self, path: &str) -> u64 {
        self.shared.counters.hits_for(path)
    }

    /// Health `Check` and `Watch` requests received.
    pub fn health_checks(&self) -> u64 {
        self.shared.counters.health_checks.load(Ordering::Relaxed)
    }

    /// TCP connections open now on the gRPC server (not counting black-hole ones).
    pub fn open_connections(&self) -> u64 {
        self.shared
            .counters
            .open_connections
            .load(Ordering::Relaxed)
    }

    /// TCP connections accepted by the gRPC server since start (or the last reset).
    pub fn connections_accepted(&self) -> u64 {
        self.shared
            .counters
            .connections_accepted
            .load(Ordering::Relaxed)
    }

    /// Headers (HTTP/2 headers, i.e. gRPC metadata plus `user-agent`, `te`, `content-type`, ...)
    /// of the most recent request of any service; `None` before the first one.
    pub fn last_request_headers(&self) -> Option<http::HeaderMap> {
        self.shared.counters.last_request_headers()
    }

    /// The headers of the last 32 test-service requests, oldest first.
    pub fn recent_request_headers(&self) -> Vec<http::HeaderMap> {
        self.shared.counters.recent_request_headers()
    }

    /// Unary test-service calls dropped before they were answered (their client cancelled
    /// them, or went away): while delayed, typically.
    pub fn cancelled(&self) -> u64 {
        self.shared.counters.cancelled.load(Ordering::Relaxed)
    }

    /// From now on, records the [`CALL_ID_HEADER`](crate::CALL_ID_HEADER) (`x-call-id`, a
    /// decimal `u64`) of every test-service request this backend receives, so that a benchmark
    /// can tell which calls reached it whatever their outcome. Starts from an empty record.
    pub fn record_call_ids(&self) {
        self.shared.counters.record_call_ids();
    }

    /// The call ids recorded since [`record_call_ids`](Self::record_call_ids) or the last
    /// call of this (empty if recording is off).
    pub fn take_call_ids(&self) -> Vec<u64> {
        self.shared.counters.take_call_ids()
    }

    /// Resets every counter (and the last headers) except `open_connections`, which is a gauge.
    pub fn reset_counters(&self) {
        self.shared.counters.reset();
    }
}

impl Shared {
    /// Starts a serving generation on `listener`.
    fn serve(&self, listener: TcpListener) -> Running {
        let kill = CancellationToken::new();
        let shutdown = kill.child_token();
        let incoming = Incoming::new(listener, kill.clone(), Arc::clone(&self.counters));
        let test_service = TestServiceServer::new(TestServiceImpl {
            name: Arc::clone(&self.name),
            faults: Arc::clone(&self.faults),
            counters: Arc::clone(&self.counters),
            killed: kill.clone(),
        });
        let counters = Arc::clone(&self.counters);
        let record = MapRequestLayer::new(move |req: http::Request<tonic::body::Body>| {
            counters.record_request(&req);
            req
        });
        let mut server = Server::builder();
        if let Some(age) = self.options.max_connection_age {
            server = server.max_connection_age(age);
        }
        if let Some(grace) = self.options.max_connection_age_grace {
            server = server.max_connection_age_grace(grace);
        }
        let health = self.options.health.then(|| self.health_server.clone());
        let router = server
            .layer(record)
            .add_optional_service(health)
            .add_service(test_service);
        let name = Arc::clone(&self.name);
        let signal = shutdown.clone().cancelled_owned();
        let task = tokio::spawn(async move {
            if let Err(error) = router.serve_with_incoming_shutdown(incoming, signal).await {
                tracing::warn!(backend = %name, %error, "test backend server failed");
            }
        });
        tracing::debug!(backend = %self.name, addr = %self.addr, "test backend serving");
        Running {
            kill,
            shutdown,
            task: Some(task),
        }
    }
}

/// Several [`Backend`]s, named `b0`, `b1`, ...
#[derive(Clone, Debug)]
pub struct Backends {
    backends: Vec<Backend>,
}

impl Backends {
    /// Starts `n` backends named `b0` .. `b{n-1}`, each on its own free port.
    pub async fn start(n: usize) -> io::Result<Self> {
        let mut backends = Vec::with_capacity(n);
        for i in 0..n {
            backends.push(Backend::start(format!("b{i}")).await?);
        }
        Ok(Self { backends })
    }

    /// The backends, in name order.
    pub fn as_slice(&self) -> &[Backend] {
        &self.backends
    }

    /// Iterates over the backends in name order.
    pub fn iter(&self) -> std::slice::Iter<'_, Backend> {
        self.backends.iter()
    }

    /// How many backends there are.
    pub fn len(&self) -> usize {
        self.backends.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.backends.is_empty()
    }

    /// Every backend's URI, in name order.
    pub fn uris(&self) -> Vec<String> {
        self.iter().map(Backend::uri).collect()
    }

    /// Every backend's address, in name order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.iter().map(Backend::addr).collect()
    }

    /// The sum of every backend's [`hits`](Backend::hits).
    pub fn total_hits(&self) -> u64 {
        self.iter().map(Backend::hits).sum()
    }

    /// The backend named `name`, if any.
    pub fn by_name(&self, name: &str) -> Option<&Backend> {
        self.iter().find(|b| b.name() == name)
    }
}

impl Index<usize> for Backends {
    type Output = Backend;

    fn index(&self, index: usize) -> &Backend {
        &self.backends[index]
    }
}

impl<'a> IntoIterator for &'a Backends {
    type Item = &'a Backend;
    type IntoIter = std::slice::Iter<'a, Backend>;

    fn into_iter(self) -> Self::IntoIter {
        self.backends.iter()
    }
}

impl IntoIterator for Backends {
    type Item = Backend;
    type IntoIter = std::vec::IntoIter<Backend>;

    fn into_iter(self) -> Self::IntoIter {
        self.backends.into_iter()
    }
}

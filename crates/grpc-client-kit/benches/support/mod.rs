//! What the end-to-end and reaction benchmarks share: settings from arguments and the
//! environment, the runtimes, test backends in a child process, the baseline clients, a
//! closed-loop unary load generator with an HDR histogram, CPU accounting (per runtime or per
//! process), and table formatting.
//!
//! Not every bench binary uses every item.
#![allow(dead_code)]

use std::future::Future;
use std::io::{BufRead, BufReader, Lines, Write};
use std::pin::Pin;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::{Ping, Pong};
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

/// The boxed error tonic's generated clients accept from a transport.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

// ----- settings -----

/// Command-line arguments after `--` (`cargo bench --bench e2e -- --secs 2`), falling back to
/// an environment variable, then to a default. `cargo bench` itself passes `--bench`, which is
/// how a real benchmark run is told apart from `cargo test --benches` (a smoke run).
#[derive(Debug, Clone)]
pub(crate) struct Args {
    args: Vec<String>,
}

impl Args {
    /// The process arguments.
    pub(crate) fn from_env() -> Self {
        Self {
            args: std::env::args().skip(1).collect(),
        }
    }

    /// Whether `cargo bench` started us (it passes `--bench`); `false` under `cargo test`.
    pub(crate) fn is_bench(&self) -> bool {
        self.args.iter().any(|a| a == "--bench")
    }

    /// Whether `--flag` was given.
    pub(crate) fn flag(&self, flag: &str) -> bool {
        self.args.iter().any(|a| a == flag)
    }

    /// `--name VALUE` or `--name=VALUE`, else the environment variable `env`, else `default`.
    pub(crate) fn get<T: std::str::FromStr>(&self, name: &str, env: &str, default: T) -> T {
        let long = format!("--{name}");
        let prefix = format!("--{name}=");
        let mut from_args = None;
        for (i, a) in self.args.iter().enumerate() {
            if let Some(v) = a.strip_prefix(&prefix) {
                from_args = Some(v.to_string());
            } else if *a == long {
                from_args = self.args.get(i + 1).cloned();
            }
        }
        let raw = from_args.or_else(|| std::env::var(env).ok());
        match raw {
            Some(raw) => raw
                .parse()
                .unwrap_or_else(|_| panic!("--{name} / {env}: cannot parse {raw:?}")),
            None => default,
        }
    }

    /// A duration in (fractional) seconds, as [`get`](Self::get).
    pub(crate) fn secs(&self, name: &str, env: &str, default: f64) -> Duration {
        Duration::from_secs_f64(self.get(name, env, default))
    }
}

// ----- runtimes -----

/// A multi-thread runtime with `workers` threads named `name` (the name is how the CPU
/// accounting below tells the client side from the servers).
pub(crate) fn runtime(name: &str, workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name(name)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Thread-name prefix of the client runtime.
pub(crate) const CLIENT_THREADS: &str = "gck-client";
/// Thread-name prefix of the backends' runtime.
pub(crate) const SERVER_THREADS: &str = "gck-server";

// ----- backends in a child process -----

/// Set (to how many backends to serve) in the environment of a bench binary re-executed as a
/// backends process; see [`serve_backends_if_child`].
pub(crate) const BACKENDS_CHILD_ENV: &str = "GCK_BENCH_BACKENDS_CHILD";
/// The backends process's runtime's worker threads.
pub(crate) const BACKENDS_CHILD_WORKERS_ENV: &str = "GCK_BENCH_BACKENDS_CHILD_WORKERS";

/// If this process is a backends process (started by [`BackendsProcess::start`]), serves and
/// returns `true` once its stdin is closed; otherwise returns `false` at once.
///
/// The child starts its test backends on a runtime of its own (threads named
/// [`SERVER_THREADS`]), prints their URIs on one line of stdout, then answers one line per
/// command read from stdin:
///
/// * `hits` — every backend's test-service calls so far, space-separated;
/// * `cancelled` — every backend's cancelled unary calls so far, space-separated;
/// * `delay I MS` — backend `I` delays every call by `MS` ms from now on; answers `ok`.
///
/// On EOF (the parent is done, or died) it stops its backends and returns.
pub(crate) fn serve_backends_if_child() -> bool {
    let Ok(n) = std::env::var(BACKENDS_CHILD_ENV) else {
        return false;
    };
    let n: usize = n.parse().expect("backends child: count");
    let workers: usize = std::env::var(BACKENDS_CHILD_WORKERS_ENV)
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(2);
    let rt = runtime(SERVER_THREADS, workers);
    let backends = rt
        .block_on(test_backends::Backends::start(n))
        .expect("backends");
    let mut out = std::io::stdout().lock();
    let mut answer = |line: String| {
        writeln!(out, "{line}").expect("backends child: stdout");
        out.flush().expect("backends child: stdout");
    };
    answer(backends.uris().join(" "));
    let join = |v: Vec<u64>| v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["hits"] => answer(join(backends.iter().map(|b| b.hits()).collect())),
            ["cancelled"] => answer(join(backends.iter().map(|b| b.cancelled()).collect())),
            ["delay", i, ms] => {
                let i: usize = i.parse().expect("delay: backend index");
                let ms: u64 = ms.parse().expect("delay: milliseconds");
                backends[i].set_delay(Duration::from_millis(ms));
                answer("ok".into());
            }
            _ => panic!("backends child: unknown command {line:?}"),
        }
    }
    rt.block_on(async {
        for b in backends.iter() {
            b.stop().await;
        }
    });
    true
}

/// Test backends served by a child process: this bench binary again, with
/// [`BACKENDS_CHILD_ENV`] set (see [`serve_backends_if_child`]). Dropping it closes the
/// child's stdin, gives it a second to stop, then kills it, and reaps it: on every exit path,
/// a panic's unwinding included. Should this process die outright, the child sees EOF and
/// exits.
pub(crate) struct BackendsProcess {
    child: Child,
    to_child: Option<ChildStdin>,
    from_child: Lines<BufReader<ChildStdout>>,
    uris: Vec<String>,
}

impl BackendsProcess {
    /// Starts `n` backends in a child process whose runtime has `workers` worker threads, and
    /// waits for their URIs.
    pub(crate) fn start(n: usize, workers: usize) -> Self {
        let exe = std::env::current_exe().expect("current exe");
        let mut child = Command::new(exe)
            .env(BACKENDS_CHILD_ENV, n.to_string())
            .env(BACKENDS_CHILD_WORKERS_ENV, workers.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the backends process");
        let to_child = child.stdin.take();
        let from_child = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        // From here on, a panic drops `this`, which reaps the child.
        let mut this = Self {
            child,
            to_child,
            from_child,
            uris: Vec::new(),
        };
        this.uris = this
            .read_line()
            .split_whitespace()
            .map(String::from)
            .collect();
        assert_eq!(this.uris.len(), n, "backends process: URIs");
        this
    }

    fn read_line(&mut self) -> String {
        self.from_child
            .next()
            .expect("the backends process exited")
            .expect("backends process: stdout")
    }

    /// Sends `command`, returns the answer line.
    fn ask(&mut self, command: &str) -> String {
        let to_child = self.to_child.as_mut().expect("stdin open");
        writeln!(to_child, "{command}").expect("backends process: stdin");
        to_child.flush().expect("backends process: stdin");
        self.read_line()
    }

    fn ask_counts(&mut self, command: &str) -> Vec<u64> {
        self.ask(command)
            .split_whitespace()
            .map(|c| c.parse().expect("backends process: a count"))
            .collect()
    }

    /// The backends' URIs, in order.
    pub(crate) fn uris(&self) -> Vec<String> {
        self.uris.clone()
    }

    /// The child's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every backend's test-service calls so far.
    pub(crate) fn hits(&mut self) -> Vec<u64> {
        self.ask_counts("hits")
    }

    /// Every backend's cancelled unary calls so far.
    pub(crate) fn cancelled(&mut self) -> Vec<u64> {
        self.ask_counts("cancelled")
    }

    /// Backend `i` delays every call by `delay` (whole milliseconds) from now on.
    pub(crate) fn set_delay(&mut self, i: usize, delay: Duration) {
        let answer = self.ask(&format!("delay {i} {}", delay.as_millis()));
        assert_eq!(answer, "ok", "backends process: delay");
    }
}

impl Drop for BackendsProcess {
    fn drop(&mut self) {
        // EOF: the child stops its backends and exits.
        drop(self.to_child.take());
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ----- clients -----

/// A unary caller: a generated tonic client over any transport, erased to what the load
/// generator needs. Implemented for every `TestServiceClient<T>` whose transport can be sent
/// between threads.
pub(crate) trait UnaryCaller: Clone + Send + Sync + 'static {
    /// One `TestService/Unary` call.
    fn unary(
        &mut self,
        request: tonic::Request<Ping>,
    ) -> impl Future<Output = Result<Pong, Status>> + Send;
}

impl<T> UnaryCaller for TestServiceClient<T>
where
    T: tonic::client::GrpcService<tonic::body::Body> + Clone + Send + Sync + 'static,
    T::Future: Send,
    T::Error: Into<BoxError>,
    T::ResponseBody: http_body::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
{
    fn unary(
        &mut self,
        request: tonic::Request<Ping>,
    ) -> impl Future<Output = Result<Pong, Status>> + Send {
        let call = TestServiceClient::unary(self, request);
        async move { call.await.map(tonic::Response::into_inner) }
    }
}

/// An endpoint with tonic's defaults (no timeouts, `TCP_NODELAY` on), as every contender uses.
pub(crate) fn endpoint(uri: &str) -> Endpoint {
    Endpoint::from_shared(uri.to_string()).expect("backend uri")
}

/// tonic's own balancer over `uris` (must be called inside the client runtime: it spawns).
pub(crate) fn balance_list(uris: &[String]) -> TestServiceClient<Channel> {
    TestServiceClient::new(Channel::balance_list(uris.iter().map(|u| endpoint(u))))
}

/// What the per-call benches (`kit_call`, `allocs`) compare over `uris`: the kit (round-robin,
/// Watch health, every layer) once it is ready, one connected bare `Channel` to the first
/// backend, and tonic's `Channel::balance_list` (call inside the client runtime: it spawns).
pub(crate) async fn kit_bare_and_list(uris: &[String]) -> (grpc_client_kit::Kit, Channel, Channel) {
    use grpc_client_kit::health::{HealthConfig, ProbeMode};
    let kit = grpc_client_kit::Kit::builder()
        .targets(uris.iter().cloned())
        .health(HealthConfig::new().mode(ProbeMode::Watch))
        .build()
        .expect("kit");
    assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
    let bare = endpoint(&uris[0]).connect().await.expect("bare channel");
    let list = Channel::balance_list(uris.iter().map(|u| endpoint(u)));
    (kit, bare, list)
}

/// One HTTP/2 connection to `uri` made with hyper alone, its `SendRequest` called directly
/// (no `Buffer`, no worker task, no reconnection): the floor under every contender, for scale.
/// With `one_write`, its IO sends each request's `HEADERS` and `DATA` in one write, as the
/// kit's plaintext connections do (`grpc_client_kit::state::writes::Coalesced`).
pub(crate) async fn single_hyper(uri: &str, one_write: bool) -> TestServiceClient<DirectH2> {
    use grpc_client_kit::state::writes::Coalesced;
    let parsed: http::Uri = uri.parse().expect("a backend URI");
    let authority = parsed.authority().expect("host:port").clone();
    let stream = tokio::net::TcpStream::connect(authority.as_str())
        .await
        .expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let io = if one_write {
        Coalesced::new(stream)
    } else {
        Coalesced::passthrough(stream)
    };
    let (send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .timer(hyper_util::rt::TokioTimer::new())
            .handshake(hyper_util::rt::TokioIo::new(io))
            .await
            .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    TestServiceClient::with_origin(DirectH2 { send }, parsed)
}

/// hyper's HTTP/2 `SendRequest` as a tower service (see [`single_hyper`]).
#[derive(Clone)]
pub(crate) struct DirectH2 {
    send: hyper::client::conn::http2::SendRequest<tonic::body::Body>,
}

impl tower::Service<http::Request<tonic::body::Body>> for DirectH2 {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, hyper::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), hyper::Error>> {
        self.send.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.send.send_request(req))
    }
}

/// One bare `Channel` to `uri`, connected lazily.
pub(crate) fn single_channel(uri: &str) -> TestServiceClient<Channel> {
    TestServiceClient::new(endpoint(uri).connect_lazy())
}

/// tower's power-of-two-choices balancer (`PendingRequests` load) over one `Channel` per uri.
/// `p2c::Balance` is not `Clone`, so, as tower intends, it sits behind a `Buffer` (bounded at
/// 1,024 waiting requests; one worker task) which every caller clones.
pub(crate) fn tower_p2c(uris: &[String]) -> TestServiceClient<impl UnaryTransport> {
    use tower::load::{CompleteOnResponse, PendingRequests};
    let channels: Vec<_> = uris
        .iter()
        .map(|u| PendingRequests::new(endpoint(u).connect_lazy(), CompleteOnResponse::default()))
        .collect();
    let balance = tower::balance::p2c::Balance::new(tower::discover::ServiceList::new(channels));
    TestServiceClient::new(tower::buffer::Buffer::new(balance, 1024))
}

/// The transports above, named for `impl Trait` returns.
pub(crate) trait UnaryTransport:
    tonic::client::GrpcService<
        tonic::body::Body,
        Error = BoxError,
        ResponseBody = tonic::body::Body,
        Future: Send,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<T> UnaryTransport for T where
    T: tonic::client::GrpcService<
            tonic::body::Body,
            Error = BoxError,
            ResponseBody = tonic::body::Body,
            Future: Send,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

// ----- closed-loop load -----

/// What a load run measured.
#[derive(Debug)]
pub(crate) struct LoadResult {
    /// Calls that succeeded.
    pub(crate) ok: u64,
    /// Calls that failed.
    pub(crate) failed: u64,
    /// Wall time from the start to the end of the last call.
    pub(crate) elapsed: Duration,
    /// Latency of successful calls, in nanoseconds.
    pub(crate) latency: Histogram<u64>,
    /// The first few distinct errors, for the report.
    pub(crate) errors: Vec<String>,
}

impl LoadResult {
    fn empty() -> Self {
        Self {
            ok: 0,
            failed: 0,
            elapsed: Duration::ZERO,
            latency: new_histogram(),
            errors: Vec::new(),
        }
    }

    /// Successful calls per second.
    pub(crate) fn throughput(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }

    /// Adds another run (same contender, another round).
    pub(crate) fn merge(&mut self, other: LoadResult) {
        self.ok += other.ok;
        self.failed += other.failed;
        self.elapsed += other.elapsed;
        self.latency.add(&other.latency).expect("same bounds");
        for e in other.errors {
            if self.errors.len() < 3 && !self.errors.contains(&e) {
                self.errors.push(e);
            }
        }
    }
}

/// A histogram of nanoseconds from 1 ns to 60 s, 3 significant digits.
pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

/// `callers` tasks each call `client` (their own clone) back to back until `duration` has
/// passed; each call's latency goes into the task's own histogram, merged at the end.
pub(crate) async fn closed_loop<C: UnaryCaller>(
    client: &C,
    callers: usize,
    duration: Duration,
) -> LoadResult {
    let start = Instant::now();
    let end = start + duration;
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let mut r = LoadResult::empty();
                while Instant::now() < end {
                    let t0 = Instant::now();
                    let outcome = client.unary(tonic::Request::new(Ping::default())).await;
                    let took = t0.elapsed();
                    match outcome {
                        Ok(_) => {
                            r.ok += 1;
                            r.latency.saturating_record(took.as_nanos() as u64);
                        }
                        Err(status) => {
                            r.failed += 1;
                            let e = format!("{:?}: {}", status.code(), status.message());
                            if r.errors.len() < 3 && !r.errors.contains(&e) {
                                r.errors.push(e);
                            }
                        }
                    }
                }
                r
            })
        })
        .collect();
    let mut total = LoadResult::empty();
    for t in tasks {
        total.merge(t.await.expect("caller task panicked"));
    }
    total.elapsed = start.elapsed();
    total
}

// ----- CPU accounting -----

/// CPU time (user + system) used so far by this process's threads whose name starts with
/// `prefix`, from `/proc/self/task/*/stat` (clock-tick resolution, 10 ms).
pub(crate) fn thread_cpu(prefix: &str) -> Duration {
    let ticks_per_sec = 100u64; // USER_HZ on Linux
    let mut ticks = 0u64;
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ... ; comm may hold spaces, so split after the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if !stat[open + 1..close].starts_with(prefix) {
            continue;
        }
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        // After the comm: state is field 3; utime and stime are fields 14 and 15.
        let utime: u64 = fields.get(11).and_then(|f| f.parse().ok()).unwrap_or(0);
        let stime: u64 = fields.get(12).and_then(|f| f.parse().ok()).unwrap_or(0);
        ticks += utime + stime;
    }
    Duration::from_millis(ticks * 1000 / ticks_per_sec)
}

/// CPU time (user + system, every thread, those gone included) used so far by the process
/// `pid` (`None`: this one), from `/proc/<pid>/stat` (clock-tick resolution, 10 ms); zero if
/// it cannot be read.
pub(crate) fn process_cpu(pid: Option<u32>) -> Duration {
    let ticks_per_sec = 100u64; // USER_HZ on Linux
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let Ok(stat) = std::fs::read_to_string(path) else {
        return Duration::ZERO;
    };
    let Some(close) = stat.rfind(')') else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    // After the comm: utime and stime (fields 14 and 15 of the line) are 11 and 12.
    let utime: u64 = fields.get(11).and_then(|f| f.parse().ok()).unwrap_or(0);
    let stime: u64 = fields.get(12).and_then(|f| f.parse().ok()).unwrap_or(0);
    Duration::from_millis((utime + stime) * 1000 / ticks_per_sec)
}

/// CPU used by this (the client's) process and by the backends' process since
/// [`CpuMark::now`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuMark {
    client: Duration,
    server: Duration,
    server_pid: u32,
}

impl CpuMark {
    /// The counters now; the backends run in the process `server_pid`.
    pub(crate) fn now(server_pid: u32) -> Self {
        Self {
            client: process_cpu(None),
            server: process_cpu(Some(server_pid)),
            server_pid,
        }
    }

    /// (client, server) CPU used since `self`.
    pub(crate) fn since(self) -> (Duration, Duration) {
        let now = Self::now(self.server_pid);
        (
            now.client.saturating_sub(self.client),
            now.server.saturating_sub(self.server),
        )
    }
}

/// `/proc/loadavg`'s three averages.
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

// ----- formatting -----

/// A duration in µs or ms, 3 significant digits.
pub(crate) fn fmt_dur(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1_000.0 {
        format!("{us:.0} µs")
    } else if us < 10_000.0 {
        format!("{:.2} ms", us / 1e3)
    } else if us < 1_000_000.0 {
        format!("{:.1} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// Nanoseconds from a histogram, formatted.
pub(crate) fn fmt_ns(ns: u64) -> String {
    fmt_dur(Duration::from_nanos(ns))
}

/// A plain-text table: a header row, then rows; columns padded to their widest cell. The
/// first column is left-aligned, the others right-aligned.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let cols = header.len();
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(cols) {
            width[i] = width[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        for (i, cell) in cells.iter().enumerate() {
            let pad = width[i] - cell.chars().count();
            if i == 0 {
                out.push_str(cell);
                out.push_str(&" ".repeat(pad));
            } else {
                out.push_str("  ");
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            }
        }
        out.push('\n');
    };
    line(header.to_vec());
    let rule: Vec<String> = width.iter().map(|w| "-".repeat(*w)).collect();
    line(rule.iter().map(String::as_str).collect());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

//! Interop: the checker (Check and Watch) against grpcio's official Python health servicer.
//!
//! The interpreter is `$GCK_INTEROP_PYTHON` (CI sets it to a venv with `grpcio` and
//! `grpcio-health-checking`), else `python3` if it can import them. The tests need one, so a
//! plain `cargo test` lists them as ignored, with that reason; run them with
//! `cargo test -p health-layer --test interop -- --include-ignored`, where a missing
//! interpreter is a failure, never a silent pass.

mod support;

use std::process::Stdio;
use std::time::Duration;

use health_layer::{HealthChecker, HealthVerdict, ProbeMode, Target};
use support::wait_verdict;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tonic::transport::Endpoint;

const LIMIT: Duration = Duration::from_secs(20);

fn python() -> Option<String> {
    if let Ok(p) = std::env::var("GCK_INTEROP_PYTHON")
        && !p.is_empty()
    {
        return Some(p);
    }
    let ok = std::process::Command::new("python3")
        .args(["-c", "import grpc, grpc_health.v1.health"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then(|| "python3".to_owned())
}

struct PyServer {
    _child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    uri: String,
}

impl PyServer {
    async fn start() -> Self {
        let Some(python) = python() else {
            panic!(
                "no Python with grpcio and grpcio-health-checking: set GCK_INTEROP_PYTHON to a \
                 venv's python with both (.ci/interop-setup prints it)"
            );
        };
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/interop/health_server.py"
        );
        let mut child = Command::new(&python)
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let port = tokio::time::timeout(LIMIT, stdout.next_line())
            .await
            .expect("the Python server printed its port in time")
            .unwrap()
            .expect("a port line");
        let port: u16 = port.trim().parse().expect("a port number");
        PyServer {
            _child: child,
            stdin,
            stdout,
            uri: format!("http://127.0.0.1:{port}"),
        }
    }

    async fn set(&mut self, service: &str, status: &str) {
        let service = if service.is_empty() { "-" } else { service };
        self.stdin
            .write_all(format!("set {service} {status}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
        let answer = tokio::time::timeout(LIMIT, self.stdout.next_line())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer.as_deref(), Some("ok"));
    }

    /// A target probed on a tonic `Channel` (it is given an `Endpoint`).
    fn target(&self, name: &str, service: &str) -> Target {
        Target::new(name)
            .endpoint(Endpoint::from_shared(self.uri.clone()).unwrap())
            .service(service)
    }

    /// A target of the default endpoint template, probed on the checker's own HTTP/2
    /// connection: named `http://{name}.test:{port}`, connected to the server's address.
    fn direct_target(&self, name: &str, service: &str) -> Target {
        let address: std::net::SocketAddr = self.uri.trim_start_matches("http://").parse().unwrap();
        Target::new(format!("http://{name}.test:{}", address.port()))
            .address(address)
            .service(service)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Python with grpcio (GCK_INTEROP_PYTHON): cargo test -p health-layer --test interop -- --include-ignored"]
async fn check_against_grpcio() {
    check_against_grpcio_on(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Python with grpcio (GCK_INTEROP_PYTHON): cargo test -p health-layer --test interop -- --include-ignored"]
async fn check_against_grpcio_on_the_checkers_own_connections() {
    check_against_grpcio_on(true).await;
}

/// `Check`s against grpcio, on tonic `Channel`s or (`direct`) the checker's own connections.
async fn check_against_grpcio_on(direct: bool) {
    let mut py = PyServer::start().await;
    let checker = HealthChecker::builder()
        .interval(Duration::ZERO)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    let (server, svc_a) = if direct {
        (
            py.direct_target("server", ""),
            py.direct_target("svc-a", "svc.A"),
        )
    } else {
        (py.target("server", ""), py.target("svc-a", "svc.A"))
    };
    let (server, svc_a) = {
        let names = (server.name().to_owned(), svc_a.name().to_owned());
        checker.add_target(server).unwrap();
        checker.add_target(svc_a).unwrap();
        names
    };

    let status = checker.check_now(&server).await.unwrap();
    assert_eq!(status.verdict, HealthVerdict::Healthy, "{status:?}");

    py.set("", "NOT_SERVING").await;
    let status = checker.check_now(&server).await.unwrap();
    assert_eq!(status.verdict, HealthVerdict::Unhealthy);
    assert_eq!(status.last_error.as_deref(), Some("NOT_SERVING"));

    // grpcio answers Check for an unknown service with NOT_FOUND (and no message).
    let status = checker.check_now(&svc_a).await.unwrap();
    assert_eq!(status.verdict, HealthVerdict::Unhealthy);
    assert_eq!(
        status.last_error.as_deref(),
        Some("NOT_FOUND: unknown service \"svc.A\"")
    );
    py.set("svc.A", "SERVING").await;
    assert_eq!(
        checker.check_now(&svc_a).await.unwrap().verdict,
        HealthVerdict::Healthy
    );
    checker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Python with grpcio (GCK_INTEROP_PYTHON): cargo test -p health-layer --test interop -- --include-ignored"]
async fn watch_against_grpcio_including_service_unknown() {
    let mut py = PyServer::start().await;
    let checker = HealthChecker::builder()
        .mode(ProbeMode::Watch)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    let server = checker.add_target(py.target("server", "")).unwrap();
    let svc_b = checker.add_target(py.target("svc-b", "svc.B")).unwrap();

    assert!(wait_verdict(&server, HealthVerdict::Healthy, LIMIT).await);
    // Unlike tonic-health (NOT_FOUND), grpcio streams SERVICE_UNKNOWN and keeps the stream open.
    assert!(wait_verdict(&svc_b, HealthVerdict::Unhealthy, LIMIT).await);
    assert_eq!(
        svc_b.health().reason.as_deref(),
        Some("SERVICE_UNKNOWN: the server does not know service \"svc.B\"")
    );

    // The same stream then reports the service as it becomes known and changes.
    py.set("svc.B", "SERVING").await;
    assert!(wait_verdict(&svc_b, HealthVerdict::Healthy, LIMIT).await);
    py.set("svc.B", "NOT_SERVING").await;
    assert!(wait_verdict(&svc_b, HealthVerdict::Unhealthy, LIMIT).await);
    assert_eq!(svc_b.health().reason.as_deref(), Some("NOT_SERVING"));
    let status = checker.status("svc-b").unwrap();
    assert_eq!(
        status.consecutive_failures, 1,
        "SERVING in between reset the count"
    );
    assert!(status.channel_open, "the stream never broke");

    py.set("", "NOT_SERVING").await;
    assert!(wait_verdict(&server, HealthVerdict::Unhealthy, LIMIT).await);
    py.set("", "SERVING").await;
    assert!(wait_verdict(&server, HealthVerdict::Healthy, LIMIT).await);
    checker.stop().await;
}

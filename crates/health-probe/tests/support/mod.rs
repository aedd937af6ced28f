//! Shared by the integration tests: run the built binary, read its lines, start the small
//! servers test-backends does not provide (slow or Check-only health, no health at all, gzip,
//! TLS), and make certificates.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr};
use tokio::time::Instant;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::codec::CompressionEncoding;
use tonic::service::Routes;
use tonic::transport::{Server, ServerTlsConfig};
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_grpc-health-probe");

/// Generous bound for anything that should take well under a second, on a busy machine.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A finished run of the binary.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    /// The stderr lines.
    pub fn lines(&self) -> Vec<&str> {
        self.stderr.lines().collect()
    }

    /// The one line printed (most runs print exactly one).
    pub fn line(&self) -> &str {
        let lines = self.lines();
        assert_eq!(lines.len(), 1, "expected one line, got {lines:?}");
        lines[0]
    }
}

/// Runs the binary to completion.
pub async fn probe(args: &[&str]) -> Run {
    let started = Instant::now();
    let child = tokio::process::Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    let out = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{args:?} did not exit within {PATIENCE:?}"))
        .expect("the binary runs");
    Run {
        code: out.status.code().expect("exited, not killed by a signal"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
        elapsed: started.elapsed(),
    }
}

/// A running binary whose stderr is read line by line (watch mode, interrupts).
pub struct Running {
    child: Child,
    lines: Lines<BufReader<ChildStderr>>,
    pub seen: Vec<String>,
}

impl Running {
    pub fn start(args: &[&str]) -> Running {
        let mut child = tokio::process::Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the binary starts");
        let stderr = child.stderr.take().unwrap();
        Running {
            child,
            lines: BufReader::new(stderr).lines(),
            seen: Vec::new(),
        }
    }

    /// The next stderr line, within [`PATIENCE`].
    pub async fn next_line(&mut self) -> String {
        let line = tokio::time::timeout(PATIENCE, self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("no new line within {PATIENCE:?}; so far: {:#?}", self.seen))
            .expect("stderr readable")
            .unwrap_or_else(|| panic!("stderr closed; so far: {:#?}", self.seen));
        self.seen.push(line.clone());
        line
    }

    /// Reads lines until one satisfies `want`; returns it.
    pub async fn line_where(&mut self, want: impl Fn(&str) -> bool) -> String {
        loop {
            let line = self.next_line().await;
            if want(&line) {
                return line;
            }
        }
    }

    /// Sends a signal (`"INT"`, `"TERM"`) with kill(1).
    pub async fn signal(&self, name: &str) {
        let pid = self.child.id().expect("still running").to_string();
        let status = tokio::process::Command::new("kill")
            .args([&format!("-{name}"), &pid])
            .status()
            .await
            .expect("kill(1) runs");
        assert!(status.success());
    }

    /// Waits for the exit; returns the code and the remaining stderr lines.
    pub async fn finish(mut self) -> (i32, Vec<String>) {
        let mut rest = Vec::new();
        while let Ok(Ok(Some(line))) = tokio::time::timeout(PATIENCE, self.lines.next_line()).await
        {
            rest.push(line);
        }
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("exits after the signal")
            .unwrap();
        (status.code().expect("exited, not killed by a signal"), rest)
    }
}

/// A watch line is `<RFC 3339 UTC timestamp> <message>`; returns the message after checking
/// the timestamp's shape.
pub fn untimestamped(line: &str) -> &str {
    let (stamp, message) = line.split_once(' ').expect("timestamp, space, message");
    let b = stamp.as_bytes();
    assert_eq!(stamp.len(), 24, "{line}");
    for (i, c) in b.iter().enumerate() {
        let ok = match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'.',
            23 => *c == b'Z',
            _ => c.is_ascii_digit(),
        };
        assert!(ok, "not an RFC 3339 timestamp: {line}");
    }
    message
}

// ----- small servers -----

/// A server run by a test; stops when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    headers: Arc<Mutex<Option<http::HeaderMap>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Headers of the last request received.
    pub fn last_request_headers(&self) -> Option<http::HeaderMap> {
        self.headers.lock().unwrap().clone()
    }
}

async fn listener() -> (tokio::net::TcpListener, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// Starts a server with `routes`, recording request headers, optionally with TLS.
async fn serve(routes: Routes, tls: Option<ServerTlsConfig>) -> TestServer {
    let (listener, addr) = listener().await;
    let headers = Arc::new(Mutex::new(None));
    let recorded = Arc::clone(&headers);
    let record = tower::util::MapRequestLayer::new(move |req: http::Request<tonic::body::Body>| {
        *recorded.lock().unwrap() = Some(req.headers().clone());
        req
    });
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).expect("a valid server TLS config");
    }
    let router = builder.layer(record).add_routes(routes);
    let task = tokio::spawn(async move {
        let _ = router
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await;
    });
    TestServer {
        addr,
        headers,
        task,
    }
}

/// A server with no `grpc.health.v1.Health` at all: every call is `UNIMPLEMENTED`.
pub async fn no_health_server() -> TestServer {
    serve(Routes::default(), None).await
}

/// A `Health` service that only implements `Check` (`Watch` is `UNIMPLEMENTED`), answering
/// the status set with [`CheckOnly::set`] after an optional delay.
#[derive(Clone)]
pub struct CheckOnly {
    status: Arc<AtomicI32>,
    delay: Duration,
}

impl CheckOnly {
    pub fn new(delay: Duration) -> Self {
        CheckOnly {
            status: Arc::new(AtomicI32::new(ServingStatus::Serving as i32)),
            delay,
        }
    }

    pub fn set(&self, status: ServingStatus) {
        self.status.store(status as i32, Ordering::SeqCst);
    }

    pub async fn serve(&self) -> TestServer {
        serve(Routes::new(HealthServer::new(self.clone())), None).await
    }
}

#[tonic::async_trait]
impl Health for CheckOnly {
    async fn check(
        &self,
        _request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        Ok(Response::new(HealthCheckResponse {
            status: self.status.load(Ordering::SeqCst),
        }))
    }

    type WatchStream = Pin<
        Box<dyn tokio_stream::Stream<Item = Result<HealthCheckResponse, Status>> + Send + 'static>,
    >;

    async fn watch(
        &self,
        _request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("this test server has no Watch"))
    }
}

/// tonic-health's own service (whole server `SERVING`), optionally accepting gzip, optionally
/// behind TLS.
pub async fn standard_health(gzip: bool, tls: Option<ServerTlsConfig>) -> TestServer {
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    let service = if gzip {
        service
            .accept_compressed(CompressionEncoding::Gzip)
            .send_compressed(CompressionEncoding::Gzip)
    } else {
        service
    };
    serve(Routes::new(service), tls).await
}

// ----- certificates -----

/// A CA, a server certificate it signed for `localhost` and `probe.test` (not for
/// 127.0.0.1), a client certificate it signed, another CA, written as PEM files in a
/// temporary directory.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub other_ca: PathBuf,
    pub server_cert: String,
    pub server_key: String,
    pub ca_pem: String,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A key that does not belong to `client_cert`.
    pub wrong_key: PathBuf,
    /// A PEM file without any certificate.
    pub not_a_cert: PathBuf,
}

impl Pki {
    pub fn new() -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
            IsCa, KeyPair, KeyUsagePurpose,
        };
        let ca_params = |name: &str| {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name.push(DnType::CommonName, name);
            p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            p
        };
        let ca =
            CertifiedIssuer::self_signed(ca_params("probe test CA"), KeyPair::generate().unwrap())
                .unwrap();
        let other_ca =
            CertifiedIssuer::self_signed(ca_params("another CA"), KeyPair::generate().unwrap())
                .unwrap();

        let server_key = KeyPair::generate().unwrap();
        let mut server =
            CertificateParams::new(vec!["localhost".into(), "probe.test".into()]).unwrap();
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_cert = server.signed_by(&server_key, &ca).unwrap();

        let client_key = KeyPair::generate().unwrap();
        let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
        client
            .distinguished_name
            .push(DnType::CommonName, "probe client");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_cert = client.signed_by(&client_key, &ca).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        Pki {
            ca: write("ca.pem", &ca.pem()),
            other_ca: write("other-ca.pem", &other_ca.pem()),
            server_cert: server_cert.pem(),
            server_key: server_key.serialize_pem(),
            ca_pem: ca.pem(),
            client_cert: write("client.pem", &client_cert.pem()),
            client_key: write("client-key.pem", &client_key.serialize_pem()),
            wrong_key: write(
                "wrong-key.pem",
                &KeyPair::generate().unwrap().serialize_pem(),
            ),
            not_a_cert: write("empty.pem", "no PEM in here\n"),
            dir,
        }
    }

    /// The server side: this PKI's server certificate; with `require_client_cert`, a client
    /// certificate signed by the CA is required.
    pub fn server_tls(&self, require_client_cert: bool) -> ServerTlsConfig {
        let identity = tonic::transport::Identity::from_pem(&self.server_cert, &self.server_key);
        let config = ServerTlsConfig::new().identity(identity);
        if require_client_cert {
            config.client_ca_root(tonic::transport::Certificate::from_pem(&self.ca_pem))
        } else {
            config
        }
    }
}

/// A path as an argument.
pub fn arg(path: &std::path::Path) -> &str {
    path.to_str().unwrap()
}

//! The kit over TLS: three backends that speak only TLS and require a client certificate
//! (mutual TLS), a private CA made here with `rcgen`, and one endpoint template that gives the
//! application calls **and the health probes** the same `ClientTlsConfig`.
//!
//! ```text
//! cargo run -p grpc-client-kit --example tls
//! ```
//!
//! What it shows, and checks (it exits non-zero otherwise):
//!
//! * the probes go over TLS with the client certificate: every target is healthy (a backend
//!   refuses a connection without one), and each backend counts its health checks, all over
//!   TLS from the client certificate;
//! * calls go over TLS with it too, split evenly; a backend whose health service says
//!   `NOT_SERVING` (learnt over its TLS `Watch` stream) gets none;
//! * a template without the client certificate: the probes fail as calls would, and the call's
//!   `UNAVAILABLE` says why for each target.
//!
//! The server certificate names `billing.internal`, not the address: the template sets
//! `domain_name`, as it must when targets are IP addresses. (A `dns:` target needs none: each
//! address it resolves to is verified as the name, as gRPC does; see the `dns` module.)
//!
//! tonic's TLS here is its `tls-ring` feature (rustls with ring), with no system roots: the only
//! root trusted is the CA made above.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use grpc_client_kit::health::{HealthConfig, ProbeMode};
use grpc_client_kit::state::HealthVerdict;
use grpc_client_kit::{EndpointTemplate, Kit, KitChannel};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::test_service_server::{TestService, TestServiceServer};
use test_backends::pb::{Ping, Pong, StreamPing};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};
use tonic::{Code, Request, Response, Status};
use tonic_health::server::HealthReporter;
use tower::util::MapRequestLayer;

type Error = Box<dyn std::error::Error>;

/// The name the server certificate is for.
const SERVER_NAME: &str = "billing.internal";

#[tokio::main]
async fn main() -> Result<(), Error> {
    let pki = Pki::new()?;
    let mut backends = Vec::new();
    for name in ["t0", "t1", "t2"] {
        backends.push(TlsBackend::start(name, &pki).await?);
    }
    let targets: Vec<String> = backends.iter().map(|b| b.uri.clone()).collect();
    for b in &backends {
        println!(
            "{} = {} (TLS only, client certificate required)",
            b.name, b.uri
        );
    }

    // One TLS configuration for the calls and the probes: the private CA as the only root, the
    // server's name, and the client's certificate.
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca))
        .domain_name(SERVER_NAME)
        .identity(Identity::from_pem(&pki.client_cert, &pki.client_key));
    let kit = Kit::builder()
        .targets(targets.clone())
        .template(template(tls))
        .health(HealthConfig::new().mode(ProbeMode::Watch))
        .build()?;
    if !kit.wait_until_ready(Duration::from_secs(5)).await {
        return Err(format!("the TLS backends never became ready: {kit:?}").into());
    }
    for target in &targets {
        let card = kit.card(target).ok_or("a target without a card")?;
        let health = card.health();
        println!("{target}: {:?}", health.state);
        if health.state != HealthVerdict::Healthy {
            return Err(format!("{target} is not healthy: {card:?}").into());
        }
    }

    let mut client = TestServiceClient::new(kit.channel());
    let split = calls(&mut client, 30).await?;
    println!("30 calls over TLS:             {split:?}");
    expect(&split, &[("t0", 10), ("t1", 10), ("t2", 10)])?;

    // t1's health service says NOT_SERVING: the kit hears it on t1's TLS Watch stream.
    backends[1]
        .health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    wait_eligible(&kit, 2).await?;
    let split = calls(&mut client, 30).await?;
    println!("30 calls, t1 NOT_SERVING:      {split:?}");
    expect(&split, &[("t0", 15), ("t2", 15)])?;
    kit.shutdown().await;

    // What each backend saw: health requests (one Watch stream each) and calls, every one
    // over TLS from the client certificate.
    for b in &backends {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let c = &b.counts;
        let (checks, calls) = (load(&c.health), load(&c.calls));
        println!(
            "{}: {checks} health request(s), {calls} calls; over TLS from the client \
             certificate: {} and {}",
            b.name,
            load(&c.health_with_cert),
            load(&c.calls_with_cert)
        );
        if checks == 0 || load(&c.health_with_cert) != checks || load(&c.calls_with_cert) != calls {
            return Err(format!("{}: not everything came over mutual TLS", b.name).into());
        }
    }

    // The same kit without the client certificate: probes fail exactly as calls would, and the
    // call that finds no healthy target says why for each.
    let no_identity = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca))
        .domain_name(SERVER_NAME);
    let kit = Kit::builder()
        .targets(targets.clone())
        .template(template(no_identity))
        .health(HealthConfig::new().mode(ProbeMode::Watch))
        .build()?;
    let mut client = TestServiceClient::new(kit.channel());
    let status = client
        .unary(Ping::default())
        .await
        .expect_err("no backend accepts a client without a certificate");
    println!(
        "\nwithout the client certificate: {:?}\n  {}",
        status.code(),
        status.message().replace("; ", ";\n  ")
    );
    if status.code() != Code::Unavailable || !targets.iter().all(|t| status.message().contains(t)) {
        return Err(format!("unexpected status: {status:?}").into());
    }
    kit.shutdown().await;
    Ok(())
}

/// Every target's endpoint: its `https://` address, the TLS settings, a deadline per call.
fn template(tls: ClientTlsConfig) -> EndpointTemplate {
    EndpointTemplate::from_fn(move |uri: &str| {
        Ok(Endpoint::from_shared(uri.to_owned())?
            .tls_config(tls.clone())?
            .timeout(Duration::from_secs(2)))
    })
}

/// A private CA, a server certificate for `billing.internal` and a client certificate, as PEM.
struct Pki {
    ca: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
    /// The client certificate as the server sees it (DER).
    client_der: Arc<[u8]>,
}

impl Pki {
    fn new() -> Result<Self, rcgen::Error> {
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "grpc-client-kit example CA");
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;

        let server_key = KeyPair::generate()?;
        let mut server = CertificateParams::new(vec![SERVER_NAME.to_owned()])?;
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_cert = server.signed_by(&server_key, &ca)?;

        let client_key = KeyPair::generate()?;
        let mut client = CertificateParams::new(Vec::<String>::new())?;
        client
            .distinguished_name
            .push(DnType::CommonName, "billing-client");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_cert = client.signed_by(&client_key, &ca)?;

        Ok(Pki {
            ca: ca.pem(),
            server_cert: server_cert.pem(),
            server_key: server_key.serialize_pem(),
            client_cert: client_cert.pem(),
            client_key: client_key.serialize_pem(),
            client_der: Arc::from(client_cert.der().as_ref()),
        })
    }
}

/// What a backend saw.
#[derive(Debug, Default)]
struct Counts {
    health: AtomicU64,
    health_with_cert: AtomicU64,
    calls: AtomicU64,
    calls_with_cert: AtomicU64,
}

/// A tonic server on `127.0.0.1` that speaks only TLS and requires a client certificate, with
/// `grpc.health.v1.Health` and the test service.
struct TlsBackend {
    name: &'static str,
    uri: String,
    health: HealthReporter,
    counts: Arc<Counts>,
    _task: AbortOnDrop,
}

impl TlsBackend {
    async fn start(name: &'static str, pki: &Pki) -> Result<Self, Error> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let uri = format!("https://{}", listener.local_addr()?);
        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(&pki.server_cert, &pki.server_key))
            .client_ca_root(Certificate::from_pem(&pki.ca));
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        let counts = Arc::new(Counts::default());
        let seen = counts.clone();
        let client_cert = pki.client_der.clone();
        // Counts every health request, and those that came over TLS from the client certificate.
        let count_health = MapRequestLayer::new(move |req: http::Request<tonic::body::Body>| {
            if req.uri().path().starts_with("/grpc.health.v1.Health/") {
                seen.health.fetch_add(1, Ordering::Relaxed);
                let certs = req
                    .extensions()
                    .get::<tonic::transport::server::TlsConnectInfo<
                        tonic::transport::server::TcpConnectInfo,
                    >>()
                    .and_then(|info| info.peer_certs());
                if certs.is_some_and(|c| c.first().map(|d| d.as_ref()) == Some(&client_cert[..])) {
                    seen.health_with_cert.fetch_add(1, Ordering::Relaxed);
                }
            }
            req
        });
        let service = Signed {
            name,
            counts: counts.clone(),
            client_cert: pki.client_der.clone(),
        };
        let router = Server::builder()
            .tls_config(tls)?
            .layer(count_health)
            .add_service(health_service)
            .add_service(TestServiceServer::new(service));
        let task = tokio::spawn(async move {
            if let Err(e) = router
                .serve_with_incoming(TcpIncoming::from(listener))
                .await
            {
                eprintln!("{name}: server failed: {e}");
            }
        });
        Ok(TlsBackend {
            name,
            uri,
            health,
            counts,
            _task: AbortOnDrop(task),
        })
    }
}

/// The test service, answering with the backend's name; counts calls and those made with the
/// client certificate.
struct Signed {
    name: &'static str,
    counts: Arc<Counts>,
    client_cert: Arc<[u8]>,
}

#[tonic::async_trait]
impl TestService for Signed {
    async fn unary(&self, request: Request<Ping>) -> Result<Response<Pong>, Status> {
        let seq = self.counts.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let from_client = request
            .peer_certs()
            .is_some_and(|c| c.first().map(|d| d.as_ref()) == Some(&self.client_cert[..]));
        if from_client {
            self.counts.calls_with_cert.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Response::new(Pong {
            backend: self.name.to_owned(),
            seq,
            payload: request.into_inner().payload,
        }))
    }

    type ServerStreamStream =
        Pin<Box<dyn futures_core::Stream<Item = Result<Pong, Status>> + Send + 'static>>;

    async fn server_stream(
        &self,
        _request: Request<StreamPing>,
    ) -> Result<Response<Self::ServerStreamStream>, Status> {
        Err(Status::unimplemented("not in this example"))
    }
}

/// Aborts the server task when the backend is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Makes `n` calls; counts the replies by backend.
async fn calls(
    client: &mut TestServiceClient<KitChannel>,
    n: usize,
) -> Result<BTreeMap<String, usize>, Status> {
    let mut split = BTreeMap::new();
    for _ in 0..n {
        let backend = client.unary(Ping::default()).await?.into_inner().backend;
        *split.entry(backend).or_insert(0) += 1;
    }
    Ok(split)
}

/// Fails unless `split` is exactly `want`.
fn expect(split: &BTreeMap<String, usize>, want: &[(&str, usize)]) -> Result<(), String> {
    let want: BTreeMap<String, usize> = want.iter().map(|&(s, n)| (s.to_owned(), n)).collect();
    if *split == want {
        Ok(())
    } else {
        Err(format!("expected {want:?}, got {split:?}"))
    }
}

/// Waits (at most 5 s) until the balancer picks from exactly `n` targets.
async fn wait_eligible(kit: &Kit, n: usize) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while kit.eligible_targets().len() != n {
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("never {n} eligible targets: {kit:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

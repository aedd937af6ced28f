//! A `dns:` target keeps its name, as gRPC does: each resolved address's channel (and its
//! health probes) sends the name as `:authority` and verifies the server's TLS certificate as
//! the name — here a certificate for `localhost` only, made with `rcgen`, served over TLS on
//! 127.0.0.1, reached by `dns:///localhost:PORT` with no `domain_name` set anywhere.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use grpc_client_kit::health::{HealthConfig, ProbeMode};
use grpc_client_kit::state::HealthVerdict;
use grpc_client_kit::{DnsSettings, EndpointTemplate, Kit};
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::test_service_server::{TestService, TestServiceServer};
use test_backends::pb::{Ping, Pong, StreamPing};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};
use tower::util::MapRequestLayer;

struct Answer;

#[tonic::async_trait]
impl TestService for Answer {
    async fn unary(&self, _: Request<Ping>) -> Result<Response<Pong>, Status> {
        Ok(Response::new(Pong {
            backend: "localhost".into(),
            ..Default::default()
        }))
    }

    type ServerStreamStream =
        std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Pong, Status>> + Send>>;

    async fn server_stream(
        &self,
        _: Request<StreamPing>,
    ) -> Result<Response<Self::ServerStreamStream>, Status> {
        Err(Status::unimplemented("not here"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_target_sends_the_name_as_authority_and_verifies_tls_as_the_name() {
    // A self-signed certificate for `localhost` only (no IP address in it).
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // Every request's `:authority` (health probes and calls), as the server saw it.
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let record = seen.clone();
    let layer = MapRequestLayer::new(move |req: http::Request<tonic::body::Body>| {
        let authority = req
            .uri()
            .authority()
            .map(|a| a.to_string())
            .unwrap_or_default();
        record
            .lock()
            .unwrap()
            .push((req.uri().path().to_owned(), authority));
        req
    });
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let server = Server::builder()
        .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(&cert_pem, &key_pem)))
        .unwrap()
        .layer(layer)
        .add_service(health_service)
        .add_service(TestServiceServer::new(Answer))
        .serve_with_incoming(TcpIncoming::from(listener));
    let server = tokio::spawn(server);

    // The certificate is trusted; nothing names the server but the `dns:` target.
    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&cert_pem));
    let template = EndpointTemplate::from_fn(move |uri: &str| {
        Ok(Endpoint::from_shared(uri.to_owned())?.tls_config(tls.clone())?)
    });
    let kit = Kit::builder()
        .target(format!("dns:///localhost:{port}"))
        .dns(DnsSettings::default().scheme("https"))
        .template(template)
        .health(HealthConfig::new().mode(ProbeMode::Watch))
        .build()
        .unwrap();
    assert!(
        kit.wait_until_ready(Duration::from_secs(10)).await,
        "{kit:?}"
    );
    // The target is the address (`localhost` may resolve to `::1` too, where nothing listens:
    // that target is unhealthy and takes no call); its channel and probes speak to the name.
    let target = format!("https://127.0.0.1:{port}");
    assert!(kit.targets().iter().any(|t| **t == *target), "{kit:?}");
    assert_eq!(
        kit.eligible_targets(),
        vec![Arc::<str>::from(target.as_str())]
    );
    let card = kit.card(&target).unwrap();
    assert_eq!(card.health_verdict(), HealthVerdict::Healthy, "{card:?}");

    let mut client = TestServiceClient::new(kit.channel());
    let pong = client
        .unary(Ping::default())
        .await
        .expect("the TLS handshake as localhost");
    assert_eq!(pong.into_inner().backend, "localhost");

    let seen = seen.lock().unwrap().clone();
    let expected = format!("localhost:{port}");
    let calls: Vec<_> = seen
        .iter()
        .filter(|(path, _)| path.starts_with("/gck."))
        .collect();
    let probes: Vec<_> = seen
        .iter()
        .filter(|(path, _)| path.starts_with("/grpc.health.v1."))
        .collect();
    assert_eq!(calls.len(), 1, "{seen:?}");
    assert!(!probes.is_empty(), "{seen:?}");
    for (path, authority) in calls.iter().chain(&probes) {
        assert_eq!(authority, &expected, "{path}");
    }
    kit.shutdown().await;
    server.abort();
}

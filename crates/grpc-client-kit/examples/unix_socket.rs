//! Your own connector: a tonic server on a Unix socket (with its health service), and the kit
//! calling it through a connector the endpoint template gives — for the application's calls
//! **and** the health probes.
//!
//! ```text
//! cargo run -p grpc-client-kit --example unix_socket
//! ```
//!
//! The target is named `http://billing`; the template maps its host to the socket's path and
//! returns tonic's endpoint with a connector that opens the socket (as tonic's
//! `Endpoint::connect_with_connector_lazy` takes it). The example checks that the probes went
//! over the socket (the server counts them), that calls do, and that a `NOT_SERVING` heard
//! over the socket takes the target out; it ends by itself, non-zero on any failure.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use grpc_client_kit::health::{HealthConfig, ProbeMode};
use grpc_client_kit::{EndpointTemplate, Kit};
use hyper_util::rt::TokioIo;
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::test_service_server::{TestService, TestServiceServer};
use test_backends::pb::{Ping, Pong, StreamPing};
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Endpoint, Server};
use tonic::{Code, Request, Response, Status};
use tower::util::MapRequestLayer;

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let dir = std::env::temp_dir().join(format!("gck-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run(&dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run(dir: &std::path::Path) -> Result<(), Error> {
    // The server: health and the test service, on a Unix socket.
    let path = dir.join("billing.sock");
    let listener = UnixListener::bind(&path)?;
    let health_requests = Arc::new(AtomicU64::new(0));
    let counted = health_requests.clone();
    let count = MapRequestLayer::new(move |req: http::Request<tonic::body::Body>| {
        if req.uri().path().starts_with("/grpc.health.v1.Health/") {
            counted.fetch_add(1, Ordering::Relaxed);
        }
        req
    });
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let incoming = futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    });
    let server = tokio::spawn(
        Server::builder()
            .layer(count)
            .add_service(health_service)
            .add_service(TestServiceServer::new(Billing))
            .serve_with_incoming(incoming),
    );
    println!("server on {}", path.display());

    // The kit: each target's host names a socket in `dir`.
    let sockets: PathBuf = dir.to_owned();
    let template = EndpointTemplate::from_connector_fn(move |uri: &str| {
        let host = uri
            .parse::<http::Uri>()?
            .host()
            .unwrap_or_default()
            .to_owned();
        let socket = sockets.join(format!("{host}.sock"));
        let endpoint = Endpoint::from_shared(uri.to_owned())?.timeout(Duration::from_secs(2));
        let connector = tower::service_fn(move |_: http::Uri| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        });
        Ok((endpoint, connector))
    });
    let kit = Kit::builder()
        .target("http://billing")
        .template(template)
        .health(HealthConfig::new().mode(ProbeMode::Watch))
        .build()?;
    if !kit.wait_until_ready(Duration::from_secs(5)).await || kit.eligible_targets().is_empty() {
        return Err(format!("the target never became healthy: {kit:?}").into());
    }
    let probes = health_requests.load(Ordering::Relaxed);
    println!("health probes over the socket: {probes}");
    if probes == 0 {
        return Err("no health probe went over the socket".into());
    }

    let mut client = TestServiceClient::new(kit.channel());
    for _ in 0..10 {
        let pong = client.unary(Ping::default()).await?.into_inner();
        if pong.backend != "billing" {
            return Err(format!("answered by {:?}", pong.backend).into());
        }
    }
    println!("10 calls over the socket: answered");

    // NOT_SERVING, heard on the Watch stream over the socket: the target leaves.
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    tokio::time::timeout(Duration::from_secs(5), async {
        while !kit.eligible_targets().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .map_err(|_| "NOT_SERVING was never heard")?;
    let status = client.unary(Ping::default()).await.unwrap_err();
    println!(
        "after NOT_SERVING: {:?} {}",
        status.code(),
        status.message()
    );
    if status.code() != Code::Unavailable {
        return Err(format!("expected UNAVAILABLE, got {status:?}").into());
    }
    kit.shutdown().await;
    server.abort();
    Ok(())
}

/// The test service, answering as `billing`.
struct Billing;

#[tonic::async_trait]
impl TestService for Billing {
    async fn unary(&self, _: Request<Ping>) -> Result<Response<Pong>, Status> {
        Ok(Response::new(Pong {
            backend: "billing".into(),
            ..Default::default()
        }))
    }

    type ServerStreamStream =
        std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Pong, Status>> + Send>>;

    async fn server_stream(
        &self,
        _: Request<StreamPing>,
    ) -> Result<Response<Self::ServerStreamStream>, Status> {
        Err(Status::unimplemented("not in this example"))
    }
}

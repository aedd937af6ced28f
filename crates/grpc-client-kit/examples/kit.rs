//! The whole kit: health checking, quarantine, a breaker per target and a balancer, in one
//! channel a generated client takes like a tonic `Channel`.
//!
//! ```text
//! cargo run -p grpc-client-kit --example kit
//! ```

use std::time::Duration;

use grpc_client_kit::Kit;
use grpc_client_kit::health::{HealthConfig, ProbeMode};
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tonic::transport::Endpoint;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backends = Backends::start(3).await?;
    let addresses = backends.uris();

    let kit = Kit::builder()
        .targets(addresses)
        .endpoint_template(|uri: &str| {
            // TLS, origin, user agent, timeouts: the same for calls and health probes.
            Ok(Endpoint::from_shared(uri.to_owned())?.timeout(Duration::from_secs(2)))
        })
        .health(HealthConfig::new().mode(ProbeMode::Watch))
        .build()?;
    kit.wait_until_ready(Duration::from_secs(5)).await;

    let mut client = TestServiceClient::new(kit.channel());
    let reply = client.unary(Ping::default()).await?;
    println!("answered by {}", reply.into_inner().backend);

    backends[1].set_serving(false).await; // b1 leaves the rotation at once ...
    kit.shutdown().await; // ... and everything stops here (or when the last handle is dropped)
    Ok(())
}

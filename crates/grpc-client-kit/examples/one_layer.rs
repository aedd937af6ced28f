//! One layer on an existing tonic client: a circuit breaker over a plain `Channel`, added with
//! `ServiceBuilder`. The generated client takes the stack like the channel itself.
//!
//! ```text
//! cargo run -p grpc-client-kit --example one_layer
//! ```

use grpc_client_kit::breaker::{BreakerConfig, BreakerLayer, WhenOpen};
use grpc_client_kit::state::EndpointCard;
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tonic::transport::Channel;
use tower::ServiceBuilder;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backends = Backends::start(1).await?;
    let addr = backends[0].uri();

    let channel = Channel::from_shared(addr.clone())?.connect_lazy();
    let breaker = BreakerLayer::new(
        EndpointCard::new(addr.clone()),
        BreakerConfig::default()
            .consecutive_failures(3)
            .when_open(WhenOpen::FailFast),
    )?;
    let stack = ServiceBuilder::new().layer(breaker).service(channel);
    let mut client = TestServiceClient::new(stack);

    client.unary(Ping::default()).await?;
    backends[0].fail_always(Some(tonic::Code::Unavailable));
    for _ in 0..3 {
        let _ = client.unary(Ping::default()).await;
    }
    // Open: the call fails at once, without reaching the backend.
    let status = client.unary(Ping::default()).await.unwrap_err();
    println!("{:?}: {}", status.code(), status.message());
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(backends[0].hits(), 4);
    Ok(())
}

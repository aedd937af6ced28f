//! Moving from tonic's `Channel::balance_list` to the kit: the same generated client, another
//! channel. One backend says `NOT_SERVING`: `balance_list` keeps sending it calls; the kit
//! sends it none.
//!
//! ```text
//! cargo run -p grpc-client-kit --example from_balance_list
//! ```

use grpc_client_kit::Kit;
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tonic::transport::{Channel, Endpoint};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backends = Backends::start(3).await?;
    let addresses = backends.uris();
    backends[1].set_serving(false).await;

    // Before: tonic's balancer; no health, no quarantine, errors that name no backend.
    let endpoints = addresses.iter().map(|a| Endpoint::from_shared(a.clone()));
    let endpoints = endpoints.collect::<Result<Vec<_>, _>>()?;
    let before = TestServiceClient::new(Channel::balance_list(endpoints.into_iter()));
    // After: the same generated client, over the kit's channel.
    let kit = Kit::builder().targets(addresses.clone()).build()?;
    let after = TestServiceClient::new(kit.channel());

    let (before, after) = (calls_to_b1(before).await?, calls_to_b1(after).await?);
    println!("balance_list: {before} of 30 calls went to b1, which is NOT_SERVING");
    println!("kit:          {after} of 30 calls went to b1");
    kit.shutdown().await;
    Ok(())
}

/// How many of 30 calls `client` sends to b1.
async fn calls_to_b1<T>(mut client: TestServiceClient<T>) -> Result<usize, tonic::Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut to_b1 = 0;
    for _ in 0..30 {
        if client.unary(Ping::default()).await?.into_inner().backend == "b1" {
            to_b1 += 1;
        }
    }
    Ok(to_b1)
}

//! tonic's own `Channel::balance_channel`, driven by the kit's health checker — without the rest
//! of the kit: a backend set to NOT_SERVING leaves tonic's balancer, and comes back.
//!
//! ```text
//! cargo run -p health-layer --example balance_channel
//! ```

use std::convert::Infallible;
use std::time::Duration;

use health_layer::{
    HealthChecker, HealthFilter, HealthVerdict, LineState, ProbeMode, drive_balance_channel,
};
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tonic::transport::{Channel, Endpoint};
use tower::discover::Change;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backends = Backends::start(3).await?;
    let addresses = backends.uris();

    let checker = HealthChecker::builder().mode(ProbeMode::Watch).build()?;
    checker.start(Vec::<String>::new())?;
    let endpoints = addresses.into_iter().map(|uri| {
        let endpoint = Endpoint::from_shared(uri.clone()).expect("a valid URI");
        Ok::<_, Infallible>(Change::Insert(uri, endpoint))
    });
    let healthy_only =
        HealthFilter::tonic_endpoints(futures_util::stream::iter(endpoints), checker.clone());
    let (channel, changes) = Channel::balance_channel::<String>(16);
    tokio::spawn(drive_balance_channel(healthy_only, changes));
    let mut client = TestServiceClient::new(channel);

    checker.wait_until_ready(Duration::from_secs(5)).await;
    let mut transitions = checker.subscribe();
    backends[1].set_serving(false).await;
    while transitions.recv().await?.to != LineState::Health(HealthVerdict::Unhealthy) {}
    tokio::time::sleep(Duration::from_millis(50)).await; // tonic applies the change in its task

    backends.iter().for_each(|b| b.reset_counters());
    for _ in 0..30 {
        client.unary(Ping::default()).await?;
    }
    let hits: Vec<u64> = backends.iter().map(|b| b.hits()).collect();
    println!("b1 NOT_SERVING, 30 calls through tonic's balancer: {hits:?}");
    assert_eq!(hits[1], 0);
    checker.stop().await;
    Ok(())
}

//! Drive tonic's own `Channel::balance_channel` from the health checker, without the rest of
//! the kit: three test backends, one flips to NOT_SERVING and gets no calls, then flips back.
//!
//! ```text
//! cargo run -p health-layer --example balance_channel
//! ```

use std::convert::Infallible;
use std::time::Duration;

use health_layer::{HealthChecker, HealthFilter, HealthVerdict, ProbeMode, drive_balance_channel};
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tonic::transport::{Channel, Endpoint};
use tower::discover::Change;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backends = Backends::start(3).await?;
    println!("backends: {:?}", backends.uris());

    // 1. The checker: Watch streams, so a status change is seen at once.
    let checker = HealthChecker::builder().mode(ProbeMode::Watch).build()?;
    checker.start(Vec::<String>::new())?;

    // 2. The endpoints, from wherever you discover them (a fixed list here), filtered by health.
    //    Each endpoint's probe gets its own channel built from the same `Endpoint` settings.
    let discovered = futures_util::stream::iter(backends.uris().into_iter().map(|uri| {
        let endpoint = Endpoint::from_shared(uri.clone()).expect("a valid URI");
        Ok::<_, Infallible>(Change::Insert(uri, endpoint))
    }));
    let filter = HealthFilter::tonic_endpoints(discovered, checker.clone());

    // 3. tonic's balanced channel, driven by the filter.
    let (channel, changes) = Channel::balance_channel::<String>(16);
    tokio::spawn(drive_balance_channel(filter, changes));
    let mut client = TestServiceClient::new(channel);

    checker.wait_until_ready(Duration::from_secs(5)).await;
    let mut events = checker.subscribe();
    let mut round = async |label: &str| -> Result<(), tonic::Status> {
        backends.iter().for_each(|b| b.reset_counters());
        for _ in 0..60 {
            client.unary(Ping::default()).await?;
        }
        let split: Vec<String> = backends
            .iter()
            .map(|b| format!("{}={}", b.name(), b.hits()))
            .collect();
        println!("{label:<28} 60 calls: {}", split.join(" "));
        Ok(())
    };

    round("all serving").await?;

    backends[1].set_serving(false).await;
    wait_for(&mut events, HealthVerdict::Unhealthy).await;
    // The forwarding task sends the `Remove` right after the transition; give it a moment.
    tokio::time::sleep(Duration::from_millis(100)).await;
    round("b1 NOT_SERVING").await?;
    assert_eq!(backends[1].hits(), 0, "a NOT_SERVING backend gets no calls");

    backends[1].set_serving(true).await;
    wait_for(&mut events, HealthVerdict::Healthy).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    round("b1 SERVING again").await?;

    checker.stop().await;
    Ok(())
}

async fn wait_for(
    events: &mut tokio::sync::broadcast::Receiver<health_layer::Transition>,
    to: HealthVerdict,
) {
    while let Ok(t) = events.recv().await {
        if t.to == to {
            println!(
                "transition: {} {} -> {} ({})",
                t.target,
                t.from,
                t.to,
                t.reason.as_deref().unwrap_or("-")
            );
            return;
        }
    }
}

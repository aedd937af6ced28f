//! Under tower's own p2c balancer, over three real backends, one of which fails every call:
//! after the trip the failing one gets no calls; when it recovers, the half-open probe lets it
//! back in.

use std::time::Duration;

use breaker_layer::{Breaker, BreakerConfig, BreakerHandle, BreakerLayer};
use endpoint_state::{BreakerState, EndpointCard, HasCard};
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::{Backends, fixture};
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::Channel;
use tower::Layer;
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::discover::ServiceList;
use tower::load::{CompleteOnResponse, PendingRequestsDiscover};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2c_routes_around_an_open_breaker_and_the_probe_lets_it_back_in() {
    let backends = Backends::start(3).await.unwrap();
    let config = BreakerConfig::default()
        .consecutive_failures(3)
        .open_base(Duration::from_secs(3))
        .open_multiplier(1.0)
        .open_jitter(0.0);

    let mut handles: Vec<BreakerHandle> = Vec::new();
    let mut stacks: Vec<Breaker<Channel>> = Vec::new();
    for b in &backends {
        let layer = BreakerLayer::new(EndpointCard::new(b.name()), config.clone()).unwrap();
        handles.push(layer.handle());
        let channel = fixture::connect_lazy(b);
        stacks.push(layer.layer(channel));
    }
    assert_eq!(
        stacks[1].card().unwrap().target(),
        "b1",
        "cards readable through the stack"
    );
    let discover =
        PendingRequestsDiscover::new(ServiceList::new(stacks), CompleteOnResponse::default());
    let balance = Balance::new(discover);
    let mut client = TestServiceClient::new(Buffer::new(balance, 64));
    let bad = &backends[1];
    bad.fail_always(Some(Code::Unavailable));

    // Until the breaker trips, b1's share of calls fails.
    let mut calls = 0;
    while !matches!(handles[1].state(), BreakerState::Open { .. }) {
        let _ = client.unary(Ping::default()).await;
        calls += 1;
        assert!(calls < 1_000, "b1's breaker never tripped");
    }
    assert_eq!(
        bad.hits(),
        3,
        "exactly the three consecutive failures reached b1"
    );
    let until = match handles[1].state() {
        BreakerState::Open { until } => until,
        _ => unreachable!(),
    };

    // While open, b1 gets no calls and every call succeeds on b0 or b2. Only calls that start
    // well before the half-open instant are made here.
    let mut while_open = 0;
    while Instant::now() + Duration::from_millis(1_500) < until && while_open < 60 {
        let pong = client
            .unary(Ping::default())
            .await
            .expect("routed to a healthy backend");
        assert_ne!(pong.into_inner().backend, "b1");
        while_open += 1;
    }
    assert!(
        while_open >= 10,
        "only {while_open} calls in the open period"
    );
    assert_eq!(
        bad.hits(),
        3,
        "no call reached b1 while its breaker was open"
    );

    // b1 recovers. After the open period, p2c's readiness polling takes the half-open permit,
    // the probe goes to b1 and succeeds, and b1 is back in rotation.
    bad.fail_always(None);
    let deadline = Instant::now() + Duration::from_secs(30);
    while handles[1].state() != BreakerState::Closed {
        assert!(
            Instant::now() < deadline,
            "b1 never came back: {:?}",
            handles[1].line()
        );
        client
            .unary(Ping::default())
            .await
            .expect("no failures after recovery");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        handles[1].line().reason.as_deref(),
        Some("probe call succeeded")
    );
    let before = bad.hits();
    for _ in 0..60 {
        client.unary(Ping::default()).await.unwrap();
    }
    assert!(bad.hits() > before, "b1 takes calls again");
    assert!(handles.iter().all(|h| h.state() == BreakerState::Closed));
}

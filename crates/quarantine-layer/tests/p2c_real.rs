//! Three real backends behind tower's p2c balancer, each stack `Quarantine<Channel>`:
//! stopping one backend costs at most one failed call, then no call reaches it until its
//! quarantine ends (real time: the quarantine is 2 s, and only calls that completed before its
//! end are judged, so a slow machine cannot make the test lie).

use std::time::Duration;

use endpoint_state::EndpointCard;
use quarantine_layer::{Quarantine, QuarantineConfig, QuarantineGroup};
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::{Backends, fixture};
use tokio::time::Instant;
use tonic::Code;
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::discover::ServiceList;
use tower::load::Constant;

const QUARANTINE: Duration = Duration::from_secs(2);

#[tokio::test]
async fn a_stopped_backend_costs_one_failed_call_then_none_until_its_quarantine_ends() {
    let backends = Backends::start(3).await.unwrap();
    let group = QuarantineGroup::new(QuarantineConfig::default().duration(QUARANTINE)).unwrap();
    let mut cards = Vec::new();
    let mut stacks = Vec::new();
    for b in &backends {
        let channel = fixture::connect(b).await;
        let card = EndpointCard::new(b.name());
        stacks.push(Constant::new(
            Quarantine::new(channel, &group, card.clone()),
            1u32,
        ));
        cards.push(card);
    }
    let balancer = Buffer::new(Balance::new(ServiceList::new(stacks)), 64);
    let mut client = TestServiceClient::new(balancer);

    // Warm: every backend serves.
    for _ in 0..60 {
        client.unary(Ping::default()).await.unwrap();
    }
    assert!(backends.iter().all(|b| b.hits() > 0), "{backends:?}");

    // b1 stops abruptly. Sequential calls until one of them lands on it (p2c picks at random).
    let b1 = &backends[1];
    b1.stop().await;
    let mut failures = 0;
    for _ in 0..300 {
        match client.unary(Ping::default()).await {
            Ok(pong) => assert_ne!(pong.into_inner().backend, "b1"),
            Err(status) => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                failures += 1;
                break;
            }
        }
    }
    assert_eq!(failures, 1, "p2c sent a call to the stopped backend");
    let until = cards[1]
        .quarantine_state()
        .until
        .expect("the failed call quarantined b1");
    assert!(until > Instant::now());

    // b1 is back at once, but quarantined: no call may reach it until the quarantine ends.
    b1.restart().await.unwrap();
    b1.reset_counters();
    // A call that completed before the quarantine's end was routed before it: it must not have
    // reached b1 (b1 counts a call when it arrives, before it answers).
    let mut during = 0;
    loop {
        let result = client.unary(Ping::default()).await;
        if Instant::now() >= until {
            break;
        }
        let pong = result.unwrap().into_inner();
        assert_ne!(pong.backend, "b1");
        assert_eq!(
            b1.hits(),
            0,
            "call {during} during the quarantine reached b1"
        );
        during += 1;
    }
    assert!(during > 0, "calls were made during the quarantine");

    // After the quarantine, b1 carries traffic again, and nothing failed.
    tokio::time::sleep_until(until + Duration::from_millis(50)).await;
    let mut after = 0;
    while b1.hits() == 0 && after < 300 {
        client.unary(Ping::default()).await.unwrap();
        after += 1;
    }
    assert!(b1.hits() > 0, "b1 is back in rotation after {after} calls");
    assert_eq!(group.strikes("b1"), Some(1));
}

//! One rule for every passive signal, owned by `endpoint-state` and asked by the balancer,
//! quarantine and the breaker alike: quarantine and open breakers narrow the choice, never
//! empty it. Cross-crate, over real tonic backends on loopback.

use std::time::{Duration, Instant};

use endpoint_state::{EndpointCard, HealthVerdict, Peers};
use grpc_client_kit::balance::{Balance, BalanceConfig};
use grpc_client_kit::breaker::{BreakerConfig, BreakerLayer};
use grpc_client_kit::quarantine::QuarantineGroup;
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use tower::Layer;
use tower::discover::ServiceList;

fn channel(uri: String) -> Channel {
    Endpoint::from_shared(uri).unwrap().connect_lazy()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_balancer_never_picks_an_endpoint_whose_quarantine_gate_stays_shut() {
    // The group has a third member, b2, that this balancer does not route to (another
    // balancer's, or one discovery removed): it is eligible, so b0's quarantine holds — b0's
    // gate stays shut. The balancer used to decide on its own endpoints alone (b0 quarantined,
    // b1 unhealthy: "ignore quarantine"), picked b0, and the call waited on b0's shut gate for
    // the whole quarantine. Now both ask b0's card, which asks its peer set.
    let backends = Backends::start(2).await.unwrap();
    let group = QuarantineGroup::default();
    let cards: Vec<EndpointCard> = ["b0", "b1", "b2"]
        .iter()
        .map(|n| EndpointCard::new(*n))
        .collect();
    for card in &cards {
        group.add(card.clone());
    }
    let services: Vec<_> = (0..2)
        .map(|i| {
            group
                .layer(cards[i].clone())
                .layer(channel(backends[i].uri()))
        })
        .collect();
    let balance = Balance::new(ServiceList::new(services), BalanceConfig::new()).unwrap();
    group
        .report_failure_with_reason("b0", Some(Duration::from_secs(60)), "UNAVAILABLE: test")
        .unwrap();
    cards[1].set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    assert!(cards[2].is_eligible());

    let mut client = TestServiceClient::new(balance);
    let mut request = tonic::Request::new(Ping::default());
    request.set_timeout(Duration::from_secs(10));
    let started = Instant::now();
    let status = client.unary(request).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the call did not wait on a shut gate: {:?}",
        started.elapsed()
    );
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("quarantined"),
        "{}",
        status.message()
    );
    assert_eq!(backends.total_hits(), 0);

    // b2 leaves the group: no eligible peer is left, so b0 is admitted after all.
    group.remove("b2");
    client.unary(Ping::default()).await.unwrap();
    assert_eq!(backends[0].hits(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_breakers_under_the_balancer_never_cut_it_off() {
    // Breakers alone (no quarantine group): their cards are in no peer set, so the balancer
    // makes its endpoints each other's peers. Every breaker opens after three failures; calls
    // still reach the backends, and the first success closes a breaker.
    let backends = Backends::start(3).await.unwrap();
    let config = BreakerConfig::default().consecutive_failures(3);
    let mut cards = Vec::new();
    let services: Vec<_> = backends
        .iter()
        .map(|b| {
            let card = EndpointCard::new(b.name());
            cards.push(card.clone());
            BreakerLayer::new(card, config.clone())
                .unwrap()
                .layer(channel(b.uri()))
        })
        .collect();
    let balance = Balance::new(ServiceList::new(services), BalanceConfig::new()).unwrap();
    for b in backends.iter() {
        b.fail_next(4, Code::Internal);
    }
    let mut client = TestServiceClient::new(balance);
    let mut codes = Vec::new();
    for _ in 0..13 {
        codes.push(client.unary(Ping::default()).await.err().map(|s| s.code()));
    }
    let failed = codes.iter().filter(|c| c.is_some()).count();
    assert_eq!(failed, 12, "{codes:?}");
    assert!(
        codes[..12].iter().all(|c| *c == Some(Code::Internal)),
        "every failure is a backend's own: {codes:?}"
    );
    assert_eq!(codes[12], None, "the 13th call succeeds");
    assert_eq!(backends.total_hits(), 13, "every call reached a backend");
    assert!(
        cards.iter().all(|c| c.peers().is_some()),
        "the balancer gave the cards a peer set"
    );
    let shared = cards[0].peers().unwrap();
    assert!(
        cards
            .iter()
            .all(|c| c.peers().is_some_and(|p: Peers| p.same_set(&shared)))
    );
}

//! Under tower's p2c balancer over three real backends: the gate layer, and the discover
//! filter. After one backend goes NOT_SERVING it gets zero calls; after SERVING it gets calls
//! again.

mod support;

use std::time::Duration;

use health_layer::{HealthChecker, HealthFilter, HealthVerdict, ProbeMode, Target};
use support::{hits_after, wait_verdict};
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tonic::transport::{Channel, Endpoint};
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::discover::ServiceList;
use tower::load::{CompleteOnResponse, PendingRequestsDiscover};

const LIMIT: Duration = Duration::from_secs(10);

fn watcher() -> HealthChecker {
    HealthChecker::builder()
        .mode(ProbeMode::Watch)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_takes_a_not_serving_backend_out_of_p2c_and_brings_it_back() {
    let backends = Backends::start(3).await.unwrap();
    let checker = watcher();
    checker.start(backends.uris()).unwrap();
    assert!(checker.wait_until_ready(LIMIT).await);

    let stacks: Vec<_> = backends
        .iter()
        .map(|b| {
            let channel = Endpoint::from_shared(b.uri()).unwrap().connect_lazy();
            tower::ServiceBuilder::new()
                .layer(checker.layer(&b.uri()).unwrap())
                .service(channel)
        })
        .collect();
    let discover =
        PendingRequestsDiscover::new(ServiceList::new(stacks), CompleteOnResponse::default());
    let balance = Balance::new(discover);
    let mut client = TestServiceClient::new(Buffer::new(balance, 64));

    let mut ping = async || {
        client.unary(Ping::default()).await.unwrap();
    };

    let hits = hits_after(&backends, 60, &mut ping).await;
    assert!(hits.iter().all(|h| *h > 0), "{hits:?}");

    let card = checker.card(&backends[1].uri()).unwrap();
    backends[1].set_serving(false).await;
    assert!(wait_verdict(&card, HealthVerdict::Unhealthy, LIMIT).await);
    let hits = hits_after(&backends, 60, &mut ping).await;
    assert_eq!(hits[1], 0, "{hits:?}");
    assert_eq!(hits.iter().sum::<u64>(), 60);

    backends[1].set_serving(true).await;
    assert!(wait_verdict(&card, HealthVerdict::Healthy, LIMIT).await);
    let hits = hits_after(&backends, 60, &mut ping).await;
    assert!(hits[1] > 0, "back in rotation: {hits:?}");
    checker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_discover_filter_drives_p2c() {
    let backends = Backends::start(3).await.unwrap();
    let uris = backends.uris();
    let checker = watcher();
    checker.start(Vec::<&str>::new()).unwrap();

    let channels: Vec<Channel> = uris
        .iter()
        .map(|u| Endpoint::from_shared(u.clone()).unwrap().connect_lazy())
        .collect();
    let targets = uris.clone();
    let filter = HealthFilter::with_targets(
        ServiceList::new::<http::Request<tonic::body::Body>>(channels),
        checker.clone(),
        move |key: &usize, _: &Channel| Target::new(targets[*key].as_str()),
    );
    let discover = PendingRequestsDiscover::new(filter, CompleteOnResponse::default());
    let mut client = TestServiceClient::new(Buffer::new(Balance::new(discover), 64));

    // tower's balancer reads its discover only when asked for readiness: the first call
    // registers the targets with the checker, and waits until one is healthy.
    assert!(checker.targets().is_empty());
    tokio::time::timeout(LIMIT, client.unary(Ping::default()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(checker.targets().len(), 3);
    assert!(checker.wait_until_ready(LIMIT).await);

    let mut ping = async || {
        client.unary(Ping::default()).await.unwrap();
    };
    let hits = hits_after(&backends, 60, &mut ping).await;
    assert!(hits.iter().all(|h| *h > 0), "{hits:?}");

    // Wait for the transition itself (published after the card changed): from then on the
    // filter, polled by the balancer before its next pick, sees it.
    let mut events = checker.subscribe();
    backends[2].set_serving(false).await;
    assert!(support::wait_transition(&mut events, &uris[2], HealthVerdict::Unhealthy, LIMIT).await);
    let hits = hits_after(&backends, 60, &mut ping).await;
    assert_eq!(hits[2], 0, "{hits:?}");

    backends[2].set_serving(true).await;
    assert!(support::wait_transition(&mut events, &uris[2], HealthVerdict::Healthy, LIMIT).await);
    let hits = hits_after(&backends, 60, &mut ping).await;
    assert!(hits[2] > 0, "back in rotation: {hits:?}");
    checker.stop().await;
}

//! Probe channels: a failed probe drops its channel before its result is published, removing a
//! target or stopping the checker closes channels, and probes never use application channels.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use health_layer::{HealthChecker, HealthVerdict};
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::{HEALTH_CHECK_PATH, Ping};
use test_backends::{Backend, Backends};
use tonic::transport::Endpoint;

const LIMIT: Duration = Duration::from_secs(10);

fn on_demand() -> HealthChecker {
    HealthChecker::builder()
        .interval(Duration::ZERO)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_failed_probe_drops_its_channel_before_publishing_and_the_next_one_reconnects() {
    let b = Backend::start("b0").await.unwrap();
    let target = b.uri();
    let checker = on_demand();
    checker.add_target(target.as_str()).unwrap();
    checker.start(Vec::<&str>::new()).unwrap();

    // What a subscriber sees at the moment an unhealthy verdict is published.
    let seen = Arc::new(Mutex::new(Vec::new()));
    {
        let seen = seen.clone();
        let me = checker.clone(); // a cycle, broken by stop() below
        let target = target.clone();
        checker.on_transition(move |t| {
            let open = me.status(&target).unwrap().channel_open;
            seen.lock().unwrap().push((support::verdict(t.to), open));
        });
    }

    let mut accepted = Vec::new();
    for _ in 0..3 {
        checker.check_now(&target).await.unwrap();
        accepted.push(b.connections_accepted());
    }
    b.set_serving(false).await;
    for _ in 0..3 {
        let status = checker.check_now(&target).await.unwrap();
        assert_eq!(status.verdict, HealthVerdict::Unhealthy);
        assert!(!status.channel_open);
        accepted.push(b.connections_accepted());
    }
    b.set_serving(true).await;
    for _ in 0..2 {
        checker.check_now(&target).await.unwrap();
        accepted.push(b.connections_accepted());
    }
    // Passing probes share one connection; the first failure drops it, every probe after a
    // failure opens a new one, and passing probes share that one again.
    assert_eq!(accepted, [1, 1, 1, 1, 2, 3, 4, 4]);
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (HealthVerdict::Healthy, true),
            (HealthVerdict::Unhealthy, false),
            (HealthVerdict::Healthy, true),
        ],
        "the channel was already gone when the unhealthy verdict was published"
    );
    checker.stop().await;
}

#[tokio::test]
async fn removing_a_target_closes_its_probe_channel_at_once() {
    let backends = Backends::start(2).await.unwrap();
    let checker = on_demand();
    checker.start(backends.uris()).unwrap();
    for uri in backends.uris() {
        checker.check_now(&uri).await.unwrap();
    }
    assert_eq!(backends[0].open_connections(), 1);
    assert_eq!(backends[1].open_connections(), 1);

    let t = std::time::Instant::now();
    assert!(checker.remove_target(&backends[0].uri()));
    assert!(
        support::eventually(LIMIT, || backends[0].open_connections() == 0).await,
        "the removed target's connection is closed"
    );
    eprintln!("connection closed {:?} after remove_target", t.elapsed());
    assert_eq!(
        backends[1].open_connections(),
        1,
        "the other target keeps its own"
    );
    assert!(!checker.contains(&backends[0].uri()));
    checker.stop().await;
}

#[tokio::test]
async fn stopping_the_checker_closes_every_probe_channel() {
    let backends = Backends::start(3).await.unwrap();
    let checker = HealthChecker::builder()
        .interval(Duration::from_secs(60))
        .build()
        .unwrap();
    checker.start(backends.uris()).unwrap();
    assert!(checker.wait_until_ready(LIMIT).await);
    assert!(backends.iter().all(|b| b.open_connections() == 1));
    checker.stop().await;
    assert!(
        support::eventually(LIMIT, || backends.iter().all(|b| b.open_connections() == 0)).await
    );
    assert!(!checker.is_running());
}

#[tokio::test]
async fn probes_never_use_the_application_channel() {
    let b = Backend::start("b0").await.unwrap();
    let app_endpoint = Endpoint::from_shared(b.uri())
        .unwrap()
        .user_agent("the-app")
        .unwrap();
    // The application's channel, gated by the checker's verdict.
    let checker = on_demand();
    let card = checker.add_target(b.uri()).unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    let app_channel = app_endpoint.connect_lazy();
    let gated = tower::ServiceBuilder::new()
        .layer(health_layer::HealthLayer::new(card))
        .service(app_channel);
    let mut client = TestServiceClient::new(gated);

    // The target is probed once when the checker starts (interval 0: no schedule).
    assert!(checker.wait_until_ready(LIMIT).await);
    assert_eq!(
        b.connections_accepted(),
        1,
        "the probe connected on its own"
    );
    assert_eq!(b.hits_for(HEALTH_CHECK_PATH), 1);

    client.unary(Ping::default()).await.unwrap();
    assert_eq!(
        b.connections_accepted(),
        2,
        "the app has its own connection"
    );
    let ua = b.last_request_headers().unwrap()["user-agent"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(ua.starts_with("the-app"), "{ua}");

    checker.check_now(&b.uri()).await.unwrap();
    let ua = b.last_request_headers().unwrap()["user-agent"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        !ua.starts_with("the-app"),
        "the probe did not go through the app channel: {ua}"
    );
    assert_eq!(b.hits_for(HEALTH_CHECK_PATH), 2);
    assert_eq!(b.hits(), 1, "probes are not application calls");
    assert_eq!(b.connections_accepted(), 2);
    checker.stop().await;
}

//! `Watch` against real tonic servers on loopback.

mod support;

use std::time::Duration;

use health_layer::{HealthChecker, HealthVerdict, ProbeMode, Target};
use support::wait_verdict;
use test_backends::Backend;

const LIMIT: Duration = Duration::from_secs(10);

fn watcher() -> HealthChecker {
    HealthChecker::builder()
        .mode(ProbeMode::Watch)
        .interval(Duration::from_secs(300)) // not used by Watch; a change must not wait for it
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_status_change_reaches_the_gate_without_waiting_for_an_interval() {
    let b = Backend::start("b0").await.unwrap();
    let checker = watcher();
    let card = checker.add_target(b.uri()).unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    assert!(wait_verdict(&card, HealthVerdict::Healthy, LIMIT).await);

    for _ in 0..3 {
        let t = std::time::Instant::now();
        b.set_serving(false).await;
        assert!(wait_verdict(&card, HealthVerdict::Unhealthy, LIMIT).await);
        eprintln!("NOT_SERVING reached the card in {:?}", t.elapsed());
        assert_eq!(card.health().reason.as_deref(), Some("NOT_SERVING"));
        b.set_serving(true).await;
        assert!(wait_verdict(&card, HealthVerdict::Healthy, LIMIT).await);
    }
    assert_eq!(b.health_checks(), 1, "one Watch stream, no polling");
    let status = checker.status(&b.uri()).unwrap();
    assert_eq!(status.next_check, None, "no schedule in Watch mode");
    assert!(status.channel_open);
    checker.stop().await;
}

#[tokio::test]
async fn an_unknown_service_on_tonic_health_is_not_found() {
    let b = Backend::start("b0").await.unwrap();
    let checker = watcher();
    let card = checker
        .add_target(Target::new(b.uri()).service("no.such.Service"))
        .unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    assert!(wait_verdict(&card, HealthVerdict::Unhealthy, LIMIT).await);
    assert_eq!(
        card.health().reason.as_deref(),
        Some("NOT_FOUND: unknown service \"no.such.Service\" (service not registered)")
    );
    checker.stop().await;
}

#[tokio::test]
async fn a_broken_stream_is_unhealthy_until_a_new_one_says_serving() {
    let b = Backend::start("b0").await.unwrap();
    let checker = watcher();
    let card = checker.add_target(b.uri()).unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    assert!(wait_verdict(&card, HealthVerdict::Healthy, LIMIT).await);

    b.stop().await;
    assert!(wait_verdict(&card, HealthVerdict::Unhealthy, LIMIT).await);
    let reason = card.health().reason.clone().unwrap();
    assert!(reason.starts_with("UNAVAILABLE"), "{reason}");
    assert!(
        !checker.status(&b.uri()).unwrap().channel_open,
        "the broken channel is dropped"
    );

    b.restart().await.unwrap();
    let t = std::time::Instant::now();
    assert!(wait_verdict(&card, HealthVerdict::Healthy, LIMIT).await);
    eprintln!("re-subscribed {:?} after the restart", t.elapsed());
    assert_eq!(b.health_checks(), 2, "a second Watch");
    checker.stop().await;
}

#[tokio::test]
async fn a_server_without_watch_is_healthy_by_default_and_unhealthy_when_required() {
    // gRFC A17: UNIMPLEMENTED means the server does not do health checking: healthy.
    let (uri, server) = support::server_without_health().await;
    let lenient = watcher();
    let card = lenient.add_target(uri.as_str()).unwrap();
    lenient.start(Vec::<&str>::new()).unwrap();
    assert!(wait_verdict(&card, HealthVerdict::Healthy, LIMIT).await);
    assert_eq!(
        card.health().reason.as_deref(),
        Some("UNIMPLEMENTED: no health service; counted as healthy")
    );

    let strict = HealthChecker::builder()
        .mode(ProbeMode::Watch)
        .unimplemented_is_healthy(false)
        .build()
        .unwrap();
    let card = strict.add_target(uri.as_str()).unwrap();
    strict.start(Vec::<&str>::new()).unwrap();
    assert!(wait_verdict(&card, HealthVerdict::Unhealthy, LIMIT).await);
    let reason = card.health().reason.clone().unwrap();
    assert!(reason.starts_with("UNIMPLEMENTED"), "{reason}");
    strict.stop().await;
    lenient.stop().await;
    server.abort();
}

//! `Backend::start_with` and its `ServerOptions`: no health service, the maximum connection age
//! with and without a grace, kept across restarts.

use std::time::Duration;

use test_backends::{Backend, ServerOptions};
use tokio::time::Instant;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;

use crate::support::{EVENTUALLY, channel, check, eventually, health_client, test_client, unary};

const AGE: Duration = Duration::from_millis(300);

#[tokio::test]
async fn without_health_a_check_is_unimplemented() {
    let options = ServerOptions::default().health(false);
    let backend = Backend::start_with("b0", options).await.unwrap();
    assert!(!backend.options().health);

    let mut health = health_client(backend.uri()).await;
    let status = check(&mut health, "").await.unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    let mut client = test_client(backend.uri()).await;
    assert_eq!(unary(&mut client, "x").await.unwrap().backend, "b0");

    // Kept across restarts.
    backend.restart().await.unwrap();
    let mut health = health_client(backend.uri()).await;
    let status = check(&mut health, "").await.unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
}

#[tokio::test]
async fn max_connection_age_closes_an_idle_connection_and_survives_restarts() {
    let options = ServerOptions::default().max_connection_age(AGE);
    let backend = Backend::start_with("b0", options).await.unwrap();

    for generation in 0..2 {
        let connecting = Instant::now();
        let _channel = channel(backend.uri()).await;
        eventually("the client's connection is open", || async {
            backend.open_connections() == 1
        })
        .await;
        eventually("the server closed the aged connection", || async {
            backend.open_connections() == 0
        })
        .await;
        let closed_after = connecting.elapsed();
        assert!(
            closed_after >= AGE,
            "generation {generation}: {closed_after:?}"
        );
        backend.restart().await.unwrap();
    }

    // Without the option the connection stays.
    let plain = Backend::start("b1").await.unwrap();
    let _channel = channel(plain.uri()).await;
    tokio::time::sleep(AGE * 3).await;
    assert_eq!(plain.open_connections(), 1);
}

/// A health `Watch` on its own connection; returns when it ends (with its error, if any).
async fn watch_until_it_ends(uri: String) -> (Duration, Option<tonic::Status>) {
    let mut health = health_client(uri).await;
    let started = Instant::now();
    let request = HealthCheckRequest {
        service: String::new(),
    };
    let mut watch = health.watch(request).await.unwrap().into_inner();
    loop {
        match watch.message().await {
            Ok(Some(_)) => {}
            Ok(None) => return (started.elapsed(), None),
            Err(status) => return (started.elapsed(), Some(status)),
        }
    }
}

#[tokio::test]
async fn the_age_alone_lets_open_calls_keep_their_connection() {
    let options = ServerOptions::default().max_connection_age(AGE);
    let backend = Backend::start_with("b0", options).await.unwrap();

    let watch = tokio::spawn(watch_until_it_ends(backend.uri()));
    tokio::time::sleep(AGE * 4).await;

    assert!(!watch.is_finished(), "{:?}", watch.await);
    assert_eq!(backend.open_connections(), 1);
}

#[tokio::test]
async fn with_a_grace_the_connection_is_dropped_at_age_plus_grace_open_calls_and_all() {
    let grace = Duration::from_millis(400);
    let options = ServerOptions::default()
        .max_connection_age(AGE)
        .max_connection_age_grace(grace);
    let backend = Backend::start_with("b0", options).await.unwrap();

    let (ended, error) = tokio::time::timeout(EVENTUALLY, watch_until_it_ends(backend.uri()))
        .await
        .expect("the watch ends");

    assert!(ended >= AGE + grace, "ended after {ended:?}");
    assert!(error.is_some(), "the watch ended cleanly after {ended:?}");
}

//! Every control of the harness, on default settings: Unary and ServerStream replies, health,
//! injected failures and delays, hits, graceful stop, restart on the same port, kill, and a
//! backend without the health service.

use std::time::Duration;

use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::{SERVICE_NAME, StreamPing};
use tokio::time::Instant;
use tonic::Code;
use tonic_health::ServingStatus as Set;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::support::client::{
    EVENTUALLY, assert_refused, assert_within, channel, check, endpoint, error_chain, unary,
};
use crate::support::{Implementation, InteropBackend, ServerSettings};

pub(crate) async fn controls_work(imp: Implementation) {
    let defaults = ServerSettings::defaults();
    let mut b0 = InteropBackend::start(imp, "b0", &defaults).await;
    let b1 = InteropBackend::start(imp, "b1", &defaults).await;
    println!("{imp}: b0 {} b1 {}", b0.uri(), b1.uri());
    assert_eq!(b0.implementation(), imp);
    assert_ne!(b0.uri(), b1.uri());

    // Unary: the backend's name, the call's number, the payload echoed.
    let mut c0 = TestServiceClient::new(channel(&b0.uri()).await);
    let mut c1 = TestServiceClient::new(channel(&b1.uri()).await);
    let pong = unary(&mut c0, "hello").await.expect("unary");
    assert_eq!(
        (pong.backend.as_str(), pong.seq, pong.payload.as_str()),
        ("b0", 1, "hello")
    );
    let pong = unary(&mut c0, "again").await.expect("unary");
    assert_eq!(
        (pong.backend.as_str(), pong.seq, pong.payload.as_str()),
        ("b0", 2, "again")
    );
    let pong = unary(&mut c1, "").await.expect("unary");
    assert_eq!((pong.backend.as_str(), pong.seq), ("b1", 1));

    // ServerStream: `count` Pongs numbered from 0 (on b1: tonic's backend counts streams in
    // `seq` too).
    let mut stream = c1
        .server_stream(StreamPing { count: 3 })
        .await
        .expect("server stream")
        .into_inner();
    let mut seqs = Vec::new();
    while let Some(pong) = stream.message().await.expect("a stream message") {
        assert_eq!(pong.backend, "b1");
        seqs.push(pong.seq);
    }
    assert_eq!(seqs, [0, 1, 2]);

    // Health: the implementation's own service.
    let mut h0 = HealthClient::new(channel(&b0.uri()).await);
    assert_eq!(check(&mut h0, "").await.unwrap(), ServingStatus::Serving);
    assert_eq!(
        check(&mut h0, SERVICE_NAME).await.unwrap(),
        ServingStatus::Serving
    );
    b0.set_health("", Set::NotServing).await;
    assert_eq!(check(&mut h0, "").await.unwrap(), ServingStatus::NotServing);
    assert_eq!(
        check(&mut h0, SERVICE_NAME).await.unwrap(),
        ServingStatus::Serving
    );

    // An injected failure, once.
    b0.fail_next(1, Code::Unavailable).await;
    let status = unary(&mut c0, "fails")
        .await
        .expect_err("an injected failure");
    assert_eq!(status.code(), Code::Unavailable, "{}", error_chain(&status));
    assert!(
        status.message().ends_with("injected failure"),
        "{}",
        error_chain(&status)
    );
    assert_eq!(unary(&mut c0, "passes").await.expect("unary").seq, 4);

    // A delay, then none.
    let delay = Duration::from_millis(400);
    b0.set_delay(delay).await;
    let started = Instant::now();
    unary(&mut c0, "slow").await.expect("unary");
    let slow = started.elapsed();
    assert_within(
        "a delayed call",
        slow,
        delay,
        delay + Duration::from_secs(3),
    );
    b0.set_delay(Duration::ZERO).await;
    let started = Instant::now();
    unary(&mut c0, "fast").await.expect("unary");
    let fast = started.elapsed();
    assert!(
        fast < Duration::from_millis(300),
        "delay 0 still slow: {fast:?}"
    );
    println!("{imp}: delayed call {slow:?}, undelayed {fast:?}");

    // hits: every Unary call, the failed one included.
    assert_eq!(b0.hits().await, 6);
    assert_eq!(b1.hits().await, 1);

    // Graceful stop: new connections are refused at once, a call in flight finishes.
    let delay = Duration::from_millis(1000);
    b0.set_delay(delay).await;
    let mut in_flight = c0.clone();
    let call = tokio::spawn(async move { unary(&mut in_flight, "in flight").await });
    let deadline = Instant::now() + EVENTUALLY;
    while b0.hits().await < 7 {
        assert!(
            Instant::now() < deadline,
            "the in-flight call never arrived"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    let port = b0.port();
    let stop = b0.stop_graceful(Duration::from_secs(5));
    let while_stopping = async {
        tokio::time::sleep(delay / 4).await;
        assert_refused(port).await;
        assert!(!call.is_finished(), "the call was no longer in flight");
    };
    tokio::join!(stop, while_stopping);
    println!("{imp}: graceful stop took {:?}", started.elapsed());
    let pong = call
        .await
        .unwrap()
        .expect("the in-flight call finished during the grace");
    assert_eq!((pong.backend.as_str(), pong.seq), ("b0", 7));
    assert_refused(port).await;
    assert!(endpoint(&b0.uri()).connect().await.is_err());

    // Restart on the same port: a fresh server, health SERVING again.
    let uri = b0.uri();
    b0.restart().await;
    assert_eq!(b0.uri(), uri);
    let mut fresh = TestServiceClient::new(channel(&b0.uri()).await);
    let pong = unary(&mut fresh, "back")
        .await
        .expect("unary after restart");
    assert_eq!((pong.backend.as_str(), pong.seq), ("b0", 1));
    let mut h0 = HealthClient::new(channel(&b0.uri()).await);
    assert_eq!(check(&mut h0, "").await.unwrap(), ServingStatus::Serving);
    // The old channel reconnects by itself.
    let deadline = Instant::now() + EVENTUALLY;
    loop {
        match unary(&mut c0, "old channel").await {
            Ok(pong) => break assert_eq!(pong.backend, "b0"),
            Err(status) if Instant::now() < deadline => {
                println!("{imp}: old channel after restart: {}", error_chain(&status));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!(
                "the old channel never reconnected: {}",
                error_chain(&status)
            ),
        }
    }

    // Kill: a call in flight fails, the port refuses connections.
    b0.set_delay(Duration::from_secs(5)).await;
    let hits = b0.hits().await;
    let mut in_flight = fresh.clone();
    let call = tokio::spawn(async move { unary(&mut in_flight, "killed").await });
    let deadline = Instant::now() + EVENTUALLY;
    while b0.hits().await == hits {
        assert!(
            Instant::now() < deadline,
            "the in-flight call never arrived"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    b0.kill().await;
    let status = tokio::time::timeout(Duration::from_secs(3), call)
        .await
        .expect("the in-flight call fails promptly")
        .unwrap()
        .expect_err("the in-flight call fails");
    println!(
        "{imp}: in-flight call at kill, after {:?}: {}",
        started.elapsed(),
        error_chain(&status)
    );
    assert_refused(b0.port()).await;

    // No health service: UNIMPLEMENTED.
    let no_health = ServerSettings {
        health: false,
        ..ServerSettings::defaults()
    };
    let nh = InteropBackend::start(imp, "nh", &no_health).await;
    let mut h = HealthClient::new(channel(&nh.uri()).await);
    let status = check(&mut h, "").await.expect_err("no health service");
    assert_eq!(
        status.code(),
        Code::Unimplemented,
        "{}",
        error_chain(&status)
    );
    let mut c = TestServiceClient::new(channel(&nh.uri()).await);
    assert_eq!(unary(&mut c, "").await.expect("unary").backend, "nh");
}

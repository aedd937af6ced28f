//! set_delay, fail_next, fail_always.

use std::time::Duration;

use test_backends::Backend;
use test_backends::pb::StreamPing;
use tokio::time::Instant;
use tonic::Code;

use crate::support::{test_client, unary};

const DELAY: Duration = Duration::from_millis(150);

#[tokio::test]
async fn delay_delays_unary_calls() {
    let backend = Backend::start("b0").await.unwrap();
    let mut client = test_client(backend.uri()).await;
    unary(&mut client, "warm-up").await.unwrap();

    backend.set_delay(DELAY);
    let started = Instant::now();
    unary(&mut client, "slow").await.unwrap();
    let slow = started.elapsed();

    backend.set_delay(Duration::ZERO);
    let started = Instant::now();
    unary(&mut client, "fast").await.unwrap();
    let fast = started.elapsed();

    assert!(slow >= DELAY, "delayed call took {slow:?}");
    assert!(fast < DELAY, "undelayed call took {fast:?}");
}

#[tokio::test]
async fn delay_delays_streams() {
    let backend = Backend::start("b0").await.unwrap();
    let mut client = test_client(backend.uri()).await;
    backend.set_delay(DELAY);

    let started = Instant::now();
    let mut stream = client
        .server_stream(StreamPing { count: 2 })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();

    assert!(started.elapsed() >= DELAY, "{:?}", started.elapsed());
    assert_eq!(first.seq, 0);
}

#[tokio::test]
async fn fail_next_fails_exactly_n_unary_calls() {
    let backend = Backend::start("b3").await.unwrap();
    let mut client = test_client(backend.uri()).await;

    backend.fail_next(2, Code::Unavailable);
    for _ in 0..2 {
        let status = unary(&mut client, "x").await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().contains("b3"), "{status:?}");
    }
    let pong = unary(&mut client, "ok").await.unwrap();

    assert_eq!((pong.backend.as_str(), pong.payload.as_str()), ("b3", "ok"));
    assert_eq!(pong.seq, 3);
    assert_eq!(backend.hits(), 3);
}

#[tokio::test]
async fn fail_next_stream_sends_one_message_then_the_error() {
    let backend = Backend::start("b0").await.unwrap();
    let mut client = test_client(backend.uri()).await;

    backend.fail_next(1, Code::ResourceExhausted);
    let mut stream = client
        .server_stream(StreamPing { count: 5 })
        .await
        .expect("the failure comes in the trailers, not the headers")
        .into_inner();
    let first = stream.message().await.unwrap().expect("one message");
    assert_eq!((first.backend.as_str(), first.seq), ("b0", 0));
    let status = stream.message().await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);

    let mut stream = client
        .server_stream(StreamPing { count: 5 })
        .await
        .unwrap()
        .into_inner();
    let mut seqs = Vec::new();
    while let Some(pong) = stream.message().await.unwrap() {
        seqs.push(pong.seq);
    }
    assert_eq!(seqs, [0, 1, 2, 3, 4]);
}

#[tokio::test]
async fn fail_always_fails_until_cleared() {
    let backend = Backend::start("b0").await.unwrap();
    let mut client = test_client(backend.uri()).await;

    backend.fail_always(Some(Code::Internal));
    for _ in 0..3 {
        let status = unary(&mut client, "x").await.unwrap_err();
        assert_eq!(status.code(), Code::Internal);
    }
    backend.fail_always(None);

    unary(&mut client, "ok").await.unwrap();
}

//! Outcome classification against real tonic servers over real sockets, one test per place an
//! outcome can be found.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use endpoint_state::{Classify, OnOutcome, Outcome, OutcomeSource};
use test_backends::fixture::{self, LocalTimeout};
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::{Ping, StreamPing};
use test_backends::{Backend, Backends};
use tonic::Code;
use tonic::transport::Channel;

type Seen = Arc<Mutex<Vec<Outcome>>>;

type Client = TestServiceClient<Classify<Channel, Record>>;

/// Records every outcome it is handed.
#[derive(Clone, Default)]
struct Record(Seen);

impl OnOutcome for Record {
    fn on_outcome(self, outcome: Outcome) {
        self.0.lock().unwrap().push(outcome);
    }
}

fn client(channel: Channel) -> (Client, Seen) {
    let record = Record::default();
    let seen = record.0.clone();
    (TestServiceClient::new(Classify::new(channel, record)), seen)
}

/// The one outcome reported, waiting (bounded) for it to arrive.
async fn only_outcome(seen: &Seen) -> Outcome {
    for _ in 0..500 {
        {
            let seen = seen.lock().unwrap();
            if !seen.is_empty() {
                assert_eq!(seen.len(), 1, "reported exactly once: {seen:?}");
                return seen[0].clone();
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no outcome reported within 5 s");
}

/// A backend named `b0`, and a classifying client connected to it.
async fn started() -> (Backend, Client, Seen) {
    let b = Backend::start("b0").await.unwrap();
    let (c, seen) = client(fixture::connect(&b).await);
    (b, c, seen)
}

#[tokio::test]
async fn ok() {
    let (_b, mut c, seen) = started().await;
    let pong = c.unary(Ping::default()).await.unwrap().into_inner();
    assert_eq!(pong.backend, "b0");
    let status = only_outcome(&seen).await.status().cloned().unwrap();
    assert_eq!(status.code, Code::Ok);
    assert_eq!(status.source, OutcomeSource::Trailers);
}

#[tokio::test]
async fn trailers_only_error() {
    let (b, mut c, seen) = started().await;
    b.fail_next(1, Code::Unavailable);
    let err = c.unary(Ping::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    let status = only_outcome(&seen).await.status().cloned().unwrap();
    assert_eq!(status.code, Code::Unavailable);
    assert_eq!(
        status.source,
        OutcomeSource::Headers,
        "a trailers-only response"
    );
}

#[tokio::test]
async fn error_in_trailers_after_streamed_messages() {
    let (b, mut c, seen) = started().await;
    let mut stream = fixture::failing_stream(&b, &mut c, Code::Internal).await;
    let first = stream.message().await.unwrap().expect("one message first");
    assert_eq!(first.backend, "b0");
    assert!(
        seen.lock().unwrap().is_empty(),
        "not known until the trailers"
    );
    let err = stream.message().await.unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    let status = only_outcome(&seen).await.status().cloned().unwrap();
    assert_eq!(status.code, Code::Internal);
    assert_eq!(status.source, OutcomeSource::Trailers);
}

#[tokio::test]
async fn connect_refused() {
    let (_b, channel) = fixture::refused("b0").await.unwrap();
    let (mut c, seen) = client(channel);
    let err = c.unary(Ping::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    let status = only_outcome(&seen).await.status().cloned().unwrap();
    assert_eq!(status.code, Code::Unavailable);
    assert_eq!(status.source, OutcomeSource::ServiceError);
    assert!(
        status.message.to_lowercase().contains("refused"),
        "the cause survives: {status}"
    );
}

#[tokio::test]
async fn local_timeout() {
    let slow = LocalTimeout::start("b0").await.unwrap();
    let (mut c, seen) = client(slow.channel);
    let err = c.unary(Ping::default()).await.unwrap_err();
    // tonic reports its own timeout as CANCELLED ...
    LocalTimeout::assert_cancelled(&err);
    // ... which the classifier counts as what it is.
    let status = only_outcome(&seen).await.status().cloned().unwrap();
    assert_eq!(status.code, Code::DeadlineExceeded);
    assert_eq!(status.source, OutcomeSource::ServiceError);
}

#[tokio::test]
async fn response_future_dropped() {
    let (b, mut c, seen) = started().await;
    b.set_delay(Duration::from_secs(5));
    // The caller gives up (its own timer, not the channel's) before the reply.
    let gave_up = tokio::time::timeout(Duration::from_millis(100), c.unary(Ping::default())).await;
    assert!(gave_up.is_err());
    assert_eq!(b.hits(), 1, "the call did reach the backend");
    assert_eq!(only_outcome(&seen).await, Outcome::Abandoned);
}

#[tokio::test]
async fn body_dropped_half_read() {
    let (_b, mut c, seen) = started().await;
    let mut stream = c
        .server_stream(StreamPing { count: 100_000 })
        .await
        .unwrap()
        .into_inner();
    assert!(stream.message().await.unwrap().is_some());
    drop(stream);
    assert_eq!(only_outcome(&seen).await, Outcome::Abandoned);
}

#[tokio::test]
async fn many_calls_each_reported_once() {
    let bs = Backends::start(1).await.unwrap();
    let (c, seen) = client(fixture::connect(&bs[0]).await);
    let mut calls = Vec::new();
    for i in 0..20u32 {
        let mut c = c.clone();
        if i % 4 == 0 {
            bs[0].fail_next(1, Code::ResourceExhausted);
        }
        calls.push(tokio::spawn(async move {
            c.unary(Ping::default()).await.is_ok()
        }));
    }
    let mut ok = 0;
    for call in calls {
        ok += usize::from(call.await.unwrap());
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 20);
    let ok_reported = seen
        .iter()
        .filter(|o| o.status().is_some_and(|s| s.code == Code::Ok))
        .count();
    assert_eq!(ok_reported, ok);
}

//! What counts as a failure, against real tonic servers over loopback: a trailers-only
//! error, an error in the trailers after a streamed reply, a transport error and a local
//! timeout count; client errors count as successes; an abandoned call counts as neither; the
//! code set is configurable.

mod support;

use std::time::Duration;

use breaker_layer::{Breaker, BreakerConfig, BreakerHandle, BreakerLayer};
use endpoint_state::{BreakerState, EndpointCard, FailureCodes};
use support::reason;
use test_backends::Backend;
use test_backends::fixture::{self, LocalTimeout};
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tonic::Code;
use tonic::transport::Channel;
use tower::Layer;

type Client = TestServiceClient<Breaker<Channel>>;

fn client(channel: Channel, config: BreakerConfig) -> (Client, BreakerHandle) {
    let layer = BreakerLayer::new(EndpointCard::new("b0"), config).unwrap();
    let handle = layer.handle();
    (TestServiceClient::new(layer.layer(channel)), handle)
}

/// `n` calls that `b` answers with `code`.
async fn fail(c: &mut Client, b: &Backend, n: u64, code: Code) {
    b.fail_next(n, code);
    for _ in 0..n {
        assert_eq!(c.unary(Ping::default()).await.unwrap_err().code(), code);
    }
}

fn open(h: &BreakerHandle) -> bool {
    matches!(h.state(), BreakerState::Open { .. })
}

/// One failure trips: each failing kind of outcome must open it on its own.
fn trip_on_one() -> BreakerConfig {
    BreakerConfig::default()
        .consecutive_failures(1)
        .open_base(Duration::from_secs(60))
}

#[tokio::test]
async fn a_trailers_only_error_counts() {
    let b = Backend::start("b0").await.unwrap();
    let (mut c, h) = client(fixture::connect_lazy(&b), trip_on_one());
    c.unary(Ping::default()).await.unwrap();
    assert!(!open(&h));
    b.fail_next(1, Code::Unavailable);
    let err = c.unary(Ping::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(open(&h));
    assert!(reason(h.card()).starts_with("1 consecutive failure (last: UNAVAILABLE"));
}

#[tokio::test]
async fn an_error_in_the_trailers_after_a_streamed_reply_counts() {
    let b = Backend::start("b0").await.unwrap();
    let (mut c, h) = client(fixture::connect_lazy(&b), trip_on_one());
    let mut stream = fixture::failing_stream(&b, &mut c, Code::Internal).await;
    let first = stream
        .message()
        .await
        .unwrap()
        .expect("a message before the error");
    assert_eq!(first.backend, "b0");
    assert_eq!(
        h.state(),
        BreakerState::Closed,
        "not known before the trailers"
    );
    let err = stream.message().await.unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert!(open(&h));
    assert!(reason(h.card()).contains("INTERNAL"));
}

#[tokio::test]
async fn a_transport_error_counts() {
    let (_stopped, channel) = fixture::refused("b0").await.unwrap();
    let (mut c, h) = client(channel, trip_on_one());
    let err = c.unary(Ping::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(open(&h));
    let why = reason(h.card());
    assert!(why.to_lowercase().contains("refused"), "{why}");
}

#[tokio::test]
async fn a_local_timeout_counts() {
    let slow = LocalTimeout::start("b0").await.unwrap();
    let (mut c, h) = client(slow.channel.clone(), trip_on_one());
    let err = c.unary(Ping::default()).await.unwrap_err();
    LocalTimeout::assert_cancelled(&err);
    assert!(open(&h));
    assert!(reason(h.card()).contains("DEADLINE_EXCEEDED"));
}

#[tokio::test]
async fn client_errors_count_as_successes() {
    let b = Backend::start("b0").await.unwrap();
    let (mut c, h) = client(
        fixture::connect_lazy(&b),
        BreakerConfig::default().consecutive_failures(2),
    );
    for code in [
        Code::InvalidArgument,
        Code::NotFound,
        Code::PermissionDenied,
        Code::AlreadyExists,
        Code::FailedPrecondition,
        Code::Unauthenticated,
    ] {
        fail(&mut c, &b, 1, Code::Unavailable).await;
        fail(&mut c, &b, 1, code).await;
        assert_eq!(
            h.state(),
            BreakerState::Closed,
            "{code:?} resets the run of failures, as a success does"
        );
    }
    fail(&mut c, &b, 2, Code::Unavailable).await;
    assert!(open(&h), "two failures in a row still trip");
}

#[tokio::test]
async fn an_abandoned_call_counts_as_neither() {
    let b = Backend::start("b0").await.unwrap();
    let (mut c, h) = client(
        fixture::connect_lazy(&b),
        BreakerConfig::default().consecutive_failures(2),
    );
    fail(&mut c, &b, 1, Code::Unavailable).await;

    // The caller gives up on slow calls (its own timer, then drops the future): neither a
    // failure (which would trip) nor a success (which would reset the count).
    b.set_delay(Duration::from_secs(5));
    for _ in 0..3 {
        let gave_up =
            tokio::time::timeout(Duration::from_millis(50), c.unary(Ping::default())).await;
        assert!(gave_up.is_err());
    }
    assert_eq!(
        h.state(),
        BreakerState::Closed,
        "abandoned calls are not failures"
    );
    b.set_delay(Duration::ZERO);
    fail(&mut c, &b, 1, Code::Unavailable).await;
    assert!(
        open(&h),
        "abandoned calls did not reset the count: failure, 3 abandoned, failure trips at 2"
    );
}

#[tokio::test]
async fn the_failure_codes_are_configurable() {
    let b = Backend::start("b0").await.unwrap();
    let codes = FailureCodes::from_codes([Code::NotFound]);
    let (mut c, h) = client(
        fixture::connect_lazy(&b),
        trip_on_one().failure_codes(codes),
    );
    fail(&mut c, &b, 3, Code::Unavailable).await;
    assert_eq!(
        h.state(),
        BreakerState::Closed,
        "UNAVAILABLE is not in this set"
    );
    fail(&mut c, &b, 1, Code::NotFound).await;
    assert!(open(&h));
}

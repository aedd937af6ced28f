//! A call's deadline (`grpc-timeout`) bounds its whole life in the kit: waiting for a ready
//! target, waiting for an eligible one, connecting, the response — and waiting does not restart
//! it. Real backends (and an address that drops SYNs) on loopback.

mod support;

use std::time::Duration;

use grpc_client_kit::Kit;
use grpc_client_kit::breaker::BreakerConfig;
use grpc_client_kit::state::BreakerState;
use support::{eventually, watch};
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::{Ping, StreamPing};
use test_backends::{Backends, SynDrop};
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::Endpoint;

/// How late after its deadline a call may end on a loaded machine.
const SLACK: Duration = Duration::from_millis(250);

fn ping(deadline: Duration) -> tonic::Request<Ping> {
    let mut request = tonic::Request::new(Ping::default());
    request.set_timeout(deadline);
    request
}

/// One call with `deadline`; the test gives up (and fails) 5 s after it.
async fn call_with<T>(
    client: &mut TestServiceClient<T>,
    deadline: Duration,
) -> (
    Result<tonic::Response<test_backends::pb::Pong>, tonic::Status>,
    Duration,
)
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: http_body::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let start = Instant::now();
    let out = tokio::time::timeout(
        deadline + Duration::from_secs(5),
        client.unary(ping(deadline)),
    )
    .await
    .unwrap_or_else(|_| panic!("the call outlived its {deadline:?} deadline by 5 s"));
    (out, start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_to_an_address_that_drops_syns_ends_at_its_deadline() {
    let hole = SynDrop::start().await.unwrap();
    let kit = Kit::builder()
        .target(hole.uri())
        .without_health()
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    for deadline in [Duration::from_millis(300), Duration::from_millis(150)] {
        let (out, took) = call_with(&mut client, deadline).await;
        let status = out.unwrap_err();
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        assert!(took < deadline + SLACK, "took {took:?} for {deadline:?}");
        assert_eq!(
            status.message(),
            format!(
                "deadline exceeded after {} ms waiting for {}: connecting",
                deadline.as_millis(),
                hole.uri()
            )
        );
    }
    // It counts against the target: a local timeout is DEADLINE_EXCEEDED, a quarantine code.
    let card = kit.card(&hole.uri()).unwrap();
    assert!(
        card.quarantine_state().active_at(Instant::now()),
        "{card:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_for_a_busy_target_ends_at_its_deadline() {
    // One call at a time on the target's connection, one more held by its worker and room for
    // one more in its queue: further calls find the channel not ready (`poll_ready` is
    // `Pending` below the balancer).
    let backends = Backends::start(1).await.unwrap();
    backends[0].set_delay(Duration::from_secs(5));
    let kit = Kit::builder()
        .target(backends[0].uri())
        .without_health()
        .endpoint_template(|uri: &str| {
            Ok(Endpoint::from_shared(uri.to_owned())?
                .concurrency_limit(1)
                .buffer_size(1))
        })
        .build()
        .unwrap();
    let busy: Vec<_> = (0..4)
        .map(|_| {
            let mut client = TestServiceClient::new(kit.channel());
            tokio::spawn(async move { client.unary(Ping::default()).await })
        })
        .collect();
    assert!(eventually(Duration::from_secs(5), || backends[0].hits() == 1).await);
    let mut client = TestServiceClient::new(kit.channel());
    let deadline = Duration::from_millis(200);
    let (out, took) = call_with(&mut client, deadline).await;
    let status = out.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(took < deadline + SLACK, "took {took:?}");
    assert_eq!(
        status.message(),
        format!(
            "deadline exceeded after 200 ms waiting for {} to be ready",
            backends[0].uri()
        )
    );
    for call in busy {
        call.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_ready_does_not_restart_the_deadline() {
    // The call waits 500 ms of its second for an eligible target, whose answer then takes
    // 700 ms: the call ends at its deadline, and the backend was told what was left of it.
    let backends = Backends::start(1).await.unwrap();
    let kit = Kit::builder()
        .targets(backends.uris())
        .health(watch())
        .wait_for_ready(true)
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
    backends[0].set_serving(false).await;
    assert!(eventually(Duration::from_secs(5), || kit.eligible_targets().is_empty()).await);
    backends[0].set_delay(Duration::from_millis(700));
    let mut client = TestServiceClient::new(kit.channel());
    let deadline = Duration::from_secs(1);
    let call = tokio::spawn(async move { call_with(&mut client, deadline).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    backends[0].set_serving(true).await;
    let (out, took) = call.await.unwrap();
    let status = out.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(took < deadline + SLACK, "took {took:?}");
    assert!(status.message().contains(&backends[0].uri()), "{status:?}");
    let headers = backends[0].last_request_headers().unwrap();
    let sent = balance_timeout(&headers);
    assert!(
        sent <= Duration::from_millis(520),
        "the backend was given {sent:?} of a deadline 500 ms into a 1 s call"
    );
}

/// The `grpc-timeout` a backend received.
fn balance_timeout(headers: &http::HeaderMap) -> Duration {
    let value = headers.get("grpc-timeout").expect("a grpc-timeout");
    grpc_client_kit::balance::grpc_timeout(value.as_bytes()).expect("a valid grpc-timeout")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_never_waits_past_its_deadline_for_a_half_open_permit() {
    // One target; its breaker's only half-open permit is held by a long stream (its trailers
    // unread). A unary call then either goes through or fails naming the target — by its
    // deadline either way, never waiting for the stream to end.
    let backends = Backends::start(1).await.unwrap();
    let kit = Kit::builder()
        .target(backends[0].uri())
        .without_health()
        .without_quarantine()
        .breaker(
            BreakerConfig::default()
                .consecutive_failures(1)
                .open_base(Duration::from_millis(100))
                .open_jitter(0.0)
                .half_open_permits(1),
        )
        .build()
        .unwrap();
    let breaker = kit.breaker(&backends[0].uri()).unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    backends[0].fail_next(1, Code::Unavailable);
    client.unary(Ping::default()).await.unwrap_err();
    let BreakerState::Open { until } = breaker.state() else {
        panic!("the breaker did not open: {:?}", breaker.state());
    };
    tokio::time::sleep_until(until + Duration::from_millis(10)).await;
    let mut stream = client
        .server_stream(StreamPing { count: 1_000 })
        .await
        .unwrap()
        .into_inner();
    stream.message().await.unwrap().unwrap();
    assert!(
        matches!(breaker.state(), BreakerState::HalfOpen { .. }),
        "the stream is the probe: {:?}",
        breaker.state()
    );
    let deadline = Duration::from_millis(200);
    let mut other = TestServiceClient::new(kit.channel());
    let (out, took) = call_with(&mut other, deadline).await;
    assert!(took < deadline + SLACK, "took {took:?}: {out:?}");
    if let Err(status) = out {
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        assert!(status.message().contains(&backends[0].uri()), "{status:?}");
    }
    while stream.message().await.unwrap().is_some() {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_until_ready_takes_any_timeout() {
    let backends = Backends::start(1).await.unwrap();
    let kit = Kit::builder()
        .targets(backends.uris())
        .health(watch())
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::MAX).await);
}

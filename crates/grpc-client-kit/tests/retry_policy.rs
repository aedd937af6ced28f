//! gRPC's retry policy (gRFC A6) from the service config, against real backends on loopback
//! with injected failures: retryable statuses are retried on another target with a jittered
//! backoff, the server's pushback is honoured, a throttle stops retries after a burst of
//! failures, attempts carry `grpc-previous-rpc-attempts`, and a call is committed once it has
//! response headers or its request cannot be replayed whole.

mod support;

use std::time::Duration;

use grpc_client_kit::Kit;
use test_backends::Backends;
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::{Ping, StreamPing};
use tokio::time::Instant;
use tonic::Code;

type Client = TestServiceClient<grpc_client_kit::KitChannel>;

/// A service config retrying `UNAVAILABLE` on every method of the test service, with `extra`
/// top-level fields (`, "retryThrottling": {...}`).
fn config(max_attempts: u32, initial_backoff: &str, extra: &str) -> String {
    format!(
        r#"{{"methodConfig": [{{
            "name": [{{"service": "gck.test.v1.TestService"}}],
            "retryPolicy": {{
                "maxAttempts": {max_attempts},
                "initialBackoff": "{initial_backoff}",
                "maxBackoff": "1s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"]
            }}
        }}]{extra}}}"#
    )
}

fn kit(backends: &Backends, json: &str) -> Kit {
    Kit::builder()
        .targets(backends.uris())
        .without_health()
        .service_config(json)
        .build()
        .unwrap()
}

/// A unary call, which must end within 10 s: its outcome and how long it took.
async fn unary(client: &mut Client, payload: String) -> (Result<(), tonic::Status>, Duration) {
    let start = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(10), client.unary(Ping { payload }))
        .await
        .expect("the call ended within 10 s");
    (out.map(drop), start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_twice_then_ok_succeeds_on_the_third_attempt_on_another_target() {
    let backends = Backends::start(2).await.unwrap();
    // Whichever is picked first fails, the retry goes to the other, which fails too; the
    // third attempt succeeds.
    backends[0].fail_next(1, Code::Unavailable);
    backends[1].fail_next(1, Code::Unavailable);
    let kit = kit(&backends, &config(3, "0.01s", ""));
    let mut client = TestServiceClient::new(kit.channel());
    let (out, _) = unary(&mut client, String::new()).await;
    assert!(out.is_ok(), "{out:?}");
    assert_eq!(
        backends.total_hits(),
        3,
        "three attempts reached the servers"
    );
    assert!(
        backends[0].hits() >= 1 && backends[1].hits() >= 1,
        "the retry went to the other target: {:?}",
        backends.iter().map(|b| b.hits()).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_carry_grpc_previous_rpc_attempts_and_the_final_status_names_the_targets() {
    let backends = Backends::start(1).await.unwrap();
    backends[0].fail_next(5, Code::Unavailable);
    let kit = kit(&backends, &config(3, "0.001s", ""));
    let mut client = TestServiceClient::new(kit.channel());
    let (out, _) = unary(&mut client, String::new()).await;
    let status = out.expect_err("every attempt failed");
    assert_eq!(status.code(), Code::Unavailable);
    let b0 = &backends.uris()[0];
    assert!(
        status
            .message()
            .ends_with(&format!("(attempts: {b0}, {b0}, {b0})")),
        "{}",
        status.message()
    );
    assert_eq!(backends[0].hits(), 3, "maxAttempts: 3");
    let previous: Vec<Option<String>> = backends[0]
        .recent_request_headers()
        .iter()
        .map(|h| {
            h.get("grpc-previous-rpc-attempts")
                .map(|v| v.to_str().unwrap().to_owned())
        })
        .collect();
    assert_eq!(previous, [None, Some("1".into()), Some("2".into())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_not_in_retryable_status_codes_is_not_retried() {
    let backends = Backends::start(2).await.unwrap();
    backends[0].fail_always(Some(Code::InvalidArgument));
    backends[1].fail_always(Some(Code::InvalidArgument));
    let kit = kit(&backends, &config(5, "0.001s", ""));
    let mut client = TestServiceClient::new(kit.channel());
    let (out, _) = unary(&mut client, String::new()).await;
    assert_eq!(out.unwrap_err().code(), Code::InvalidArgument);
    assert_eq!(backends.total_hits(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushback_delays_the_next_attempt_by_exactly_its_value() {
    let backends = Backends::start(1).await.unwrap();
    let kit = kit(&backends, &config(3, "0.001s", ""));
    let mut client = TestServiceClient::new(kit.channel());
    // Without pushback, the retry comes within the 1 ms backoff.
    backends[0].fail_next(1, Code::Unavailable);
    let (out, quick) = unary(&mut client, String::new()).await;
    assert!(out.is_ok(), "{out:?}");
    assert_eq!(backends[0].hits(), 2);
    // With a pushback of 200 ms, it waits that long.
    backends[0].set_pushback(Some("200"));
    backends[0].fail_next(1, Code::Unavailable);
    let (out, pushed) = unary(&mut client, String::new()).await;
    assert!(out.is_ok(), "{out:?}");
    assert_eq!(backends[0].hits(), 4);
    assert!(
        pushed >= Duration::from_millis(200)
            && pushed < Duration::from_millis(200) + quick * 4 + Duration::from_millis(300),
        "pushed back: {pushed:?} (without: {quick:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_or_malformed_pushback_stops_retrying() {
    let backends = Backends::start(1).await.unwrap();
    let kit = kit(&backends, &config(3, "0.001s", ""));
    let mut client = TestServiceClient::new(kit.channel());
    for (i, pushback) in ["-1", "soon"].into_iter().enumerate() {
        backends[0].set_pushback(Some(pushback));
        backends[0].fail_next(1, Code::Unavailable);
        let (out, _) = unary(&mut client, String::new()).await;
        assert_eq!(out.unwrap_err().code(), Code::Unavailable, "{pushback}");
        assert_eq!(backends[0].hits(), i as u64 + 1, "{pushback}: not retried");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_stops_retries_after_a_burst_of_failures_and_resumes_after_successes() {
    let backends = Backends::start(1).await.unwrap();
    let throttling = r#", "retryThrottling": {"maxTokens": 10, "tokenRatio": 1}"#;
    let kit = kit(&backends, &config(2, "0.001s", throttling));
    let mut client = TestServiceClient::new(kit.channel());
    backends[0].fail_always(Some(Code::Unavailable));
    // 10 tokens, one taken per failed attempt; retries only above 5.
    // Call 1: 10 -> 9, retried, 9 -> 8. Call 2: 8 -> 7, retried, 7 -> 6. Call 3: 6 -> 5, not.
    let mut per_call = Vec::new();
    for _ in 0..4 {
        let before = backends[0].hits();
        let (out, _) = unary(&mut client, String::new()).await;
        assert_eq!(out.unwrap_err().code(), Code::Unavailable);
        per_call.push(backends[0].hits() - before);
    }
    assert_eq!(per_call, [2, 2, 1, 1], "attempts per call");
    // Successes give back a token each (tokenRatio 1): 4 -> 7.
    backends[0].fail_always(None);
    for _ in 0..3 {
        let (out, _) = unary(&mut client, String::new()).await;
        assert!(out.is_ok(), "{out:?}");
    }
    backends[0].fail_always(Some(Code::Unavailable));
    let before = backends[0].hits();
    let (out, _) = unary(&mut client, String::new()).await;
    assert_eq!(out.unwrap_err().code(), Code::Unavailable);
    assert_eq!(backends[0].hits() - before, 2, "retries resumed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_replay_limit_is_not_retried() {
    let backends = Backends::start(1).await.unwrap();
    let kit = kit(&backends, &config(3, "0.001s", ""));
    let mut client = TestServiceClient::new(kit.channel());
    // Within the limit: retried.
    backends[0].fail_next(1, Code::Unavailable);
    let (out, _) = unary(&mut client, "x".repeat(60 * 1024)).await;
    assert!(out.is_ok(), "{out:?}");
    assert_eq!(backends[0].hits(), 2);
    // Over 64 KiB: it cannot be replayed whole, so the first status is the call's.
    backends[0].fail_next(1, Code::Unavailable);
    let (out, _) = unary(&mut client, "x".repeat(70 * 1024)).await;
    assert_eq!(out.unwrap_err().code(), Code::Unavailable);
    assert_eq!(backends[0].hits(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stream_is_committed_once_it_has_response_headers() {
    let backends = Backends::start(1).await.unwrap();
    let kit = kit(&backends, &config(3, "0.001s", ""));
    let mut client = TestServiceClient::new(kit.channel());
    // One message, then UNAVAILABLE in the trailers: too late to retry.
    backends[0].fail_next(1, Code::Unavailable);
    let mut stream = client
        .server_stream(StreamPing { count: 3 })
        .await
        .expect("response headers")
        .into_inner();
    assert!(stream.message().await.unwrap().is_some());
    let status = stream.message().await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(backends[0].hits(), 1, "not retried after headers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_deadline_bounds_every_attempt_and_backoff_together() {
    let backends = Backends::start(1).await.unwrap();
    backends[0].fail_always(Some(Code::Unavailable));
    // Backoffs of up to 0.2, 0.4, 0.8, 1 s: five attempts would outlive the deadline.
    let kit = kit(&backends, &config(5, "0.2s", ""));
    let mut client = TestServiceClient::new(kit.channel());
    let mut request = tonic::Request::new(Ping::default());
    request.set_timeout(Duration::from_millis(300));
    let start = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(10), client.unary(request))
        .await
        .expect("ended");
    let took = start.elapsed();
    let code = out.unwrap_err().code();
    assert!(
        matches!(code, Code::Unavailable | Code::DeadlineExceeded),
        "{code:?}"
    );
    assert!(took < Duration::from_millis(300 + 250), "{took:?}");
}

// ----- hedging -----

/// A service config hedging every method of the test service.
fn hedging(max_attempts: u32, delay: &str, non_fatal: &str) -> String {
    format!(
        r#"{{"methodConfig": [{{
            "name": [{{"service": "gck.test.v1.TestService"}}],
            "hedgingPolicy": {{
                "maxAttempts": {max_attempts},
                "hedgingDelay": "{delay}",
                "nonFatalStatusCodes": [{non_fatal}]
            }}
        }}]}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedging_returns_the_fast_answer_and_cancels_the_slow_attempt() {
    let backends = Backends::start(2).await.unwrap();
    let (slow, fast) = (&backends[0], &backends[1]);
    slow.set_delay(Duration::from_secs(3));
    let kit = kit(&backends, &hedging(2, "0.05s", ""));
    let mut client = TestServiceClient::new(kit.channel());
    for i in 0..4 {
        let (out, took) = unary(&mut client, String::new()).await;
        assert!(out.is_ok(), "call {i}: {out:?}");
        assert!(took < Duration::from_secs(1), "call {i} took {took:?}");
    }
    // Round robin sent some first attempts to the slow backend; each was hedged to the fast
    // one after 50 ms, which answered, and the slow attempt was cancelled.
    assert_eq!(
        fast.hits(),
        4,
        "every call was answered by the fast backend"
    );
    assert!(
        support::eventually(Duration::from_secs(2), || slow.cancelled() == slow.hits()).await,
        "slow: {} hits, {} cancelled",
        slow.hits(),
        slow.cancelled()
    );
    // The hedged attempts said so; the first attempts did not: every call whose first attempt
    // went to the slow backend was hedged to the fast one.
    let previous = |b: &test_backends::Backend| -> Vec<Option<String>> {
        b.recent_request_headers()
            .iter()
            .map(|h| {
                h.get("grpc-previous-rpc-attempts")
                    .map(|v| v.to_str().unwrap().to_owned())
            })
            .collect()
    };
    let (on_fast, on_slow) = (previous(fast), previous(slow));
    let hedged_to_fast = on_fast.iter().filter(|p| p.as_deref() == Some("1")).count();
    let first_on_slow = on_slow.iter().filter(|p| p.is_none()).count();
    assert!(
        first_on_slow >= 1,
        "round robin sent first attempts to the slow backend"
    );
    assert_eq!(hedged_to_fast, first_on_slow, "{on_fast:?} {on_slow:?}");
    // A cancelled attempt counts against nobody: the slow backend is still eligible.
    assert_eq!(kit.eligible_targets().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hedge_goes_to_a_target_no_earlier_attempt_of_the_call_went_to() {
    // Two slow targets and a fast one; random picks (round robin walks the targets in order,
    // which would hide a hedge going back to the first attempt's target).
    let backends = Backends::start(3).await.unwrap();
    backends[0].set_delay(Duration::from_secs(3));
    backends[1].set_delay(Duration::from_secs(3));
    let kit = Kit::builder()
        .targets(backends.uris())
        .without_health()
        .strategy(grpc_client_kit::balance::Strategy::Random)
        .service_config(hedging(3, "0.03s", ""))
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    const CALLS: usize = 12;
    for i in 0..CALLS {
        let mut request = tonic::Request::new(Ping::default());
        request
            .metadata_mut()
            .insert("x-call", i.to_string().parse().unwrap());
        let out = tokio::time::timeout(Duration::from_secs(10), client.unary(request))
            .await
            .expect("the call ended within 10 s");
        assert!(out.is_ok(), "call {i}: {out:?}");
    }
    // Each call reached the fast target once, and no target twice: with three attempts and
    // three targets, a call whose first two attempts went to the slow ones sent its third to
    // the fast one.
    let calls = |b: &test_backends::Backend| -> Vec<String> {
        b.recent_request_headers()
            .iter()
            .map(|h| h["x-call"].to_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        backends[2].hits(),
        CALLS as u64,
        "{:?}",
        calls(&backends[2])
    );
    for (i, b) in backends.iter().enumerate() {
        let mut seen = calls(b);
        let all = seen.len();
        seen.sort();
        seen.dedup();
        assert_eq!(
            seen.len(),
            all,
            "backend {i} saw a call twice: {:?}",
            calls(b)
        );
    }
    assert!(
        backends[0].hits() + backends[1].hits() >= 2,
        "some calls started on a slow target"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_status_ends_hedging_at_once_with_that_status() {
    let backends = Backends::start(2).await.unwrap();
    backends[0].set_delay(Duration::from_secs(3));
    backends[1].fail_always(Some(Code::InvalidArgument));
    let kit = kit(&backends, &hedging(2, "0.05s", r#""UNAVAILABLE""#));
    let mut client = TestServiceClient::new(kit.channel());
    for i in 0..2 {
        let (out, took) = unary(&mut client, String::new()).await;
        assert_eq!(out.unwrap_err().code(), Code::InvalidArgument, "call {i}");
        assert!(took < Duration::from_secs(1), "call {i} took {took:?}");
    }
    assert!(
        support::eventually(Duration::from_secs(2), || backends[0].cancelled()
            == backends[0].hits())
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_fatal_status_sends_the_next_hedge_at_once() {
    let backends = Backends::start(2).await.unwrap();
    backends[0].fail_always(Some(Code::Unavailable));
    // A hedging delay far longer than the test: only a non-fatal failure sends the next.
    let kit = kit(&backends, &hedging(3, "30s", r#""UNAVAILABLE""#));
    let mut client = TestServiceClient::new(kit.channel());
    for i in 0..4 {
        let (out, took) = unary(&mut client, String::new()).await;
        assert!(out.is_ok(), "call {i}: {out:?}");
        assert!(took < Duration::from_secs(1), "call {i} took {took:?}");
    }
    assert_eq!(backends[1].hits(), 4);
    // Every backend failing: the call ends with the last status, naming the targets.
    backends[1].fail_always(Some(Code::Unavailable));
    let (out, took) = unary(&mut client, String::new()).await;
    let status = out.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status.message().contains("(attempts: "),
        "{}",
        status.message()
    );
    assert!(took < Duration::from_secs(1), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedged_call_ends_by_its_deadline() {
    let backends = Backends::start(2).await.unwrap();
    backends[0].set_delay(Duration::from_secs(3));
    backends[1].set_delay(Duration::from_secs(3));
    let kit = kit(&backends, &hedging(3, "0.05s", ""));
    let mut client = TestServiceClient::new(kit.channel());
    let mut request = tonic::Request::new(Ping::default());
    request.set_timeout(Duration::from_millis(300));
    let start = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(10), client.unary(request))
        .await
        .expect("ended");
    assert_eq!(out.unwrap_err().code(), Code::DeadlineExceeded);
    assert!(start.elapsed() < Duration::from_millis(300 + 250));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stream_not_ready_at_once_is_sent_once_unhedged() {
    // `UNIMPLEMENTED` (the test backends' answer to `Upload`) is non-fatal here: a hedged call
    // that meets it sends its next attempt at once, so every attempt shows as a hit.
    let backends = Backends::start(2).await.unwrap();
    let kit = kit(&backends, &hedging(3, "0.01s", r#""UNIMPLEMENTED""#));
    let upload_hits = || {
        backends
            .iter()
            .map(|b| b.hits_for(test_backends::UPLOAD_PATH))
            .sum::<u64>()
    };
    // A client stream whose messages are all there at the call: read whole, kept, hedged.
    let pings = futures_util::stream::iter(vec![Ping::default(); 3]);
    let status = test_backends::upload(kit.channel(), tonic::Request::new(pings))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    assert_eq!(upload_hits(), 3, "a stream ready at once is hedged");
    // A client stream whose first message comes later (its caller may be waiting for the
    // answer before it sends more): sent once, as it comes.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Ping>(1);
    let pings = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let producer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = tx.send(Ping::default()).await;
    });
    let status = tokio::time::timeout(
        Duration::from_secs(10),
        test_backends::upload(kit.channel(), tonic::Request::new(pings)),
    )
    .await
    .expect("the call ended within 10 s")
    .unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    assert_eq!(upload_hits(), 4, "a stream not ready at once is sent once");
    producer.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_replay_limit_is_sent_once_unhedged() {
    let backends = Backends::start(2).await.unwrap();
    backends[0].set_delay(Duration::from_millis(300));
    let kit = kit(&backends, &hedging(2, "0.02s", ""));
    let mut client = TestServiceClient::new(kit.channel());
    // Round robin: one of the two calls starts on the slow backend.
    let mut took = Vec::new();
    for i in 0..2 {
        let (out, t) = unary(&mut client, "x".repeat(70 * 1024)).await;
        assert!(out.is_ok(), "call {i}: {out:?}");
        took.push(t);
    }
    assert_eq!(backends.total_hits(), 2, "one attempt per call");
    assert!(
        took.iter().any(|t| *t >= Duration::from_millis(300)),
        "the call on the slow backend was not hedged: {took:?}"
    );
    // Within the limit, the same calls are hedged: none waits for the slow backend.
    for _ in 0..2 {
        let (out, t) = unary(&mut client, "x".repeat(1024)).await;
        assert!(out.is_ok(), "{out:?}");
        assert!(t < Duration::from_millis(300), "{t:?}");
    }
    assert!(
        backends[0].hits() >= 2,
        "a small call started on the slow backend"
    );
    assert!(backends.total_hits() >= 5, "and was hedged");
}

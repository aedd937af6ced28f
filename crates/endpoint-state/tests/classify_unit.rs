//! Classification edge cases that a real server rarely produces on demand: HTTP statuses
//! without `grpc-status`, a body that ends without one, exactly-once reporting, and the
//! mapping of error chains.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use endpoint_state::{
    CallStatus, ClassifiedBody, FailureCodes, Outcome, OutcomeSource, ResponseFuture, Verdict,
};
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use test_backends::synthetic::{Reply, trailers, trailers_only};
use tonic::Code;

type Seen = Arc<Mutex<Vec<Outcome>>>;

fn listener(seen: &Seen) -> impl FnOnce(Outcome) + Send + Clone + 'static {
    let seen = seen.clone();
    // A failed assertion must not poison the record for the listener of a body dropped later.
    move |o| seen.lock().unwrap_or_else(|p| p.into_inner()).push(o)
}

#[tokio::test]
async fn http_status_without_grpc_status_is_mapped() {
    for (http, code) in [
        (StatusCode::SERVICE_UNAVAILABLE, Code::Unavailable),
        (StatusCode::BAD_GATEWAY, Code::Unavailable),
        (StatusCode::NOT_FOUND, Code::Unimplemented),
        (StatusCode::UNAUTHORIZED, Code::Unauthenticated),
        (StatusCode::IM_A_TEAPOT, Code::Unknown),
    ] {
        let seen = Seen::default();
        let resp = Response::builder()
            .status(http)
            .body(Reply::empty())
            .unwrap();
        let fut = ResponseFuture::new(async { Ok::<_, Infallible>(resp) }, Some(listener(&seen)));
        let body = fut.await.unwrap().into_body();
        drop(body.collect().await);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "{http}: reported once");
        let status = seen[0].status().unwrap();
        assert_eq!(
            (status.code, status.source),
            (code, OutcomeSource::HttpStatus),
            "{http}"
        );
    }
}

#[tokio::test]
async fn a_body_that_ends_without_a_status_is_unknown() {
    let seen = Seen::default();
    let body = ClassifiedBody::new(Reply::messages(1), Some(listener(&seen)));
    drop(body.collect().await);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].status().unwrap().code, Code::Unknown);
    assert_eq!(
        seen[0].status().unwrap().source,
        OutcomeSource::MissingStatus
    );
}

#[tokio::test]
async fn reported_exactly_once_even_when_polled_past_the_end_and_dropped() {
    let seen = Seen::default();
    let mut body = ClassifiedBody::new(
        Reply::new(trailers(Code::Internal, Some("boom%21")), 1),
        Some(listener(&seen)),
    );
    while body.frame().await.is_some() {}
    assert!(body.frame().await.is_none());
    drop(body);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let s = seen[0].status().unwrap();
    assert_eq!((s.code, s.message.as_str()), (Code::Internal, "boom!"));
    assert_eq!(s.to_string(), "INTERNAL: boom!");
}

#[tokio::test]
async fn trailers_only_is_reported_at_the_headers_and_not_again() {
    let seen = Seen::default();
    let resp = trailers_only(Code::Unavailable, Some("going away"));
    let fut = ResponseFuture::new(async { Ok::<_, Infallible>(resp) }, Some(listener(&seen)));
    let body = fut.await.unwrap().into_body();
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "known before the body is read"
    );
    drop(body); // dropping the body now is not an abandonment: the outcome is known
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].status().unwrap().source, OutcomeSource::Headers);
    assert_eq!(seen[0].status().unwrap().code, Code::Unavailable);
}

#[test]
fn error_chains() {
    // tonic's own local timeout arrives as CANCELLED, caused by its `TimeoutExpired`.
    let timeout = tonic::Status::from_error(Box::new(tonic::TimeoutExpired(())));
    let s = CallStatus::from_error(&timeout);
    assert_eq!(s.code, Code::DeadlineExceeded);
    // A cancellation for another reason stays CANCELLED.
    let s = CallStatus::from_error(&tonic::Status::cancelled("client went away"));
    assert_eq!(s.code, Code::Cancelled);
    // tower's timeout.
    let s = CallStatus::from_error(&tower::timeout::error::Elapsed::new());
    assert_eq!(s.code, Code::DeadlineExceeded);
    // Anything else below the codec is transport: UNAVAILABLE, with the chain in words.
    let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
    let s = CallStatus::from_error(&io);
    assert_eq!(s.code, Code::Unavailable);
    assert_eq!(s.to_string(), "UNAVAILABLE: connection refused");
}

#[test]
fn failure_code_sets() {
    let q = FailureCodes::quarantine_default();
    let b = FailureCodes::breaker_default();
    let done = |code| Outcome::Completed(CallStatus::new(code, OutcomeSource::Trailers));
    assert_eq!(q.classify(&done(Code::Unavailable)), Verdict::Failure);
    assert_eq!(q.classify(&done(Code::DeadlineExceeded)), Verdict::Failure);
    assert_eq!(q.classify(&done(Code::Internal)), Verdict::Success);
    assert_eq!(b.classify(&done(Code::Internal)), Verdict::Failure);
    for client_error in [
        Code::InvalidArgument,
        Code::NotFound,
        Code::PermissionDenied,
        Code::AlreadyExists,
        Code::FailedPrecondition,
        Code::Ok,
    ] {
        assert_eq!(
            b.classify(&done(client_error)),
            Verdict::Success,
            "{client_error:?}"
        );
    }
    assert_eq!(b.classify(&Outcome::Abandoned), Verdict::Ignored);
    let custom = FailureCodes::from_codes([Code::Aborted]);
    assert_eq!(custom.classify(&done(Code::Aborted)), Verdict::Failure);
    assert_eq!(custom.classify(&done(Code::Unavailable)), Verdict::Success);
    assert_eq!(
        format!("{b:?}"),
        "{\"UNKNOWN\", \"DEADLINE_EXCEEDED\", \"RESOURCE_EXHAUSTED\", \"INTERNAL\", \"UNAVAILABLE\", \"DATA_LOSS\"}"
    );
}

#[test]
fn a_call_the_server_did_not_process_counts_neither_way() {
    use endpoint_state::{FailureCodes, NotProcessed, Outcome, Verdict};
    let refused = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "refused stream");
    let marked: endpoint_state::classify::BoxError = Box::new(NotProcessed::new(refused));
    let outcome = Outcome::from_error(&*marked);
    assert!(matches!(outcome, Outcome::NotProcessed(_)), "{outcome:?}");
    assert_eq!(outcome.status().unwrap().code, tonic::Code::Unavailable);
    for codes in [
        FailureCodes::quarantine_default(),
        FailureCodes::breaker_default(),
    ] {
        assert_eq!(codes.classify(&outcome), Verdict::Ignored);
    }
    // The mark keeps the original error in the chain, for whoever looks for it.
    let source = std::error::Error::source(&*marked).unwrap();
    assert!(source.downcast_ref::<std::io::Error>().is_some());
    // Unmarked, the same error is a failure.
    let plain = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
    let outcome = Outcome::from_error(&plain);
    assert_eq!(
        FailureCodes::quarantine_default().classify(&outcome),
        Verdict::Failure
    );
}

// ----- responses that are not gRPC, and frames the client cannot decode -----

/// An HTML page, as a proxy answers with `200 OK` when the backend behind it is gone.
fn html_page() -> Response<http_body_util::Full<bytes::Bytes>> {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/html; charset=utf-8")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            b"<html><body>502 Bad Gateway</body></html>",
        )))
        .unwrap()
}

#[tokio::test]
async fn an_html_page_from_a_proxy_is_a_failure_known_at_the_headers() {
    let seen = Seen::default();
    let resp = html_page();
    let fut = ResponseFuture::new(async { Ok::<_, Infallible>(resp) }, Some(listener(&seen)));
    let body = fut.await.unwrap().into_body();
    assert_eq!(seen.lock().unwrap().len(), 1, "judged at the headers");
    // tonic's client gives up on such a body and drops it: that is no abandonment.
    drop(body);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    let status = seen[0].status().expect("a failure, not an abandoned call");
    assert!(matches!(seen[0], Outcome::Completed(_)), "{:?}", seen[0]);
    assert_eq!(
        status.code,
        Code::Unknown,
        "HTTP 200 without gRPC: UNKNOWN, as gRPC maps it"
    );
    assert!(status.message.contains("text/html"), "{status}");
    assert_eq!(status.source, OutcomeSource::NotGrpc);
    assert_eq!(
        FailureCodes::breaker_default().classify(&seen[0]),
        Verdict::Failure
    );
}

#[tokio::test]
async fn grpc_content_types_are_grpc() {
    for content_type in [
        "application/grpc",
        "application/grpc+proto",
        "application/grpc;x=1",
    ] {
        let seen = Seen::default();
        let mut resp = test_backends::synthetic::reply(Code::Ok, None);
        resp.headers_mut()
            .insert("content-type", content_type.parse().unwrap());
        let fut = ResponseFuture::new(async { Ok::<_, Infallible>(resp) }, Some(listener(&seen)));
        let body = fut.await.unwrap().into_body();
        assert!(
            seen.lock().unwrap().is_empty(),
            "{content_type}: the status is to come"
        );
        drop(body.collect().await);
        let seen = seen.lock().unwrap();
        assert_eq!(seen[0].status().unwrap().code, Code::Ok, "{content_type}");
    }
}

/// A response that says gRPC, whose body starts with `data`, and then never ends.
fn grpc_reply_with(data: &'static [u8]) -> Response<DataThenHang> {
    Response::builder()
        .header("content-type", "application/grpc")
        .body(DataThenHang(Some(bytes::Bytes::from_static(data))))
        .unwrap()
}

/// One data frame, then nothing (pending) for ever.
struct DataThenHang(Option<bytes::Bytes>);

impl http_body::Body for DataThenHang {
    type Data = bytes::Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Infallible>>> {
        match self.0.take() {
            Some(data) => std::task::Poll::Ready(Some(Ok(http_body::Frame::data(data)))),
            None => std::task::Poll::Pending,
        }
    }
}

/// Reads the first frame of a classified reply, then drops the body (as tonic does when it
/// cannot decode a message, and as a caller does when it gives up): the outcome reported.
async fn first_frame_then_drop(resp: Response<DataThenHang>) -> Outcome {
    let seen = Seen::default();
    let fut = ResponseFuture::new(async { Ok::<_, Infallible>(resp) }, Some(listener(&seen)));
    let mut body = fut.await.unwrap().into_body();
    assert!(body.frame().await.unwrap().unwrap().is_data());
    drop(body);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    seen[0].clone()
}

#[tokio::test]
async fn a_frame_the_client_cannot_decode_is_a_failure_when_the_body_is_dropped() {
    // The first byte of a gRPC message is its compression flag: 0 or 1, nothing else.
    let outcome = first_frame_then_drop(grpc_reply_with(b"\x7fnot a grpc frame")).await;
    let status = outcome.status().expect("a failure, not an abandoned call");
    assert_eq!(status.code, Code::Internal, "as tonic reports it: {status}");
    assert_eq!(status.source, OutcomeSource::Malformed);
    assert_eq!(
        status.to_string(),
        "INTERNAL: malformed gRPC message: compression flag 0x7f (valid flags are 0 and 1): \
         not a gRPC message"
    );
    assert_eq!(
        FailureCodes::breaker_default().classify(&outcome),
        Verdict::Failure
    );
    // A compressed message without a `grpc-encoding` cannot be decoded either.
    let outcome = first_frame_then_drop(grpc_reply_with(b"\x01\0\0\0\x02hi")).await;
    assert_eq!(outcome.status().map(|s| s.code), Some(Code::Internal));
    // The second message of a stream is read as carefully as the first.
    let outcome = first_frame_then_drop(grpc_reply_with(b"\0\0\0\0\x05hello\x09\0\0\0\x01x")).await;
    assert_eq!(outcome.status().map(|s| s.code), Some(Code::Internal));
}

#[tokio::test]
async fn a_well_formed_reply_dropped_midway_is_still_abandoned() {
    // Whole messages, or one cut in the middle: the caller may simply have stopped reading.
    for data in [
        &b"\0\0\0\0\x05hello"[..],
        &b"\0\0\0\0\x05hel"[..],
        &b"\0\0\0"[..],
        &b"\0\0\0\0\x05hello\0\0\0\0\x01x"[..],
    ] {
        let outcome = first_frame_then_drop(grpc_reply_with(data)).await;
        assert_eq!(outcome, Outcome::Abandoned, "{data:?}");
    }
    // A compressed message with its encoding named is well formed.
    let mut resp = grpc_reply_with(b"\x01\0\0\0\x02hi");
    resp.headers_mut()
        .insert("grpc-encoding", "gzip".parse().unwrap());
    assert_eq!(first_frame_then_drop(resp).await, Outcome::Abandoned);
}

#[tokio::test]
async fn tonic_s_own_client_fails_an_html_page_and_the_target_is_charged() {
    use test_backends::pb::Ping;
    use test_backends::pb::test_service_client::TestServiceClient;
    let seen = Seen::default();
    let proxy = tower::service_fn(|_req: http::Request<tonic::body::Body>| async {
        Ok::<_, Infallible>(html_page())
    });
    let classified = endpoint_state::Classify::new(proxy, listener(&seen));
    let mut client = TestServiceClient::new(classified);
    let err = client.unary(Ping::default()).await.unwrap_err();
    // What the caller sees is tonic's: INTERNAL (the first byte, `<`, is no compression flag).
    assert_eq!(err.code(), Code::Internal, "{err}");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(matches!(seen[0], Outcome::Completed(_)), "{:?}", seen[0]);
    assert_eq!(
        FailureCodes::breaker_default().classify(&seen[0]),
        Verdict::Failure
    );
}

#[test]
fn only_the_client_s_own_timeout_becomes_deadline_exceeded() {
    // tonic's local timeout: a CANCELLED status whose source is tonic's `TimeoutExpired`.
    let local = tonic::Status::from_error(Box::new(tonic::TimeoutExpired(())));
    assert_eq!(
        local.code(),
        Code::Cancelled,
        "tonic reports its timeout as CANCELLED"
    );
    assert_eq!(CallStatus::from_error(&local).code, Code::DeadlineExceeded);
    // The bare error, below tonic's conversion.
    assert_eq!(
        CallStatus::from_error(&tonic::TimeoutExpired(())).code,
        Code::DeadlineExceeded
    );
    // A server's own CANCELLED stays CANCELLED, whatever its message says.
    let server = tonic::Status::cancelled("Timeout expired");
    assert_eq!(CallStatus::from_error(&server).code, Code::Cancelled);
    let mut headers = http::HeaderMap::new();
    headers.insert("grpc-status", "1".parse().unwrap());
    headers.insert("grpc-message", "Timeout expired".parse().unwrap());
    let from_trailers = CallStatus::from_headers(&headers, OutcomeSource::Trailers).unwrap();
    assert_eq!(from_trailers.code, Code::Cancelled);
}

/// The outcome of a gRPC reply whose body is `<html>` and then `trailers`, read to its end.
async fn html_then(trailers: http::HeaderMap) -> Outcome {
    let seen = Seen::default();
    let resp = Response::builder()
        .header("content-type", "application/grpc")
        .body(http_body_util::StreamBody::new(futures_util::stream::iter(
            [
                Ok::<_, Infallible>(http_body::Frame::data(bytes::Bytes::from_static(b"<html>"))),
                Ok(http_body::Frame::trailers(trailers)),
            ],
        )))
        .unwrap();
    let fut = ResponseFuture::new(async { Ok::<_, Infallible>(resp) }, Some(listener(&seen)));
    let body = fut.await.unwrap().into_body();
    drop(body.collect().await);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    seen[0].clone()
}

#[tokio::test]
async fn a_status_in_the_trailers_after_malformed_data_says_which_failure() {
    // Malformed data, then the server's own error: its error is the outcome.
    let outcome = html_then(trailers(Code::Unavailable, Some("going away"))).await;
    let status = outcome.status().unwrap();
    assert_eq!(
        (status.code, status.source),
        (Code::Unavailable, OutcomeSource::Trailers)
    );
    // Malformed data, then `OK`: the client could not read it, so it did not succeed.
    let outcome = html_then(trailers(Code::Ok, None)).await;
    let status = outcome.status().unwrap();
    assert_eq!(
        (status.code, status.source),
        (Code::Internal, OutcomeSource::Malformed)
    );
}

fn answer(status: u16, content_type: Option<&str>) -> Response<()> {
    let mut builder = Response::builder().status(status);
    if let Some(ct) = content_type {
        builder = builder.header("content-type", ct);
    }
    builder.body(()).unwrap()
}

#[test]
fn one_rule_tells_a_response_that_is_not_grpc() {
    // gRPC: its content type, with or without a subtype; no content type at all (as tonic).
    for ct in [
        Some("application/grpc"),
        Some("application/grpc+proto"),
        None,
    ] {
        assert_eq!(
            CallStatus::of_non_grpc_response(&answer(200, ct)),
            None,
            "{ct:?}"
        );
    }
    // A trailers-only answer is gRPC whatever else it says.
    let mut trailers_only = answer(200, Some("text/html"));
    trailers_only
        .headers_mut()
        .insert("grpc-status", http::HeaderValue::from_static("14"));
    assert_eq!(CallStatus::of_non_grpc_response(&trailers_only), None);

    let page = CallStatus::of_non_grpc_response(&answer(200, Some("text/html"))).unwrap();
    assert_eq!(
        (page.code, page.source),
        (Code::Unknown, OutcomeSource::NotGrpc)
    );
    let proxy = CallStatus::of_non_grpc_response(&answer(503, Some("text/plain"))).unwrap();
    assert_eq!(
        (proxy.code, proxy.source),
        (Code::Unavailable, OutcomeSource::NotGrpc)
    );
    let bare = CallStatus::of_non_grpc_response(&answer(404, Some("application/grpc"))).unwrap();
    assert_eq!(
        (bare.code, bare.source),
        (Code::Unimplemented, OutcomeSource::HttpStatus)
    );

    // The error a transport fails the call with carries the same judgement.
    let err =
        endpoint_state::NotGrpcResponse::check("http://b0:1", &answer(503, Some("text/plain")))
            .unwrap();
    let wrapped: Box<dyn std::error::Error + Send + Sync> = Box::new(err);
    assert_eq!(CallStatus::from_error(&*wrapped), proxy);
}

#[test]
fn a_reply_that_is_not_grpc_fails_under_every_set_but_none() {
    let page = Outcome::Completed(CallStatus::not_grpc(StatusCode::OK, b"text/html"));
    let garbled = Outcome::Completed(CallStatus::malformed("compression flag 7"));
    for outcome in [&page, &garbled] {
        for set in [
            FailureCodes::quarantine_default(),
            FailureCodes::breaker_default(),
            FailureCodes::from_codes([Code::DataLoss]),
        ] {
            assert_eq!(
                set.classify(outcome),
                Verdict::Failure,
                "{set:?} {outcome:?}"
            );
        }
        assert_eq!(FailureCodes::NONE.classify(outcome), Verdict::Success);
    }
    // A gRPC UNKNOWN stays a success for a set without it.
    let unknown = Outcome::Completed(CallStatus::new(Code::Unknown, OutcomeSource::Trailers));
    assert_eq!(
        FailureCodes::quarantine_default().classify(&unknown),
        Verdict::Success
    );
}

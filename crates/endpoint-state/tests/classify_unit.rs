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
    move |o| seen.lock().unwrap().push(o)
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
    // tonic's own local timeout arrives as CANCELLED "Timeout expired".
    let s = CallStatus::from_error(&tonic::Status::cancelled("Timeout expired"));
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

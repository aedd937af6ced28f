//! The classifying response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;

use super::body::ClassifiedBody;
use super::frames::Frames;
use super::outcome::{OnOutcome, Outcome, Reporter};
use super::status::{CallStatus, OutcomeSource};
use crate::error::BoxError;

pin_project! {
    /// Wraps a service's response future: classifies an `Err` and the response headers, and
    /// hands the body to a [`ClassifiedBody`] when the status is still to come in the trailers.
    ///
    /// The headers decide when they carry `grpc-status` (a trailers-only response), an HTTP
    /// status other than 200 (mapped as gRPC specifies), or a `content-type` that is not
    /// gRPC's ([`OutcomeSource::NotGrpc`]: an HTML page from a proxy is a failure of its
    /// target, `UNKNOWN` as gRPC's clients map a `200` that is not gRPC). A response with no
    /// `content-type` at all is read on (tonic's client does not require one).
    ///
    /// Dropping it before it completes reports [`Outcome::Abandoned`].
    pub struct ResponseFuture<F, O: OnOutcome> {
        #[pin]
        inner: F,
        reporter: Option<Reporter<O>>,
    }
}

impl<F, O: OnOutcome> fmt::Debug for ResponseFuture<F, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("reporter", &self.reporter)
            .finish_non_exhaustive()
    }
}

impl<F, O: OnOutcome> ResponseFuture<F, O> {
    /// Classify `inner`'s outcome for `on_outcome`; `None` listens to nothing and costs
    /// nothing beyond a pass-through.
    pub fn new(inner: F, on_outcome: Option<O>) -> Self {
        ResponseFuture {
            inner,
            reporter: Some(Reporter::new(on_outcome)),
        }
    }
}

impl<F, B, E, O> Future for ResponseFuture<F, O>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    O: OnOutcome,
{
    type Output = Result<Response<ClassifiedBody<B, O>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        let mut reporter = this
            .reporter
            .take()
            .expect("ResponseFuture polled after completion");
        match result {
            Err(e) => {
                let e = e.into();
                reporter.report(|| Outcome::from_error(&*e));
                Poll::Ready(Err(e))
            }
            Ok(response) => {
                if reporter.is_listening()
                    && let Some(status) = judge_headers(&response)
                {
                    reporter.report(|| Outcome::Completed(status));
                }
                let compressed_ok = response
                    .headers()
                    .get(&GRPC_ENCODING)
                    .is_some_and(|e| e.as_bytes() != b"identity");
                Poll::Ready(Ok(response.map(|body| {
                    ClassifiedBody::with_frames(body, reporter, Frames::new(compressed_ok))
                })))
            }
        }
    }
}

/// `grpc-encoding`, as a ready header name.
static GRPC_ENCODING: http::HeaderName = http::HeaderName::from_static("grpc-encoding");

/// The call's status when the response headers already say it: `grpc-status` (trailers-only),
/// or a response that is not gRPC at all.
fn judge_headers<B>(response: &Response<B>) -> Option<CallStatus> {
    CallStatus::from_headers(response.headers(), OutcomeSource::Headers)
        .or_else(|| CallStatus::of_non_grpc_response(response))
}

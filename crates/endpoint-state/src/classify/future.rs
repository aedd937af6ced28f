//! The classifying response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;

use super::body::ClassifiedBody;
use super::outcome::{OnOutcome, Outcome, Reporter};
use super::status::{CallStatus, OutcomeSource};
use crate::error::BoxError;

pin_project! {
    /// Wraps a service's response future: classifies an `Err` and the response headers, and
    /// hands the body to a [`ClassifiedBody`] when the status is still to come in the trailers.
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
            reporter: Some(Reporter(on_outcome)),
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
                if reporter.is_listening() {
                    let in_headers =
                        CallStatus::from_headers(response.headers(), OutcomeSource::Headers)
                            .or_else(|| {
                                (response.status() != http::StatusCode::OK)
                                    .then(|| CallStatus::from_http_status(response.status()))
                            });
                    if let Some(status) = in_headers {
                        reporter.report(|| Outcome::Completed(status));
                    }
                }
                Poll::Ready(Ok(response.map(|body| ClassifiedBody {
                    inner: body,
                    reporter,
                })))
            }
        }
    }
}

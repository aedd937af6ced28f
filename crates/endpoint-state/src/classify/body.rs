//! The classifying response body: the status in the trailers, or the body's end without one.

use std::error::Error;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::outcome::{OnOutcome, Outcome, Reporter};
use super::status::{CallStatus, OutcomeSource, missing_status};

pin_project! {
    /// A response body that reports the call's final status — from its trailers, a body error,
    /// or its end without a status — exactly once; dropped before that, it reports
    /// [`Outcome::Abandoned`]. With no listener it is a plain pass-through.
    pub struct ClassifiedBody<B, O: OnOutcome> {
        #[pin]
        pub(super) inner: B,
        pub(super) reporter: Reporter<O>,
    }
}

impl<B, O: OnOutcome> fmt::Debug for ClassifiedBody<B, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClassifiedBody")
            .field("reporter", &self.reporter)
            .finish_non_exhaustive()
    }
}

impl<B, O: OnOutcome> ClassifiedBody<B, O> {
    /// Wrap a body whose response headers carried no final status.
    pub fn new(inner: B, on_outcome: Option<O>) -> Self {
        ClassifiedBody {
            inner,
            reporter: Reporter(on_outcome),
        }
    }

    /// The wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// The wrapped body, mutably.
    pub fn get_mut(&mut self) -> &mut B {
        &mut self.inner
    }
}

impl<B, O> Body for ClassifiedBody<B, O>
where
    B: Body,
    B::Error: Error + 'static,
    O: OnOutcome,
{
    type Data = B::Data;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        if !this.reporter.is_listening() {
            // Nobody listens (or the outcome is known): a plain tail call, nothing copied.
            return this.inner.poll_frame(cx);
        }
        let frame = ready!(this.inner.poll_frame(cx));
        {
            match &frame {
                Some(Ok(f)) => {
                    if let Some(trailers) = f.trailers_ref() {
                        this.reporter.report(|| {
                            Outcome::Completed(
                                CallStatus::from_headers(trailers, OutcomeSource::Trailers)
                                    .unwrap_or_else(missing_status),
                            )
                        });
                    }
                }
                Some(Err(e)) => this.reporter.report(|| {
                    let mut status = CallStatus::from_error(e);
                    status.source = OutcomeSource::BodyError;
                    Outcome::Completed(status)
                }),
                None => this
                    .reporter
                    .report(|| Outcome::Completed(missing_status())),
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

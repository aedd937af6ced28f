//! The classifying response body: the status in the trailers, or the body's end without one;
//! and, dropped before either, whether what it carried could be decoded at all.

use std::error::Error;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::frames::Frames;
use super::outcome::{OnOutcome, Outcome, Reporter};
use super::status::{CallStatus, OutcomeSource, missing_status};

pin_project! {
    /// A response body that reports the call's final status — from its trailers, a body error,
    /// or its end without a status — exactly once; dropped before that, it reports
    /// [`Outcome::Abandoned`]. With no listener it is a plain pass-through.
    ///
    /// While it listens it also reads the 5-byte prefix of each gRPC message that passes
    /// (nothing is copied): data no client can decode (a compression flag other than 0 and 1,
    /// a compressed message with no `grpc-encoding`) ends the call as a failure — `INTERNAL`,
    /// as tonic's decoder reports it, [`OutcomeSource::Malformed`] — even when the client then
    /// drops the body (as tonic does) rather than reading on. Data that is well formed and
    /// dropped before its status is still abandoned: a caller may stop reading any time.
    pub struct ClassifiedBody<B, O: OnOutcome> {
        #[pin]
        pub(super) inner: B,
        pub(super) reporter: Reporter<O>,
        pub(super) frames: Frames,
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
    /// Wrap a body whose response headers carried no final status (and are not known here:
    /// a compressed message is taken to have its `grpc-encoding`).
    pub fn new(inner: B, on_outcome: Option<O>) -> Self {
        ClassifiedBody::with_frames(inner, Reporter::new(on_outcome), Frames::new(true))
    }

    pub(super) fn with_frames(inner: B, reporter: Reporter<O>, frames: Frames) -> Self {
        ClassifiedBody {
            inner,
            reporter,
            frames,
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
        // Once the data is known to be malformed, that is how the call ends — unless a status
        // says it failed for a reason of its own.
        let malformed = |status: CallStatus, reporter: &Reporter<O>| match reporter.drop_status() {
            Some(bad)
                if status.code == tonic::Code::Ok
                    || status.source == OutcomeSource::MissingStatus =>
            {
                bad.clone()
            }
            _ => status,
        };
        match &frame {
            Some(Ok(f)) => {
                if let Some(data) = f.data_ref() {
                    if let Err(why) = this.frames.feed(data) {
                        this.reporter.on_drop(CallStatus::malformed(why));
                    }
                } else if let Some(trailers) = f.trailers_ref() {
                    let status = CallStatus::from_headers(trailers, OutcomeSource::Trailers)
                        .unwrap_or_else(missing_status);
                    let status = malformed(status, this.reporter);
                    this.reporter.report(|| Outcome::Completed(status));
                }
            }
            Some(Err(e)) => this.reporter.report(|| {
                let mut status = CallStatus::from_error(e);
                status.source = OutcomeSource::BodyError;
                Outcome::Completed(status)
            }),
            None => {
                let status = malformed(missing_status(), this.reporter);
                this.reporter.report(|| Outcome::Completed(status));
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

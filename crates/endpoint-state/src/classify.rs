//! gRPC outcome classification.
//!
//! A gRPC call's outcome can be found in four places, and all four are read here:
//!
//! 1. the service's `Err` — a transport error (connect refused, reset, h2 error) counts as
//!    `UNAVAILABLE`, a local timeout as `DEADLINE_EXCEEDED` (tonic itself reports its own
//!    timeout as `CANCELLED`);
//! 2. `grpc-status` in the response headers (a *trailers-only* response, which is how most
//!    errors arrive), or an HTTP status other than 200 without one;
//! 3. `grpc-status` in the trailers at the end of the body (streams and ordinary unary replies);
//! 4. the response future or body dropped before the end: the caller gave up, which counts as
//!    neither success nor failure ([`Outcome::Abandoned`]).
//!
//! [`ResponseFuture`] and [`ClassifiedBody`] find the outcome and hand it, exactly once, to an
//! [`OnOutcome`]; [`FailureCodes`] says which codes a layer counts as failures.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::{HeaderMap, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tonic::Code;

/// `grpc-status`, as a ready header name (a string key would be parsed on every lookup).
static GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");

/// The error type of the classifying wrappers (tower's usual boxed error).
pub type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// The canonical gRPC name of a code, as it appears in specs and logs (`UNAVAILABLE`).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Where an outcome was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeSource {
    /// The service returned `Err` instead of a response (a transport error or a timeout).
    ServiceError,
    /// `grpc-status` in the response headers: a trailers-only response.
    Headers,
    /// No `grpc-status` in the headers and an HTTP status other than 200, mapped as gRPC
    /// specifies.
    HttpStatus,
    /// `grpc-status` in the trailers at the end of the body.
    Trailers,
    /// The body failed while being read (connection reset, h2 error).
    BodyError,
    /// The body ended without a `grpc-status` (a protocol violation; counted as `UNKNOWN`
    /// as tonic does).
    MissingStatus,
}

/// The status a finished call ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallStatus {
    /// The gRPC code (`Ok` for success).
    pub code: Code,
    /// The status message or, for transport errors, the error chain in words.
    pub message: String,
    /// Where the status was found.
    pub source: OutcomeSource,
}

impl CallStatus {
    /// A status with no message.
    pub fn new(code: Code, source: OutcomeSource) -> Self {
        CallStatus {
            code,
            message: String::new(),
            source,
        }
    }

    /// The status of a call whose service returned `err`.
    ///
    /// The error chain is searched for a `tonic::Status` (its code is kept, except tonic's own
    /// `CANCELLED: Timeout expired`, which is a local timeout), and for a timeout
    /// (`tonic::TimeoutExpired`, tower's and tokio's `Elapsed`: `DEADLINE_EXCEEDED`); anything
    /// else is a transport failure: `UNAVAILABLE`. The message is the whole chain.
    pub fn from_error(err: &(dyn Error + 'static)) -> Self {
        let message = error_chain(err);
        let mut cur = Some(err);
        while let Some(e) = cur {
            if let Some(status) = e.downcast_ref::<tonic::Status>() {
                let code = if status.code() == Code::Cancelled
                    && status.message() == tonic::TimeoutExpired(()).to_string()
                {
                    Code::DeadlineExceeded
                } else {
                    status.code()
                };
                return CallStatus {
                    code,
                    message: status.message().to_owned(),
                    source: OutcomeSource::ServiceError,
                };
            }
            if e.is::<tonic::TimeoutExpired>()
                || e.is::<tower::timeout::error::Elapsed>()
                || e.is::<tokio::time::error::Elapsed>()
            {
                return CallStatus {
                    code: Code::DeadlineExceeded,
                    message,
                    source: OutcomeSource::ServiceError,
                };
            }
            cur = e.source();
        }
        CallStatus {
            code: Code::Unavailable,
            message,
            source: OutcomeSource::ServiceError,
        }
    }

    /// The status carried by `grpc-status` (and `grpc-message`) in `headers`, if any.
    pub fn from_headers(headers: &HeaderMap, source: OutcomeSource) -> Option<Self> {
        let value = headers.get(&GRPC_STATUS)?;
        let code = value
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .map(Code::from_i32)
            .unwrap_or(Code::Unknown);
        if code == Code::Ok {
            // The common case: no message to decode, nothing to allocate.
            return Some(CallStatus::new(Code::Ok, source));
        }
        let message = tonic::Status::from_header_map(headers)
            .map(|s| s.message().to_owned())
            .unwrap_or_default();
        Some(CallStatus {
            code,
            message,
            source,
        })
    }

    /// The gRPC mapping of an HTTP status that came without `grpc-status`.
    pub fn from_http_status(status: http::StatusCode) -> Self {
        let code = match status.as_u16() {
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502 | 503 | 504 => Code::Unavailable,
            _ => Code::Unknown,
        };
        CallStatus {
            code,
            message: format!("HTTP status {} without grpc-status", status.as_u16()),
            source: OutcomeSource::HttpStatus,
        }
    }
}

impl fmt::Display for CallStatus {
    /// `UNAVAILABLE: connection refused`, or just `UNAVAILABLE` without a message.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(code_name(self.code))?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

/// An error and its whole `source()` chain in words, joined with `: `
/// (`transport error: tcp connect error: Connection refused`), skipping a source whose text
/// is already shown. The form every layer uses for reasons and status messages.
pub fn error_chain(err: &(dyn Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let text = e.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = e.source();
    }
    out
}

/// How a call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The call reached its final status.
    Completed(CallStatus),
    /// The caller dropped the response future, or the body before its end: neither success
    /// nor failure.
    Abandoned,
    /// The call failed with this status, but the server provably did not process it (its
    /// error was marked [`NotProcessed`]: the server refused the stream while closing the
    /// connection — a `GOAWAY` for a max connection age, a graceful stop): neither success nor
    /// failure for the backend, which is alive and closing a connection as servers do.
    NotProcessed(CallStatus),
}

impl Outcome {
    /// The status the call ended with, unless the call was abandoned.
    pub fn status(&self) -> Option<&CallStatus> {
        match self {
            Outcome::Completed(s) | Outcome::NotProcessed(s) => Some(s),
            Outcome::Abandoned => None,
        }
    }

    /// The outcome of a call whose service returned `err`: [`Outcome::NotProcessed`] when
    /// the error is marked so, otherwise [`Outcome::Completed`] with its status.
    pub fn from_error(err: &(dyn Error + 'static)) -> Self {
        let status = CallStatus::from_error(err);
        if is_not_processed(err) {
            Outcome::NotProcessed(status)
        } else {
            Outcome::Completed(status)
        }
    }
}

/// Marks a call's error as one the server provably did not process — it refused the stream
/// (a `GOAWAY` naming an earlier last stream, `REFUSED_STREAM`), or the connection closed
/// before taking the request — so that no layer counts it against the backend
/// ([`Outcome::NotProcessed`]). A transport layer that can tell (the kit's, which reads h2's
/// and hyper's errors) wraps such errors; the original stays the [`source`](Error::source).
#[derive(Debug)]
pub struct NotProcessed {
    inner: BoxError,
}

impl NotProcessed {
    /// Marks `inner`.
    pub fn new(inner: impl Into<BoxError>) -> Self {
        NotProcessed {
            inner: inner.into(),
        }
    }

    /// The marked error.
    pub fn into_inner(self) -> BoxError {
        self.inner
    }
}

impl fmt::Display for NotProcessed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not processed by the server")
    }
}

impl Error for NotProcessed {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.inner)
    }
}

/// Whether `err`'s chain holds a [`NotProcessed`] mark.
pub fn is_not_processed(err: &(dyn Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.is::<NotProcessed>() {
            return true;
        }
        cur = e.source();
    }
    false
}

/// What an outcome means to one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Good for the backend (including client errors such as `INVALID_ARGUMENT`).
    Success,
    /// Counts against the backend.
    Failure,
    /// Counts neither way (the caller gave up).
    Ignored,
}

/// The set of gRPC codes a layer counts as failures. Every other code, `OK` and client errors
/// such as `INVALID_ARGUMENT` or `NOT_FOUND` included, counts as success for the backend.
///
/// ```
/// use endpoint_state::FailureCodes;
/// use tonic::Code;
/// let codes = FailureCodes::quarantine_default().with(Code::Internal);
/// assert!(codes.contains(Code::Unavailable) && codes.contains(Code::Internal));
/// assert!(!codes.contains(Code::InvalidArgument));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FailureCodes(u32);

impl FailureCodes {
    /// No code is a failure.
    pub const NONE: FailureCodes = FailureCodes(0);

    /// Quarantine's default: `UNAVAILABLE` and `DEADLINE_EXCEEDED` (transport errors and
    /// local timeouts are classified as those).
    pub fn quarantine_default() -> Self {
        FailureCodes::from_codes([Code::Unavailable, Code::DeadlineExceeded])
    }

    /// The breaker's default: quarantine's plus `INTERNAL`, `UNKNOWN`, `DATA_LOSS` and
    /// `RESOURCE_EXHAUSTED`.
    pub fn breaker_default() -> Self {
        FailureCodes::quarantine_default()
            .with(Code::Internal)
            .with(Code::Unknown)
            .with(Code::DataLoss)
            .with(Code::ResourceExhausted)
    }

    /// Exactly these codes.
    pub fn from_codes(codes: impl IntoIterator<Item = Code>) -> Self {
        codes
            .into_iter()
            .fold(FailureCodes::NONE, FailureCodes::with)
    }

    /// This set plus `code`.
    #[must_use]
    pub fn with(self, code: Code) -> Self {
        FailureCodes(self.0 | bit(code))
    }

    /// This set without `code`.
    #[must_use]
    pub fn without(self, code: Code) -> Self {
        FailureCodes(self.0 & !bit(code))
    }

    /// Whether `code` counts as failure.
    pub fn contains(self, code: Code) -> bool {
        self.0 & bit(code) != 0
    }

    /// The codes in the set, in numeric order.
    pub fn iter(self) -> impl Iterator<Item = Code> {
        (0..=16)
            .map(Code::from_i32)
            .filter(move |c| self.contains(*c))
    }

    /// What `outcome` means under this set.
    pub fn classify(self, outcome: &Outcome) -> Verdict {
        match outcome {
            Outcome::Abandoned | Outcome::NotProcessed(_) => Verdict::Ignored,
            Outcome::Completed(s) if self.contains(s.code) => Verdict::Failure,
            Outcome::Completed(_) => Verdict::Success,
        }
    }
}

fn bit(code: Code) -> u32 {
    1 << (code as i32 as u32)
}

impl fmt::Debug for FailureCodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter().map(code_name)).finish()
    }
}

/// Receives a call's outcome, exactly once.
///
/// Implemented for every `FnOnce(Outcome) + Send + 'static` closure.
pub trait OnOutcome: Send + 'static {
    /// Called once, when the outcome is known (or the call is abandoned).
    fn on_outcome(self, outcome: Outcome);
}

impl<F> OnOutcome for F
where
    F: FnOnce(Outcome) + Send + 'static,
{
    fn on_outcome(self, outcome: Outcome) {
        self(outcome)
    }
}

/// Holds the listener until the outcome is known; reports `Abandoned` if dropped first.
struct Reporter<O: OnOutcome>(Option<O>);

impl<O: OnOutcome> Reporter<O> {
    fn report(&mut self, outcome: impl FnOnce() -> Outcome) {
        if let Some(o) = self.0.take() {
            o.on_outcome(outcome());
        }
    }

    fn is_listening(&self) -> bool {
        self.0.is_some()
    }
}

impl<O: OnOutcome> Drop for Reporter<O> {
    fn drop(&mut self) {
        if let Some(o) = self.0.take() {
            o.on_outcome(Outcome::Abandoned);
        }
    }
}

impl<O: OnOutcome> fmt::Debug for Reporter<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Reporter(listening)"
        } else {
            "Reporter(done)"
        })
    }
}

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

pin_project! {
    /// A response body that reports the call's final status — from its trailers, a body error,
    /// or its end without a status — exactly once; dropped before that, it reports
    /// [`Outcome::Abandoned`]. With no listener it is a plain pass-through.
    pub struct ClassifiedBody<B, O: OnOutcome> {
        #[pin]
        inner: B,
        reporter: Reporter<O>,
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

fn missing_status() -> CallStatus {
    CallStatus {
        code: Code::Unknown,
        message: "stream ended without a grpc-status".to_owned(),
        source: OutcomeSource::MissingStatus,
    }
}

/// A `tower` layer that classifies every call of the service below it and hands each outcome
/// to a clone of `on_outcome`. The layers that count outcomes (breaker, quarantine) use
/// [`ResponseFuture`] directly; this one is for anyone else who wants to observe outcomes
/// (metrics, logs, tests).
///
/// ```
/// use endpoint_state::{ClassifyLayer, Outcome};
/// use tower::ServiceBuilder;
/// # fn wrap(channel: tonic::transport::Channel) {
/// let svc = ServiceBuilder::new()
///     .layer(ClassifyLayer::new(|outcome: Outcome| println!("{outcome:?}")))
///     .service(channel);
/// # let _ = svc; }
/// ```
#[derive(Clone, Debug)]
pub struct ClassifyLayer<O> {
    on_outcome: O,
}

impl<O> ClassifyLayer<O> {
    /// Report every call's outcome to a clone of `on_outcome`.
    pub fn new(on_outcome: O) -> Self {
        ClassifyLayer { on_outcome }
    }
}

impl<S, O: Clone> tower_layer::Layer<S> for ClassifyLayer<O> {
    type Service = Classify<S, O>;
    fn layer(&self, inner: S) -> Self::Service {
        Classify {
            inner,
            on_outcome: self.on_outcome.clone(),
        }
    }
}

/// The service made by [`ClassifyLayer`].
#[derive(Clone, Debug)]
pub struct Classify<S, O> {
    inner: S,
    on_outcome: O,
}

impl<S, O> Classify<S, O> {
    /// Wrap `inner`.
    pub fn new(inner: S, on_outcome: O) -> Self {
        Classify { inner, on_outcome }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwrap.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, O, ReqB, ResB> tower_service::Service<http::Request<ReqB>> for Classify<S, O>
where
    S: tower_service::Service<http::Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    O: OnOutcome + Clone,
{
    type Response = Response<ClassifiedBody<ResB, O>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, O>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        ResponseFuture::new(self.inner.call(req), Some(self.on_outcome.clone()))
    }
}

impl<S: crate::HasCard, O> crate::HasCard for Classify<S, O> {
    fn card(&self) -> Option<&crate::EndpointCard> {
        self.inner.card()
    }
}

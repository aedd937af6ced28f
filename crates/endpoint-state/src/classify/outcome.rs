//! How a call ended, what that means to one layer, and how the outcome is handed over.

use std::error::Error;
use std::fmt;

use tonic::Code;

use super::status::{CallStatus, OutcomeSource, code_name};
use crate::error::BoxError;

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
    crate::error::is_caused_by::<NotProcessed>(err)
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
    ///
    /// A reply that is not gRPC at all ([`OutcomeSource::NotGrpc`]: an HTML page where a
    /// gRPC server should be) or not decodable ([`OutcomeSource::Malformed`]) is a failure of
    /// the target whatever code gRPC maps it to, under every set but
    /// [`NONE`](Self::NONE): the target is not the service it was taken for.
    pub fn classify(self, outcome: &Outcome) -> Verdict {
        match outcome {
            Outcome::Abandoned | Outcome::NotProcessed(_) => Verdict::Ignored,
            Outcome::Completed(s)
                if matches!(s.source, OutcomeSource::NotGrpc | OutcomeSource::Malformed)
                    && self != FailureCodes::NONE =>
            {
                Verdict::Failure
            }
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

/// Holds the listener until the outcome is known; reports `Abandoned` if dropped first (or the
/// status set by [`on_drop`](Self::on_drop), when what was seen already says how the call
/// ends).
pub(crate) struct Reporter<O: OnOutcome> {
    listener: Option<O>,
    dropped: Option<CallStatus>,
}

impl<O: OnOutcome> Reporter<O> {
    pub(crate) fn new(listener: Option<O>) -> Self {
        Reporter {
            listener,
            dropped: None,
        }
    }

    pub(crate) fn report(&mut self, outcome: impl FnOnce() -> Outcome) {
        if let Some(o) = self.listener.take() {
            o.on_outcome(outcome());
        }
    }

    pub(crate) fn is_listening(&self) -> bool {
        self.listener.is_some()
    }

    /// Dropped before the outcome is known, the call ends with `status`, not abandoned.
    pub(crate) fn on_drop(&mut self, status: CallStatus) {
        self.dropped = Some(status);
    }

    /// The status set by [`on_drop`](Self::on_drop), if any.
    pub(crate) fn drop_status(&self) -> Option<&CallStatus> {
        self.dropped.as_ref()
    }
}

impl<O: OnOutcome> Drop for Reporter<O> {
    fn drop(&mut self) {
        if let Some(o) = self.listener.take() {
            o.on_outcome(match self.dropped.take() {
                Some(status) => Outcome::Completed(status),
                None => Outcome::Abandoned,
            });
        }
    }
}

impl<O: OnOutcome> fmt::Debug for Reporter<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.listener.is_some() {
            "Reporter(listening)"
        } else {
            "Reporter(done)"
        })
    }
}

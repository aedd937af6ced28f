//! gRPC outcome classification.
//!
//! A gRPC call's outcome can be found in four places, and all four are read here:
//!
//! 1. the service's `Err` — a transport error (connect refused, reset, h2 error) counts as
//!    `UNAVAILABLE`, a local timeout as `DEADLINE_EXCEEDED` (tonic itself reports its own
//!    timeout as `CANCELLED`);
//! 2. `grpc-status` in the response headers (a *trailers-only* response, which is how most
//!    errors arrive), or an HTTP status other than 200 without one, or a response that is not
//!    gRPC at all (`200 OK` with `content-type: text/html` from a proxy: `UNKNOWN`, as gRPC's
//!    clients map it);
//! 3. `grpc-status` in the trailers at the end of the body (streams and ordinary unary replies);
//! 4. the response future or body dropped before the end: the caller gave up, which counts as
//!    neither success nor failure ([`Outcome::Abandoned`]) — unless the data seen so far is no
//!    gRPC message a client can decode (then the client gave up because it could not read the
//!    reply: `INTERNAL`, as tonic reports it, a failure of the target).
//!
//! A server's own `CANCELLED` stays `CANCELLED`; only the client's local timeout (tonic's
//! `TimeoutExpired`, tower's or tokio's `Elapsed`, wherever in the error chain) counts as
//! `DEADLINE_EXCEEDED`.
//!
//! [`ResponseFuture`] and [`ClassifiedBody`] find the outcome and hand it, exactly once, to an
//! [`OnOutcome`]; [`FailureCodes`] says which codes a layer counts as failures.

mod body;
mod frames;
mod future;
mod layer;
mod outcome;
mod status;

pub use body::ClassifiedBody;
pub use frames::{MessagePrefixes, Prefix};
pub use future::ResponseFuture;
pub use layer::{Classify, ClassifyLayer};
pub use outcome::{FailureCodes, NotProcessed, OnOutcome, Outcome, Verdict, is_not_processed};
pub use status::{CallStatus, NotGrpcResponse, OutcomeSource, code_by_name, code_name};

pub use crate::error::{BoxError, error_chain};

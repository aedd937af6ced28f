//! The shared core of grpc-client-kit: the per-endpoint **state card**, the readiness **gate**
//! built on it, and gRPC **outcome classification**.
//!
//! Every endpoint (one target, one tonic `Channel`) has one [`EndpointCard`]. Each layer writes
//! its own line — the health checker its verdict, quarantine its deadline, the breaker its
//! state, each with a reason — and anyone reads the card in O(1) without a lock. A change of
//! any line wakes whoever waits on the card.
//!
//! A layer that gates calls builds its `poll_ready` on a [`Gate`]: `Pending` with a real waker
//! (a card change, or one reused timer at the line's own deadline) while its line is shut,
//! never an `Err` for a transient condition, never a busy re-poll. That is what lets each layer
//! work under tower's `balance::p2c::Balance`, `ReadyCache` and `Buffer`.
//!
//! The layers that count failures read outcomes through [`classify`]: the service's `Err`,
//! `grpc-status` in the headers (trailers-only) or in the trailers, and a call abandoned by its
//! caller, each mapped to a gRPC code and judged by a configurable [`FailureCodes`] set.
//!
//! # Example: a gate under `ServiceBuilder`
//!
//! A minimal health gate over any service, shut while the card's health verdict does not
//! admit calls:
//!
//! ```
//! use std::task::{Context, Poll};
//! use endpoint_state::{EndpointCard, Gate, GateCheck, HealthVerdict};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! struct HealthGate<S> { gate: Gate, inner: S }
//!
//! impl<S: Service<R>, R> Service<R> for HealthGate<S> {
//!     type Response = S::Response;
//!     type Error = S::Error;
//!     type Future = S::Future;
//!     fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
//!         let check = |c: &EndpointCard| {
//!             if c.health_verdict().admits() { GateCheck::Open } else { GateCheck::Shut }
//!         };
//!         // Pending (with a waker on the card) while shut; never an error.
//!         std::task::ready!(self.gate.poll_open(cx, check));
//!         self.inner.poll_ready(cx)
//!     }
//!     fn call(&mut self, req: R) -> S::Future { self.inner.call(req) }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let card = EndpointCard::new("127.0.0.1:50051");
//! card.set_health(HealthVerdict::Healthy, None);
//! let mut svc = ServiceBuilder::new()
//!     .layer_fn(|inner| HealthGate { gate: Gate::new(card.clone()), inner })
//!     .service_fn(|x: u32| async move { Ok::<_, std::convert::Infallible>(x + 1) });
//! assert_eq!(svc.ready().await.unwrap().call(1).await.unwrap(), 2);
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backoff;
pub mod card;
pub mod classify;
#[cfg(feature = "serde")]
mod de;
mod eligibility;
pub mod error;
pub mod event;
pub mod gate;
mod line;
pub mod peers;
pub mod rng;
pub mod sync;
pub mod text;
pub mod time;
#[cfg(feature = "transport")]
pub mod transport;
pub mod writes;

#[doc(inline)]
pub use backoff::Backoff;
#[doc(inline)]
pub use card::{
    Block, BreakerLine, BreakerState, CardSnapshot, Changed, EndpointCard, HasCard, HealthLine,
    HealthVerdict, Ineligible, Line, LineKind, Quarantine, QuarantineLine, Reason,
};
#[doc(inline)]
pub use classify::{
    CallStatus, ClassifiedBody, Classify, ClassifyLayer, FailureCodes, NotGrpcResponse,
    NotProcessed, OnOutcome, Outcome, OutcomeSource, ResponseFuture, Verdict, code_by_name,
    code_name, error_chain, is_not_processed,
};
#[doc(inline)]
pub use error::{BoxError, ConfigError};
#[doc(inline)]
pub use event::{CardEvent, LineState};
#[doc(inline)]
pub use gate::{Gate, GateCheck, Opened, PassiveCheck, PassiveGate, PassiveOpened};
#[doc(inline)]
pub use peers::{Admission, Peers, Witness};

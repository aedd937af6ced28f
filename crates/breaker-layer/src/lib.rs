//! A per-endpoint circuit breaker for tonic clients, as a tower layer.
//!
//! Wrap one endpoint's channel in a [`Breaker`] (from a [`BreakerLayer`] built with the
//! endpoint's [`EndpointCard`](endpoint_state::EndpointCard)). The breaker reads the gRPC
//! outcome of every call — a transport error, a trailers-only error, the status in the
//! trailers at the end of a stream, a local timeout — and:
//!
//! * **closed**, counts outcomes and trips on a [`TripPolicy`]: `N` consecutive failures
//!   (default 5), or a failure rate over the last `n` calls or the last `d` seconds once a
//!   minimum number of calls is reached; and optionally on a rate of [`SlowCalls`];
//! * **open**, refuses calls for an open period that grows between repeated trips (the core's
//!   [`Backoff`](endpoint_state::Backoff): exponential, capped, with jitter, set in
//!   [`BreakerConfig::open`]): `poll_ready` stays `Pending` with a timer at the
//!   half-open instant, so that a balancer routes around the endpoint ([`WhenOpen::Wait`]),
//!   or the call fails at once with [`BreakerOpen`], which a generated client sees as
//!   `UNAVAILABLE` naming the target and when it will be retried ([`WhenOpen::FailFast`]);
//!
//!   An open breaker is a *passive* signal, inferred from calls: when the endpoint's card
//!   belongs to a [`Peers`](endpoint_state::Peers) set (a quarantine group's, or the one our
//!   balancer gives cards that have none) and no peer is eligible, the breaker admits calls
//!   anyway — passive signals narrow the choice, never empty it — and the first success closes
//!   it. A breaker alone over one channel, in no peer set, refuses as above; an operator's
//!   forced-open breaker always does;
//! * **half-open**, admits a bounded number of probe calls (default 1): permits are taken in
//!   `poll_ready`, handed to the call, and given back if the service, the response future or
//!   the body is dropped before the outcome — a half-open breaker never sticks. Success
//!   closes the breaker; a failure reopens it for longer. Nobody queues for a permit: while
//!   every permit is taken (a probe that is a long stream holds its permit until its
//!   trailers) the card says so (`BreakerState::HalfOpen { busy: true }`), the endpoint is not
//!   eligible, and — like an open breaker, a passive signal — calls go to eligible peers, or
//!   are admitted anyway when none is.
//!
//! What counts as a failure is a [`FailureCodes`](endpoint_state::FailureCodes) set (default
//! [`breaker_default`](endpoint_state::FailureCodes::breaker_default)); client errors such as
//! `INVALID_ARGUMENT` or `NOT_FOUND` count as successes, and a call its caller abandons counts
//! as neither. Every transition is published on the card's breaker line, with its reason
//! (`5 consecutive failures (last: UNAVAILABLE: connection refused)`), and the card's
//! [`CardEvent`](endpoint_state::CardEvent) for it — the one event type of every line of
//! every card — goes to [`BreakerHandle::subscribe`]rs; operators can
//! [`force_open`](BreakerHandle::force_open), [`disable`](BreakerHandle::disable) and
//! [`reset`](BreakerHandle::reset) the breaker.
//!
//! The configuration is a plain struct, [`BreakerConfig`], checked when the layer is built:
//! an invalid one is a [`ConfigError`] naming the field and the value. With the feature
//! `serde` it reads from a configuration file (see [`BreakerConfig`]).
//!
//! In the closed state the request path takes no lock: one atomic load in `poll_ready`, one
//! reference count in `call`, and on the outcome two atomic loads (the default policy on a
//! healthy endpoint) or two to three atomic read-modify-writes (a window; a time window also
//! reads the clock). Transitions are rare and take a short lock.
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//! use breaker_layer::{BreakerConfig, BreakerLayer, WhenOpen};
//! use endpoint_state::{BreakerState, EndpointCard};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! // Stands in for a tonic `Channel`: every call fails with a trailers-only UNAVAILABLE.
//! let channel = tower::service_fn(|_: http::Request<String>| async {
//!     let reply = http::Response::builder()
//!         .header("grpc-status", "14")
//!         .header("grpc-message", "connection refused")
//!         .body(String::new())
//!         .unwrap();
//!     Ok::<_, Infallible>(reply)
//! });
//!
//! let card = EndpointCard::new("10.0.0.7:50051");
//! let config = BreakerConfig::default().when_open(WhenOpen::FailFast);
//! let mut svc = ServiceBuilder::new()
//!     .layer(BreakerLayer::new(card.clone(), config).unwrap())
//!     .service(channel);
//!
//! for _ in 0..5 {
//!     let _ = svc.ready().await.unwrap().call(http::Request::new(String::new())).await;
//! }
//! assert!(matches!(card.breaker_state(), BreakerState::Open { .. }));
//! assert_eq!(
//!     card.breaker().reason.as_deref(),
//!     Some("5 consecutive failures (last: UNAVAILABLE: connection refused)"),
//! );
//!
//! // The next call fails fast; a generated client would see this status.
//! let error = svc.ready().await.unwrap().call(http::Request::new(String::new())).await.unwrap_err();
//! let status = tonic::Status::from_error(error);
//! assert_eq!(status.code(), tonic::Code::Unavailable);
//! assert!(status.message().starts_with("10.0.0.7:50051: breaker open, retry in"));
//! # }
//! ```
//!
//! Under tower's `p2c::Balance` (or our balancer), use the default [`WhenOpen::Wait`]: an open
//! endpoint is simply not ready, and the balancer sends its calls elsewhere until the probe
//! lets it back in.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
pub mod error;
pub mod future;
mod handle;
mod layer;
mod reason;
mod service;
mod state;
mod trip;
mod window;
mod word;

pub use config::{BreakerConfig, MAX_HALF_OPEN_PERMITS, WhenOpen};
#[doc(no_inline)]
pub use endpoint_state::{BoxError, ConfigError};
pub use error::BreakerOpen;
pub use handle::BreakerHandle;
pub use layer::BreakerLayer;
pub use service::Breaker;
pub use trip::{
    MAX_CALLS_PER_BUCKET, MAX_COUNT_WINDOW, MAX_TIME_WINDOW, MIN_TIME_WINDOW, SlowCalls,
    TIME_WINDOW_BUCKETS, TripPolicy, Window,
};

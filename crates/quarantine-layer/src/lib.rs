//! Passive quarantine for tonic clients: a call that fails with `UNAVAILABLE` or
//! `DEADLINE_EXCEEDED` takes its endpoint out of rotation for a few seconds — and quarantine
//! never empties the choice.
//!
//! A failed call is fresher news than any health probe. Each endpoint's stack (one tonic
//! `Channel` per target) gets a [`Quarantine`] service from its group's
//! [`layer`](QuarantineGroup::layer). The service classifies every call — the service's own
//! error (a refused connection counts as `UNAVAILABLE`, a local timeout as
//! `DEADLINE_EXCEEDED`), a trailers-only response, or the trailers at the end of the body —
//! and a failure code writes the quarantine line of the endpoint's
//! [`EndpointCard`](endpoint_state::EndpointCard): out for 5 s (by default), with the reason
//! (`UNAVAILABLE: connection refused`). [`QuarantineGroup::report_failure`] is the same seam
//! for anything outside the call path that learns of a failure.
//!
//! While an endpoint is quarantined its `poll_ready` is `Pending` (never an `Err`: tower treats
//! that as final), with real wake-ups — the quarantine's end, a change of its card — so any
//! tower balancer (`p2c::Balance`, `ReadyCache`) simply routes around it.
//!
//! # Never empties the choice
//!
//! Quarantine only narrows the choice. The group's cards form a
//! [`Peers`](endpoint_state::Peers) set, where one rule holds for every passive signal
//! (quarantine and open breakers together): an endpoint's quarantine shuts it only while
//! another member is eligible on every line of its card (health, quarantine, breaker). When
//! none is — every peer that health admits is quarantined or has its breaker open, or the rest
//! are unhealthy — quarantine is ignored: degraded service beats refusing to route. Give the
//! endpoints' breakers the same cards and they follow the same rule. A quarantined endpoint waiting for its turn watches one eligible peer (and
//! the group's membership), so it is woken the moment the last such peer goes. The next failure
//! renews its quarantine; a success of a call admitted while its quarantine was ignored lifts
//! it.
//!
//! # Repeat offenders and outliers
//!
//! A target's `n`-th quarantine in a row lasts `duration × n`, capped at `max_duration`
//! (60 s); the count drops by one for every `decay_after` (30 s) it stays out of quarantine.
//! An optional [`OutlierEjection`] policy (failure percentage over an interval, as in gRFC A50
//! and Envoy) ejects targets whose calls mostly fail with codes that do not quarantine on
//! their own (`INTERNAL`, `UNKNOWN`, ...); its small-cluster rule is stated on the type.
//!
//! # Events and configuration
//!
//! Every quarantine that starts, is renewed or is lifted is a write of a card's quarantine
//! line, and so one [`CardEvent`](endpoint_state::CardEvent) — the one event type of every
//! line of every card. [`QuarantineGroup::subscribe`] streams those of every member.
//!
//! [`QuarantineConfig`] is a plain struct checked when the group is built: an invalid one is
//! a [`ConfigError`] naming the field and the value. With the feature `serde` it reads from
//! a configuration file (see [`QuarantineConfig`]).
//!
//! # Example
//!
//! Two endpoints; the first answers `UNAVAILABLE` (a stand-in for a tonic `Channel`, so that
//! the example runs without a network):
//!
//! ```
//! use std::convert::Infallible;
//! use endpoint_state::EndpointCard;
//! use quarantine_layer::{QuarantineConfig, QuarantineGroup};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let group = QuarantineGroup::new(QuarantineConfig::default()).unwrap();
//! let (b0, b1) = (EndpointCard::new("b0"), EndpointCard::new("b1"));
//! group.add(b1.clone());
//!
//! let mut svc = ServiceBuilder::new()
//!     .layer(group.layer(b0.clone()))
//!     .service_fn(|_req: http::Request<()>| async {
//!         let reply = http::Response::builder()
//!             .header("grpc-status", "14")
//!             .header("grpc-message", "going away")
//!             .body(())
//!             .unwrap();
//!         Ok::<_, Infallible>(reply)
//!     });
//!
//! // The call fails with UNAVAILABLE: b0 is quarantined for 5 s.
//! let _reply = svc.ready().await.unwrap().call(http::Request::new(())).await.unwrap();
//! let why = b0.eligibility().unwrap_err().to_string();
//! assert_eq!(why, "b0: quarantined 5.0 s more after UNAVAILABLE: going away");
//!
//! // b1 is eligible, so b0 waits (Pending, not an error)...
//! let mut ready = tokio_test::task::spawn(svc.ready());
//! assert!(ready.poll().is_pending());
//!
//! // ...until b1 is quarantined too: then quarantine is ignored and b0 is woken, ready.
//! group.report_failure("b1", None).unwrap();
//! assert!(ready.is_woken());
//! assert!(ready.poll().is_ready());
//! # }
//! ```
//!
//! Over real endpoints, each stack is `group.layer(card)` over the endpoint's `Channel`, and the
//! stacks go to a balancer (tower's `p2c::Balance`, or the kit's own, which reads the cards
//! through [`HasCard`](endpoint_state::HasCard)):
//!
//! ```no_run
//! # async fn run(addrs: Vec<String>) -> Result<(), Box<dyn std::error::Error>> {
//! use endpoint_state::EndpointCard;
//! use quarantine_layer::QuarantineGroup;
//! use tonic::transport::Endpoint;
//! use tower::ServiceBuilder;
//!
//! let group = QuarantineGroup::default();
//! let mut stacks = Vec::new();
//! for addr in addrs {
//!     let channel = Endpoint::from_shared(addr.clone())?.connect_lazy();
//!     let stack = ServiceBuilder::new()
//!         .layer(group.layer(EndpointCard::new(addr)))
//!         .service(channel);
//!     stacks.push(tower::load::Constant::new(stack, 1));
//! }
//! let balanced = tower::balance::p2c::Balance::new(tower::discover::ServiceList::new(stacks));
//! let channel = tower::buffer::Buffer::new(balanced, 1024);
//! // let client = GreeterClient::new(channel);
//! # let _ = channel; Ok(()) }
//! ```
//!
//! A caller's own timeout *above* the layer drops the call, which counts neither way; to have
//! timeouts quarantine, set the timeout on the `Endpoint` (or a `tower::timeout` layer) below
//! this one.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
pub mod error;
pub mod future;
mod group;
mod layer;
mod member;
mod outlier;
mod service;

pub use config::{MAX_SETTING, OutlierEjection, QuarantineConfig};
#[doc(no_inline)]
pub use endpoint_state::ConfigError;
#[allow(deprecated)]
pub use error::InvalidConfig;
pub use error::UnknownTarget;
pub use group::QuarantineGroup;
pub use layer::QuarantineLayer;
pub use service::Quarantine;

//! Makes a tonic client survive its backends: active health checking, passive quarantine, a
//! circuit breaker per target and a load balancer, composed into **one channel that a generated
//! client takes exactly like a tonic `Channel`**.
//!
//! Each piece is its own crate and its own tower layer, re-exported here — [`health`],
//! [`quarantine`], [`breaker`], [`balance`], and the shared core, [`state`] — so you can add a
//! single one to an existing stack with `ServiceBuilder`. This crate composes all of them:
//!
//! ```text
//!              ┌────────────────────── per target (one EndpointCard each) ──────────────────────┐
//! KitChannel → Balance → Health gate → Quarantine → Breaker → transport errors named → connection
//!   (clone)    O(1) pick   (Watch/Check    (5 s after    (Wait mode:        (UNAVAILABLE,       (lazy: the kit's
//!              over the    verdicts from   UNAVAILABLE,  skipped while      target in the       HTTP/2 client, or
//!              eligible    the checker)    never empties open)              message)            a tonic Channel)
//!              targets                     the choice)
//! ```
//!
//! * **Targets** are a fixed list, or a DNS name re-resolved as its records change
//!   ([`dns`]); the balancer's discovery adds and removes the per-target stacks as they come
//!   and go.
//! * **One card per target.** The health checker, quarantine and the breaker each write their
//!   line of the target's [`EndpointCard`](state::EndpointCard); the balancer reads the cards to
//!   keep an exact set of eligible targets and to say why each was skipped.
//! * **The endpoint template** ([`EndpointTemplate`]) builds each target's tonic `Endpoint` —
//!   TLS, origin, user agent, timeouts — for its application channel *and* its health probe's
//!   channel (a separate connection: probes never count towards breakers or quarantine).
//! * **The connection.** A plaintext target of the kit's own templates
//!   ([`EndpointTemplate::new`], [`EndpointSettings`]) is called through the kit's own HTTP/2
//!   client, on the `h2` crate: the caller's task sends the request and reads the response,
//!   where a tonic `Channel` hands each call to a worker task and hyper spawns two more (a
//!   unary call costs 0.78–0.83× the client CPU of tonic's `balance_list`: `BENCHMARKS.md`).
//!   It honours every setting of the template (timeout, origin, user agent, keepalive, TCP)
//!   and backs its keepalive off on `too_many_pings` (gRFC A8). TLS, a template function's
//!   endpoint and a user's connector keep a tonic `Channel`.
//! * **Errors are gRPC statuses** naming the target(s) and why, never `UNKNOWN` (see
//!   [`error`]): `UNAVAILABLE` when no target is eligible (each listed: unhealthy, breaker open,
//!   quarantined ...), when the DNS name cannot be resolved, on a transport error.
//! * **Transparent retry.** A call the backend provably did not act on — connecting to its
//!   target was refused (a backend that stopped, or closed its port after `GOAWAY`), the
//!   connection closed before taking the request, or the backend refused the stream — is sent
//!   once more, to another eligible target, as gRPC's own clients do
//!   ([`KitBuilder::transparent_retry`]). A call a backend may have acted on is never sent
//!   twice.
//! * **Lifetime.** [`KitBuilder::build`] starts the health checker, the balancer's task and the
//!   DNS task; [`Kit::shutdown`] stops them, as does dropping the last handle (every [`Kit`]
//!   and [`KitChannel`] clone is one). [`Kit::wait_until_ready`] waits for first verdicts.
//! * **Configuration** from code ([`KitBuilder`]) or a file ([`KitConfig`], serde; TOML with
//!   [`KitConfig::from_toml`]); either way every invalid value fails the build naming the field
//!   and the value, and nothing starts.
//! * **Observability.** The layers log their transitions with `tracing` (`info`), the kit its
//!   own (targets added and removed, DNS failures, start and stop). Each call has a `debug`
//!   span, `grpc.call`, with its `grpc.method`, the kit's name (`grpc.target`, see
//!   [`KitBuilder::name`]), the `backend` picked, the `attempt` and the `grpc.status`. The
//!   `metrics` feature records gRPC's call and attempt metrics (gRFC A66:
//!   `grpc.client.call.duration`, `grpc.client.attempt.duration`, ...) and the kit's own
//!   (eligible targets, breaker states, quarantines, health transitions, transparent retries)
//!   through the [`metrics`](https://docs.rs/metrics) facade: every one is listed in the
//!   `metrics` module (with that feature; on docs.rs).
//!
//! # Example
//!
//! Three local test servers; the kit with `Watch` health checking; a generated client.
//! (`test_backends` is this repository's crate of test servers, which is not published: it
//! lets the example run as a test, against servers whose health it can change and whose calls
//! it can count. In your code, the addresses are your servers' and the client your own.)
//!
//! ```
//! use std::time::Duration;
//! use grpc_client_kit::Kit;
//! use grpc_client_kit::health::{HealthConfig, ProbeMode};
//! use test_backends::Backends;
//! use test_backends::pb::{Ping, test_service_client::TestServiceClient};
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backends = Backends::start(3).await?;
//! let kit = Kit::builder()
//!     .targets(backends.uris())
//!     .health(HealthConfig::new().mode(ProbeMode::Watch))
//!     .build()?;
//! assert!(kit.wait_until_ready(Duration::from_secs(5)).await);
//! let mut client = TestServiceClient::new(kit.channel());
//!
//! backends[1].set_serving(false).await; // b1 leaves the rotation at once
//! # while kit.eligible_targets().len() != 2 { tokio::time::sleep(Duration::from_millis(1)).await }
//! for _ in 0..60 {
//!     client.unary(Ping::default()).await?;
//! }
//! let hits: Vec<u64> = backends.iter().map(|b| b.hits()).collect();
//! assert_eq!(hits, [30, 0, 30]);
//!
//! for b in backends.iter() {
//!     b.set_serving(false).await;
//! }
//! # while !kit.eligible_targets().is_empty() { tokio::time::sleep(Duration::from_millis(1)).await }
//! let status = client.unary(Ping::default()).await.unwrap_err();
//! assert_eq!(status.code(), tonic::Code::Unavailable);
//! assert!(status.message().starts_with("no healthy targets: "));
//! assert!(status.message().contains(&format!("{}: unhealthy (NOT_SERVING)", backends[1].uri())));
//! kit.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! One layer on its own, under `ServiceBuilder`, over a plain tonic `Channel` (a generated
//! client takes the stack as it is):
//!
//! ```
//! use grpc_client_kit::breaker::{BreakerConfig, BreakerLayer, WhenOpen};
//! use grpc_client_kit::state::EndpointCard;
//! use test_backends::Backends;
//! use test_backends::pb::{Ping, test_service_client::TestServiceClient};
//! use tower::ServiceBuilder;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backends = Backends::start(1).await?;
//! let channel = tonic::transport::Channel::from_shared(backends[0].uri())?.connect_lazy();
//! let card = EndpointCard::new(backends[0].uri());
//! let config = BreakerConfig::default().consecutive_failures(2).when_open(WhenOpen::FailFast);
//! let mut client = TestServiceClient::new(
//!     ServiceBuilder::new().layer(BreakerLayer::new(card, config)?).service(channel),
//! );
//! backends[0].fail_always(Some(tonic::Code::Unavailable));
//! for _ in 0..2 {
//!     let _ = client.unary(Ping::default()).await;
//! }
//! let status = client.unary(Ping::default()).await.unwrap_err();
//! assert!(status.message().contains("breaker open"));
//! assert_eq!(backends[0].hits(), 2); // the third call never left the client
//! # Ok(()) }
//! ```
//!
//! # Cargo features
//!
//! `full` (the default) is `kit`, `dns`, `toml` and `http-probe` (health-layer's HTTP probe). `health`, `quarantine`, `breaker` and
//! `balance` each re-export their crate under the same name; `kit` (which takes all four) is
//! the kit itself ([`Kit`], [`KitBuilder`], [`KitConfig`], [`KitChannel`]). `dns` enables `dns:` targets
//! (hickory-resolver), `toml` [`KitConfig::from_toml`]. `metrics` (off by default) adds the
//! metrics of the `metrics` module. With only some layer features, the crate re-exports those layers and
//! the core ([`state`]) and nothing else.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "balance")]
#[doc(inline)]
pub use balance_layer as balance;
#[cfg(feature = "breaker")]
#[doc(inline)]
pub use breaker_layer as breaker;
#[doc(inline)]
pub use endpoint_state as state;
#[cfg(feature = "health")]
#[doc(inline)]
pub use health_layer as health;
#[cfg(feature = "quarantine")]
#[doc(inline)]
pub use quarantine_layer as quarantine;

#[cfg(feature = "kit")]
mod builder;
#[cfg(feature = "kit")]
mod call_options;
#[cfg(feature = "kit")]
mod config;
#[cfg(feature = "kit")]
mod connect;
#[cfg(feature = "kit")]
mod discovery;
#[cfg(feature = "kit")]
pub mod dns;
#[cfg(feature = "kit")]
pub mod error;
#[cfg(feature = "kit")]
pub mod future;
#[cfg(feature = "kit")]
mod hedge;
#[cfg(feature = "kit")]
mod http2;
#[cfg(feature = "kit")]
mod kit;
#[cfg(feature = "kit")]
mod life;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(feature = "kit")]
mod observe;
#[cfg(feature = "kit")]
mod per_target;
#[cfg(feature = "kit")]
mod policy;
#[cfg(feature = "kit")]
mod registry;
#[cfg(feature = "kit")]
mod retry;
#[cfg(feature = "kit")]
mod service;
#[cfg(feature = "kit")]
pub mod service_config;
#[cfg(feature = "kit")]
mod stack;
#[cfg(feature = "kit")]
mod target;
#[cfg(feature = "kit")]
mod template;

#[cfg(feature = "kit")]
pub use builder::KitBuilder;
#[cfg(feature = "kit")]
pub use call_options::CallOptions;
#[cfg(feature = "kit")]
pub use config::KitConfig;
#[cfg(feature = "kit")]
pub use dns::{DnsSettings, DnsTarget};
#[cfg(feature = "kit")]
pub use error::{BuildError, InvalidConfig};
#[cfg(feature = "kit")]
pub use kit::Kit;
#[cfg(feature = "kit")]
pub use per_target::TargetService;
#[cfg(feature = "kit")]
pub use service::KitChannel;
#[cfg(feature = "kit")]
pub use target::{Target, TargetOptions};
#[cfg(feature = "kit")]
pub use template::{EndpointSettings, EndpointTemplate};

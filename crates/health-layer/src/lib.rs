//! Active health checking for tonic clients, as tower middleware.
//!
//! A [`HealthChecker`] probes each target on its own probe channel — never on an application
//! channel, so probes do not count towards breakers or quarantines and a failed probe is free
//! to drop its connection — and writes its verdict into the target's
//! [`EndpointCard`], the per-endpoint state card every layer of
//! the kit shares. Three ways to use the verdicts:
//!
//! * [`HealthLayer`] → [`Health<S>`]: a readiness gate. `poll_ready` is `Pending` (with a real
//!   waker) while the target is not healthy, so the endpoint drops out of tower's p2c balancer,
//!   `ReadyCache` or anything else that waits for readiness, and comes back when it recovers.
//! * [`HealthFilter`]: a `tower::discover::Discover` filter that inserts an endpoint only
//!   while it is healthy — it drives tower's balancers, and tonic's own
//!   `Channel::balance_channel` through [`drive_balance_channel`].
//! * The checker's API: [`is_healthy`](HealthChecker::is_healthy),
//!   [`status`](HealthChecker::status), [`subscribe`](HealthChecker::subscribe) to
//!   transitions, [`on_transition`](HealthChecker::on_transition) callbacks. A transition is
//!   a [`CardEvent`] of the card's health line, the same event every layer's change of a card
//!   is, so metrics and logs observe one stream.
//!
//! **Probes** ([`ProbeMode`]): `grpc.health.v1.Health/Check` with a deadline (default);
//! `Watch`, one stream per target whose every message is a verdict at once (a backend set to
//! `NOT_SERVING` is gated within a millisecond), re-subscribing with backoff when the stream
//! breaks (with a [`Backoff`]); an HTTP GET judged by a predicate (cargo feature `http-probe`,
//! off by default); or your own. The service name defaults to `""`, the whole server.
//!
//! **Evidence only, with gRPC's client health semantics (gRFC A17).** A target is healthy
//! only after a probe saw it serving: until then its card says
//! [`HealthVerdict::Unknown`] — *connecting*, which shuts the gate (a balancer lets calls wait
//! for the first verdict rather than fail). Asking about a target that no running checker will
//! ever probe is an explicit [`NotRunning`] error, not "unhealthy". `UNIMPLEMENTED` (a server
//! without the health service) counts as healthy, as in gRPC's own clients, logged once per
//! target at `warn`; [`unimplemented_is_healthy(false)`](HealthConfig::unimplemented_is_healthy)
//! requires the service.
//!
//! **Probe connections follow the server's rules (gRFC A8).** The checker never adds an HTTP/2
//! keepalive of its own to the endpoint template's: C-core, grpc-go and grpc-java servers allow
//! a ping without data only every 5 minutes by default and close connections that ping more
//! with `GOAWAY ENHANCE_YOUR_CALM "too_many_pings"`. When a server does (to a keepalive of the
//! template's, or [`probe_keepalive`](HealthConfig::probe_keepalive)), the checker doubles that
//! target's interval for its new connections. A connection the server closes — any `GOAWAY`,
//! a max connection age or idleness — is replaced at once, and the target keeps its verdict:
//! only evidence (a refused reconnect, a status other than `SERVING`, no answer within the
//! timeout) makes it unhealthy. A quiet `Watch` stream is verified with a `Check` on its
//! connection every interval — a call with data, which no server counts as an abusive ping.
//! Plaintext probe connections count as connected once the server has sent its HTTP/2
//! settings, so a black hole is a connection failure, and a port that answers HTTP/1 or TLS
//! says so in the target's reason.
//!
//! **Probe connections.** The `Check`s of a target named by its `http://` URI with the default
//! [endpoint template](HealthConfig::endpoint_template) — no `Endpoint` of its own, no
//! connector (the target's or the checker's), no HTTP/2 keepalive
//! ([`probe_keepalive`](HealthConfig::probe_keepalive)) — run on an HTTP/2 connection of the
//! checker's own, on the `h2` crate with hyper's client settings: each `Check` is sent from the
//! target's task, its `HEADERS` and `DATA` handed to the connection together (so that they
//! normally leave in one write), and its answer is read there. The checker knows every setting
//! of such an endpoint (tonic's defaults), so nothing of the user's is left out; at 1,000
//! targets it costs about 30 % less CPU and a third less memory than a tonic `Channel` per
//! target (`BENCHMARKS.md`). Its requests say `user-agent: health-layer/<version>`. Every other
//! probe — of a target given an [`Endpoint`](tonic::transport::Endpoint) or a template of the
//! user's (whose settings cannot be read back), over TLS, through a connector, with a
//! keepalive, and every `Watch` stream — runs on a tonic `Channel` made from its endpoint, as
//! the endpoint says.
//!
//! **Schedule.** Every target has its own next-check instant on tokio's monotonic clock (no
//! global tick: a black-holed target never delays another). Defaults: every 30 s, 5 s
//! timeout; after n failures in a row the next check waits `interval × 2^(n−1)`, at most
//! 300 s (a [`Backoff`] too); one success resets. With [`jitter`](HealthConfig::jitter), each
//! wait is drawn from its band and then put on a checker-wide grid of instants within that band
//! (a step of at most 100 ms), so that checks drawn close together share one wake-up; without
//! jitter, instants are exact. Interval 0 means one check when a target is
//! added, then on-demand checks only. At most
//! [`max_concurrent_probes`](HealthConfig::max_concurrent_probes) probes run at once.
//!
//! **Configuration** is a plain [`HealthConfig`] with setters, validated once when the checker
//! is built; with the cargo feature `serde` it also deserializes from a document (TOML, JSON,
//! ...), durations in humantime form.
//!
//! # Example
//!
//! A gate under `ServiceBuilder`, with a custom probe so that the example needs no server:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use health_layer::{HealthChecker, ProbeMode};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let checker = HealthChecker::builder()
//!     .mode(ProbeMode::custom(|target: Arc<str>| async move {
//!         if target.as_ref() == "b2" { Err("b2 is down".into()) } else { Ok(()) }
//!     }))
//!     .interval(Duration::from_secs(10))
//!     .build()?;
//! checker.start(["b1", "b2"])?;
//! assert!(checker.wait_until_ready(Duration::from_secs(1)).await);
//! assert_eq!(checker.is_healthy("b1")?, true);
//! assert_eq!(checker.is_healthy("b2")?, false);
//! assert_eq!(
//!     checker.status("b2").unwrap().last_error.as_deref(),
//!     Some("b2 is down"),
//! );
//!
//! let mut b1 = ServiceBuilder::new()
//!     .layer(checker.layer("b1").unwrap())
//!     .service_fn(|x: u32| async move { Ok::<_, std::convert::Infallible>(x * 2) });
//! assert_eq!(b1.ready().await?.call(21).await?, 42);
//!
//! // b2's gate stays shut: `poll_ready` is pending, not an error.
//! let mut b2 = ServiceBuilder::new()
//!     .layer(checker.layer("b2").unwrap())
//!     .service_fn(|x: u32| async move { Ok::<_, std::convert::Infallible>(x * 2) });
//! assert!(tokio::time::timeout(Duration::from_millis(50), b2.ready()).await.is_err());
//!
//! checker.stop().await;
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

mod checker;
mod config;
pub mod discover;
pub mod error;
mod layer;
pub mod probe;
mod service;

pub use checker::{HealthChecker, Target, TargetStatus};
pub use config::{HealthConfig, ProbeMode};
pub use discover::{HealthFilter, drive_balance_channel};
pub use error::{
    ConfigError, InvalidTarget, NotRunning, NotRunningCause, RefusedBecause, StartError,
    TargetRefused,
};
pub use layer::HealthLayer;
pub use service::Health;

#[doc(no_inline)]
pub use endpoint_state::{Backoff, CardEvent, EndpointCard, HealthVerdict, LineState};

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
//!   transitions, [`on_transition`](HealthChecker::on_transition) callbacks.
//!
//! **Probes** ([`ProbeMode`]): `grpc.health.v1.Health/Check` with a deadline (default);
//! `Watch`, one stream per target whose every message is a verdict at once (a backend set to
//! `NOT_SERVING` is gated within a millisecond), re-subscribing with backoff when the stream
//! breaks; an HTTP GET judged by a predicate (cargo feature `http-probe`, on by default); or
//! your own. The service name defaults to `""`,
//! the whole server.
//!
//! **Evidence only.** A target is healthy only after a probe saw it serving: until then its
//! card says [`HealthVerdict::Unknown`], which shuts
//! the gate. Asking about a target that no running checker will ever probe is an explicit
//! [`NotRunning`] error, not "unhealthy". `UNIMPLEMENTED` (a server without the health service)
//! is unhealthy unless [`unimplemented_is_healthy`](HealthConfig::unimplemented_is_healthy).
//!
//! **Schedule.** Every target has its own next-check instant on tokio's monotonic clock (no
//! global tick: a black-holed target never delays another). Defaults: every 30 s, 5 s
//! timeout; after n failures in a row the next check waits `interval × 2^(n−1)`, at most
//! 300 s; one success resets. Interval 0 means on-demand checks only. At most
//! [`max_concurrent_probes`](HealthConfig::max_concurrent_probes) probes run at once.
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

mod checker;
mod config;
pub mod discover;
pub mod error;
mod layer;
pub mod probe;
mod schedule;
mod service;

pub use checker::{HealthChecker, Target, TargetStatus, Transition};
pub use config::{HealthConfig, ProbeMode, WatchBackoff};
pub use discover::{HealthFilter, drive_balance_channel};
pub use error::{
    ConfigError, InvalidTarget, NotRunning, NotRunningCause, RefusedBecause, StartError,
    TargetRefused,
};
pub use layer::HealthLayer;
pub use service::Health;

#[doc(no_inline)]
pub use endpoint_state::{EndpointCard, HealthVerdict};

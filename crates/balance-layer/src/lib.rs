//! A load balancer over [`tower::discover`] that picks, for every request, one endpoint that is
//! both **eligible** — its [`EndpointCard`](endpoint_state::EndpointCard) admits calls — and
//! **ready**, in O(1), and that is cheap to clone: no `Buffer`, no worker task on the request
//! path.
//!
//! # How it works
//!
//! * **An exact eligible set.** A small background task, spawned when the balancer is built and
//!   stopped when its last clone is dropped, drives discovery (so endpoints come and go even
//!   while no request is in flight), watches every endpoint's card (health verdict,
//!   quarantine, breaker), and wakes at the next quarantine or open-breaker deadline. After
//!   each batch of changes it publishes a new immutable snapshot of the eligible endpoints,
//!   swapped atomically. Passive signals — quarantine, open breakers — narrow the choice and
//!   never empty it: when every endpoint that health admits is shut by them alone, they are
//!   ignored (the one rule of [`endpoint_state::peers`], which each endpoint's own quarantine
//!   and breaker gates also follow, so the balancer never picks an endpoint whose gate stays
//!   shut). Cards in no peer set get the balancer's own, so breakers under it never cut it
//!   off either.
//! * **O(1) picks, no allocation.** A request reads the snapshot without a lock, chooses a
//!   position with the strategy, double-checks that endpoint's card (one atomic load; a change
//!   is honoured at once, before the snapshot is rebuilt), clones the endpoint's service and
//!   polls it ready. A clone of the balancer reserves at most one endpoint in `poll_ready`,
//!   and `call` uses it. If the endpoint is not ready, up to three others are tried; then
//!   the clone waits, woken by any of those becoming ready or by the next change of the
//!   eligible set. (Pick-first tries only its one endpoint and waits for it; ring hash
//!   chooses in `call`, where the request's hash is known, and its response future waits
//!   for that endpoint to be ready.)
//! * **Strategies.** [`Strategy::RoundRobin`] (default; exact shares: 60 calls over 3
//!   endpoints are 20/20/20), [`Strategy::Random`] (seedable), [`Strategy::Weighted`]
//!   (weights by target), least-loaded: [`Strategy::LeastInFlight`] (power of two choices on
//!   calls in flight) and [`Strategy::PeakEwma`] (power of two choices on latency), and
//!   gRPC's policies: [`Strategy::PickFirst`] (one endpoint for every call, sticky, the next
//!   on failure) and [`Strategy::RingHash`] (consistent hashing on the request's
//!   [`RequestHash`] or a header, through [`RequestHashKey`]).
//!
//!   | strategy | in a file | chooses | a pick costs |
//!   |---|---|---|---|
//!   | [`RoundRobin`](Strategy::RoundRobin) | `round_robin` (default) | each eligible endpoint in turn | O(1) |
//!   | [`Random`](Strategy::Random) | `random` | uniformly at random | O(1) |
//!   | [`Weighted`](Strategy::Weighted) | `weighted`, `[weights]` | in proportion to weights | O(1) |
//!   | [`LeastInFlight`](Strategy::LeastInFlight) | `least_in_flight` | the less busy of two | O(1) |
//!   | [`PeakEwma`](Strategy::PeakEwma) | `peak_ewma`, `[peak_ewma]` | the faster of two | O(1) |
//!   | [`PickFirst`](Strategy::PickFirst) | `pick_first`, `[pick_first]` | the first eligible in order, sticky | O(1) |
//!   | [`RingHash`](Strategy::RingHash) | `ring_hash`, `[ring_hash]` | by the request's hash, on a ring | O(1) |
//! * **Nothing eligible.** While some endpoint is *connecting* (its card has no health
//!   verdict yet) the call waits for the first verdicts, up to its own deadline
//!   ([`RequestDeadline`]) and [`BalanceConfig::connecting_wait`] (5 s), as gRPC queues calls
//!   while a channel connects. A call whose `poll_ready` found nothing but whose targets
//!   became eligible before `call` (the first verdicts landing in between) picks again, as
//!   `poll_ready` would have. Otherwise it fails at once with [`error::NoHealthyTargets`],
//!   which lists every target and why it was skipped (from the cards) and which a generated
//!   tonic client receives as `UNAVAILABLE`. With [`BalanceConfig::wait_for_ready`] the call
//!   waits instead, up to its own deadline; a request's [`WaitForReady`] extension says the
//!   same for one call, either way.
//!
//! The configuration is a plain [`BalanceConfig`], validated when the balancer is built (an
//! invalid one is an [`endpoint_state::ConfigError`] naming the field and the value). With the
//! `serde` feature it is also read from a configuration file, under the names it has here
//! (`strategy = "weighted"`, `[weights]`, `[peak_ewma]`, `[pick_first]`, `[ring_hash]`,
//! `wait_for_ready`, `max_wait = "2s"`, `connecting_wait`, `seed`); unknown fields are
//! refused.
//!
//! Endpoints are any `Service + Clone + HasCard`: every layer of the kit implements
//! [`HasCard`](endpoint_state::HasCard). Plain services without a card (a bare tonic
//! `Channel`) go in [`NoCard`] (or a whole discovery stream in [`WithoutCards`]): always
//! eligible, still picked only when ready.
//!
//! # Example
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::convert::Infallible;
//! use balance_layer::{BalanceConfig, BalanceLayer, NoCard};
//! use tower::discover::Change;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! // Three endpoints that answer with their own name; discovery is a stream of changes
//! // (here a fixed list; a channel or a DNS watcher in real life).
//! let endpoints = ["a", "b", "c"].map(|name| {
//!     let svc = tower::service_fn(move |_req: http::Request<()>| async move {
//!         Ok::<_, Infallible>(name)
//!     });
//!     Ok::<_, Infallible>(Change::Insert(name, NoCard::new(svc)))
//! });
//! let discover = futures_util::stream::iter(endpoints);
//!
//! let mut svc = ServiceBuilder::new()
//!     .concurrency_limit(64)
//!     .layer(BalanceLayer::new(BalanceConfig::new())?) // round-robin
//!     .service(discover);
//!
//! let mut seen = BTreeMap::new();
//! for _ in 0..60 {
//!     let name = svc.ready().await?.call(http::Request::new(())).await?;
//!     *seen.entry(name).or_insert(0) += 1;
//! }
//! assert_eq!(seen, BTreeMap::from([("a", 20), ("b", 20), ("c", 20)]));
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

mod alias;
mod cards;
mod config;
mod deadline;
mod dispatch;
mod driver;
pub mod error;
pub mod future;
mod hash;
mod inflight;
mod layer;
mod picker;
mod ring;
mod service;
mod shared;

pub use cards::{NoCard, PlainEndpoint, WithCard, WithoutCards};
pub use config::{BalanceConfig, PeakEwma, Strategy, Weights};
pub use deadline::{RequestDeadline, WaitForReady, grpc_timeout};
pub use error::NoHealthyTargets;
pub use hash::{RequestHash, RequestHashKey};
pub use layer::BalanceLayer;
pub use service::Balance;

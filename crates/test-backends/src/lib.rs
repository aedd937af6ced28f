//! Real tonic test servers on loopback, for grpc-client-kit's integration tests, examples and
//! benchmarks.
//!
//! Each [`Backend`] is a tonic server on `127.0.0.1` (a free port, kept across restarts) serving
//! `grpc.health.v1.Health` (from `tonic-health`) and a small test service,
//! `gck.test.v1.TestService` ([`pb`]), whose every reply names the backend. A backend handle can
//! flip health, slow calls down, make them fail with a chosen code, stop abruptly (RST) or
//! gracefully, restart on the same port, or turn into a [`BlackHole`] (accepts TCP, never
//! answers); it counts calls, health checks and connections and records the last request's
//! headers. [`Backend::start_with`] takes [`ServerOptions`]: a maximum connection age (and
//! grace), or no health service at all.
//!
//! A [`PingGuard`] in front of any backend enforces a gRPC server's ping policy (GOAWAY
//! `ENHANCE_YOUR_CALM` `too_many_pings`) and records every client PING.
//!
//! What the crates' tests and benchmarks share lives here once: [`fixture`] (channels to a
//! backend, a refused connection, a local timeout), [`synthetic`] (in-process replies and a
//! channel that answers at once) and [`bench`](mod@bench) (runtime, backends, concurrent
//! callers).
//!
//! ```
//! use std::time::Duration;
//! use test_backends::Backends;
//! use test_backends::pb::{Ping, test_service_client::TestServiceClient};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backends = Backends::start(2).await?;
//! let mut client = TestServiceClient::connect(backends[1].uri()).await?;
//!
//! let pong = client.unary(Ping { payload: "hi".into() }).await?.into_inner();
//! assert_eq!((pong.backend.as_str(), pong.payload.as_str()), ("b1", "hi"));
//!
//! backends[1].fail_next(1, tonic::Code::Unavailable);
//! let status = client.unary(Ping::default()).await.unwrap_err();
//! assert_eq!(status.code(), tonic::Code::Unavailable);
//! assert_eq!(backends[1].hits(), 2);
//!
//! backends[1].set_delay(Duration::from_millis(10));
//! backends[1].set_serving(false).await; // health of "" is now NOT_SERVING
//!
//! backends[1].stop().await; // connections reset, port refuses connections
//! assert!(client.unary(Ping::default()).await.is_err());
//! backends[1].restart().await?; // same port, health state kept
//! # Ok(())
//! # }
//! ```

mod backend;
pub mod bench;
mod black_hole;
mod client_stream;
mod conn;
pub mod fixture;
mod freeze;
mod html;
mod mute;
pub mod pb;
mod ping_guard;
mod service;
mod syn_drop;
pub mod synthetic;
pub mod wire;

pub use backend::{Backend, Backends, Mode, ServerOptions};
pub use black_hole::BlackHole;
pub use client_stream::{UPLOAD_PATH, upload};
pub use freeze::FreezeProxy;
pub use html::{HTML_PAGE, HtmlServer};
pub use mute::MuteServer;
pub use ping_guard::{PingGuard, PingPolicy};
pub use service::CALL_ID_HEADER;
pub use syn_drop::SynDrop;
#[doc(no_inline)]
pub use tonic_health::ServingStatus;

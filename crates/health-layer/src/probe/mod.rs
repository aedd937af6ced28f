//! Probes: one look at a target, and what it found.
//!
//! The checker runs these on the probe's own channel, never on an application channel. They
//! are also usable alone: [`check_once`] connects to one endpoint, asks
//! `grpc.health.v1.Health/Check` once and says what it saw, with a [`ProbeError`] that keeps
//! connection failures ([`ProbeFailure::Connect`]) apart from RPC failures
//! ([`ProbeFailure::Rpc`]) — what a `grpc_health_probe`-style command needs for its exit code.
//!
//! ```no_run
//! use std::time::Duration;
//! use health_layer::probe::{self, ServingStatus};
//! use tonic::transport::Endpoint;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let endpoint = Endpoint::from_static("http://127.0.0.1:50051")
//!     .connect_timeout(Duration::from_secs(1));
//! match probe::check_once(&endpoint, "", Duration::from_secs(1)).await {
//!     Ok(ServingStatus::Serving) => println!("serving"),
//!     Ok(other) => println!("not serving: {}", other.as_str_name()),
//!     Err(e) if e.is_connect() => println!("cannot connect: {e}"),
//!     Err(e) => println!("health RPC failed: {e}"),
//! }
//! # }
//! ```

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use endpoint_state::BoxError;

mod check_call;
mod connect;
mod error;
pub mod frames;
mod grpc;
#[cfg(feature = "http-probe")]
mod http_probe;
mod link;

pub(crate) use connect::Via;
pub use error::{ProbeError, ProbeFailure, status_text};
pub use grpc::{
    ServingStatus, check_on, check_once, check_with, connect, local_timeout_is_deadline,
    serving_status,
};
#[cfg(feature = "http-probe")]
pub use http_probe::{HttpAnswer, HttpProbe};
pub(crate) use link::{Connector, Dial, ProbeLink, Verifying};

/// The future a [`CustomProbe`] returns.
pub type ProbeFuture = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'static>>;

/// Any probe the user writes: given the target's name, succeed when it is healthy.
///
/// The checker bounds it by the probe timeout ([`ProbeFailure::TimedOut`]). An error that is a
/// [`ProbeError`] is kept as it is (so a custom probe may call [`check_on`]); any other error
/// becomes [`ProbeFailure::Custom`]. A probe that panics is a failed probe too (the panic is
/// caught and logged, its message kept as the reason), and its target keeps being probed.
///
/// ```
/// use health_layer::probe::CustomProbe;
/// let probe = CustomProbe::new(|target: std::sync::Arc<str>| async move {
///     if target.ends_with(":1") { Err("port 1 is never healthy".into()) } else { Ok(()) }
/// });
/// # let _ = probe;
/// ```
#[derive(Clone)]
pub struct CustomProbe {
    f: Arc<dyn Fn(Arc<str>) -> ProbeFuture + Send + Sync>,
}

impl CustomProbe {
    /// A probe from an async function of the target's name.
    pub fn new<F, Fut>(f: F) -> Self
    where
        F: Fn(Arc<str>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        CustomProbe {
            f: Arc::new(move |target| Box::pin(f(target))),
        }
    }

    pub(crate) fn call(&self, target: Arc<str>) -> ProbeFuture {
        (self.f)(target)
    }
}

impl fmt::Debug for CustomProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomProbe").finish_non_exhaustive()
    }
}

/// Runs a custom probe with a time limit, turning its error into a [`ProbeError`].
///
/// A probe that panics — while it is made or while it runs — is a failed probe: the panic is
/// caught, logged at `error` and kept as the reason (`the custom probe panicked: ...`), and the
/// target keeps being probed on its schedule.
pub(crate) async fn run_custom(
    probe: &CustomProbe,
    target: &Arc<str>,
    limit: Duration,
) -> Result<(), ProbeError> {
    let made = catch_unwind(AssertUnwindSafe(|| probe.call(target.clone())));
    let result = match made {
        Ok(future) => tokio::time::timeout(limit, CatchPanic { inner: future }).await,
        Err(payload) => Ok(Err(payload)),
    };
    match result {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(match e.downcast::<ProbeError>() {
            Ok(probe_error) => *probe_error,
            Err(other) => ProbeError::new(target.clone(), ProbeFailure::Custom(other)),
        }),
        Ok(Err(payload)) => {
            let message = panic_message(&*payload);
            tracing::error!(backend = %target, panic = %message, "custom health probe panicked: counted as a failed probe");
            Err(ProbeError::new(
                target.clone(),
                ProbeFailure::Custom(format!("the custom probe panicked: {message}").into()),
            ))
        }
        Err(_) => Err(ProbeError::new(
            target.clone(),
            ProbeFailure::TimedOut { after: limit },
        )),
    }
}

/// A future whose panic is caught and returned as its payload.
struct CatchPanic<F> {
    inner: F,
}

impl<F: Future + Unpin> Future for CatchPanic<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.inner;
        match catch_unwind(AssertUnwindSafe(|| Pin::new(inner).poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(out)) => Poll::Ready(Ok(out)),
            Err(payload) => Poll::Ready(Err(payload)),
        }
    }
}

/// The text of a panic's payload (a `&str` or a `String`; anything else is named as such).
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

//! What the benchmarks of every crate set up alike: the runtime they run on, backends on it, and
//! a closed loop of concurrent callers.
//!
//! ```
//! use test_backends::bench;
//! use test_backends::pb::{Ping, test_service_client::TestServiceClient};
//!
//! let rt = bench::runtime(2);
//! let backends = bench::backends(&rt, 1);
//! let client = rt.block_on(async {
//!     TestServiceClient::connect(backends[0].uri()).await.unwrap()
//! });
//! // 40 calls over 4 callers, each on its own clone of the client.
//! let took = rt.block_on(bench::concurrent(4, 40, |calls| {
//!     let mut client = client.clone();
//!     async move {
//!         for _ in 0..calls {
//!             client.unary(Ping::default()).await.unwrap();
//!         }
//!     }
//! }));
//! assert!(took > std::time::Duration::ZERO);
//! ```

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;

use crate::Backends;

/// A multi-thread runtime with `workers` worker threads, every driver enabled.
///
/// # Panics
///
/// If the runtime cannot be built.
pub fn runtime(workers: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// `n` backends ([`Backends::start`]) serving on `rt`.
///
/// # Panics
///
/// If they cannot start.
pub fn backends(rt: &Runtime, n: usize) -> Backends {
    rt.block_on(Backends::start(n)).expect("test backends")
}

/// Wall time for `iters` calls shared by `callers` concurrent tasks: each task is the future
/// `caller(calls)` makes (its own clone of the service, and a loop of `calls` calls), spawned on
/// the current runtime. When `iters` does not divide evenly, every task makes one more and the
/// time is scaled back to `iters` calls.
///
/// # Panics
///
/// Outside a Tokio runtime, or if a task panics.
pub async fn concurrent<F, Fut>(callers: u64, iters: u64, mut caller: F) -> Duration
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let per_task = iters.div_ceil(callers);
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|_| tokio::spawn(caller(per_task)))
        .collect();
    for task in tasks {
        task.await.expect("a caller panicked");
    }
    let made = per_task * callers;
    if made == 0 {
        return start.elapsed();
    }
    start.elapsed().mul_f64(iters as f64 / made as f64)
}

//! Zero heap allocations per pick (and per clone), counted by a global allocator.
//!
//! The counting allocator sees every thread of the process, so this test runs without the test
//! harness (`harness = false` in Cargo.toml): libtest runs a test on a thread of its own while
//! its main thread goes on (setting up its wait for the result: a few allocations, 900 bytes),
//! and those landed in the first counting window now and then (`round_robin over 3 endpoints:
//! 4 allocations`). Here `main` is the only thread — the runtime is a current-thread one, and
//! the test checks, before each window, that no other thread exists — so whatever is counted
//! was allocated by the picks themselves.

mod support;

use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use balance_layer::{
    Balance, BalanceConfig, PeakEwma, RequestDeadline, RequestHash, RequestHashKey, Strategy,
    Weights,
};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use support::{Counted, Req, list_counted};
use tower::Service;

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

fn strategies() -> Vec<Strategy> {
    vec![
        Strategy::RoundRobin,
        Strategy::Random,
        Strategy::Weighted(Weights::new().weight("b0", 1.0).weight("b1", 2.0)),
        Strategy::LeastInFlight,
        Strategy::PeakEwma(PeakEwma::new()),
        Strategy::pick_first(),
        Strategy::PickFirst {
            shuffle_address_list: true,
        },
        // Requests without a hash: a random position on the ring.
        Strategy::ring_hash(),
        Strategy::RingHash {
            min_ring_size: 1024,
            max_ring_size: 4096,
            request_hash_header: Some("x-user-id".into()),
        },
    ]
}

/// A request with its own hash.
#[derive(Debug, Clone, Copy)]
struct Keyed(u64);

impl RequestDeadline for Keyed {
    fn time_budget(&self) -> Option<Duration> {
        None
    }
}

impl RequestHashKey for Keyed {
    fn request_hash(&self, _header: Option<&http::HeaderName>) -> Option<u64> {
        Some(self.0)
    }
}

/// One pick and call of `req`, polled by hand; both must complete at once.
fn one_with<R, S: Service<R>>(svc: &mut S, cx: &mut Context<'_>, req: R) {
    assert!(matches!(svc.poll_ready(cx), Poll::Ready(Ok(()))));
    let fut = pin!(svc.call(req));
    assert!(fut.poll(cx).is_ready());
}

fn one<S: Service<Req>>(svc: &mut S, cx: &mut Context<'_>) {
    one_with(svc, cx, Req::default());
}

/// The threads of this process (Linux; elsewhere, `None`).
fn threads() -> Option<usize> {
    std::fs::read_dir("/proc/self/task").ok().map(|d| d.count())
}

/// Counts what `f` allocates (and reallocates), with no other thread alive.
fn counted(what: &str, f: impl FnOnce()) -> (usize, usize) {
    if let Some(n) = threads() {
        assert_eq!(n, 1, "{what}: another thread would be counted too");
    }
    let region = Region::new(GLOBAL);
    f();
    let change = region.change();
    (change.allocations, change.reallocations)
}

fn no_allocation_per_pick_or_clone() {
    // A current-thread runtime that is never yielded to during the measurement: the
    // background task does not run, and nothing else allocates behind our back.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for n in [3, 1_000] {
            for strategy in strategies() {
                let name = strategy.name();
                let eps: Vec<Counted> = (0..n).map(|i| Counted::carded(&format!("b{i}"))).collect();
                let config = BalanceConfig::new().strategy(strategy.clone()).seed(3);
                let mut balance = Balance::new(list_counted(&eps), config).unwrap();
                let cx = &mut Context::from_waker(Waker::noop());

                // Warm up (thread-local slots of the snapshot swap, first uses).
                for _ in 0..100 {
                    one(&mut balance, cx);
                }

                let picks = counted(name, || {
                    for _ in 0..10_000 {
                        one(&mut balance, cx);
                    }
                });
                assert_eq!(picks, (0, 0), "{name} over {n} endpoints: {picks:?}");

                let clones = counted(name, || {
                    for _ in 0..1_000 {
                        let mut clone = balance.clone();
                        one(&mut clone, cx);
                    }
                });
                assert_eq!(
                    clones,
                    (0, 0),
                    "{name} clone over {n} endpoints: {clones:?}"
                );
                let mut calls = 11_100;

                if let Strategy::RingHash {
                    request_hash_header,
                    ..
                } = &strategy
                {
                    // Requests with their own hash, and (with a header configured) requests
                    // whose header is hashed: made before the window (a request's headers
                    // are allocated by whoever builds it), sent inside it.
                    let mut keyed = Balance::new(
                        list_counted(&eps),
                        BalanceConfig::new().strategy(strategy.clone()),
                    )
                    .unwrap();
                    one_with(&mut keyed, cx, Keyed(0));
                    let hashed = counted(name, || {
                        for k in 0..1_000 {
                            one_with(&mut keyed, cx, Keyed(RequestHash::of(&[k as u8]).0));
                        }
                    });
                    assert_eq!(
                        hashed,
                        (0, 0),
                        "{name} keyed over {n} endpoints: {hashed:?}"
                    );
                    calls += 1_001;
                    if let Some(header) = request_hash_header {
                        let mut requests: Vec<http::Request<()>> = (0..1_000)
                            .map(|k| {
                                http::Request::builder()
                                    .header(header, format!("user-{k}"))
                                    .body(())
                                    .unwrap()
                            })
                            .collect();
                        let mut by_header = Balance::new(
                            list_counted(&eps),
                            BalanceConfig::new().strategy(strategy.clone()),
                        )
                        .unwrap();
                        one_with(&mut by_header, cx, http::Request::new(()));
                        let headers = counted(name, || {
                            while let Some(req) = requests.pop() {
                                one_with(&mut by_header, cx, req);
                            }
                        });
                        assert_eq!(
                            headers,
                            (0, 0),
                            "{name} by header over {n} endpoints: {headers:?}"
                        );
                        calls += 1_001;
                    }
                }
                assert_eq!(eps.iter().map(Counted::hits).sum::<usize>(), calls);
            }
        }
    });
}

fn main() {
    no_allocation_per_pick_or_clone();
    println!("no allocation per pick or clone: ok");
}

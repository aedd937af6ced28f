//! Zero heap allocations per pick (and per clone), counted by a global allocator.
//!
//! This file holds a single test: the counting allocator sees every thread of the process, so
//! no other test may run beside it.

mod support;

use std::pin::pin;
use std::task::{Context, Poll, Waker};

use balance_layer::{Balance, BalanceConfig, PeakEwma, Strategy, Weights};
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
    ]
}

/// One pick and call, polled by hand; both must complete at once.
fn one<S: Service<Req>>(svc: &mut S, cx: &mut Context<'_>) {
    assert!(matches!(svc.poll_ready(cx), Poll::Ready(Ok(()))));
    let fut = pin!(svc.call(Req::default()));
    assert!(fut.poll(cx).is_ready());
}

#[test]
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
                let config = BalanceConfig::new().strategy(strategy).seed(3);
                let mut balance = Balance::new(list_counted(&eps), config).unwrap();
                let cx = &mut Context::from_waker(Waker::noop());

                // Warm up (thread-local slots of the snapshot swap, first uses).
                for _ in 0..100 {
                    one(&mut balance, cx);
                }

                let region = Region::new(GLOBAL);
                for _ in 0..10_000 {
                    one(&mut balance, cx);
                }
                let picks = region.change();
                assert_eq!(
                    (picks.allocations, picks.reallocations),
                    (0, 0),
                    "{name} over {n} endpoints: {picks:?}"
                );

                let region = Region::new(GLOBAL);
                for _ in 0..1_000 {
                    let mut clone = balance.clone();
                    one(&mut clone, cx);
                }
                let clones = region.change();
                assert_eq!(
                    (clones.allocations, clones.reallocations),
                    (0, 0),
                    "{name} clone over {n} endpoints: {clones:?}"
                );
                assert_eq!(eps.iter().map(Counted::hits).sum::<usize>(), 11_100);
            }
        }
    });
}

use std::future::Future;

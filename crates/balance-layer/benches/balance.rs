//! Time per pick + call through the balancer, against tower's p2c `Balance` over the same
//! endpoints, and end to end against tonic's `Channel::balance_list`.
//!
//! `cargo bench -p balance-layer --bench balance`
//!
//! * `pick_call/single/*`: one caller, no-op endpoints (always ready, answer at once), polled
//!   by hand: the cost of the balancer itself. Ours is shown with round-robin (the default),
//!   least-in-flight (the strategy comparable to p2c), pick-first, and ring hash (requests
//!   without a hash: a random position on the ring); tower's p2c over the same endpoints,
//!   each counted by `PendingRequests` (its load metric).
//! * `pick_call/throughput_4_tasks/*`: 4 tasks on a 2-worker runtime share one balancer:
//!   clones of ours, clones of a `Buffer` in front of tower's p2c (which is not `Clone`, so a
//!   tonic user would have to put it there; its one worker task makes every pick). The figure
//!   is **wall time per completed pick + call** across the 4 tasks (wall time ÷ calls, the
//!   inverse of the throughput), not the time one pick takes.
//! * `pick_call/per_pick_4_tasks/*`: the same 4 tasks, each timing its own calls: the figure
//!   is the mean time one pick + call takes as a caller sees it while the 4 run (the sum of
//!   every call's duration ÷ calls; each duration includes one clock read). For tower's p2c it
//!   includes the hop to the `Buffer`'s worker and back.
//! * `e2e_unary/*`: a generated tonic client's unary call over 3 real test backends on
//!   loopback: tonic's own `Channel::balance_list` against ours over 3 `Channel`s.

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use balance_layer::{
    Balance, BalanceConfig, RequestDeadline, RequestHashKey, Strategy, WithoutCards,
};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use endpoint_state::{EndpointCard, HasCard};
use test_backends::bench;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tower::discover::{Change, ServiceList};
use tower::load::{CompleteOnResponse, PendingRequests};
use tower::{Service, ServiceExt};

const SIZES: [usize; 3] = [3, 100, 10_000];
const CALLERS: u64 = 4;

/// The request of the no-op benchmarks.
#[derive(Debug, Clone, Copy, Default)]
struct Req;

impl RequestDeadline for Req {}
impl RequestHashKey for Req {}

/// An endpoint that is always ready and answers at once, with a state card.
#[derive(Clone)]
struct Noop {
    card: EndpointCard,
}

impl HasCard for Noop {
    fn card(&self) -> Option<&EndpointCard> {
        Some(&self.card)
    }
}

impl Service<Req> for Noop {
    type Response = ();
    type Error = Infallible;
    type Future = Ready<Result<(), Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Req) -> Self::Future {
        ready(Ok(()))
    }
}

fn noops(n: usize) -> Vec<Noop> {
    (0..n)
        .map(|i| Noop {
            card: EndpointCard::new(format!("10.0.{}.{}:50051", i / 250, i % 250)),
        })
        .collect()
}

type Ours = Balance<
    futures_util::stream::Iter<std::vec::IntoIter<Result<Change<usize, Noop>, Infallible>>>,
    Req,
>;

fn ours(n: usize, strategy: Strategy) -> Ours {
    let changes: Vec<_> = noops(n)
        .into_iter()
        .enumerate()
        .map(|(i, s)| Ok(Change::Insert(i, s)))
        .collect();
    Balance::new(
        futures_util::stream::iter(changes),
        BalanceConfig::new().strategy(strategy),
    )
    .unwrap()
}

type P2c = tower::balance::p2c::Balance<ServiceList<Vec<PendingRequests<Noop>>>, Req>;

/// Tower's p2c behind a `Buffer` (it is not `Clone`), as the concurrent groups share it.
type P2cBuffered = tower::buffer::Buffer<Req, <P2c as Service<Req>>::Future>;

fn tower_p2c(n: usize) -> P2c {
    let services = noops(n)
        .into_iter()
        .map(|s| PendingRequests::new(s, CompleteOnResponse::default()))
        .collect::<Vec<_>>();
    tower::balance::p2c::Balance::new(ServiceList::new(services))
}

/// One pick and call, polled by hand (everything is ready at once).
fn pick_call<S>(svc: &mut S, cx: &mut Context<'_>)
where
    S: Service<Req>,
    S::Error: std::fmt::Debug,
{
    match svc.poll_ready(cx) {
        Poll::Ready(Ok(())) => {}
        other => panic!("not ready: {other:?}", other = other.map(|r| r.map(|_| ()))),
    }
    let fut = pin!(svc.call(Req));
    assert!(fut.poll(cx).is_ready());
}

/// Our balancer in the comparisons: round-robin (the default), least-in-flight (the strategy
/// comparable to p2c), pick-first and ring hash.
fn ours_strategies() -> [(&'static str, Strategy); 4] {
    [
        ("ours_round_robin", Strategy::RoundRobin),
        ("ours_least_in_flight", Strategy::LeastInFlight),
        ("ours_pick_first", Strategy::pick_first()),
        ("ours_ring_hash", Strategy::ring_hash()),
    ]
}

fn single(c: &mut Criterion) {
    let rt = bench::runtime(2);
    let _guard = rt.enter();
    let mut g = c.benchmark_group("pick_call/single");
    for n in SIZES {
        let cx = &mut Context::from_waker(Waker::noop());
        for (name, strategy) in ours_strategies() {
            let mut svc = ours(n, strategy);
            g.bench_function(BenchmarkId::new(name, n), |b| {
                b.iter(|| pick_call(&mut svc, cx))
            });
        }
        let mut p2c = tower_p2c(n);
        // Let p2c take in discovery and poll its endpoints ready once.
        pick_call(&mut p2c, cx);
        g.bench_function(BenchmarkId::new("tower_p2c", n), |b| {
            b.iter(|| pick_call(&mut p2c, cx))
        });
    }
    g.finish();
}

/// `iters` calls split over `CALLERS` tasks, each on its own clone of `svc`; wall time.
fn run_concurrent<S>(rt: &tokio::runtime::Runtime, svc: &S, iters: u64) -> Duration
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug + Send,
{
    rt.block_on(bench::concurrent(CALLERS, iters, |calls| {
        let mut svc = svc.clone();
        async move {
            for _ in 0..calls {
                svc.ready().await.unwrap().call(Req).await.unwrap();
            }
        }
    }))
}

/// `iters` calls split over `CALLERS` tasks, each on its own clone of `svc` and timing each of
/// its calls: the sum of the calls' durations (criterion divides it by `iters`: the mean time
/// of one pick + call as a caller sees it while the tasks run).
fn run_per_pick<S>(rt: &tokio::runtime::Runtime, svc: &S, iters: u64) -> Duration
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug + Send,
{
    let per_task = iters.div_ceil(CALLERS);
    let total: Duration = rt.block_on(async {
        let tasks: Vec<_> = (0..CALLERS)
            .map(|_| {
                let mut svc = svc.clone();
                tokio::spawn(async move {
                    let mut spent = Duration::ZERO;
                    // One clock read per call: each call's time runs from the end of the last.
                    let mut last = Instant::now();
                    for _ in 0..per_task {
                        svc.ready().await.unwrap().call(Req).await.unwrap();
                        let now = Instant::now();
                        spent += now - last;
                        last = now;
                    }
                    spent
                })
            })
            .collect();
        let mut total = Duration::ZERO;
        for task in tasks {
            total += task.await.expect("a caller panicked");
        }
        total
    });
    let made = per_task * CALLERS;
    if made == 0 {
        return total;
    }
    total.mul_f64(iters as f64 / made as f64)
}

/// 4 tasks on 2 workers: throughput (wall time per completed call) and the time of one pick +
/// call as each task sees it.
fn concurrent(c: &mut Criterion) {
    let rt = bench::runtime(2);
    let _guard = rt.enter();
    type Run<S> = fn(&tokio::runtime::Runtime, &S, u64) -> Duration;
    let groups: [(&str, Run<Ours>, Run<P2cBuffered>); 2] = [
        (
            "pick_call/throughput_4_tasks",
            run_concurrent,
            run_concurrent,
        ),
        ("pick_call/per_pick_4_tasks", run_per_pick, run_per_pick),
    ];
    for (group, run_ours, run_p2c) in groups {
        let mut g = c.benchmark_group(group);
        for n in SIZES {
            for (name, strategy) in ours_strategies() {
                let svc = ours(n, strategy);
                g.bench_function(BenchmarkId::new(name, n), |b| {
                    b.iter_custom(|iters| run_ours(&rt, &svc, iters))
                });
            }
            let p2c = tower::buffer::Buffer::new(tower_p2c(n), 1024);
            g.bench_function(BenchmarkId::new("tower_p2c_buffered", n), |b| {
                b.iter_custom(|iters| run_p2c(&rt, &p2c, iters))
            });
        }
        g.finish();
    }
}

fn e2e(c: &mut Criterion) {
    let rt = bench::runtime(2);
    let backends = bench::backends(&rt, 3);
    let endpoint = |uri: String| tonic::transport::Endpoint::from_shared(uri).unwrap();

    let tonic_client = {
        let _guard = rt.enter();
        TestServiceClient::new(tonic::transport::Channel::balance_list(
            backends.uris().into_iter().map(endpoint),
        ))
    };
    let ours_client = {
        let _guard = rt.enter();
        let changes: Vec<Result<_, Infallible>> = backends
            .iter()
            .map(|b| {
                Ok(Change::Insert(
                    b.name().to_string(),
                    endpoint(b.uri()).connect_lazy(),
                ))
            })
            .collect();
        let balance = Balance::new(
            WithoutCards::new(futures_util::stream::iter(changes)),
            BalanceConfig::new(),
        )
        .unwrap();
        TestServiceClient::new(balance)
    };

    let mut g = c.benchmark_group("e2e_unary/3_backends");
    g.bench_function("tonic_balance_list", |b| {
        b.to_async(&rt).iter(|| {
            let mut client = tonic_client.clone();
            async move { client.unary(Ping::default()).await.unwrap() }
        })
    });
    g.bench_function("ours_round_robin", |b| {
        b.to_async(&rt).iter(|| {
            let mut client = ours_client.clone();
            async move { client.unary(Ping::default()).await.unwrap() }
        })
    });
    g.finish();
    drop((tonic_client, ours_client));
    rt.block_on(async {
        for b in backends.iter() {
            b.stop().await;
        }
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = single, concurrent, e2e
}
criterion_main!(benches);

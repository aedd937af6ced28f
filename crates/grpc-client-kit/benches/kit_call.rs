//! One unary call through the kit against the same call through tonic's `Channel::balance_list`
//! and a bare `Channel` to one backend, in the same run, over three in-process backends on
//! loopback.
//!
//! `cargo bench -p grpc-client-kit --bench kit_call`
//!
//! * `sequential`: one caller, one call per iteration (latency of a whole call).
//! * `concurrent_32`: 32 callers, each making its share of the iterations (throughput; the
//!   reported time is wall time per call).
//!
//! The backends run in the same process and the same runtime as the callers, so the figures
//! include the servers' own work; only the differences between the rows are the clients'.

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tonic::client::GrpcService;

mod support;

const CALLERS: u64 = 32;

async fn sequential<T>(mut client: TestServiceClient<T>, iters: u64) -> Duration
where
    T: GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let start = Instant::now();
    for _ in 0..iters {
        client
            .unary(Ping::default())
            .await
            .expect("the call succeeds");
    }
    start.elapsed()
}

async fn concurrent<T>(client: &TestServiceClient<T>, iters: u64) -> Duration
where
    T: GrpcService<tonic::body::Body> + Clone + Send + 'static,
    T::Future: Send,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    test_backends::bench::concurrent(CALLERS, iters, |calls| {
        let mut client = client.clone();
        async move {
            for _ in 0..calls {
                client
                    .unary(Ping::default())
                    .await
                    .expect("the call succeeds");
            }
        }
    })
    .await
}

fn calls(c: &mut Criterion) {
    let rt = test_backends::bench::runtime(2);
    let backends = test_backends::bench::backends(&rt, 3);
    let uris = backends.uris();

    let (kit, bare, list) = rt.block_on(support::kit_bare_and_list(&uris));
    let kit_client = TestServiceClient::new(kit.channel());
    let bare_client = TestServiceClient::new(bare);
    let list_client = TestServiceClient::new(list);

    let mut g = c.benchmark_group("sequential");
    g.bench_function("kit", |b| {
        b.to_async(&rt)
            .iter_custom(|iters| sequential(kit_client.clone(), iters))
    });
    g.bench_function("balance_list", |b| {
        b.to_async(&rt)
            .iter_custom(|iters| sequential(list_client.clone(), iters))
    });
    g.bench_function("bare_channel", |b| {
        b.to_async(&rt)
            .iter_custom(|iters| sequential(bare_client.clone(), iters))
    });
    g.finish();

    let mut g = c.benchmark_group("concurrent_32");
    g.bench_function("kit", |b| {
        b.to_async(&rt)
            .iter_custom(|iters| concurrent(&kit_client, iters))
    });
    g.bench_function("balance_list", |b| {
        b.to_async(&rt)
            .iter_custom(|iters| concurrent(&list_client, iters))
    });
    g.bench_function("bare_channel", |b| {
        b.to_async(&rt)
            .iter_custom(|iters| concurrent(&bare_client, iters))
    });
    g.finish();
    rt.block_on(kit.shutdown());
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sample_size(30);
    targets = calls
}
criterion_main!(benches);

//! Per-call overhead of a closed breaker against the bare service, and against
//! `tower-resilience`'s circuit breaker in the same run.
//!
//! `cargo bench -p breaker-layer --bench closed`
//!
//! Each iteration is one whole call: `poll_ready`, `call`, the response future, and the body
//! read to its end (one message, then `grpc-status: 0` in the trailers, as a unary gRPC reply
//! arrives), over an in-process service that answers at once — so the figures are the
//! middleware's own cost, not a network's.

use std::hint::black_box;
use std::time::Duration;

use breaker_layer::{BreakerConfig, BreakerLayer, Window};
use criterion::{Criterion, criterion_group, criterion_main};
use endpoint_state::{ClassifyLayer, EndpointCard, Outcome};
use test_backends::synthetic::{Immediate, call_now};
use tower::Layer;
use tower_resilience_circuitbreaker::CircuitBreakerLayer;

fn closed(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let bare = Immediate::ok();

    let ours = |config: BreakerConfig| {
        BreakerLayer::new(EndpointCard::new("10.0.0.7:50051"), config)
            .unwrap()
            .layer(bare.clone())
    };

    let mut g = c.benchmark_group("closed_call");
    let mut svc = bare.clone();
    g.bench_function("bare", |b| b.iter(|| call_now(&mut svc)));

    // The gRPC outcome classification alone (what every breaker call also pays).
    fn ignore(outcome: Outcome) {
        black_box(outcome);
    }
    let mut svc = ClassifyLayer::new(ignore as fn(Outcome)).layer(bare.clone());
    g.bench_function("classify_only", |b| b.iter(|| call_now(&mut svc)));

    let mut svc = ours(BreakerConfig::default());
    g.bench_function("breaker_layer/consecutive_5", |b| {
        b.iter(|| call_now(&mut svc))
    });
    let mut svc = ours(BreakerConfig::default().failure_rate(0.5, Window::Count(100), 20));
    g.bench_function("breaker_layer/count_window_100", |b| {
        b.iter(|| call_now(&mut svc))
    });
    let mut svc =
        ours(BreakerConfig::default().failure_rate(0.5, Window::Time(Duration::from_secs(10)), 20));
    g.bench_function("breaker_layer/time_window_10s", |b| {
        b.iter(|| call_now(&mut svc))
    });

    let mut svc = CircuitBreakerLayer::builder()
        .consecutive_failures(5)
        .build()
        .unwrap()
        .layer(bare.clone());
    g.bench_function("tower_resilience/consecutive_5", |b| {
        b.iter(|| call_now(&mut svc))
    });
    let mut svc = CircuitBreakerLayer::builder()
        .failure_rate_threshold(0.5)
        .sliding_window_size(100)
        .minimum_number_of_calls(20)
        .build()
        .unwrap()
        .layer(bare.clone());
    g.bench_function("tower_resilience/count_window_100", |b| {
        b.iter(|| call_now(&mut svc))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = closed
}
criterion_main!(benches);

//! Per-call overhead of the quarantine layer against the bare service.
//!
//! `cargo bench -p quarantine-layer --bench overhead`
//!
//! Each iteration is one whole unary call as a balancer drives it: `poll_ready`, `call`, the
//! response future polled to completion, and the body read to its trailers (`grpc-status: 0`).
//! The inner service answers at once (no I/O), so the difference is the layer's own cost:
//! the gate check, the classification of the outcome and its report to the group.

use std::hint::black_box;
use std::task::{Context, Waker};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use endpoint_state::EndpointCard;
use quarantine_layer::{OutlierEjection, Quarantine, QuarantineConfig, QuarantineGroup};
use test_backends::synthetic::{Immediate, call_now};
use tower::Service;

/// A group of three; returns the first endpoint's service and every card.
fn stack(config: QuarantineConfig) -> (Quarantine<Immediate>, QuarantineGroup, Vec<EndpointCard>) {
    let group = QuarantineGroup::new(config).unwrap();
    let cards: Vec<_> = ["b0", "b1", "b2"].map(EndpointCard::new).into();
    for card in &cards {
        group.add(card.clone());
    }
    let svc = Quarantine::new(Immediate::ok(), &group, cards[0].clone());
    (svc, group, cards)
}

fn calls(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();

    let mut g = c.benchmark_group("call");
    let mut bare = Immediate::ok();
    g.bench_function("bare", |b| b.iter(|| black_box(call_now(&mut bare))));

    // The core's classification alone, with a listener that does nothing: the part of the
    // layer's cost that any classifying layer pays.
    let mut classify =
        endpoint_state::Classify::new(Immediate::ok(), |o: endpoint_state::Outcome| {
            black_box(o);
        });
    g.bench_function("classify_only", |b| {
        b.iter(|| black_box(call_now(&mut classify)))
    });

    let (mut svc, _group, _cards) = stack(QuarantineConfig::default());
    g.bench_function("quarantine", |b| b.iter(|| black_box(call_now(&mut svc))));

    let policy = OutlierEjection::default().interval(Duration::from_secs(3600));
    let (mut svc, _group, _cards) =
        stack(QuarantineConfig::default().outlier_ejection(Some(policy)));
    g.bench_function("quarantine_with_outlier_ejection", |b| {
        b.iter(|| black_box(call_now(&mut svc)))
    });
    g.finish();

    let mut g = c.benchmark_group("poll_ready");
    // Every member quarantined: each poll finds no eligible peer (a scan of the group) and
    // ignores the quarantine.
    let (mut svc, group, cards) = stack(QuarantineConfig::default());
    for card in &cards {
        group
            .report_failure(card.target(), Some(Duration::from_secs(3600)))
            .unwrap();
    }
    let mut cx = Context::from_waker(Waker::noop());
    g.bench_function("quarantined_but_ignored", |b| {
        b.iter(|| black_box(Service::<http::Request<()>>::poll_ready(&mut svc, &mut cx).is_ready()))
    });
    // Quarantined with an eligible peer: shut; each poll re-checks the card and its witness.
    let (mut svc, group, _cards) = stack(QuarantineConfig::default());
    group
        .report_failure("b0", Some(Duration::from_secs(3600)))
        .unwrap();
    g.bench_function("quarantined_and_shut", |b| {
        b.iter(|| {
            black_box(Service::<http::Request<()>>::poll_ready(&mut svc, &mut cx).is_pending())
        })
    });
    g.finish();
}

criterion_group!(benches, calls);
criterion_main!(benches);

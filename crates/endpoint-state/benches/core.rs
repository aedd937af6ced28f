//! Costs on the request path: the classifying body wrapper against a bare body, and reading
//! a state card.
//!
//! `cargo bench -p endpoint-state --bench core`

use std::hint::black_box;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Buf;
use criterion::{Criterion, criterion_group, criterion_main};
use endpoint_state::{
    ClassifiedBody, EndpointCard, Gate, GateCheck, HealthVerdict, LineKind, Outcome,
};
use http::HeaderMap;
use http_body::{Body, Frame};
use test_backends::synthetic::Reply;

/// Read a body to its end, the way tonic's decoder does.
/// Read a body to its end, the way tonic's decoder does. The trailers are handed back so that
/// freeing them stays outside the measurement.
fn drain<B: Body>(body: B) -> (usize, Option<HeaderMap>) {
    let mut body = std::pin::pin!(body);
    let mut cx = Context::from_waker(Waker::noop());
    let (mut data, mut trailers) = (0, None);
    while let Poll::Ready(Some(Ok(frame))) = body.as_mut().poll_frame(&mut cx) {
        match frame.into_data() {
            Ok(d) => data += black_box(d).remaining(),
            Err(f) => trailers = f.into_trailers().ok(),
        }
    }
    (data, trailers)
}

fn body(c: &mut Criterion) {
    let mut ok = HeaderMap::new();
    ok.insert("grpc-status", "0".parse().unwrap());
    let mut unavailable = HeaderMap::new();
    unavailable.insert("grpc-status", "14".parse().unwrap());
    unavailable.insert("grpc-message", "backend%20going%20away".parse().unwrap());
    let seen = Arc::new(AtomicUsize::new(0));
    let listener = |seen: &Arc<AtomicUsize>| {
        let seen = seen.clone();
        move |o: Outcome| {
            black_box(&o);
            seen.fetch_add(1, Ordering::Relaxed);
        }
    };

    // A unary reply, built and read in each iteration (building it clones a header map, the
    // same cost in every variant).
    let mut g = c.benchmark_group("body/unary");
    g.bench_function("bare", |b| b.iter(|| drain(Reply::new(ok.clone(), 1))));
    g.bench_function("passthrough_control", |b| {
        b.iter(|| {
            drain(Passthrough {
                inner: Reply::new(ok.clone(), 1),
            })
        })
    });
    g.bench_function("classified_no_listener", |b| {
        b.iter(|| {
            drain(ClassifiedBody::new(
                Reply::new(ok.clone(), 1),
                None::<fn(Outcome)>,
            ))
        })
    });
    g.bench_function("classified_listener_ok", |b| {
        b.iter(|| {
            drain(ClassifiedBody::new(
                Reply::new(ok.clone(), 1),
                Some(listener(&seen)),
            ))
        })
    });
    g.bench_function("classified_listener_error", |b| {
        b.iter(|| {
            drain(ClassifiedBody::new(
                Reply::new(unavailable.clone(), 1),
                Some(listener(&seen)),
            ))
        })
    });
    g.finish();

    // A server stream of 1,000 messages: what the wrapper costs per frame.
    let mut g = c.benchmark_group("body/stream_1000");
    g.throughput(criterion::Throughput::Elements(1_000));
    g.bench_function("bare", |b| b.iter(|| drain(Reply::new(ok.clone(), 1_000))));
    g.bench_function("classified_no_listener", |b| {
        b.iter(|| {
            drain(ClassifiedBody::new(
                Reply::new(ok.clone(), 1_000),
                None::<fn(Outcome)>,
            ))
        })
    });
    g.bench_function("classified_listener_ok", |b| {
        b.iter(|| {
            drain(ClassifiedBody::new(
                Reply::new(ok.clone(), 1_000),
                Some(listener(&seen)),
            ))
        })
    });
    g.finish();
}

fn card(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let card = EndpointCard::new("10.0.0.7:50051");
    card.set_health(HealthVerdict::Healthy, Some("SERVING".into()));

    let mut g = c.benchmark_group("card");
    g.bench_function("health_admits", |b| {
        b.iter(|| black_box(&card).health_admits())
    });
    g.bench_function("health_verdict", |b| {
        b.iter(|| black_box(&card).health_verdict())
    });
    g.bench_function("is_eligible", |b| b.iter(|| black_box(&card).is_eligible()));
    g.bench_function("is_eligible_ignoring_quarantine", |b| {
        b.iter(|| black_box(&card).is_eligible_ignoring(&[LineKind::Quarantine]))
    });
    g.bench_function("snapshot", |b| b.iter(|| black_box(&card).snapshot()));
    g.bench_function("eligibility_summary_quarantined", |b| {
        let q = EndpointCard::new("10.0.0.8:50051");
        q.quarantine_for(
            Duration::from_secs(60),
            Some("UNAVAILABLE: connection refused".into()),
        );
        b.iter(|| black_box(&q).eligibility())
    });

    let mut gate = Gate::new(card.clone());
    let mut cx = Context::from_waker(Waker::noop());
    g.bench_function("gate_poll_open/open", |b| {
        b.iter(|| {
            gate.poll_open(&mut cx, |c| {
                if c.health_admits() {
                    GateCheck::Open
                } else {
                    GateCheck::Shut
                }
            })
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = body, card
}
criterion_main!(benches);

pin_project_lite::pin_project! {
    /// Control: a wrapper that does nothing, to tell wrapper cost from measurement artefacts.
    struct Passthrough<B> {
        #[pin]
        inner: B,
    }
}

impl<B: Body> Body for Passthrough<B> {
    type Data = B::Data;
    type Error = B::Error;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.project().inner.poll_frame(cx)
    }
}

//! Costs on the request path: the classifying body wrapper against a bare body, and reading
//! a state card.
//!
//! `cargo bench -p endpoint-state --bench core`

use std::convert::Infallible;
use std::hint::black_box;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use endpoint_state::{
    ClassifiedBody, EndpointCard, Gate, GateCheck, HealthVerdict, LineKind, Outcome,
};
use http::HeaderMap;
use http_body::{Body, Frame};

/// A unary gRPC reply as tonic's body yields it: one data frame, then the trailers.
struct Reply {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Reply {
    fn new(trailers: &HeaderMap) -> Self {
        Reply {
            data: Some(Bytes::from_static(b"\0\0\0\0\x05hello")),
            trailers: Some(trailers.clone()),
        }
    }
}

impl Body for Reply {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(d) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }
}

/// Read a body to its end, the way tonic's decoder does.
/// Read a body to its end, the way tonic's decoder does; the frames are returned so that
/// dropping them stays outside the measurement.
fn drain<B: Body>(body: B) -> Vec<Frame<B::Data>> {
    let mut body = std::pin::pin!(body);
    let mut cx = Context::from_waker(Waker::noop());
    let mut frames = Vec::with_capacity(2);
    while let Poll::Ready(Some(frame)) = body.as_mut().poll_frame(&mut cx) {
        frames.extend(frame.ok());
    }
    frames
}

fn body(c: &mut Criterion) {
    let mut ok = HeaderMap::new();
    ok.insert("grpc-status", "0".parse().unwrap());
    let mut unavailable = HeaderMap::new();
    unavailable.insert("grpc-status", "14".parse().unwrap());
    unavailable.insert("grpc-message", "backend%20going%20away".parse().unwrap());

    let mut g = c.benchmark_group("body");
    g.bench_function("bare", |b| b.iter(|| drain(Reply::new(&ok))));
    g.bench_function("classified/no_listener", |b| {
        b.iter(|| drain(ClassifiedBody::new(Reply::new(&ok), None::<fn(Outcome)>)))
    });
    let seen = Arc::new(AtomicUsize::new(0));
    let listener = |seen: &Arc<AtomicUsize>| {
        let seen = seen.clone();
        move |o: Outcome| {
            black_box(&o);
            seen.fetch_add(1, Ordering::Relaxed);
        }
    };
    g.bench_function("classified/listener_ok", |b| {
        b.iter_batched(
            || ClassifiedBody::new(Reply::new(&ok), Some(listener(&seen))),
            drain,
            BatchSize::SmallInput,
        )
    });
    g.bench_function("classified/listener_error", |b| {
        b.iter_batched(
            || ClassifiedBody::new(Reply::new(&unavailable), Some(listener(&seen))),
            drain,
            BatchSize::SmallInput,
        )
    });
    g.finish();
    assert!(seen.load(Ordering::Relaxed) > 0);
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

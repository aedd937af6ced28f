//! Per-call overhead of the quarantine layer against the bare service.
//!
//! `cargo bench -p quarantine-layer --bench overhead`
//!
//! Each iteration is one whole unary call as a balancer drives it: `poll_ready`, `call`, the
//! response future polled to completion, and the body read to its trailers (`grpc-status: 0`).
//! The inner service answers at once (no I/O), so the difference is the layer's own cost:
//! the gate check, the classification of the outcome and its report to the group.

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::hint::black_box;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use endpoint_state::EndpointCard;
use http::HeaderMap;
use http_body::{Body, Frame};
use quarantine_layer::{OutlierEjection, Quarantine, QuarantineConfig, QuarantineGroup};
use tower::Service;

/// A unary gRPC reply as tonic's body yields it: one data frame, then the trailers.
struct Reply {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
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

/// Answers every call at once with a successful unary reply.
#[derive(Clone)]
struct Bare {
    trailers: HeaderMap,
}

impl Bare {
    fn new() -> Self {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        Bare { trailers }
    }
}

impl Service<http::Request<()>> for Bare {
    type Response = http::Response<Reply>;
    type Error = Infallible;
    type Future = Ready<Result<http::Response<Reply>, Infallible>>;
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _req: http::Request<()>) -> Self::Future {
        ready(Ok(http::Response::new(Reply {
            data: Some(Bytes::from_static(b"\0\0\0\0\x05hello")),
            trailers: Some(self.trailers.clone()),
        })))
    }
}

/// One call, driven by hand with a no-op waker; returns how many frames the body had.
fn one_call<S, B>(svc: &mut S) -> usize
where
    S: Service<http::Request<()>, Response = http::Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
{
    let mut cx = Context::from_waker(Waker::noop());
    match svc.poll_ready(&mut cx) {
        Poll::Ready(Ok(())) => {}
        _ => panic!("not ready"),
    }
    let fut = pin!(svc.call(http::Request::new(())));
    let Poll::Ready(Ok(response)) = fut.poll(&mut cx) else {
        panic!("no reply")
    };
    let mut body = pin!(response.into_body());
    let mut frames = 0;
    while let Poll::Ready(Some(frame)) = body.as_mut().poll_frame(&mut cx) {
        frames += usize::from(frame.is_ok());
    }
    frames
}

/// A group of three; returns the first endpoint's service and every card.
fn stack(config: QuarantineConfig) -> (Quarantine<Bare>, QuarantineGroup, Vec<EndpointCard>) {
    let group = QuarantineGroup::new(config).unwrap();
    let cards: Vec<_> = ["b0", "b1", "b2"].map(EndpointCard::new).into();
    for card in &cards {
        group.add(card.clone());
    }
    let svc = Quarantine::new(Bare::new(), &group, cards[0].clone());
    (svc, group, cards)
}

fn calls(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();

    let mut g = c.benchmark_group("call");
    let mut bare = Bare::new();
    g.bench_function("bare", |b| b.iter(|| black_box(one_call(&mut bare))));

    // The core's classification alone, with a listener that does nothing: the part of the
    // layer's cost that any classifying layer pays.
    let mut classify = endpoint_state::Classify::new(Bare::new(), |o: endpoint_state::Outcome| {
        black_box(o);
    });
    g.bench_function("classify_only", |b| {
        b.iter(|| black_box(one_call(&mut classify)))
    });

    let (mut svc, _group, _cards) = stack(QuarantineConfig::default());
    g.bench_function("quarantine", |b| b.iter(|| black_box(one_call(&mut svc))));

    let policy = OutlierEjection::default().interval(Duration::from_secs(3600));
    let (mut svc, _group, _cards) =
        stack(QuarantineConfig::default().outlier_ejection(Some(policy)));
    g.bench_function("quarantine_with_outlier_ejection", |b| {
        b.iter(|| black_box(one_call(&mut svc)))
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
        b.iter(|| black_box(svc.poll_ready(&mut cx).is_ready()))
    });
    // Quarantined with an eligible peer: shut; each poll re-checks the card and its witness.
    let (mut svc, group, _cards) = stack(QuarantineConfig::default());
    group
        .report_failure("b0", Some(Duration::from_secs(3600)))
        .unwrap();
    g.bench_function("quarantined_and_shut", |b| {
        b.iter(|| black_box(svc.poll_ready(&mut cx).is_pending()))
    });
    g.finish();
}

criterion_group!(benches, calls);
criterion_main!(benches);

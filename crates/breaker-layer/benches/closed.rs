//! Per-call overhead of a closed breaker against the bare service, and against
//! `tower-resilience`'s circuit breaker in the same run.
//!
//! `cargo bench -p breaker-layer --bench closed`
//!
//! Each iteration is one whole call: `poll_ready`, `call`, the response future, and the body
//! read to its end (one message, then `grpc-status: 0` in the trailers, as a unary gRPC reply
//! arrives), over an in-process service that answers at once — so the figures are the
//! middleware's own cost, not a network's.

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use breaker_layer::{BreakerConfig, BreakerLayer, Window};
use bytes::{Buf, Bytes};
use criterion::{Criterion, criterion_group, criterion_main};
use endpoint_state::{ClassifyLayer, EndpointCard, Outcome};
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame};
use tower::{Layer, Service};
use tower_resilience_circuitbreaker::CircuitBreakerLayer;

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

/// The bare "channel": answers every call at once with an OK unary reply.
#[derive(Clone)]
struct Bare {
    trailers: HeaderMap,
}

impl Service<Request<()>> for Bare {
    type Response = Response<Reply>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Reply>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<()>) -> Self::Future {
        std::future::ready(Ok(Response::new(Reply {
            data: Some(Bytes::from_static(b"\0\0\0\0\x05hello")),
            trailers: Some(self.trailers.clone()),
        })))
    }
}

/// One whole call, driven by hand: everything here completes without waiting.
fn one_call<S, B>(svc: &mut S) -> usize
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
    B::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready(Ok(())) = svc.poll_ready(&mut cx) else {
        panic!("not ready")
    };
    let fut = std::pin::pin!(svc.call(Request::new(())));
    let Poll::Ready(Ok(resp)) = fut.poll(&mut cx) else {
        panic!("not answered")
    };
    let mut body = std::pin::pin!(resp.into_body());
    let mut n = 0;
    while let Poll::Ready(Some(frame)) = body.as_mut().poll_frame(&mut cx) {
        if let Ok(d) = frame.unwrap().into_data() {
            n += black_box(d).remaining();
        }
    }
    n
}

fn closed(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    let bare = Bare { trailers };

    let ours = |config: BreakerConfig| {
        BreakerLayer::new(EndpointCard::new("10.0.0.7:50051"), config)
            .unwrap()
            .layer(bare.clone())
    };

    let mut g = c.benchmark_group("closed_call");
    let mut svc = bare.clone();
    g.bench_function("bare", |b| b.iter(|| one_call(&mut svc)));

    // The gRPC outcome classification alone (what every breaker call also pays).
    fn ignore(outcome: Outcome) {
        black_box(outcome);
    }
    let mut svc = ClassifyLayer::new(ignore as fn(Outcome)).layer(bare.clone());
    g.bench_function("classify_only", |b| b.iter(|| one_call(&mut svc)));

    let mut svc = ours(BreakerConfig::default());
    g.bench_function("breaker_layer/consecutive_5", |b| {
        b.iter(|| one_call(&mut svc))
    });
    let mut svc = ours(BreakerConfig::default().failure_rate(0.5, Window::Count(100), 20));
    g.bench_function("breaker_layer/count_window_100", |b| {
        b.iter(|| one_call(&mut svc))
    });
    let mut svc =
        ours(BreakerConfig::default().failure_rate(0.5, Window::Time(Duration::from_secs(10)), 20));
    g.bench_function("breaker_layer/time_window_10s", |b| {
        b.iter(|| one_call(&mut svc))
    });

    let mut svc = CircuitBreakerLayer::builder()
        .consecutive_failures(5)
        .build()
        .unwrap()
        .layer(bare.clone());
    g.bench_function("tower_resilience/consecutive_5", |b| {
        b.iter(|| one_call(&mut svc))
    });
    let mut svc = CircuitBreakerLayer::builder()
        .failure_rate_threshold(0.5)
        .sliding_window_size(100)
        .minimum_number_of_calls(20)
        .build()
        .unwrap()
        .layer(bare.clone());
    g.bench_function("tower_resilience/count_window_100", |b| {
        b.iter(|| one_call(&mut svc))
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

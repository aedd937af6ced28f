//! Helpers shared by the tests: a scripted stand-in for a tonic `Channel` that answers as each
//! request's `x-reply` header says, and a one-line way to build an endpoint under quarantine.

#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use endpoint_state::classify::BoxError;
use endpoint_state::{EndpointCard, Gate, GateCheck, HasCard};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use quarantine_layer::{Quarantine, QuarantineGroup};
use tower::Service;

pub type Req = http::Request<()>;

/// A response body: its frames, in order.
#[derive(Debug, Default)]
pub struct Frames(VecDeque<Frame<Bytes>>);

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }
}

fn status_headers(code: i32) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    h.insert("grpc-status", code.to_string().parse().unwrap());
    if code != 0 {
        h.insert("grpc-message", "scripted".parse().unwrap());
    }
    h
}

/// Answers as the request's `x-reply` header says:
/// * `ok` — a data frame, then `grpc-status: 0` in the trailers;
/// * `code:N` — a trailers-only response with `grpc-status: N`;
/// * `trailers:N` — a data frame, then `grpc-status: N` in the trailers;
/// * `refused` — a service error: connection refused;
/// * `hang` — never answers.
#[derive(Clone, Debug, Default)]
pub struct Scripted {
    pub calls: Arc<AtomicUsize>,
}

impl Scripted {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

type Reply = http::Response<Frames>;

impl Service<Req> for Scripted {
    type Response = Reply;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Reply, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let script = req
            .headers()
            .get("x-reply")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_else(|| "ok".to_owned());
        Box::pin(async move {
            let data = || Frame::data(Bytes::from_static(b"\0\0\0\0\x02hi"));
            if script == "ok" {
                let frames = [data(), Frame::trailers(status_headers(0))];
                return Ok(http::Response::new(Frames(frames.into())));
            }
            if script == "refused" {
                let e = io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused");
                return Err(e.into());
            }
            if script == "hang" {
                std::future::pending::<()>().await;
            }
            if let Some(code) = script.strip_prefix("code:") {
                let mut reply = http::Response::new(Frames::default());
                *reply.headers_mut() = status_headers(code.parse().unwrap());
                reply
                    .headers_mut()
                    .insert("content-type", "application/grpc".parse().unwrap());
                return Ok(reply);
            }
            if let Some(code) = script.strip_prefix("trailers:") {
                let frames = [
                    data(),
                    Frame::trailers(status_headers(code.parse().unwrap())),
                ];
                return Ok(http::Response::new(Frames(frames.into())));
            }
            panic!("unknown script {script}");
        })
    }
}

/// A request whose reply is scripted (see [`Scripted`]).
pub fn request(reply: &str) -> Req {
    http::Request::builder()
        .header("x-reply", reply)
        .body(())
        .unwrap()
}

/// One endpoint named `name` in `group`: its card, and its service under quarantine over a
/// [`Scripted`] backend, wrapped for readiness assertions.
pub fn endpoint(
    group: &QuarantineGroup,
    name: &str,
) -> (
    EndpointCard,
    tower_test::mock::Spawn<Quarantine<Scripted>>,
    Scripted,
) {
    let card = EndpointCard::new(name);
    let backend = Scripted::default();
    let svc = Quarantine::new(backend.clone(), group, card.clone());
    (card, tower_test::mock::Spawn::new(svc), backend)
}

/// Calls a service that is ready, reads the whole reply, and returns the call's error if any.
pub async fn call_through<S, B>(svc: &mut S, reply: &str) -> Result<(), BoxError>
where
    S: Service<Req, Response = http::Response<B>, Error = BoxError>,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    let response = svc.call(request(reply)).await?;
    response.into_body().collect().await.map_err(Into::into)?;
    Ok(())
}

/// Polls `svc` ready (it must be), then calls it with the scripted reply and reads it all.
pub async fn call(
    svc: &mut tower_test::mock::Spawn<Quarantine<Scripted>>,
    reply: &str,
) -> Result<(), BoxError> {
    tokio_test::assert_ready_ok!(svc.poll_ready(), "the endpoint must be ready to be called");
    call_through(svc.get_mut(), reply).await
}

/// Whether the card's quarantine is in force now.
pub fn quarantined(card: &EndpointCard) -> bool {
    card.quarantine_state()
        .active_at(tokio::time::Instant::now())
}

/// A minimal health gate (the health layer's job, here so that a stack can read the health
/// line): `Pending` while the card's health verdict does not admit calls.
pub struct HealthGate<S> {
    pub gate: Gate,
    pub inner: S,
}

impl<S> HealthGate<S> {
    pub fn new(card: &EndpointCard, inner: S) -> Self {
        HealthGate {
            gate: Gate::new(card.clone()),
            inner,
        }
    }
}

impl<S: Service<R>, R> Service<R> for HealthGate<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        std::task::ready!(self.gate.poll_open(cx, |c| {
            if c.health_admits() {
                GateCheck::Open
            } else {
                GateCheck::Shut
            }
        }));
        self.inner.poll_ready(cx)
    }
    fn call(&mut self, req: R) -> S::Future {
        self.inner.call(req)
    }
}

impl<S> HasCard for HealthGate<S> {
    fn card(&self) -> Option<&EndpointCard> {
        Some(self.gate.card())
    }
}

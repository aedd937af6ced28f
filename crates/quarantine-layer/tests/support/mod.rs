//! Helpers shared by the tests: a scripted stand-in for a tonic `Channel` that answers as each
//! request's `x-reply` header says (with test-backends' synthetic replies), and a one-line way
//! to build an endpoint under quarantine.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use endpoint_state::{BoxError, EndpointCard, Gate, GateCheck, HasCard};
use http_body::Body;
use http_body_util::BodyExt;
use quarantine_layer::{Quarantine, QuarantineGroup};
use test_backends::synthetic::{self, Reply as ReplyBody};
use tonic::Code;
use tower::Service;

pub type Req = http::Request<()>;

/// Answers as the request's `x-reply` header says:
/// * `ok` — a data frame, then `grpc-status: 0` in the trailers;
/// * `code:N` — a trailers-only response with `grpc-status: N`;
/// * `trailers:N` — a data frame, then `grpc-status: N` in the trailers;
/// * `refused` — a service error: connection refused;
/// * `hang` — never answers;
/// * `html` — not gRPC: `200 OK` with `content-type: text/html`, as a proxy answers.
#[derive(Clone, Debug, Default)]
pub struct Scripted {
    pub calls: Arc<AtomicUsize>,
}

impl Scripted {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

type Reply = http::Response<ReplyBody>;

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
            // Every failure says "scripted" (a success says nothing).
            let code = |n: &str| Code::from_i32(n.parse().unwrap());
            let message = |c: Code| (c != Code::Ok).then_some("scripted");
            if script == "ok" {
                return Ok(synthetic::reply(Code::Ok, None));
            }
            if script == "refused" {
                let e = io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused");
                return Err(e.into());
            }
            if script == "hang" {
                std::future::pending::<()>().await;
            }
            if script == "html" {
                let mut page = http::Response::new(ReplyBody::messages(1));
                page.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("text/html"),
                );
                return Ok(page);
            }
            if let Some(n) = script.strip_prefix("code:") {
                return Ok(synthetic::trailers_only(code(n), message(code(n))));
            }
            if let Some(n) = script.strip_prefix("trailers:") {
                return Ok(synthetic::reply(code(n), message(code(n))));
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
    finish(svc.call(request(reply))).await
}

/// Waits for a call already made and reads its whole reply; the call's error if any.
pub async fn finish<B>(
    call: impl Future<Output = Result<http::Response<B>, BoxError>>,
) -> Result<(), BoxError>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    call.await?
        .into_body()
        .collect()
        .await
        .map_err(Into::into)?;
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

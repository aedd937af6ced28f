//! Test support: a scripted HTTP-level "channel" whose replies say how each call ends (its
//! bodies are test-backends' synthetic replies), and helpers to drive a breaker.

#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use breaker_layer::{BoxError, Breaker, BreakerConfig, BreakerLayer, BreakerOpen};
use endpoint_state::{BreakerState, CardEvent, EndpointCard, LineState};
use http::{Request, Response};
use http_body::Body as _;
use test_backends::synthetic::{self, Reply as Body};
use tonic::Code;
use tower::{Layer, Service, ServiceExt};

/// How a scripted call ends.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A message, then `grpc-status: 0` in the trailers.
    Ok,
    /// A trailers-only response with this code (how most errors arrive).
    TrailersOnly(Code),
    /// A message, then this code in the trailers (an error after a streamed reply).
    InTrailers(Code),
    /// The service fails: a transport error (connection refused).
    Transport,
    /// Wait, then the inner reply.
    After(Duration, Box<Reply>),
    /// The response future never completes.
    Hang,
    /// Headers and one message arrive, then the body never ends.
    HangBody,
    /// A trailers-only response with this code and this (percent-encoded) message.
    TrailersOnlyWith(Code, String),
    /// Not gRPC at all: `200 OK` with an HTML page, as a proxy answers for a backend it lost.
    Html,
}

/// The scripted "channel": replies come from a shared queue (`Reply::Ok` once it is empty);
/// it counts the calls it receives.
#[derive(Clone, Default)]
pub struct Script {
    queue: Arc<Mutex<VecDeque<Reply>>>,
    calls: Arc<AtomicUsize>,
}

impl Script {
    pub fn new() -> Self {
        Self::default()
    }

    /// Queue replies.
    pub fn push(&self, replies: impl IntoIterator<Item = Reply>) {
        self.queue.lock().unwrap().extend(replies);
    }

    /// Calls received so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

type BoxFut = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

fn reply(r: Reply) -> BoxFut {
    Box::pin(async move {
        match r {
            Reply::Ok => Ok(synthetic::reply(Code::Ok, None)),
            Reply::TrailersOnly(code) => Ok(synthetic::trailers_only(code, Some("scripted"))),
            Reply::InTrailers(code) => Ok(synthetic::reply(code, Some("scripted"))),
            Reply::Transport => Err(Box::new(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "connection refused",
            )) as BoxError),
            Reply::After(d, inner) => {
                tokio::time::sleep(d).await;
                reply(*inner).await
            }
            Reply::Hang => std::future::pending().await,
            Reply::HangBody => Ok(Response::new(Body::messages(1).hang())),
            Reply::TrailersOnlyWith(code, message) => {
                Ok(synthetic::trailers_only(code, Some(&message)))
            }
            Reply::Html => {
                let mut page = Response::new(Body::messages(1));
                page.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("text/html"),
                );
                Ok(page)
            }
        }
    })
}

impl Service<Request<()>> for Script {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFut;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<()>) -> BoxFut {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let r = self.queue.lock().unwrap().pop_front().unwrap_or(Reply::Ok);
        reply(r)
    }
}

/// A breaker over a fresh script, on a fresh card named `b1`.
pub fn breaker(config: BreakerConfig) -> (Breaker<Script>, Script, EndpointCard) {
    let card = EndpointCard::new("b1");
    let script = Script::new();
    let layer = BreakerLayer::new(card.clone(), config).expect("valid config");
    (layer.layer(script.clone()), script, card)
}

/// The response of a breaker over a script.
pub type Answer = <Breaker<Script> as Service<Request<()>>>::Response;

/// One call up to its response (the body unread): ready, then call.
pub async fn send(svc: &mut Breaker<Script>) -> Result<Answer, BoxError> {
    svc.ready().await?.call(Request::new(())).await
}

/// One call that a fail-fast breaker refuses: its refusal.
pub async fn refused(svc: &mut Breaker<Script>) -> Box<BreakerOpen> {
    send(svc)
        .await
        .expect_err("the breaker refuses the call")
        .downcast()
        .expect("a BreakerOpen")
}

/// One whole call: ready, call, read the body to its end. `Err` carries the service error's
/// text, or `grpc-status` of a failed reply as `code N`.
pub async fn call(svc: &mut Breaker<Script>) -> Result<(), String> {
    let resp = svc
        .ready()
        .await
        .map_err(|e| e.to_string())?
        .call(Request::new(()))
        .await
        .map_err(|e| e.to_string())?;
    if let Some(code) = resp.headers().get("grpc-status") {
        return if code == "0" {
            Ok(())
        } else {
            Err(format!("code {}", code.to_str().unwrap()))
        };
    }
    let mut body = std::pin::pin!(resp.into_body());
    let mut status = None;
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        if let Ok(t) = frame.unwrap().into_trailers() {
            status = t.get("grpc-status").cloned();
        }
    }
    match status {
        Some(code) if code == "0" => Ok(()),
        Some(code) => Err(format!("code {}", code.to_str().unwrap())),
        None => Err("no status".into()),
    }
}

/// Queue `replies` and make one call per reply.
pub async fn run(svc: &mut Breaker<Script>, script: &Script, replies: &[Reply]) {
    for r in replies {
        script.push([r.clone()]);
        let _ = call(svc).await;
    }
}

/// The reason on the card's breaker line (panics if there is none).
pub fn reason(card: &EndpointCard) -> String {
    card.breaker()
        .reason
        .as_deref()
        .expect("a reason on the breaker line")
        .to_owned()
}

/// The breaker states an event goes from and to (panics unless it is of the breaker line).
pub fn states(event: &CardEvent) -> (BreakerState, BreakerState) {
    match (event.from, event.to) {
        (LineState::Breaker(from), LineState::Breaker(to)) => (from, to),
        other => panic!("not a breaker event: {other:?}"),
    }
}

pub fn is_open(card: &EndpointCard) -> bool {
    matches!(card.breaker_state(), BreakerState::Open { .. })
}

/// How long the current open period has left (panics unless open).
pub fn open_for(card: &EndpointCard) -> Duration {
    match card.breaker_state() {
        BreakerState::Open { until } => until - tokio::time::Instant::now(),
        other => panic!("breaker not open: {other:?}"),
    }
}

pub fn fails(n: usize) -> Vec<Reply> {
    vec![Reply::TrailersOnly(Code::Unavailable); n]
}

pub fn oks(n: usize) -> Vec<Reply> {
    vec![Reply::Ok; n]
}

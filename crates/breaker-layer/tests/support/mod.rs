//! Test support: a scripted HTTP-level "channel" whose replies say how each call ends, a body
//! that can carry trailers or hang, and helpers to drive a breaker.

#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use breaker_layer::{BoxError, Breaker, BreakerConfig, BreakerLayer};
use bytes::Bytes;
use endpoint_state::{BreakerState, EndpointCard};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame};
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
}

/// A test response body: frames, then either the end or a hang.
pub struct TestBody {
    frames: VecDeque<Frame<Bytes>>,
    hang: bool,
}

impl TestBody {
    fn new(frames: Vec<Frame<Bytes>>, hang: bool) -> Self {
        TestBody {
            frames: frames.into(),
            hang,
        }
    }
}

impl Body for TestBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.frames.pop_front() {
            Some(f) => Poll::Ready(Some(Ok(f))),
            None if self.hang => Poll::Pending,
            None => Poll::Ready(None),
        }
    }
}

fn status_map(code: Code) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("grpc-status", HeaderValue::from(code as i32));
    if code != Code::Ok {
        h.insert("grpc-message", HeaderValue::from_static("scripted"));
    }
    h
}

fn message() -> Frame<Bytes> {
    Frame::data(Bytes::from_static(b"\0\0\0\0\x02hi"))
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

type BoxFut = Pin<Box<dyn Future<Output = Result<Response<TestBody>, BoxError>> + Send>>;

fn reply(r: Reply) -> BoxFut {
    Box::pin(async move {
        match r {
            Reply::Ok => Ok(Response::new(TestBody::new(
                vec![message(), Frame::trailers(status_map(Code::Ok))],
                false,
            ))),
            Reply::TrailersOnly(code) => {
                let mut resp = Response::new(TestBody::new(vec![], false));
                *resp.headers_mut() = status_map(code);
                Ok(resp)
            }
            Reply::InTrailers(code) => Ok(Response::new(TestBody::new(
                vec![message(), Frame::trailers(status_map(code))],
                false,
            ))),
            Reply::Transport => Err(Box::new(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "connection refused",
            )) as BoxError),
            Reply::After(d, inner) => {
                tokio::time::sleep(d).await;
                reply(*inner).await
            }
            Reply::Hang => std::future::pending().await,
            Reply::HangBody => Ok(Response::new(TestBody::new(vec![message()], true))),
        }
    })
}

impl Service<Request<()>> for Script {
    type Response = Response<TestBody>;
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

//! In-process stand-ins for a tonic channel, for tests and benchmarks that must exercise a layer
//! and not a socket: a reply body shaped as tonic's client reads one ([`Reply`]), the two
//! shapes of a gRPC server's answer ([`reply`], with the status in the trailers, and
//! [`trailers_only`]), and a service that answers every call at once ([`Immediate`]).
//!
//! ```
//! use test_backends::synthetic::{self, Reply};
//! use tonic::Code;
//!
//! // One message, then `grpc-status: 14` and its message in the trailers.
//! let failed = synthetic::reply(Code::Unavailable, Some("scripted"));
//! // `grpc-status: 14` in the headers, no body.
//! let refused = synthetic::trailers_only(Code::Unavailable, Some("scripted"));
//! assert_eq!(refused.headers()["grpc-status"], "14");
//! // A message, and then nothing ever again.
//! let stuck = Reply::messages(1).hang();
//! # let _ = (failed, stuck);
//! ```

use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame};
use tonic::Code;

/// One encoded gRPC message (`"hello"` as a length-prefixed frame).
const MESSAGE: &[u8] = b"\0\0\0\0\x05hello";

/// A gRPC reply body as tonic's client reads it: `messages` data frames (each one encoded
/// message), then the trailers if it has any, then the end — or, made to [`hang`](Self::hang),
/// no end at all.
pub struct Reply {
    messages: usize,
    trailers: Option<HeaderMap>,
    hang: bool,
}

impl Reply {
    /// `messages` messages, then `trailers`.
    pub fn new(trailers: HeaderMap, messages: usize) -> Self {
        Reply {
            messages,
            trailers: Some(trailers),
            hang: false,
        }
    }

    /// No frame at all: the body of a trailers-only response.
    pub fn empty() -> Self {
        Reply::messages(0)
    }

    /// `messages` messages and no trailers: a body that ends without a status.
    pub fn messages(messages: usize) -> Self {
        Reply {
            messages,
            trailers: None,
            hang: false,
        }
    }

    /// This body without its end: after its frames it stays pending (and never wakes).
    #[must_use]
    pub fn hang(mut self) -> Self {
        self.hang = true;
        self
    }
}

impl Default for Reply {
    /// [`Reply::empty`].
    fn default() -> Self {
        Reply::empty()
    }
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reply")
            .field("messages_left", &self.messages)
            .field("trailers", &self.trailers)
            .field("hang", &self.hang)
            .finish()
    }
}

impl Body for Reply {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.messages > 0 {
            self.messages -= 1;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(MESSAGE)))));
        }
        match self.trailers.take() {
            Some(t) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            None if self.hang => Poll::Pending,
            None => Poll::Ready(None),
        }
    }
}

/// The trailers of a call that ended with `code` (and `message`, percent-encoded by the
/// caller where needed).
pub fn trailers(code: Code, message: Option<&str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("grpc-status", (code as i32).into());
    if let Some(m) = message {
        h.insert(
            "grpc-message",
            m.parse().expect("a valid grpc-message header value"),
        );
    }
    h
}

/// A reply as a server sends a unary answer: one message, then `code` (and `message`) in the
/// trailers. With a code other than `OK`, an error after a streamed message.
pub fn reply(code: Code, message: Option<&str>) -> http::Response<Reply> {
    http::Response::new(Reply::new(trailers(code, message), 1))
}

/// A trailers-only response, as a server sends most errors: `content-type: application/grpc`
/// and `code` (and `message`) in the headers, and an empty body.
pub fn trailers_only(code: Code, message: Option<&str>) -> http::Response<Reply> {
    let mut response = http::Response::new(Reply::empty());
    let headers = response.headers_mut();
    *headers = trailers(code, message);
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// A "channel" that answers every call at once with one message and the configured trailers
/// (`grpc-status: 0` by default): the bare service a layer's overhead is measured against.
#[derive(Clone, Debug)]
pub struct Immediate {
    trailers: HeaderMap,
}

impl Immediate {
    /// Answers every call with `OK`.
    pub fn ok() -> Self {
        Immediate {
            trailers: trailers(Code::Ok, None),
        }
    }

    /// Answers every call with `code` in the trailers.
    pub fn failing(code: Code, message: &str) -> Self {
        Immediate {
            trailers: trailers(code, Some(message)),
        }
    }
}

impl<B> tower::Service<http::Request<B>> for Immediate {
    type Response = http::Response<Reply>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<http::Response<Reply>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: http::Request<B>) -> Self::Future {
        std::future::ready(Ok(http::Response::new(Reply::new(
            self.trailers.clone(),
            1,
        ))))
    }
}

/// Drives one whole call on a service that completes without waiting (such as [`Immediate`]
/// under middleware): `poll_ready`, `call`, the response future and the body read to its end,
/// all with a no-op waker. Returns the number of message bytes read.
///
/// # Panics
///
/// If any step is not ready at once, or fails.
pub fn call_now<S, B>(svc: &mut S) -> usize
where
    S: tower::Service<http::Request<()>, Response = http::Response<B>>,
    S::Error: fmt::Debug,
    B: Body,
    B::Error: fmt::Debug,
{
    use bytes::Buf;
    use std::future::Future;

    let mut cx = Context::from_waker(std::task::Waker::noop());
    let Poll::Ready(Ok(())) = svc.poll_ready(&mut cx) else {
        panic!("the service was not ready at once")
    };
    let response = std::pin::pin!(svc.call(http::Request::new(())));
    let Poll::Ready(Ok(response)) = response.poll(&mut cx) else {
        panic!("the call was not answered at once")
    };
    let mut body = std::pin::pin!(response.into_body());
    let mut read = 0;
    while let Poll::Ready(Some(frame)) = body.as_mut().poll_frame(&mut cx) {
        if let Ok(data) = frame.expect("the body does not fail").into_data() {
            read += std::hint::black_box(data).remaining();
        }
    }
    read
}

//! Transparent retry of calls no backend acted on.
//!
//! A call can fail before a backend acted on it: the target's connection was gone (the backend
//! stopped, or sent `GOAWAY` and closed its port) and reconnecting was refused; the request was
//! queued on a connection that closed before taking it; or the backend's `GOAWAY` said it never
//! processed the call's stream (HTTP/2 lets a client retry those). gRPC's own clients retry such
//! calls on another backend without telling the caller ("transparent retry"); so does the kit,
//! once per call.
//!
//! To have the request again, [`Unsent::split`] keeps the request's head (its headers cloned,
//! its extensions moved: nothing below the kit's channel reads them) and sends the body down
//! inside a [`Handoff`], which keeps what it passes on (the data frames, shared, not copied; up
//! to [`REPLAY_LIMIT`] bytes) and, when dropped, gives back the body: unread, or as what was
//! read plus what was not. (A backend that refuses a stream with `REFUSED_STREAM` did not
//! process it either; those are retried too.) A call is retried only when both hold: its error proves the backend
//! did not act on it, and its body came back.
//!
//! Where the body comes back is a slot of the channel handle's [`Retrier`], reused call after
//! call while no earlier call of the handle still holds it: the common path allocates only
//! the header clone and the handoff, and touches no count shared with other callers.

use std::error::Error;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Extensions, HeaderMap, Method, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use tonic::Status;

use endpoint_state::transport::{never_sent, refused_by_server};

use endpoint_state::sync::lock;

use crate::life::Life;
use crate::stack::Request;

/// The most request body bytes a call keeps to send again; a longer body is not retried once
/// read.
pub(crate) const REPLAY_LIMIT: usize = 64 * 1024;

/// What the calls of one channel handle share for their retries: the kit (to choose a target
/// again) and the slot where a body comes back.
pub(crate) struct Shared {
    pub(crate) life: Arc<Life>,
    slot: Mutex<Option<Returned>>,
}

/// A request body given back by its [`Handoff`].
enum Returned {
    /// Never read: the body itself.
    Unread(tonic::body::Body),
    /// Read (some or all of it): the data frames read, and the rest if it did not end.
    Read {
        frames: Kept,
        rest: Option<tonic::body::Body>,
    },
}

impl Returned {
    fn into_body(self) -> tonic::body::Body {
        match self {
            Returned::Unread(body) => body,
            Returned::Read { frames, rest } => {
                let frames = frames.first.into_iter().chain(frames.more).collect();
                tonic::body::Body::new(Replay { frames, rest })
            }
        }
    }
}

/// A channel handle's retry state: a [`Shared`] reused while no call still holds it.
#[derive(Default)]
pub(crate) struct Retrier {
    shared: Option<Arc<Shared>>,
}

impl Retrier {
    /// The shared state for a new call: this handle's, when no earlier call holds it any more
    /// (its slot emptied), else a fresh one that becomes this handle's.
    fn shared(&mut self, life: &Arc<Life>) -> Arc<Shared> {
        if let Some(shared) = &mut self.shared
            && let Some(mine) = Arc::get_mut(shared)
        {
            *mine.slot.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
            return Arc::clone(shared);
        }
        let shared = Arc::new(Shared {
            life: Arc::clone(life),
            slot: Mutex::new(None),
        });
        self.shared = Some(Arc::clone(&shared));
        shared
    }
}

/// What a call keeps to send its request again.
pub(crate) struct Unsent {
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    extensions: Extensions,
    shared: Arc<Shared>,
}

impl fmt::Debug for Unsent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Unsent")
            .field("method", &self.method)
            .field("uri", &self.uri)
            .finish_non_exhaustive()
    }
}

impl Unsent {
    /// The request to send down (same head, body in a [`Handoff`]), and what is kept to send
    /// it again.
    pub(crate) fn split(
        req: Request,
        retrier: &mut Retrier,
        life: &Arc<Life>,
    ) -> (Request, Unsent) {
        let (mut parts, body) = req.into_parts();
        let shared = retrier.shared(life);
        let unsent = Unsent {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            version: parts.version,
            headers: parts.headers.clone(),
            extensions: std::mem::take(&mut parts.extensions),
            shared: Arc::clone(&shared),
        };
        let handoff = Handoff {
            inner: Some(body),
            read: false,
            ended: false,
            kept: Kept::default(),
            shared,
        };
        (
            http::Request::from_parts(parts, tonic::body::Body::new(handoff)),
            unsent,
        )
    }

    /// The request again (and the kit, to choose its target), if `error` proves the backend
    /// did not act on it and its body came back.
    pub(crate) fn again(self, error: &(dyn Error + 'static)) -> Option<(Request, Arc<Shared>)> {
        if !never_sent(error) && !refused_by_server(error) {
            return None;
        }
        let body = lock(&self.shared.slot).take()?.into_body();
        let mut req = http::Request::new(body);
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers;
        *req.extensions_mut() = self.extensions;
        Some((req, self.shared))
    }
}

/// The data frames a [`Handoff`] passed on, while they fit in [`REPLAY_LIMIT`]: shared with
/// the frames sent (a reference count each, no copy); the first one (a unary call's only one)
/// kept without an allocation.
#[derive(Default)]
struct Kept {
    first: Option<Bytes>,
    more: Vec<Bytes>,
    len: usize,
    /// Gave up: too long, trailers, or an error.
    spoiled: bool,
}

impl Kept {
    fn keep(&mut self, frame: &Frame<Bytes>) {
        if self.spoiled {
            return;
        }
        match frame.data_ref() {
            Some(data) if self.len + data.len() <= REPLAY_LIMIT => {
                self.len += data.len();
                if self.first.is_none() {
                    self.first = Some(data.clone());
                } else {
                    self.more.push(data.clone());
                }
            }
            _ => self.spoil(),
        }
    }

    fn spoil(&mut self) {
        *self = Kept {
            spoiled: true,
            ..Kept::default()
        };
    }
}

/// The request body as sent down: passes the body through, keeping what it passes on, and
/// gives the body back when dropped (see the [module docs](self)).
pub(crate) struct Handoff {
    inner: Option<tonic::body::Body>,
    read: bool,
    ended: bool,
    kept: Kept,
    shared: Arc<Shared>,
}

impl Drop for Handoff {
    fn drop(&mut self) {
        let returned = if !self.read {
            match self.inner.take() {
                Some(body) => Returned::Unread(body),
                None => return,
            }
        } else if self.kept.spoiled {
            return;
        } else {
            Returned::Read {
                frames: std::mem::take(&mut self.kept),
                rest: if self.ended { None } else { self.inner.take() },
            }
        };
        *lock(&self.shared.slot) = Some(returned);
    }
}

impl Body for Handoff {
    type Data = Bytes;
    type Error = Status;

    #[inline]
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        this.read = true;
        let Some(body) = &mut this.inner else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => this.kept.keep(frame),
            Poll::Ready(Some(Err(_))) => this.kept.spoil(),
            Poll::Ready(None) => this.ended = true,
            Poll::Pending => {}
        }
        polled
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

/// A body sent again: the frames the first attempt read, then the rest of the original.
struct Replay {
    frames: std::collections::VecDeque<Bytes>,
    rest: Option<tonic::body::Body>,
}

impl Body for Replay {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if let Some(data) = this.frames.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        match &mut this.rest {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::io;

    fn request(body: &'static str) -> Request {
        let mut req = http::Request::builder()
            .method(Method::POST)
            .uri("http://example/test.TestService/Unary")
            .header("te", "trailers")
            .body(tonic::body::Body::new(
                http_body_util::Full::new(Bytes::from_static(body.as_bytes()))
                    .map_err(|never| match never {}),
            ))
            .unwrap();
        req.extensions_mut().insert(7u32);
        req
    }

    fn refused() -> io::Error {
        io::Error::from(io::ErrorKind::ConnectionRefused)
    }

    /// A kit (never called) to retry with.
    fn life() -> Arc<Life> {
        let kit = crate::Kit::builder()
            .target("http://127.0.0.1:1")
            .without_health()
            .build()
            .unwrap();
        Arc::clone(&kit.life)
    }

    #[tokio::test]
    async fn an_unread_body_comes_back_with_the_whole_request() {
        let (life, mut retrier) = (life(), Retrier::default());
        let (sent, unsent) = Unsent::split(request("hello"), &mut retrier, &life);
        assert!(
            sent.extensions().get::<u32>().is_none(),
            "extensions stay above"
        );
        drop(sent); // as tonic's channel does when connecting fails
        let (again, _) = unsent.again(&refused()).expect("retryable");
        assert_eq!(again.method(), Method::POST);
        assert_eq!(again.uri(), "http://example/test.TestService/Unary");
        assert_eq!(again.headers()["te"], "trailers");
        assert_eq!(again.extensions().get::<u32>(), Some(&7));
        let bytes = again.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(bytes, "hello");
    }

    /// A body of several data frames.
    fn streaming(chunks: &[&'static str]) -> tonic::body::Body {
        let frames: Vec<Result<Frame<Bytes>, Status>> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes()))))
            .collect();
        tonic::body::Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
            frames,
        )))
    }

    #[tokio::test]
    async fn a_body_read_in_part_comes_back_as_what_was_read_then_the_rest() {
        let (life, mut retrier) = (life(), Retrier::default());
        let mut req = request("");
        *req.body_mut() = streaming(&["ab", "cd", "ef"]);
        let (sent, unsent) = Unsent::split(req, &mut retrier, &life);
        let mut body = sent.into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, "ab");
        drop(body); // the stream was refused after its first frame went out
        let (again, _) = unsent.again(&refused()).expect("retryable");
        let bytes = again.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(bytes, "abcdef");
    }

    #[tokio::test]
    async fn a_body_read_whole_comes_back_whole() {
        let (life, mut retrier) = (life(), Retrier::default());
        let (sent, unsent) = Unsent::split(request("hello"), &mut retrier, &life);
        let bytes = sent.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(bytes, "hello");
        let (again, _) = unsent.again(&refused()).expect("retryable");
        let bytes = again.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(bytes, "hello");
    }

    #[tokio::test]
    async fn a_body_too_long_to_keep_is_not_sent_again_once_read() {
        let (life, mut retrier) = (life(), Retrier::default());
        let big: &'static str = Box::leak("x".repeat(REPLAY_LIMIT + 1).into_boxed_str());
        let (sent, unsent) = Unsent::split(request(big), &mut retrier, &life);
        let _ = sent.into_body().collect().await.unwrap();
        assert!(unsent.again(&refused()).is_none());
    }

    #[tokio::test]
    async fn a_body_not_yet_dropped_is_not_retried() {
        let (life, mut retrier) = (life(), Retrier::default());
        let (sent, unsent) = Unsent::split(request("hello"), &mut retrier, &life);
        assert!(unsent.again(&refused()).is_none());
        drop(sent);
    }

    #[tokio::test]
    async fn a_handle_reuses_its_slot_only_when_no_call_holds_it() {
        let (life, mut retrier) = (life(), Retrier::default());
        let (sent, first) = Unsent::split(request("a"), &mut retrier, &life);
        // The first call is still going: the second gets a slot of its own.
        let (sent2, second) = Unsent::split(request("b"), &mut retrier, &life);
        assert!(!Arc::ptr_eq(&first.shared, &second.shared));
        drop(sent);
        let (again, _) = first.again(&refused()).expect("the first call's own body");
        assert_eq!(again.into_body().collect().await.unwrap().to_bytes(), "a");
        // The second call ended with its body given back unread but never taken: the next call
        // reuses the slot, emptied — it never sees another call's body.
        drop(sent2);
        let kept = Arc::as_ptr(&second.shared);
        drop(second);
        let (sent3, third) = Unsent::split(request("c"), &mut retrier, &life);
        assert_eq!(kept, Arc::as_ptr(&third.shared), "the free slot is reused");
        assert!(lock(&third.shared.slot).is_none());
        drop(sent3);
        let (again, _) = third.again(&refused()).expect("the third call's own body");
        assert_eq!(again.into_body().collect().await.unwrap().to_bytes(), "c");
    }
}

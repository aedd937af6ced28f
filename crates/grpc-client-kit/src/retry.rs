//! Transparent retry of calls that never left the client.
//!
//! A call can fail before any byte of it reached a backend: the target's connection was gone
//! (the backend stopped, or sent `GOAWAY` and closed its port) and reconnecting was refused, or
//! the request was queued on a connection that closed before taking it. gRPC's own clients retry
//! such calls on another backend without telling the caller ("transparent retry"); so does the
//! kit, once per call.
//!
//! To have the request again, [`Unsent::split`] keeps the request's head (its headers cloned,
//! its extensions moved: nothing below the kit's channel reads them) and sends the body down
//! inside a [`Handoff`]. A handoff that is dropped before anything read it gives the body back;
//! one that was read never does. A call is retried only when both hold: its error says the
//! request never reached a connection, and its body came back unread.
//!
//! Where the body comes back is a slot of the channel handle's [`Retrier`], reused call after
//! call while no earlier call of the handle still holds it: the common path allocates only
//! the header clone and the handoff, and touches no count shared with other callers.

use std::error::Error;
use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Extensions, HeaderMap, Method, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use tonic::Status;

use crate::kit::{Life, lock};
use crate::stack::Request;

/// What the calls of one channel handle share for their retries: the kit (to choose a target
/// again) and the slot where an unread body comes back.
pub(crate) struct Shared {
    pub(crate) life: Arc<Life>,
    slot: Mutex<Option<tonic::body::Body>>,
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
    pub(crate) fn split(req: Request, retrier: &mut Retrier, life: &Arc<Life>) -> (Request, Unsent) {
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
            shared,
        };
        (
            http::Request::from_parts(parts, tonic::body::Body::new(handoff)),
            unsent,
        )
    }

    /// The request again (and the kit, to choose its target), if `error` says it never
    /// reached a connection and its body came back unread.
    pub(crate) fn again(self, error: &(dyn Error + 'static)) -> Option<(Request, Arc<Shared>)> {
        if !never_sent(error) {
            return None;
        }
        let body = lock(&self.shared.slot).take()?;
        let mut req = http::Request::new(body);
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers;
        *req.extensions_mut() = self.extensions;
        Some((req, self.shared))
    }
}

/// Whether `error` proves that the request never reached a connection: connecting to the
/// target was refused (or there was no route to it, or no local address), or the connection
/// closed before taking the request from its queue (hyper's "operation was canceled").
///
/// These all come at once, so the retry still has the caller's time budget (its
/// `grpc-timeout` header is sent again unchanged). A connect timeout, or a host found
/// unreachable only after address resolution timed out, may take seconds and is not retried.
/// A reset, a broken pipe or a `GOAWAY` after the request went out are not either: the
/// backend may have acted on the call.
pub(crate) fn never_sent(error: &(dyn Error + 'static)) -> bool {
    let mut cur = Some(error);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return matches!(
                io.kind(),
                io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::NetworkUnreachable
                    | io::ErrorKind::AddrNotAvailable
            );
        }
        if let Some(hyper) = e.downcast_ref::<hyper::Error>() {
            return hyper.is_canceled();
        }
        cur = e.source();
    }
    false
}

/// The request body as sent down: passes the body through, and gives it back when dropped
/// unread.
pub(crate) struct Handoff {
    inner: Option<tonic::body::Body>,
    read: bool,
    shared: Arc<Shared>,
}

impl Drop for Handoff {
    fn drop(&mut self) {
        if !self.read
            && let Some(body) = self.inner.take()
        {
            *lock(&self.shared.slot) = Some(body);
        }
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
        match &mut this.inner {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

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
        assert!(sent.extensions().get::<u32>().is_none(), "extensions stay above");
        drop(sent); // as tonic's channel does when connecting fails
        let (again, _) = unsent.again(&refused()).expect("retryable");
        assert_eq!(again.method(), Method::POST);
        assert_eq!(again.uri(), "http://example/test.TestService/Unary");
        assert_eq!(again.headers()["te"], "trailers");
        assert_eq!(again.extensions().get::<u32>(), Some(&7));
        let bytes = again.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(bytes, "hello");
    }

    #[tokio::test]
    async fn a_body_once_read_never_comes_back() {
        let (life, mut retrier) = (life(), Retrier::default());
        let (sent, unsent) = Unsent::split(request("hello"), &mut retrier, &life);
        let mut body = sent.into_body();
        let _ = body.frame().await;
        drop(body);
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

    #[test]
    fn only_errors_that_prove_the_request_never_left_are_retried() {
        #[derive(Debug)]
        struct Wrap(Box<dyn Error + Send + Sync>);
        impl fmt::Display for Wrap {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("wrapped")
            }
        }
        impl Error for Wrap {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&*self.0)
            }
        }
        for kind in [
            io::ErrorKind::ConnectionRefused,
            io::ErrorKind::NetworkUnreachable,
            io::ErrorKind::AddrNotAvailable,
        ] {
            assert!(never_sent(&Wrap(Box::new(io::Error::from(kind)))), "{kind:?}");
        }
        for kind in [
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::BrokenPipe,
            io::ErrorKind::TimedOut,
            io::ErrorKind::HostUnreachable,
            io::ErrorKind::UnexpectedEof,
        ] {
            assert!(!never_sent(&Wrap(Box::new(io::Error::from(kind)))), "{kind:?}");
        }
        assert!(!never_sent(&Status::unavailable("backend said so")));
        // The kit's transport errors carry a status whose source is the cause.
        let mut status = Status::unavailable("b0: transport error");
        status.set_source(Arc::new(io::Error::from(io::ErrorKind::ConnectionRefused)));
        assert!(never_sent(&Wrap(Box::new(status))));
    }
}

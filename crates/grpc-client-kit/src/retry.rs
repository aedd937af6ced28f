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

use crate::kit::lock;
use crate::stack::Request;

/// Where an unread body comes back.
type Slot = Arc<Mutex<Option<tonic::body::Body>>>;

/// What a call keeps to send its request again.
pub(crate) struct Unsent {
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    extensions: Extensions,
    slot: Slot,
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
    pub(crate) fn split(req: Request) -> (Request, Unsent) {
        let (mut parts, body) = req.into_parts();
        let slot: Slot = Arc::new(Mutex::new(None));
        let unsent = Unsent {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            version: parts.version,
            headers: parts.headers.clone(),
            extensions: std::mem::take(&mut parts.extensions),
            slot: Arc::clone(&slot),
        };
        let handoff = Handoff {
            inner: Some(body),
            read: false,
            slot,
        };
        (
            http::Request::from_parts(parts, tonic::body::Body::new(handoff)),
            unsent,
        )
    }

    /// The request again, if `error` says it never reached a connection and its body came
    /// back unread.
    pub(crate) fn again(self, error: &(dyn Error + 'static)) -> Option<Request> {
        if !never_sent(error) {
            return None;
        }
        let body = lock(&self.slot).take()?;
        let mut req = http::Request::new(body);
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers;
        *req.extensions_mut() = self.extensions;
        Some(req)
    }
}

/// Whether `error` proves that the request never reached a connection: connecting to the
/// target was refused (or the target was unreachable), or the connection closed before taking
/// the request from its queue (hyper's "operation was canceled").
///
/// A reset, a broken pipe or a `GOAWAY` after the request went out are not: the backend may
/// have acted on the call.
pub(crate) fn never_sent(error: &(dyn Error + 'static)) -> bool {
    let mut cur = Some(error);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return matches!(
                io.kind(),
                io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::HostUnreachable
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
    slot: Slot,
}

impl Drop for Handoff {
    fn drop(&mut self) {
        if !self.read
            && let Some(body) = self.inner.take()
        {
            *lock(&self.slot) = Some(body);
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

    #[tokio::test]
    async fn an_unread_body_comes_back_with_the_whole_request() {
        let (sent, unsent) = Unsent::split(request("hello"));
        assert!(sent.extensions().get::<u32>().is_none(), "extensions stay above");
        drop(sent); // as tonic's channel does when connecting fails
        let again = unsent.again(&refused()).expect("retryable");
        assert_eq!(again.method(), Method::POST);
        assert_eq!(again.uri(), "http://example/test.TestService/Unary");
        assert_eq!(again.headers()["te"], "trailers");
        assert_eq!(again.extensions().get::<u32>(), Some(&7));
        let bytes = again.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(bytes, "hello");
    }

    #[tokio::test]
    async fn a_body_once_read_never_comes_back() {
        let (sent, unsent) = Unsent::split(request("hello"));
        let mut body = sent.into_body();
        let _ = body.frame().await;
        drop(body);
        assert!(unsent.again(&refused()).is_none());
    }

    #[test]
    fn a_body_not_yet_dropped_is_not_retried() {
        let (sent, unsent) = Unsent::split(request("hello"));
        assert!(unsent.again(&refused()).is_none());
        drop(sent);
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
            io::ErrorKind::HostUnreachable,
            io::ErrorKind::NetworkUnreachable,
        ] {
            assert!(never_sent(&Wrap(Box::new(io::Error::from(kind)))), "{kind:?}");
        }
        for kind in [
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::BrokenPipe,
            io::ErrorKind::TimedOut,
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

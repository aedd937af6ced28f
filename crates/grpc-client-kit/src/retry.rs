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
//! its extensions moved — but for the two the balancer reads, `WaitForReady` and
//! `RequestHash`, which are copied) and sends the body down inside a [`Handoff`], which keeps
//! what it passes on (the data frames, shared, not copied; up to [`REPLAY_LIMIT`] bytes) and,
//! when dropped, gives back the body: unread, or as what was read plus what was not. (A backend
//! that refuses a stream with `REFUSED_STREAM` did not process it either; those are retried
//! too.) A call is retried only when both hold: its error proves the backend did not act on
//! it, and its body came back.
//!
//! Where the body comes back is a slot of the channel handle's [`Retrier`], reused call after
//! call while no earlier call of the handle still holds it: the common path allocates only
//! the header clone and the handoff.
//!
//! **Nothing is kept past the call.** When the call ends — answered, failed, or dropped by the
//! caller — its [`Unsent`] closes the slot: a body given back then is dropped at once (a
//! producer feeding a client stream sees its channel close), and the handoff keeps no more
//! frames. **The memory kept for replay is bounded per kit**: the frames every call of a kit
//! keeps count against one [`ReplayBudget`] of [`REPLAY_BUDGET`](crate::life::REPLAY_BUDGET)
//! bytes; a call whose frames do
//! not fit goes without transparent retry once its body is read (as one longer than
//! [`REPLAY_LIMIT`] does). The budget is given back as calls end.

use std::error::Error;
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http::{Extensions, HeaderMap, Method, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use tonic::Status;

use endpoint_state::sync::lock;
use endpoint_state::transport::{closed_before_server_spoke, never_sent, refused_by_server};

use crate::life::{KitState, Life, ReplayBudget};
use crate::stack::Request;

/// The most request body bytes a call keeps to send again; a longer body is not retried once
/// read.
pub(crate) const REPLAY_LIMIT: usize = 64 * 1024;

/// What the calls of one channel handle share for their retries: the kit (to choose a target
/// again) and the slot where a body comes back.
pub(crate) struct Shared {
    life: Arc<Life>,
    slot: Mutex<Option<Returned>>,
    /// Whether the call may still send its request again (written under the slot's lock): once
    /// it has ended, a body given back is dropped and no frame is kept.
    open: AtomicBool,
    /// How many [`Handoff`]s of this call are alive: the body is still below, being sent or
    /// not yet dropped by the connection (0 or 1 in practice).
    out: AtomicUsize,
    /// Woken when a [`Handoff`] is dropped (its body given back, or let go).
    back: AtomicWaker,
}

impl Shared {
    fn budget(&self) -> &ReplayBudget {
        &self.life.state.replay
    }

    /// The call has ended: drop what came back, and whatever comes back from now on. (So a
    /// slot holds a body only while its call's [`Unsent`], and so the slot, lives.)
    fn close(&self) {
        let returned = {
            let mut slot = lock(&self.slot);
            self.open.store(false, Ordering::Release);
            slot.take()
        };
        if let Some(returned) = returned {
            returned.discard(self.budget());
        }
    }
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
    fn into_body(self, state: &Arc<KitState>) -> tonic::body::Body {
        match self {
            Returned::Unread(body) => body,
            Returned::Read { frames, rest } => {
                let charge = Charge {
                    state: Arc::clone(state),
                    bytes: frames.len,
                };
                let frames = frames.first.into_iter().chain(frames.more).collect();
                tonic::body::Body::new(Replay {
                    frames,
                    rest,
                    _charge: charge,
                })
            }
        }
    }

    /// Drops it, giving back the budget its frames held.
    fn discard(self, budget: &ReplayBudget) {
        if let Returned::Read { frames, .. } = &self {
            budget.give(frames.len);
        }
    }
}

/// A channel handle's retry state: a [`Shared`] reused while no call still holds it.
#[derive(Default)]
pub(crate) struct Retrier {
    shared: Option<Arc<Shared>>,
}

impl Retrier {
    /// The shared state for a new call: this handle's, when no earlier call holds it any more,
    /// else a fresh one that becomes this handle's.
    fn shared(&mut self, life: &Arc<Life>) -> Arc<Shared> {
        if let Some(shared) = &mut self.shared
            && let Some(mine) = Arc::get_mut(shared)
        {
            // Closed, and emptied, when its call ended.
            *mine.open.get_mut() = true;
            return Arc::clone(shared);
        }
        let shared = Arc::new(Shared {
            life: Arc::clone(life),
            slot: Mutex::new(None),
            open: AtomicBool::new(true),
            out: AtomicUsize::new(0),
            back: AtomicWaker::new(),
        });
        self.shared = Some(Arc::clone(&shared));
        shared
    }
}

/// What a call keeps to send its request again. Dropping it (the call ended) closes the slot:
/// the request body is let go as soon as it comes back.
pub(crate) struct Unsent {
    head: Option<Head>,
    shared: Arc<Shared>,
}

/// A request's head, kept to send it again.
struct Head {
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    extensions: Extensions,
}

impl fmt::Debug for Unsent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Unsent");
        if let Some(head) = &self.head {
            d.field("method", &head.method).field("uri", &head.uri);
        }
        d.finish_non_exhaustive()
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        self.shared.close();
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
        let extensions = std::mem::take(&mut parts.extensions);
        // The extensions the balancer reads on the request itself go down with it: the
        // call's wait-for-ready, and its hash for `ring_hash`.
        if let Some(wait) = extensions.get::<balance_layer::WaitForReady>() {
            parts.extensions.insert(*wait);
        }
        if let Some(hash) = extensions.get::<balance_layer::RequestHash>() {
            parts.extensions.insert(*hash);
        }
        let unsent = Unsent {
            head: Some(Head {
                method: parts.method.clone(),
                uri: parts.uri.clone(),
                version: parts.version,
                headers: parts.headers.clone(),
                extensions,
            }),
            shared: Arc::clone(&shared),
        };
        let handoff = Handoff::new(body, shared);
        (
            http::Request::from_parts(parts, tonic::body::Body::new(handoff)),
            unsent,
        )
    }

    /// The kit the call belongs to.
    pub(crate) fn life(&self) -> &Arc<Life> {
        &self.shared.life
    }

    /// Ready once no attempt's body is still below (each [`Handoff`] sent down has been
    /// dropped, and has given its body back if it could). An attempt's error can come up
    /// before the connection has dropped the request body it was sending: a retry waits for
    /// it here (bounded by the caller), instead of finding the slot empty.
    pub(crate) fn poll_body_back(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.shared.out.load(Ordering::Acquire) == 0 {
            return Poll::Ready(());
        }
        self.shared.back.register(cx.waker());
        if self.shared.out.load(Ordering::Acquire) == 0 {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Whether an attempt's body is still below (see [`poll_body_back`](Self::poll_body_back)).
    pub(crate) fn body_out(&self) -> bool {
        self.shared.out.load(Ordering::Acquire) != 0
    }

    /// Whether `error` proves the backend did not act on the call.
    pub(crate) fn not_acted_on(error: &(dyn Error + 'static)) -> bool {
        never_sent(error) || refused_by_server(error) || closed_before_server_spoke(error)
    }

    /// The request again for one more attempt, keeping what is needed to send it yet again
    /// (a retry policy's): the same head (with the extensions the balancer reads), and the
    /// body as the last attempt gave it back, sent down in a new [`Handoff`]. `None` when the
    /// body has not come back whole (too long to keep, over the kit's budget, or still held
    /// by the last attempt).
    pub(crate) fn resend(&mut self) -> Option<Request> {
        let head = self.head.as_ref()?;
        let returned = lock(&self.shared.slot).take()?;
        let body = returned.into_body(&self.shared.life.state);
        let handoff = Handoff::new(body, Arc::clone(&self.shared));
        let mut req = http::Request::new(tonic::body::Body::new(handoff));
        *req.method_mut() = head.method.clone();
        *req.uri_mut() = head.uri.clone();
        *req.version_mut() = head.version;
        *req.headers_mut() = head.headers.clone();
        if let Some(wait) = head.extensions.get::<balance_layer::WaitForReady>() {
            req.extensions_mut().insert(*wait);
        }
        if let Some(hash) = head.extensions.get::<balance_layer::RequestHash>() {
            req.extensions_mut().insert(*hash);
        }
        Some(req)
    }

    /// The request again (and the kit, to choose its target), if `error` proves the backend
    /// did not act on it and its body came back.
    pub(crate) fn again(mut self, error: &(dyn Error + 'static)) -> Option<(Request, Arc<Life>)> {
        if !Self::not_acted_on(error) {
            return None;
        }
        let returned = lock(&self.shared.slot).take()?;
        let head = self.head.take()?;
        let life = Arc::clone(&self.shared.life);
        let mut req = http::Request::new(returned.into_body(&life.state));
        *req.method_mut() = head.method;
        *req.uri_mut() = head.uri;
        *req.version_mut() = head.version;
        *req.headers_mut() = head.headers;
        *req.extensions_mut() = head.extensions;
        Some((req, life))
    }
}

/// The data frames a [`Handoff`] passed on, while they fit in [`REPLAY_LIMIT`] and in the
/// kit's [`ReplayBudget`] (`len` bytes of it are this call's): shared with the frames sent (a
/// reference count each, no copy); the first one (a unary call's only one) kept without an
/// allocation.
#[derive(Default)]
struct Kept {
    first: Option<Bytes>,
    more: Vec<Bytes>,
    len: usize,
    /// Gave up: too long, over the budget, trailers, an error, or the call ended.
    spoiled: bool,
}

impl Kept {
    fn keep(&mut self, frame: &Frame<Bytes>, budget: &ReplayBudget) {
        if self.spoiled {
            return;
        }
        match frame.data_ref() {
            Some(data) if self.len + data.len() <= REPLAY_LIMIT && budget.take(data.len()) => {
                self.len += data.len();
                if self.first.is_none() {
                    self.first = Some(data.clone());
                } else {
                    self.more.push(data.clone());
                }
            }
            _ => self.spoil(budget),
        }
    }

    fn spoil(&mut self, budget: &ReplayBudget) {
        budget.give(self.len);
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

impl Handoff {
    fn new(body: tonic::body::Body, shared: Arc<Shared>) -> Handoff {
        shared.out.fetch_add(1, Ordering::AcqRel);
        Handoff {
            inner: Some(body),
            read: false,
            ended: false,
            kept: Kept::default(),
            shared,
        }
    }

    /// Gives the body back to the slot while the call is open (else lets it go).
    fn give_back(&mut self) {
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
        let mut slot = lock(&self.shared.slot);
        if self.shared.open.load(Ordering::Acquire) {
            *slot = Some(returned);
        } else {
            // The call has ended: nobody will send it again. (Dropped outside the lock: a
            // user's body may do anything when dropped.)
            drop(slot);
            returned.discard(self.shared.budget());
        }
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        self.give_back();
        // After the slot is filled: a call waiting for the body finds it there.
        self.shared.out.fetch_sub(1, Ordering::AcqRel);
        self.shared.back.wake();
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
        let budget = &this.shared.life.state.replay;
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if this.shared.open.load(Ordering::Acquire) {
                    this.kept.keep(frame, budget);
                } else {
                    this.kept.spoil(budget);
                }
            }
            Poll::Ready(Some(Err(_))) => this.kept.spoil(budget),
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

/// The budget a body sent again holds until it is dropped.
struct Charge {
    state: Arc<KitState>,
    bytes: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.state.replay.give(self.bytes);
    }
}

/// A body sent again: the frames the first attempt read, then the rest of the original.
struct Replay {
    frames: std::collections::VecDeque<Bytes>,
    rest: Option<tonic::body::Body>,
    _charge: Charge,
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

    /// A body of several data frames, which holds a clone of `alive` until it is dropped.
    fn streaming_held(chunks: &[&'static str], alive: Arc<()>) -> tonic::body::Body {
        use futures_util::StreamExt;
        let frames: Vec<Result<Frame<Bytes>, Status>> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes()))))
            .collect();
        let stream = futures_util::stream::iter(frames).map(move |f| {
            let _ = &alive;
            f
        });
        tonic::body::Body::new(http_body_util::StreamBody::new(stream))
    }

    fn streaming(chunks: &[&'static str]) -> tonic::body::Body {
        streaming_held(chunks, Arc::default())
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
        assert!(third.shared.open.load(Ordering::Acquire));
        drop(sent3);
        let (again, _) = third.again(&refused()).expect("the third call's own body");
        assert_eq!(again.into_body().collect().await.unwrap().to_bytes(), "c");
    }

    #[tokio::test]
    async fn a_body_given_back_after_its_call_ended_is_dropped_at_once() {
        let (life, mut retrier) = (life(), Retrier::default());
        for read in [false, true] {
            let (mut req, alive) = (request(""), Arc::new(()));
            *req.body_mut() = streaming_held(&["ab", "cd"], alive.clone());
            let (sent, unsent) = Unsent::split(req, &mut retrier, &life);
            let mut sent = sent.into_body();
            if read {
                sent.frame().await.unwrap().unwrap();
            }
            // The server answered (ending the client stream early): the call is over while its
            // body is still being sent; then the transport drops the body.
            drop(unsent);
            drop(sent);
            assert_eq!(
                Arc::strong_count(&alive),
                1,
                "read: {read}: the body was kept"
            );
            assert_eq!(life.state.replay.used(), 0, "read: {read}");
        }
    }

    #[tokio::test]
    async fn frames_read_after_the_call_ended_are_not_kept() {
        let (life, mut retrier) = (life(), Retrier::default());
        let mut req = request("");
        *req.body_mut() = streaming(&["ab", "cd", "ef"]);
        let (sent, unsent) = Unsent::split(req, &mut retrier, &life);
        let mut sent = sent.into_body();
        sent.frame().await.unwrap().unwrap();
        assert_eq!(life.state.replay.used(), 2);
        drop(unsent); // a bidirectional stream answered: its request goes on
        sent.frame().await.unwrap().unwrap();
        assert_eq!(life.state.replay.used(), 0);
    }

    #[tokio::test]
    async fn calls_beyond_the_kits_replay_budget_go_without_transparent_retry() {
        let (life, mut retrier) = (life(), Retrier::default());
        let budget = &life.state.replay;
        // Other calls keep all but 4 bytes of the budget.
        assert!(budget.take(crate::life::REPLAY_BUDGET - 4));
        let (sent, unsent) = Unsent::split(request("hello"), &mut retrier, &life);
        let _ = sent.into_body().collect().await.unwrap();
        assert!(
            unsent.again(&refused()).is_none(),
            "5 bytes do not fit in 4"
        );
        assert_eq!(budget.used(), crate::life::REPLAY_BUDGET - 4);
        // They end: the next call keeps its frames, holds them until its retry is sent, and
        // gives them back.
        budget.give(crate::life::REPLAY_BUDGET - 4);
        let (sent, unsent) = Unsent::split(request("hello"), &mut retrier, &life);
        let _ = sent.into_body().collect().await.unwrap();
        assert_eq!(budget.used(), 5);
        let (again, _) = unsent.again(&refused()).expect("within the budget");
        assert_eq!(budget.used(), 5, "held by the body sent again");
        assert_eq!(
            again.into_body().collect().await.unwrap().to_bytes(),
            "hello"
        );
        assert_eq!(budget.used(), 0);
    }
}

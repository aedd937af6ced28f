//! Readiness: a clone reserves one ready endpoint in `poll_ready` and `call` uses it; not-ready
//! endpoints are skipped or waited on with a real waker; no worker hop on the request path.

mod support;

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use balance_layer::{Balance, BalanceConfig, NoCard, NoHealthyTargets, WithCard, WithoutCards};
use endpoint_state::{EndpointCard, HasCard, HealthVerdict};
use futures_util::{FutureExt, Stream, TryStreamExt};
use support::{Counted, Req, call, list, settle};
use tokio_test::{assert_pending, assert_ready_ok, task};
use tower::Service;
use tower::discover::{Change, ServiceList};
use tower_test::mock;

type Mock = mock::Mock<Req, Arc<str>>;
type Handle = mock::Handle<Req, Arc<str>>;
type Named<S> = Vec<(Arc<str>, S)>;
type Counter = Arc<AtomicUsize>;

fn mocks(n: usize) -> (Named<NoCard<Mock>>, Vec<Handle>) {
    (0..n)
        .map(|i| {
            let (svc, handle) = mock::pair();
            ((Arc::from(format!("m{i}")), NoCard::new(svc)), handle)
        })
        .unzip()
}

/// A discovery of two endpoints: the mock `m0` and `other`, keyed by their names.
fn mock_and(
    mock: Mock,
    other: &Counted,
) -> impl Stream<Item = Result<Change<String, Either>, Infallible>> + use<> {
    futures_util::stream::iter([
        Ok(Change::Insert("m0".to_string(), Either::A(mock))),
        Ok(Change::Insert(
            other.name.to_string(),
            Either::B(other.clone()),
        )),
    ])
}

#[tokio::test]
async fn an_endpoint_that_is_not_ready_is_skipped_for_one_that_is() {
    let (mut eps, mut handles) = mocks(1);
    handles[0].allow(0);
    let ready_one = Counted::plain("ready");
    let mock = eps.remove(0).1.into_inner();
    let mut balance = Balance::new(
        WithoutCards::new(mock_and(mock, &ready_one)),
        BalanceConfig::new(),
    )
    .unwrap();
    let mut t = task::spawn(());
    for _ in 0..10 {
        assert_ready_ok!(t.enter(|cx, _| balance.poll_ready(cx)));
        let reply = balance
            .call(Req::default())
            .now_or_never()
            .unwrap()
            .unwrap();
        assert_eq!(&*reply, "ready");
    }
    assert_eq!(ready_one.hits(), 10);
}

/// Two endpoint types in one discovery.
#[derive(Clone)]
enum Either {
    A(Mock),
    B(Counted),
}

impl Service<Req> for Either {
    type Response = Arc<str>;
    type Error = tower::BoxError;
    type Future = futures_util::future::Either<
        <Mock as Service<Req>>::Future,
        futures_util::future::MapErr<
            Ready<Result<Arc<str>, Infallible>>,
            fn(Infallible) -> tower::BoxError,
        >,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), tower::BoxError>> {
        match self {
            Either::A(m) => m.poll_ready(cx),
            Either::B(c) => Service::<Req>::poll_ready(c, cx).map_err(|e| match e {}),
        }
    }

    fn call(&mut self, req: Req) -> Self::Future {
        use futures_util::TryFutureExt;
        match self {
            Either::A(m) => futures_util::future::Either::Left(m.call(req)),
            Either::B(c) => futures_util::future::Either::Right(
                c.call(req)
                    .map_err((|e: Infallible| match e {}) as fn(Infallible) -> tower::BoxError),
            ),
        }
    }
}

/// Two endpoints, neither ready: a clone waits without a busy re-poll, and endpoint `which`
/// becoming ready wakes it and takes the call.
async fn nothing_ready_until(which: usize) {
    let (eps, mut handles) = mocks(2);
    for h in &mut handles {
        h.allow(0);
    }
    let mut balance = Balance::new(list(&eps), BalanceConfig::new()).unwrap();
    let mut t = task::spawn(());
    assert_pending!(t.enter(|cx, _| balance.poll_ready(cx)));
    assert_pending!(t.enter(|cx, _| balance.poll_ready(cx)));
    assert!(!t.is_woken(), "no busy re-poll");

    handles[which].allow(1);
    assert!(t.is_woken());
    assert_ready_ok!(t.enter(|cx, _| balance.poll_ready(cx)));
    let fut = balance.call(Req::default());
    let (_, reply) = handles[which].next_request().await.unwrap();
    let name = format!("m{which}");
    reply.send_response(Arc::from(name.as_str()));
    assert_eq!(*fut.await.unwrap(), *name);
}

#[tokio::test]
async fn pending_while_nothing_is_ready_and_woken_when_one_is() {
    // Either endpoint becoming ready wakes the waiting clone: here the first one tried.
    nothing_ready_until(0).await;
}

#[tokio::test]
async fn the_second_candidate_becoming_ready_wakes_too() {
    nothing_ready_until(1).await;
}

/// An always-ready endpoint that counts, for itself alone, how often it is polled ready, how
/// many of its clones hold a reservation (a permit taken in `poll_ready`, released by `call` or
/// drop), and how many calls it took; it answers with its own name.
#[derive(Debug)]
struct Permits {
    name: Arc<str>,
    polls: Counter,
    held: Counter,
    calls: Counter,
    holding: bool,
    card: EndpointCard,
}

impl Permits {
    fn polls(&self) -> usize {
        self.polls.load(Ordering::SeqCst)
    }

    fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Clone for Permits {
    fn clone(&self) -> Self {
        Permits {
            name: self.name.clone(),
            polls: self.polls.clone(),
            held: self.held.clone(),
            calls: self.calls.clone(),
            holding: false,
            card: self.card.clone(),
        }
    }
}

impl Drop for Permits {
    fn drop(&mut self) {
        if self.holding {
            self.held.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl HasCard for Permits {
    fn card(&self) -> Option<&EndpointCard> {
        Some(&self.card)
    }
}

impl Service<Req> for Permits {
    type Response = Arc<str>;
    type Error = Infallible;
    type Future = Ready<Result<Arc<str>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        if !self.holding {
            self.holding = true;
            self.held.fetch_add(1, Ordering::SeqCst);
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Req) -> Self::Future {
        assert!(self.holding, "called without a permit");
        self.holding = false;
        self.held.fetch_sub(1, Ordering::SeqCst);
        self.calls.fetch_add(1, Ordering::SeqCst);
        ready(Ok(self.name.clone()))
    }
}

/// `n` endpoints `p0`..: each with its own counters.
fn permits(n: usize) -> Named<Permits> {
    (0..n)
        .map(|i| {
            let name: Arc<str> = format!("p{i}").into();
            let svc = Permits {
                name: name.clone(),
                polls: Counter::default(),
                held: Counter::default(),
                calls: Counter::default(),
                holding: false,
                card: EndpointCard::new(name.clone()),
            };
            (name, svc)
        })
        .collect()
}

/// Per endpoint, in order: (polls, reservations held, calls taken).
fn counts(eps: &Named<Permits>) -> Vec<(usize, usize, usize)> {
    eps.iter()
        .map(|(_, e)| (e.polls(), e.held(), e.calls()))
        .collect()
}

#[tokio::test]
async fn a_clone_reserves_at_most_one_endpoint_and_call_uses_it() {
    let eps = permits(3);
    let mut balance = Balance::new(list(&eps), BalanceConfig::new()).unwrap();
    let mut t = task::spawn(());
    assert_ready_ok!(t.enter(|cx, _| balance.poll_ready(cx)));
    assert_ready_ok!(t.enter(|cx, _| balance.poll_ready(cx)));
    assert_ready_ok!(t.enter(|cx, _| balance.poll_ready(cx)));
    // Round-robin starts at p0: polled once and reserved, however often the clone is asked;
    // no other endpoint touched.
    assert_eq!(counts(&eps), [(1, 1, 0), (0, 0, 0), (0, 0, 0)]);
    let reply = balance.call(Req::default()).await.unwrap();
    assert_eq!(&*reply, "p0", "the call goes to the endpoint reserved");
    assert_eq!(counts(&eps), [(1, 0, 1), (0, 0, 0), (0, 0, 0)]);

    // Two clones: one reservation each, on the next two endpoints.
    let mut other = balance.clone();
    assert_ready_ok!(t.enter(|cx, _| balance.poll_ready(cx)));
    assert_ready_ok!(t.enter(|cx, _| other.poll_ready(cx)));
    assert_eq!(counts(&eps), [(1, 0, 1), (1, 1, 0), (1, 1, 0)]);
    drop(other);
    assert_eq!(
        counts(&eps),
        [(1, 0, 1), (1, 1, 0), (1, 0, 0)],
        "dropping a ready clone releases its own reservation, and only that"
    );
    assert_eq!(&*balance.call(Req::default()).await.unwrap(), "p1");
    drop(balance);
    assert!(eps.iter().all(|(_, e)| e.held() == 0));
}

#[tokio::test]
async fn a_reservation_is_given_up_when_its_endpoint_turns_ineligible() {
    let eps = permits(2);
    let mut balance = Balance::new(list(&eps), BalanceConfig::new()).unwrap();
    let mut t = task::spawn(());
    assert_ready_ok!(t.enter(|cx, _| balance.poll_ready(cx)));
    // Round-robin starts at p0.
    assert_eq!(counts(&eps), [(1, 1, 0), (0, 0, 0)]);
    eps[0].1.card.set_health(HealthVerdict::Unhealthy, None);
    assert_ready_ok!(t.enter(|cx, _| balance.poll_ready(cx)));
    // p0's reservation is given back and p1 reserved instead; p0 is not asked again.
    assert_eq!(counts(&eps), [(1, 0, 0), (1, 1, 0)]);
    let reply = balance.call(Req::default()).await.unwrap();
    assert_eq!(&*reply, "p1", "the call goes to the eligible endpoint");
    assert_eq!(counts(&eps), [(1, 0, 0), (1, 0, 1)]);
}

#[tokio::test]
#[should_panic(expected = "before poll_ready")]
async fn a_clone_starts_unready() {
    let eps = permits(1);
    let mut balance = Balance::new(list(&eps), BalanceConfig::new()).unwrap();
    let mut t = task::spawn(());
    assert_ready_ok!(t.enter(|cx, _| balance.poll_ready(cx)));
    let mut clone = balance.clone();
    drop(clone.call(Req::default()));
}

#[tokio::test]
async fn poll_ready_never_fails_when_nothing_is_eligible() {
    let eps = permits(2);
    for (_, e) in &eps {
        e.card.set_health(HealthVerdict::Unhealthy, None);
    }
    let mut balance = Balance::new(list(&eps), BalanceConfig::new()).unwrap();
    settle(|| balance.eligible_targets().is_empty()).await;
    let mut t = task::spawn(());
    for _ in 0..3 {
        assert_ready_ok!(t.enter(|cx, _| balance.poll_ready(cx)));
    }
    assert_eq!(
        counts(&eps),
        [(0, 0, 0), (0, 0, 0)],
        "nothing polled, nothing reserved"
    );
    let err = balance.call(Req::default()).await.unwrap_err();
    assert!(err.is::<NoHealthyTargets>());
}

#[tokio::test]
async fn an_endpoint_that_fails_poll_ready_is_taken_out_and_named() {
    let (mut eps, mut handles) = mocks(1);
    handles[0].send_error("connection pool closed");
    let backup = Counted::carded("backup");
    let mock = eps.remove(0).1.into_inner();
    // Each with a card: the mock's own, and the backup's.
    let discover = mock_and(mock, &backup).map_ok(|change| match change {
        Change::Insert(k, Either::B(c)) => {
            let card = c.card().clone();
            Change::Insert(k, WithCard::new(Either::B(c), card))
        }
        Change::Insert(k, a) => Change::Insert(k, WithCard::new(a, EndpointCard::new("m0"))),
        Change::Remove(k) => Change::Remove(k),
    });
    let mut balance = Balance::new(discover, BalanceConfig::new()).unwrap();
    for _ in 0..4 {
        let reply = call(&mut balance, Req::default()).await.unwrap();
        assert_eq!(&*reply, "backup");
    }
    settle(|| balance.eligible_targets().len() == 1).await;

    backup
        .card()
        .set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    settle(|| balance.eligible_targets().is_empty()).await;
    let err = call(&mut balance, Req::default()).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("m0: failed: connection pool closed"),
        "{text}"
    );
    assert!(text.contains("backup: unhealthy (NOT_SERVING)"), "{text}");
}

#[tokio::test]
async fn no_worker_hop_the_call_completes_on_its_first_poll() {
    // With a Buffer in front, a call needs a worker task to run before it can complete.
    let eps: Vec<Counted> = (0..3).map(|i| Counted::plain(&format!("n{i}"))).collect();
    let mut balance = Balance::new(
        WithoutCards::new(ServiceList::new::<Req>(eps.clone())),
        BalanceConfig::new(),
    )
    .unwrap();
    let cx = &mut Context::from_waker(std::task::Waker::noop());
    for _ in 0..9 {
        assert!(matches!(balance.poll_ready(cx), Poll::Ready(Ok(()))));
        let mut fut = std::pin::pin!(balance.call(Req::default()));
        assert!(fut.as_mut().poll(cx).is_ready());
    }
    assert!(eps.iter().all(|e| e.hits() == 3));
}

#[tokio::test]
async fn a_rejected_call_reads_a_bounded_number_of_cards_and_says_a_bounded_amount() {
    // 10,000 targets, each unhealthy for a long reason.
    let eps = permits(10_000);
    let reason = "NOT_SERVING: the server said so at length; ".repeat(20);
    for (_, e) in &eps {
        e.card
            .set_health(HealthVerdict::Unhealthy, Some(reason.as_str().into()));
    }
    let mut balance = Balance::new(list(&eps), BalanceConfig::new()).unwrap();
    settle(|| balance.targets().len() == 10_000).await;
    let err = call(&mut balance, Req::default()).await.unwrap_err();
    let no_healthy = err.downcast_ref::<NoHealthyTargets>().unwrap();
    // The first targets, each with why; the rest counted, not read.
    let listed = no_healthy.targets();
    assert_eq!(listed.len(), 16, "targets read for one rejected call");
    assert_eq!(no_healthy.unlisted(), 10_000 - 16);
    assert_eq!(&*listed[0].target, "p0");
    let message = no_healthy.status().message();
    assert!(message.len() <= 4_096, "{} bytes", message.len());
    assert!(
        message.starts_with("no healthy targets: p0: unhealthy (NOT_SERVING"),
        "{message}"
    );
    assert!(message.contains(" more"), "{message}");
    assert!(message.len() == no_healthy.to_string().len());
}

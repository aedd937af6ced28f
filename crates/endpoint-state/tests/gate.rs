//! The gate: pending while shut, woken by the card or its timer, never an error, never a
//! busy re-poll — and what that buys under tower's `ReadyCache`.

use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use endpoint_state::{BreakerState, EndpointCard, Gate, GateCheck, HealthVerdict, Opened};
use tokio::time::Instant;
use tokio_test::{assert_pending, assert_ready, assert_ready_ok, task};
use tower::Service;
use tower::ready_cache::ReadyCache;

/// Health gate check: shut unless the verdict admits calls.
fn health(card: &EndpointCard) -> GateCheck {
    if card.health_verdict().admits() {
        GateCheck::Open
    } else {
        GateCheck::Shut
    }
}

/// Quarantine-style check: shut until the quarantine ends.
fn quarantine(card: &EndpointCard) -> GateCheck {
    match card.quarantine_state().until {
        Some(until) if until > Instant::now() => GateCheck::ShutUntil(until),
        _ => GateCheck::Open,
    }
}

/// A minimal gated service, as a layer would build one, counting its `poll_ready` calls.
struct Gated<S> {
    gate: Gate,
    inner: S,
    polls: Arc<AtomicUsize>,
}

impl<S> Gated<S> {
    fn new(card: &EndpointCard, inner: S) -> Self {
        Gated {
            gate: Gate::new(card.clone()),
            inner,
            polls: Arc::default(),
        }
    }
}

impl<S: Service<R>, R> Service<R> for Gated<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        std::task::ready!(self.gate.poll_open(cx, |c| {
            match (health(c), quarantine(c)) {
                (GateCheck::Open, q) => q,
                (shut, _) => shut,
            }
        }));
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> S::Future {
        self.inner.call(req)
    }
}

fn unknown_card(name: &str) -> EndpointCard {
    let card = EndpointCard::new(name);
    card.set_health(HealthVerdict::Unknown, Some("no probe yet".into()));
    card
}

#[tokio::test]
async fn pending_while_shut() {
    let card = unknown_card("b1");
    let mut gate = Gate::new(card.clone());
    let mut t = task::spawn(());
    assert_pending!(t.enter(|cx, _| gate.poll_open(cx, health)));
    assert_pending!(t.enter(|cx, _| gate.poll_open(cx, health)));
    card.set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    assert!(t.is_woken(), "a change of the card wakes the waiter");
    assert_pending!(t.enter(|cx, _| gate.poll_open(cx, health)));
}

#[tokio::test]
async fn woken_and_ready_when_the_line_opens() {
    let card = unknown_card("b1");
    let mut gate = Gate::new(card.clone());
    let mut t = task::spawn(());
    assert_pending!(t.enter(|cx, _| gate.poll_open(cx, health)));
    assert!(!t.is_woken());
    card.set_health(HealthVerdict::Healthy, None);
    assert!(t.is_woken());
    assert_eq!(
        assert_ready!(t.enter(|cx, _| gate.poll_open(cx, health))),
        Opened::Open
    );
}

#[tokio::test]
async fn a_change_between_the_look_and_the_subscription_is_not_lost() {
    let card = unknown_card("b1");
    let mut gate = Gate::new(card.clone());
    let mut t = task::spawn(());
    // The check itself opens the line the first time it runs (a write racing the gate's look):
    // the gate must notice on its own second look rather than sleep forever.
    let mut first = true;
    let poll = t.enter(|cx, _| {
        gate.poll_open(cx, |c| {
            let verdict = health(c);
            if first {
                first = false;
                c.set_health(HealthVerdict::Healthy, None);
            }
            verdict
        })
    });
    assert_eq!(assert_ready!(poll), Opened::Open);
}

#[tokio::test(start_paused = true)]
async fn woken_at_the_deadline() {
    let card = EndpointCard::new("b1");
    card.quarantine_for(Duration::from_secs(5), Some("UNAVAILABLE".into()));
    let mut gate = Gate::new(card.clone());
    let mut t = task::spawn(());
    assert_pending!(t.enter(|cx, _| gate.poll_open(cx, quarantine)));

    tokio::time::advance(Duration::from_millis(4_999)).await;
    assert!(!t.is_woken(), "not before the deadline");
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(t.is_woken(), "the reused timer fires at the deadline");
    assert_ready!(t.enter(|cx, _| gate.poll_open(cx, quarantine)));
}

#[tokio::test(start_paused = true)]
async fn deadline_passed_is_reported_when_the_check_still_says_shut() {
    // A breaker-style check: the line stays `Open { until }` until the breaker itself moves it;
    // the gate reports that the instant passed so the breaker can go half-open.
    let card = EndpointCard::new("b1");
    let until = Instant::now() + Duration::from_secs(2);
    card.set_breaker(BreakerState::Open { until }, None);
    let mut gate = Gate::new(card.clone());
    let check = |c: &EndpointCard| match c.breaker_state() {
        BreakerState::Open { until } => GateCheck::ShutUntil(until),
        _ => GateCheck::Open,
    };
    let mut t = task::spawn(());
    assert_pending!(t.enter(|cx, _| gate.poll_open(cx, check)));
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(t.is_woken());
    assert_eq!(
        assert_ready!(t.enter(|cx, _| gate.poll_open(cx, check))),
        Opened::DeadlinePassed
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_deadline_moves_the_timer() {
    let card = EndpointCard::new("b1");
    card.quarantine_for(Duration::from_secs(5), None);
    let mut gate = Gate::new(card.clone());
    let mut t = task::spawn(());
    assert_pending!(t.enter(|cx, _| gate.poll_open(cx, quarantine)));
    // Renewed: now 10 s from here.
    card.quarantine_for(Duration::from_secs(10), Some("renewed".into()));
    assert!(t.is_woken());
    assert_pending!(t.enter(|cx, _| gate.poll_open(cx, quarantine)));
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(!t.is_woken(), "the old deadline no longer fires");
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(t.is_woken());
    assert_ready!(t.enter(|cx, _| gate.poll_open(cx, quarantine)));
}

/// Drive `poll_ready` of a gated service in a real task for a long stretch of (paused) time and
/// count how often the runtime polls it: once to go pending, once per real event.
#[tokio::test(start_paused = true)]
async fn no_spurious_re_polls() {
    let card = unknown_card("b1");
    let svc = Gated::new(&card, tower::service_fn(|()| async { Ok::<_, ()>(()) }));
    let polls = svc.polls.clone();
    let waiter = tokio::spawn(async move {
        let mut svc = svc;
        poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    });

    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(
        polls.load(Ordering::SeqCst),
        1,
        "shut and idle: polled once, then left alone"
    );

    // A quarantine with a deadline: one wake for the change, one at the deadline.
    card.set_health(HealthVerdict::Healthy, None);
    card.quarantine_for(Duration::from_secs(30), None);
    // Both writes happened before the task ran again, so they cost a single re-poll.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(polls.load(Ordering::SeqCst), 2);
    tokio::time::sleep(Duration::from_secs(21)).await;
    waiter.await.unwrap();
    assert_eq!(
        polls.load(Ordering::SeqCst),
        3,
        "ready at the deadline, no poll in between"
    );
}

#[tokio::test]
async fn a_shut_gate_is_pending_never_an_error() {
    let card = unknown_card("b1");
    let (mock, mut handle) = tower_test::mock::pair::<(), ()>();
    handle.allow(1);
    let mut svc = tower_test::mock::Spawn::new(Gated::new(&card, mock));
    // The inner service is ready, but the gate is shut: `Pending`, not `Err`.
    assert_pending!(svc.poll_ready());
    card.set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    assert!(svc.is_woken());
    assert_pending!(svc.poll_ready());
    card.set_health(HealthVerdict::Healthy, None);
    assert!(svc.is_woken());
    assert_ready_ok!(svc.poll_ready());
}

#[tokio::test]
async fn an_open_gate_does_not_wake_its_last_waiter_on_later_changes() {
    let card = unknown_card("b1");
    let mut gate = Gate::new(card.clone());
    let mut t = task::spawn(());
    assert_pending!(t.enter(|cx, _| gate.poll_open(cx, health)));
    card.set_health(HealthVerdict::Healthy, None);
    assert!(t.is_woken());
    assert_ready!(t.enter(|cx, _| gate.poll_open(cx, health)));
    // Open now: the gate gave up its subscription, so unrelated writes leave the task alone.
    card.set_breaker(BreakerState::HalfOpen { busy: false }, None);
    card.set_breaker(BreakerState::Closed, None);
    assert!(!t.is_woken());
}

#[tokio::test]
async fn ready_cache_keeps_a_shut_endpoint_and_brings_it_back() {
    let cards = [unknown_card("a"), unknown_card("b")];
    cards[0].set_health(HealthVerdict::Healthy, None);
    let mut cache = ReadyCache::<&str, Gated<tower_test::mock::Mock<(), ()>>, ()>::default();
    let mut handles = Vec::new();
    for (name, card) in ["a", "b"].into_iter().zip(&cards) {
        let (mock, mut handle) = tower_test::mock::pair::<(), ()>();
        handle.allow(100);
        handles.push(handle);
        cache.push(name, Gated::new(card, mock));
    }
    let mut t = task::spawn(());

    let _ = t.enter(|cx, _| cache.poll_pending(cx));
    assert_eq!(cache.ready_len(), 1, "only the healthy endpoint is ready");
    assert_eq!(
        cache.pending_len(),
        1,
        "the shut endpoint waits; it is not evicted"
    );

    // However often the cache is polled, the shut endpoint is never failed out.
    for _ in 0..10 {
        assert!(t.enter(|cx, _| cache.poll_pending(cx)).is_pending());
    }
    assert_eq!(cache.pending_len(), 1);

    cards[1].set_health(HealthVerdict::Healthy, Some("SERVING".into()));
    assert!(t.is_woken(), "opening the gate wakes the cache");
    assert_ready_ok!(t.enter(|cx, _| cache.poll_pending(cx)));
    assert_eq!(cache.ready_len(), 2);
    assert_eq!(cache.pending_len(), 0);

    // And a call goes to it.
    let fut = cache.call_ready(&"b", ());
    let (_, send) = handles[1].next_request().await.unwrap();
    send.send_response(());
    fut.await.unwrap();
}

/// The gate's contract where it matters: tower's own p2c balancer over three real tonic
/// backends. A shut endpoint is skipped (not evicted, not failed) and gets calls again once
/// its line opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2c_balancer_skips_a_shut_endpoint_and_returns_to_it() {
    use test_backends::Backends;
    use test_backends::pb::Ping;
    use test_backends::pb::test_service_client::TestServiceClient;
    use tower::balance::p2c::Balance;
    use tower::discover::ServiceList;
    use tower::load::{CompleteOnResponse, PendingRequestsDiscover};

    let backends = Backends::start(3).await.unwrap();
    let cards: Vec<EndpointCard> = backends
        .iter()
        .map(|b| EndpointCard::new(b.name()))
        .collect();
    let mut endpoints = Vec::new();
    for (b, card) in backends.iter().zip(&cards) {
        let channel = tonic::transport::Endpoint::from_shared(b.uri())
            .unwrap()
            .connect()
            .await
            .unwrap();
        endpoints.push(Gated::new(card, channel));
    }
    let discover =
        PendingRequestsDiscover::new(ServiceList::new(endpoints), CompleteOnResponse::default());
    let balance = Balance::new(discover);
    let mut client = TestServiceClient::new(tower::buffer::Buffer::new(balance, 64));

    let mut calls = async |n: usize| {
        for _ in 0..n {
            client
                .unary(Ping::default())
                .await
                .expect("a healthy backend answers");
        }
    };
    calls(30).await;
    assert!(
        backends.iter().all(|b| b.hits() > 0),
        "all three take calls"
    );

    cards[1].set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    let before = backends[1].hits();
    calls(60).await;
    assert_eq!(backends[1].hits(), before, "a shut endpoint gets no call");

    cards[1].set_health(HealthVerdict::Healthy, Some("SERVING".into()));
    calls(60).await;
    assert!(
        backends[1].hits() > before,
        "once open it is back in rotation"
    );
}

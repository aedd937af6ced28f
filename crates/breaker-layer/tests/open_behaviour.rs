//! While open: `Pending` with a timer at the half-open instant (and no busy loop), or fail
//! fast with an error a generated tonic client sees as `UNAVAILABLE` naming the target and
//! when it will be retried.

mod support;

use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use breaker_layer::{BreakerConfig, BreakerLayer, BreakerOpen, WhenOpen};
use endpoint_state::error::is_caused_by;
use endpoint_state::{BreakerState, EndpointCard};
use support::{Reply, breaker, call, fails, is_open, open_for, refused, run, send};
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::{Backend, fixture};
use tokio::time::Instant;
use tokio_test::{assert_pending, assert_ready_ok, task};
use tonic::Code;
use tower::{Layer, Service};

fn trip_on_one() -> BreakerConfig {
    BreakerConfig::default()
        .consecutive_failures(1)
        .open_base(Duration::from_secs(5))
        .open_jitter(0.0)
}

#[tokio::test(start_paused = true)]
async fn wait_mode_is_pending_until_a_timer_at_the_half_open_instant() {
    let (mut svc, script, card) = breaker(trip_on_one());
    run(&mut svc, &script, &fails(1)).await;
    let until = match card.breaker_state() {
        BreakerState::Open { until } => until,
        other => panic!("{other:?}"),
    };
    let mut t = task::spawn(());
    assert_pending!(
        t.enter(|cx, _| svc.poll_ready(cx)),
        "never an error while open"
    );
    tokio::time::advance(Duration::from_millis(4_999)).await;
    assert!(
        !t.is_woken(),
        "nothing wakes the task before the open period ends"
    );
    tokio::time::advance(Duration::from_millis(2)).await;
    assert!(t.is_woken(), "the timer fires at the half-open instant");
    assert_ready_ok!(t.enter(|cx, _| svc.poll_ready(cx)));
    assert!(Instant::now() >= until);
    assert_eq!(
        card.breaker_state(),
        BreakerState::HalfOpen { busy: true },
        "half-open, and this service holds the only permit"
    );
}

#[tokio::test(start_paused = true)]
async fn wait_mode_does_not_busy_poll() {
    let (mut svc, script, card) = breaker(trip_on_one());
    run(&mut svc, &script, &fails(1)).await;
    let until = match card.breaker_state() {
        BreakerState::Open { until } => until,
        other => panic!("{other:?}"),
    };
    // A real task waits for readiness; the paused clock jumps to the next timer only when
    // every task is idle, so a busy re-poll would spin here instead of reaching the timer.
    let polls = Arc::new(AtomicUsize::new(0));
    let counted = polls.clone();
    let waiter = tokio::spawn(async move {
        poll_fn(|cx| {
            if counted.fetch_add(1, Ordering::SeqCst) >= 100 {
                return Poll::Ready(Err("busy re-poll".into()));
            }
            svc.poll_ready(cx)
        })
        .await
        .map(|()| Instant::now())
    });
    let ready_at = waiter.await.unwrap().unwrap();
    let polls = polls.load(Ordering::SeqCst);
    assert!(polls <= 2, "polled {polls} times over a 5 s open period");
    assert!(ready_at >= until && ready_at < until + Duration::from_millis(10));
}

#[tokio::test(start_paused = true)]
async fn wait_mode_forced_open_waits_for_the_operator() {
    let (mut svc, _script, card) = breaker(trip_on_one());
    let handle = svc.handle();
    handle.force_open(None);
    let mut t = task::spawn(());
    assert_pending!(t.enter(|cx, _| svc.poll_ready(cx)));
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(!t.is_woken(), "no timer: only the operator releases it");
    assert_pending!(t.enter(|cx, _| svc.poll_ready(cx)));
    handle.reset();
    assert!(t.is_woken());
    assert_ready_ok!(t.enter(|cx, _| svc.poll_ready(cx)));
    assert_eq!(card.breaker_state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn fail_fast_refuses_without_calling_and_recovers_after_the_open_period() {
    let (mut svc, script, card) = breaker(trip_on_one().when_open(WhenOpen::FailFast));
    run(&mut svc, &script, &fails(1)).await;
    tokio::time::advance(Duration::from_millis(800)).await;
    let open = refused(&mut svc).await;
    assert_eq!(open.target(), "b1");
    assert_eq!(open.retry_in(), Some(Duration::from_millis(4_200)));
    assert_eq!(
        open.to_string(),
        "b1: breaker open, retry in 4.2 s (after 1 consecutive failure (last: UNAVAILABLE: scripted))"
    );
    assert_eq!(
        script.calls(),
        1,
        "a refused call never reaches the channel"
    );

    tokio::time::advance(open_for(&card)).await;
    call(&mut svc).await.expect("the probe goes through");
    assert_eq!(card.breaker_state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn fail_fast_while_the_probe_is_in_flight() {
    let (mut svc, script, _card) = breaker(trip_on_one().when_open(WhenOpen::FailFast));
    run(&mut svc, &script, &fails(1)).await;
    tokio::time::advance(Duration::from_secs(5)).await;
    let mut other = svc.clone();
    script.push([Reply::Hang]);
    let mut probe = task::spawn(send(&mut svc));
    assert_pending!(probe.poll());
    let open = refused(&mut other).await;
    assert_eq!(open.state(), BreakerState::HalfOpen { busy: true });
    assert!(
        open.to_string()
            .starts_with("b1: breaker half-open, probe calls in flight")
    );
}

#[tokio::test]
async fn fail_fast_reaches_a_generated_client_as_unavailable_naming_target_and_retry() {
    let b = Backend::start("b0").await.unwrap();
    let channel = fixture::connect_lazy(&b);
    let target = b.addr().to_string();
    let config = trip_on_one()
        .open_base(Duration::from_secs(30))
        .when_open(WhenOpen::FailFast);
    let layer = BreakerLayer::new(EndpointCard::new(target.clone()), config).unwrap();
    let mut client = TestServiceClient::new(layer.layer(channel));

    b.fail_always(Some(Code::Unavailable));
    let first = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(first.code(), Code::Unavailable);
    assert!(is_open(layer.card()));
    assert_eq!(b.hits(), 1);

    let refused = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(
        refused.code(),
        Code::Unavailable,
        "not UNKNOWN: {refused:?}"
    );
    let msg = refused.message();
    assert!(
        msg.starts_with(&format!("{target}: breaker open, retry in ")),
        "{msg}"
    );
    assert!(
        msg.contains(" s (after 1 consecutive failure (last: UNAVAILABLE"),
        "{msg}"
    );
    assert_eq!(b.hits(), 1, "the backend never saw the refused call");
    // The typed error is still there for whoever wants it.
    assert!(is_caused_by::<BreakerOpen>(&refused), "{refused:?}");
}

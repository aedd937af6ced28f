//! Eligibility from the cards: exact set, quarantine never empties it, deadlines reopen it,
//! `NoHealthyTargets`, and wait-for-ready.

mod support;

use std::convert::Infallible;
use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use balance_layer::error::BoxError;
use balance_layer::{Balance, BalanceConfig, NoHealthyTargets};
use endpoint_state::{BreakerState, HealthVerdict};
use futures_util::{FutureExt, Stream};
use support::{Counted, Req, call, carded, list_counted, settle, tally};
use tokio::time::Instant;
use tokio_test::{assert_pending, assert_ready};
use tower::discover::Change;
use tower::{Service, ServiceExt};

fn no_healthy(e: BoxError) -> Box<NoHealthyTargets> {
    e.downcast::<NoHealthyTargets>()
        .unwrap_or_else(|e| panic!("expected NoHealthyTargets, got {e}"))
}

#[tokio::test]
async fn nothing_eligible_fails_at_once_listing_every_target_and_why() {
    // Every target has evidence against it (none is connecting), and health shuts each one:
    // passive signals alone never would (see `passive_signals_alone_never_empty_the_choice`).
    let eps = carded(3);
    let mut balance = Balance::new(list_counted(&eps), BalanceConfig::new()).unwrap();
    eps[0]
        .card()
        .set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    eps[1]
        .card()
        .set_health(HealthVerdict::Unhealthy, Some("SERVICE_UNKNOWN".into()));
    eps[1].card().set_breaker(
        BreakerState::Open {
            until: Instant::now() + Duration::from_secs(30),
        },
        Some("5 consecutive failures".into()),
    );
    eps[2].card().set_health(
        HealthVerdict::Unhealthy,
        Some("UNAVAILABLE: connect failed".into()),
    );
    eps[2].card().quarantine_for(
        Duration::from_secs(3),
        Some("UNAVAILABLE: connection refused".into()),
    );

    // poll_ready is Ready (never an Err for a transient condition) and the call fails on its
    // first poll: no waiting.
    let svc = balance.ready().await.expect("poll_ready does not fail");
    let err = svc
        .call(Req::default())
        .now_or_never()
        .expect("fails at once")
        .unwrap_err();
    let err = no_healthy(err);
    let text = err.to_string();
    assert!(text.starts_with("no healthy targets: "), "{text}");
    assert!(text.contains("b0: unhealthy (NOT_SERVING)"), "{text}");
    assert!(
        text.contains("b1: unhealthy (SERVICE_UNKNOWN); breaker open, retry in")
            && text.contains("after 5 consecutive failures"),
        "{text}"
    );
    assert!(
        text.contains("b2: unhealthy (UNAVAILABLE: connect failed); quarantined")
            && text.contains("after UNAVAILABLE: connection refused"),
        "{text}"
    );
    assert_eq!(err.targets().len(), 3);

    // tonic finds an UNAVAILABLE status in the chain, with the same words.
    let status = err
        .source()
        .and_then(|s| s.downcast_ref::<tonic::Status>())
        .expect("a tonic::Status in source()");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    let boxed: BoxError = err;
    let via_tonic = tonic::Status::from_error(boxed);
    assert_eq!(via_tonic.code(), tonic::Code::Unavailable);
    assert!(via_tonic.message().contains("b0: unhealthy (NOT_SERVING)"));

    assert!(eps.iter().all(|e| e.hits() == 0));
}

#[tokio::test]
async fn no_target_discovered_says_so() {
    let eps = carded(0);
    let mut balance = Balance::new(list_counted(&eps), BalanceConfig::new()).unwrap();
    let err = no_healthy(call(&mut balance, Req::default()).await.unwrap_err());
    assert!(err.targets().is_empty());
    assert!(
        err.to_string()
            .contains("discovery ended without any target"),
        "{err}"
    );
}

#[tokio::test]
async fn a_call_decided_on_an_older_set_picks_again_when_targets_became_eligible() {
    // poll_ready runs while every target is still connecting (health unknown) and finds
    // nothing; the first verdicts land before `call` (a client's ready-then-call is not
    // atomic). The call must go to a target that is eligible now, not fail with
    // "eligible but not ready" (CI saw exactly that, on a kit's first call after build).
    let eps = carded(3);
    for e in &eps {
        e.card().set_health(HealthVerdict::Unknown, None);
    }
    let mut balance = Balance::new(list_counted(&eps), BalanceConfig::new()).unwrap();
    settle(|| balance.eligible_targets().is_empty()).await;
    balance.ready().await.expect("poll_ready does not fail");
    for e in &eps {
        e.card().set_health(HealthVerdict::Healthy, None);
    }
    settle(|| balance.eligible_targets().len() == 3).await;
    let reply = balance
        .call(Req::default())
        .await
        .expect("the call finds an eligible target");
    assert!(reply.starts_with('b'), "{reply}");
    assert_eq!(eps.iter().map(Counted::hits).sum::<usize>(), 1);
}

#[tokio::test]
async fn a_card_change_is_honoured_before_the_set_is_rebuilt() {
    // current_thread: the background task cannot run while this test does not yield, so the
    // snapshot stays stale; the per-pick check of the card must still keep b1 out.
    let eps = carded(3);
    let mut balance = Balance::new(list_counted(&eps), BalanceConfig::new()).unwrap();
    eps[1].card().set_health(HealthVerdict::Unhealthy, None);
    assert_eq!(balance.eligible_targets().len(), 3, "the snapshot is stale");
    let mut names = Vec::new();
    for _ in 0..30 {
        let svc = balance.ready().now_or_never().unwrap().unwrap();
        names.push(svc.call(Req::default()).now_or_never().unwrap().unwrap());
    }
    let t = tally(names);
    assert_eq!(t.get("b1"), None, "{t:?}");
    assert_eq!(t.values().sum::<usize>(), 30);
}

#[tokio::test]
async fn quarantine_narrows_the_choice_but_never_empties_it() {
    let eps = carded(3);
    let mut balance = Balance::new(list_counted(&eps), BalanceConfig::new()).unwrap();
    eps[0].card().quarantine_for(Duration::from_secs(60), None);
    eps[1].card().quarantine_for(Duration::from_secs(60), None);
    eps[2].card().set_health(HealthVerdict::Unhealthy, None);
    settle(|| balance.ignoring_passive_signals()).await;

    // Every otherwise eligible endpoint is quarantined: quarantine is ignored, health is not.
    let mut names = Vec::new();
    for _ in 0..20 {
        names.push(call(&mut balance, Req::default()).await.unwrap());
    }
    let t = tally(names);
    assert_eq!(
        (t.get("b0"), t.get("b1"), t.get("b2")),
        (Some(&10), Some(&10), None)
    );

    // One comes out of quarantine: only it is eligible again.
    eps[0].card().clear_quarantine();
    settle(|| !balance.ignoring_passive_signals()).await;
    assert_eq!(balance.eligible_targets(), [Arc::from("b0")]);
    for _ in 0..5 {
        assert_eq!(&*call(&mut balance, Req::default()).await.unwrap(), "b0");
    }
}

#[tokio::test(start_paused = true)]
async fn a_quarantine_deadline_reopens_the_endpoint_without_any_card_change() {
    let eps = carded(2);
    let balance = Balance::<_, Req>::new(list_counted(&eps), BalanceConfig::new()).unwrap();
    eps[0].card().quarantine_for(Duration::from_secs(3), None);
    settle(|| balance.eligible_targets().len() == 1).await;
    let version = eps[0].card().version();

    tokio::time::advance(Duration::from_millis(2_900)).await;
    settle(|| true).await;
    assert_eq!(
        balance.eligible_targets().len(),
        1,
        "still quarantined at 2.9 s"
    );

    tokio::time::advance(Duration::from_millis(101)).await;
    settle(|| balance.eligible_targets().len() == 2).await;
    assert_eq!(eps[0].card().version(), version, "only time passed");
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_deadline_reopens_the_endpoint() {
    let eps = carded(2);
    let balance = Balance::<_, Req>::new(list_counted(&eps), BalanceConfig::new()).unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    eps[1]
        .card()
        .set_breaker(BreakerState::Open { until }, None);
    settle(|| balance.eligible_targets().len() == 1).await;
    tokio::time::advance(Duration::from_secs(5)).await;
    settle(|| balance.eligible_targets().len() == 2).await;
}

/// A balancer with `config` over `eps`, every one of them unhealthy, once it has seen that.
async fn all_unhealthy(
    eps: &[Counted],
    config: BalanceConfig,
) -> Balance<impl Stream<Item = Result<Change<String, Counted>, Infallible>> + Send + use<>, Req> {
    for e in eps {
        e.card()
            .set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    }
    let balance = Balance::new(list_counted(eps), config).unwrap();
    settle(|| balance.eligible_targets().is_empty()).await;
    balance
}

#[tokio::test(start_paused = true)]
async fn wait_for_ready_waits_and_proceeds_when_one_comes_back() {
    let eps = carded(3);
    let mut balance = all_unhealthy(&eps, BalanceConfig::new().wait_for_ready(true)).await;

    let start = Instant::now();
    let fut = balance.ready().await.unwrap().call(Req::default());
    let mut fut = tokio_test::task::spawn(fut);
    assert_pending!(fut.poll());
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_pending!(fut.poll());

    eps[2].card().set_health(HealthVerdict::Healthy, None);
    settle(|| fut.is_woken()).await;
    let reply = assert_ready!(fut.poll()).unwrap();
    assert_eq!(&*reply, "b2");
    assert_eq!(eps[2].hits(), 1);
    assert!(start.elapsed() >= Duration::from_secs(10));
}

#[tokio::test(start_paused = true)]
async fn wait_for_ready_fails_at_the_callers_deadline() {
    let eps = carded(2);
    let mut balance = all_unhealthy(&eps, BalanceConfig::new().wait_for_ready(true)).await;

    let start = Instant::now();
    let req = Req {
        budget: Some(Duration::from_secs(2)),
    };
    let err = no_healthy(call(&mut balance, req).await.unwrap_err());
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(2),
        "exactly at the deadline"
    );
    assert_eq!(err.waited(), Some(Duration::from_secs(2)));
    assert_eq!(err.status().code(), tonic::Code::DeadlineExceeded);
    assert!(
        err.to_string().contains("b0: unhealthy (NOT_SERVING)"),
        "{err}"
    );
    assert!(err.to_string().contains("(waited 2.0 s)"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn wait_for_ready_is_capped_by_max_wait() {
    let eps = carded(1);
    let config = BalanceConfig::new()
        .wait_for_ready(true)
        .max_wait(Duration::from_millis(500));
    let mut balance = all_unhealthy(&eps, config).await;

    let start = Instant::now();
    // The caller would wait 10 s; the balancer's cap is 0.5 s: UNAVAILABLE, not a deadline.
    let req = Req {
        budget: Some(Duration::from_secs(10)),
    };
    let err = no_healthy(call(&mut balance, req).await.unwrap_err());
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    assert_eq!(err.status().code(), tonic::Code::Unavailable);
}

#[tokio::test(start_paused = true)]
async fn without_max_wait_a_call_waits_its_whole_deadline_and_a_call_without_one_20_s() {
    let eps = carded(1);
    let config = BalanceConfig::new().wait_for_ready(true);
    assert_eq!(config.max_wait, None);
    let mut balance = all_unhealthy(&eps, config).await;

    // A 60 s deadline is honoured to its end, as gRPC's wait-for-ready does: no 20 s cap.
    let start = Instant::now();
    let req = Req {
        budget: Some(Duration::from_secs(60)),
    };
    let err = no_healthy(call(&mut balance, req).await.unwrap_err());
    assert_eq!(start.elapsed(), Duration::from_secs(60));
    assert_eq!(err.status().code(), tonic::Code::DeadlineExceeded);

    // No deadline: the default bound, never forever.
    let start = Instant::now();
    let err = no_healthy(call(&mut balance, Req::default()).await.unwrap_err());
    assert_eq!(start.elapsed(), BalanceConfig::DEFAULT_MAX_WAIT);
    assert_eq!(err.status().code(), tonic::Code::Unavailable);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_call_keeps_discovery_alive_and_sees_new_endpoints() {
    let (tx, discover) = support::channel(4);
    let config = BalanceConfig::new().wait_for_ready(true);
    let mut balance = Balance::new(discover, config).unwrap();
    let fut = balance.ready().await.unwrap().call(Req::default());
    drop(balance); // only the waiting call holds the balancer now
    let mut fut = tokio_test::task::spawn(fut);
    assert_pending!(fut.poll());

    let late = Counted::carded("late");
    tx.send(tower::discover::Change::Insert(
        "late".to_string(),
        late.clone(),
    ))
    .await
    .unwrap();
    settle(|| fut.is_woken()).await;
    assert_eq!(&*assert_ready!(fut.poll()).unwrap(), "late");
}

#[tokio::test]
async fn a_reservation_survives_its_own_half_open_permit() {
    // A breaker that goes half-open with every permit taken — as it does when the reserved
    // service's own readiness took the permit — does not cost the reservation: asked again,
    // the balancer keeps the endpoint it holds instead of dropping it (and its permit) for
    // another.
    let eps = carded(2);
    let mut balance = Balance::new(list_counted(&eps), BalanceConfig::new()).unwrap();
    // Let discovery add both and learn which one the next pick is.
    std::future::poll_fn(|cx| balance.poll_ready(cx))
        .await
        .unwrap();
    let first = call(&mut balance, Req::default()).await.unwrap();
    let next = if &*first == "b0" { 1 } else { 0 };

    std::future::poll_fn(|cx| balance.poll_ready(cx))
        .await
        .unwrap();
    eps[next]
        .card()
        .set_breaker(BreakerState::HalfOpen { busy: true }, None);
    // Asked again before the call: still the same endpoint.
    std::future::poll_fn(|cx| balance.poll_ready(cx))
        .await
        .unwrap();
    let got = balance.call(Req::default()).await.unwrap();
    assert_eq!(&*got, &*format!("b{next}"));

    // Another endpoint's busy half-open breaker does shut it out of new picks.
    let picks = support::calls(&mut balance, 4).await;
    assert_eq!(tally(picks).get(&format!("b{next}")), None);
}

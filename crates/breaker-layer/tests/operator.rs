//! Operators: forced-open and disabled modes, reset, and the stream of transition events (the
//! card's events of the breaker line: from, to, why, when), including what a lagging
//! subscriber sees.

mod support;

use std::time::Duration;

use breaker_layer::{BreakerConfig, WhenOpen};
use endpoint_state::{BreakerState, LineKind};
use support::{breaker, call, fails, is_open, oks, refused, run, states};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn forced_open_refuses_every_call_until_reset() {
    let (mut svc, script, card) = breaker(BreakerConfig::default().when_open(WhenOpen::FailFast));
    let handle = svc.handle();
    handle.force_open(Some("maintenance".into()));
    assert_eq!(card.breaker_state(), BreakerState::ForcedOpen);
    assert!(!card.is_eligible());
    tokio::time::advance(Duration::from_secs(3600)).await;
    let open = refused(&mut svc).await;
    assert_eq!(open.state(), BreakerState::ForcedOpen);
    assert_eq!(
        open.to_string(),
        "b1: breaker forced open by an operator; no retry until it is released (after maintenance)"
    );
    assert_eq!(script.calls(), 0);
    handle.reset();
    call(&mut svc).await.unwrap();
    assert_eq!(script.calls(), 1);
    assert_eq!(card.breaker_state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn disabled_passes_every_call_and_counts_nothing() {
    let (mut svc, script, card) = breaker(BreakerConfig::default().consecutive_failures(1));
    let handle = svc.handle();
    handle.disable();
    assert_eq!(card.breaker_state(), BreakerState::Disabled);
    assert!(card.is_eligible());
    run(&mut svc, &script, &fails(20)).await;
    assert_eq!(
        card.breaker_state(),
        BreakerState::Disabled,
        "nothing counted"
    );
    assert_eq!(script.calls(), 20, "every call passed");
    handle.reset();
    run(&mut svc, &script, &fails(1)).await;
    assert!(is_open(&card), "counting again after reset");
}

#[tokio::test(start_paused = true)]
async fn reset_closes_an_open_breaker_and_forgets_the_backoff() {
    let config = BreakerConfig::default()
        .consecutive_failures(1)
        .open_base(Duration::from_secs(1))
        .open_jitter(0.0);
    let (mut svc, script, card) = breaker(config);
    run(&mut svc, &script, &fails(1)).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    run(&mut svc, &script, &fails(1)).await; // failed probe: now open for 2 s
    assert_eq!(support::open_for(&card), Duration::from_secs(2));
    svc.handle().reset();
    assert_eq!(card.breaker_state(), BreakerState::Closed);
    assert_eq!(
        card.breaker().reason.as_deref(),
        Some("reset by an operator")
    );
    run(&mut svc, &script, &fails(1)).await;
    assert_eq!(support::open_for(&card), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn every_transition_is_an_event_with_from_to_why_and_when() {
    let config = BreakerConfig::default()
        .consecutive_failures(2)
        .open_base(Duration::from_secs(1))
        .open_jitter(0.0);
    let (mut svc, script, card) = breaker(config);
    let handle = svc.handle();
    let mut events = handle.subscribe();

    run(&mut svc, &script, &fails(2)).await;
    let tripped_at = Instant::now();
    let e = events.recv().await.unwrap();
    assert_eq!(&*e.target, "b1");
    assert_eq!(e.line, LineKind::Breaker);
    assert_eq!(
        states(&e),
        (
            BreakerState::Closed,
            BreakerState::Open {
                until: tripped_at + Duration::from_secs(1)
            }
        )
    );
    assert_eq!(
        e.reason.as_deref(),
        Some("2 consecutive failures (last: UNAVAILABLE: scripted)")
    );
    assert_eq!(e.at, tripped_at);
    assert_eq!(card.breaker().reason, e.reason, "same text on the card");

    tokio::time::advance(Duration::from_secs(1)).await;
    run(&mut svc, &script, &oks(1)).await;
    let e = events.recv().await.unwrap();
    assert_eq!(
        states(&e),
        (
            BreakerState::Open {
                until: tripped_at + Duration::from_secs(1)
            },
            BreakerState::HalfOpen { busy: false }
        )
    );
    assert_eq!(
        e.reason.as_deref(),
        Some(
            "open period ended; probing after 2 consecutive failures (last: UNAVAILABLE: scripted)"
        )
    );
    assert_eq!(e.at, tripped_at + Duration::from_secs(1));
    // The probe takes the only permit: every permit is taken, and the card says so.
    let e = events.recv().await.unwrap();
    assert_eq!(
        states(&e),
        (
            BreakerState::HalfOpen { busy: false },
            BreakerState::HalfOpen { busy: true }
        )
    );
    let e = events.recv().await.unwrap();
    assert_eq!(
        states(&e),
        (BreakerState::HalfOpen { busy: true }, BreakerState::Closed)
    );
    assert_eq!(e.reason.as_deref(), Some("probe call succeeded"));

    handle.force_open(None);
    handle.disable();
    handle.reset();
    let rest: Vec<_> = std::iter::from_fn(|| events.try_recv().ok())
        .map(|e| {
            let (from, to) = states(&e);
            (from, to, e.reason.as_deref().unwrap_or_default().to_owned())
        })
        .collect();
    assert_eq!(
        rest,
        [
            (
                BreakerState::Closed,
                BreakerState::ForcedOpen,
                "forced open by an operator".to_owned()
            ),
            (
                BreakerState::ForcedOpen,
                BreakerState::Disabled,
                "disabled by an operator".to_owned()
            ),
            (
                BreakerState::Disabled,
                BreakerState::Closed,
                "reset by an operator".to_owned()
            ),
        ]
    );
    assert!(matches!(events.try_recv(), Err(TryRecvError::Empty)));
}

#[tokio::test(start_paused = true)]
async fn a_lagging_subscriber_is_told_how_many_it_missed_and_the_breaker_never_waits() {
    let (svc, _script, _card) = breaker(BreakerConfig::default().events_capacity(2));
    let handle = svc.handle();
    let mut slow = handle.subscribe();
    // Five transitions; the subscriber reads none of them meanwhile.
    handle.force_open(None);
    handle.reset();
    handle.disable();
    handle.reset();
    handle.force_open(Some("last".into()));
    assert!(matches!(slow.recv().await, Err(RecvError::Lagged(3))));
    let e = slow.recv().await.unwrap();
    assert_eq!(states(&e), (BreakerState::Disabled, BreakerState::Closed));
    let e = slow.recv().await.unwrap();
    assert_eq!(e.reason.as_deref(), Some("last"));

    // When the breaker and every handle are gone, the stream ends.
    drop((svc, handle));
    assert!(matches!(slow.recv().await, Err(RecvError::Closed)));
}

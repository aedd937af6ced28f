//! The trip policies, each on the paused clock: consecutive failures, failure rate over a
//! count window and over a time window (each only after its minimum number of calls), and
//! the slow-call rate.

mod support;

use std::time::Duration;

use breaker_layer::{BreakerConfig, SlowCalls, Window};
use endpoint_state::BreakerState;
use support::{Reply, breaker, fails, is_open, oks, open_for, reason, run};
use tonic::Code;

#[tokio::test(start_paused = true)]
async fn trips_after_five_consecutive_failures_by_default() {
    let (mut svc, script, card) = breaker(BreakerConfig::default());
    run(&mut svc, &script, &fails(4)).await;
    run(&mut svc, &script, &oks(1)).await;
    run(&mut svc, &script, &fails(4)).await;
    assert_eq!(
        card.breaker_state(),
        BreakerState::Closed,
        "a success resets the count: 4 + 4 failures do not trip"
    );
    run(&mut svc, &script, &fails(1)).await;
    assert!(is_open(&card));
    assert_eq!(
        card.breaker().reason.as_deref(),
        Some("5 consecutive failures (last: UNAVAILABLE: scripted)")
    );
    // Default open period: 5 s with jitter 0.1.
    let left = open_for(&card);
    assert!(
        left >= Duration::from_millis(4_500) && left <= Duration::from_millis(5_500),
        "{left:?}"
    );
    assert_eq!(script.calls(), 10);
}

#[tokio::test(start_paused = true)]
async fn consecutive_limit_is_configurable() {
    let (mut svc, script, card) = breaker(BreakerConfig::default().consecutive_failures(2));
    run(&mut svc, &script, &fails(1)).await;
    assert!(!is_open(&card));
    run(&mut svc, &script, &fails(1)).await;
    assert!(is_open(&card));
    assert!(reason(&card).starts_with("2 consecutive failures"));
}

#[tokio::test(start_paused = true)]
async fn failure_rate_over_a_count_window_waits_for_its_minimum() {
    let config = BreakerConfig::default().failure_rate(0.5, Window::Count(10), 10);
    let (mut svc, script, card) = breaker(config);
    // 100 % failures, but only 5 calls: no verdict yet.
    run(&mut svc, &script, &fails(5)).await;
    assert!(!is_open(&card), "below the minimum number of calls");
    run(&mut svc, &script, &oks(4)).await;
    assert!(!is_open(&card), "9 calls: still below the minimum");
    // The 10th call reaches the minimum with 5 of 10 failed: 50 % trips.
    run(&mut svc, &script, &oks(1)).await;
    assert!(is_open(&card));
    assert_eq!(
        card.breaker().reason.as_deref(),
        Some("failure rate 50% (5 of 10 calls) over the last 10 calls reached 50%")
    );
}

#[tokio::test(start_paused = true)]
async fn failure_rate_over_a_count_window_slides() {
    let config = BreakerConfig::default().failure_rate(0.6, Window::Count(4), 4);
    let (mut svc, script, card) = breaker(config);
    run(&mut svc, &script, &fails(2)).await;
    run(&mut svc, &script, &oks(3)).await; // window: F S S S (the first F slid out)
    assert!(!is_open(&card));
    run(&mut svc, &script, &fails(2)).await; // window: S S F F = 50 %
    assert!(!is_open(&card), "50 % is below 60 %");
    run(&mut svc, &script, &fails(1)).await; // window: S F F F = 75 %
    assert!(is_open(&card));
    assert_eq!(
        card.breaker().reason.as_deref(),
        Some(
            "failure rate 75% (3 of 4 calls) over the last 4 calls reached 60% \
             (last: UNAVAILABLE: scripted)"
        )
    );
}

#[tokio::test(start_paused = true)]
async fn failure_rate_over_a_time_window_waits_for_its_minimum_and_forgets() {
    let config =
        BreakerConfig::default().failure_rate(0.5, Window::Time(Duration::from_secs(10)), 4);
    let (mut svc, script, card) = breaker(config);
    run(&mut svc, &script, &fails(3)).await;
    assert!(!is_open(&card), "3 calls: below the minimum of 4");

    // Those three leave the window.
    tokio::time::advance(Duration::from_secs(11)).await;
    run(&mut svc, &script, &fails(1)).await;
    assert!(
        !is_open(&card),
        "the old failures slid out: 1 call in the window, not 4"
    );
    run(&mut svc, &script, &oks(1)).await;
    run(&mut svc, &script, &fails(1)).await;
    assert!(!is_open(&card), "3 calls in the window");
    run(&mut svc, &script, &fails(1)).await;
    assert!(is_open(&card), "3 of 4 failed within 10 s");
    assert!(
        reason(&card).starts_with("failure rate 75% (3 of 4 calls) in the last 10.0 s reached 50%"),
        "{:?}",
        card.breaker().reason
    );
}

#[tokio::test(start_paused = true)]
async fn failure_rate_below_threshold_never_trips() {
    let config = BreakerConfig::default().failure_rate(0.5, Window::Count(10), 5);
    let (mut svc, script, card) = breaker(config);
    for _ in 0..20 {
        run(
            &mut svc,
            &script,
            &[Reply::TrailersOnly(Code::Unavailable), Reply::Ok, Reply::Ok],
        )
        .await;
    }
    assert_eq!(card.breaker_state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn slow_call_rate_trips_after_its_minimum() {
    let slow = SlowCalls::new(Duration::from_secs(1), 0.5)
        .window(Window::Count(4))
        .min_calls(4);
    let config = BreakerConfig::default().slow_calls(slow);
    let (mut svc, script, card) = breaker(config);
    let slow_ok = Reply::After(Duration::from_secs(2), Box::new(Reply::Ok));
    run(
        &mut svc,
        &script,
        &[slow_ok.clone(), slow_ok.clone(), slow_ok],
    )
    .await;
    assert!(
        !is_open(&card),
        "3 slow calls of 3, but below the minimum of 4"
    );
    run(&mut svc, &script, &oks(1)).await;
    assert!(is_open(&card), "3 of 4 calls slow");
    assert_eq!(
        card.breaker().reason.as_deref(),
        Some(
            "slow-call rate 75% (3 of 4 calls took 1.0 s or more) over the last 4 calls \
             reached 50%"
        )
    );
}

#[tokio::test(start_paused = true)]
async fn fast_calls_do_not_count_as_slow() {
    let slow = SlowCalls::new(Duration::from_secs(1), 0.5)
        .window(Window::Count(4))
        .min_calls(1);
    let (mut svc, script, card) = breaker(BreakerConfig::default().slow_calls(slow));
    let quick = Reply::After(Duration::from_millis(999), Box::new(Reply::Ok));
    run(&mut svc, &script, &vec![quick; 8]).await;
    assert_eq!(card.breaker_state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_time_window_idle_for_minutes_forgets_its_old_calls() {
    // The shortest window: 10 ms, in ten 1 ms buckets. A failure, then a long quiet spell
    // (327.68 s: 327,680 buckets, a multiple of both the ten slots and the 65,536 values of
    // a 16-bit bucket tag), then one success. The failure is long gone: one call, no trip.
    let config =
        BreakerConfig::default().failure_rate(0.5, Window::Time(Duration::from_millis(10)), 2);
    let (mut svc, script, card) = breaker(config);
    run(&mut svc, &script, &fails(1)).await;
    assert!(!is_open(&card), "one call: below the minimum");
    tokio::time::advance(Duration::from_millis(327_680)).await;
    run(&mut svc, &script, &oks(1)).await;
    assert!(
        !is_open(&card),
        "tripped on a failure from minutes ago: {:?}",
        card.breaker()
    );
    // And the window still counts what is recent: two failures now trip it.
    run(&mut svc, &script, &fails(2)).await;
    assert!(is_open(&card));
}

#[tokio::test(start_paused = true)]
async fn the_reason_keeps_a_bounded_share_of_the_server_s_text() {
    let (mut svc, script, card) = breaker(BreakerConfig::default().consecutive_failures(1));
    let long = "x".repeat(20_000);
    run(
        &mut svc,
        &script,
        &[Reply::TrailersOnlyWith(Code::Unavailable, long)],
    )
    .await;
    assert!(is_open(&card));
    let why = reason(&card);
    assert!(
        why.starts_with("1 consecutive failure (last: UNAVAILABLE: xxx"),
        "{why}"
    );
    assert!(why.chars().count() <= 241, "{} chars", why.chars().count());
}

#[tokio::test(start_paused = true)]
async fn a_proxy_s_html_page_is_a_failure() {
    let (mut svc, script, card) = breaker(BreakerConfig::default().consecutive_failures(2));
    for _ in 0..2 {
        script.push([Reply::Html]);
        // The caller (tonic's decoder) gives up on the body once it sees it is not gRPC.
        drop(support::send(&mut svc).await.unwrap());
    }
    assert!(is_open(&card), "{:?}", card.breaker());
    let why = reason(&card);
    assert!(
        why.contains("UNKNOWN") && why.contains("text/html"),
        "{why}"
    );
}

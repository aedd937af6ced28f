//! Repeat offenders: the n-th quarantine in a row lasts `duration × n`, capped, and the count
//! decays while the target stays out of quarantine (paused clock).

mod support;

use std::time::Duration;

use endpoint_state::EndpointCard;
use quarantine_layer::{QuarantineConfig, QuarantineGroup};
use support::{call, endpoint, quarantined};
use tokio::time::Instant;

fn group(config: QuarantineConfig) -> QuarantineGroup {
    let group = QuarantineGroup::new(config).unwrap();
    group.add(EndpointCard::new("peer"));
    group
}

fn remaining(card: &EndpointCard) -> Duration {
    card.quarantine_state()
        .until
        .unwrap()
        .saturating_duration_since(Instant::now())
}

#[tokio::test(start_paused = true)]
async fn repeated_quarantines_lengthen_up_to_the_cap() {
    let config = QuarantineConfig::default()
        .duration(Duration::from_secs(5))
        .max_duration(Duration::from_secs(12));
    let group = group(config);
    let (card, mut svc, _) = endpoint(&group, "b0");
    let mut seen = Vec::new();
    for _ in 0..5 {
        call(&mut svc, "code:14").await.unwrap();
        let d = remaining(&card);
        seen.push(d.as_secs());
        // Sit it out, then fail again as soon as it is back.
        tokio::time::advance(d).await;
        assert!(!quarantined(&card));
    }
    assert_eq!(seen, [5, 10, 12, 12, 12]);
    assert_eq!(group.strikes("b0"), Some(5));
}

#[tokio::test(start_paused = true)]
async fn the_count_decays_while_the_target_behaves() {
    let config = QuarantineConfig::default()
        .duration(Duration::from_secs(5))
        .decay_after(Duration::from_secs(30));
    let group = group(config);
    let (card, mut svc, _) = endpoint(&group, "b0");
    for _ in 0..3 {
        call(&mut svc, "code:14").await.unwrap();
        tokio::time::advance(remaining(&card)).await;
    }
    assert_eq!(group.strikes("b0"), Some(3));

    // Behaves: successful calls and time out of quarantine.
    call(&mut svc, "ok").await.unwrap();
    tokio::time::advance(Duration::from_secs(29)).await;
    assert_eq!(group.strikes("b0"), Some(3), "not a full period yet");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(group.strikes("b0"), Some(2));
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(group.strikes("b0"), Some(1));

    // Its next quarantine is its second in a row, not its fourth.
    call(&mut svc, "code:14").await.unwrap();
    assert_eq!(remaining(&card), Duration::from_secs(10));
    assert_eq!(group.strikes("b0"), Some(2));

    // Long enough out of trouble and it starts from scratch.
    tokio::time::advance(Duration::from_secs(10 + 600)).await;
    assert_eq!(group.strikes("b0"), Some(0));
    call(&mut svc, "code:14").await.unwrap();
    assert_eq!(remaining(&card), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_failures_is_one_quarantine() {
    let group = group(QuarantineConfig::default());
    let (card, mut svc, _) = endpoint(&group, "b0");
    let start = Instant::now();
    // Ten calls in flight when the backend dies: all fail together.
    let mut calls = Vec::new();
    for _ in 0..10 {
        tokio_test::assert_ready_ok!(svc.poll_ready());
        calls.push(svc.call(support::request("code:14")));
    }
    let version = card.version();
    for c in calls {
        c.await.unwrap();
    }
    assert_eq!(group.strikes("b0"), Some(1));
    assert_eq!(
        card.quarantine_state().until,
        Some(start + Duration::from_secs(5))
    );
    assert_eq!(card.version(), version + 1, "one write for the whole burst");
}

//! `report_failure`: the same quarantine from outside the call path (paused clock).

mod support;

use std::time::Duration;

use quarantine_layer::QuarantineGroup;
use support::{endpoint, quarantined};
use tokio::time::Instant;
use tokio_test::{assert_pending, assert_ready_ok};

#[tokio::test(start_paused = true)]
async fn a_reported_failure_quarantines_for_the_given_time() {
    let group = QuarantineGroup::default();
    let (a, mut sa, _) = endpoint(&group, "a");
    let (_b, _, _) = endpoint(&group, "b");
    assert_ready_ok!(sa.poll_ready());
    let start = Instant::now();
    let until = group
        .report_failure_with_reason("a", Some(Duration::from_secs(3)), "health probe: refused")
        .unwrap();
    assert_eq!(until, start + Duration::from_secs(3));
    assert_eq!(a.quarantine_state().until, Some(until));
    assert_eq!(
        a.eligibility().unwrap_err().to_string(),
        "a: quarantined 3.0 s more after health probe: refused"
    );
    assert_pending!(sa.poll_ready(), "the reserved readiness is re-checked");
    tokio::time::advance(Duration::from_secs(3)).await;
    assert!(sa.is_woken());
    assert_ready_ok!(sa.poll_ready());
}

#[tokio::test(start_paused = true)]
async fn without_a_duration_the_configured_policy_applies() {
    let group = QuarantineGroup::default();
    let (a, _, _) = endpoint(&group, "a");
    let start = Instant::now();
    group.report_failure("a", None).unwrap();
    assert_eq!(
        a.quarantine_state().until,
        Some(start + Duration::from_secs(5))
    );
    assert_eq!(group.strikes("a"), Some(1));
    let why = a.eligibility().unwrap_err().to_string();
    assert!(why.ends_with("after failure reported"), "{why}");
}

#[tokio::test(start_paused = true)]
async fn a_report_renews_but_never_shortens() {
    let group = QuarantineGroup::default();
    let (a, _, _) = endpoint(&group, "a");
    let start = Instant::now();
    group
        .report_failure("a", Some(Duration::from_secs(10)))
        .unwrap();
    let kept = group
        .report_failure("a", Some(Duration::from_secs(1)))
        .unwrap();
    assert_eq!(kept, start + Duration::from_secs(10));
    assert_eq!(a.quarantine_state().until, Some(kept));
    tokio::time::advance(Duration::from_secs(8)).await;
    let renewed = group
        .report_failure("a", Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(renewed, start + Duration::from_secs(18));
    assert_eq!(group.strikes("a"), Some(1));
}

#[tokio::test(start_paused = true)]
async fn an_unknown_target_is_an_error_naming_it() {
    let group = QuarantineGroup::default();
    let err = group.report_failure("10.0.0.9:50051", None).unwrap_err();
    assert_eq!(err.target(), "10.0.0.9:50051");
    assert_eq!(
        err.to_string(),
        "quarantine group has no target 10.0.0.9:50051"
    );
    assert!(group.lift("nope").is_err());
    assert!(group.admits("nope").is_err());
    assert_eq!(group.strikes("nope"), None);
}

#[tokio::test(start_paused = true)]
async fn a_zero_duration_does_nothing_and_lift_ends_a_quarantine() {
    let group = QuarantineGroup::default();
    let (a, mut sa, _) = endpoint(&group, "a");
    let (_b, _, _) = endpoint(&group, "b");
    group.report_failure("a", Some(Duration::ZERO)).unwrap();
    assert!(!quarantined(&a));
    assert_eq!(group.strikes("a"), Some(0));

    group.report_failure("a", None).unwrap();
    assert_pending!(sa.poll_ready());
    assert!(group.lift("a").unwrap());
    assert!(sa.is_woken());
    assert_ready_ok!(sa.poll_ready());
    assert!(!group.lift("a").unwrap(), "nothing left to lift");
    assert_eq!(group.strikes("a"), Some(1), "lifting keeps the count");
}

#[tokio::test(start_paused = true)]
async fn membership() {
    let group = QuarantineGroup::default();
    let (a, _, _) = endpoint(&group, "a");
    assert!(!group.add(a.clone()), "already a member");
    let other_a = endpoint_state::EndpointCard::new("a");
    assert!(
        group.add(other_a.clone()),
        "a new card for the same target replaces it"
    );
    assert!(group.cards()[0].same_card(&other_a));
    assert_eq!(group.len(), 1);
    assert!(group.remove("a").unwrap().same_card(&other_a));
    assert!(group.is_empty());
    assert!(group.remove("a").is_none());
}

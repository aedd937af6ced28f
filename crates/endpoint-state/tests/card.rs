//! The state card under concurrent writers and readers, and what its summary says.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use endpoint_state::{
    Block, BreakerState, EndpointCard, HealthVerdict, LineKind, Quarantine, Reason,
};
use proptest::prelude::*;
use tokio::time::Instant;

fn verdict(i: u8) -> HealthVerdict {
    [
        HealthVerdict::NotChecked,
        HealthVerdict::Unknown,
        HealthVerdict::Healthy,
        HealthVerdict::Unhealthy,
    ][usize::from(i % 4)]
}

fn breaker(i: u8, base: Instant) -> BreakerState {
    match i % 5 {
        0 => BreakerState::Closed,
        1 => BreakerState::Open {
            until: base + Duration::from_secs(3600 * u64::from(i)),
        },
        2 => BreakerState::HalfOpen {
            busy: i.is_multiple_of(2),
        },
        3 => BreakerState::ForcedOpen,
        _ => BreakerState::Disabled,
    }
}

/// Each writer owns one line and writes a sequence of (state, reason) pairs; readers run
/// alongside. Invariants:
/// * each line only ever shows a value its own writer wrote (no torn or foreign value);
/// * each reader sees every line's value, and the version, move only forward through the
///   writer's sequence;
/// * at the end, every line holds its writer's last value and the version counts exactly the
///   writes that changed something.
fn run(health: Vec<(u8, u8)>, quarantine: Vec<(u8, u8)>, breakers: Vec<(u8, u8)>) {
    let base = Instant::now();
    let card = EndpointCard::new("b1");
    let reason =
        |r: u8| -> Option<Reason> { (!r.is_multiple_of(3)).then(|| format!("r{}", r % 3).into()) };

    // Expected effective writes: a write that repeats the line's current (state, reason) is a
    // no-op. Fresh card: NotChecked/None, no quarantine/None, Closed/None.
    fn effective<T: PartialEq + Clone>(
        init: (T, Option<Reason>),
        seq: &[(T, Option<Reason>)],
    ) -> u64 {
        let mut cur = init;
        let mut n = 0;
        for w in seq {
            if *w != cur {
                n += 1;
                cur = w.clone();
            }
        }
        n
    }
    let h: Vec<_> = health
        .iter()
        .map(|&(s, r)| (verdict(s), reason(r)))
        .collect();
    let q: Vec<_> = quarantine
        .iter()
        .map(|&(s, r)| {
            let until =
                (!s.is_multiple_of(2)).then(|| base + Duration::from_secs(3600 * u64::from(s)));
            // Lifting a quarantine clears its reason too.
            let r = if until.is_some() { reason(r) } else { None };
            (Quarantine { until }, r)
        })
        .collect();
    let b: Vec<_> = breakers
        .iter()
        .map(|&(s, r)| (breaker(s, base), reason(r)))
        .collect();
    let expected_version = effective((HealthVerdict::NotChecked, None), &h)
        + effective((Quarantine::NONE, None), &q)
        + effective((BreakerState::Closed, None), &b);

    let start = Arc::new(Barrier::new(6));
    let mut writers = Vec::new();
    {
        let (card, h, start) = (card.clone(), h.clone(), start.clone());
        writers.push(thread::spawn(move || {
            start.wait();
            for (s, r) in h {
                card.set_health(s, r);
            }
        }));
    }
    {
        let (card, q, start) = (card.clone(), q.clone(), start.clone());
        writers.push(thread::spawn(move || {
            start.wait();
            for (s, r) in q {
                match s.until {
                    Some(u) => card.quarantine_until(u, r),
                    None => card.clear_quarantine(),
                };
            }
        }));
    }
    {
        let (card, b, start) = (card.clone(), b.clone(), start.clone());
        writers.push(thread::spawn(move || {
            start.wait();
            for (s, r) in b {
                card.set_breaker(s, r);
            }
        }));
    }

    let mut readers = Vec::new();
    for _ in 0..3 {
        let (card, h, q, b, start) = (card.clone(), h.clone(), q.clone(), b.clone(), start.clone());
        readers.push(thread::spawn(move || {
            start.wait();
            let mut last_version = 0;
            for _ in 0..200 {
                let snap = card.snapshot();
                assert!(snap.version >= last_version, "version went backwards");
                last_version = snap.version;
                let hv = (snap.health.state, snap.health.reason.clone());
                assert!(
                    hv == (HealthVerdict::NotChecked, None) || h.contains(&hv),
                    "health shows a value nobody wrote: {hv:?}"
                );
                let bv = (snap.breaker.state, snap.breaker.reason.clone());
                assert!(bv == (BreakerState::Closed, None) || b.contains(&bv));
                let qs = snap.quarantine.state;
                assert!(qs == Quarantine::NONE || q.iter().any(|(s, _)| *s == qs));
                // The summary agrees with the lines it was computed from.
                let elig = snap.eligibility_at(base);
                assert_eq!(
                    elig.is_ok(),
                    snap.health.state.admits()
                        && !snap.quarantine.state.active_at(base)
                        && snap.breaker.state.admits_at(base)
                );
            }
        }));
    }
    for t in writers.into_iter().chain(readers) {
        t.join().unwrap();
    }

    assert_eq!(card.version(), expected_version);
    // At rest, the one-load summary agrees with the lines.
    let now = Instant::now();
    assert_eq!(
        card.is_eligible(),
        card.snapshot().eligibility_at(now).is_ok()
    );
    assert_eq!(card.health_admits(), card.health_verdict().admits());
    let snap = card.snapshot();
    assert_eq!(
        card.is_eligible_ignoring(&[endpoint_state::LineKind::Quarantine]),
        snap.health.state.admits() && snap.breaker.state.admits_at(now)
    );
    if let Some((s, r)) = h.last() {
        assert_eq!(
            (card.health().state, card.health().reason.clone()),
            (*s, r.clone())
        );
    }
    if let Some((s, r)) = q.last() {
        assert_eq!(
            (card.quarantine().state, card.quarantine().reason.clone()),
            (*s, r.clone())
        );
    }
    if let Some((s, r)) = b.last() {
        assert_eq!(
            (card.breaker().state, card.breaker().reason.clone()),
            (*s, r.clone())
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn concurrent_writers_and_readers_keep_the_invariants(
        h in proptest::collection::vec((any::<u8>(), any::<u8>()), 0..60),
        q in proptest::collection::vec((any::<u8>(), any::<u8>()), 0..60),
        b in proptest::collection::vec((any::<u8>(), any::<u8>()), 0..60),
    ) {
        run(h, q, b);
    }
}

/// Two writers of the same line racing: every write that changes the line bumps the version
/// and the last writer's value stays (no write that changes the line is mistaken for a no-op).
#[test]
fn racing_writers_of_one_line_never_lose_a_change() {
    for _ in 0..50 {
        let card = EndpointCard::new("b1");
        let start = Arc::new(Barrier::new(2));
        let spawn = |v: HealthVerdict| {
            let (card, start) = (card.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                let mut changed = 0u64;
                for i in 0..500 {
                    let r: Reason = format!("{v} {i}").into();
                    changed += u64::from(card.set_health(v, Some(r)).is_some());
                }
                changed
            })
        };
        let a = spawn(HealthVerdict::Healthy);
        let b = spawn(HealthVerdict::Unhealthy);
        let total = a.join().unwrap() + b.join().unwrap();
        // Every write carries a distinct reason, so every one of them is a change.
        assert_eq!(total, 1000);
        assert_eq!(card.version(), 1000);
    }
}

#[tokio::test(start_paused = true)]
async fn summary_says_why() {
    let card = EndpointCard::new("b2");
    assert!(card.eligibility().is_ok());

    card.quarantine_for(
        Duration::from_millis(3_200),
        Some("UNAVAILABLE: connection refused".into()),
    );
    let why = card.eligibility().unwrap_err();
    assert_eq!(
        why.to_string(),
        "b2: quarantined 3.2 s more after UNAVAILABLE: connection refused"
    );
    assert!(why.blocked_by(LineKind::Quarantine));
    assert!(!card.is_eligible());
    assert!(card.is_eligible_ignoring(&[LineKind::Quarantine]));

    card.set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    let until = Instant::now() + Duration::from_secs(4);
    card.set_breaker(
        BreakerState::Open { until },
        Some("5 consecutive failures".into()),
    );
    let why = card.eligibility().unwrap_err();
    assert_eq!(why.blocks.len(), 3);
    assert_eq!(
        why.to_string(),
        "b2: unhealthy (NOT_SERVING); quarantined 3.2 s more after UNAVAILABLE: connection refused; \
         breaker open, retry in 4.0 s after 5 consecutive failures"
    );
    assert!(!card.is_eligible_ignoring(&[LineKind::Quarantine]));

    // Time alone ends the quarantine and the open period.
    tokio::time::advance(Duration::from_secs(4)).await;
    let why = card.eligibility().unwrap_err();
    assert_eq!(why.blocks.len(), 1);
    assert!(matches!(
        why.blocks[0],
        Block::Health {
            verdict: HealthVerdict::Unhealthy,
            ..
        }
    ));
    card.set_health(HealthVerdict::Healthy, None);
    assert!(card.is_eligible());
}

#[test]
fn a_fresh_card_admits_and_unknown_health_does_not() {
    let card = EndpointCard::new("b1");
    assert_eq!(card.health_verdict(), HealthVerdict::NotChecked);
    assert!(
        card.is_eligible(),
        "no checker configured: health does not block"
    );
    card.set_health(HealthVerdict::Unknown, None);
    assert!(!card.is_eligible(), "evidence only: unknown is not healthy");
    assert_eq!(
        card.eligibility().unwrap_err().to_string(),
        "b1: health unknown"
    );
}

#[test]
fn a_write_that_changes_nothing_is_skipped() {
    let card = EndpointCard::new("b1");
    assert!(card.set_health(HealthVerdict::Healthy, None).is_some());
    let v = card.version();
    assert!(card.set_health(HealthVerdict::Healthy, None).is_none());
    assert_eq!(card.version(), v);
    assert!(
        card.set_health(HealthVerdict::Healthy, Some("SERVING".into()))
            .is_some()
    );
    assert_eq!(card.version(), v + 1);
}

#[tokio::test]
async fn changed_completes_on_a_write_made_before_its_first_poll() {
    let card = EndpointCard::new("b1");
    let changed = card.changed();
    card.set_breaker(BreakerState::ForcedOpen, None);
    tokio::time::timeout(Duration::from_secs(5), changed)
        .await
        .expect("the change made after creating the future completes it");
}

#[tokio::test]
async fn every_change_of_a_line_is_one_event_on_the_card_and_on_its_peer_set() {
    use endpoint_state::{CardEvent, LineKind, LineState, Peers};
    let peers = Peers::new();
    let (b1, b2) = (EndpointCard::new("b1"), EndpointCard::new("b2"));
    peers.add(&b1);
    peers.add(&b2);
    let mut on_card = b1.subscribe();
    let mut on_set = peers.subscribe();

    let event = b1
        .set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()))
        .unwrap();
    assert_eq!(event.line, LineKind::Health);
    assert_eq!(event.from, LineState::Health(HealthVerdict::NotChecked));
    assert_eq!(event.to, LineState::Health(HealthVerdict::Unhealthy));
    assert!(event.is_transition());
    assert_eq!(
        event.to_string(),
        "b1: not checked -> unhealthy (NOT_SERVING)"
    );
    // The same write again is no change, and no event.
    assert!(
        b1.set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()))
            .is_none()
    );
    // A new reason alone is a change, but not a transition.
    let reason_only = b1
        .set_health(HealthVerdict::Unhealthy, Some("SERVICE_UNKNOWN".into()))
        .unwrap();
    assert!(!reason_only.is_transition());
    // Half-open with every probe permit taken, then one given back: changes of the card
    // (its eligibility), not transitions of the breaker.
    let b3 = EndpointCard::new("b3");
    let half_open = b3.set_breaker(BreakerState::HalfOpen { busy: false }, None);
    assert!(half_open.unwrap().is_transition());
    for busy in [true, false] {
        let permits = b3
            .set_breaker(BreakerState::HalfOpen { busy }, None)
            .unwrap();
        assert!(!permits.is_transition());
        assert_eq!(b3.is_eligible(), !busy);
    }
    b2.quarantine_for(Duration::from_secs(5), Some("UNAVAILABLE".into()));

    let card_events: Vec<CardEvent> = std::iter::from_fn(|| on_card.try_recv().ok()).collect();
    assert_eq!(card_events, [event.clone(), reason_only.clone()]);
    let set_events: Vec<CardEvent> = std::iter::from_fn(|| on_set.try_recv().ok()).collect();
    assert_eq!(set_events.len(), 3, "{set_events:?}");
    assert_eq!(set_events[..2], [event, reason_only]);
    assert_eq!(set_events[2].line, LineKind::Quarantine);
    assert_eq!(&*set_events[2].target, "b2");
    assert_eq!(set_events[2].to.to_string(), "quarantined");

    // A card that leaves the set no longer reports to it.
    peers.remove("b2");
    b2.clear_quarantine();
    assert!(on_set.try_recv().is_err());
}

#[tokio::test(start_paused = true)]
async fn every_reason_kept_on_a_card_is_bounded() {
    // Server text can be anything, of any length: a line keeps its first characters only.
    let long: String = "é".repeat(10_000);
    let card = EndpointCard::new("b1");
    let mut events = card.subscribe();
    card.set_health(HealthVerdict::Unhealthy, Some(long.as_str().into()));
    card.quarantine_for(Duration::from_secs(5), Some(long.as_str().into()));
    card.set_breaker(BreakerState::ForcedOpen, Some(long.as_str().into()));
    let snap = card.snapshot();
    for reason in [
        &snap.health.reason,
        &snap.quarantine.reason,
        &snap.breaker.reason,
    ] {
        let reason = reason.as_deref().unwrap();
        assert!(
            reason.chars().count() <= 241,
            "{} chars",
            reason.chars().count()
        );
        assert!(
            reason.starts_with("éé") && reason.ends_with('…'),
            "{reason}"
        );
    }
    // Events carry the reason as kept.
    while let Ok(event) = events.try_recv() {
        assert!(event.reason.unwrap().chars().count() <= 241);
    }
    // A short reason is kept whole.
    card.set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    assert_eq!(card.health().reason.as_deref(), Some("NOT_SERVING"));
    let summary = card.eligibility().unwrap_err().to_string();
    assert!(summary.len() < 3 * 241 * 2 + 200, "{} bytes", summary.len());
}

#[tokio::test(start_paused = true)]
async fn a_peer_set_keeps_join_order_through_removals_and_replacements() {
    use endpoint_state::Peers;
    let peers = Peers::new();
    let cards: Vec<_> = (0..100)
        .map(|i| EndpointCard::new(format!("c{i}")))
        .collect();
    for c in &cards {
        assert!(peers.add(c));
        assert!(!peers.add(c), "the same card again changes nothing");
    }
    let v = peers.version();
    // Remove every card but each seventh (the slots are compacted on the way).
    for (i, c) in cards.iter().enumerate() {
        if i % 7 != 0 {
            assert!(peers.remove_card(c));
            assert!(!peers.remove_card(c));
        }
    }
    assert!(peers.version() > v);
    let names: Vec<String> = peers
        .cards()
        .iter()
        .map(|c| c.target().to_owned())
        .collect();
    let expected: Vec<String> = (0..100).step_by(7).map(|i| format!("c{i}")).collect();
    assert_eq!(names, expected);
    assert!(cards[1].peers().is_none(), "a removed card is in no set");
    // A different card with a member's name takes its place (and its position).
    let newer = EndpointCard::new("c7");
    assert!(peers.add(&newer));
    assert!(peers.get("c7").unwrap().same_card(&newer));
    assert!(cards[7].peers().is_none());
    assert_eq!(peers.cards()[1].target(), "c7");
    assert!(peers.remove("c14").is_some() && !peers.contains("c14"));
    assert_eq!(peers.len(), expected.len() - 1);
    // Joining another set leaves this one.
    let other = Peers::new();
    other.add(&cards[0]);
    assert!(!peers.contains("c0") && other.contains("c0"));
}

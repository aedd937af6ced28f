//! Quarantine narrows the choice and never empties it: the rule reads the whole card of every
//! peer, and a quarantined endpoint waiting its turn is woken the moment the rule flips.

mod support;

use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use endpoint_state::{BreakerState, EndpointCard, HealthVerdict};
use quarantine_layer::{Quarantine, QuarantineGroup};
use support::{HealthGate, Scripted, call, call_through, endpoint, finish, quarantined};
use tokio::time::Instant;
use tokio_test::{assert_pending, assert_ready_ok};
use tower::balance::p2c::Balance;
use tower::discover::ServiceList;
use tower::load::Constant;
use tower::{Service, ServiceExt};

const LONG: Option<Duration> = Some(Duration::from_secs(3600));

#[tokio::test(start_paused = true)]
async fn three_quarantined_are_all_eligible_again() {
    let group = QuarantineGroup::default();
    let mut eps: Vec<_> = ["a", "b", "c"].map(|n| endpoint(&group, n)).into();
    for (card, _, _) in &eps {
        group.report_failure(card.target(), None).unwrap();
    }
    for (card, svc, _) in &mut eps {
        assert!(quarantined(card));
        assert_ready_ok!(svc.poll_ready(), "{} must be ready", card.target());
        assert!(group.admits(card.target()).unwrap());
    }
}

#[tokio::test(start_paused = true)]
async fn two_quarantined_are_shut_and_the_third_is_ready() {
    let group = QuarantineGroup::default();
    let (a, mut sa, _) = endpoint(&group, "a");
    let (b, mut sb, _) = endpoint(&group, "b");
    let (_c, mut sc, _) = endpoint(&group, "c");
    group.report_failure(a.target(), None).unwrap();
    group.report_failure(b.target(), None).unwrap();
    assert_pending!(sa.poll_ready());
    assert_pending!(sb.poll_ready());
    assert_ready_ok!(sc.poll_ready());
    assert!(!group.admits("a").unwrap());
    assert!(group.admits("c").unwrap());
}

/// One endpoint's stack: a health gate over quarantine, with a constant load for p2c.
type Stack = Constant<HealthGate<Quarantine<Scripted>>, u32>;

/// Three endpoints under tower's p2c balancer, each stack a health gate over quarantine.
struct Cluster {
    cards: Vec<EndpointCard>,
    backends: Vec<Scripted>,
    balancer: Balance<ServiceList<Vec<Stack>>, support::Req>,
}

fn cluster(group: &QuarantineGroup) -> Cluster {
    let mut cards = Vec::new();
    let mut backends = Vec::new();
    let mut stacks = Vec::new();
    for name in ["a", "b", "c"] {
        let card = EndpointCard::new(name);
        let backend = Scripted::default();
        let stack = HealthGate::new(&card, group.layer(card.clone()).layer_on(backend.clone()));
        stacks.push(Constant::new(stack, 1));
        cards.push(card);
        backends.push(backend);
    }
    Cluster {
        cards,
        backends,
        balancer: Balance::new(ServiceList::new(stacks)),
    }
}

trait LayerOn {
    fn layer_on<S>(&self, inner: S) -> Quarantine<S>;
}

impl LayerOn for quarantine_layer::QuarantineLayer {
    fn layer_on<S>(&self, inner: S) -> Quarantine<S> {
        tower::Layer::layer(self, inner)
    }
}

impl Cluster {
    async fn calls(&mut self, n: usize) -> [usize; 3] {
        self.calls_replying(n, "ok").await
    }

    async fn calls_replying(&mut self, n: usize, reply: &str) -> [usize; 3] {
        let before: Vec<usize> = self.backends.iter().map(Scripted::calls).collect();
        for _ in 0..n {
            let svc = tokio::time::timeout(Duration::from_secs(1), self.balancer.ready())
                .await
                .expect("the balancer has a ready endpoint")
                .unwrap();
            call_through(svc, reply).await.unwrap();
        }
        let mut got = [0; 3];
        for (i, b) in self.backends.iter().enumerate() {
            got[i] = b.calls() - before[i];
        }
        got
    }
}

#[tokio::test(start_paused = true)]
async fn under_p2c_two_quarantined_leave_all_traffic_to_the_third() {
    let group = QuarantineGroup::default();
    let mut cl = cluster(&group);
    assert_eq!(cl.calls(30).await.iter().sum::<usize>(), 30);
    group.report_failure("a", LONG).unwrap();
    group.report_failure("b", LONG).unwrap();
    assert_eq!(cl.calls(30).await, [0, 0, 30]);
}

#[tokio::test(start_paused = true)]
async fn under_p2c_one_unhealthy_and_two_quarantined_ignore_the_quarantine() {
    let group = QuarantineGroup::default();
    let mut cl = cluster(&group);
    cl.cards[2].set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    group.report_failure("a", LONG).unwrap();
    group.report_failure("b", LONG).unwrap();
    // Every call fails again (renewing each verdict), and still both carry the traffic.
    let got = cl.calls_replying(60, "code:14").await;
    assert_eq!(got[2], 0, "the unhealthy endpoint gets nothing: {got:?}");
    assert!(
        got[0] > 0 && got[1] > 0,
        "both quarantined endpoints carry the traffic: {got:?}"
    );
    // The cards still say quarantined: the rule ignores the line, it does not erase it.
    assert!(quarantined(&cl.cards[0]) && quarantined(&cl.cards[1]));

    // The first success lifts its endpoint's quarantine; from then on the other one's holds.
    let first = cl.calls(1).await;
    let winner = first.iter().position(|n| *n == 1).unwrap();
    assert!(!quarantined(&cl.cards[winner]));
    let mut only_winner = [0; 3];
    only_winner[winner] = 30;
    assert_eq!(cl.calls(30).await, only_winner);
}

#[tokio::test(start_paused = true)]
async fn one_unhealthy_and_two_quarantined_are_ready() {
    let group = QuarantineGroup::default();
    let (a, mut sa, _) = endpoint(&group, "a");
    let (b, mut sb, _) = endpoint(&group, "b");
    let (c, _, _) = endpoint(&group, "c");
    c.set_health(HealthVerdict::Unhealthy, None);
    group.report_failure(a.target(), None).unwrap();
    group.report_failure(b.target(), None).unwrap();
    assert_ready_ok!(sa.poll_ready());
    assert_ready_ok!(sb.poll_ready());
}

/// Two quarantined endpoints wait while `c` is eligible; `make_c_ineligible` takes `c` away in
/// some way, and both must be woken and ready, with no poll in between.
async fn woken_when_the_last_eligible_peer_goes(
    make_c_ineligible: impl FnOnce(&QuarantineGroup, &EndpointCard),
) {
    let group = QuarantineGroup::default();
    let (a, mut sa, _) = endpoint(&group, "a");
    let (b, mut sb, _) = endpoint(&group, "b");
    let (c, _, _) = endpoint(&group, "c");
    group.report_failure(a.target(), LONG).unwrap();
    group.report_failure(b.target(), LONG).unwrap();
    assert_pending!(sa.poll_ready());
    assert_pending!(sb.poll_ready());
    // Unrelated changes of the waiting endpoints' peers do not open them.
    assert!(!sa.is_woken() && !sb.is_woken());

    make_c_ineligible(&group, &c);

    assert!(
        sa.is_woken(),
        "a waits on its own card only through its watch of c"
    );
    assert!(sb.is_woken());
    assert_ready_ok!(sa.poll_ready());
    assert_ready_ok!(sb.poll_ready());
}

#[tokio::test(start_paused = true)]
async fn woken_when_the_last_eligible_peer_turns_unhealthy() {
    woken_when_the_last_eligible_peer_goes(|_, c| {
        c.set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn woken_when_the_last_eligible_peer_is_quarantined() {
    woken_when_the_last_eligible_peer_goes(|g, c| {
        g.report_failure(c.target(), None).unwrap();
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn woken_when_the_last_eligible_peer_opens_its_breaker() {
    woken_when_the_last_eligible_peer_goes(|_, c| {
        let until = Instant::now() + Duration::from_secs(30);
        c.set_breaker(BreakerState::Open { until }, Some("5 failures".into()));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn woken_when_the_last_eligible_peer_leaves_the_group() {
    woken_when_the_last_eligible_peer_goes(|g, c| {
        assert!(g.remove(c.target()).is_some());
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn the_witness_moves_to_another_eligible_peer() {
    let group = QuarantineGroup::default();
    let (a, mut sa, _) = endpoint(&group, "a");
    let (b, _, _) = endpoint(&group, "b");
    let (c, _, _) = endpoint(&group, "c");
    group.report_failure(a.target(), LONG).unwrap();
    assert_pending!(sa.poll_ready());
    // One of b and c keeps a shut; whichever goes first, a looks again and stays shut.
    b.set_health(HealthVerdict::Unhealthy, None);
    if sa.is_woken() {
        assert_pending!(sa.poll_ready());
    }
    assert!(!sa.is_woken());
    c.set_health(HealthVerdict::Unhealthy, None);
    assert!(sa.is_woken(), "the last eligible peer went");
    assert_ready_ok!(sa.poll_ready());
}

#[tokio::test(start_paused = true)]
async fn a_peer_coming_back_shuts_the_ignored_quarantine_again() {
    let group = QuarantineGroup::default();
    let (a, mut sa, _) = endpoint(&group, "a");
    let (b, _, _) = endpoint(&group, "b");
    group.report_failure(a.target(), LONG).unwrap();
    group
        .report_failure(b.target(), Some(Duration::from_secs(2)))
        .unwrap();
    assert_ready_ok!(sa.poll_ready(), "both quarantined: ignored");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_pending!(sa.poll_ready(), "b is back: a's quarantine holds again");
}

#[tokio::test(start_paused = true)]
async fn a_group_of_one_is_never_shut() {
    let group = QuarantineGroup::default();
    let (a, mut sa, _) = endpoint(&group, "a");
    group.report_failure(a.target(), LONG).unwrap();
    assert_ready_ok!(sa.poll_ready());
}

#[tokio::test(start_paused = true)]
async fn the_next_failure_renews_an_ignored_quarantine() {
    let group = QuarantineGroup::default();
    let (a, mut sa, _) = endpoint(&group, "a");
    let (b, _, _) = endpoint(&group, "b");
    let start = Instant::now();
    group.report_failure(a.target(), None).unwrap();
    group.report_failure(b.target(), None).unwrap();
    tokio::time::advance(Duration::from_secs(2)).await;
    // Ignored, so a is called; it fails again.
    call(&mut sa, "code:14").await.unwrap();
    assert_eq!(
        a.quarantine_state().until,
        Some(start + Duration::from_secs(7)),
        "renewed: 5 s from the new failure"
    );
    assert_eq!(
        group.strikes("a"),
        Some(1),
        "a renewal is not a new quarantine"
    );
    assert!(quarantined(&b));
}

#[tokio::test(start_paused = true)]
async fn a_success_admitted_while_ignored_lifts_the_quarantine() {
    let group = QuarantineGroup::default();
    let (a, mut sa, _) = endpoint(&group, "a");
    let (b, mut sb, _) = endpoint(&group, "b");
    group.report_failure(a.target(), None).unwrap();
    group.report_failure(b.target(), None).unwrap();
    assert_ready_ok!(sb.poll_ready(), "ignored while both are out");
    call(&mut sa, "ok").await.unwrap();
    assert!(!quarantined(&a), "a proved itself");
    assert!(quarantined(&b));
    assert_pending!(
        sb.poll_ready(),
        "a is eligible again, so b's quarantine holds"
    );
}

#[tokio::test(start_paused = true)]
async fn a_success_admitted_before_the_quarantine_does_not_lift_it() {
    let group = QuarantineGroup::default();
    let (a, mut sa, _) = endpoint(&group, "a");
    let (_b, _, _) = endpoint(&group, "b");
    assert_ready_ok!(sa.poll_ready());
    let call = sa.call(support::request("ok"));
    group.report_failure(a.target(), None).unwrap();
    finish(call).await.unwrap();
    assert!(quarantined(&a));
}

#[tokio::test(start_paused = true)]
async fn a_success_does_not_lift_a_quarantine_renewed_since_its_admission() {
    let group = QuarantineGroup::default();
    let (a, mut sa, _) = endpoint(&group, "a");
    let (b, _, _) = endpoint(&group, "b");
    group.report_failure(a.target(), None).unwrap();
    group.report_failure(b.target(), None).unwrap();
    assert_ready_ok!(sa.poll_ready(), "ignored");
    let call = sa.call(support::request("ok"));
    tokio::time::advance(Duration::from_secs(2)).await;
    group.report_failure(a.target(), None).unwrap(); // fresher news
    finish(call).await.unwrap();
    assert!(quarantined(&a));
}

/// Drives one quarantined endpoint's `poll_ready` in a real task for a long stretch of paused
/// time and counts the polls: shut and idle, it is polled once, then left alone.
#[tokio::test(start_paused = true)]
async fn no_busy_polling_while_shut() {
    struct Counting<S>(S, Arc<AtomicUsize>);
    let group = QuarantineGroup::default();
    let a = EndpointCard::new("a");
    let b = EndpointCard::new("b");
    group.add(b.clone());
    let polls = Arc::new(AtomicUsize::new(0));
    let mut svc = Counting(
        Quarantine::new(Scripted::default(), &group, a.clone()),
        polls.clone(),
    );
    group
        .report_failure("a", Some(Duration::from_secs(600)))
        .unwrap();
    let waiter = tokio::spawn(async move {
        poll_fn(|cx| {
            svc.1.fetch_add(1, Ordering::SeqCst);
            svc.0.poll_ready(cx)
        })
        .await
        .unwrap();
    });
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert_eq!(
        polls.load(Ordering::SeqCst),
        1,
        "polled once, then left alone"
    );
    // The peer becomes unhealthy: one wake (not the quarantine's end, 300 s away), and the
    // quarantine is ignored.
    b.set_health(HealthVerdict::Unhealthy, None);
    tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("woken by the peer's change")
        .unwrap();
    assert_eq!(polls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_clone_starts_with_its_own_gate() {
    let group = QuarantineGroup::default();
    let a = EndpointCard::new("a");
    group.add(EndpointCard::new("b"));
    let svc = Quarantine::new(Scripted::default(), &group, a.clone());
    group.report_failure("a", None).unwrap();
    let mut first = tower_test::mock::Spawn::new(svc.clone());
    let mut second = tower_test::mock::Spawn::new(svc);
    assert_pending!(first.poll_ready());
    assert_pending!(second.poll_ready());
    group.remove("b");
    assert!(first.is_woken() && second.is_woken(), "each clone is woken");
    assert_ready_ok!(first.poll_ready());
    assert_ready_ok!(second.poll_ready());
}

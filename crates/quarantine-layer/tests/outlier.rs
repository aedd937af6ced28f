//! Outlier ejection by failure percentage: the small-cluster rule exactly as documented, the
//! request-volume and minimum-hosts thresholds, the interval (paused clock).

mod support;

use std::time::Duration;

use endpoint_state::EndpointCard;
use quarantine_layer::{OutlierEjection, QuarantineConfig, QuarantineGroup};
use support::{Scripted, call, endpoint, quarantined};
use tokio::time::Instant;
use tower_test::mock::Spawn;

type Svc = Spawn<quarantine_layer::Quarantine<Scripted>>;

struct Cluster {
    group: QuarantineGroup,
    cards: Vec<EndpointCard>,
    svcs: Vec<Svc>,
}

fn cluster(n: usize, policy: OutlierEjection) -> Cluster {
    let group =
        QuarantineGroup::new(QuarantineConfig::default().outlier_ejection(Some(policy))).unwrap();
    let mut cards = Vec::new();
    let mut svcs = Vec::new();
    for i in 0..n {
        let (card, svc, _) = endpoint(&group, &format!("h{i}"));
        cards.push(card);
        svcs.push(svc);
    }
    Cluster { group, cards, svcs }
}

impl Cluster {
    /// `failed` calls answered INTERNAL (an outlier code, not a quarantine code) and `ok`
    /// successful calls on host `i`.
    async fn traffic(&mut self, i: usize, failed: u64, ok: u64) {
        for _ in 0..failed {
            call(&mut self.svcs[i], "code:13").await.unwrap();
        }
        for _ in 0..ok {
            call(&mut self.svcs[i], "ok").await.unwrap();
        }
    }

    /// `(failed, ok)` calls on each host in turn (see [`traffic`](Self::traffic)), then the
    /// end of a 10 s interval.
    async fn interval(&mut self, traffic: &[(u64, u64)]) {
        for (i, (failed, ok)) in traffic.iter().enumerate() {
            self.traffic(i, *failed, *ok).await;
        }
        self.end_interval(Duration::from_secs(10)).await;
    }

    /// Ends the interval: time passes, then one more outcome arrives (on the first host that
    /// is ready) and the interval is judged.
    async fn end_interval(&mut self, interval: Duration) {
        tokio::time::advance(interval).await;
        let i = (0..self.svcs.len())
            .find(|i| self.svcs[*i].poll_ready().is_ready())
            .expect("some host is ready");
        support::call_through(self.svcs[i].get_mut(), "ok")
            .await
            .unwrap();
    }

    fn ejected(&self) -> usize {
        self.cards.iter().filter(|c| quarantined(c)).count()
    }
}

/// Every host carries `volume` calls, all failed; how many are ejected after one interval.
async fn ejected_when_all_fail(n: usize, policy: OutlierEjection) -> usize {
    let volume = policy.request_volume;
    let interval = policy.interval;
    let mut cl = cluster(n, policy);
    for i in 0..n {
        cl.traffic(i, volume, 0).await;
    }
    assert_eq!(cl.ejected(), 0, "nothing before the interval ends");
    cl.end_interval(interval).await;
    cl.ejected()
}

#[tokio::test(start_paused = true)]
async fn small_cluster_rule_with_the_defaults() {
    // Defaults: 10 %, minimum_hosts 5, request_volume 50.
    let mut got = Vec::new();
    for n in [2, 3, 5, 10] {
        got.push(ejected_when_all_fail(n, OutlierEjection::default()).await);
    }
    assert_eq!(got, [0, 0, 1, 1]);
}

#[tokio::test(start_paused = true)]
async fn small_cluster_rule_by_share() {
    let base = OutlierEjection::default()
        .request_volume(10)
        .minimum_hosts(2);
    for (percent, expected) in [(10, [1, 1, 1, 1]), (50, [1, 2, 3, 5]), (100, [1, 2, 4, 9])] {
        let policy = base.clone().max_ejection_percent(percent);
        let mut got = Vec::new();
        for n in [2, 3, 5, 10] {
            assert_eq!(policy.max_ejected(n), expected[got.len()]);
            got.push(ejected_when_all_fail(n, policy.clone()).await);
        }
        assert_eq!(got, expected, "max_ejection_percent {percent}");
    }
    // Past ten hosts the share grows: 11 hosts at 10 % may lose two.
    assert_eq!(ejected_when_all_fail(11, base.clone()).await, 2);
    assert_eq!(base.max_ejected(1), 0, "a single host is never ejected");
}

fn policy() -> OutlierEjection {
    OutlierEjection::default()
        .request_volume(10)
        .minimum_hosts(3)
        .failure_percentage_threshold(50)
        .max_ejection_percent(100)
}

#[tokio::test(start_paused = true)]
async fn an_outlier_is_quarantined_like_any_other_target() {
    let mut cl = cluster(4, policy());
    cl.traffic(0, 9, 1).await; // 90 % failed
    for i in 1..4 {
        cl.traffic(i, 1, 9).await;
    }
    cl.end_interval(Duration::from_secs(10)).await;
    assert_eq!(cl.ejected(), 1);
    assert!(quarantined(&cl.cards[0]));
    assert_eq!(
        cl.cards[0].eligibility().unwrap_err().to_string(),
        "h0: quarantined 5.0 s more after outlier ejection: 9 of 10 calls failed (over 50 %)"
    );
    assert_eq!(cl.group.strikes("h0"), Some(1));
    tokio_test::assert_pending!(cl.svcs[0].poll_ready());
}

#[tokio::test(start_paused = true)]
async fn the_threshold_is_strict() {
    let mut cl = cluster(4, policy());
    // Exactly 50 % failed: not over; 60 %: over.
    cl.interval(&[(5, 5), (6, 4), (0, 10), (0, 10)]).await;
    assert!(!quarantined(&cl.cards[0]));
    assert!(quarantined(&cl.cards[1]));
}

#[tokio::test(start_paused = true)]
async fn a_host_below_the_request_volume_is_not_judged() {
    let mut cl = cluster(4, policy());
    // Every call of h0 failed, but only 9 of them.
    cl.interval(&[(9, 0), (10, 0), (0, 10), (0, 10)]).await;
    assert!(!quarantined(&cl.cards[0]));
    assert!(quarantined(&cl.cards[1]));
}

#[tokio::test(start_paused = true)]
async fn too_few_hosts_with_volume_and_nothing_is_judged() {
    let mut cl = cluster(4, policy()); // minimum_hosts 3
    cl.interval(&[(10, 0), (0, 10), (0, 9), (0, 9)]).await;
    assert_eq!(cl.ejected(), 0, "only two hosts carried the volume");
}

#[tokio::test(start_paused = true)]
async fn judged_once_per_interval_on_that_interval_s_counts() {
    let mut cl = cluster(3, policy());
    let start = Instant::now();
    cl.traffic(0, 10, 0).await;
    cl.traffic(1, 0, 10).await;
    cl.traffic(2, 0, 10).await;
    // Not yet: the interval has not ended.
    tokio::time::advance(Duration::from_millis(9_999)).await;
    cl.traffic(1, 0, 1).await;
    assert_eq!(cl.ejected(), 0);
    tokio::time::advance(start + Duration::from_secs(10) - Instant::now()).await;
    cl.traffic(1, 0, 1).await;
    assert!(quarantined(&cl.cards[0]));
    // The counts were reset: the next interval judges only its own calls.
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(!quarantined(&cl.cards[0]));
    cl.interval(&[(0, 10), (0, 10), (0, 10)]).await;
    assert_eq!(cl.ejected(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_worst_goes_first_and_every_quarantined_host_counts_toward_the_share() {
    // Ten hosts, 20 %: at most two out.
    let mut cl = cluster(10, policy().max_ejection_percent(20));
    cl.traffic(2, 7, 3).await; // 70 %
    cl.traffic(5, 10, 0).await; // 100 %
    cl.traffic(7, 9, 1).await; // 90 %
    for i in [0, 1, 3, 4, 6, 8, 9] {
        cl.traffic(i, 0, 10).await;
    }
    // One host is already out for another reason (a failure reported from elsewhere).
    cl.group
        .report_failure("h9", Some(Duration::from_secs(60)))
        .unwrap();
    assert_eq!(cl.ejected(), 1);
    cl.end_interval(Duration::from_secs(10)).await;
    assert!(quarantined(&cl.cards[5]), "the worst goes first");
    assert!(!quarantined(&cl.cards[7]) && !quarantined(&cl.cards[2]));
    assert_eq!(cl.ejected(), 2);
}

#[tokio::test(start_paused = true)]
async fn counts_from_before_an_idle_spell_are_not_judged() {
    let mut cl = cluster(3, policy());
    cl.traffic(0, 10, 0).await;
    cl.traffic(1, 0, 10).await;
    cl.traffic(2, 0, 10).await;
    // Two hours without a call; then traffic resumes. The failures are two hours old: they
    // say nothing about h0 now.
    tokio::time::advance(Duration::from_secs(2 * 3_600)).await;
    cl.traffic(1, 0, 1).await;
    assert_eq!(cl.ejected(), 0, "judged on counts two hours old");
    // The interval that starts now is judged on its own calls.
    cl.interval(&[(10, 0), (0, 10), (0, 10)]).await;
    assert!(quarantined(&cl.cards[0]));
}

#[tokio::test(start_paused = true)]
async fn an_interval_ending_while_idle_is_judged_when_traffic_resumes_within_the_next() {
    // At most one interval late: the counts of [0 s, 10 s) are still judged at 15 s.
    let mut cl = cluster(3, policy());
    cl.traffic(0, 10, 0).await;
    cl.traffic(1, 0, 10).await;
    cl.traffic(2, 0, 10).await;
    tokio::time::advance(Duration::from_secs(15)).await;
    cl.traffic(1, 0, 1).await;
    assert!(quarantined(&cl.cards[0]));
}

#[tokio::test(start_paused = true)]
async fn abandoned_calls_do_not_dilute_the_failure_share() {
    let mut cl = cluster(3, policy());
    cl.traffic(0, 10, 0).await;
    // 100 calls to h0 abandoned by their callers (the response future dropped).
    for _ in 0..100 {
        tokio_test::assert_ready_ok!(cl.svcs[0].poll_ready());
        let mut call = tokio_test::task::spawn(cl.svcs[0].call(support::request("hang")));
        tokio_test::assert_pending!(call.poll());
    }
    cl.traffic(1, 0, 10).await;
    cl.traffic(2, 0, 10).await;
    cl.end_interval(Duration::from_secs(10)).await;
    assert!(quarantined(&cl.cards[0]), "10 of 10 judged calls failed");
}

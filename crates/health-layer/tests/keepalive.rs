//! Probe connections follow the server's ping rules (gRFC A8), against a proxy that enforces
//! them as C-core and grpc-go servers do: GOAWAY `ENHANCE_YOUR_CALM "too_many_pings"` for a
//! ping that comes sooner than the server allows.
//!
//! Real sockets and real time, with intervals of a few hundred milliseconds; every wait is on
//! a condition, bounded.

mod support;

use std::time::Duration;

use health_layer::{CardEvent, EndpointCard, HealthChecker, HealthVerdict, ProbeMode};
use support::transitions;
use test_backends::{Backend, PingGuard, PingPolicy};
use tokio::sync::broadcast;
use tokio::time::Instant;
use tonic::transport::Endpoint;

const LIMIT: Duration = Duration::from_secs(20);

/// A policy that punishes the first ping sooner than `min` after the previous one.
fn strict(min: Duration) -> PingPolicy {
    PingPolicy {
        min_interval: min,
        max_strikes: 0,
        permit_without_calls: false,
    }
}

/// Intervals between consecutive pings of each connection, in milliseconds.
fn intervals(guard: &PingGuard) -> Vec<Vec<u128>> {
    let log = guard.ping_log();
    let conns = log.iter().map(|(c, _)| *c).max().map_or(0, |c| c + 1);
    (0..conns)
        .map(|c| {
            let times: Vec<Instant> = log
                .iter()
                .filter(|(conn, _)| *conn == c)
                .map(|(_, at)| *at)
                .collect();
            times
                .windows(2)
                .map(|w| (w[1] - w[0]).as_millis())
                .collect()
        })
        .collect()
}

/// Checks the guarded backend, subscribed to the transitions, until it is healthy.
async fn started(
    checker: &HealthChecker,
    guard: &PingGuard,
) -> (EndpointCard, broadcast::Receiver<CardEvent>) {
    let card = checker.add_target(guard.uri()).unwrap();
    let events = checker.subscribe();
    checker.start(Vec::<&str>::new()).unwrap();
    assert!(support::wait_verdict(&card, HealthVerdict::Healthy, LIMIT).await);
    (card, events)
}

/// A backend behind a proxy that allows a ping every `min` at most (none without calls).
async fn guarded_by(min: Duration) -> (Backend, PingGuard) {
    let backend = Backend::start("b0").await.unwrap();
    let guard = PingGuard::start(backend.addr(), strict(min)).await.unwrap();
    (backend, guard)
}

/// A backend behind a proxy that allows a ping every 500 ms at most (none without calls).
async fn guarded() -> (Backend, PingGuard) {
    guarded_by(Duration::from_millis(500)).await
}

async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    assert!(support::eventually(LIMIT, &mut cond).await, "{what}");
}

#[tokio::test]
async fn probe_keepalive_doubles_after_too_many_pings_and_the_target_stays_healthy() {
    // The shortest probe keepalive accepted is 1 s; the server allows one ping per 1.5 s.
    let (backend, guard) = guarded_by(Duration::from_millis(1_500)).await;
    let checker = HealthChecker::builder()
        .mode(ProbeMode::Watch)
        .probe_keepalive(Some(Duration::from_secs(1)))
        .build()
        .unwrap();
    let (card, mut events) = started(&checker, &guard).await;

    // 1 s: refused; 2 s: accepted.
    until("a GOAWAY", || guard.goaways_sent() == 1).await;
    until("three pings on the second connection", || {
        intervals(&guard).get(1).is_some_and(|i| i.len() >= 2)
    })
    .await;
    let seen = intervals(&guard);
    eprintln!("ping intervals per connection (ms): {seen:?}");
    assert_eq!(guard.goaways_sent(), 1, "the 2 s pings are accepted");
    assert_eq!(guard.connections_accepted(), 2);
    for (conn, want) in [(0, 1_000), (1, 2_000)] {
        assert!(
            seen[conn].iter().all(|ms| *ms + 20 >= want),
            "connection {conn} pinged every {want} ms or more: {seen:?}"
        );
    }
    // The GOAWAYs were no evidence against the target: it never left the rotation.
    assert_eq!(card.health_verdict(), HealthVerdict::Healthy);
    let transitions = transitions(&mut events);
    assert_eq!(transitions, [HealthVerdict::Healthy]);
    assert_eq!(backend.health_checks(), 2, "one Watch per connection");
    checker.stop().await;
}

#[tokio::test]
async fn the_templates_own_keepalive_is_kept_and_after_too_many_pings_slowed_to_what_servers_accept()
 {
    let (backend, guard) = guarded().await;
    let checker = HealthChecker::builder()
        .mode(ProbeMode::Watch)
        // The user's keepalive: the checker keeps it (it used to force 10 s on Watch probes).
        .endpoint_template(|target: &str| {
            Ok(Endpoint::from_shared(target.to_owned())?
                .http2_keep_alive_interval(Duration::from_millis(200)))
        })
        .build()
        .unwrap();
    let (card, mut events) = started(&checker, &guard).await;
    until("a GOAWAY", || guard.goaways_sent() == 1).await;
    until("the second connection's Watch", || {
        backend.health_checks() == 2 && card.health_verdict() == HealthVerdict::Healthy
    })
    .await;
    let seen = intervals(&guard);
    assert!(
        seen[0].iter().all(|ms| (180..450).contains(ms)),
        "the template's 200 ms, not an interval of the checker's: {seen:?}"
    );
    // The refused value cannot be read back: the new connection pings at most every 5 minutes
    // (what gRPC servers accept by default). Over a second, the old one would have pinged 5
    // times.
    let pings = guard.pings();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(guard.pings(), pings, "no ping on the new connection");
    assert_eq!(guard.goaways_sent(), 1);
    let transitions = transitions(&mut events);
    assert_eq!(transitions, [HealthVerdict::Healthy]);
    checker.stop().await;
}

#[tokio::test]
async fn check_mode_slows_its_pings_after_too_many_pings_without_a_failed_probe() {
    let backend = Backend::start("b0").await.unwrap();
    let guard = PingGuard::start(
        backend.addr(),
        PingPolicy {
            min_interval: Duration::from_millis(500),
            max_strikes: 0,
            // Check mode keeps its connection idle between checks: pings are allowed then,
            // but not sooner than 500 ms after the last.
            permit_without_calls: true,
        },
    )
    .await
    .unwrap();
    let checker = HealthChecker::builder()
        .interval(Duration::from_secs(1))
        .endpoint_template(|target: &str| {
            Ok(Endpoint::from_shared(target.to_owned())?
                .http2_keep_alive_interval(Duration::from_millis(150))
                .keep_alive_while_idle(true))
        })
        .build()
        .unwrap();
    let (_card, mut events) = started(&checker, &guard).await;
    until("a GOAWAY", || guard.goaways_sent() >= 1).await;
    // The next checks pass (on a connection tonic makes again, then on a new probe channel
    // with slower pings), and the server has nothing more to refuse.
    let checks = backend.health_checks();
    until("three more checks", || {
        backend.health_checks() >= checks + 3
    })
    .await;
    let (goaways, pings) = (guard.goaways_sent(), guard.pings());
    let more = backend.health_checks();
    until("two more checks", || backend.health_checks() >= more + 2).await;
    assert_eq!(guard.goaways_sent(), goaways, "no GOAWAY any more");
    assert_eq!(
        guard.pings(),
        pings,
        "no ping any more (at most every 5 minutes now)"
    );
    let status = checker.status(&guard.uri()).unwrap();
    assert_eq!(status.consecutive_failures, 0);
    let transitions = transitions(&mut events);
    assert_eq!(
        transitions,
        [HealthVerdict::Healthy],
        "the closed connections cost no probe"
    );
    checker.stop().await;
}

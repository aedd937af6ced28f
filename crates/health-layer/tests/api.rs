//! The checker's API: add-with-check, check_now, transitions (stream and callbacks), panicking
//! callbacks, configuration errors.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use health_layer::{
    Backoff, EndpointCard, HealthChecker, HealthConfig, HealthVerdict, RefusedBecause,
};
use support::{Script, Step, transitions, verdict};
use tokio::sync::broadcast::error::TryRecvError;

const fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

#[tokio::test(start_paused = true)]
async fn add_target_checked_refuses_a_failing_target_and_stores_nothing() {
    let script = Script::new();
    script.set("bad", [Step::Fail("connection refused")]);
    let checker = HealthChecker::builder()
        .mode(script.mode())
        .build()
        .unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    let mut events = checker.subscribe();

    let card = EndpointCard::new("bad");
    let refused = checker
        .add_target_checked(health_layer::Target::new("bad").card(card.clone()))
        .await
        .unwrap_err();
    assert!(matches!(refused.error, RefusedBecause::Probe(_)));
    assert_eq!(
        refused.to_string(),
        "refused target bad: first probe failed: health probe of bad failed: connection refused"
    );
    assert!(!checker.contains("bad"));
    assert!(checker.status("bad").is_none());
    assert_eq!(card.version(), 0, "the given card was never written");
    assert_eq!(card.health_verdict(), HealthVerdict::NotChecked);
    tokio::time::sleep(s(120)).await;
    assert_eq!(script.calls_ms("bad"), [0], "and it is never probed again");
    assert!(matches!(events.try_recv(), Err(TryRecvError::Empty)));

    // A passing target is stored healthy, next check one interval after the probe.
    let card = checker.add_target_checked("good").await.unwrap();
    assert_eq!(card.health_verdict(), HealthVerdict::Healthy);
    let status = checker.status("good").unwrap();
    assert_eq!(status.verdict, HealthVerdict::Healthy);
    assert_eq!(status.next_check, Some(script.t0 + s(120 + 30)));
    assert_eq!(
        verdict(events.try_recv().unwrap().to),
        HealthVerdict::Healthy
    );
    tokio::time::sleep(s(31)).await;
    assert_eq!(script.calls_ms("good"), [120_000, 150_000]);
    checker.stop().await;
}

#[tokio::test(start_paused = true)]
async fn check_now_publishes_like_a_scheduled_check() {
    let script = Script::new();
    script.set("t", [Step::Pass, Step::Fail("NOT_SERVING")]);
    let checker = HealthChecker::builder()
        .mode(script.mode())
        .interval(s(30))
        .build()
        .unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    checker.on_transition(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    let card = checker.add_target("t").unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    tokio::time::sleep(s(10)).await;
    let mut events = checker.subscribe();
    assert_eq!(card.health_verdict(), HealthVerdict::Healthy);
    assert_eq!(seen.load(Ordering::SeqCst), 1);

    let status = checker.check_now("t").await.unwrap();
    assert_eq!(status.verdict, HealthVerdict::Unhealthy);
    assert_eq!(status.last_error.as_deref(), Some("NOT_SERVING"));
    assert_eq!(status.consecutive_failures, 1);
    assert!(status.last_check.is_some());
    assert_eq!(
        status.next_check,
        Some(script.t0 + s(10 + 30)),
        "rescheduled from now"
    );
    assert_eq!(card.health_verdict(), HealthVerdict::Unhealthy);
    assert_eq!(card.health().reason.as_deref(), Some("NOT_SERVING"));
    assert_eq!(seen.load(Ordering::SeqCst), 2, "callback fired");
    let t = events.recv().await.unwrap();
    assert_eq!(
        (verdict(t.from), verdict(t.to)),
        (HealthVerdict::Healthy, HealthVerdict::Unhealthy)
    );

    // The scheduled check moved: not at 30 s, at 40 s.
    tokio::time::sleep(s(31)).await;
    assert_eq!(script.calls_ms("t"), [0, 10_000, 40_000]);
    checker.stop().await;
}

#[tokio::test(start_paused = true)]
async fn subscribers_and_callbacks_see_transitions_only() {
    let script = Script::new();
    use Step::*;
    script.set(
        "t",
        [
            Pass,
            Pass,
            Fail("a"),
            Fail("b"),
            Fail("b"),
            Pass,
            Pass,
            Fail("c"),
        ],
    );
    let checker = HealthChecker::builder()
        .mode(script.mode())
        .interval(s(1))
        .max_backoff(s(1))
        .build()
        .unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = log.clone();
    checker.on_transition(move |t| sink.lock().unwrap().push((verdict(t.from), verdict(t.to))));
    let mut events = checker.subscribe();
    checker.start(["t"]).unwrap();
    tokio::time::sleep(Duration::from_millis(7_500)).await;
    assert_eq!(script.calls_ms("t").len(), 8);

    use HealthVerdict::*;
    let want = vec![
        (Unknown, Healthy),
        (Healthy, Unhealthy),
        (Unhealthy, Healthy),
        (Healthy, Unhealthy),
    ];
    assert_eq!(*log.lock().unwrap(), want);
    let mut got = Vec::new();
    while let Ok(t) = events.try_recv() {
        got.push((verdict(t.from), verdict(t.to)));
        if verdict(t.to) == Unhealthy {
            assert!(matches!(t.reason.as_deref(), Some("a") | Some("c")));
        }
    }
    assert_eq!(got, want);
    checker.stop().await;
    assert!(
        matches!(events.try_recv(), Err(TryRecvError::Closed)),
        "stop ends the stream"
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_subscriber_loses_the_oldest_transitions_and_is_told() {
    let script = Script::new();
    use Step::*;
    script.set("t", [Pass, Fail("x"), Pass, Fail("x"), Pass, Fail("x")]);
    let checker = HealthChecker::builder()
        .mode(script.mode())
        .interval(s(1))
        .max_backoff(s(1))
        .events_capacity(2)
        .build()
        .unwrap();
    let mut events = checker.subscribe();
    checker.start(["t"]).unwrap();
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    assert_eq!(events.try_recv(), Err(TryRecvError::Lagged(4)));
    let last_two = transitions(&mut events);
    assert_eq!(last_two, [HealthVerdict::Healthy, HealthVerdict::Unhealthy]);
    checker.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_callback_is_caught_and_monitoring_goes_on() {
    let script = Script::new();
    use Step::*;
    script.set("t", [Pass, Fail("x"), Pass]);
    let checker = HealthChecker::builder()
        .mode(script.mode())
        .interval(s(1))
        .max_backoff(s(1))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    checker.on_transition(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
        panic!("callback bug");
    });
    let mut events = checker.subscribe();
    checker.start(["t"]).unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "called on every transition despite panics"
    );
    assert_eq!(checker.status("t").unwrap().verdict, HealthVerdict::Healthy);
    assert_eq!(std::iter::from_fn(|| events.try_recv().ok()).count(), 3);
    // Not fail-fast: stopping does not panic.
    checker.stop().await;
}

#[tokio::test(start_paused = true)]
async fn with_fail_fast_callbacks_the_panic_surfaces_to_the_caller_of_stop() {
    let script = Script::new();
    let checker = HealthChecker::builder()
        .mode(script.mode())
        .fail_fast_callbacks(true)
        .build()
        .unwrap();
    checker
        .on_transition(|t| assert_eq!(verdict(t.to), HealthVerdict::Unhealthy, "test assertion"));
    checker.start(["t"]).unwrap();
    assert!(checker.wait_until_ready(s(1)).await);
    assert!(checker.is_healthy("t").unwrap(), "monitoring went on");

    let stopping = tokio::spawn(async move { checker.stop().await });
    let err = stopping.await.unwrap_err();
    assert!(err.is_panic());
    let payload = err.into_panic();
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(message.contains("test assertion"), "{message}");
}

#[test]
fn invalid_configuration_names_the_field_and_the_value() {
    let cases: Vec<(HealthConfig, &str)> = vec![
        (
            HealthConfig::new().timeout(Duration::ZERO),
            "invalid health check configuration: timeout = 0ns: expected more than zero",
        ),
        (
            HealthConfig::new().interval(s(60)).max_backoff(s(30)),
            "invalid health check configuration: max_backoff = 30s: expected at least the interval",
        ),
        (
            HealthConfig::new().jitter(1.5),
            "invalid health check configuration: jitter = 1.5: expected a fraction in [0, 1)",
        ),
        (
            HealthConfig::new().jitter(f64::NAN),
            "invalid health check configuration: jitter = NaN: expected a fraction in [0, 1)",
        ),
        (
            HealthConfig::new().max_concurrent_probes(0),
            "invalid health check configuration: max_concurrent_probes = 0: expected between 1 and 2^29",
        ),
        (
            HealthConfig::new().events_capacity(0),
            "invalid health check configuration: events_capacity = 0: expected between 1 and 2^29",
        ),
        (
            HealthConfig::new().watch_backoff(Backoff {
                multiplier: 0.5,
                ..HealthConfig::DEFAULT_WATCH_BACKOFF
            }),
            "invalid health check configuration: watch_backoff.multiplier = 0.5: expected a finite number of at least 1",
        ),
        (
            HealthConfig::new().watch_backoff(Backoff {
                max: Duration::from_millis(10),
                ..HealthConfig::DEFAULT_WATCH_BACKOFF
            }),
            "invalid health check configuration: watch_backoff.max = 10ms: expected at least watch_backoff.initial (1s)",
        ),
        (
            HealthConfig::new().mode(health_layer::ProbeMode::Http(
                health_layer::probe::HttpProbe::new("no-slash"),
            )),
            "invalid health check configuration: http_probe.path = \"no-slash\": expected a URI path starting with '/'",
        ),
        (
            HealthConfig::new().mode(health_layer::ProbeMode::Http(
                health_layer::probe::HttpProbe::new("/x").accept_status([42]),
            )),
            "invalid health check configuration: http_probe.accept_status = [42]: expected one or more HTTP status codes between 100 and 599",
        ),
    ];
    for (config, want) in cases {
        let err = config.build().unwrap_err();
        assert_eq!(err.to_string(), want);
    }
    assert!(HealthConfig::new().interval(Duration::ZERO).build().is_ok());
}

#[tokio::test]
async fn an_invalid_target_is_refused_when_added_and_nothing_starts() {
    let checker = HealthChecker::builder().build().unwrap();
    let err = checker
        .start(["http://127.0.0.1:1", "not a uri"])
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("cannot start the health checker: invalid health check target not a uri:"),
        "{err}"
    );
    assert!(!checker.is_running());
    assert!(checker.targets().is_empty());
    assert!(checker.add_target("also not a uri").is_err());
}

#[test]
fn start_outside_a_runtime_is_an_error_not_a_panic() {
    let checker = HealthChecker::builder().build().unwrap();
    assert!(matches!(
        checker.start(["http://127.0.0.1:1"]),
        Err(health_layer::StartError::NoRuntime)
    ));
}

#[tokio::test(start_paused = true)]
async fn dropping_the_last_handle_stops_the_checker() {
    let script = Script::new();
    let checker = HealthChecker::builder()
        .mode(script.mode())
        .interval(s(1))
        .build()
        .unwrap();
    let card = checker.add_target("t").unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    let mut events = checker.subscribe();
    let clone = checker.clone();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    drop(checker);
    tokio::time::sleep(s(2)).await;
    assert_eq!(
        script.calls_ms("t"),
        [0, 1_000, 2_000, 3_000, 4_000],
        "a clone keeps it running"
    );
    drop(clone);
    tokio::time::sleep(s(10)).await;
    assert_eq!(script.total_calls(), 5, "the last handle stopped it");
    assert_eq!(card.health_verdict(), HealthVerdict::Healthy);
    assert!(events.recv().await.is_ok());
    assert!(matches!(
        events.recv().await,
        Err(tokio::sync::broadcast::error::RecvError::Closed)
    ));
}

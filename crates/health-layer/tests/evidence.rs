//! Evidence only: nothing is healthy before a probe saw it serving, and a checker that is not
//! running says so instead of looking like a cluster that is down.

mod support;

use std::sync::Arc;
use std::time::Duration;

use health_layer::{HealthChecker, HealthVerdict, NotRunningCause};
use support::{Script, Step};
use tokio::sync::Notify;
use tokio_test::{assert_pending, assert_ready_ok, task};
use tower::{Layer, Service};

#[tokio::test(start_paused = true)]
async fn a_target_is_not_healthy_before_its_first_serving() {
    let release = Arc::new(Notify::new());
    let gate = release.clone();
    let checker = HealthChecker::builder()
        .mode(health_layer::ProbeMode::custom(move |_| {
            let gate = gate.clone();
            async move {
                gate.notified().await;
                Ok(())
            }
        }))
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let card = checker.add_target("t").unwrap();
    assert_eq!(
        card.health_verdict(),
        HealthVerdict::Unknown,
        "registered: unknown"
    );
    checker.start(Vec::<&str>::new()).unwrap();

    tokio::time::sleep(Duration::from_secs(1)).await;
    // The probe is running but has not answered.
    assert_eq!(checker.is_healthy("t"), Ok(false));
    assert_eq!(card.health_verdict(), HealthVerdict::Unknown);
    let mut svc = checker
        .layer("t")
        .unwrap()
        .layer(tower::service_fn(|()| async { Ok::<_, ()>(()) }));
    let mut t = task::spawn(());
    assert_pending!(t.enter(|cx, _| svc.poll_ready(cx)));

    release.notify_one();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(checker.is_healthy("t"), Ok(true));
    assert!(t.is_woken());
    assert_ready_ok!(t.enter(|cx, _| svc.poll_ready(cx)));
    checker.stop().await;
}

/// A checker whose target `hangs` never answers (within a minute), and any other passes.
fn with_a_hanging_target() -> HealthChecker {
    let script = Script::new();
    script.set("hangs", [Step::Hang]);
    HealthChecker::builder()
        .mode(script.mode())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_stopped_checker_without_verdict_is_not_running_but_a_verdict_stays() {
    let checker = with_a_hanging_target();
    checker.start(["ok", "hangs"]).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(checker.is_healthy("ok"), Ok(true));
    assert_eq!(checker.is_healthy("hangs"), Ok(false));
    checker.stop().await;
    assert_eq!(
        checker.is_healthy("hangs").unwrap_err().cause,
        NotRunningCause::Stopped
    );
    assert_eq!(
        checker.is_healthy("ok"),
        Ok(true),
        "the last evidence stays readable"
    );
}

#[tokio::test(start_paused = true)]
async fn wait_until_ready_is_true_once_every_target_has_a_verdict() {
    let script = Script::new();
    script.set("slow", [Step::Slow(Duration::from_secs(3))]);
    script.set("down", [Step::Fail("down")]);
    let checker = HealthChecker::builder()
        .mode(script.mode())
        .build()
        .unwrap();
    checker.start(["slow", "down"]).unwrap();
    let t0 = tokio::time::Instant::now();
    assert!(checker.wait_until_ready(Duration::from_secs(10)).await);
    assert_eq!(
        t0.elapsed(),
        Duration::from_secs(3),
        "as soon as the last verdict lands"
    );
    assert_eq!(
        checker.is_healthy("down"),
        Ok(false),
        "an unhealthy verdict is a verdict"
    );
    checker.stop().await;
}

#[tokio::test(start_paused = true)]
async fn wait_until_ready_is_false_on_timeout_and_when_not_running() {
    let checker = with_a_hanging_target();
    checker.add_target("ok").unwrap();
    assert!(
        !checker.wait_until_ready(Duration::from_secs(5)).await,
        "not started"
    );
    checker.start(["hangs"]).unwrap();
    let t0 = tokio::time::Instant::now();
    assert!(!checker.wait_until_ready(Duration::from_secs(5)).await);
    assert_eq!(t0.elapsed(), Duration::from_secs(5));

    // Stopping wakes a waiter at once with `false`. On the paused clock an idle runtime jumps
    // to the next timer, so a waiter nothing wakes would still return `false` — at its
    // timeout, an hour later: the time it took is the test.
    let waiter = {
        let checker = checker.clone();
        tokio::spawn(async move {
            let t0 = tokio::time::Instant::now();
            let ready = checker.wait_until_ready(Duration::from_secs(3_600)).await;
            (ready, t0.elapsed())
        })
    };
    tokio::task::yield_now().await;
    checker.stop().await;
    let (ready, took) = waiter.await.unwrap();
    assert!(!ready);
    assert_eq!(
        took,
        Duration::ZERO,
        "woken by stop(), not by its own timeout"
    );
    assert!(!checker.wait_until_ready(Duration::from_secs(1)).await);
}

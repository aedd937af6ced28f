//! No panic on any value: durations beyond any clock (`Duration::MAX`) and probes that panic.
//!
//! A duration too long to add to an instant is a wait as long as anything can wait; a custom
//! probe or an HTTP predicate that panics is a failed probe, logged, and its target keeps being
//! probed.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use health_layer::probe::HttpProbe;
use health_layer::{Backoff, HealthChecker, HealthVerdict, ProbeMode};
use support::wait_verdict;
use test_backends::Backend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const LIMIT: Duration = Duration::from_secs(10);

/// An HTTP/1.1 server on loopback answering `200 ok` to every request.
async fn http_ok() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let response =
                    "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok";
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    base
}

#[tokio::test(start_paused = true)]
async fn a_panicking_custom_probe_is_a_failed_probe_and_its_target_keeps_being_probed() {
    let calls = Arc::new(AtomicUsize::new(0));
    let mode = ProbeMode::custom({
        let calls = calls.clone();
        move |_target: Arc<str>| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                match n {
                    0 => panic!("boom while probing"),
                    _ => Ok(()),
                }
            }
        }
    });
    let checker = HealthChecker::builder()
        .mode(mode)
        .interval(Duration::from_secs(1))
        .build()
        .unwrap();
    let card = checker.add_target("b0").unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    assert!(wait_verdict(&card, HealthVerdict::Unhealthy, LIMIT).await);
    assert_eq!(
        card.health().reason.as_deref(),
        Some("the custom probe panicked: boom while probing")
    );
    // The next scheduled probe runs and passes: the panic did not end the target's task.
    assert!(wait_verdict(&card, HealthVerdict::Healthy, LIMIT).await);
    assert!(calls.load(Ordering::SeqCst) >= 2);
    checker.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_custom_probe_that_panics_before_its_future_is_made_is_a_failed_probe_too() {
    let calls = Arc::new(AtomicUsize::new(0));
    let mode = ProbeMode::custom({
        let calls = calls.clone();
        move |_target: Arc<str>| {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("boom before the future");
            }
            async { Ok(()) }
        }
    });
    let checker = HealthChecker::builder()
        .mode(mode)
        .interval(Duration::from_secs(1))
        .build()
        .unwrap();
    let card = checker.add_target("b0").unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    assert!(wait_verdict(&card, HealthVerdict::Unhealthy, LIMIT).await);
    assert_eq!(
        card.health().reason.as_deref(),
        Some("the custom probe panicked: boom before the future")
    );
    assert!(wait_verdict(&card, HealthVerdict::Healthy, LIMIT).await);
    checker.stop().await;
}

#[tokio::test]
async fn a_panicking_http_predicate_is_a_failed_probe_and_the_target_keeps_being_probed() {
    let base = http_ok().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let probe = HttpProbe::new("/healthz").predicate({
        let calls = calls.clone();
        move |_answer| {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("predicate bug");
            }
            Ok(())
        }
    });
    let checker = HealthChecker::builder()
        .mode(ProbeMode::Http(probe))
        .interval(Duration::ZERO)
        .build()
        .unwrap();
    checker.add_target(base.as_str()).unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    let card = checker.card(&base).unwrap();
    assert!(wait_verdict(&card, HealthVerdict::Unhealthy, LIMIT).await);
    let status = checker.status(&base).unwrap();
    let error = status.last_error.as_deref().unwrap_or_default();
    assert!(
        error.ends_with("the predicate panicked: predicate bug"),
        "{error}"
    );
    let status = checker.check_now(&base).await.unwrap();
    assert_eq!(status.verdict, HealthVerdict::Healthy, "{status:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    checker.stop().await;
}

#[tokio::test]
async fn every_duration_may_be_duration_max_in_check_mode() {
    let backend = Backend::start("b0").await.unwrap();
    let checker = HealthChecker::builder()
        .timeout(Duration::MAX)
        .interval(Duration::MAX)
        .max_backoff(Duration::MAX)
        .probe_keepalive(Some(Duration::MAX))
        .build()
        .unwrap();
    let card = checker.add_target(backend.uri()).unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    let ready = tokio::time::timeout(LIMIT, checker.wait_until_ready(Duration::MAX)).await;
    assert_eq!(ready, Ok(true));
    assert_eq!(card.health_verdict(), HealthVerdict::Healthy);
    let status = checker.check_now(&backend.uri()).await.unwrap();
    assert_eq!(status.verdict, HealthVerdict::Healthy, "{status:?}");
    checker.stop().await;
    assert!(!checker.wait_until_ready(Duration::MAX).await);
}

#[tokio::test]
async fn every_duration_may_be_duration_max_in_watch_mode() {
    let backend = Backend::start("b0").await.unwrap();
    let checker = HealthChecker::builder()
        .mode(ProbeMode::Watch)
        .timeout(Duration::MAX)
        .interval(Duration::MAX)
        .max_backoff(Duration::MAX)
        .probe_keepalive(Some(Duration::MAX))
        .watch_backoff(Backoff::new(Duration::MAX, 1.6, Duration::MAX, 0.2))
        .build()
        .unwrap();
    let card = checker.add_target(backend.uri()).unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    let ready = tokio::time::timeout(LIMIT, checker.wait_until_ready(Duration::MAX)).await;
    assert_eq!(ready, Ok(true));
    assert_eq!(card.health_verdict(), HealthVerdict::Healthy);
    // A `Check` in `Watch` mode carries the probe timeout as its deadline.
    let status = checker.check_now(&backend.uri()).await.unwrap();
    assert_eq!(status.verdict, HealthVerdict::Healthy, "{status:?}");
    checker.stop().await;
}

#[tokio::test]
async fn an_http_probe_may_have_a_timeout_of_duration_max() {
    let base = http_ok().await;
    let checker = HealthChecker::builder()
        .mode(ProbeMode::Http(HttpProbe::new("/healthz")))
        .interval(Duration::ZERO)
        .timeout(Duration::MAX)
        .build()
        .unwrap();
    checker.add_target(base.as_str()).unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    let status = checker.check_now(&base).await.unwrap();
    assert_eq!(status.verdict, HealthVerdict::Healthy, "{status:?}");
    checker.stop().await;
}

#[test]
fn a_sub_second_probe_keepalive_is_refused_naming_the_field() {
    let err = HealthChecker::builder()
        .probe_keepalive(Some(Duration::from_millis(999)))
        .build()
        .unwrap_err();
    assert_eq!((err.field(), err.value()), ("probe_keepalive", "999ms"));
    assert!(
        HealthChecker::builder()
            .probe_keepalive(Some(Duration::from_secs(1)))
            .build()
            .is_ok()
    );
}

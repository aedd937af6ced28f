//! `-watch` with the built binary against real local servers: each transition on its own
//! timestamped line, until SIGINT/SIGTERM, then the exit code of the last status.

mod support;

use std::time::Duration;

use support::{CheckOnly, Running, untimestamped};
use test_backends::{Backend, ServingStatus};

const NOT_SERVING: &str = r#"service unhealthy (responded with "NOT_SERVING")"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prints_each_transition_with_a_timestamp_and_exits_with_the_last_status() {
    let backend = Backend::start("b0").await.unwrap();
    let addr = backend.addr().to_string();
    let mut run = Running::start(&["-addr", &addr, "-watch"]);

    let mut lines = vec![run.next_line().await];
    assert_eq!(untimestamped(&lines[0]), "status: SERVING");
    for serving in [false, true, false] {
        backend.set_serving(serving).await;
        let line = run.next_line().await;
        let want = if serving {
            "status: SERVING"
        } else {
            NOT_SERVING
        };
        assert_eq!(untimestamped(&line), want, "{:#?}", run.seen);
        lines.push(line);
    }
    // Timestamps in order (RFC 3339 UTC with a fixed width sorts as text).
    let stamps: Vec<&str> = lines.iter().map(|l| &l[..24]).collect();
    assert!(stamps.windows(2).all(|w| w[0] <= w[1]), "{lines:#?}");
    // One Watch stream, not a poll per transition.
    assert_eq!(backend.health_checks(), 1);

    run.signal("INT").await;
    let (code, rest) = run.finish().await;
    assert_eq!(code, 4, "the last status was NOT_SERVING: {rest:?}");
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert_eq!(untimestamped(&rest[0]), "cancellation received");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_server_that_goes_away_and_comes_back() {
    let backend = Backend::start("b0").await.unwrap();
    let addr = backend.addr().to_string();
    let mut run = Running::start(&["-addr", &addr, "-watch"]);
    assert_eq!(untimestamped(&run.next_line().await), "status: SERVING");

    backend.stop().await;
    let line = run.next_line().await;
    let message = untimestamped(&line);
    assert!(
        message.starts_with(&format!(
            "error: failed to connect service at \"{addr}\": dial tcp {addr}: "
        )),
        "{:#?}",
        run.seen
    );

    backend.restart().await.unwrap();
    let line = run.next_line().await;
    assert_eq!(untimestamped(&line), "status: SERVING", "{:#?}", run.seen);

    run.signal("TERM").await;
    let (code, _) = run.finish().await;
    assert_eq!(code, 0, "the last status was SERVING");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_several_addresses_and_exits_with_the_worst() {
    let b0 = Backend::start("b0").await.unwrap();
    let b1 = Backend::start("b1").await.unwrap();
    let (a0, a1) = (b0.addr().to_string(), b1.addr().to_string());
    let mut run = Running::start(&["-addr", &a0, "-addr", &a1, "-watch"]);

    let mut first = vec![
        untimestamped(&run.next_line().await).to_owned(),
        untimestamped(&run.next_line().await).to_owned(),
    ];
    first.sort();
    let mut want = vec![
        format!("{a0}: status: SERVING"),
        format!("{a1}: status: SERVING"),
    ];
    want.sort();
    assert_eq!(first, want);

    b1.set_serving(false).await;
    let line = run.next_line().await;
    assert_eq!(untimestamped(&line), format!("{a1}: {NOT_SERVING}"));
    b1.stop().await;
    let line = run.next_line().await;
    assert!(
        untimestamped(&line).starts_with(&format!(
            "{a1}: error: failed to connect service at \"{a1}\""
        )),
        "{:#?}",
        run.seen
    );

    run.signal("INT").await;
    let (code, _) = run.finish().await;
    assert_eq!(
        code, 2,
        "b0 serving, b1 unreachable: the worst is a connection failure"
    );
    assert_eq!(b0.health_checks(), 1, "b0 was never re-watched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_service_is_watched_until_it_appears() {
    let backend = Backend::start("b0").await.unwrap();
    let addr = backend.addr().to_string();
    let mut run = Running::start(&["-addr", &addr, "-service", "orders", "-watch"]);
    // tonic-health ends a Watch of an unknown service with NOT_FOUND (the protocol says to
    // stream SERVICE_UNKNOWN): an RPC failure, as for a one-shot Check, retried with backoff.
    assert_eq!(
        untimestamped(&run.next_line().await),
        "error: health rpc failed: rpc error: code = NotFound desc = service not registered"
    );
    backend
        .set_service_status("orders", ServingStatus::Serving)
        .await;
    assert_eq!(untimestamped(&run.next_line().await), "status: SERVING");
    run.signal("INT").await;
    assert_eq!(run.finish().await.0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_watch_is_polled_with_check() {
    let health = CheckOnly::new(Duration::ZERO);
    let server = health.serve().await;
    let mut run = Running::start(&["-addr", &server.addr(), "-watch"]);
    assert_eq!(untimestamped(&run.next_line().await), "status: SERVING");
    health.set(ServingStatus::NotServing);
    assert_eq!(untimestamped(&run.next_line().await), NOT_SERVING);
    run.signal("INT").await;
    assert_eq!(run.finish().await.0, 4);
}

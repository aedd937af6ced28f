//! `HealthFilter` on its own: only healthy endpoints are inserted, unhealthy ones removed and
//! re-inserted, targets registered and unregistered with the checker, and a filter that falls
//! behind the transition stream still ends up exact.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::Poll;

use health_layer::{HealthChecker, HealthFilter, ProbeMode};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_test::{assert_pending, task};
use tower::discover::Change;

type Upstream = ReceiverStream<Result<Change<String, u32>, Infallible>>;

/// A checker whose custom probe answers from a table, probed only on demand.
fn checker() -> (HealthChecker, Arc<Mutex<HashMap<String, bool>>>) {
    let table: Arc<Mutex<HashMap<String, bool>>> = Arc::default();
    let t = table.clone();
    let checker = HealthChecker::builder()
        .mode(ProbeMode::custom(move |target| {
            let up = t.lock().unwrap().get(&*target).copied().unwrap_or(false);
            async move { if up { Ok(()) } else { Err("down".into()) } }
        }))
        .interval(std::time::Duration::ZERO)
        .events_capacity(4)
        .build()
        .unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    (checker, table)
}

async fn set(
    checker: &HealthChecker,
    table: &Mutex<HashMap<String, bool>>,
    target: &str,
    up: bool,
) {
    table.lock().unwrap().insert(target.to_owned(), up);
    checker.check_now(target).await.unwrap();
}

fn insert(k: &str, v: u32) -> Result<Change<String, u32>, Infallible> {
    Ok(Change::Insert(k.to_owned(), v))
}

fn remove(k: &str) -> Result<Change<String, u32>, Infallible> {
    Ok(Change::Remove(k.to_owned()))
}

fn show(p: Poll<Option<Result<Change<String, u32>, Infallible>>>) -> String {
    match p {
        Poll::Ready(Some(Ok(Change::Insert(k, v)))) => format!("insert {k}={v}"),
        Poll::Ready(Some(Ok(Change::Remove(k)))) => format!("remove {k}"),
        Poll::Ready(Some(Err(e))) => match e {},
        Poll::Ready(None) => "end".to_owned(),
        Poll::Pending => "pending".to_owned(),
    }
}

#[tokio::test]
async fn only_healthy_endpoints_are_inserted_and_unhealthy_ones_removed() {
    let (checker, table) = checker();
    checker.add_target("c").unwrap(); // the user's own target: the filter must not remove it
    let (tx, rx) = mpsc::channel(8);
    let mut filter = task::spawn(HealthFilter::new(Upstream::new(rx), checker.clone()));

    tx.send(insert("a", 1)).await.unwrap();
    tx.send(insert("b", 2)).await.unwrap();
    assert_pending!(filter.poll_next(), "no verdict yet: nothing inserted");
    assert!(
        checker.contains("a") && checker.contains("b"),
        "registered with the checker"
    );

    set(&checker, &table, "a", true).await;
    assert!(filter.is_woken());
    assert_eq!(show(filter.poll_next()), "insert a=1");
    assert_pending!(filter.poll_next());

    set(&checker, &table, "b", false).await;
    assert_pending!(
        filter.poll_next(),
        "unhealthy and never inserted: nothing to say"
    );

    set(&checker, &table, "a", false).await;
    assert_eq!(show(filter.poll_next()), "remove a");
    set(&checker, &table, "a", true).await;
    assert_eq!(show(filter.poll_next()), "insert a=1");

    // The same key with a new service replaces it.
    tx.send(insert("a", 10)).await.unwrap();
    assert_eq!(show(filter.poll_next()), "insert a=10");

    tx.send(remove("a")).await.unwrap();
    assert_eq!(show(filter.poll_next()), "remove a");
    assert!(
        !checker.contains("a"),
        "the filter's own target is unregistered"
    );
    tx.send(remove("b")).await.unwrap();
    assert_pending!(filter.poll_next(), "b was never inserted");
    assert!(!checker.contains("b"));

    tx.send(insert("c", 3)).await.unwrap();
    assert_pending!(filter.poll_next());
    set(&checker, &table, "c", true).await;
    assert_eq!(show(filter.poll_next()), "insert c=3");
    tx.send(remove("c")).await.unwrap();
    assert_eq!(show(filter.poll_next()), "remove c");
    assert!(
        checker.contains("c"),
        "a target the filter did not add stays"
    );

    // The upstream ends: health still changes, so the filter goes on until the checker stops.
    drop(tx);
    assert_pending!(filter.poll_next());
    checker.stop().await;
    assert_eq!(show(filter.poll_next()), "end");
}

#[tokio::test]
async fn a_filter_that_falls_behind_re_reads_every_card() {
    let (checker, table) = checker();
    let (tx, rx) = mpsc::channel(8);
    let mut filter = task::spawn(HealthFilter::new(Upstream::new(rx), checker.clone()));
    for (k, v) in [("a", 1), ("b", 2), ("c", 3)] {
        tx.send(insert(k, v)).await.unwrap();
    }
    assert_pending!(filter.poll_next());

    // Many more transitions than the stream keeps (capacity 4), none read meanwhile.
    for _ in 0..5 {
        for k in ["a", "b", "c"] {
            set(&checker, &table, k, true).await;
            set(&checker, &table, k, false).await;
        }
    }
    set(&checker, &table, "b", true).await;
    let mut out = Vec::new();
    loop {
        match filter.poll_next() {
            Poll::Pending => break,
            p => out.push(show(p)),
        }
    }
    assert_eq!(out, ["insert b=2"], "exactly the current state");
    checker.stop().await;
}

#[tokio::test]
async fn an_endpoint_that_cannot_be_checked_is_never_inserted() {
    // Default Check mode: a target name must be a URI.
    let checker = HealthChecker::builder().build().unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    let (tx, rx) = mpsc::channel(8);
    let mut filter = task::spawn(HealthFilter::new(Upstream::new(rx), checker.clone()));
    tx.send(insert("not a uri", 1)).await.unwrap();
    assert_pending!(filter.poll_next());
    assert!(checker.targets().is_empty());
    checker.stop().await;
}

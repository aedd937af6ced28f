//! Discovery: endpoints come and go while the balancer runs, with or without traffic.

mod support;

use std::sync::Arc;
use std::time::Duration;

use balance_layer::error::BoxError;
use balance_layer::{Balance, BalanceConfig, NoCard, NoHealthyTargets};
use support::{Counted, Req, channel, settle, tally};
use tower::discover::Change;
use tower::{Service, ServiceExt};

async fn call<S>(svc: &mut S) -> Result<Arc<str>, BoxError>
where
    S: Service<Req, Response = Arc<str>, Error = BoxError>,
{
    svc.ready().await?.call(Req::default()).await
}

fn names(v: Vec<Arc<str>>) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_inserted_and_removed_while_running() {
    let (tx, discover) = channel::<String, Counted>(8);
    let mut balance = Balance::new(discover, BalanceConfig::new()).unwrap();

    let err = call(&mut balance).await.unwrap_err();
    let err = err.downcast::<NoHealthyTargets>().unwrap();
    assert!(
        err.to_string().contains("no targets discovered yet"),
        "{err}"
    );

    let (b0, b1) = (Counted::carded("b0"), Counted::carded("b1"));
    tx.send(Change::Insert("b0".into(), b0.clone()))
        .await
        .unwrap();
    settle(|| balance.targets().len() == 1).await;
    for _ in 0..3 {
        assert_eq!(&*call(&mut balance).await.unwrap(), "b0");
    }

    tx.send(Change::Insert("b1".into(), b1.clone()))
        .await
        .unwrap();
    settle(|| balance.targets().len() == 2).await;
    let mut got = Vec::new();
    for _ in 0..10 {
        got.push(call(&mut balance).await.unwrap());
    }
    let t = tally(got);
    assert_eq!((t["b0"], t["b1"]), (5, 5));

    tx.send(Change::Remove("b0".into())).await.unwrap();
    settle(|| names(balance.targets()) == ["b1"]).await;
    let before = b0.hits();
    for _ in 0..10 {
        assert_eq!(&*call(&mut balance).await.unwrap(), "b1");
    }
    assert_eq!(b0.hits(), before, "a removed endpoint gets no new call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_is_driven_without_any_request() {
    // Capacity 1: each send completes only once the balancer has taken the previous change,
    // and no request is ever made.
    let (tx, discover) = channel::<String, Counted>(1);
    let balance = Balance::<_, Req>::new(discover, BalanceConfig::new()).unwrap();
    let eps: Vec<Counted> = (0..5).map(|i| Counted::carded(&format!("b{i}"))).collect();
    for e in &eps {
        let send = tx.send(Change::Insert(e.name.to_string(), e.clone()));
        tokio::time::timeout(Duration::from_secs(10), send)
            .await
            .expect("the balancer keeps taking changes")
            .unwrap();
    }
    settle(|| balance.targets().len() == 5).await;
    tx.send(Change::Remove("b3".into())).await.unwrap();
    settle(|| balance.targets().len() == 4).await;
    assert_eq!(names(balance.targets()), ["b0", "b1", "b2", "b4"]);
    assert!(eps.iter().all(|e| e.hits() == 0), "no request was made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_an_endpoint_lets_its_in_flight_calls_finish() {
    let (mock, mut handle) = tower_test::mock::pair::<Req, Arc<str>>();
    let (tx, discover) = channel::<String, NoCard<tower_test::mock::Mock<Req, Arc<str>>>>(4);
    tx.send(Change::Insert("b0".into(), NoCard::new(mock)))
        .await
        .unwrap();
    let mut balance = Balance::new(discover, BalanceConfig::new()).unwrap();
    settle(|| balance.targets().len() == 1).await;

    let in_flight = tokio::spawn({
        let mut b = balance.clone();
        async move { b.ready().await?.call(Req::default()).await }
    });
    let (_req, reply) = handle.next_request().await.expect("the call reached b0");

    tx.send(Change::Remove("b0".into())).await.unwrap();
    settle(|| balance.targets().is_empty()).await;

    // The call made before the removal still completes, with b0's answer.
    reply.send_response(Arc::from("b0"));
    let answer = tokio::time::timeout(Duration::from_secs(10), in_flight)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(&*answer, "b0");

    // New calls do not go there.
    let err = call(&mut balance).await.unwrap_err();
    assert!(err.is::<NoHealthyTargets>(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserting_a_known_key_replaces_its_service() {
    let (tx, discover) = channel::<String, Counted>(4);
    let mut balance = Balance::new(discover, BalanceConfig::new()).unwrap();
    let (old, new) = (Counted::carded("old"), Counted::carded("new"));
    tx.send(Change::Insert("b0".into(), old.clone()))
        .await
        .unwrap();
    settle(|| balance.targets().len() == 1).await;
    assert_eq!(&*call(&mut balance).await.unwrap(), "old");

    tx.send(Change::Insert("b0".into(), new.clone()))
        .await
        .unwrap();
    settle(|| call_now(&mut balance).as_deref() == Some("new")).await;
    assert_eq!(names(balance.targets()), ["b0"]);
    let before = old.hits();
    for _ in 0..5 {
        assert_eq!(&*call(&mut balance).await.unwrap(), "new");
    }
    assert_eq!(old.hits(), before);
}

/// One call, made only if the balancer is ready at once.
fn call_now<S>(svc: &mut S) -> Option<String>
where
    S: Service<Req, Response = Arc<str>, Error = BoxError>,
{
    use futures_util::FutureExt;
    let svc = svc.ready().now_or_never()?.ok()?;
    Some(svc.call(Req::default()).now_or_never()?.ok()?.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_task_stops_with_the_last_clone() {
    let (tx, discover) = channel::<String, Counted>(4);
    let balance = Balance::<_, Req>::new(discover, BalanceConfig::new()).unwrap();
    let clone = balance.clone();
    drop(balance);
    tx.send(Change::Insert("b0".into(), Counted::carded("b0")))
        .await
        .unwrap();
    settle(|| clone.targets().len() == 1).await;
    assert!(!tx.is_closed(), "a clone is alive: discovery keeps running");

    drop(clone);
    // The task drops the discovery stream (and with it the receiver) when it stops.
    tokio::time::timeout(Duration::from_secs(10), tx.closed())
        .await
        .expect("discovery is dropped once no handle is left");
}

#[tokio::test]
async fn endpoints_outlive_the_end_and_the_failure_of_discovery() {
    let b0 = Counted::carded("b0");
    let changes: Vec<Result<Change<String, Counted>, std::io::Error>> = vec![
        Ok(Change::Insert("b0".into(), b0.clone())),
        Err(std::io::Error::other("resolver went away")),
    ];
    let mut balance =
        Balance::new(futures_util::stream::iter(changes), BalanceConfig::new()).unwrap();
    for _ in 0..3 {
        assert_eq!(&*call(&mut balance).await.unwrap(), "b0");
    }
    b0.card()
        .set_health(endpoint_state::HealthVerdict::Unhealthy, None);
    settle(|| balance.eligible_targets().is_empty()).await;
    let err = call(&mut balance).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("discovery failed: resolver went away"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_completes_when_the_balancer_takes_in_a_change() {
    let (tx, discover) = channel::<String, Counted>(8);
    let balance = Balance::<_, Req>::new(discover, BalanceConfig::new()).unwrap();
    let b0 = Counted::carded("b0");

    // Subscribed before the change: an insert completes it.
    let changed = balance.changed();
    tx.send(Change::Insert("b0".into(), b0.clone()))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), changed)
        .await
        .expect("an insert is a change");
    assert_eq!(names(balance.targets()), ["b0"]);

    // A card that makes an endpoint ineligible is a change too, with no discovery event.
    let changed = balance.changed();
    b0.card().set_health(
        endpoint_state::HealthVerdict::Unhealthy,
        Some("NOT_SERVING".into()),
    );
    tokio::time::timeout(Duration::from_secs(10), changed)
        .await
        .expect("an eligibility change is a change");
    assert!(balance.eligible_targets().is_empty());

    // Nothing happening: it stays pending.
    let idle = tokio::time::timeout(Duration::from_millis(50), balance.changed()).await;
    assert!(idle.is_err(), "no change, no completion");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_services_are_reused_across_calls_and_let_go_on_removal() {
    let (tx, discover) = channel::<String, Counted>(8);
    let mut balance = Balance::new(discover, BalanceConfig::new()).unwrap();
    let eps: Vec<Counted> = (0..3).map(|i| Counted::carded(&format!("b{i}"))).collect();
    for e in &eps {
        tx.send(Change::Insert(e.name.to_string(), e.clone()))
            .await
            .unwrap();
    }
    settle(|| balance.targets().len() == 3).await;
    let cloned_before: usize = eps.iter().map(Counted::clones).sum();
    for _ in 0..300 {
        call(&mut balance).await.unwrap();
    }
    assert_eq!(eps.iter().map(Counted::hits).sum::<usize>(), 300);
    // The first call's clone is let go (a handle used once keeps nothing); after that, one
    // clone per endpoint, reused — not one per call.
    let cloned = eps.iter().map(Counted::clones).sum::<usize>() - cloned_before;
    assert!(cloned <= 4, "{cloned} clones for 300 calls");

    // b0 is removed: this handle still holds its spare of b0 until its next call.
    tx.send(Change::Remove("b0".into())).await.unwrap();
    settle(|| names(balance.targets()) == ["b1", "b2"]).await;
    call(&mut balance).await.unwrap();
    assert_eq!(
        eps[0].alive(),
        1,
        "a removed endpoint's service is still held"
    );
    drop(balance);
    // The background task stops with the last handle, and every clone goes with it.
    settle(|| eps.iter().all(|e| e.alive() == 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_counts_stay_with_their_endpoint_across_replacement_and_removal() {
    type Mock = NoCard<tower_test::mock::Mock<Req, Arc<str>>>;
    let (tx, discover) = channel::<String, Mock>(4);
    let config = BalanceConfig::new()
        .strategy(balance_layer::Strategy::LeastInFlight)
        .seed(1);
    let mut balance = Balance::new(discover, config).unwrap();
    let (old, mut old_handle) = tower_test::mock::pair::<Req, Arc<str>>();
    tx.send(Change::Insert("b0".into(), NoCard::new(old)))
        .await
        .unwrap();
    settle(|| balance.targets().len() == 1).await;

    // A call in flight on b0, then b0 replaced by a new service under the same key.
    let first = balance.ready().await.unwrap().call(Req::default());
    let (_, reply) = old_handle
        .next_request()
        .await
        .expect("the call reached b0");
    assert_eq!(balance.in_flight("b0"), Some(1));
    let (new, mut new_handle) = tower_test::mock::pair::<Req, Arc<str>>();
    tx.send(Change::Insert("b0".into(), NoCard::new(new)))
        .await
        .unwrap();
    // The new endpoint counts from zero: the call on the old one is not its own.
    settle(|| balance.in_flight("b0") == Some(0)).await;

    // The old call finishing counts down the old endpoint, not the new one.
    reply.send_response(Arc::from("old b0"));
    assert_eq!(&*first.await.unwrap(), "old b0");
    assert_eq!(balance.in_flight("b0"), Some(0));

    // The new endpoint counts its own calls: once each, whether answered or dropped.
    let answered = balance.ready().await.unwrap().call(Req::default());
    let (_, reply) = new_handle
        .next_request()
        .await
        .expect("the call reached b0");
    let dropped = balance.ready().await.unwrap().call(Req::default());
    let _unanswered = new_handle
        .next_request()
        .await
        .expect("the call reached b0");
    assert_eq!(balance.in_flight("b0"), Some(2));
    reply.send_response(Arc::from("new b0"));
    assert_eq!(&*answered.await.unwrap(), "new b0");
    assert_eq!(balance.in_flight("b0"), Some(1));
    drop(dropped);
    assert_eq!(balance.in_flight("b0"), Some(0));

    // b0 removed with a call in flight; b1, inserted meanwhile, counts from zero, and so does
    // b2, inserted once b0 is gone with its last call (it may take over b0's counter).
    let held = balance.ready().await.unwrap().call(Req::default());
    let (_, reply) = new_handle
        .next_request()
        .await
        .expect("the call reached b0");
    tx.send(Change::Remove("b0".into())).await.unwrap();
    let (b1, mut b1_handle) = tower_test::mock::pair::<Req, Arc<str>>();
    tx.send(Change::Insert("b1".into(), NoCard::new(b1)))
        .await
        .unwrap();
    settle(|| names(balance.targets()) == ["b1"]).await;
    assert_eq!(balance.in_flight("b1"), Some(0));
    reply.send_response(Arc::from("removed b0"));
    assert_eq!(&*held.await.unwrap(), "removed b0");
    drop(new_handle);
    let (b2, mut b2_handle) = tower_test::mock::pair::<Req, Arc<str>>();
    tx.send(Change::Insert("b2".into(), NoCard::new(b2)))
        .await
        .unwrap();
    settle(|| balance.targets().len() == 2).await;
    assert_eq!(
        (balance.in_flight("b1"), balance.in_flight("b2")),
        (Some(0), Some(0))
    );

    // Each counts only its own calls.
    let mut futures = Vec::new();
    for _ in 0..3 {
        futures.push(balance.ready().await.unwrap().call(Req::default()));
    }
    let mut replies = Vec::new();
    let (mut to_b1, mut to_b2) = (0, 0);
    while replies.len() < 3 {
        tokio::select! {
            Some((_, reply)) = b1_handle.next_request() => { to_b1 += 1; replies.push(reply); }
            Some((_, reply)) = b2_handle.next_request() => { to_b2 += 1; replies.push(reply); }
        }
    }
    assert_eq!(
        (balance.in_flight("b1"), balance.in_flight("b2")),
        (Some(to_b1), Some(to_b2))
    );
    drop(futures);
    assert_eq!(
        (balance.in_flight("b1"), balance.in_flight("b2")),
        (Some(0), Some(0))
    );
}

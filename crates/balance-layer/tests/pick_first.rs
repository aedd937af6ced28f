//! Pick-first (gRPC's default policy, gRFC A62): every call to the first eligible endpoint in
//! order; on its failure the first eligible one from the top again; sticky when an earlier one
//! comes back; the order shuffled, deterministically with a seed, once per change of the set.

mod support;

use std::sync::Arc;

use balance_layer::{Balance, BalanceConfig, Strategy};
use endpoint_state::HealthVerdict;
use support::{Counted, Req, calls, carded, list_counted, tally};
use tower::discover::Change;

fn pick_first(shuffle: bool) -> Strategy {
    Strategy::PickFirst {
        shuffle_address_list: shuffle,
    }
}

fn down(ep: &Counted) {
    ep.card()
        .set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
}

fn up(ep: &Counted) {
    ep.card().set_health(HealthVerdict::Healthy, None);
}

/// The one endpoint that answered all of `n` calls.
async fn only<S>(balance: &mut S, n: usize) -> String
where
    S: tower::Service<Req, Response = Arc<str>, Error = balance_layer::error::BoxError>,
{
    let t = tally(calls(balance, n).await);
    assert_eq!(t.len(), 1, "every call to one endpoint: {t:?}");
    t.into_keys().next().unwrap()
}

#[tokio::test]
async fn every_call_goes_to_the_first_endpoint_in_discovery_order() {
    let eps = carded(3);
    let mut balance = Balance::new(
        list_counted(&eps),
        BalanceConfig::new().strategy(Strategy::pick_first()),
    )
    .unwrap();
    assert_eq!(only(&mut balance, 30).await, "b0");
    // From every clone too.
    let mut clone = balance.clone();
    assert_eq!(only(&mut clone, 10).await, "b0");
    assert_eq!(eps[0].hits(), 40);
}

#[tokio::test]
async fn failover_goes_down_the_list_and_stays_when_an_earlier_one_comes_back() {
    let eps = carded(3);
    let mut balance = Balance::new(
        list_counted(&eps),
        BalanceConfig::new().strategy(Strategy::pick_first()),
    )
    .unwrap();
    assert_eq!(only(&mut balance, 10).await, "b0");

    // b0 fails: the next in order.
    down(&eps[0]);
    support::settle(|| balance.eligible_targets().len() == 2).await;
    assert_eq!(only(&mut balance, 10).await, "b1");

    // b0 comes back: calls stay on b1, as gRPC's pick_first stays on the connection it has.
    up(&eps[0]);
    support::settle(|| balance.eligible_targets().len() == 3).await;
    assert_eq!(only(&mut balance, 10).await, "b1");

    // b1 fails: the first eligible from the top of the list again (b0), not the one after b1.
    down(&eps[1]);
    support::settle(|| balance.eligible_targets().len() == 2).await;
    assert_eq!(only(&mut balance, 10).await, "b0");
}

#[tokio::test]
async fn a_change_seen_only_on_the_card_moves_the_next_call_at_once() {
    // The card shuts b0 and the next call is made before the balancer's task has rebuilt its
    // set: the pick double-checks the card, waits for the rebuild, and goes to b1.
    let eps = carded(3);
    let mut balance = Balance::new(
        list_counted(&eps),
        BalanceConfig::new().strategy(Strategy::pick_first()),
    )
    .unwrap();
    assert_eq!(only(&mut balance, 3).await, "b0");
    down(&eps[0]);
    assert_eq!(only(&mut balance, 3).await, "b1");
}

#[tokio::test]
async fn discovery_removing_the_current_endpoint_moves_calls_and_an_insert_does_not() {
    let (tx, changes) = support::channel::<String, Counted>(16);
    let mut balance = Balance::new(
        changes,
        BalanceConfig::new().strategy(Strategy::pick_first()),
    )
    .unwrap();
    for name in ["b0", "b1", "b2"] {
        tx.send(Change::Insert(name.into(), Counted::carded(name)))
            .await
            .unwrap();
    }
    support::settle(|| balance.targets().len() == 3).await;
    assert_eq!(only(&mut balance, 5).await, "b0");
    tx.send(Change::Remove("b0".into())).await.unwrap();
    support::settle(|| balance.targets().len() == 2).await;
    assert_eq!(only(&mut balance, 5).await, "b1");
    // An endpoint inserted (even one named as the first was) does not take over.
    tx.send(Change::Insert("b0".into(), Counted::carded("b0")))
        .await
        .unwrap();
    support::settle(|| balance.targets().len() == 3).await;
    assert_eq!(only(&mut balance, 5).await, "b1");
}

/// The order calls go through as endpoints fail one by one, for a balancer over 8 endpoints
/// built with `seed`.
async fn failover_order(shuffle: bool, seed: u64) -> Vec<String> {
    let eps = carded(8);
    let config = BalanceConfig::new()
        .strategy(pick_first(shuffle))
        .seed(seed);
    let mut balance = Balance::new(list_counted(&eps), config).unwrap();
    let mut order = Vec::new();
    for left in (1..=8).rev() {
        support::settle(|| balance.eligible_targets().len() == left).await;
        let name = only(&mut balance, 3).await;
        let ep = eps.iter().find(|e| *e.name == *name).unwrap();
        down(ep);
        order.push(name);
    }
    order
}

#[tokio::test]
async fn shuffle_address_list_is_deterministic_with_a_seed() {
    // Without shuffling: discovery order.
    let plain: Vec<String> = (0..8).map(|i| format!("b{i}")).collect();
    assert_eq!(failover_order(false, 1).await, plain);

    let mut orders = Vec::new();
    for seed in 0..6 {
        let a = failover_order(true, seed).await;
        let b = failover_order(true, seed).await;
        assert_eq!(a, b, "seed {seed}: the same seed, the same order");
        // A permutation of the endpoints.
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, plain, "seed {seed}");
        orders.push(a);
    }
    // Seeds give different orders, and the first endpoint varies (what the shuffle is for:
    // clients that see the same list spread over it).
    orders.sort();
    orders.dedup();
    assert!(orders.len() >= 5, "{orders:?}");
    let firsts: std::collections::BTreeSet<&String> = orders.iter().map(|o| &o[0]).collect();
    assert!(firsts.len() >= 3, "{firsts:?}");
}

#[tokio::test]
async fn the_order_is_shuffled_once_per_change_of_the_set_and_the_current_endpoint_stays() {
    let (tx, changes) = support::channel::<String, Counted>(64);
    let config = BalanceConfig::new().strategy(pick_first(true)).seed(11);
    let mut balance = Balance::new(changes, config).unwrap();
    let eps: Vec<Counted> = carded(6);
    for ep in &eps {
        tx.send(Change::Insert(ep.name.to_string(), ep.clone()))
            .await
            .unwrap();
    }
    support::settle(|| balance.targets().len() == 6).await;
    let current = only(&mut balance, 5).await;
    // Card changes of other endpoints do not reshuffle: calls stay.
    for ep in eps.iter().filter(|e| *e.name != *current) {
        down(ep);
        support::settle(|| balance.eligible_targets().len() == 5).await;
        up(ep);
        support::settle(|| balance.eligible_targets().len() == 6).await;
    }
    support::settle(|| balance.eligible_targets().len() == 6).await;
    assert_eq!(only(&mut balance, 5).await, current);
    // A new list (an endpoint inserted) is shuffled again, but the current endpoint, still
    // there and eligible, keeps the calls.
    tx.send(Change::Insert("b6".into(), Counted::carded("b6")))
        .await
        .unwrap();
    support::settle(|| balance.targets().len() == 7).await;
    assert_eq!(only(&mut balance, 5).await, current);
}

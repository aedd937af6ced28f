//! Ring hash (gRFCs A42, A76): the same key lands on the same endpoint while it is eligible,
//! whatever the discovery order; an endpoint inserted takes only its share of the keys and
//! one removed gives back only its own, at any number of endpoints; the table is the one
//! the docs describe; a key whose endpoint is not eligible goes to the next one on the ring,
//! or to an endpoint that owns no position when none that owns one is eligible; the hash
//! comes from a header of a real `http::Request` or a `RequestHash` extension; no hash
//! spreads calls at random.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use balance_layer::{
    Balance, BalanceConfig, RequestDeadline, RequestHash, RequestHashKey, Strategy,
};
use endpoint_state::HealthVerdict;
use support::{Counted, Req, carded, list_counted};
use tower::discover::Change;
use tower::{Service, ServiceExt};

const KEYS: u64 = 10_000;

/// A request that carries its own hash.
#[derive(Debug, Clone, Copy)]
struct Keyed(u64);

impl RequestDeadline for Keyed {
    fn time_budget(&self) -> Option<Duration> {
        None
    }
}

impl RequestHashKey for Keyed {
    fn request_hash(&self, _header: Option<&http::HeaderName>) -> Option<u64> {
        Some(self.0)
    }
}

fn key(k: u64) -> u64 {
    RequestHash::of(format!("key-{k}").as_bytes()).0
}

fn config() -> BalanceConfig {
    BalanceConfig::new().strategy(Strategy::ring_hash()).seed(1)
}

/// The endpoint that answers a call with hash `hash`.
async fn owner<S, R>(balance: &mut S, req: R) -> Arc<str>
where
    S: Service<R, Response = Arc<str>>,
    S::Error: std::fmt::Debug,
{
    balance.ready().await.unwrap().call(req).await.unwrap()
}

/// Where every one of the `KEYS` keys lands.
async fn placement<S>(balance: &mut S) -> Vec<Arc<str>>
where
    S: Service<Keyed, Response = Arc<str>>,
    S::Error: std::fmt::Debug,
{
    let mut out = Vec::with_capacity(KEYS as usize);
    for k in 0..KEYS {
        out.push(owner(balance, Keyed(key(k))).await);
    }
    out
}

/// The table as the docs of `Strategy::RingHash` describe it, built here independently:
/// `size` positions; endpoint `e`'s score of position `s` is SplitMix64's output function of
/// `XXH64(e) + (s + 1) × 0x9E3779B97F4A7C15`; each position belongs to the highest score (on
/// a tie, the lesser name); a hash `h` lands on position `h × size / 2^64` and goes on, round
/// the table, to the first position whose owner is eligible.
struct Reference {
    owners: Vec<String>,
}

impl Reference {
    fn new(names: &[&str], size: usize) -> Self {
        fn splitmix64(mut z: u64) -> u64 {
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        let keys: Vec<u64> = names
            .iter()
            .map(|name| RequestHash::of(name.as_bytes()).0)
            .collect();
        let owners = (0..size as u64)
            .map(|s| {
                let (_, name) = names
                    .iter()
                    .zip(&keys)
                    .map(|(name, key)| {
                        let score = splitmix64(
                            key.wrapping_add((s + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                        );
                        // Highest score first; on a tie, the lesser name.
                        (score, std::cmp::Reverse(*name))
                    })
                    .max()
                    .expect("some endpoint");
                name.0.to_string()
            })
            .collect();
        Reference { owners }
    }

    /// The table of the default configuration: 4,096 positions.
    fn default_over(names: &[&str]) -> Self {
        Reference::new(names, 4096)
    }

    /// The first endpoint from `hash`'s position on that `eligible` accepts.
    fn owner(&self, hash: u64, eligible: impl Fn(&str) -> bool) -> &str {
        let len = self.owners.len();
        let start = ((u128::from(hash) * len as u128) >> 64) as usize;
        (0..len)
            .map(|i| &self.owners[(start + i) % len])
            .find(|name| eligible(name))
            .expect("some endpoint is eligible")
    }

    /// Where every one of the `KEYS` keys lands while every endpoint is eligible.
    fn placement(&self) -> Vec<String> {
        (0..KEYS)
            .map(|k| self.owner(key(k), |_| true).to_string())
            .collect()
    }
}
type Changes = support::Changes<String, Counted>;

async fn over_channel<R>(
    names: &[&str],
) -> (
    tokio::sync::mpsc::Sender<Change<String, Counted>>,
    Vec<Counted>,
    Balance<Changes, R>,
) {
    let (tx, changes) = support::channel::<String, Counted>(64);
    let balance = Balance::new(changes, config()).unwrap();
    let mut eps = Vec::new();
    for name in names {
        let ep = Counted::carded(name);
        tx.send(Change::Insert(name.to_string(), ep.clone()))
            .await
            .unwrap();
        eps.push(ep);
    }
    let n = names.len();
    support::settle(|| balance.targets().len() == n).await;
    (tx, eps, balance)
}

fn moved(before: &[Arc<str>], after: &[Arc<str>]) -> Vec<usize> {
    (0..before.len())
        .filter(|&i| before[i] != after[i])
        .collect()
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("b{i}")).collect()
}

fn as_strs(names: &[String]) -> Vec<&str> {
    names.iter().map(String::as_str).collect()
}

fn same(placement: &[Arc<str>], expected: &[String]) -> bool {
    placement
        .iter()
        .map(|n| &**n)
        .eq(expected.iter().map(String::as_str))
}

/// Inserts `b{n}` into a balancer over `b0..b{n-1}` and checks that the keys that moved all
/// went to it, at most its share `1/(n+1)` of them (+ 3 % of all keys for the table's and
/// the keys' randomness), and that both placements are the documented table's. Returns the
/// placement before.
async fn insert_one(n: usize) -> Vec<Arc<str>> {
    let old = names(n);
    let new = names(n + 1);
    let (tx, _eps, mut balance) = over_channel::<Keyed>(&as_strs(&old)).await;
    let before = placement(&mut balance).await;
    assert!(same(
        &before,
        &Reference::default_over(&as_strs(&old)).placement()
    ));

    let added = &new[n];
    tx.send(Change::Insert(added.clone(), Counted::carded(added)))
        .await
        .unwrap();
    support::settle(|| balance.targets().len() == n + 1).await;
    let after = placement(&mut balance).await;
    assert!(same(
        &after,
        &Reference::default_over(&as_strs(&new)).placement()
    ));

    let moved = moved(&before, &after);
    let share = 1.0 / (n + 1) as f64;
    println!(
        "{n} -> {} endpoints: {} of {KEYS} keys moved ({:.1} %; 1/{} is {:.1} %)",
        n + 1,
        moved.len(),
        moved.len() as f64 * 100.0 / KEYS as f64,
        n + 1,
        share * 100.0
    );
    assert!(
        moved.len() as f64 <= (share + 0.03) * KEYS as f64,
        "{} of {KEYS} keys moved",
        moved.len()
    );
    assert!(
        moved.len() as f64 >= share / 2.0 * KEYS as f64,
        "the new endpoint took too few keys: {}",
        moved.len()
    );
    // Every key that moved went to the new endpoint: none moved between the old ones.
    assert!(moved.iter().all(|&i| &*after[i] == added));
    before
}

/// Removes `removed` from a balancer over `b0..b{n-1}` and checks that exactly its keys
/// moved, to the documented table's endpoints.
async fn remove_one(n: usize, removed: &str) {
    let all = names(n);
    let (tx, _eps, mut balance) = over_channel::<Keyed>(&as_strs(&all)).await;
    let before = placement(&mut balance).await;
    tx.send(Change::Remove(removed.into())).await.unwrap();
    support::settle(|| balance.targets().len() == n - 1).await;
    let after = placement(&mut balance).await;

    let moved = moved(&before, &after);
    let owned: Vec<usize> = (0..before.len())
        .filter(|&i| &*before[i] == removed)
        .collect();
    println!(
        "{n} -> {} endpoints ({removed} removed): {} of {KEYS} keys moved, {removed} had {}",
        n - 1,
        moved.len(),
        owned.len()
    );
    assert!(!owned.is_empty());
    assert_eq!(moved, owned, "exactly {removed}'s keys moved");
    let rest: Vec<&str> = all
        .iter()
        .map(String::as_str)
        .filter(|&n| n != removed)
        .collect();
    assert!(same(&after, &Reference::default_over(&rest).placement()));
}

#[tokio::test]
async fn inserting_a_fourth_endpoint_moves_only_the_keys_that_go_to_it() {
    let before = insert_one(3).await;
    // Three endpoints share the keys evenly: a third each, within 10 %.
    let shares = support::tally(before.iter().cloned());
    println!("3 endpoints: {shares:?} of {KEYS} keys");
    assert_eq!(shares.len(), 3, "{shares:?}");
    for (name, n) in &shares {
        assert!(
            (3_000..=3_667).contains(n),
            "{name}: {n} of {KEYS} ({shares:?})"
        );
    }
}

#[tokio::test]
async fn inserting_a_fifth_endpoint_moves_only_the_keys_that_go_to_it() {
    insert_one(4).await;
}

#[tokio::test]
async fn inserting_a_ninth_endpoint_moves_only_the_keys_that_go_to_it() {
    insert_one(8).await;
}

#[tokio::test]
async fn removing_an_endpoint_moves_only_its_own_keys() {
    remove_one(4, "b1").await;
    remove_one(5, "b2").await;
    remove_one(9, "b5").await;
}

#[tokio::test]
async fn the_same_key_lands_on_the_same_endpoint_from_every_clone_and_any_order() {
    let eps = carded(5);
    let mut balance: Balance<_, Keyed> = Balance::new(list_counted(&eps), config()).unwrap();
    let first = placement(&mut balance).await;
    // Again: from the same clone, from fresh clones (each with its own generator), and from
    // another balancer over the same endpoints listed in another order.
    assert_eq!(placement(&mut balance).await, first);
    let mut clone = balance.clone();
    assert_eq!(placement(&mut clone).await, first);
    let reversed: Vec<Counted> = eps.iter().rev().cloned().collect();
    let mut other: Balance<_, Keyed> = Balance::new(list_counted(&reversed), config()).unwrap();
    assert_eq!(placement(&mut other).await, first);

    // Through a rebuild that changes the discovery order: two endpoints leave and come back
    // in the other order (b1, b3, b4, b2, b0), in one batch and then one by one.
    let (tx, _eps, mut balance) = over_channel::<Keyed>(&["b0", "b1", "b2", "b3", "b4"]).await;
    assert_eq!(placement(&mut balance).await, first);
    for name in ["b0", "b2"] {
        tx.send(Change::Remove(name.into())).await.unwrap();
    }
    for name in ["b2", "b0"] {
        tx.send(Change::Insert(name.into(), Counted::carded(name)))
            .await
            .unwrap();
    }
    support::settle(|| balance.targets().len() == 5).await;
    assert_eq!(placement(&mut balance).await, first);
    tx.send(Change::Remove("b3".into())).await.unwrap();
    support::settle(|| balance.targets().len() == 4).await;
    tx.send(Change::Insert("b3".into(), Counted::carded("b3")))
        .await
        .unwrap();
    support::settle(|| balance.targets().len() == 5).await;
    assert_eq!(placement(&mut balance).await, first);
}

#[tokio::test]
async fn the_table_has_max_ring_size_positions_below_the_cap() {
    // 100 positions: a key lands where the documented table of 100 says, which differs from
    // the default table of 4,096 for some keys.
    let names = ["b0", "b1", "b2"];
    let eps = carded(3);
    let config = config().strategy(Strategy::RingHash {
        min_ring_size: 10,
        max_ring_size: 100,
        request_hash_header: None,
    });
    let mut balance: Balance<_, Keyed> = Balance::new(list_counted(&eps), config).unwrap();
    let small = Reference::new(&names, 100).placement();
    assert!(same(&placement(&mut balance).await, &small));
    assert_ne!(small, Reference::default_over(&names).placement());
}

#[tokio::test]
async fn endpoints_without_a_position_serve_when_no_owner_is_eligible() {
    // One position for three endpoints: one owns it, and takes every key while eligible;
    // when it is not, the keys spread over the other two by their hash (no call waits).
    let names = ["b0", "b1", "b2"];
    let eps = carded(3);
    let config = config().strategy(Strategy::RingHash {
        min_ring_size: 1,
        max_ring_size: 1,
        request_hash_header: None,
    });
    let mut balance: Balance<_, Keyed> = Balance::new(list_counted(&eps), config).unwrap();
    support::settle(|| balance.eligible_targets().len() == 3).await;
    let reference = Reference::new(&names, 1);
    let holder = reference.owners[0].clone();
    let before = placement(&mut balance).await;
    assert!(before.iter().all(|name| **name == *holder));

    let i = names.iter().position(|&n| n == holder).unwrap();
    eps[i]
        .card()
        .set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    support::settle(|| balance.eligible_targets().len() == 2).await;
    let during = placement(&mut balance).await;
    let shares = support::tally(during.iter().cloned());
    assert_eq!(shares.len(), 2, "{shares:?}");
    assert!(!shares.contains_key(&holder), "{shares:?}");
    // And the same key keeps its endpoint.
    assert_eq!(placement(&mut balance).await, during);
}

#[tokio::test]
async fn a_key_whose_endpoint_is_not_eligible_goes_to_the_next_on_the_ring() {
    let names = ["b0", "b1", "b2"];
    let eps = carded(3);
    let mut balance: Balance<_, Keyed> = Balance::new(list_counted(&eps), config()).unwrap();
    support::settle(|| balance.eligible_targets().len() == 3).await;
    // The documented table: 4,096 positions over 3 endpoints.
    let reference = Reference::default_over(&names);
    let before = placement(&mut balance).await;
    for k in 0..KEYS {
        assert_eq!(
            &*before[k as usize],
            reference.owner(key(k), |_| true),
            "key {k}"
        );
    }

    eps[1]
        .card()
        .set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    support::settle(|| balance.eligible_targets().len() == 2).await;
    let during = placement(&mut balance).await;
    for k in 0..KEYS as usize {
        // b1's keys go to the next endpoint on the ring; every other key stays where it was.
        let expected = reference.owner(key(k as u64), |name| name != "b1");
        assert_eq!(&*during[k], expected, "key {k}");
        if &*before[k] != "b1" {
            assert_eq!(
                during[k], before[k],
                "key {k} moved, and its endpoint is eligible"
            );
        }
    }

    // Back: its keys come back to it.
    eps[1].card().set_health(HealthVerdict::Healthy, None);
    support::settle(|| balance.eligible_targets().len() == 3).await;
    assert_eq!(placement(&mut balance).await, before);
}

#[tokio::test]
async fn a_call_picked_onto_an_endpoint_that_just_turned_ineligible_goes_to_the_next() {
    // The card changes, and the call is made before the balancer's task rebuilds its set: the
    // pick double-checks the card and goes on round the ring.
    let names = ["b0", "b1", "b2"];
    let eps = carded(3);
    let mut balance: Balance<_, Keyed> = Balance::new(list_counted(&eps), config()).unwrap();
    support::settle(|| balance.eligible_targets().len() == 3).await;
    let reference = Reference::default_over(&names);
    let k = (0..KEYS)
        .find(|&k| reference.owner(key(k), |_| true) == "b2")
        .unwrap();
    eps[2]
        .card()
        .set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    // No yield to the balancer's task in between.
    let name = owner(&mut balance, Keyed(key(k))).await;
    assert_eq!(&*name, reference.owner(key(k), |n| n != "b2"));
}

#[tokio::test]
async fn the_hash_comes_from_the_configured_header_of_an_http_request() {
    let names = ["b0", "b1", "b2"];
    let eps = carded(3);
    let config = BalanceConfig::new()
        .strategy(Strategy::RingHash {
            min_ring_size: 1024,
            max_ring_size: 8 * 1024 * 1024,
            // Upper case is read as lower case, as HTTP/2 sends header names.
            request_hash_header: Some("X-User-Id".into()),
        })
        .seed(5);
    let mut balance: Balance<_, http::Request<()>> =
        Balance::new(list_counted(&eps), config).unwrap();
    support::settle(|| balance.eligible_targets().len() == 3).await;
    let reference = Reference::default_over(&names);

    let with_header = |values: &[&str]| {
        let mut builder = http::Request::builder();
        for v in values {
            builder = builder.header("x-user-id", *v);
        }
        builder.body(()).unwrap()
    };
    let mut seen = BTreeMap::new();
    for user in 0..300 {
        let value = format!("user-{user}");
        let expected = reference.owner(RequestHash::of(value.as_bytes()).0, |_| true);
        for _ in 0..3 {
            let name = owner(&mut balance, with_header(&[&value])).await;
            assert_eq!(&*name, expected, "{value}");
        }
        *seen.entry(expected.to_string()).or_insert(0) += 1;
    }
    // The users spread over every endpoint.
    assert_eq!(seen.len(), 3, "{seen:?}");

    // Several values are joined with "," before hashing (gRFC A76).
    let joined = reference.owner(RequestHash::of(b"a,b").0, |_| true);
    for _ in 0..5 {
        assert_eq!(
            &*owner(&mut balance, with_header(&["a", "b"])).await,
            joined
        );
    }

    // A `RequestHash` extension wins over the header.
    let (value, ext) = (0..100u64)
        .map(|i| {
            (
                format!("user-{i}"),
                RequestHash::of(format!("other-{i}").as_bytes()),
            )
        })
        .find(|(v, ext)| {
            reference.owner(RequestHash::of(v.as_bytes()).0, |_| true)
                != reference.owner(ext.0, |_| true)
        })
        .unwrap();
    let mut req = with_header(&[&value]);
    req.extensions_mut().insert(ext);
    assert_eq!(
        &*owner(&mut balance, req).await,
        reference.owner(ext.0, |_| true)
    );
}

#[tokio::test]
async fn without_a_hash_calls_spread_at_random() {
    // No header configured (and, below, a header configured but absent or empty): a random
    // hash per call (gRFC A76).
    for (config, req) in [
        (config(), None),
        (
            BalanceConfig::new()
                .strategy(Strategy::RingHash {
                    min_ring_size: 1024,
                    max_ring_size: 4096,
                    request_hash_header: Some("x-user-id".into()),
                })
                .seed(2),
            Some(""),
        ),
    ] {
        let eps = carded(3);
        let mut balance: Balance<_, http::Request<()>> =
            Balance::new(list_counted(&eps), config).unwrap();
        let mut names = Vec::new();
        for _ in 0..3_000 {
            let mut builder = http::Request::builder();
            if let Some(value) = req {
                builder = builder.header("x-user-id", value);
            }
            names.push(owner(&mut balance, builder.body(()).unwrap()).await);
        }
        let t = support::tally(names.iter().cloned());
        assert_eq!(t.len(), 3, "{t:?}");
        for (name, n) in &t {
            assert!((800..=1_200).contains(n), "{name}: {n} of 3000 ({t:?})");
        }
        // Not a rotation in disguise: consecutive calls repeat an endpoint now and then.
        assert!(names.windows(2).any(|w| w[0] == w[1]));
    }
    // And with the crate's test request type (no hash at all).
    let eps = carded(3);
    let mut balance: Balance<_, Req> = Balance::new(list_counted(&eps), config()).unwrap();
    support::calls(&mut balance, 300).await;
    assert!(
        eps.iter().all(|e| e.hits() > 50),
        "{:?}",
        eps.iter().map(Counted::hits).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn nothing_eligible_fails_as_with_every_strategy() {
    let eps = carded(2);
    let config = config().connecting_wait(Duration::ZERO);
    let mut balance: Balance<_, Keyed> = Balance::new(list_counted(&eps), config).unwrap();
    for ep in &eps {
        ep.card()
            .set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    }
    support::settle(|| balance.eligible_targets().is_empty()).await;
    let error = balance
        .ready()
        .await
        .unwrap()
        .call(Keyed(key(1)))
        .await
        .unwrap_err();
    assert!(error.is::<balance_layer::NoHealthyTargets>(), "{error}");
}

#[tokio::test(start_paused = true)]
async fn with_wait_for_ready_a_call_waits_then_goes_to_its_keys_endpoint() {
    let names = ["b0", "b1", "b2"];
    let eps = carded(3);
    for ep in &eps {
        ep.card()
            .set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    }
    let config = config().wait_for_ready(true);
    let mut balance: Balance<_, Keyed> = Balance::new(list_counted(&eps), config).unwrap();
    let reference = Reference::default_over(&names);
    let k = 7;
    let expected = reference.owner(key(k), |_| true).to_string();
    let call = tokio::spawn(balance.ready().await.unwrap().call(Keyed(key(k))));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!call.is_finished());
    for ep in &eps {
        ep.card().set_health(HealthVerdict::Healthy, None);
    }
    let name = call.await.unwrap().unwrap();
    assert_eq!(&*name, expected);
}

fn ring_error(min: u64, max: u64, header: Option<&str>) -> endpoint_state::ConfigError {
    let config = BalanceConfig::new().strategy(Strategy::RingHash {
        min_ring_size: min,
        max_ring_size: max,
        request_hash_header: header.map(Into::into),
    });
    let direct = config.validate().unwrap_err();
    let layer = balance_layer::BalanceLayer::<Keyed>::new(config).unwrap_err();
    assert_eq!(direct, layer, "the layer and the configuration check alike");
    direct
}

#[test]
fn invalid_ring_hash_settings_fail_naming_field_and_value() {
    let e = ring_error(2048, 1024, None);
    assert_eq!((e.field(), e.value()), ("ring_hash.min_ring_size", "2048"));
    assert!(e.to_string().contains("max_ring_size (1024)"), "{e}");

    let e = ring_error(0, 1024, None);
    assert_eq!((e.field(), e.value()), ("ring_hash.min_ring_size", "0"));
    let e = ring_error(1, 0, None);
    assert_eq!((e.field(), e.value()), ("ring_hash.max_ring_size", "0"));

    let e = ring_error(1024, 8 * 1024 * 1024 + 1, None);
    assert_eq!(
        (e.field(), e.value()),
        ("ring_hash.max_ring_size", "8388609")
    );
    assert!(e.to_string().contains("at most 8388608"), "{e}");
    let e = ring_error(u64::MAX, u64::MAX, None);
    assert_eq!(e.field(), "ring_hash.min_ring_size");

    for (header, says) in [
        ("", "a header name"),
        ("x user", "lowercase letters"),
        (":path", "lowercase letters"),
        ("x-key-bin", "not binary"),
        ("x-é", "lowercase letters"),
    ] {
        let e = ring_error(1024, 4096, Some(header));
        assert_eq!(e.field(), "ring_hash.request_hash_header", "{header:?}");
        assert_eq!(e.value(), format!("{header:?}"));
        assert!(e.to_string().contains(says), "{header:?}: {e}");
    }

    // Valid: the defaults, the edges, a header in upper case.
    for (min, max, header) in [
        (1024, 8 * 1024 * 1024, None),
        (1, 1, Some("x-user-id")),
        (8 * 1024 * 1024, 8 * 1024 * 1024, Some("X-Tenant.Key_2")),
    ] {
        BalanceConfig::new()
            .strategy(Strategy::RingHash {
                min_ring_size: min,
                max_ring_size: max,
                request_hash_header: header.map(Into::into),
            })
            .validate()
            .unwrap();
    }
}

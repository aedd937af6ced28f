//! The strategies' distributions and the configuration checks, over in-process endpoints.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use balance_layer::{Balance, BalanceConfig, BalanceLayer, PeakEwma, Strategy, Weights};
use endpoint_state::{ConfigError, EndpointCard, HasCard, HealthVerdict};
use futures_util::FutureExt;
use support::{Counted, Req, calls, carded, list, list_counted, tally};
use tower::{Service, ServiceExt};

fn weighted(weights: Weights) -> BalanceConfig {
    BalanceConfig::new().strategy(Strategy::Weighted(weights))
}

#[tokio::test]
async fn round_robin_splits_exactly_and_skips_the_ineligible() {
    let eps = carded(3);
    let mut balance = Balance::new(list_counted(&eps), BalanceConfig::new()).unwrap();
    let t = tally(calls(&mut balance, 60).await);
    assert_eq!(
        t.values().copied().collect::<Vec<_>>(),
        [20, 20, 20],
        "{t:?}"
    );

    eps[1]
        .card()
        .set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    support::settle(|| balance.eligible_targets().len() == 2).await;
    let t = tally(calls(&mut balance, 60).await);
    assert_eq!(t.get("b0"), Some(&30));
    assert_eq!(t.get("b1"), None);
    assert_eq!(t.get("b2"), Some(&30));

    eps[1].card().set_health(HealthVerdict::Healthy, None);
    support::settle(|| balance.eligible_targets().len() == 3).await;
    let t = tally(calls(&mut balance, 60).await);
    assert_eq!(
        t.values().copied().collect::<Vec<_>>(),
        [20, 20, 20],
        "{t:?}"
    );
}

#[tokio::test]
async fn round_robin_is_shared_by_every_clone() {
    let eps = carded(3);
    let balance = Balance::new(list_counted(&eps), BalanceConfig::new()).unwrap();
    let mut names = Vec::new();
    for _ in 0..30 {
        // A fresh clone per call, as code that clones a client per request does.
        let mut c = balance.clone();
        names.extend(calls(&mut c, 1).await);
    }
    let t = tally(names);
    assert_eq!(
        t.values().copied().collect::<Vec<_>>(),
        [10, 10, 10],
        "{t:?}"
    );
}

/// Pearson's chi-square statistic of `counts` against a uniform expectation.
fn chi_square(counts: &[usize]) -> f64 {
    let total: usize = counts.iter().sum();
    let expected = total as f64 / counts.len() as f64;
    counts
        .iter()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum()
}

#[tokio::test]
async fn random_is_uniform_chi_square_over_30000_picks() {
    // 10 endpoints, 9 degrees of freedom: the 0.1 % critical value is 27.88.
    for seed in [1, 2, 3] {
        let eps = carded(10);
        let config = BalanceConfig::new().strategy(Strategy::Random).seed(seed);
        let mut balance = Balance::new(list_counted(&eps), config).unwrap();
        calls(&mut balance, 30_000).await;
        let counts: Vec<usize> = eps.iter().map(Counted::hits).collect();
        let chi2 = chi_square(&counts);
        assert!(
            chi2 < 27.88,
            "seed {seed}: chi-square {chi2:.2} for {counts:?}"
        );
        // And it is not round-robin in disguise: perfectly even counts would give 0.
        assert!(chi2 > 0.0, "seed {seed}: suspiciously exact {counts:?}");
    }
}

#[tokio::test]
async fn random_with_a_seed_repeats_itself() {
    let run = |seed| async move {
        let eps = carded(5);
        let config = BalanceConfig::new().strategy(Strategy::Random).seed(seed);
        let mut balance = Balance::new(list_counted(&eps), config).unwrap();
        calls(&mut balance, 50).await
    };
    let (a, b, c) = (run(9).await, run(9).await, run(10).await);
    assert_eq!(a, b, "same seed, same picks");
    assert_ne!(a, c, "another seed, other picks");
    // Not a fixed rotation either.
    let rotation: Vec<Arc<str>> = (0..50).map(|i| a[i % 5].clone()).collect();
    assert_ne!(a, rotation);
}

fn assert_within_one_percent(count: usize, expected: f64, what: &str) {
    let off = (count as f64 - expected).abs() / expected;
    assert!(
        off <= 0.01,
        "{what}: {count} vs {expected} ({:.2} % off)",
        off * 100.0
    );
}

#[tokio::test]
async fn weighted_1_2_1_within_one_percent_over_40000_picks() {
    let eps = carded(3);
    let weights = Weights::new()
        .weight("b0", 1.0)
        .weight("b1", 2.0)
        .weight("b2", 1.0);
    let mut balance = Balance::new(list_counted(&eps), weighted(weights)).unwrap();
    calls(&mut balance, 40_000).await;
    assert_within_one_percent(eps[0].hits(), 10_000.0, "b0");
    assert_within_one_percent(eps[1].hits(), 20_000.0, "b1");
    assert_within_one_percent(eps[2].hits(), 10_000.0, "b2");
    // The ratio itself, as the issue states it.
    let ratio = eps[1].hits() as f64 / eps[0].hits() as f64;
    assert!((ratio - 2.0).abs() <= 0.02, "b1/b0 = {ratio}");
}

#[tokio::test]
async fn weighted_missing_target_counts_one() {
    let eps = carded(3);
    // Only b0 is listed (3.0); b1 and b2 count 1.0 each.
    let mut balance = Balance::new(
        list_counted(&eps),
        weighted(Weights::new().weight("b0", 3.0)),
    )
    .unwrap();
    calls(&mut balance, 10_000).await;
    assert_within_one_percent(eps[0].hits(), 6_000.0, "b0");
    assert_within_one_percent(eps[1].hits(), 2_000.0, "b1");
    assert_within_one_percent(eps[2].hits(), 2_000.0, "b2");
}

#[tokio::test]
async fn weighted_zero_weight_is_never_picked_while_others_are_eligible() {
    let eps = carded(3);
    let weights = Weights::new().weight("b0", 0.0).weight("b1", 1.0);
    let mut balance = Balance::new(list_counted(&eps), weighted(weights)).unwrap();
    calls(&mut balance, 1_000).await;
    assert_eq!(eps[0].hits(), 0);
    assert_eq!(eps[1].hits() + eps[2].hits(), 1_000);
}

#[tokio::test]
async fn weighted_all_eligible_zero_is_uniform_among_them() {
    let eps = carded(3);
    let weights = Weights::new()
        .weight("b0", 0.0)
        .weight("b1", 0.0)
        .weight("b2", 4.0);
    let mut balance = Balance::new(list_counted(&eps), weighted(weights)).unwrap();
    eps[2].card().set_health(HealthVerdict::Unhealthy, None);
    support::settle(|| balance.eligible_targets().len() == 2).await;
    calls(&mut balance, 10_000).await;
    assert_eq!(eps[2].hits(), 0);
    assert_within_one_percent(eps[0].hits(), 5_000.0, "b0");
    assert_within_one_percent(eps[1].hits(), 5_000.0, "b1");
}

fn build_error(weights: Weights) -> ConfigError {
    let layer = BalanceLayer::<Req>::new(weighted(weights.clone())).unwrap_err();
    let eps = carded(1);
    let direct = Balance::<_, Req>::new(list_counted(&eps), weighted(weights)).unwrap_err();
    assert_eq!(layer, direct, "the layer and the balancer check alike");
    direct
}

#[tokio::test]
async fn building_fails_for_bad_weights_naming_target_and_value() {
    let e = build_error(Weights::new().weight("b0", 1.0).weight("b2", -1.5));
    assert_eq!((e.field(), e.value()), ("weights[b2]", "-1.5"));
    assert!(e.to_string().contains("weights[b2] = -1.5"), "{e}");
    assert!(e.to_string().contains("negative"), "{e}");

    let e = build_error(Weights::new().weight("b1", f64::NAN));
    assert_eq!((e.field(), e.value()), ("weights[b1]", "NaN"));

    let e = build_error(Weights::new().weight("b3", f64::INFINITY));
    assert_eq!((e.field(), e.value()), ("weights[b3]", "inf"));
    assert!(e.to_string().contains("finite"), "{e}");

    let e = build_error(Weights::new().weight("b0", 0.0).weight("b1", 0.0));
    assert_eq!(e.field(), "weights");
    assert_eq!(e.value(), "b0 = 0, b1 = 0");
    assert!(e.to_string().contains("zero"), "{e}");

    let e = build_error(Weights::new().weight("", 1.0));
    assert_eq!(e.field(), "weights");

    let e = BalanceConfig::new()
        .strategy(Strategy::PeakEwma(PeakEwma::new().decay(Duration::ZERO)))
        .validate()
        .unwrap_err();
    assert_eq!(e.field(), "peak_ewma.decay");
}

/// A discovery that counts how often it is polled.
struct Watched<D> {
    inner: D,
    polls: Arc<AtomicUsize>,
}

impl<D: futures_util::Stream + Unpin> futures_util::Stream for Watched<D> {
    type Item = D::Item;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<D::Item>> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

#[tokio::test]
async fn an_invalid_balancer_starts_nothing() {
    let eps = carded(2);
    let polls = Arc::new(AtomicUsize::new(0));
    let discover = Watched {
        inner: Box::pin(list_counted(&eps)),
        polls: polls.clone(),
    };
    let bad = weighted(Weights::new().weight("b1", -1.0));
    assert!(Balance::<_, Req>::new(discover, bad).is_err());
    tokio::task::yield_now().await;
    assert_eq!(
        polls.load(Ordering::SeqCst),
        0,
        "discovery was never polled"
    );
}

/// An endpoint that answers its name after `delay` on tokio's clock: at once when zero (on the
/// response future's first poll), never (until dropped) when `None`.
#[derive(Clone)]
struct Delayed {
    name: Arc<str>,
    delay: Option<Duration>,
    card: Option<EndpointCard>,
    hits: Arc<AtomicUsize>,
}

impl Delayed {
    fn new(name: &str, delay: Option<Duration>, card: bool) -> Self {
        Delayed {
            name: name.into(),
            delay,
            card: card.then(|| EndpointCard::new(name)),
            hits: Arc::default(),
        }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    fn named(&self) -> (Arc<str>, Self) {
        (self.name.clone(), self.clone())
    }
}

impl HasCard for Delayed {
    fn card(&self) -> Option<&EndpointCard> {
        self.card.as_ref()
    }
}

impl Service<Req> for Delayed {
    type Response = Arc<str>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Arc<str>, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Req) -> Self::Future {
        self.hits.fetch_add(1, Ordering::SeqCst);
        let (name, delay) = (self.name.clone(), self.delay);
        Box::pin(async move {
            match delay {
                None => std::future::pending().await,
                Some(d) if d.is_zero() => {}
                Some(d) => tokio::time::sleep(d).await,
            }
            Ok(name)
        })
    }
}

#[tokio::test]
async fn least_in_flight_prefers_the_idle_endpoint() {
    let busy = Delayed::new("busy", None, true);
    let idle = Delayed::new("idle", Some(Duration::ZERO), true);
    let pairs = [busy.named(), idle.named()];
    let config = BalanceConfig::new()
        .strategy(Strategy::LeastInFlight)
        .seed(5);
    let mut balance = Balance::new(list(&pairs), config).unwrap();

    let mut held = Vec::new();
    for _ in 0..50 {
        let mut fut = balance.ready().await.unwrap().call(Req::default());
        match (&mut fut).now_or_never() {
            Some(reply) => assert_eq!(&*reply.unwrap(), "idle"),
            None => held.push(fut),
        }
    }
    // With two endpoints both are always the two choices: `busy` can win only while it has
    // no call in flight, i.e. once.
    assert!(busy.hits() <= 1, "busy got {}", busy.hits());
    assert!(idle.hits() >= 49);
    assert_eq!(balance.in_flight("busy"), Some(held.len()));
    assert_eq!(balance.in_flight("idle"), Some(0));
    // Dropping a response future releases its in-flight count.
    drop(held);
    assert_eq!(balance.in_flight("busy"), Some(0));
}

#[tokio::test(start_paused = true)]
async fn peak_ewma_prefers_the_fast_endpoint() {
    let slow = Delayed::new("slow", Some(Duration::from_millis(100)), false);
    let fast = Delayed::new("fast", Some(Duration::from_millis(2)), false);
    let pairs = [slow.named(), fast.named()];
    let config = BalanceConfig::new()
        .strategy(Strategy::PeakEwma(PeakEwma::new()))
        .seed(11);
    let mut balance = Balance::new(list(&pairs), config).unwrap();
    calls(&mut balance, 100).await;
    let (s, f) = (slow.hits(), fast.hits());
    assert!(s <= 2, "slow got {s}, fast {f}");
    assert_eq!(s + f, 100);
}

//! The kit's extension points, against real servers on loopback: targets from a discovery
//! source (`KitBuilder::discover`), layers of the user's inside every target's stack
//! (`per_target_layer`), and per-target health service names (`Target::health_service`).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use grpc_client_kit::breaker::BreakerConfig;
use grpc_client_kit::health::{HealthConfig, ProbeMode};
use grpc_client_kit::state::BreakerState;
use grpc_client_kit::{Kit, Target, TargetOptions, TargetService};
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tokio::sync::mpsc;
use tonic::Code;
use tower::discover::Change;
use tower_layer::Layer;
use tower_service::Service;

const LIMIT: Duration = Duration::from_secs(10);

async fn until(mut cond: impl FnMut() -> bool) -> bool {
    tokio::time::timeout(LIMIT, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .is_ok()
}

fn watch() -> HealthConfig {
    HealthConfig::new().mode(ProbeMode::Watch)
}

type Changes = mpsc::Sender<Change<String, TargetOptions>>;

/// A kit driven by a channel of changes, as a user's registry would drive it.
fn discovered_kit() -> (Kit, Changes) {
    let (tx, mut rx) = mpsc::channel::<Change<String, TargetOptions>>(16);
    let changes = futures_util::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|c| c.map(Ok::<_, Infallible>))
    });
    let kit = Kit::builder()
        .discover(changes)
        .health(watch())
        .build()
        .unwrap();
    (kit, tx)
}

fn has(kit: &Kit, uri: &str) -> bool {
    kit.targets().iter().any(|t| &**t == uri)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_targets_take_calls_and_a_removed_one_drains_its_call_in_flight() {
    let backends = Backends::start(2).await.unwrap();
    let (kit, tx) = discovered_kit();
    for b in backends.iter() {
        tx.send(Change::Insert(b.uri(), TargetOptions::new()))
            .await
            .unwrap();
    }
    assert!(kit.wait_until_ready(LIMIT).await);
    assert!(until(|| kit.eligible_targets().len() == 2).await, "{kit:?}");
    let mut client = TestServiceClient::new(kit.channel());
    for _ in 0..4 {
        client.unary(Ping::default()).await.unwrap();
    }
    assert_eq!((backends[0].hits(), backends[1].hits()), (2, 2));

    // Two slow calls in flight, one on each target; then b0 is removed.
    for b in backends.iter() {
        b.set_delay(Duration::from_secs(3));
        b.reset_counters();
    }
    let calls: Vec<_> = (0..2)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move { client.unary(Ping::default()).await })
        })
        .collect();
    assert!(until(|| backends[0].hits() == 1 && backends[1].hits() == 1).await);
    tx.send(Change::Remove(backends[0].uri())).await.unwrap();
    assert!(until(|| !has(&kit, &backends[0].uri()) && kit.eligible_targets().len() == 1).await);
    assert!(
        calls.iter().all(|c| !c.is_finished()),
        "the calls ended before the removal: nothing was drained"
    );
    // The calls in flight on the removed target finish, answered.
    for call in calls {
        let pong = call
            .await
            .unwrap()
            .expect("a call in flight was cut by the removal");
        assert!(!pong.into_inner().backend.is_empty());
    }
    // No new call goes to it.
    backends[1].set_delay(Duration::ZERO);
    for _ in 0..4 {
        client.unary(Ping::default()).await.unwrap();
    }
    assert_eq!((backends[0].hits(), backends[1].hits()), (1, 5));

    // A target the kit cannot use is skipped (and logged, naming it); the source goes on.
    tx.send(Change::Insert(
        "http://user:pw@127.0.0.1:1".into(),
        TargetOptions::new(),
    ))
    .await
    .unwrap();
    tx.send(Change::Insert(
        backends[0].addr().to_string(),
        TargetOptions::new(),
    ))
    .await
    .unwrap();
    assert!(until(|| has(&kit, &backends[0].uri())).await, "{kit:?}");
    assert_eq!(kit.targets().len(), 2, "{kit:?}");

    // Targets follow the source only.
    let err = kit.add_target("http://127.0.0.1:1").await.unwrap_err();
    assert_eq!(err.field(), "discover");
    assert!(!kit.remove_target(&backends[0].uri()).await);
    kit.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovered_target_inserted_with_other_options_is_replaced() {
    let backends = Backends::start(1).await.unwrap();
    backends[0]
        .set_service_status("svc.b", tonic_health::ServingStatus::NotServing)
        .await;
    let (kit, tx) = discovered_kit();
    let uri = backends[0].uri();
    tx.send(Change::Insert(uri.clone(), TargetOptions::new()))
        .await
        .unwrap();
    assert!(kit.wait_until_ready(LIMIT).await);
    assert!(until(|| kit.eligible_targets().len() == 1).await);
    // The same target, now checked for a service that is not serving.
    tx.send(Change::Insert(
        uri.clone(),
        TargetOptions::new().health_service("svc.b"),
    ))
    .await
    .unwrap();
    assert!(until(|| kit.eligible_targets().is_empty()).await, "{kit:?}");
    assert_eq!(kit.targets().len(), 1);
    kit.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn discover_is_exclusive_with_target_and_targets() {
    let source = || futures_util::stream::empty::<Result<Change<String, ()>, Infallible>>();
    let err = Kit::builder()
        .discover(source())
        .targets(["http://127.0.0.1:1"])
        .build()
        .unwrap_err();
    let err = err.invalid_config().unwrap();
    assert_eq!(err.field(), "targets");
    assert!(err.to_string().contains("`discover`"), "{err}");
    let err = Kit::builder()
        .target("http://127.0.0.1:1")
        .discover(source())
        .build()
        .unwrap_err();
    let err = err.invalid_config().unwrap();
    assert_eq!(
        (err.field(), err.value()),
        ("target", "\"http://127.0.0.1:1\"")
    );
    assert!(err.to_string().contains("`discover`"), "{err}");
}

/// A layer that counts the calls each of its services sees (one service per target, in the
/// order the targets were built), and fails them with `UNAVAILABLE` while `fail` is set.
#[derive(Clone, Default)]
struct Counting {
    counts: Arc<Mutex<Vec<Arc<AtomicU64>>>>,
    fail: Arc<AtomicBool>,
}

impl Counting {
    fn counts(&self) -> Vec<u64> {
        self.counts
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

impl Layer<TargetService> for Counting {
    type Service = Counted;

    fn layer(&self, inner: TargetService) -> Counted {
        let count = Arc::new(AtomicU64::new(0));
        self.counts.lock().unwrap().push(count.clone());
        Counted {
            inner,
            count,
            fail: self.fail.clone(),
        }
    }
}

#[derive(Clone)]
struct Counted {
    inner: TargetService,
    count: Arc<AtomicU64>,
    fail: Arc<AtomicBool>,
}

type Req = http::Request<tonic::body::Body>;
type Res = http::Response<tonic::body::Body>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Service<Req> for Counted {
    type Response = Res;
    type Error = BoxError;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Res, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.count.fetch_add(1, Ordering::Relaxed);
        if self.fail.load(Ordering::Relaxed) {
            return Box::pin(async { Err(tonic::Status::unavailable("the layer says no").into()) });
        }
        Box::pin(self.inner.call(req))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_target_layer_sees_every_call_of_its_target() {
    let backends = Backends::start(2).await.unwrap();
    let counting = Counting::default();
    let kit = Kit::builder()
        .targets(backends.uris())
        .health(watch())
        .per_target_layer(counting.clone())
        .per_target_layer(tower::limit::ConcurrencyLimitLayer::new(4))
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(LIMIT).await);
    let mut client = TestServiceClient::new(kit.channel());
    for _ in 0..10 {
        client.unary(Ping::default()).await.unwrap();
    }
    let hits: Vec<u64> = backends.iter().map(|b| b.hits()).collect();
    assert_eq!(hits, [5, 5]);
    // One service per target, each saw exactly its own target's calls (and no probe).
    assert_eq!(counting.counts(), hits);
    kit.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_from_a_per_target_layer_counts_against_its_target() {
    let backends = Backends::start(1).await.unwrap();
    let counting = Counting::default();
    let kit = Kit::builder()
        .targets(backends.uris())
        .without_health()
        .breaker(BreakerConfig::default().consecutive_failures(2))
        .per_target_layer(counting.clone())
        .transparent_retry(false)
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(LIMIT).await);
    let mut client = TestServiceClient::new(kit.channel());
    client.unary(Ping::default()).await.unwrap();
    let card = kit.card(&backends[0].uri()).unwrap();
    assert_eq!(card.breaker_state(), BreakerState::Closed);
    assert!(card.quarantine_state().until.is_none());

    counting.fail.store(true, Ordering::Relaxed);
    for _ in 0..2 {
        let status = client.unary(Ping::default()).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(status.message().contains("the layer says no"), "{status:?}");
    }
    // Counted as the target's failures: quarantined, and its breaker open.
    assert!(card.quarantine_state().until.is_some(), "{card:?}");
    assert!(
        matches!(card.breaker_state(), BreakerState::Open { .. }),
        "{card:?}"
    );
    assert_eq!(counting.counts(), [3]);
    assert_eq!(
        backends[0].hits(),
        1,
        "the failed calls never reached the backend"
    );
    kit.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_target_is_checked_for_its_own_health_service() {
    use tonic_health::ServingStatus::{NotServing, Serving};
    let backends = Backends::start(3).await.unwrap();
    // The servers as a whole say NOT_SERVING: a probe of "" would take every target out.
    for b in backends.iter() {
        b.set_serving(false).await;
    }
    backends[0]
        .set_service_status("billing.v1.Billing", Serving)
        .await;
    backends[1]
        .set_service_status("ledger.v1.Ledger", Serving)
        .await;
    backends[2]
        .set_service_status("audit.v1.Audit", Serving)
        .await;
    let kit = Kit::builder()
        .targets([
            Target::new(backends[0].uri()).health_service("billing.v1.Billing"),
            Target::new(backends[1].uri()).health_service("ledger.v1.Ledger"),
        ])
        .health(watch())
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(LIMIT).await);
    assert_eq!(kit.eligible_targets().len(), 2, "{kit:?}");

    // Each target follows its own service: ledger stops serving, billing is untouched.
    backends[1]
        .set_service_status("ledger.v1.Ledger", NotServing)
        .await;
    assert!(until(|| kit.eligible_targets().len() == 1).await, "{kit:?}");
    assert_eq!(&*kit.eligible_targets()[0], backends[0].uri());
    let mut client = TestServiceClient::new(kit.channel());
    for _ in 0..4 {
        client.unary(Ping::default()).await.unwrap();
    }
    assert_eq!((backends[0].hits(), backends[1].hits()), (4, 0));

    // A target added while running, with its own service name.
    let added = Target::new(backends[2].uri()).health_service("audit.v1.Audit");
    assert_eq!(kit.add_target(added).await, Ok(true));
    assert!(until(|| kit.eligible_targets().len() == 2).await, "{kit:?}");
    kit.shutdown().await;
}

//! Against real tonic servers on loopback, through a generated tonic client.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use balance_layer::{
    Balance, BalanceConfig, BalanceLayer, NoCard, PeakEwma, Strategy, WithCard, WithoutCards,
};
use endpoint_state::{EndpointCard, HealthVerdict};
use support::settle;
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tower::ServiceBuilder;
use tower::discover::Change;

fn channel(uri: String) -> Channel {
    Endpoint::from_shared(uri)
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .connect_lazy()
}

/// One endpoint per backend, keyed `b0`, `b1`, ..., each with a card named like it.
fn carded(backends: &Backends) -> (Vec<(String, WithCard<Channel>)>, Vec<EndpointCard>) {
    backends
        .iter()
        .map(|b| {
            let card = EndpointCard::new(b.name());
            (
                (
                    b.name().to_string(),
                    WithCard::new(channel(b.uri()), card.clone()),
                ),
                card,
            )
        })
        .unzip()
}

fn discover<S: Send + 'static>(
    eps: Vec<(String, S)>,
) -> impl futures_util::Stream<Item = Result<Change<String, S>, std::convert::Infallible>> + Send + 'static
{
    futures_util::stream::iter(eps.into_iter().map(|(k, s)| Ok(Change::Insert(k, s))))
}

/// `n` sequential unary calls; replies counted per backend name.
async fn split<S>(client: &mut TestServiceClient<S>, n: usize) -> BTreeMap<String, usize>
where
    S: tonic::client::GrpcService<tonic::body::Body>,
    S::Error: Into<tonic::codegen::StdError>,
    S::ResponseBody: http_body::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <S::ResponseBody as http_body::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut out = BTreeMap::new();
    for _ in 0..n {
        let pong = client.unary(Ping::default()).await.unwrap().into_inner();
        *out.entry(pong.backend).or_default() += 1;
    }
    out
}

fn counts(t: &BTreeMap<String, usize>, names: &[&str]) -> Vec<usize> {
    names
        .iter()
        .map(|n| t.get(*n).copied().unwrap_or(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_over_three_backends_20_20_20_then_30_0_30_then_back() {
    let backends = Backends::start(3).await.unwrap();
    let (eps, cards) = carded(&backends);
    let balance = Balance::new(discover(eps), BalanceConfig::new()).unwrap();
    let mut client = TestServiceClient::new(balance.clone());

    let t = split(&mut client, 60).await;
    assert_eq!(counts(&t, &["b0", "b1", "b2"]), [20, 20, 20], "{t:?}");
    assert_eq!(
        backends.iter().map(|b| b.hits()).collect::<Vec<_>>(),
        [20, 20, 20]
    );

    // What the health checker writes when b1 says NOT_SERVING.
    cards[1].set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    settle(|| balance.eligible_targets().len() == 2).await;
    let t = split(&mut client, 60).await;
    assert_eq!(counts(&t, &["b0", "b1", "b2"]), [30, 0, 30], "{t:?}");
    assert_eq!(backends[1].hits(), 20, "b1 got no new call");

    cards[1].set_health(HealthVerdict::Healthy, None);
    settle(|| balance.eligible_targets().len() == 3).await;
    let t = split(&mut client, 60).await;
    assert_eq!(counts(&t, &["b0", "b1", "b2"]), [20, 20, 20], "{t:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_channels_without_cards_are_all_eligible() {
    let backends = Backends::start(3).await.unwrap();
    let eps: Vec<(String, Channel)> = backends
        .iter()
        .map(|b| (b.name().to_string(), channel(b.uri())))
        .collect();
    let balance = Balance::new(WithoutCards::new(discover(eps)), BalanceConfig::new()).unwrap();
    let mut client = TestServiceClient::new(balance);
    let t = split(&mut client, 30).await;
    assert_eq!(counts(&t, &["b0", "b1", "b2"]), [10, 10, 10], "{t:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_healthy_targets_reaches_the_client_as_unavailable_naming_each_target() {
    let backends = Backends::start(3).await.unwrap();
    let (eps, cards) = carded(&backends);
    let balance = Balance::new(discover(eps), BalanceConfig::new()).unwrap();
    let mut client = TestServiceClient::new(balance.clone());
    cards[0].set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    cards[1].set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    cards[2].set_health(HealthVerdict::Unknown, Some("no probe yet".into()));
    settle(|| balance.eligible_targets().is_empty()).await;

    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let message = status.message();
    assert!(message.contains("b0: unhealthy (NOT_SERVING)"), "{message}");
    assert!(message.contains("b1: unhealthy (NOT_SERVING)"), "{message}");
    assert!(
        message.contains("b2: health unknown (no probe yet)"),
        "{message}"
    );
    assert_eq!(backends.total_hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_ready_through_a_tonic_client_deadline_and_recovery() {
    let backends = Backends::start(2).await.unwrap();
    let (eps, cards) = carded(&backends);
    for c in &cards {
        c.set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    }
    let config = BalanceConfig::new().wait_for_ready(true);
    let balance = Balance::new(discover(eps), config).unwrap();
    let mut client = TestServiceClient::new(balance.clone());
    settle(|| balance.eligible_targets().is_empty()).await;

    // The request's own deadline (grpc-timeout) bounds the wait.
    let start = Instant::now();
    let mut req = tonic::Request::new(Ping::default());
    req.set_timeout(Duration::from_millis(300));
    let status = client.unary(req).await.unwrap_err();
    let took = start.elapsed();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("b0: unhealthy"), "{status:?}");
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");

    // A waiting call proceeds as soon as a backend comes back.
    let waiting = tokio::spawn({
        let mut client = client.clone();
        async move {
            let mut req = tonic::Request::new(Ping::default());
            req.set_timeout(Duration::from_secs(20));
            client.unary(req).await
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished());
    cards[1].set_health(HealthVerdict::Healthy, None);
    let pong = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(pong.backend, "b1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peak_ewma_prefers_the_fast_backend_over_a_delayed_one() {
    let backends = Backends::start(2).await.unwrap();
    backends[0].set_delay(Duration::from_millis(150));
    let (eps, _cards) = carded(&backends);
    let config = BalanceConfig::new()
        .strategy(Strategy::PeakEwma(PeakEwma::new()))
        .seed(1);
    let balance = Balance::new(discover(eps), config).unwrap();
    let mut client = TestServiceClient::new(balance);
    let t = split(&mut client, 40).await;
    let (slow, fast) = (
        t.get("b0").copied().unwrap_or(0),
        t.get("b1").copied().unwrap_or(0),
    );
    assert!(slow <= 3, "the delayed backend got {slow} of 40: {t:?}");
    assert_eq!(slow + fast, 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_service_builder_as_the_inner_service_of_a_generated_client() {
    let backends = Backends::start(2).await.unwrap();
    let eps: Vec<(String, NoCard<Channel>)> = backends
        .iter()
        .map(|b| (b.name().to_string(), NoCard::new(channel(b.uri()))))
        .collect();
    let svc = ServiceBuilder::new()
        .timeout(Duration::from_secs(5))
        .layer(BalanceLayer::new(BalanceConfig::new()).unwrap())
        .service(discover(eps));
    let mut client = TestServiceClient::new(svc);
    let t = split(&mut client, 10).await;
    assert_eq!(counts(&t, &["b0", "b1"]), [5, 5], "{t:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_share_one_balancer() {
    let backends = Backends::start(3).await.unwrap();
    let (eps, _cards) = carded(&backends);
    let balance = Balance::new(discover(eps), BalanceConfig::new()).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut client = TestServiceClient::new(balance.clone());
        tasks.push(tokio::spawn(async move { split(&mut client, 30).await }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap().values().sum::<usize>();
    }
    assert_eq!(total, 240);
    // Round-robin is shared by every clone: the split stays exact overall.
    assert_eq!(
        backends.iter().map(|b| b.hits()).collect::<Vec<_>>(),
        [80, 80, 80]
    );
}

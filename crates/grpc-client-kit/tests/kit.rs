//! The kit end to end against real backends: shares, streams, concurrency, the endpoint
//! template reaching probes, readiness and lifetime (nothing left running once it is gone).

mod support;

use std::time::Duration;

use grpc_client_kit::Kit;
use grpc_client_kit::health::{HealthConfig, ProbeMode};
use support::{eventually, ready_watch_kit};
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::{Ping, StreamPing};
use test_backends::{Backends, BlackHole};
use tonic::transport::Endpoint;

fn hits(backends: &Backends) -> Vec<u64> {
    backends.iter().map(|b| b.hits()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_calls_split_20_20_20_then_30_0_30_when_one_is_not_serving() {
    let backends = Backends::start(3).await.unwrap();
    let kit = ready_watch_kit(&backends).await;
    let mut client = TestServiceClient::new(kit.channel());
    let mut sixty_calls = async || {
        backends.iter().for_each(|b| b.reset_counters());
        for _ in 0..60 {
            client.unary(Ping::default()).await.unwrap();
        }
        hits(&backends)
    };
    assert_eq!(sixty_calls().await, [20, 20, 20]);

    backends[1].set_serving(false).await;
    assert!(eventually(Duration::from_secs(5), || kit.eligible_targets().len() == 2).await);
    assert_eq!(sixty_calls().await, [30, 0, 30]);

    backends[1].set_serving(true).await;
    assert!(eventually(Duration::from_secs(5), || kit.eligible_targets().len() == 3).await);
    assert_eq!(sixty_calls().await, [20, 20, 20]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_streams_and_concurrent_clones_work_through_the_kit() {
    let backends = Backends::start(3).await.unwrap();
    let kit = ready_watch_kit(&backends).await;
    let mut client = TestServiceClient::new(kit.channel());
    let mut stream = client
        .server_stream(StreamPing { count: 5 })
        .await
        .unwrap()
        .into_inner();
    let mut n = 0;
    while let Some(pong) = stream.message().await.unwrap() {
        assert_eq!(pong.seq, n);
        n += 1;
    }
    assert_eq!(n, 5);

    backends.iter().for_each(|b| b.reset_counters());
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                client.unary(Ping::default()).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(backends.total_hits(), 640);
    for b in backends.iter() {
        assert!(b.hits() > 100, "unbalanced: {:?}", hits(&backends));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_template_reaches_the_probes_and_the_calls() {
    let backends = Backends::start(1).await.unwrap();
    let kit = Kit::builder()
        .targets(backends.uris())
        .health(HealthConfig::new().mode(ProbeMode::Check))
        .endpoint_template(|uri: &str| {
            Ok(Endpoint::from_shared(uri.to_owned())?
                .user_agent("kit-template-test/7")?
                .origin("http://origin.kit.test:1234".parse()?))
        })
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
    assert_eq!(backends[0].health_checks(), 1);
    let probe = backends[0].last_request_headers().unwrap();
    let agent = probe.get("user-agent").unwrap().to_str().unwrap();
    assert!(
        agent.starts_with("kit-template-test/7"),
        "probe sent {agent}"
    );

    let mut client = TestServiceClient::new(kit.channel());
    client.unary(Ping::default()).await.unwrap();
    let call = backends[0].last_request_headers().unwrap();
    let agent = call.get("user-agent").unwrap().to_str().unwrap();
    assert!(
        agent.starts_with("kit-template-test/7"),
        "call sent {agent}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_until_ready_is_false_while_a_target_has_no_verdict() {
    let backends = Backends::start(1).await.unwrap();
    let hole = BlackHole::start().await.unwrap();
    let kit = Kit::builder()
        .targets([backends[0].uri(), hole.uri()])
        .health(HealthConfig::new().timeout(Duration::from_secs(30)))
        .build()
        .unwrap();
    assert!(!kit.wait_until_ready(Duration::from_millis(300)).await);
    // The healthy one takes calls meanwhile.
    let mut client = TestServiceClient::new(kit.channel());
    client.unary(Ping::default()).await.unwrap();
    assert_eq!(backends[0].hits(), 1);
}

/// Baseline: tasks alive in the runtime now (the backends' own included).
fn alive() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_stops_probes_tasks_and_connections() {
    let backends = Backends::start(2).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let baseline = alive();
    let kit = Kit::builder()
        .targets(backends.uris())
        .health(HealthConfig::new().interval(Duration::from_millis(20)))
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
    let mut client = TestServiceClient::new(kit.channel());
    client.unary(Ping::default()).await.unwrap();
    client.unary(Ping::default()).await.unwrap();

    // The kit handle goes; the client's channel still holds the kit: probes go on.
    drop(kit);
    let checks = backends[0].health_checks();
    assert!(
        eventually(Duration::from_secs(5), || backends[0].health_checks()
            > checks + 2)
        .await
    );

    // The last handle goes: probes stop, tasks end, connections close.
    drop(client);
    assert!(
        eventually(Duration::from_secs(10), || backends
            .iter()
            .all(|b| b.open_connections() == 0))
        .await,
        "connections left open: {:?}",
        backends
            .iter()
            .map(|b| b.open_connections())
            .collect::<Vec<_>>()
    );
    assert!(
        eventually(Duration::from_secs(10), || alive() == baseline).await,
        "{} tasks alive, {baseline} before the kit",
        alive()
    );
    let checks = backends[0].health_checks();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        backends[0].health_checks(),
        checks,
        "probes after the kit was dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_the_checker_and_closes_every_connection() {
    let backends = Backends::start(2).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let baseline = alive();
    let kit = ready_watch_kit(&backends).await;
    let mut client = TestServiceClient::new(kit.channel());
    client.unary(Ping::default()).await.unwrap();
    client.unary(Ping::default()).await.unwrap();
    // The server counts a connection from its own accept task, and a connection the client
    // gave up while connecting is counted until the server sees it close: settle first.
    assert!(
        eventually(Duration::from_secs(5), || backends
            .iter()
            .all(|b| b.open_connections() == 2))
        .await,
        "a probe and a call connection each: {:?}",
        backends
            .iter()
            .map(|b| b.open_connections())
            .collect::<Vec<_>>()
    );

    kit.shutdown().await;
    assert!(!kit.checker().unwrap().is_running());
    assert!(kit.targets().is_empty());
    assert!(
        eventually(Duration::from_secs(10), || backends
            .iter()
            .all(|b| b.open_connections() == 0))
        .await,
        "connections left open: {:?}",
        backends
            .iter()
            .map(|b| b.open_connections())
            .collect::<Vec<_>>()
    );
    // Only the balancer's task (ended with the last channel) may remain.
    drop(client);
    drop(kit);
    assert!(
        eventually(Duration::from_secs(10), || alive() == baseline).await,
        "{} tasks alive, {baseline} before",
        alive()
    );
}

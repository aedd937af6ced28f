//! DNS discovery through a real resolver path: hickory-resolver asks a DNS server on loopback
//! (started by the test, answering for one name with TTL 0), and the records the test adds and
//! removes move traffic between three servers on 127.0.0.1, .2 and .3 (one port).

mod support;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use grpc_client_kit::health::{HealthConfig, ProbeMode};
use grpc_client_kit::state::BreakerState;
use grpc_client_kit::{DnsSettings, Kit};
use support::{Answer, IpServer, LoopbackDns, eventually, three_ip_servers};
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tonic::Code;

const NAME: &str = "billing.kit.test";

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, last)
}

/// Re-resolve every second (TTL 0): the shortest `min_refresh` the kit accepts.
fn dns_settings() -> DnsSettings {
    DnsSettings::default()
        .refresh(Duration::from_secs(1))
        .min_refresh(Duration::from_secs(1))
}

fn queries(dns: &LoopbackDns) -> u64 {
    dns.queries.load(Ordering::Relaxed)
}

/// Waits until the server has answered at least `n` more queries than `since`.
async fn answered(dns: &LoopbackDns, since: u64, n: u64) {
    assert!(
        eventually(Duration::from_secs(10), || queries(dns) >= since + n).await,
        "the kit stopped resolving"
    );
}

/// Makes `n` calls; returns the replies by server name.
async fn split(
    client: &mut TestServiceClient<grpc_client_kit::KitChannel>,
    n: usize,
) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        let pong = client.unary(Ping::default()).await.unwrap().into_inner();
        *seen.entry(pong.backend).or_insert(0) += 1;
    }
    seen
}

fn names(kit: &Kit) -> Vec<String> {
    let mut t: Vec<String> = kit
        .eligible_targets()
        .iter()
        .map(|t| t.to_string())
        .collect();
    t.sort();
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_added_and_removed_move_traffic() {
    let servers: Vec<IpServer> = three_ip_servers().await;
    let port = servers[0].addr.port();
    let dns = LoopbackDns::start(NAME, LoopbackDns::addresses(&[ip(1), ip(2)])).await;

    let kit = Kit::builder()
        .target(format!("dns://{}/{NAME}:{port}", dns.addr))
        .health(HealthConfig::new().mode(ProbeMode::Watch))
        .dns(dns_settings())
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
    let uri = |last: u8| format!("http://127.0.0.{last}:{port}");
    assert_eq!(names(&kit), vec![uri(1), uri(2)]);
    let mut client = TestServiceClient::new(kit.channel());
    let first = split(&mut client, 60).await;
    assert_eq!(
        first,
        BTreeMap::from([("s1".into(), 30), ("s2".into(), 30)])
    );

    // A record appears: the third server takes its share.
    dns.set(LoopbackDns::addresses(&[ip(1), ip(2), ip(3)]));
    assert!(
        eventually(Duration::from_secs(10), || names(&kit).len() == 3).await,
        "the new record was never picked up: {:?}",
        kit
    );
    let second = split(&mut client, 60).await;
    assert_eq!(
        second,
        BTreeMap::from([("s1".into(), 20), ("s2".into(), 20), ("s3".into(), 20)])
    );

    // A record disappears: its server gets no more calls.
    dns.set(LoopbackDns::addresses(&[ip(2), ip(3)]));
    // (The balancer takes the removal a moment after the kit's list.)
    assert!(
        eventually(Duration::from_secs(10), || kit.targets().len() == 2
            && kit.eligible_targets().len() == 2)
        .await,
        "the removed record was never dropped: {:?}",
        kit
    );
    let before = servers[0].hits();
    let third = split(&mut client, 60).await;
    assert_eq!(
        third,
        BTreeMap::from([("s2".into(), 30), ("s3".into(), 30)])
    );
    assert_eq!(
        servers[0].hits(),
        before,
        "a removed target still got calls"
    );
    assert!(kit.card(&uri(1)).is_none());

    // The name stops resolving: the known targets are kept and calls go on.
    dns.set(Answer::NxDomain);
    let queries = dns.queries.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        eventually(Duration::from_secs(10), || {
            dns.queries.load(std::sync::atomic::Ordering::Relaxed) > queries + 2
        })
        .await
    );
    assert_eq!(kit.targets().len(), 2);
    let fourth = split(&mut client, 20).await;
    assert_eq!(fourth.values().sum::<usize>(), 20);

    // ... and when no known target is healthy, the error says the DNS name and why.
    servers[1]
        .health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    servers[2]
        .health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    assert!(
        eventually(Duration::from_secs(10), || kit
            .eligible_targets()
            .is_empty())
        .await
    );
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let message = status.message();
    assert!(
        message.contains(&format!(
            "DNS resolution of dns://{}/{NAME}:{port} failed",
            dns.addr
        )),
        "{message}"
    );
    assert!(
        message.contains(&uri(2)) && message.contains(&uri(3)),
        "{message}"
    );
    assert!(message.contains("NOT_SERVING"), "{message}");
    kit.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_never_resolves_is_an_unavailable_status_naming_it() {
    let dns = LoopbackDns::start(NAME, Answer::NxDomain).await;
    let target = format!("dns://{}/{NAME}:50051", dns.addr);
    let kit = Kit::builder()
        .target(target.clone())
        .dns(dns_settings())
        .build()
        .unwrap();
    // Not ready: the name does not resolve.
    assert!(!kit.wait_until_ready(Duration::from_millis(300)).await);
    assert!(dns.queries.load(std::sync::atomic::Ordering::Relaxed) > 0);
    assert!(kit.targets().is_empty());
    let mut client = TestServiceClient::new(kit.channel());
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status
            .message()
            .starts_with(&format!("DNS resolution of {target} failed: ")),
        "{}",
        status.message()
    );
    assert!(
        status.message().contains("no healthy targets"),
        "{}",
        status.message()
    );

    // The name starts resolving: targets appear without rebuilding anything.
    let server = IpServer::start("s1", ip(1).into(), 0).await.unwrap();
    drop(kit);
    let kit = Kit::builder()
        .target(format!("dns://{}/{NAME}:{}", dns.addr, server.addr.port()))
        .health(HealthConfig::new().mode(ProbeMode::Watch))
        .dns(dns_settings())
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    assert!(client.unary(Ping::default()).await.is_err());
    dns.set(LoopbackDns::addresses(&[ip(1)]));
    assert!(
        eventually(Duration::from_secs(10), || kit.eligible_targets().len()
            == 1)
        .await
    );
    let pong = client.unary(Ping::default()).await.unwrap().into_inner();
    assert_eq!(pong.backend, "s1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_missing_from_one_answer_keeps_its_target_and_its_state() {
    let servers: Vec<IpServer> = three_ip_servers().await;
    let port = servers[0].addr.port();
    let dns = LoopbackDns::start(NAME, LoopbackDns::addresses(&[ip(1), ip(2), ip(3)])).await;
    let kit = Kit::builder()
        .target(format!("dns://{}/{NAME}:{port}", dns.addr))
        .health(HealthConfig::new().mode(ProbeMode::Watch))
        .dns(dns_settings())
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
    let uri = |last: u8| format!("http://127.0.0.{last}:{port}");
    let card = kit.card(&uri(3)).unwrap();
    // State a removal would lose: an operator's forced-open breaker.
    kit.breaker(&uri(3)).unwrap().force_open(None);

    // One answer without .3 (a resolver answering with a subset), then the full set again.
    let before = queries(&dns);
    dns.set(LoopbackDns::addresses(&[ip(1), ip(2)]));
    answered(&dns, before, 1).await;
    dns.set(LoopbackDns::addresses(&[ip(1), ip(2), ip(3)]));
    answered(&dns, before, 3).await;
    let kept = kit.card(&uri(3)).expect("the target was removed");
    assert!(
        kept.same_card(&card),
        "the target was removed and added again"
    );
    assert_eq!(
        kit.breaker(&uri(3)).unwrap().state(),
        BreakerState::ForcedOpen,
        "its breaker state was reset"
    );

    // Missing from two answers in a row: removed.
    let before = queries(&dns);
    dns.set(LoopbackDns::addresses(&[ip(1), ip(2)]));
    assert!(
        eventually(Duration::from_secs(10), || kit.targets().len() == 2).await,
        "never removed: {kit:?}"
    );
    assert!(
        queries(&dns) >= before + 2,
        "removed after {} answer(s)",
        queries(&dns) - before
    );
    assert!(kit.card(&uri(3)).is_none());
    kit.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unspecified_addresses_are_dropped() {
    let servers: Vec<IpServer> = three_ip_servers().await;
    let port = servers[0].addr.port();
    let dns = LoopbackDns::start(
        NAME,
        LoopbackDns::addresses(&[Ipv4Addr::UNSPECIFIED, ip(1)]),
    )
    .await;
    let kit = Kit::builder()
        .target(format!("dns://{}/{NAME}:{port}", dns.addr))
        .health(HealthConfig::new().mode(ProbeMode::Watch))
        .dns(dns_settings())
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
    let targets: Vec<String> = kit.targets().iter().map(|t| t.to_string()).collect();
    assert_eq!(targets, [format!("http://127.0.0.1:{port}")]);

    // An answer with nothing else is no usable answer: the targets known are kept, and the
    // failure is named.
    let before = queries(&dns);
    dns.set(LoopbackDns::addresses(&[Ipv4Addr::UNSPECIFIED]));
    answered(&dns, before, 3).await;
    assert_eq!(kit.targets().len(), 1);
    servers[0]
        .health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    assert!(
        eventually(Duration::from_secs(10), || kit
            .eligible_targets()
            .is_empty())
        .await
    );
    let mut client = TestServiceClient::new(kit.channel());
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert!(
        status.message().contains("no usable address"),
        "{}",
        status.message()
    );
    kit.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_capped_keeping_the_targets_known() {
    let servers: Vec<IpServer> = three_ip_servers().await;
    let port = servers[0].addr.port();
    let dns = LoopbackDns::start(NAME, LoopbackDns::addresses(&[ip(2), ip(3)])).await;
    let kit = Kit::builder()
        .target(format!("dns://{}/{NAME}:{port}", dns.addr))
        .health(HealthConfig::new().mode(ProbeMode::Watch))
        .dns(dns_settings().max_addresses(2))
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
    let uri = |last: u8| format!("http://127.0.0.{last}:{port}");
    let sorted = |kit: &Kit| {
        let mut t: Vec<String> = kit.targets().iter().map(|t| t.to_string()).collect();
        t.sort();
        t
    };
    assert_eq!(sorted(&kit), [uri(2), uri(3)]);
    // A third address, lower than both: the known ones stay, the new one waits for room.
    let before = queries(&dns);
    dns.set(LoopbackDns::addresses(&[ip(1), ip(2), ip(3)]));
    answered(&dns, before, 3).await;
    assert_eq!(sorted(&kit), [uri(2), uri(3)]);
    // Room made: .3 leaves (missing twice), .1 comes in.
    dns.set(LoopbackDns::addresses(&[ip(1), ip(2)]));
    assert!(
        eventually(Duration::from_secs(10), || sorted(&kit) == [uri(1), uri(2)]).await,
        "{kit:?}"
    );
    kit.shutdown().await;
}

//! IPv6: a kit over a server on the IPv6 loopback (`[::1]`), health-checked in `Check` and in
//! `Watch` mode, its target written with and without a scheme.

mod support;

use std::net::Ipv6Addr;
use std::time::Duration;

use grpc_client_kit::Kit;
use grpc_client_kit::health::{HealthConfig, ProbeMode};
use support::IpServer;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;

async fn kit_on_v6(mode: ProbeMode, written: impl Fn(&str) -> String) {
    let server = IpServer::start("v6", Ipv6Addr::LOCALHOST.into(), 0)
        .await
        .unwrap();
    let addr = server.addr.to_string();
    assert!(addr.starts_with("[::1]:"), "{addr}");
    let kit = Kit::builder()
        .target(written(&addr))
        .health(HealthConfig::new().mode(mode))
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
    let name = format!("http://{addr}");
    assert_eq!(kit.eligible_targets(), [name.as_str().into()]);
    let mut client = TestServiceClient::new(kit.channel());
    let pong = client.unary(Ping::default()).await.unwrap().into_inner();
    assert_eq!(pong.backend, "v6");

    // Its health follows the server's.
    server
        .health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    kit.checker().unwrap().check_now(&name).await.unwrap();
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert!(
        status.message().contains(&format!("{name}: unhealthy")),
        "{status:?}"
    );
    kit.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kit_checks_and_calls_an_ipv6_target_in_check_mode() {
    kit_on_v6(ProbeMode::Check, |addr| format!("http://{addr}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kit_watches_and_calls_an_ipv6_target_written_without_a_scheme() {
    kit_on_v6(ProbeMode::Watch, |addr| addr.to_owned()).await;
}

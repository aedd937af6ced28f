//! No panic on any value: a kit whose every duration is beyond any clock (`Duration::MAX`)
//! builds, waits and answers; a wait of `Duration::MAX` is as long as anything waits.

use std::time::Duration;

use grpc_client_kit::health::{HealthConfig, ProbeMode};
use grpc_client_kit::state::Backoff;
use grpc_client_kit::{EndpointSettings, Kit};
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;

const LIMIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kit_whose_every_duration_is_duration_max_builds_waits_and_answers() {
    let backends = Backends::start(2).await.unwrap();
    let endpoint = EndpointSettings {
        timeout: Some(Duration::MAX),
        connect_timeout: Some(Duration::MAX),
        http2_keep_alive_interval: Some(Duration::MAX),
        keep_alive_timeout: Some(Duration::MAX),
        tcp_keepalive: Some(Duration::MAX),
        ..EndpointSettings::default()
    };
    endpoint.validate().unwrap();
    for mode in [ProbeMode::Check, ProbeMode::Watch] {
        let kit = Kit::builder()
            .targets(backends.uris())
            .template(endpoint.template())
            .health(
                HealthConfig::new()
                    .mode(mode)
                    .interval(Duration::MAX)
                    .timeout(Duration::MAX)
                    .max_backoff(Duration::MAX)
                    .probe_keepalive(Some(Duration::MAX))
                    .watch_backoff(Backoff::new(Duration::MAX, 2.0, Duration::MAX, 0.0)),
            )
            .wait_for_ready(true)
            .max_wait(Duration::MAX)
            .connecting_wait(Duration::MAX)
            .build()
            .unwrap();
        let ready = tokio::time::timeout(LIMIT, kit.wait_until_ready(Duration::MAX)).await;
        assert_eq!(ready, Ok(true));
        let mut client = TestServiceClient::new(kit.channel());
        let answer = tokio::time::timeout(LIMIT, client.unary(Ping::default())).await;
        assert!(answer.unwrap().is_ok());
        kit.shutdown().await;
        assert!(!kit.wait_until_ready(Duration::MAX).await, "shut down");
    }
}

//! A kit configured only by gRPC's service config JSON — the load-balancing policy, the health
//! service name, a method's timeout — against every server implementation.

use std::collections::BTreeMap;
use std::time::Duration;

use grpc_client_kit::Kit;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tokio::time::Instant;
use tonic::Code;
use tonic_health::ServingStatus;

use crate::support::{Implementation, InteropBackend, ServerSettings};

const SERVICE: &str = "gck.test.v1.TestService";

/// Two backends of `imp`; the kit's only settings are its targets and a service config:
/// `round_robin` (after a policy it does not know), health checks of the test service by
/// name, and a 500 ms timeout on `Unary`.
pub(crate) async fn configured_by_service_config(imp: Implementation) {
    let settings = ServerSettings::defaults();
    let b0 = InteropBackend::start(imp, "b0", &settings).await;
    let b1 = InteropBackend::start(imp, "b1", &settings).await;
    b0.set_health(SERVICE, ServingStatus::Serving).await;
    b1.set_health(SERVICE, ServingStatus::NotServing).await;
    let json = format!(
        r#"{{
            "loadBalancingConfig": [{{ "grpclb": {{}} }}, {{ "round_robin": {{}} }}],
            "healthCheckConfig": {{ "serviceName": "{SERVICE}" }},
            "methodConfig": [{{
                "name": [{{ "service": "{SERVICE}", "method": "Unary" }}],
                "timeout": "0.5s"
            }}]
        }}"#
    );
    let kit = Kit::builder()
        .targets([b0.uri(), b1.uri()])
        .service_config(json)
        .build()
        .unwrap();
    let tag = format!("{imp}");
    assert!(kit.wait_until_ready(Duration::from_secs(10)).await, "{tag}");
    // b1 serves as a whole ("") but not the test service: the checker asked about the service.
    assert_eq!(eligible(&kit), [b0.uri()], "{tag}");
    let mut client = TestServiceClient::new(kit.channel());
    assert_eq!(calls(&mut client, 20).await, split(&[("b0", 20)]), "{tag}");

    b1.set_health(SERVICE, ServingStatus::Serving).await;
    let status = kit.checker().unwrap().check_now(&b1.uri()).await.unwrap();
    assert_eq!(
        status.verdict,
        grpc_client_kit::state::HealthVerdict::Healthy,
        "{tag}: {status:?}"
    );
    let mut both = vec![b0.uri(), b1.uri()];
    both.sort();
    let deadline = Instant::now() + Duration::from_secs(10);
    while eligible(&kit) != both {
        assert!(Instant::now() < deadline, "{tag}: b1 never eligible");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // round_robin: exact shares.
    assert_eq!(
        calls(&mut client, 20).await,
        split(&[("b0", 10), ("b1", 10)]),
        "{tag}"
    );

    // Unary's configured timeout: a slow backend's call ends at 500 ms.
    b0.set_delay(Duration::from_secs(2)).await;
    b1.set_delay(Duration::from_secs(2)).await;
    let started = Instant::now();
    let status = client.unary(Ping::default()).await.unwrap_err();
    let took = started.elapsed();
    // The kit sent the deadline on (`grpc-timeout`): the server's end of it may answer first,
    // as grpc-go's test backend does (`CANCELLED` when its call's context ends); once the
    // deadline has passed the caller sees `DEADLINE_EXCEEDED` either way.
    assert_eq!(status.code(), Code::DeadlineExceeded, "{tag}: {status:?}");
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(1000),
        "{tag}: {took:?}"
    );
    b0.set_delay(Duration::ZERO).await;
    b1.set_delay(Duration::ZERO).await;
    kit.shutdown().await;
}

fn eligible(kit: &Kit) -> Vec<String> {
    let mut names: Vec<String> = kit
        .eligible_targets()
        .iter()
        .map(|t| t.to_string())
        .collect();
    names.sort();
    names
}

async fn calls(
    client: &mut TestServiceClient<grpc_client_kit::KitChannel>,
    n: usize,
) -> BTreeMap<String, usize> {
    let mut answered = BTreeMap::new();
    for _ in 0..n {
        let pong = client.unary(Ping::default()).await.unwrap();
        *answered.entry(pong.into_inner().backend).or_default() += 1;
    }
    answered
}

fn split(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(b, n)| ((*b).to_owned(), *n)).collect()
}

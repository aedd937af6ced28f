//! Targets added and removed while a kit runs (`Kit::add_target`, `Kit::remove_target`).

use std::time::Duration;

use grpc_client_kit::Kit;
use grpc_client_kit::health::{HealthConfig, ProbeMode};
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_added_while_running_takes_calls_and_one_removed_takes_none() {
    let backends = Backends::start(2).await.unwrap();
    let kit = Kit::builder()
        .target(backends[0].uri())
        .health(HealthConfig::new().mode(ProbeMode::Watch))
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(LIMIT).await);

    // Written without a scheme: the same name as the builder gives it.
    let written = backends[1].addr().to_string();
    assert_eq!(kit.add_target(&written).await, Ok(true));
    assert_eq!(
        kit.add_target(&backends[1].uri()).await,
        Ok(false),
        "there already"
    );
    assert!(until(|| kit.eligible_targets().len() == 2).await);
    // An operator names it as it was written, or in another case: the same target.
    let shouted = backends[1].uri().to_uppercase();
    assert!(kit.card(&written).is_some(), "{written}");
    assert!(kit.card(&shouted).is_some(), "{shouted}");
    assert!(kit.breaker(&shouted).is_some(), "{shouted}");
    let mut client = TestServiceClient::new(kit.channel());
    for _ in 0..4 {
        client.unary(Ping::default()).await.unwrap();
    }
    assert_eq!(backends[1].hits(), 2);

    assert!(kit.remove_target(&backends[0].uri()).await);
    assert!(!kit.remove_target(&backends[0].uri()).await, "gone already");
    assert!(until(|| kit.eligible_targets().len() == 1).await);
    backends[0].reset_counters();
    for _ in 0..4 {
        client.unary(Ping::default()).await.unwrap();
    }
    assert_eq!(backends[0].hits(), 0);
    assert!(kit.card(&backends[0].uri()).is_none());
    assert!(kit.checker().unwrap().targets().len() == 1);

    // Refused as the builder refuses it, naming the field.
    let err = kit
        .add_target("http://user:pw@10.0.0.7:1")
        .await
        .unwrap_err();
    assert_eq!(err.field(), "target");
    assert!(!err.to_string().contains("pw"), "{err}");

    kit.shutdown().await;
    assert_eq!(
        kit.add_target(&backends[0].uri()).await,
        Ok(false),
        "shut down"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kit_on_a_dns_name_takes_its_targets_from_the_answers_only() {
    let kit = Kit::builder()
        .target("dns://127.0.0.1:1/billing.test:50051")
        .build()
        .unwrap();
    let err = kit.add_target("http://10.0.0.7:50051").await.unwrap_err();
    assert_eq!(err.field(), "target");
    assert!(!kit.remove_target("http://10.0.0.7:50051").await);
    kit.shutdown().await;
}

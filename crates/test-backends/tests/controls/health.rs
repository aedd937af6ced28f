//! Health status controls, seen through `grpc.health.v1.Health`.

use test_backends::pb::SERVICE_NAME;
use test_backends::{Backend, ServingStatus as Set};
use tokio_stream::StreamExt;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::{check, health_client};

#[tokio::test]
async fn default_health_is_serving_for_server_and_test_service() {
    let backend = Backend::start("b0").await.unwrap();
    let mut health = health_client(backend.uri()).await;

    assert_eq!(
        check(&mut health, "").await.unwrap(),
        ServingStatus::Serving
    );
    assert_eq!(
        check(&mut health, SERVICE_NAME).await.unwrap(),
        ServingStatus::Serving
    );
    let unknown = check(&mut health, "no.such.Service").await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
}

#[tokio::test]
async fn set_serving_flips_the_whole_server_only() {
    let backend = Backend::start("b0").await.unwrap();
    let mut health = health_client(backend.uri()).await;

    backend.set_serving(false).await;
    assert_eq!(
        check(&mut health, "").await.unwrap(),
        ServingStatus::NotServing
    );
    assert_eq!(
        check(&mut health, SERVICE_NAME).await.unwrap(),
        ServingStatus::Serving
    );

    backend.set_serving(true).await;
    assert_eq!(
        check(&mut health, "").await.unwrap(),
        ServingStatus::Serving
    );
}

#[tokio::test]
async fn set_service_status_flips_one_service_name() {
    let backend = Backend::start("b0").await.unwrap();
    let mut health = health_client(backend.uri()).await;

    backend
        .set_service_status(SERVICE_NAME, Set::NotServing)
        .await;
    assert_eq!(
        check(&mut health, SERVICE_NAME).await.unwrap(),
        ServingStatus::NotServing
    );
    assert_eq!(
        check(&mut health, "").await.unwrap(),
        ServingStatus::Serving
    );

    backend
        .set_service_status("other.Service", Set::Unknown)
        .await;
    assert_eq!(
        check(&mut health, "other.Service").await.unwrap(),
        ServingStatus::Unknown
    );
}

#[tokio::test]
async fn watch_sees_the_flip() {
    let backend = Backend::start("b0").await.unwrap();
    let mut health = health_client(backend.uri()).await;
    let request = HealthCheckRequest {
        service: String::new(),
    };
    let mut watch = health.watch(request).await.unwrap().into_inner();

    let first = watch.next().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);

    backend.set_serving(false).await;
    let second = watch.next().await.unwrap().unwrap();
    assert_eq!(second.status(), ServingStatus::NotServing);
    assert_eq!(backend.health_checks(), 1);
}

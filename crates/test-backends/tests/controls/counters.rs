//! hits, hits_for, health_checks, connection counts, recorded headers, several backends.

use test_backends::pb::{
    HEALTH_CHECK_PATH, Ping, SERVER_STREAM_PATH, StreamPing, UNARY_PATH,
    test_service_client::TestServiceClient,
};
use test_backends::{Backend, Backends};
use tonic::transport::Channel;

use crate::support::{channel, check, endpoint, eventually, health_client, test_client, unary};

#[tokio::test]
async fn calls_and_health_checks_are_counted_apart() {
    let backend = Backend::start("b0").await.unwrap();
    let mut client = test_client(backend.uri()).await;
    let mut health = health_client(backend.uri()).await;

    for _ in 0..3 {
        unary(&mut client, "x").await.unwrap();
    }
    let mut stream = client
        .server_stream(StreamPing { count: 1 })
        .await
        .unwrap()
        .into_inner();
    while stream.message().await.unwrap().is_some() {}
    check(&mut health, "").await.unwrap();
    check(&mut health, "").await.unwrap();

    assert_eq!(backend.hits(), 4);
    assert_eq!(backend.hits_for(UNARY_PATH), 3);
    assert_eq!(backend.hits_for(SERVER_STREAM_PATH), 1);
    assert_eq!(backend.hits_for(HEALTH_CHECK_PATH), 2);
    assert_eq!(backend.health_checks(), 2);

    backend.reset_counters();
    assert_eq!(backend.hits(), 0);
    assert_eq!(backend.hits_for(UNARY_PATH), 0);
    assert_eq!(backend.health_checks(), 0);
    assert_eq!(backend.connections_accepted(), 0);
    assert!(backend.last_request_headers().is_none());
}

#[tokio::test]
async fn open_connections_follows_the_client() {
    let backend = Backend::start("b0").await.unwrap();
    assert_eq!(backend.open_connections(), 0);

    let channel = channel(backend.uri()).await;
    let mut client = TestServiceClient::new(channel.clone());
    client.unary(Ping::default()).await.unwrap();
    assert_eq!(backend.open_connections(), 1);
    assert_eq!(backend.connections_accepted(), 1);

    drop((client, channel));
    eventually("the server notices the closed connection", || async {
        backend.open_connections() == 0
    })
    .await;
    assert_eq!(backend.connections_accepted(), 1);

    let _second: Channel = crate::support::channel(backend.uri()).await;
    eventually("a second connection is accepted", || async {
        backend.connections_accepted() == 2
    })
    .await;
    assert_eq!(backend.open_connections(), 1);
}

#[tokio::test]
async fn last_request_headers_carry_user_agent_and_metadata() {
    let backend = Backend::start("b0").await.unwrap();
    assert!(backend.last_request_headers().is_none());
    let channel = endpoint(backend.uri())
        .user_agent("gck-test/1.0")
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = TestServiceClient::new(channel.clone());

    let mut request = tonic::Request::new(Ping::default());
    request
        .metadata_mut()
        .insert("x-test-id", "42".parse().unwrap());
    client.unary(request).await.unwrap();

    let headers = backend.last_request_headers().unwrap();
    let user_agent = headers["user-agent"].to_str().unwrap();
    assert!(user_agent.starts_with("gck-test/1.0"), "{user_agent}");
    assert_eq!(headers["x-test-id"], "42");

    // Health requests are recorded too, and replace the previous ones.
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    check(&mut health, "").await.unwrap();
    let headers = backend.last_request_headers().unwrap();
    assert!(headers.get("x-test-id").is_none());
}

#[tokio::test]
async fn backends_are_named_in_order_and_answer_with_their_name() {
    let backends = Backends::start(3).await.unwrap();

    assert_eq!(backends.len(), 3);
    let mut ports: Vec<u16> = backends.addrs().iter().map(|a| a.port()).collect();
    ports.dedup();
    assert_eq!(ports.len(), 3);
    for (i, uri) in backends.uris().into_iter().enumerate() {
        let mut client = test_client(uri).await;
        let pong = unary(&mut client, "x").await.unwrap();
        assert_eq!(pong.backend, format!("b{i}"));
        assert_eq!(backends[i].name(), pong.backend);
    }
    assert_eq!(backends.total_hits(), 3);
    assert_eq!(backends.by_name("b2").unwrap().hits(), 1);
}

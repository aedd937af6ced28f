//! The kit's own HTTP/2 client (`src/http2.rs`), which calls plaintext targets of the kit's own
//! templates: what a tonic `Channel` did for them, it must do — streams both ways, messages
//! larger than any flow-control window, the template's user agent, timeout and keepalive (gRFC
//! A8, backing off when a server says `too_many_pings`) — against real servers.

mod support;

use std::time::{Duration, Instant};

use grpc_client_kit::{EndpointSettings, EndpointTemplate, Kit};
use support::eventually;
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::{Ping, StreamPing};
use test_backends::{Backends, PingGuard, PingPolicy};
use tonic::Code;
use tonic::transport::Endpoint;

fn kit_with(uris: Vec<String>, template: EndpointTemplate) -> Kit {
    Kit::builder()
        .targets(uris)
        .without_health()
        .template(template)
        .build()
        .unwrap()
}

fn agent(backends: &Backends) -> String {
    let headers = backends[0].last_request_headers().unwrap();
    headers["user-agent"].to_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kits_templates_are_called_by_its_own_client_and_a_users_endpoint_by_tonics() {
    let backends = Backends::start(1).await.unwrap();
    let own = concat!("grpc-client-kit/", env!("CARGO_PKG_VERSION"));

    let kit = kit_with(backends.uris(), EndpointTemplate::new());
    let mut client = TestServiceClient::new(kit.channel());
    client.unary(Ping::default()).await.unwrap();
    assert_eq!(agent(&backends), own);

    let settings = EndpointSettings {
        user_agent: Some("billing/1.4".into()),
        ..EndpointSettings::default()
    };
    let kit = kit_with(backends.uris(), settings.template());
    let mut client = TestServiceClient::new(kit.channel());
    client.unary(Ping::default()).await.unwrap();
    assert_eq!(agent(&backends), format!("billing/1.4 {own}"));

    // A user's endpoint may hold settings no one can read back: tonic's `Channel` takes it.
    let template =
        EndpointTemplate::from_fn(|uri: &str| Ok(Endpoint::from_shared(uri.to_owned())?));
    let kit = kit_with(backends.uris(), template);
    let mut client = TestServiceClient::new(kit.channel());
    client.unary(Ping::default()).await.unwrap();
    assert!(
        agent(&backends).starts_with("tonic/"),
        "{}",
        agent(&backends)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_and_messages_larger_than_every_window_cross_the_connection() {
    let backends = Backends::start(1).await.unwrap();
    let kit = kit_with(backends.uris(), EndpointTemplate::new());
    let mut client = TestServiceClient::new(kit.channel());

    // 3 MiB each way: more than the server's stream window (64 KiB) and the kit's (2 MiB),
    // so both sides must give capacity back as they read.
    // A window never given back would hold the call forever: bounded here.
    let payload = "x".repeat(3 * 1024 * 1024);
    let call = client.unary(Ping {
        payload: payload.clone(),
    });
    let pong = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .expect("stalled: flow-control capacity not given back")
        .unwrap()
        .into_inner();
    assert_eq!(pong.payload.len(), payload.len());

    let mut stream = client
        .server_stream(StreamPing { count: 500 })
        .await
        .unwrap()
        .into_inner();
    let mut seen = 0;
    while let Some(pong) = stream.message().await.unwrap() {
        assert_eq!(pong.backend, "b0");
        seen += 1;
    }
    assert_eq!(seen, 500);

    // Many calls at once share the one connection.
    let calls = (0..200).map(|_| {
        let mut client = client.clone();
        tokio::spawn(async move { client.unary(Ping::default()).await })
    });
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(backends[0].connections_accepted(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_status_reaches_the_caller_and_a_lost_connection_is_made_again() {
    let backends = Backends::start(1).await.unwrap();
    let kit = Kit::builder()
        .targets(backends.uris())
        .without_health()
        .without_breaker()
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    backends[0].fail_next(1, Code::PermissionDenied);
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);

    backends[0].stop().await;
    assert!(client.unary(Ping::default()).await.is_err());
    backends[0].restart().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if client.unary(Ping::default()).await.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "never reconnected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(backends[0].connections_accepted(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_templates_timeout_ends_a_slow_call() {
    let backends = Backends::start(1).await.unwrap();
    backends[0].set_delay(Duration::from_secs(30));
    let settings = EndpointSettings {
        timeout: Some(Duration::from_millis(200)),
        ..EndpointSettings::default()
    };
    let kit = kit_with(backends.uris(), settings.template());
    let mut client = TestServiceClient::new(kit.channel());
    let started = Instant::now();
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// gRFC A8: pings at the template's interval; a server that answers `GOAWAY ENHANCE_YOUR_CALM
/// "too_many_pings"` gets half as many on the next connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_pings_at_its_interval_and_backs_off_on_too_many_pings() {
    let backends = Backends::start(1).await.unwrap();
    let guard = PingGuard::start(
        backends[0].addr(),
        PingPolicy {
            min_interval: Duration::from_millis(1500),
            max_strikes: 0,
            permit_without_calls: true,
        },
    )
    .await
    .unwrap();
    let settings = EndpointSettings {
        http2_keep_alive_interval: Some(Duration::from_secs(1)),
        keep_alive_while_idle: Some(true),
        ..EndpointSettings::default()
    };
    let kit = kit_with(vec![guard.uri()], settings.template());
    let mut client = TestServiceClient::new(kit.channel());
    client.unary(Ping::default()).await.unwrap();

    // A ping a second: the second is a strike, and the guard sends GOAWAY.
    let deadline = Instant::now() + Duration::from_secs(20);
    let left = || deadline.saturating_duration_since(Instant::now());
    assert!(
        eventually(left(), || guard.goaways_sent() > 0).await,
        "no GOAWAY: {:?}",
        guard.ping_log()
    );
    // The next connection pings every 2 s: never a strike.
    client.unary(Ping::default()).await.unwrap();
    let pings_on_second = || {
        guard
            .ping_log()
            .iter()
            .filter(|(conn, _)| *conn == 1)
            .count()
    };
    assert!(
        eventually(left(), || pings_on_second() >= 3).await,
        "too few pings: {:?}",
        guard.ping_log()
    );
    let second: Vec<_> = guard
        .ping_log()
        .into_iter()
        .filter(|(conn, _)| *conn == 1)
        .map(|(_, at)| at)
        .collect();
    for pair in second.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= Duration::from_millis(1900), "pinged after {gap:?}");
    }
    assert_eq!(guard.goaways_sent(), 1);
    assert_eq!(guard.connections_accepted(), 2);
}

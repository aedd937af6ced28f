//! PingGuard: a gRPC server's ping policy (GOAWAY `ENHANCE_YOUR_CALM` `too_many_pings`) in front
//! of a real backend, seen by tonic clients with HTTP/2 keepalive (and by a bare h2 client).
//!
//! hyper's keepalive sends a PING `interval` after the last frame it *read*, and only once the
//! previous PING was answered: an idle connection pings every `interval` (plus a round trip),
//! and any message from the server pushes the next PING back.

use std::error::Error;
use std::time::Duration;

use endpoint_state::error::cause_ref;
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::{Ping, StreamPing};
use test_backends::{Backend, PingGuard, PingPolicy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::codec::Streaming;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::support::{EVENTUALLY, endpoint, eventually, unary};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// gRPC's policy shape with short times: 300 ms between pings, `max_strikes` strikes.
fn policy(max_strikes: u32) -> PingPolicy {
    PingPolicy {
        min_interval: Duration::from_millis(300),
        max_strikes,
        permit_without_calls: false,
    }
}

/// An endpoint that pings every `every`, idle or not.
fn pinging(uri: String, every: Duration) -> Endpoint {
    endpoint(uri)
        .http2_keep_alive_interval(every)
        .keep_alive_while_idle(true)
        .keep_alive_timeout(Duration::from_secs(5))
}

/// A health `Watch` of the whole server on `channel`, past its first message (`SERVING`).
async fn watch(channel: &Channel) -> Streaming<HealthCheckResponse> {
    let mut health = HealthClient::new(channel.clone());
    let mut watch = health
        .watch(HealthCheckRequest::default())
        .await
        .expect("watch")
        .into_inner();
    let first = watch.next().await.expect("first message").expect("ok");
    assert_eq!(first.status(), ServingStatus::Serving);
    watch
}

/// A backend behind a guard with `policy`, a channel through the guard that pings every
/// `every`, and a health `Watch` on that channel, past its first message.
async fn watched(
    policy: PingPolicy,
    every: Duration,
) -> (Backend, PingGuard, Channel, Streaming<HealthCheckResponse>) {
    let backend = Backend::start("b0").await.unwrap();
    let guard = PingGuard::start(backend.addr(), policy).await.unwrap();
    let channel = pinging(guard.uri(), every).connect().await.unwrap();
    let watch = watch(&channel).await;
    (backend, guard, channel, watch)
}

/// The watch's next item, which must come within [`EVENTUALLY`].
async fn next_within(
    watch: &mut Streaming<HealthCheckResponse>,
) -> Option<Result<HealthCheckResponse, tonic::Status>> {
    tokio::time::timeout(EVENTUALLY, watch.next())
        .await
        .expect("the watch moves on in time")
}

/// When the guard read each client PING of connection `index`.
fn pings_on(guard: &PingGuard, index: u64) -> Vec<Instant> {
    guard
        .ping_log()
        .into_iter()
        .filter(|&(connection, _)| connection == index)
        .map(|(_, at)| at)
        .collect()
}

/// Time between consecutive PINGs.
fn intervals(pings: &[Instant]) -> Vec<Duration> {
    pings.windows(2).map(|w| w[1] - w[0]).collect()
}

/// The error and its `source()` chain, one line each, with the types this test can name.
fn describe(error: &(dyn Error + 'static)) -> String {
    let mut out = String::new();
    let mut next = Some(error);
    let mut depth = 0;
    while let Some(e) = next {
        let kind = if let Some(s) = e.downcast_ref::<tonic::Status>() {
            format!("tonic::Status(code={:?})", s.code())
        } else if e.is::<tonic::transport::Error>() {
            "tonic::transport::Error".to_owned()
        } else if let Some(h) = e.downcast_ref::<hyper::Error>() {
            format!("hyper::Error(closed={})", h.is_closed())
        } else if let Some(h) = e.downcast_ref::<h2::Error>() {
            format!(
                "h2::Error(reason={:?}, go_away={}, remote={}, io={})",
                h.reason(),
                h.is_go_away(),
                h.is_remote(),
                h.is_io()
            )
        } else if let Some(io) = e.downcast_ref::<std::io::Error>() {
            format!("std::io::Error(kind={:?})", io.kind())
        } else {
            "<other type>".to_owned()
        };
        out.push_str(&format!("\n  [{depth}] {kind}: {e}"));
        next = e.source();
        depth += 1;
    }
    out
}

#[tokio::test]
async fn calls_and_a_watch_pass_through_unchanged() {
    let backend = Backend::start("b0").await.unwrap();
    let guard = PingGuard::start(backend.addr(), PingPolicy::default())
        .await
        .unwrap();
    let channel = endpoint(guard.uri()).connect().await.unwrap();
    let mut client = TestServiceClient::new(channel.clone());

    let pong = unary(&mut client, "through").await.unwrap();
    assert_eq!(
        (pong.backend.as_str(), pong.payload.as_str()),
        ("b0", "through")
    );
    let mut stream = client
        .server_stream(StreamPing { count: 200 })
        .await
        .unwrap()
        .into_inner();
    let mut received = 0;
    while let Some(pong) = stream.message().await.unwrap() {
        assert_eq!(pong.seq, received);
        received += 1;
    }
    assert_eq!(received, 200);

    let mut watch = watch(&channel).await;
    backend.set_serving(false).await;
    let second = watch.next().await.unwrap().unwrap();
    assert_eq!(second.status(), ServingStatus::NotServing);

    // A large request crosses too (many frames, flow control).
    let big = "x".repeat(1 << 20);
    let pong = client
        .unary(Ping {
            payload: big.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pong.payload.len(), big.len());

    assert_eq!(guard.connections_accepted(), 1);
    assert_eq!(guard.open_connections(), 1);
    assert_eq!(backend.open_connections(), 1);
    assert_eq!(guard.goaways_sent(), 0);
}

#[tokio::test]
async fn pings_too_fast_get_goaway_too_many_pings() {
    let (_backend, guard, channel, mut watch) =
        watched(policy(0), Duration::from_millis(100)).await;

    // The first PING after SERVING is judged afresh, the second is a strike and punished.
    let next = next_within(&mut watch).await;
    let status = match next {
        Some(Err(status)) => status,
        other => panic!("the watch should fail, got {other:?}"),
    };
    println!(
        "in-flight Watch after GOAWAY: code={:?} message={:?}{}",
        status.code(),
        status.message(),
        describe(&status)
    );
    assert_eq!(guard.goaways_sent(), 1);
    assert_eq!(guard.strikes(), 1);
    let pings = pings_on(&guard, 0);
    assert_eq!(pings.len(), 2, "{pings:?}");
    assert!(intervals(&pings)[0] < Duration::from_millis(300));

    // The Watch (stream 1 <= the GOAWAY's last stream id) only sees the connection close under
    // it: tonic 0.14 does not surface the GOAWAY's code or debug data in the call's Status.
    assert_eq!(status.code(), Code::Unknown);
    let h2 = cause_ref::<h2::Error>(&status).expect("an h2::Error in the chain");
    assert!(h2.is_io(), "{h2}");
    assert!(!status.to_string().contains("too_many_pings"));

    // The channel reconnects for the next call, which succeeds on a new connection.
    let mut client = TestServiceClient::new(channel.clone());
    let pong = unary(&mut client, "after").await.unwrap();
    assert_eq!(pong.payload, "after");
    assert_eq!(guard.connections_accepted(), 2);
}

#[tokio::test]
async fn goaway_carries_enhance_your_calm_and_too_many_pings_to_an_h2_client() {
    let backend = Backend::start("b0").await.unwrap();
    let guard = PingGuard::start(
        backend.addr(),
        PingPolicy {
            permit_without_calls: true,
            ..policy(0)
        },
    )
    .await
    .unwrap();
    let tcp = TcpStream::connect(guard.addr()).await.unwrap();
    let (_send_request, mut connection) = h2::client::handshake(tcp).await.unwrap();
    let mut ping_pong = connection.ping_pong().expect("ping_pong");
    let connection = tokio::spawn(connection);

    ping_pong.ping(h2::Ping::opaque()).await.unwrap();
    // Right after the first: a strike, punished.
    let punished = ping_pong.ping(h2::Ping::opaque()).await;
    let error = tokio::time::timeout(EVENTUALLY, connection)
        .await
        .expect("the connection ends")
        .unwrap()
        .expect_err("the connection fails");

    println!("h2 connection error: {error} / {error:?}; ping: {punished:?}");
    assert_eq!(error.reason(), Some(h2::Reason::ENHANCE_YOUR_CALM));
    assert!(error.is_go_away() && error.is_remote(), "{error:?}");
    assert!(error.to_string().contains("too_many_pings"), "{error}");
    assert_eq!(guard.goaways_sent(), 1);
    assert_eq!(guard.pings(), 2);
    eventually("the guard closed the connection", || async {
        guard.open_connections() == 0
    })
    .await;
}

#[tokio::test]
async fn pings_at_the_allowed_rate_are_never_punished() {
    let (backend, guard, _channel, mut watch) =
        watched(policy(0), Duration::from_millis(400)).await;
    let started = Instant::now();

    eventually("six pings, over two seconds", || async {
        pings_on(&guard, 0).len() >= 6
    })
    .await;

    assert!(started.elapsed() >= Duration::from_secs(2));
    let intervals = intervals(&pings_on(&guard, 0));
    assert!(
        intervals.iter().all(|&i| i >= Duration::from_millis(300)),
        "{intervals:?}"
    );
    assert_eq!(guard.strikes(), 0);
    assert_eq!(guard.goaways_sent(), 0);
    // Still the same, working connection.
    backend.set_serving(false).await;
    let next = watch.next().await.unwrap().unwrap();
    assert_eq!(next.status(), ServingStatus::NotServing);
    assert_eq!(guard.connections_accepted(), 1);
}

#[tokio::test]
async fn the_strike_beyond_max_strikes_is_punished() {
    let (_backend, guard, _channel, mut watch) =
        watched(policy(2), Duration::from_millis(100)).await;

    let next = next_within(&mut watch).await;
    assert!(matches!(next, Some(Err(_))), "{next:?}");

    // Strikes 1 and 2 were forwarded and answered (hyper pings again only after an ACK); the
    // 3rd was punished.
    assert_eq!(guard.goaways_sent(), 1);
    assert_eq!(guard.strikes(), 3);
    let pings = pings_on(&guard, 0);
    assert_eq!(
        pings.len(),
        4,
        "one judged afresh, three strikes: {pings:?}"
    );
    assert!(
        intervals(&pings)
            .iter()
            .all(|&i| i < Duration::from_millis(300))
    );
}

#[tokio::test]
async fn server_data_between_pings_resets_the_count() {
    // One stray strike (a late health flip on a loaded machine) is tolerated; an interval-only
    // rule would strike every PING below and fail at the second.
    let (backend, guard, _channel, mut watch) =
        watched(policy(1), Duration::from_millis(100)).await;

    // A Watch message every 150 ms: hyper pings 100 ms after each, so each PING comes about
    // 150 ms after the previous one (a strike by interval alone) with a message in between.
    let flipper = {
        let backend = backend.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(150));
            for i in 0..16 {
                tick.tick().await;
                backend.set_serving(i % 2 == 1).await;
            }
        })
    };
    let mut messages = 0;
    while messages < 16 {
        next_within(&mut watch).await.expect("open").expect("ok");
        messages += 1;
    }
    flipper.await.unwrap();

    let intervals = intervals(&pings_on(&guard, 0));
    let fast = intervals
        .iter()
        .filter(|&&i| i < Duration::from_millis(300))
        .count();
    assert!(fast >= 8, "{intervals:?}");
    assert_eq!(guard.goaways_sent(), 0, "{intervals:?}");
    assert_eq!(guard.connections_accepted(), 1);
}

#[tokio::test]
async fn idle_pings_are_strikes_unless_permitted() {
    let backend = Backend::start("b0").await.unwrap();
    let strict = PingPolicy {
        min_interval: Duration::from_millis(10),
        max_strikes: 0,
        permit_without_calls: false,
    };
    let permissive = PingPolicy {
        permit_without_calls: true,
        ..strict
    };
    let strict = PingGuard::start(backend.addr(), strict).await.unwrap();
    let permissive = PingGuard::start(backend.addr(), permissive).await.unwrap();
    // No call is ever made: the connections stay idle.
    let _strict_channel = pinging(strict.uri(), Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let _permissive_channel = pinging(permissive.uri(), Duration::from_millis(100))
        .connect()
        .await
        .unwrap();

    eventually("the strict guard punishes the second idle ping", || async {
        strict.goaways_sent() == 1
    })
    .await;
    assert_eq!(pings_on(&strict, 0).len(), 2);

    eventually("the permissive guard sees six pings", || async {
        permissive.pings() >= 6
    })
    .await;
    assert_eq!(permissive.strikes(), 0);
    assert_eq!(permissive.goaways_sent(), 0);
}

#[tokio::test]
async fn an_oversized_frame_or_a_missing_preface_closes_the_connection() {
    let backend = Backend::start("b0").await.unwrap();
    let guard = PingGuard::start(backend.addr(), PingPolicy::default())
        .await
        .unwrap();

    // A DATA frame header announcing 16 MiB - 1 bytes of payload: 9 bytes over the limit.
    let mut oversized = TcpStream::connect(guard.addr()).await.unwrap();
    oversized.write_all(PREFACE).await.unwrap();
    oversized
        .write_all(&[0xff, 0xff, 0xff, 0x0, 0x0, 0, 0, 0, 1])
        .await
        .unwrap();
    let mut not_h2 = TcpStream::connect(guard.addr()).await.unwrap();
    not_h2.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();

    for socket in [&mut oversized, &mut not_h2] {
        // Whatever the upstream sent first (its SETTINGS), then EOF or a reset.
        let closed = tokio::time::timeout(EVENTUALLY, async {
            let mut buf = [0u8; 1024];
            while matches!(socket.read(&mut buf).await, Ok(n) if n > 0) {}
        })
        .await;
        assert!(closed.is_ok(), "the guard should close the connection");
    }
    eventually("both connections closed", || async {
        guard.open_connections() == 0
    })
    .await;
    assert_eq!(guard.connections_accepted(), 2);
}

#[tokio::test]
async fn stop_closes_the_listener_and_every_connection() {
    let backend = Backend::start("b0").await.unwrap();
    let guard = PingGuard::start(backend.addr(), PingPolicy::default())
        .await
        .unwrap();
    let channel = endpoint(guard.uri()).connect().await.unwrap();
    let mut watch = watch(&channel).await;
    assert_eq!(guard.open_connections(), 1);

    guard.stop().await;

    assert_eq!(guard.open_connections(), 0);
    let next = next_within(&mut watch).await;
    assert!(matches!(next, Some(Err(_)) | None), "{next:?}");
    let refused = TcpStream::connect(guard.addr()).await;
    assert!(refused.is_err(), "the listener should be closed");
    eventually("the backend saw its connection close", || async {
        backend.open_connections() == 0
    })
    .await;
}

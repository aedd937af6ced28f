//! Failures after the response started: a transport error while the body is read, a response
//! that is not gRPC. Each reaches the caller as a status naming the target — a transport error
//! as `UNAVAILABLE`, never tonic's `UNKNOWN`. Bare HTTP/2 servers on loopback.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use grpc_client_kit::Kit;
use grpc_client_kit::state::Quarantine as QuarantineState;
use test_backends::HtmlServer;
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::{Ping, StreamPing};
use tokio::net::TcpListener;
use tonic::Code;

/// A server that answers every stream with gRPC response headers and half a message, then
/// dies: its connection is reset (a backend killed while it answers).
async fn dying_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                // Closed with an RST when dropped.
                let _ = socket.set_zero_linger();
                let Ok(mut conn) = h2::server::handshake(socket).await else {
                    return;
                };
                if let Some(Ok((_request, mut respond))) = conn.accept().await {
                    let response = http::Response::builder()
                        .header("content-type", "application/grpc")
                        .body(())
                        .unwrap();
                    let mut send = respond.send_response(response, false).unwrap();
                    // A message header announcing 100 bytes, and 3 of them.
                    send.send_data(Bytes::from_static(&[0, 0, 0, 0, 100, 1, 2, 3]), false)
                        .unwrap();
                    // Let the frames out, then die.
                    let _ = tokio::time::timeout(Duration::from_millis(50), conn.accept()).await;
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transport_error_while_the_body_is_read_is_unavailable_naming_the_target() {
    let addr = dying_server().await;
    let target = format!("http://{addr}");
    let kit = Kit::builder()
        .target(target.clone())
        .without_health()
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().starts_with(&format!("{target}: ")),
        "{status:?}"
    );
    // A stream's body too.
    let mut client = TestServiceClient::new(kit.channel());
    let status = match client.server_stream(StreamPing { count: 3 }).await {
        Ok(reply) => reply.into_inner().message().await.unwrap_err(),
        Err(status) => status,
    };
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().starts_with(&format!("{target}: ")),
        "{status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_that_is_not_grpc_names_the_target() {
    let html = HtmlServer::start().await.unwrap();
    let kit = Kit::builder()
        .target(html.uri())
        .without_health()
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    let status = client.unary(Ping::default()).await.unwrap_err();
    // What gRPC's own clients say of an HTTP 200 without `grpc-status`.
    assert_eq!(status.code(), Code::Unknown, "{status:?}");
    assert_eq!(
        status.message(),
        format!(
            "{}: not a gRPC response: HTTP status 200, content-type \"text/html; charset=utf-8\"",
            html.uri()
        )
    );
    assert_eq!(html.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_answers_html_is_quarantined_whatever_code_it_maps_to() {
    // An HTML page maps to `UNKNOWN`, a code the quarantine's default set does not hold; yet a
    // target that does not speak gRPC is not the service it was taken for: out of the
    // rotation after its first such answer, while the real backend takes the calls.
    let html = HtmlServer::start().await.unwrap();
    let backends = test_backends::Backends::start(1).await.unwrap();
    let backend = &backends[0];
    let kit = Kit::builder()
        .targets([html.uri(), backend.uri()])
        .without_health()
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    let mut failed = Vec::new();
    for _ in 0..20 {
        if let Err(status) = client.unary(Ping::default()).await {
            failed.push(status);
        }
    }
    assert_eq!(html.requests(), 1, "one answer took it out: {failed:?}");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].code(), Code::Unknown);
    assert!(failed[0].message().starts_with(&html.uri()), "{failed:?}");
    let card = kit.card(&html.uri()).unwrap();
    assert_ne!(card.quarantine_state(), QuarantineState::NONE, "{card:?}");
    assert_eq!(kit.eligible_targets(), vec![backend.uri().into()]);
}

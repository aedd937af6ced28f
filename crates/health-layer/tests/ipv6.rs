//! IPv6 literal targets (`http://[::1]:PORT`) in every probe mode: `Check`, `Watch` and HTTP.
//! Real servers on the IPv6 loopback.

mod support;

use std::time::Duration;

use health_layer::probe::HttpProbe;
use health_layer::{HealthChecker, HealthVerdict, ProbeMode};
use support::wait_verdict;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

const LIMIT: Duration = Duration::from_secs(10);

/// A tonic server with the health service on `[::1]`: its URI and its health reporter.
async fn grpc_on_v6() -> (String, HealthReporter, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("[::1]:0").await.unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap());
    assert!(uri.starts_with("http://[::1]:"), "{uri}");
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    (uri, reporter, task)
}

/// A minimal HTTP/1.1 server on `[::1]`: `200 {"ok":true}` to every request, and the `Host`
/// header of each request it saw.
async fn http_on_v6() -> (String, tokio::sync::mpsc::Receiver<String>) {
    let listener = TcpListener::bind("[::1]:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (hosts_tx, hosts) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let hosts_tx = hosts_tx.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&request).to_lowercase();
                let host = text
                    .lines()
                    .find_map(|l| l.strip_prefix("host: "))
                    .unwrap_or("")
                    .trim()
                    .to_owned();
                let _ = hosts_tx.try_send(host);
                let body = r#"{"ok":true}"#;
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (base, hosts)
}

#[tokio::test]
async fn check_mode_probes_an_ipv6_literal() {
    let (uri, reporter, _server) = grpc_on_v6().await;
    let checker = HealthChecker::builder()
        .interval(Duration::ZERO)
        .build()
        .unwrap();
    let card = checker.add_target(uri.as_str()).unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    assert!(wait_verdict(&card, HealthVerdict::Healthy, LIMIT).await);

    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    let status = checker.check_now(&uri).await.unwrap();
    assert_eq!(status.verdict, HealthVerdict::Unhealthy, "{status:?}");
    assert_eq!(status.last_error.as_deref(), Some("NOT_SERVING"));
    checker.stop().await;
}

#[tokio::test]
async fn watch_mode_follows_an_ipv6_literal() {
    let (uri, reporter, _server) = grpc_on_v6().await;
    let checker = HealthChecker::builder()
        .mode(ProbeMode::Watch)
        .build()
        .unwrap();
    let card = checker.add_target(uri.as_str()).unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    assert!(wait_verdict(&card, HealthVerdict::Healthy, LIMIT).await);
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    assert!(wait_verdict(&card, HealthVerdict::Unhealthy, LIMIT).await);
    assert_eq!(card.health().reason.as_deref(), Some("NOT_SERVING"));
    checker.stop().await;
}

#[tokio::test]
async fn http_mode_connects_to_an_ipv6_literal_and_sends_its_bracketed_host() {
    let (base, mut hosts) = http_on_v6().await;
    let checker = HealthChecker::builder()
        .mode(ProbeMode::Http(
            HttpProbe::new("/healthz").require_json_key("ok"),
        ))
        .interval(Duration::ZERO)
        .build()
        .unwrap();
    checker.add_target(base.as_str()).unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    let status = checker.check_now(&base).await.unwrap();
    // Before the fix the brackets reached the address lookup: "failed to lookup address".
    assert_eq!(status.verdict, HealthVerdict::Healthy, "{status:?}");
    let host = tokio::time::timeout(LIMIT, hosts.recv()).await.unwrap();
    let authority = base.trim_start_matches("http://");
    assert_eq!(host.as_deref(), Some(authority), "Host: [::1]:PORT");
    checker.stop().await;
}

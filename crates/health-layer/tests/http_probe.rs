//! The HTTP probe against a small local HTTP server answering like a service whose only probe
//! is the lookup of a record that does not exist.

mod support;

use std::time::Duration;

use health_layer::probe::HttpProbe;
use health_layer::{HealthChecker, HealthVerdict, ProbeMode, TargetStatus};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serves: `/records/missing-json` 404 + JSON with `ok`, `/records/missing-html` 404 + HTML,
/// `/records/broken` 503, `/records/crash` 500, `/records/slow` never answers.
async fn record_service() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&request);
                let path = text.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let (status, content_type, body) = match path.as_str() {
                    "/records/missing-json" => (
                        "404 Not Found",
                        "application/json",
                        r#"{"ok":true,"found":false}"#,
                    ),
                    "/records/missing-html" => (
                        "404 Not Found",
                        "text/html",
                        "<html><body>Not Found</body></html>",
                    ),
                    "/records/broken" => ("503 Service Unavailable", "text/plain", "upstream down"),
                    "/records/crash" => ("500 Internal Server Error", "text/plain", "oops"),
                    "/records/slow" => {
                        std::future::pending::<()>().await;
                        unreachable!()
                    }
                    _ => ("200 OK", "application/json", r#"{"ok":true}"#),
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    base
}

async fn probe(base: &str, path: &str) -> TargetStatus {
    probe_within(base, path, Duration::from_secs(5)).await
}

async fn probe_within(base: &str, path: &str, timeout: Duration) -> TargetStatus {
    let checker = HealthChecker::builder()
        .mode(ProbeMode::Http(
            HttpProbe::new(path)
                .accept_status([200, 404])
                .require_json_key("ok"),
        ))
        .interval(Duration::ZERO)
        .timeout(timeout)
        .build()
        .unwrap();
    checker.add_target(base).unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    let status = checker.check_now(base).await.unwrap();
    checker.stop().await;
    status
}

fn reason(status: &TargetStatus) -> &str {
    assert_eq!(status.verdict, HealthVerdict::Unhealthy, "{status:?}");
    status.last_error.as_deref().unwrap()
}

#[tokio::test]
async fn a_404_with_a_json_object_containing_ok_is_healthy() {
    let base = record_service().await;
    let status = probe(&base, "/records/missing-json").await;
    assert_eq!(status.verdict, HealthVerdict::Healthy, "{status:?}");
    assert_eq!(status.last_error, None);
}

#[tokio::test]
async fn a_404_with_an_html_body_is_unhealthy() {
    let base = record_service().await;
    let status = probe(&base, "/records/missing-html").await;
    assert_eq!(
        reason(&status),
        format!(
            "GET {base}/records/missing-html: HTTP 404 Not Found: body is not a JSON object with \
             key \"ok\" (text/html: \"<html><body>Not Found</body></html>\")"
        )
    );
}

#[tokio::test]
async fn any_5xx_is_unhealthy() {
    let base = record_service().await;
    for (path, status_line) in [
        ("/records/broken", "503 Service Unavailable"),
        ("/records/crash", "500 Internal Server Error"),
    ] {
        let status = probe(&base, path).await;
        assert_eq!(
            reason(&status),
            format!(
                "GET {base}{path}: HTTP {status_line}: status not accepted (healthy is [200, 404])"
            )
        );
    }
}

#[tokio::test]
async fn no_answer_in_time_is_unhealthy() {
    let base = record_service().await;
    let status = probe_within(&base, "/records/slow", Duration::from_millis(500)).await;
    assert_eq!(
        reason(&status),
        format!("GET {base}/records/slow: no answer within 0.5 s")
    );
}

#[tokio::test]
async fn a_refused_connection_is_unhealthy() {
    let base = support::refused_uri();
    let status = probe(&base, "/records/missing-json").await;
    let why = reason(&status);
    assert!(why.starts_with("UNAVAILABLE: connect failed:"), "{why}");
    assert!(why.contains("Connection refused"), "{why}");
}

#[tokio::test]
async fn a_custom_predicate_sees_status_headers_and_body() {
    let base = record_service().await;
    let checker = HealthChecker::builder()
        .mode(ProbeMode::Http(
            HttpProbe::new("/records/missing-html").predicate(|answer| {
                if answer.status == 404 && answer.body.starts_with(b"<html>") {
                    Ok(())
                } else {
                    Err(format!("unexpected {}", answer.status))
                }
            }),
        ))
        .interval(Duration::ZERO)
        .build()
        .unwrap();
    checker.add_target(base.as_str()).unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    assert_eq!(
        checker.check_now(&base).await.unwrap().verdict,
        HealthVerdict::Healthy
    );
    checker.stop().await;
}

#[test]
fn an_https_target_is_refused_when_added() {
    let checker = HealthChecker::builder()
        .mode(ProbeMode::Http(HttpProbe::new("/health")))
        .build()
        .unwrap();
    let err = checker.add_target("https://example.invalid").unwrap_err();
    assert!(err.to_string().contains("plain http only"), "{err}");
}

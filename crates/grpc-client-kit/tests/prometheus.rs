//! The kit's metrics through `metrics-exporter-prometheus`, scraped over HTTP as Prometheus
//! does: latency histograms with A66's buckets, the gauges, Prometheus' names for the dotted
//! ones. Run with `cargo test -p grpc-client-kit --features metrics --test prometheus`.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::time::Duration;

use grpc_client_kit::Kit;
use grpc_client_kit::health::{HealthConfig, ProbeMode};
use grpc_client_kit::metrics::LATENCY_BUCKETS;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Installs the exporter with its HTTP listener on a free loopback port; returns the address.
/// (The exporter binds the port itself and does not say which one it got for port 0: a port
/// found free is given to it, and another tried if someone took it in between.)
fn install_exporter() -> SocketAddr {
    let mut last = None;
    for _ in 0..5 {
        let addr = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .unwrap();
        let built = PrometheusBuilder::new()
            .with_http_listener(addr)
            .with_recommended_naming(true)
            .set_buckets_for_metric(Matcher::Suffix("duration".into()), LATENCY_BUCKETS)
            .unwrap()
            .build();
        match built {
            Ok((recorder, exporter)) => {
                metrics::set_global_recorder(recorder).unwrap();
                tokio::spawn(exporter);
                return addr;
            }
            Err(e) => last = Some(e),
        }
    }
    panic!("no free port for the exporter: {last:?}");
}

/// `GET /metrics` over a plain TCP connection; the body.
async fn scrape(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

/// The samples of `name` whose labels include `labels`: (labels as rendered, value).
fn samples<'a>(
    body: &'a str,
    name: &'a str,
    labels: &'a [(&str, &str)],
) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    body.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?;
        let (set, value) = match rest.strip_prefix('{') {
            Some(rest) => rest.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        let has = |(k, v): &(&str, &str)| set.split(',').any(|l| l == format!("{k}=\"{v}\""));
        labels
            .iter()
            .all(has)
            .then(|| (set, value.trim().parse().unwrap()))
    })
}

/// The value of the one sample of `name` whose labels include `labels`.
fn sample(body: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let found: Vec<(&str, f64)> = samples(body, name, labels).collect();
    assert!(found.len() <= 1, "{name} {labels:?}: {found:?}");
    found.first().map(|(_, v)| *v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_histograms_with_buckets_and_the_gauges() {
    let addr = install_exporter();
    let scraped = [("grpc_target", "scraped")];
    let backends = Backends::start(2).await.unwrap();
    let kit = Kit::builder()
        .name("scraped")
        .targets(backends.uris())
        .health(HealthConfig::new().mode(ProbeMode::Watch))
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
    let mut client = TestServiceClient::new(kit.channel());
    for _ in 0..10 {
        client.unary(Ping::default()).await.unwrap();
    }
    backends[0].fail_next(1, tonic::Code::Unavailable);
    let mut failed = 0;
    for _ in 0..2 {
        if client.unary(Ping::default()).await.is_err() {
            failed += 1;
        }
    }
    assert_eq!(failed, 1, "b0 failed once, b1 answered");

    // The gauges are set by the kit's task as the balancer takes the change in: scrape until
    // they show the quarantine (bounded).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let body = loop {
        let body = scrape(addr).await;
        let eligible = sample(&body, "grpc_client_kit_targets_eligible", &scraped);
        if eligible == Some(1.0) || tokio::time::Instant::now() > deadline {
            break body;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    let method = "gck.test.v1.TestService/Unary";
    let ok = [
        ("grpc_method", method),
        ("grpc_target", "scraped"),
        ("grpc_status", "OK"),
    ];
    // Histograms: one bucket per A66 boundary, plus +Inf; count and sum.
    let buckets = samples(&body, "grpc_client_attempt_duration_seconds_bucket", &ok).count();
    assert_eq!(buckets, LATENCY_BUCKETS.len() + 1, "{body}");
    let inf = [ok.as_slice(), &[("le", "+Inf")]].concat();
    let calls = sample(&body, "grpc_client_call_duration_seconds_bucket", &inf);
    assert_eq!(calls, Some(11.0), "{body}");
    let count = sample(&body, "grpc_client_call_duration_seconds_count", &ok);
    assert_eq!(count, Some(11.0), "{body}");
    assert!(sample(&body, "grpc_client_call_duration_seconds_sum", &ok).is_some());
    assert!(
        body.contains("# TYPE grpc_client_call_duration_seconds histogram"),
        "{body}"
    );
    // Counters, with Prometheus' suffix.
    let started = [("grpc_method", method), ("grpc_target", "scraped")];
    let started = sample(&body, "grpc_client_attempt_started_total", &started);
    assert_eq!(started, Some(12.0), "{body}");
    let b0 = backends.uris()[0].clone();
    let b0 = [
        ("grpc_target", "scraped"),
        ("grpc_client_kit_backend", b0.as_str()),
    ];
    let quarantines = sample(&body, "grpc_client_kit_quarantines_total", &b0);
    assert_eq!(quarantines, Some(1.0), "{body}");
    // Gauges.
    assert!(
        body.contains("# TYPE grpc_client_kit_targets_eligible gauge"),
        "{body}"
    );
    let known = sample(&body, "grpc_client_kit_targets_known", &scraped);
    assert_eq!(known, Some(2.0), "{body}");
    let eligible = sample(&body, "grpc_client_kit_targets_eligible", &scraped);
    assert_eq!(eligible, Some(1.0), "{body}");
    let breaker = sample(&body, "grpc_client_kit_breaker_state", &b0);
    assert_eq!(breaker, Some(0.0), "{body}");
    kit.shutdown().await;
}

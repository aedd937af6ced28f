//! The kit's metrics in Prometheus: serves `/metrics` with `metrics-exporter-prometheus`'s HTTP
//! listener while a kit over three local test backends runs calls — one backend fails now
//! and then (`UNAVAILABLE`: quarantined), another answers `INTERNAL` in bursts (its breaker
//! opens) — then ends by itself.
//!
//! ```text
//! cargo run -p grpc-client-kit --features metrics --example prometheus
//! cargo run -p grpc-client-kit --features metrics --example prometheus -- --seconds 60 --addr 127.0.0.1:9464
//! ```
//!
//! While it runs, open the URL it prints (`curl http://127.0.0.1:9464/metrics`). It runs for
//! `--seconds` (default 3) and listens on `--addr` (default `127.0.0.1:9464`).

use std::error::Error;
use std::net::SocketAddr;
use std::time::Duration;

use grpc_client_kit::Kit;
use grpc_client_kit::breaker::BreakerConfig;
use grpc_client_kit::health::{HealthConfig, ProbeMode};
use grpc_client_kit::metrics::LATENCY_BUCKETS;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tokio::time::Instant;
use tonic::Code;

struct Args {
    seconds: u64,
    addr: SocketAddr,
}

fn args() -> Result<Args, Box<dyn Error>> {
    let mut args = Args {
        seconds: 3,
        addr: "127.0.0.1:9464".parse()?,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--seconds" => args.seconds = value()?.parse()?,
            "--addr" => args.addr = value()?.parse()?,
            other => {
                return Err(
                    format!("unknown argument {other:?} (--seconds N, --addr IP:PORT)").into(),
                );
            }
        }
    }
    Ok(args)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn Error>> {
    let args = args()?;
    // The recorder first, so that the kit describes its metrics to it. Prometheus' own names
    // (`_total`, `_seconds`), and A66's buckets for the two latency histograms (without
    // buckets, the exporter renders histograms as summaries).
    PrometheusBuilder::new()
        .with_http_listener(args.addr)
        .with_recommended_naming(true)
        .set_buckets_for_metric(Matcher::Suffix("duration".into()), LATENCY_BUCKETS)?
        .install()?;
    println!(
        "metrics at http://{}/metrics for {} s",
        args.addr, args.seconds
    );

    let backends = Backends::start(3).await?;
    let kit = Kit::builder()
        .name("example")
        .targets(backends.uris())
        .health(HealthConfig::new().mode(ProbeMode::Watch))
        .breaker(BreakerConfig::default().consecutive_failures(3))
        .build()?;
    kit.wait_until_ready(Duration::from_secs(5)).await;
    let mut client = TestServiceClient::new(kit.channel());

    let end = Instant::now() + Duration::from_secs(args.seconds);
    let (mut calls, mut failures) = (0u64, 0u64);
    while Instant::now() < end {
        if calls % 200 == 0 {
            backends[0].fail_next(1, Code::Unavailable);
        }
        if calls % 500 == 250 {
            backends[1].fail_next(3, Code::Internal);
        }
        calls += 1;
        if client.unary(Ping::default()).await.is_err() {
            failures += 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "{calls} calls, {failures} failed; eligible now: {:?}",
        kit.eligible_targets()
    );
    kit.shutdown().await;
    Ok(())
}

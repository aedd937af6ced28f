//! Watch reaction: the time from a server's health status change to the gate shutting.
//!
//! A real tonic server (test-backends, `tonic-health`) on loopback, the checker in `Watch` mode,
//! one target. Each round sets the server's status to NOT_SERVING and measures, in a task
//! waiting on the target's card, how long until the card's health line no longer admits calls
//! (what `Health<S>::poll_ready` reads); then sets SERVING again and waits for it (not measured).
//!
//! ```text
//! cargo bench -p health-layer --bench watch_reaction            # 300 flips
//! HL_FLIPS=1000 cargo bench -p health-layer --bench watch_reaction
//! ```

use std::time::{Duration, Instant};

use health_layer::{EndpointCard, HealthChecker, HealthVerdict, ProbeMode};
use test_backends::Backend;

async fn until(card: &EndpointCard, want: HealthVerdict) {
    loop {
        let changed = card.changed();
        if card.health_verdict() == want {
            return;
        }
        changed.await;
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing we need.
    let flips: usize = std::env::var("HL_FLIPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let load_before = loadavg();
        let backend = Backend::start("b0").await.unwrap();
        let checker = HealthChecker::builder()
            .mode(ProbeMode::Watch)
            .build()
            .unwrap();
        let card = checker.add_target(backend.uri()).unwrap();
        checker.start(Vec::<&str>::new()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), until(&card, HealthVerdict::Healthy))
            .await
            .expect("healthy in time");

        let mut samples = Vec::with_capacity(flips);
        for _ in 0..flips {
            let waiter = {
                let card = card.clone();
                tokio::spawn(async move {
                    until(&card, HealthVerdict::Unhealthy).await;
                    Instant::now()
                })
            };
            tokio::task::yield_now().await;
            let start = Instant::now();
            backend.set_serving(false).await;
            let shut = waiter.await.unwrap();
            samples.push(shut - start);
            backend.set_serving(true).await;
            until(&card, HealthVerdict::Healthy).await;
        }
        checker.stop().await;
        samples.sort();
        let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
        println!(
            "watch reaction (status change -> gate shut), {} flips: p50 {:?}  p90 {:?}  p99 {:?}  max {:?}  mean {:?}",
            samples.len(),
            percentile(&samples, 0.50),
            percentile(&samples, 0.90),
            percentile(&samples, 0.99),
            samples[samples.len() - 1],
            mean,
        );
        println!("load average before: {load_before}; after: {}", loadavg());
        assert_eq!(backend.health_checks(), 1, "one Watch stream for every flip");
    });
}

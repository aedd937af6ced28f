//! Targets from a discovery source of your own: the kit follows a channel of
//! `tower::discover::Change`s — what a Kubernetes EndpointSlice watcher, a Consul watch or your
//! own registry would send — while a caller keeps calling.
//!
//! ```text
//! cargo run -p grpc-client-kit --example discover
//! ```
//!
//! Two backends are inserted; a third is added at run time (health-checked for its gRPC
//! service's name rather than the whole server) and takes its share; the first is removed
//! while calls are in flight on it (each backend answers after 50 ms): those calls finish, no
//! new call goes to it, and **no call fails**. Every target's stack also holds a layer of the
//! example's own: a concurrency limit per target. The example ends by itself, and exits
//! non-zero if any call failed or traffic did not follow the changes.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use grpc_client_kit::health::{HealthConfig, ProbeMode};
use grpc_client_kit::{Kit, TargetOptions};
use test_backends::Backends;
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::{Ping, SERVICE_NAME};
use tokio::sync::mpsc;
use tower::discover::Change;
use tower::limit::ConcurrencyLimitLayer;

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let backends = Backends::start(3).await?;
    for b in backends.iter() {
        b.set_delay(Duration::from_millis(50));
    }

    // The discovery source: a channel of changes, as a stream the kit polls.
    let (changes, mut rx) = mpsc::channel::<Change<String, TargetOptions>>(16);
    let source = futures_util::stream::poll_fn(move |cx| {
        rx.poll_recv(cx)
            .map(|change| change.map(Ok::<_, Infallible>))
    });
    let kit = Kit::builder()
        .discover(source)
        .per_target_layer(ConcurrencyLimitLayer::new(64))
        .health(HealthConfig::new().mode(ProbeMode::Watch))
        .build()?;
    for b in &backends.as_slice()[..2] {
        changes
            .send(Change::Insert(b.uri(), TargetOptions::new()))
            .await?;
    }
    if !kit.wait_until_ready(Duration::from_secs(5)).await {
        return Err(format!("the first targets never became ready: {kit:?}").into());
    }
    println!("targets: {:?}", kit.targets());

    // The caller: 4 concurrent callers, calling until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut callers = Vec::new();
    for _ in 0..4 {
        let mut client = TestServiceClient::new(kit.channel());
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        callers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match client.unary(Ping::default()).await {
                    Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(status) => {
                        eprintln!("call failed: {status:?}");
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }));
    }
    let calls = || ok.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed);
    let wait_for_calls = |n: u64| {
        let target = calls() + n;
        async move {
            while calls() < target {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait_for_calls(20).await;

    // A target appears at run time.
    let options = TargetOptions::new().health_service(SERVICE_NAME);
    let added = Change::Insert(backends[2].uri(), options);
    changes.send(added).await?;
    wait_until(|| backends[2].hits() >= 5).await?;
    println!("added {}: it takes calls", backends[2].uri());

    // A target goes away while calls are in flight on it.
    wait_until(|| backends[0].hits() > 0).await?;
    changes.send(Change::Remove(backends[0].uri())).await?;
    wait_until(|| !kit.targets().iter().any(|t| **t == *backends[0].uri())).await?;
    // Calls still in flight on b0 finish (50 ms); count b0's calls after that.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let b0_after_removal = backends[0].hits();
    wait_for_calls(40).await;
    println!("removed {}: it takes no more calls", backends[0].uri());

    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        caller.await?;
    }
    let hits: Vec<u64> = backends.iter().map(|b| b.hits()).collect();
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    println!("calls: {ok} answered, {failed} failed; per backend {hits:?}");
    kit.shutdown().await;

    if failed > 0 {
        return Err(format!("{failed} call(s) failed").into());
    }
    if backends[0].hits() != b0_after_removal {
        return Err("the removed target still got calls".into());
    }
    Ok(())
}

/// Waits (at most 10 s) until `cond` holds.
async fn wait_until(mut cond: impl FnMut() -> bool) -> Result<(), Error> {
    tokio::time::timeout(Duration::from_secs(10), async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .map_err(|_| "timed out waiting for the kit".into())
}

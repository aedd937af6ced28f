//! The grpc-client-kit demo: three local backends, one kit with `Watch` health checking, and a
//! generated client that keeps working while the backends misbehave.
//!
//! ```text
//! cargo run --example demo
//! ```
//!
//! Needs nothing installed: the backends are real tonic servers on `127.0.0.1`, started here.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use grpc_client_kit::health::{Backoff, HealthConfig, ProbeMode};
use grpc_client_kit::{Kit, KitChannel};
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tokio::sync::watch;
use tokio::time::Instant;

type Client = TestServiceClient<KitChannel>;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let backends = Backends::start(3).await?;
    let names: Vec<String> = backends.iter().map(|b| b.name().to_owned()).collect();

    // The whole kit: health checking over Watch streams, quarantine, a breaker per target and a
    // round-robin balancer, in one channel a generated client takes like a tonic `Channel`.
    let kit = Kit::builder()
        .targets(backends.uris())
        .health(
            HealthConfig::new()
                .mode(ProbeMode::Watch)
                .timeout(Duration::from_secs(2))
                .watch_backoff(Backoff {
                    initial: Duration::from_millis(100),
                    max: Duration::from_secs(1),
                    ..HealthConfig::DEFAULT_WATCH_BACKOFF
                }),
        )
        .build()?;
    let mut client = TestServiceClient::new(kit.channel());

    println!("grpc-client-kit demo — three local backends, Watch health checks, round-robin\n");
    for b in backends.iter() {
        println!("  {} = {}", b.name(), b.uri());
    }
    if !kit.wait_until_ready(Duration::from_secs(10)).await {
        return Err("the backends never became ready".into());
    }

    // 1. All serving.
    let split = calls(&mut client, 60).await;
    table("1. all serving", &names, &split, &[]);

    // 2. b1 says NOT_SERVING. A caller runs all along; when did b1 get its last call?
    let caller = Background::start(client.clone());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let flip = Instant::now();
    backends[1].set_serving(false).await;
    wait_eligible(&kit, 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let log = caller.stop().await;
    let after_flip: Vec<_> = log.iter().filter(|c| c.sent >= flip).collect();
    let last_b1 = log
        .iter()
        .filter(|c| c.backend.as_deref() == Some("b1"))
        .map(|c| c.sent)
        .max();
    let ms = |a: Instant, b: Instant| {
        if a >= b {
            format!("{:.2} ms after", (a - b).as_secs_f64() * 1e3)
        } else {
            format!("{:.2} ms before", (b - a).as_secs_f64() * 1e3)
        }
    };
    let shut = kit
        .card(&backends[1].uri())
        .map(|card| card.health().since)
        .unwrap_or(flip);
    let reaction = format!("b1 was out of rotation {} the flip", ms(shut, flip));
    let last = match last_b1 {
        Some(t) => format!("its last call was sent {} the flip", ms(t, flip)),
        None => "it got no call".to_owned(),
    };
    let failed = after_flip.iter().filter(|c| c.backend.is_none()).count();
    let split = calls(&mut client, 60).await;
    table(
        "2. b1 NOT_SERVING",
        &names,
        &split,
        &[
            format!("{reaction}; {last}"),
            format!(
                "a sequential caller made {} calls across the flip, {failed} failed",
                after_flip.len()
            ),
        ],
    );

    // 3. b1 is back; b2 is stopped abruptly (every connection reset, port closed).
    backends[1].set_serving(true).await;
    wait_eligible(&kit, 3).await;
    let caller = Background::start(client.clone());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stop = Instant::now();
    backends[2].stop().await;
    wait_eligible(&kit, 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let log = caller.stop().await;
    let around: Vec<_> = log.iter().filter(|c| c.sent >= stop).collect();
    let failed: Vec<_> = around.iter().filter(|c| c.backend.is_none()).collect();
    let split = calls(&mut client, 60).await;
    let why = kit
        .card(&backends[2].uri())
        .and_then(|c| c.eligibility().err())
        .map(|e| e.to_string())
        .unwrap_or_default();
    let mut notes = vec![
        format!(
            "a sequential caller made {} calls across the stop, {} failed",
            around.len(),
            failed.len()
        ),
        format!("the kit's view: {why}"),
    ];
    notes.extend(
        failed
            .iter()
            .take(3)
            .map(|c| format!("failed: {}", c.error)),
    );
    table("3. b2 stopped abruptly", &names, &split, &notes);

    // 4. b2 restarted, then every backend says NOT_SERVING.
    backends[2].restart().await?;
    wait_eligible(&kit, 3).await;
    for b in backends.iter() {
        b.set_serving(false).await;
    }
    wait_eligible(&kit, 0).await;
    let status = client
        .unary(Ping::default())
        .await
        .expect_err("nothing is serving");
    println!("\n4. all NOT_SERVING — the client sees:");
    println!("   code:    {:?}", status.code());
    println!(
        "   message: {}",
        status.message().replace("; ", ";\n            ")
    );

    // 5. Recovery.
    for b in backends.iter() {
        b.set_serving(true).await;
    }
    wait_eligible(&kit, 3).await;
    let split = calls(&mut client, 60).await;
    table("5. all serving again", &names, &split, &[]);

    kit.shutdown().await;
    println!("\ndone in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Makes `n` sequential calls; counts replies by backend, and failures under `"failed"`.
async fn calls(client: &mut Client, n: usize) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        let key = match client.unary(Ping::default()).await {
            Ok(reply) => reply.into_inner().backend,
            Err(_) => "failed".to_owned(),
        };
        *seen.entry(key).or_insert(0) += 1;
    }
    seen
}

fn table(phase: &str, names: &[String], split: &BTreeMap<String, usize>, notes: &[String]) {
    println!("\n{phase}");
    let mut header = String::from("   ");
    let mut row = String::from("   ");
    for name in names.iter().map(String::as_str).chain(["failed"]) {
        header.push_str(&format!("{name:>8}"));
        row.push_str(&format!("{:>8}", split.get(name).copied().unwrap_or(0)));
    }
    println!("{header}\n{row}");
    for note in notes {
        println!("   {note}");
    }
}

/// Waits (bounded) until the balancer picks from exactly `n` targets.
async fn wait_eligible(kit: &Kit, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while kit.eligible_targets().len() != n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One call made by the background caller.
struct Call {
    sent: Instant,
    backend: Option<String>,
    error: String,
}

/// A sequential caller running until stopped, logging every call.
struct Background {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    log: Arc<Mutex<Vec<Call>>>,
}

impl Background {
    fn start(mut client: Client) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let log = Arc::new(Mutex::new(Vec::new()));
        let out = log.clone();
        let task = tokio::spawn(async move {
            while !*stopped.borrow_and_update() {
                let sent = Instant::now();
                let call = match client.unary(Ping::default()).await {
                    Ok(reply) => Call {
                        sent,
                        backend: Some(reply.into_inner().backend),
                        error: String::new(),
                    },
                    Err(status) => Call {
                        sent,
                        backend: None,
                        error: format!("{:?}: {}", status.code(), status.message()),
                    },
                };
                out.lock().unwrap().push(call);
            }
        });
        Background { stop, task, log }
    }

    async fn stop(self) -> Vec<Call> {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

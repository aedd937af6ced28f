//! The grpc-client-kit demo: three local backends, one kit with `Watch` health checking, and a
//! generated client that keeps working while the backends misbehave — next to the same client
//! over tonic's `Channel::balance_list` on the same backends, phase by phase.
//!
//! ```text
//! cargo run --example demo
//! RUST_LOG=info cargo run --example demo   # also the kit's transitions as they happen (stderr)
//! ```
//!
//! Needs nothing installed: the backends are real tonic servers on `127.0.0.1`, started here.
//! Each phase makes 60 sequential calls with each client: `balance_list` keeps giving a
//! `NOT_SERVING` backend its share, keeps failing about a third of the calls while a backend
//! is down (errors that name no backend), and answers from backends that all say
//! `NOT_SERVING`; the kit does none of that.

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
use tonic::transport::{Channel, Endpoint};
use tracing_subscriber::EnvFilter;

type Client = TestServiceClient<KitChannel>;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `RUST_LOG=info` shows the kit's transitions (health, quarantine, breaker) on stderr;
    // without it, only warnings.
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
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
    // The same generated client over tonic's own balancer on the same addresses.
    let endpoints = backends.uris().into_iter().map(Endpoint::from_shared);
    let endpoints = endpoints.collect::<Result<Vec<_>, _>>()?;
    let mut tonic = TestServiceClient::new(Channel::balance_list(endpoints.into_iter()));

    println!("grpc-client-kit demo — three local backends, Watch health checks, round-robin,");
    println!("next to tonic's Channel::balance_list over the same backends\n");
    for b in backends.iter() {
        println!("  {} = {}", b.name(), b.uri());
    }
    if !kit.wait_until_ready(Duration::from_secs(10)).await {
        return Err("the backends never became ready".into());
    }

    // 1. All serving.
    let split = calls(&mut client, 60).await;
    let theirs = calls(&mut tonic, 60).await;
    table("1. all serving", &names, &split, &theirs, &[]);
    check(&split, &[20, 20, 20])?;

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
    let theirs = calls(&mut tonic, 60).await;
    table(
        "2. b1 NOT_SERVING",
        &names,
        &split,
        &theirs,
        &[
            format!("kit: {reaction}; {last}"),
            format!(
                "kit: a sequential caller made {} calls across the flip, {failed} failed",
                after_flip.len()
            ),
            "balance_list: b1 keeps its full share (tonic does not read health)".to_owned(),
        ],
    );
    check(&split, &[30, 0, 30])?;

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
    let theirs = calls(&mut tonic, 60).await;
    let why = kit
        .card(&backends[2].uri())
        .and_then(|c| c.eligibility().err())
        .map(|e| e.to_string())
        .unwrap_or_default();
    let mut notes = vec![
        format!(
            "kit: a sequential caller made {} calls across the stop, {} failed",
            around.len(),
            failed.len()
        ),
        format!("kit: its view of b2: {why}"),
    ];
    notes.extend(
        failed
            .iter()
            .take(3)
            .map(|c| format!("kit: failed: {}", c.error)),
    );
    // balance_list does not learn: a second later, the same share of calls fails again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let again = calls(&mut tonic, 60).await;
    notes.push(format!(
        "balance_list: a second later, {} of 60 calls failed again",
        again.failed
    ));
    if let Some(error) = &theirs.first_error {
        notes.push(format!("balance_list: failed: {error}  (which backend?)"));
    }
    table("3. b2 stopped abruptly", &names, &split, &theirs, &notes);
    check(&split, &[30, 30, 0])?;

    // 4. b2 restarted, then every backend says NOT_SERVING.
    backends[2].restart().await?;
    wait_eligible(&kit, 3).await;
    for b in backends.iter() {
        b.set_serving(false).await;
    }
    wait_eligible(&kit, 0).await;
    let status = match client.unary(Ping::default()).await {
        Ok(reply) => return Err(format!("nothing serves, yet the kit got {reply:?}").into()),
        Err(status) => status,
    };
    println!("\n4. all NOT_SERVING — the kit's client sees:");
    println!("   code:    {:?}", status.code());
    println!(
        "   message: {}",
        status.message().replace("; ", ";\n            ")
    );
    let theirs = calls(&mut tonic, 60).await;
    println!(
        "   balance_list: {} of 60 calls answered, by backends that all say NOT_SERVING",
        60 - theirs.failed
    );

    // 5. Recovery.
    for b in backends.iter() {
        b.set_serving(true).await;
    }
    wait_eligible(&kit, 3).await;
    let split = calls(&mut client, 60).await;
    let theirs = calls(&mut tonic, 60).await;
    table("5. all serving again", &names, &split, &theirs, &[]);
    check(&split, &[20, 20, 20])?;

    kit.shutdown().await;
    println!("\ndone in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// What `n` sequential calls did: replies by backend, failures, the first error.
#[derive(Debug, Default)]
struct Split {
    by_backend: BTreeMap<String, usize>,
    failed: usize,
    first_error: Option<String>,
}

/// Makes `n` sequential calls with `client` (the kit's or tonic's).
async fn calls<T>(client: &mut TestServiceClient<T>, n: usize) -> Split
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut split = Split::default();
    for _ in 0..n {
        match client.unary(Ping::default()).await {
            Ok(reply) => {
                *split
                    .by_backend
                    .entry(reply.into_inner().backend)
                    .or_insert(0) += 1
            }
            Err(status) => {
                split.failed += 1;
                split
                    .first_error
                    .get_or_insert_with(|| format!("{:?}: {}", status.code(), status.message()));
            }
        }
    }
    split
}

/// Fails unless the kit's calls went to b0, b1, b2 as `want` says, and none failed (the demo
/// shows what the README says: CI runs it).
fn check(kit: &Split, want: &[usize; 3]) -> Result<(), String> {
    let got: Vec<usize> = ["b0", "b1", "b2"]
        .iter()
        .map(|b| kit.by_backend.get(*b).copied().unwrap_or(0))
        .collect();
    if got == want && kit.failed == 0 {
        Ok(())
    } else {
        Err(format!(
            "the kit's calls: {got:?} and {} failed, expected {want:?}",
            kit.failed
        ))
    }
}

/// The phase's calls per backend, the kit's row above tonic's.
fn table(phase: &str, names: &[String], kit: &Split, tonic: &Split, notes: &[String]) {
    println!("\n{phase}");
    let mut header = format!("   {:<14}", "");
    for name in names.iter().map(String::as_str).chain(["failed"]) {
        header.push_str(&format!("{name:>8}"));
    }
    println!("{header}");
    for (client, split) in [("kit", kit), ("balance_list", tonic)] {
        let mut row = format!("   {client:<14}");
        for name in names {
            row.push_str(&format!(
                "{:>8}",
                split.by_backend.get(name).copied().unwrap_or(0)
            ));
        }
        row.push_str(&format!("{:>8}", split.failed));
        println!("{row}");
    }
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

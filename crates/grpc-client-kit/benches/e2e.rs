//! End-to-end unary throughput and latency: the kit against tonic's and tower's balancers, in
//! the same run.
//!
//! Three test backends on loopback, in another process (this bench binary again, re-executed
//! as a backends process); `--callers` (64) tasks, each with its own clone of a generated
//! `TestServiceClient`, call `Unary` back to back for a fixed time. Contenders:
//!
//! * `kit` — the grpc-client-kit channel with round-robin (health in Watch mode, quarantine and
//!   breaker at their defaults: the whole per-target stack), its targets called through the
//!   kit's own HTTP/2 client (the default template, plaintext);
//! * `tonic balance_list` — `Channel::balance_list` over the three endpoints;
//! * `tower p2c` — tower's `p2c::Balance` over three `Channel`s (load: pending requests).
//!   `p2c::Balance` is not `Clone`, so it sits behind a `tower::buffer::Buffer` (1,024 slots,
//!   one worker task), the way tower means it to be shared;
//! * `kit, 1 backend` — the kit with one target, beside `single Channel`;
//! * `single Channel` — one bare `Channel` to one backend, for scale (no balancing at all);
//! * `single hyper h2` — one HTTP/2 connection made with hyper alone, its `SendRequest` called
//!   directly (no `Buffer`, no reconnection): the floor under every contender;
//! * `single hyper h2 one write` — the same, its IO sending each request's `HEADERS` and
//!   `DATA` in one write as the kit's connections do: the floor under the kit.
//!
//! * `kit + retryPolicy` — the kit with a service config whose `retryPolicy` (gRFC A6) covers
//!   the method: the cost of an enabled retry policy on the success path (issue 16).
//!
//! With `--hedging` (issue 16), a second part runs over three other backends (in a second
//! backends process), one of them slow (`--slow-ms`, 20 ms per call): the kit over the two
//! fast ones alone, over all three without hedging, and over all three with a `hedgingPolicy`
//! (`maxAttempts` 2, `hedgingDelay` `--hedge-delay-ms`, 2 ms), with `--hedge-callers` (4)
//! callers — few enough that the backends are not saturated, where hedging is meant to run:
//! the hedged p99 against the fast backends' p99.
//!
//! With `--variants`, the kit also runs without its breaker, without quarantine, without
//! health checking, and as the balancer alone: what each layer costs. `--only NAME` keeps
//! the contenders whose name contains `NAME` (for profiling one at a time).
//!
//! Each contender warms up (connections made, caches hot), then is measured for `--secs` (10)
//! in total, split into `--rounds` (20) slices taken in rotating order, each after a short
//! warm-up (at most 250 ms; the first one `--warmup`, 1 s), so that a change in the machine's
//! load hits every contender alike: on a shared machine, prefer many short rounds. Latency is
//! per successful call (HDR histogram, 3 significant digits). Client CPU is the client
//! process's own (user + system, all its threads, from `/proc/self/stat`) over the contender's
//! measured slices, per call: only the client counts, the backends being elsewhere. Server CPU
//! is the backends process's (from `/proc/<pid>/stat`), per call. Both have the clock tick's
//! resolution (10 ms) per slice.
//!
//! The backends process serves on a runtime of `--server-workers` (2) worker threads and
//! answers the bench's questions (calls per backend, for the split column and the hedging
//! part's slow backend) on its stdin and stdout; it exits when its stdin closes, and is killed
//! and reaped should the bench panic. The callers and every client's background tasks run on
//! the client process's runtime (`--client-workers`, 2). Note that test-backends records each
//! request's headers (a short lock and a header-map clone per call): the same for every
//! contender.
//!
//! ```text
//! cargo bench -p grpc-client-kit --bench e2e                          # 10 s each, 20 rounds
//! cargo bench -p grpc-client-kit --bench e2e -- --secs 30 --rounds 60 # steadier on a busy box
//! cargo bench -p grpc-client-kit --bench e2e -- --variants            # the cost of each layer
//! GCK_E2E_SECS=1 GCK_E2E_ROUNDS=1 cargo bench -p grpc-client-kit --bench e2e   # quick look
//! cargo bench -p grpc-client-kit --bench e2e -- --hedging             # and the hedging part
//! ```
//!
//! Under `cargo test --benches` (no `--bench` argument) it runs a 0.3 s smoke version.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use grpc_client_kit::Kit;
use grpc_client_kit::health::{HealthConfig, ProbeMode};
use support::{
    Args, BackendsProcess, CpuMark, LoadResult, UnaryCaller, balance_list, closed_loop, fmt_ns,
    loadavg, single_channel, table, tower_p2c,
};
use test_backends::pb::test_service_client::TestServiceClient;

/// Runs the closed loop for one contender: `(callers, duration) -> result`. Boxed once per
/// run, not per call.
type Runner = Box<dyn Fn(usize, Duration) -> Pin<Box<dyn Future<Output = LoadResult> + Send>>>;

/// The closed loop over `client` (a generated client, cloned once per caller task).
fn runner<C: UnaryCaller>(client: C) -> Runner {
    Box::new(move |callers, d| {
        let client = client.clone();
        Box::pin(async move { closed_loop(&client, callers, d).await })
    })
}

struct Contender {
    name: &'static str,
    client: Runner,
    result: Option<LoadResult>,
    cpu: (Duration, Duration),
    /// Calls each backend received while this contender was measured.
    split: Vec<u64>,
}

fn main() {
    // Re-executed as the backends process: serve until stdin closes.
    if support::serve_backends_if_child() {
        return;
    }
    let args = Args::from_env();
    let smoke = !args.is_bench();
    let secs = args.secs("secs", "GCK_E2E_SECS", if smoke { 0.3 } else { 10.0 });
    let warmup = args.secs(
        "warmup",
        "GCK_E2E_WARMUP_SECS",
        if smoke { 0.1 } else { 1.0 },
    );
    let callers: usize = args.get("callers", "GCK_E2E_CALLERS", 64);
    let rounds: u32 = args.get("rounds", "GCK_E2E_ROUNDS", if smoke { 1 } else { 20 });
    let client_workers: usize = args.get("client-workers", "GCK_E2E_CLIENT_WORKERS", 2);
    let server_workers: usize = args.get("server-workers", "GCK_E2E_SERVER_WORKERS", 2);
    let only: Option<String> = args.get("only", "GCK_E2E_ONLY", String::new()).into();
    let only = only.filter(|s| !s.is_empty());
    let variants = args.flag("--variants") || std::env::var_os("GCK_E2E_VARIANTS").is_some();
    let hedging = args.flag("--hedging") || std::env::var_os("GCK_E2E_HEDGING").is_some();
    let slow_ms: u64 = args.get("slow-ms", "GCK_E2E_SLOW_MS", 20);
    let hedge_delay_ms: u64 = args.get("hedge-delay-ms", "GCK_E2E_HEDGE_DELAY_MS", 2);
    let hedge_callers: usize = args.get("hedge-callers", "GCK_E2E_HEDGE_CALLERS", 4);

    let mut backends = BackendsProcess::start(3, server_workers);
    let client_rt = support::runtime(support::CLIENT_THREADS, client_workers);
    let uris = backends.uris();

    let mut contenders: Vec<Contender> = {
        let _guard = client_rt.enter();
        let mut all: Vec<(&'static str, Runner)> = Vec::new();
        all.push((
            "kit (round-robin)",
            client_rt.block_on(kit_runner(&uris, Layers::All)),
        ));
        all.push((
            "kit + retryPolicy",
            client_rt.block_on(kit_with_config(&uris, RETRY_POLICY)),
        ));
        if variants {
            for (name, layers) in [
                ("kit without breaker", Layers::NoBreaker),
                ("kit without quarantine", Layers::NoQuarantine),
                ("kit without health", Layers::NoHealth),
                ("kit, balancer only", Layers::BalanceOnly),
            ] {
                all.push((name, client_rt.block_on(kit_runner(&uris, layers))));
            }
        }
        all.push((
            "kit, 1 backend",
            client_rt.block_on(kit_runner(&uris[..1], Layers::All)),
        ));
        all.push(("tonic balance_list", runner(balance_list(&uris))));
        all.push(("tower p2c + Buffer", runner(tower_p2c(&uris))));
        all.push((
            "single Channel, 1 backend",
            runner(single_channel(&uris[0])),
        ));
        all.push((
            "single hyper h2, 1 backend",
            runner(client_rt.block_on(support::single_hyper(&uris[0], false))),
        ));
        all.push((
            "single hyper h2 one write",
            runner(client_rt.block_on(support::single_hyper(&uris[0], true))),
        ));
        all.into_iter()
            .filter(|(name, _)| only.as_deref().is_none_or(|o| name.contains(o)))
            .map(|(name, client)| Contender {
                name,
                client,
                result: None,
                cpu: (Duration::ZERO, Duration::ZERO),
                split: vec![0; 3],
            })
            .collect()
    };

    let load_before = loadavg();
    let slice = secs / rounds;
    for round in 0..rounds as usize {
        let n = contenders.len();
        for k in 0..n {
            let c = &mut contenders[(round + k) % n];
            // Connections are up after the first round: later slices only need the callers
            // back in their steady state.
            let warm_for = if round == 0 {
                warmup
            } else {
                warmup.min(Duration::from_millis(250))
            };
            let warm = client_rt.block_on((c.client)(callers, warm_for));
            assert!(
                warm.ok > 0,
                "{}: no successful call in the warm-up: {:?}",
                c.name,
                warm.errors
            );
            let hits_before = backends.hits();
            let cpu = CpuMark::now(backends.pid());
            let r = client_rt.block_on((c.client)(callers, slice));
            let (client_cpu, server_cpu) = cpu.since();
            for (i, after) in backends.hits().into_iter().enumerate() {
                c.split[i] += after - hits_before[i];
            }
            c.cpu.0 += client_cpu;
            c.cpu.1 += server_cpu;
            match &mut c.result {
                Some(total) => total.merge(r),
                None => c.result = Some(r),
            }
        }
    }
    let load_after = loadavg();

    let reference = contenders
        .iter()
        .find(|c| c.name.starts_with("tonic"))
        .and_then(|c| c.result.as_ref())
        .map(|r| (r.throughput(), r.latency.value_at_quantile(0.99)));
    let mut rows = Vec::new();
    for c in &contenders {
        let r = c.result.as_ref().expect("measured");
        let calls = (r.ok + r.failed).max(1) as f64;
        let (tput_ratio, p99_ratio) = match reference {
            Some((tput, p99)) => (
                format!("{:.2}", r.throughput() / tput),
                format!(
                    "{:.2}",
                    r.latency.value_at_quantile(0.99) as f64 / p99 as f64
                ),
            ),
            None => ("-".into(), "-".into()),
        };
        rows.push(vec![
            c.name.to_string(),
            format!("{:.0}", r.throughput()),
            tput_ratio,
            fmt_ns(r.latency.value_at_quantile(0.50)),
            fmt_ns(r.latency.value_at_quantile(0.99)),
            p99_ratio,
            fmt_ns(r.latency.value_at_quantile(0.999)),
            fmt_ns(r.latency.max()),
            format!("{:.1}", c.cpu.0.as_secs_f64() * 1e6 / calls),
            format!("{:.1}", c.cpu.1.as_secs_f64() * 1e6 / calls),
            c.split
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join("/"),
            r.failed.to_string(),
        ]);
    }
    println!(
        "e2e unary: 3 backends on loopback in another process (runtime {server_workers} \
         workers), {callers} callers, {} measured per contender ({rounds} round(s), {} warm-up \
         each), client runtime {client_workers} workers; client CPU = the client process's{}",
        support::fmt_dur(secs),
        support::fmt_dur(warmup),
        if smoke { " [smoke run]" } else { "" },
    );
    print!(
        "{}",
        table(
            &[
                "contender",
                "calls/s",
                "x tonic",
                "p50",
                "p99",
                "p99 x tonic",
                "p99.9",
                "max",
                "client CPU µs/call",
                "server CPU µs/call",
                "b0/b1/b2 calls",
                "errors",
            ],
            &rows,
        )
    );
    for c in &contenders {
        let r = c.result.as_ref().expect("measured");
        if !r.errors.is_empty() {
            println!("{} errors, e.g.: {:?}", c.name, r.errors);
        }
    }
    println!("load average before: {load_before}; after: {load_after}");

    let mut hedging_failed = 0;
    if hedging {
        hedging_failed = hedging_part(
            &client_rt,
            HedgingRun {
                server_workers,
                callers: hedge_callers,
                secs,
                warmup,
                rounds,
                slow: Duration::from_millis(slow_ms),
                delay_ms: hedge_delay_ms,
            },
        );
    }

    let failed: u64 = contenders
        .iter()
        .map(|c| c.result.as_ref().map_or(0, |r| r.failed))
        .sum();
    drop(contenders);
    client_rt.shutdown_timeout(Duration::from_secs(1));
    // Closes the backends process's stdin, waits for it to exit.
    drop(backends);
    assert_eq!(failed, 0, "no call may fail on healthy backends");
    assert_eq!(hedging_failed, 0, "no hedged call may fail");
}

/// A retry policy over the test service's methods (issue 16): never used on the success path
/// but for its bookkeeping.
const RETRY_POLICY: &str = r#"{"methodConfig": [{"name": [{"service": "gck.test.v1.TestService"}],
    "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#;

/// The settings of the hedging part.
struct HedgingRun {
    server_workers: usize,
    callers: usize,
    secs: Duration,
    warmup: Duration,
    rounds: u32,
    slow: Duration,
    delay_ms: u64,
}

/// The hedging part: three backends, the last one slow; returns the calls that failed.
fn hedging_part(client_rt: &tokio::runtime::Runtime, run: HedgingRun) -> u64 {
    let mut backends = BackendsProcess::start(3, run.server_workers);
    backends.set_delay(2, run.slow);
    let uris = backends.uris();
    let hedge = format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "gck.test.v1.TestService"}}],
            "hedgingPolicy": {{"maxAttempts": 2, "hedgingDelay": "{}s"}}}}]}}"#,
        run.delay_ms as f64 / 1000.0
    );
    let mut contenders: Vec<(&'static str, Runner, Option<LoadResult>)> = {
        let _guard = client_rt.enter();
        vec![
            (
                "kit, 2 fast backends only",
                client_rt.block_on(kit_with_config(&uris[..2], "{}")),
                None,
            ),
            (
                "kit, 2 fast + 1 slow, no hedging",
                client_rt.block_on(kit_with_config(&uris, "{}")),
                None,
            ),
            (
                "kit, 2 fast + 1 slow, hedging",
                client_rt.block_on(kit_with_config(&uris, &hedge)),
                None,
            ),
        ]
    };
    let slice = run.secs / run.rounds;
    for round in 0..run.rounds as usize {
        let n = contenders.len();
        for k in 0..n {
            let (_, client, result) = &mut contenders[(round + k) % n];
            let warm_for = if round == 0 {
                run.warmup
            } else {
                run.warmup.min(Duration::from_millis(250))
            };
            let _ = client_rt.block_on(client(run.callers, warm_for));
            let r = client_rt.block_on(client(run.callers, slice));
            match result {
                Some(total) => total.merge(r),
                None => *result = Some(r),
            }
        }
    }
    let fast_p99 = contenders[0]
        .2
        .as_ref()
        .map_or(1, |r| r.latency.value_at_quantile(0.99).max(1));
    let mut rows = Vec::new();
    let mut failed = 0;
    for (name, _, result) in &contenders {
        let r = result.as_ref().expect("measured");
        failed += r.failed;
        rows.push(vec![
            name.to_string(),
            format!("{:.0}", r.throughput()),
            fmt_ns(r.latency.value_at_quantile(0.50)),
            fmt_ns(r.latency.value_at_quantile(0.99)),
            format!(
                "{:.2}",
                r.latency.value_at_quantile(0.99) as f64 / fast_p99 as f64
            ),
            fmt_ns(r.latency.value_at_quantile(0.999)),
            fmt_ns(r.latency.max()),
            r.failed.to_string(),
        ]);
    }
    println!(
        "hedging (issue 16): 3 backends in another process, the third {} ms slower per call; hedgingDelay {} ms, \
         maxAttempts 2; {} callers, {} measured per contender",
        run.slow.as_millis(),
        run.delay_ms,
        run.callers,
        support::fmt_dur(run.secs),
    );
    print!(
        "{}",
        table(
            &[
                "contender",
                "calls/s",
                "p50",
                "p99",
                "p99 x fast-only",
                "p99.9",
                "max",
                "errors",
            ],
            &rows,
        )
    );
    println!(
        "slow backend: {} calls received, {} cancelled",
        backends.hits()[2],
        backends.cancelled()[2]
    );
    drop(contenders);
    drop(backends);
    failed
}

/// The kit's channel over `uris` (health in Watch mode, every layer) with a service config.
async fn kit_with_config(uris: &[String], config: &str) -> Runner {
    let kit = Kit::builder()
        .targets(uris.iter().cloned())
        .health(HealthConfig::new().mode(ProbeMode::Watch))
        .service_config(config)
        .build()
        .expect("kit");
    assert!(
        kit.wait_until_ready(Duration::from_secs(10)).await,
        "kit ready"
    );
    runner(TestServiceClient::new(kit.channel()))
}

/// Which of the kit's per-target layers run (`--variants` measures each one's share).
#[derive(Debug, Clone, Copy)]
enum Layers {
    All,
    NoBreaker,
    NoQuarantine,
    NoHealth,
    BalanceOnly,
}

/// The kit's channel over `uris`: round-robin, health in Watch mode, quarantine and breaker at
/// their defaults (or without some of them). The channel keeps the kit running.
async fn kit_runner(uris: &[String], layers: Layers) -> Runner {
    let mut builder = Kit::builder()
        .targets(uris.iter().cloned())
        .health(HealthConfig::new().mode(ProbeMode::Watch));
    builder = match layers {
        Layers::All => builder,
        Layers::NoBreaker => builder.without_breaker(),
        Layers::NoQuarantine => builder.without_quarantine(),
        Layers::NoHealth => builder.without_health(),
        Layers::BalanceOnly => builder
            .without_health()
            .without_quarantine()
            .without_breaker(),
    };
    let kit = builder.build().expect("kit");
    assert!(
        kit.wait_until_ready(Duration::from_secs(10)).await,
        "kit ready"
    );
    runner(TestServiceClient::new(kit.channel()))
}

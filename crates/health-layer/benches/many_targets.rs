//! A checker with 1,000 targets: CPU share and memory per target, in `Watch` mode (idle: nothing
//! changes on the servers) and in `Check` mode (a `Check` per target every 1 s).
//!
//! Each mode runs in a process of its own (this binary again, with `HL_BENCH_MODE`), so that
//! neither's memory or CPU counts towards the other's. Its servers run in yet another process
//! (`HL_BENCH_SERVERS=1`): 10 test backends. The checker has 1,000 targets, 100 per backend,
//! each with its own probe connection (so 1,000 HTTP/2 connections, as 1,000 real endpoints
//! would have). Each target is named by a URI of its own (`http://t7.bench:PORT`) and reached at
//! its backend's address ([`Target::address`]), with the default endpoint template: in `Check`
//! mode the checker's own HTTP/2 connections carry its probes. Only the checker's process is measured: CPU time from `/proc/self/stat` (user +
//! system, all threads) over a window after warm-up, and resident memory (`VmRSS`) before the
//! checker and after it is warm. The load average is printed too: other work on the machine
//! slows everything down, but CPU time per check is this process's own.
//!
//! `HL_MODES=channel` measures `Check` mode with each target given a tonic `Endpoint` instead
//! (probes on tonic `Channel`s, as for any endpoint the checker cannot read back);
//! `HL_MODES=h2floor` a run without any checker, for scale: the same `Check`s, each target a
//! task of its own on an HTTP/2 connection of the `h2` crate (no hyper, no tonic), sending a
//! request's `HEADERS` and `DATA` together, on the same grid of ten instants a second.
//!
//! The output ends with one line per mode, `watch: ...` then `checker: ...`:
//!
//! ```text
//! cargo bench -p health-layer --bench many_targets
//! HL_TARGETS=2000 HL_WINDOW_SECS=30 cargo bench -p health-layer --bench many_targets
//! HL_MODES=check cargo bench -p health-layer --bench many_targets
//! HL_MODES=check,channel,h2floor cargo bench -p health-layer --bench many_targets
//! ```
//!
//! `HL_WATCH_INTERVAL_SECS` (default 30, the checker's default interval) is how often a quiet
//! `Watch` stream's connection is verified with a `Check`; `HL_WINDOW_SECS` the measured window
//! (default 20 s for `Check`; for `Watch`, 4/3 of that interval and at least 20 s, so that the
//! window holds every target's verifying `Check`); `HL_WORKERS` (default 2) the checker's
//! runtime's worker threads, 0 for a current-thread runtime.

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use health_layer::{HealthChecker, ProbeMode, Target};
use tonic::transport::Endpoint;

const BACKENDS: usize = 10;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// User + system CPU time of this process, all threads (`/proc/self/stat`, in USER_HZ = 100).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields 14 and 15 of the whole line (utime, stime) are 12 and 13 after the command name.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// The servers' process: serve, print the URIs, answer `count` with the total health checks
/// (`Check` and `Watch` calls); exit on EOF.
fn servers() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let backends = test_backends::Backends::start(BACKENDS).await.unwrap();
        println!("{}", backends.uris().join(" "));
        std::io::stdout().flush().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(4);
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                if tx.blocking_send(line.unwrap()).is_err() {
                    break;
                }
            }
        });
        while let Some(line) = rx.recv().await {
            if line.trim() == "count" {
                let total: u64 = backends.iter().map(|b| b.health_checks()).sum();
                println!("{total}");
                std::io::stdout().flush().unwrap();
            }
        }
    });
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Targets named by their URI, probed with the default endpoint template: the checker's
    /// own HTTP/2 connections.
    Check,
    /// The same, each target given a tonic `Endpoint` of its own (which the checker cannot
    /// read back): probes on tonic `Channel`s.
    CheckChannel,
    Watch,
    /// No checker, for scale: the same `Check`s a second, each target a task of its own on an
    /// HTTP/2 connection of the `h2` crate (no hyper, no tonic), its request's `HEADERS` and
    /// `DATA` handed to the connection together, on the same 100 ms grid as the checker.
    H2Floor,
}

impl Mode {
    fn parse(s: &str) -> Option<Mode> {
        match s.trim() {
            "check" | "checker" => Some(Mode::Check),
            "channel" => Some(Mode::CheckChannel),
            "watch" => Some(Mode::Watch),
            "h2floor" => Some(Mode::H2Floor),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Check => "check",
            Mode::CheckChannel => "channel",
            Mode::Watch => "watch",
            Mode::H2Floor => "h2floor",
        }
    }

    /// The first word of the summary line.
    fn label(self) -> &'static str {
        match self {
            Mode::Check => "checker",
            Mode::CheckChannel => "checker-channel",
            Mode::Watch => "watch",
            Mode::H2Floor => "h2floor",
        }
    }
}

/// What a mode measures: the checker, or the `h2floor` mode's tasks.
enum Running {
    Checker(HealthChecker),
    H2(Vec<tokio::task::JoinHandle<()>>),
}

/// How many of the checker's targets are healthy.
fn healthy(checker: &HealthChecker) -> usize {
    checker
        .statuses()
        .iter()
        .filter(|s| s.verdict == health_layer::HealthVerdict::Healthy)
        .count()
}

/// Runs `f`, which blocks, on a runtime of `workers` threads (0: the current thread).
fn blocking<T>(workers: usize, f: impl FnOnce() -> T) -> T {
    if workers == 0 {
        f()
    } else {
        tokio::task::block_in_place(f)
    }
}

/// One mode, measured in this process (the servers in a child): prints the details, then the
/// summary line.
fn measure(mode: Mode) {
    let targets = env_or("HL_TARGETS", 1_000) as usize;
    let interval = match mode {
        Mode::Check | Mode::CheckChannel | Mode::H2Floor => Duration::from_secs(1),
        Mode::Watch => Duration::from_secs(env_or("HL_WATCH_INTERVAL_SECS", 30)),
    };
    // Watch: by default a window longer than the interval, so that it holds every target's
    // verifying `Check` of a quiet stream, not just silence.
    let default_window = match mode {
        Mode::Check | Mode::CheckChannel | Mode::H2Floor => 20,
        Mode::Watch => (interval.as_secs() * 4 / 3).max(20),
    };
    let window = Duration::from_secs(env_or("HL_WINDOW_SECS", default_window));

    let mut child = Command::new(std::env::current_exe().unwrap())
        .env("HL_BENCH_SERVERS", "1")
        .env_remove("HL_BENCH_MODE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_child = child.stdin.take().unwrap();
    let mut from_child = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let uris: Vec<String> = from_child
        .next()
        .unwrap()
        .unwrap()
        .split_whitespace()
        .map(String::from)
        .collect();
    let mut count = move || -> u64 {
        writeln!(to_child, "count").unwrap();
        to_child.flush().unwrap();
        from_child.next().unwrap().unwrap().trim().parse().unwrap()
    };

    // `HL_WORKERS` (default 2): the checker's runtime's worker threads; 0 is a current-thread
    // runtime.
    let workers = env_or("HL_WORKERS", 2) as usize;
    let runtime = match workers {
        0 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(n);
            builder
        }
    }
    .enable_all()
    .build()
    .unwrap();
    let (rss_before, rss_after, cpu, wall, calls, load) = runtime.block_on(async {
        // Let the runtime's own allocations settle before the baseline.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let rss_before = rss_kib();
        let running = match mode {
            Mode::H2Floor => {
                let tasks: Vec<_> = (0..targets)
                    .map(|i| tokio::spawn(h2_target(uris[i % uris.len()].clone())))
                    .collect();
                tokio::time::sleep(Duration::from_secs(5)).await; // every connection made
                Running::H2(tasks)
            }
            Mode::Check | Mode::CheckChannel | Mode::Watch => {
                let probe_mode = if mode == Mode::Watch {
                    ProbeMode::Watch
                } else {
                    ProbeMode::Check
                };
                let checker = HealthChecker::builder()
                    .mode(probe_mode)
                    .interval(interval)
                    .jitter(0.1)
                    .timeout(Duration::from_secs(5))
                    .build()
                    .unwrap();
                let list: Vec<Target> = (0..targets)
                    .map(|i| {
                        let uri = &uris[i % uris.len()];
                        if mode == Mode::CheckChannel {
                            return Target::new(format!("t{i}"))
                                .endpoint(Endpoint::from_shared(uri.clone()).unwrap());
                        }
                        // A name of its own for each target (as each of 1,000 servers has),
                        // connected to its backend's address.
                        let address: std::net::SocketAddr =
                            uri.trim_start_matches("http://").parse().unwrap();
                        Target::new(format!("http://t{i}.bench:{}", address.port()))
                            .address(address)
                    })
                    .collect();
                checker.start(list).unwrap();
                assert!(
                    checker.wait_until_ready(Duration::from_secs(60)).await,
                    "all verdicts in"
                );
                tokio::time::sleep(Duration::from_secs(5)).await; // warm-up: every channel connected
                assert_eq!(healthy(&checker), targets);
                Running::Checker(checker)
            }
        };

        let rss_after = rss_kib();
        let calls_before = blocking(workers, &mut count);
        let load_before = loadavg();
        let cpu_before = cpu_time();
        let t0 = Instant::now();
        tokio::time::sleep(window).await;
        let cpu = cpu_time() - cpu_before;
        let wall = t0.elapsed();
        let load = format!("before: {load_before}; after: {}", loadavg());
        let calls = blocking(workers, &mut count) - calls_before;
        match running {
            Running::H2(tasks) => {
                for task in tasks {
                    assert!(!task.is_finished(), "an h2 target stopped");
                    task.abort();
                }
            }
            Running::Checker(checker) => {
                assert_eq!(healthy(&checker), targets, "every target stayed healthy");
                checker.stop().await;
            }
        }
        (rss_before, rss_after, cpu, wall, calls, load)
    });
    let _ = child.kill();
    let _ = child.wait();

    let share = cpu.as_secs_f64() / wall.as_secs_f64();
    let per_target = (rss_after.saturating_sub(rss_before)) as f64 / targets as f64;
    match mode {
        Mode::Check => println!(
            "{targets} targets, Check every 1 s (jitter 0.1), {BACKENDS} backends in another process, {}",
            runtime_name(workers)
        ),
        Mode::CheckChannel => println!(
            "{targets} targets, each given a tonic Endpoint (probes on tonic Channels), Check every 1 s (jitter 0.1), {BACKENDS} backends in another process, {}",
            runtime_name(workers)
        ),
        Mode::H2Floor => println!(
            "{targets} targets, no checker: a Check every 1 s on each of {targets} connections of the h2 crate (HEADERS and DATA together), on a 100 ms grid, {BACKENDS} backends in another process, {}",
            runtime_name(workers)
        ),
        Mode::Watch => println!(
            "{targets} targets, Watch, idle (a quiet stream verified with a Check every {} s), {BACKENDS} backends in another process, {}",
            interval.as_secs(),
            runtime_name(workers)
        ),
    }
    println!(
        "health calls in {:.1} s: {calls} ({:.0}/s); CPU {:.2} s = {:.2}% of one core; {:.1} µs CPU per call",
        wall.as_secs_f64(),
        calls as f64 / wall.as_secs_f64(),
        cpu.as_secs_f64(),
        share * 100.0,
        cpu.as_secs_f64() * 1e6 / calls.max(1) as f64,
    );
    println!(
        "RSS {rss_before} KiB -> {rss_after} KiB: {per_target:.1} KiB per target (task, status record, card, probe connection)"
    );
    println!("load average {load}");
    println!(
        "{}: targets={targets} cpu_percent={:.1} kib_per_target={:.1}",
        mode.label(),
        share * 100.0,
        per_target
    );
}

/// One target of the `h2floor` mode: a connection of the `h2` crate, then a `Check` every
/// second (starting at a random one of ten instants of a second: the checker's grid), its
/// `HEADERS` and its one `DATA` frame handed over together, the answer read whole.
async fn h2_target(uri: String) {
    use prost::Message;

    let parsed: http::Uri = uri.parse().unwrap();
    let stream = tokio::net::TcpStream::connect(parsed.authority().unwrap().as_str())
        .await
        .unwrap();
    stream.set_nodelay(true).unwrap();
    let (send, connection) = h2::client::handshake(stream).await.unwrap();
    tokio::spawn(connection);
    let message = tonic_health::pb::HealthCheckRequest::default().encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    let body = tonic::codegen::Bytes::from(framed);
    let path: http::Uri = format!("{uri}/grpc.health.v1.Health/Check")
        .parse()
        .unwrap();
    // One grid for all targets, as the checker has: every target starts on one of ten
    // instants of the same second.
    static ORIGIN: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(|| tokio::time::Instant::now() + Duration::from_secs(1));
    let slot = Duration::from_millis(100 * (rand_unit() * 10.0) as u64);
    let mut tick = tokio::time::interval_at(origin + slot, Duration::from_secs(1));
    let mut send = send.ready().await.unwrap();
    loop {
        tick.tick().await;
        let request = http::Request::builder()
            .method(http::Method::POST)
            .uri(path.clone())
            .header(http::header::TE, "trailers")
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header("grpc-timeout", "5000m")
            .body(())
            .unwrap();
        let (response, mut stream) = send.send_request(request, false).unwrap();
        stream.send_data(body.clone(), true).unwrap();
        let mut answer = response.await.unwrap().into_body();
        while let Some(chunk) = answer.data().await {
            let chunk = chunk.unwrap();
            let _ = answer.flow_control().release_capacity(chunk.len());
        }
        let trailers = answer.trailers().await.unwrap().expect("trailers");
        assert_eq!(trailers.get("grpc-status").unwrap(), "0");
        send = send.ready().await.unwrap();
    }
}

/// A number in [0, 1), different for every call.
fn rand_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

fn runtime_name(workers: usize) -> String {
    match workers {
        0 => "current-thread runtime".into(),
        n => format!("multi-thread runtime, {n} workers"),
    }
}

fn main() {
    if std::env::var("HL_BENCH_SERVERS").is_ok() {
        return servers();
    }
    if let Ok(mode) = std::env::var("HL_BENCH_MODE") {
        return measure(Mode::parse(&mode).expect("HL_BENCH_MODE is a mode of HL_MODES"));
    }
    // `cargo test --benches` runs this too: measure only under `cargo bench`.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let modes: Vec<Mode> = std::env::var("HL_MODES")
        .unwrap_or_else(|_| "watch,check".into())
        .split(',')
        .map(|m| Mode::parse(m).expect("HL_MODES lists watch, check, channel or h2floor"))
        .collect();
    let mut summaries = Vec::new();
    for mode in modes {
        let out = Command::new(std::env::current_exe().unwrap())
            .env("HL_BENCH_MODE", mode.name())
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        assert!(out.status.success(), "the {} run failed", mode.name());
        let text = String::from_utf8(out.stdout).unwrap();
        print!("{text}");
        println!();
        let prefix = format!("{}: ", mode.label());
        summaries.extend(
            text.lines()
                .filter(|l| l.starts_with(&prefix))
                .map(String::from),
        );
    }
    // The summary lines last, `checker: ...` at the very end.
    summaries.sort_by_key(|l| l.starts_with("checker: "));
    for line in summaries {
        println!("{line}");
    }
}

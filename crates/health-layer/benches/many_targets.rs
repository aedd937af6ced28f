//! A checker with 1,000 targets at a 1 s interval: CPU share and memory per target.
//!
//! The servers run in a child process (this binary again, with `HL_BENCH_SERVERS=1`): 10
//! test backends. The checker has 1,000 targets, 100 per backend, each with its own probe
//! channel (so 1,000 HTTP/2 connections, as 1,000 real endpoints would have). Only this
//! process is measured: CPU time from `/proc/self/stat` (user + system, all threads) over a
//! window after warm-up, and resident memory (`VmRSS`) before the checker and after it is warm.
//!
//! ```text
//! cargo bench -p health-layer --bench many_targets
//! HL_TARGETS=2000 HL_WINDOW_SECS=30 cargo bench -p health-layer --bench many_targets
//! ```

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use health_layer::{HealthChecker, Target};
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

/// The child: serve, print the URIs, answer `count` with the total health checks; exit on EOF.
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

fn main() {
    if std::env::var("HL_BENCH_SERVERS").is_ok() {
        return servers();
    }
    let targets = env_or("HL_TARGETS", 1_000) as usize;
    let window = Duration::from_secs(env_or("HL_WINDOW_SECS", 20));

    let mut child = Command::new(std::env::current_exe().unwrap())
        .env("HL_BENCH_SERVERS", "1")
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

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let load_before = loadavg();
    let (rss_before, rss_after, cpu, wall, checks) = runtime.block_on(async {
        // Let the runtime's own allocations settle before the baseline.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let rss_before = rss_kib();
        let checker = HealthChecker::builder()
            .interval(Duration::from_secs(1))
            .jitter(0.1)
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let list: Vec<Target> = (0..targets)
            .map(|i| {
                Target::new(format!("t{i}"))
                    .endpoint(Endpoint::from_shared(uris[i % uris.len()].clone()).unwrap())
            })
            .collect();
        checker.start(list).unwrap();
        assert!(
            checker.wait_until_ready(Duration::from_secs(60)).await,
            "all verdicts in"
        );
        tokio::time::sleep(Duration::from_secs(5)).await; // warm-up: every channel connected
        let healthy = checker
            .statuses()
            .iter()
            .filter(|s| s.verdict == health_layer::HealthVerdict::Healthy)
            .count();
        assert_eq!(healthy, targets);

        let rss_after = rss_kib();
        let checks_before = tokio::task::block_in_place(&mut count);
        let cpu_before = cpu_time();
        let t0 = Instant::now();
        tokio::time::sleep(window).await;
        let cpu = cpu_time() - cpu_before;
        let wall = t0.elapsed();
        let checks = tokio::task::block_in_place(&mut count) - checks_before;
        checker.stop().await;
        (rss_before, rss_after, cpu, wall, checks)
    });
    let _ = child.kill();
    let _ = child.wait();

    let share = cpu.as_secs_f64() / wall.as_secs_f64();
    println!(
        "{targets} targets, interval 1 s (jitter 0.1), Check mode, {BACKENDS} backends in another process"
    );
    println!(
        "checks in {:.1} s: {checks} ({:.0}/s); CPU {:.2} s = {:.1}% of one core; {:.1} µs CPU per check",
        wall.as_secs_f64(),
        checks as f64 / wall.as_secs_f64(),
        cpu.as_secs_f64(),
        share * 100.0,
        cpu.as_secs_f64() * 1e6 / checks.max(1) as f64,
    );
    println!(
        "RSS {} KiB -> {} KiB: {:.1} KiB per target (task, status record, card, probe channel and its HTTP/2 connection)",
        rss_before,
        rss_after,
        (rss_after.saturating_sub(rss_before)) as f64 / targets as f64
    );
    println!("load average before: {load_before}; after: {}", loadavg());
}

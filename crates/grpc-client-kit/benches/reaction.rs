//! Reaction: how fast the kit stops sending calls to a backend that goes away, and how many
//! calls fail on the way.
//!
//! Three in-process test backends on loopback; the backend under test is `b1`.
//!
//! 1. **Watch flip.** The kit in Watch mode under `--flip-callers` (8) concurrent callers. Each
//!    round sets `b1` NOT_SERVING and measures the time from the flip (just before the status
//!    is set) to the *start* of the last call that `b1` then answered — the last call the kit
//!    admitted to it. Then SERVING again, and the next round starts once `b1` gets calls again.
//!    A flip after which no call to `b1` started has no reaction to measure: it is counted
//!    (the "flips with no call after" column), not taken as a 0 µs sample. Flips go on until
//!    `--flips` (200) flips have a sample, so that the p99 is a percentile rather than the
//!    maximum (at most four times as many flips in all). The same flip under tonic's
//!    `balance_list` is shown for contrast (it ignores health).
//! 2. **Stop.** `b1` is stopped gracefully (`stop_graceful`: GOAWAY, in-flight calls drain,
//!    the port refuses new connections at once; what is still open after `--grace` is killed)
//!    or abruptly (`stop`: every connection reset at once, in-flight calls fail). One
//!    sequential caller, then 32 concurrent callers, call without pause from before the stop
//!    until `--observe` (1.5 s) after it. Counted per trial: failed calls, of which started
//!    before the stop (they were in flight when it came) and after it (new calls the client
//!    still sent to the dead backend), and the calls in flight to `b1` at the stop (started
//!    before, ended after, and received by `b1`) and — for an abrupt stop, which takes a
//!    moment to reset every connection — the calls in flight to `b1` at any time during the
//!    stop (received by `b1`, started before the stop ended, ended after it began). Which calls
//!    `b1` received is told by `b1` itself (every call carries an `x-call-id`, which the backend
//!    records), not by the call's outcome: a failed call counts as in flight only if it reached
//!    `b1`. Contenders: the kit in Watch mode, the
//!    kit in Check mode (`--check-interval`, 1 s), and tonic's `balance_list`. A fresh client
//!    per trial; `b1` is restarted between trials.
//!
//! Goals (issue 8): Watch flip to last admitted call within a millisecond; a sequential
//! caller loses 0 calls in Watch mode and at most 1 in Check mode; 32 concurrent callers lose
//! no more calls than were in flight to the backend.
//!
//! ```text
//! cargo bench -p grpc-client-kit --bench reaction
//! cargo bench -p grpc-client-kit --bench reaction -- --flips 200 --trials 10
//! ```
//!
//! Under `cargo test --benches` (no `--bench` argument) it runs a short smoke version.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{Args, UnaryCaller, balance_list, fmt_dur, loadavg, table};
use test_backends::{Backend, Backends};
use tonic::Code;

/// The backend that is flipped and stopped.
const VICTIM: usize = 1;

// ----- callers -----

/// One finished call.
#[derive(Debug, Clone)]
struct Record {
    /// Its `x-call-id`.
    id: u64,
    start: Instant,
    end: Instant,
    /// The answering backend's index, or the failure.
    outcome: Result<usize, (Code, String)>,
}

/// What caller tasks share with the driver.
struct Shared {
    stop: AtomicBool,
    base: Instant,
    /// Per backend: the start (ns after `base`) of the latest call it answered.
    last_start: [AtomicU64; 3],
    /// When the victim was flipped (ns after `base`; `u64::MAX`: no flip under way).
    flip_at: AtomicU64,
    /// Calls the victim answered that started after `flip_at`.
    late: AtomicU64,
    /// Every call, when the trial wants them.
    records: Option<Mutex<Vec<Record>>>,
    /// The next call's `x-call-id`.
    next_id: AtomicU64,
}

impl Shared {
    fn new(keep_records: bool) -> Arc<Self> {
        Arc::new(Self {
            stop: AtomicBool::new(false),
            base: Instant::now(),
            last_start: Default::default(),
            flip_at: AtomicU64::new(u64::MAX),
            late: AtomicU64::new(0),
            records: keep_records.then(|| Mutex::new(Vec::new())),
            next_id: AtomicU64::new(0),
        })
    }

    fn since_base(&self, t: Instant) -> u64 {
        t.duration_since(self.base).as_nanos() as u64
    }

    fn last_start(&self, backend: usize) -> Option<Instant> {
        match self.last_start[backend].load(Ordering::Acquire) {
            0 => None,
            ns => Some(self.base + Duration::from_nanos(ns)),
        }
    }
}

/// Calls back to back until `shared.stop`; every outcome is noted in `shared`.
async fn caller<C: UnaryCaller>(mut client: C, shared: Arc<Shared>) {
    let mut local = Vec::new();
    while !shared.stop.load(Ordering::Relaxed) {
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let mut request = tonic::Request::new(test_backends::pb::Ping::default());
        request.metadata_mut().insert(
            test_backends::CALL_ID_HEADER,
            tonic::metadata::MetadataValue::from(id),
        );
        let start = Instant::now();
        let outcome = client.unary(request).await;
        let end = Instant::now();
        let outcome = match outcome {
            Ok(pong) => {
                let i = backend_index(&pong.backend);
                let start_ns = shared.since_base(start).max(1);
                shared.last_start[i].fetch_max(start_ns, Ordering::AcqRel);
                if i == VICTIM && start_ns > shared.flip_at.load(Ordering::Acquire) {
                    shared.late.fetch_add(1, Ordering::Relaxed);
                }
                Ok(i)
            }
            Err(status) => Err((status.code(), status.message().to_string())),
        };
        if shared.records.is_some() {
            local.push(Record {
                id,
                start,
                end,
                outcome,
            });
        }
    }
    if let Some(records) = &shared.records {
        records.lock().unwrap().extend(local);
    }
}

fn backend_index(name: &str) -> usize {
    name.strip_prefix('b')
        .and_then(|n| n.parse().ok())
        .filter(|i: &usize| *i < 3)
        .unwrap_or_else(|| panic!("unexpected backend name {name:?}"))
}

/// Starts `n` caller tasks on clones of a client; returns their handles.
type Spawner = Box<dyn Fn(usize, Arc<Shared>) -> Vec<tokio::task::JoinHandle<()>> + Send + Sync>;

fn spawner<C: UnaryCaller>(client: C) -> Spawner {
    Box::new(move |n, shared| {
        (0..n)
            .map(|_| tokio::spawn(caller(client.clone(), shared.clone())))
            .collect()
    })
}

async fn join(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in tasks {
        t.await.expect("caller panicked");
    }
}

/// Waits (up to `limit`) until `backend` has answered a call that started after `after`.
async fn until_answered(shared: &Shared, backend: usize, after: Instant, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if shared.last_start(backend).is_some_and(|t| t > after) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    false
}

// ----- contenders -----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contender {
    KitWatch,
    KitCheck,
    BalanceList,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::KitWatch => "kit, Watch",
            Contender::KitCheck => "kit, Check",
            Contender::BalanceList => "tonic balance_list",
        }
    }
}

/// A client under test and what stops it.
struct Client {
    spawn: Spawner,
    shutdown: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

/// Builds a fresh client and waits until it is ready (every backend known healthy, for the
/// kit).
async fn client(which: Contender, uris: &[String], settings: &Settings) -> Client {
    match which {
        Contender::BalanceList => Client {
            spawn: spawner(balance_list(uris)),
            shutdown: None,
        },
        Contender::KitWatch => kit::client(uris, kit::Health::Watch).await,
        Contender::KitCheck => kit::client(uris, kit::Health::Check(settings.check_interval)).await,
    }
}

// ----- settings -----

struct Settings {
    flips: usize,
    flip_callers: usize,
    trials: usize,
    concurrent: usize,
    observe: Duration,
    lead: Duration,
    grace: Duration,
    check_interval: Duration,
    smoke: bool,
}

impl Settings {
    fn from_args() -> Self {
        let args = Args::from_env();
        let smoke = !args.is_bench();
        Self {
            flips: args.get("flips", "GCK_REACTION_FLIPS", if smoke { 5 } else { 200 }),
            flip_callers: args.get("flip-callers", "GCK_REACTION_FLIP_CALLERS", 8),
            trials: args.get("trials", "GCK_REACTION_TRIALS", if smoke { 1 } else { 5 }),
            concurrent: args.get("callers", "GCK_REACTION_CALLERS", 32),
            observe: args.secs(
                "observe",
                "GCK_REACTION_OBSERVE_SECS",
                if smoke { 0.6 } else { 1.5 },
            ),
            lead: args.secs(
                "lead",
                "GCK_REACTION_LEAD_SECS",
                if smoke { 0.1 } else { 0.3 },
            ),
            grace: args.secs(
                "grace",
                "GCK_REACTION_GRACE_SECS",
                if smoke { 0.2 } else { 0.5 },
            ),
            check_interval: args.secs("check-interval", "GCK_REACTION_CHECK_INTERVAL_SECS", 1.0),
            smoke,
        }
    }
}

// ----- 1. flips -----

struct FlipResult {
    /// Flip to the start of the last call the victim answered, for each flip after which one
    /// started.
    reaction: Vec<Duration>,
    /// Calls the victim answered that started after the flip, over all flips.
    late_calls: u64,
    /// Flips in all.
    flips: usize,
    /// Flips after which no call to the victim started (no sample).
    clean: usize,
}

async fn flips(
    which: Contender,
    backends: &Backends,
    uris: &[String],
    s: &Settings,
    n: usize,
) -> FlipResult {
    let client = client(which, uris, s).await;
    let shared = Shared::new(false);
    let tasks = (client.spawn)(s.flip_callers, shared.clone());
    let victim = &backends[VICTIM];
    let mut result = FlipResult {
        reaction: Vec::with_capacity(n),
        late_calls: 0,
        flips: 0,
        clean: 0,
    };
    // `n` samples: flips after which a call to the victim started (at most `4 n` flips).
    while result.reaction.len() < n && result.flips < 4 * n {
        result.flips += 1;
        // The victim must be in rotation before it is flipped.
        assert!(
            until_answered(&shared, VICTIM, Instant::now(), Duration::from_secs(10)).await,
            "{}: {} got no call within 10 s",
            which.name(),
            victim.name()
        );
        shared.late.store(0, Ordering::Release);
        let flip = Instant::now();
        shared
            .flip_at
            .store(shared.since_base(flip), Ordering::Release);
        victim.set_serving(false).await;
        // Calls admitted just before the gate shut answer within a few ms; wait well past
        // that, then read the start of the last call the victim answered.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let last = shared.last_start(VICTIM).expect("answered before");
        if last > flip {
            result.reaction.push(last - flip);
        } else {
            result.clean += 1;
        }
        shared.flip_at.store(u64::MAX, Ordering::Release);
        result.late_calls += shared.late.load(Ordering::Acquire);
        victim.set_serving(true).await;
    }
    shared.stop.store(true, Ordering::Relaxed);
    join(tasks).await;
    if let Some(shutdown) = client.shutdown {
        shutdown.await;
    }
    result
}

// ----- 2. stops -----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopKind {
    Graceful,
    Abrupt,
}

#[derive(Debug, Default, Clone)]
struct TrialResult {
    calls: u64,
    failed: u64,
    failed_in_flight: u64,
    failed_new: u64,
    in_flight_to_victim: u64,
    /// Abrupt stops: calls to `b1` (answered or failed) in flight at any moment between the
    /// start of the stop and its end (every connection reset, the port refusing); graceful
    /// stops: the same as `in_flight_to_victim`.
    in_flight_during_stop: u64,
    /// How long the stop took (abrupt: until every connection was reset).
    stop_took: Duration,
    /// The first few failures: (ms after the stop the call started, code, message).
    examples: Vec<(f64, Code, String)>,
}

async fn stop_trial(
    which: Contender,
    kind: StopKind,
    callers: usize,
    backends: &Backends,
    uris: &[String],
    s: &Settings,
) -> TrialResult {
    let victim: Backend = backends[VICTIM].clone();
    let client = client(which, uris, s).await;
    // Warm: every backend answers before the clock starts.
    let warm = Shared::new(false);
    let tasks = (client.spawn)(callers, warm.clone());
    for i in 0..3 {
        assert!(
            until_answered(&warm, i, warm.base, Duration::from_secs(10)).await,
            "{}: b{i} got no call within 10 s of the client being ready",
            which.name()
        );
    }
    warm.stop.store(true, Ordering::Relaxed);
    join(tasks).await;

    let shared = Shared::new(true);
    victim.record_call_ids();
    let tasks = (client.spawn)(callers, shared.clone());
    tokio::time::sleep(s.lead).await;
    let stop_at = Instant::now();
    let stopper = {
        let victim = victim.clone();
        let grace = s.grace;
        tokio::spawn(async move {
            match kind {
                StopKind::Graceful => {
                    victim.stop_graceful(grace).await;
                    stop_at
                }
                StopKind::Abrupt => {
                    victim.stop().await;
                    Instant::now()
                }
            }
        })
    };
    tokio::time::sleep(s.observe).await;
    shared.stop.store(true, Ordering::Relaxed);
    join(tasks).await;
    let gone_at = stopper.await.expect("stopper");
    if let Some(shutdown) = client.shutdown {
        shutdown.await;
    }
    victim.restart().await.expect("restart b1");

    let records = shared.records.as_ref().unwrap().lock().unwrap();
    let mut r = TrialResult {
        calls: records.len() as u64,
        stop_took: gone_at - stop_at,
        ..TrialResult::default()
    };
    // The calls the victim received, as it tells (whatever became of them).
    let reached: std::collections::HashSet<u64> = victim.take_call_ids().into_iter().collect();
    for rec in records.iter() {
        let to_victim = reached.contains(&rec.id);
        if to_victim && rec.start < stop_at && rec.end > stop_at {
            r.in_flight_to_victim += 1;
        }
        if to_victim && rec.start < gone_at && rec.end > stop_at {
            r.in_flight_during_stop += 1;
        }
        if let Err((code, message)) = &rec.outcome {
            r.failed += 1;
            if rec.start < stop_at {
                r.failed_in_flight += 1;
            } else {
                r.failed_new += 1;
            }
            if r.examples.len() < 3 {
                let after = rec.start.saturating_duration_since(stop_at).as_secs_f64() * 1e3
                    - stop_at.saturating_duration_since(rec.start).as_secs_f64() * 1e3;
                r.examples.push((after, *code, message.clone()));
            }
        }
    }
    r
}

fn main() {
    let s = Settings::from_args();
    let server_rt = support::runtime(support::SERVER_THREADS, 2);
    let client_rt = support::runtime(support::CLIENT_THREADS, 2);
    let backends = server_rt.block_on(Backends::start(3)).expect("backends");
    let uris = backends.uris();
    let load_before = loadavg();

    // 1. Watch flips.
    let mut flip_rows = Vec::new();
    for (which, n) in [
        (Contender::KitWatch, s.flips),
        (Contender::BalanceList, s.flips.min(5)),
    ] {
        let _guard = client_rt.enter();
        let mut r = client_rt.block_on(flips(which, &backends, &uris, &s, n));
        r.reaction.sort();
        let pct = |p: f64| {
            if r.reaction.is_empty() {
                return "-".to_string();
            }
            let i = ((r.reaction.len() as f64 - 1.0) * p).round() as usize;
            fmt_dur(r.reaction[i])
        };
        flip_rows.push(vec![
            which.name().to_string(),
            r.flips.to_string(),
            r.reaction.len().to_string(),
            pct(0.50),
            pct(0.90),
            pct(0.99),
            pct(1.0),
            format!("{}/{}", r.clean, r.flips),
            r.late_calls.to_string(),
        ]);
    }
    println!(
        "\n1. NOT_SERVING flip -> start of the last call the flipped backend answered \
         ({} callers, 3 backends; the 200 ms after each flip are watched; a sample per flip \
         after which a call to b1 started)",
        s.flip_callers
    );
    print!(
        "{}",
        table(
            &[
                "client",
                "flips",
                "samples",
                "p50",
                "p90",
                "p99",
                "max",
                "flips with no call after",
                "calls to b1 after the flips"
            ],
            &flip_rows
        )
    );

    // 2. Stops.
    let contenders = [
        Contender::KitWatch,
        Contender::KitCheck,
        Contender::BalanceList,
    ];
    let mut rows = Vec::new();
    let mut examples = Vec::new();
    for kind in [StopKind::Graceful, StopKind::Abrupt] {
        for callers in [1, s.concurrent] {
            for which in contenders {
                let mut trials = Vec::new();
                for _ in 0..s.trials {
                    let _guard = client_rt.enter();
                    trials.push(
                        client_rt.block_on(stop_trial(which, kind, callers, &backends, &uris, &s)),
                    );
                }
                let sum = |f: fn(&TrialResult) -> u64| trials.iter().map(f).sum::<u64>();
                let max = |f: fn(&TrialResult) -> u64| trials.iter().map(f).max().unwrap_or(0);
                let per = |f: fn(&TrialResult) -> u64| {
                    format!(
                        "{:.1} (max {})",
                        sum(f) as f64 / trials.len() as f64,
                        max(f)
                    )
                };
                rows.push(vec![
                    format!("{kind:?}"),
                    callers.to_string(),
                    which.name().to_string(),
                    trials.len().to_string(),
                    per(|t| t.failed),
                    per(|t| t.failed_in_flight),
                    per(|t| t.failed_new),
                    per(|t| t.in_flight_to_victim),
                    trials
                        .iter()
                        .filter(|t| t.failed > t.in_flight_to_victim)
                        .count()
                        .to_string(),
                    per(|t| t.in_flight_during_stop),
                    trials
                        .iter()
                        .filter(|t| t.failed > t.in_flight_during_stop)
                        .count()
                        .to_string(),
                    fmt_dur(
                        trials.iter().map(|t| t.stop_took).sum::<Duration>() / trials.len() as u32,
                    ),
                    format!("{:.0}", sum(|t| t.calls) as f64 / trials.len() as f64),
                ]);
                if let Some(t) = trials.iter().find(|t| !t.examples.is_empty()) {
                    let shown: Vec<String> = t
                        .examples
                        .iter()
                        .map(|(ms, code, message)| format!("{ms:+.2} ms {code:?} {message:?}"))
                        .collect();
                    examples.push(format!(
                        "{kind:?}, {callers} caller(s), {}: {}",
                        which.name(),
                        shown.join("; ")
                    ));
                }
            }
        }
    }
    println!(
        "\n2. b1 stopped (graceful: GOAWAY, {} grace; abrupt: RST); calls made from {} before \
         to {} after the stop; per trial: mean (max)",
        fmt_dur(s.grace),
        fmt_dur(s.lead),
        fmt_dur(s.observe)
    );
    print!(
        "{}",
        table(
            &[
                "stop",
                "callers",
                "client",
                "trials",
                "failed",
                "of which in flight",
                "of which new",
                "in flight to b1 (received by b1)",
                "trials failed > in flight",
                "in flight during stop",
                "trials failed > that",
                "stop took",
                "calls",
            ],
            &rows
        )
    );
    println!("failure examples (when the call started, relative to the stop; code; message):");
    for e in &examples {
        println!("  {e}");
    }
    println!(
        "load average before: {load_before}; after: {}{}",
        loadavg(),
        if s.smoke { " [smoke run]" } else { "" }
    );
    client_rt.shutdown_timeout(Duration::from_secs(1));
    server_rt.block_on(async {
        for b in backends.iter() {
            b.stop().await;
        }
    });
}

/// The kit under test.
mod kit {
    use super::*;
    use grpc_client_kit::Kit;
    use grpc_client_kit::health::{HealthConfig, ProbeMode};
    use test_backends::pb::test_service_client::TestServiceClient;

    /// Health mode.
    #[derive(Debug, Clone, Copy)]
    pub(super) enum Health {
        Watch,
        Check(Duration),
    }

    /// A fresh kit over `uris` (round-robin; quarantine and breaker at their defaults), ready:
    /// every target has a health verdict.
    pub(super) async fn client(uris: &[String], health: Health) -> Client {
        let config = match health {
            Health::Watch => HealthConfig::new().mode(ProbeMode::Watch),
            Health::Check(interval) => HealthConfig::new()
                .mode(ProbeMode::Check)
                .interval(interval),
        };
        let kit = Kit::builder()
            .targets(uris.iter().cloned())
            .health(config)
            .build()
            .expect("kit");
        assert!(
            kit.wait_until_ready(Duration::from_secs(10)).await,
            "kit ready"
        );
        let client = TestServiceClient::new(kit.channel());
        Client {
            spawn: spawner(client),
            shutdown: Some(Box::pin(async move { kit.shutdown().await })),
        }
    }
}

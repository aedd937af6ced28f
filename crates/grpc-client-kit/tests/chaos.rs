//! Chaos: four real backends, 32 concurrent callers with deadlines, and a random fault about
//! every 500 ms — stop and restart, black hole, NOT_SERVING flip, injected errors, added delay
//! — against the whole kit (health in Watch mode, quarantine, breaker, round-robin). Bounded:
//! about 20 s.
//!
//! The kit's penalties are scaled to the chaos tempo (quarantine 0.5–1 s, breaker open
//! 0.5–1 s, Watch re-subscription 0.2–0.8 s) instead of the production defaults (5 s and
//! more), so that the time a fault may still cost after it is cleared stays short and the
//! windows below stay tight. Every window is a constant derived from that configuration.
//!
//! Invariants checked:
//!
//! 1. **No panic** anywhere in the process (a panic hook counts them: callers, the kit's own
//!    tasks, the backends), and every caller and fault task ends.
//! 2. **Every call ends by its deadline** ([`CALL_DEADLINE`], sent as `grpc-timeout`) plus
//!    [`DEADLINE_SLACK`] — time spent inside the kit before the channel (where tonic enforces
//!    the deadline) included.
//! 3. **Failures only inside fault windows.** A fault's window runs from the moment it is
//!    applied to the moment it is cleared, plus a tail. A failed call must have been in flight
//!    at some moment of a window that explains it (see [`unexplained`]):
//!    * a failure on one backend (transport error, deadline, injected error: the message names
//!      it) needs a *disruptive* fault of that backend — stop, black hole, errors, delay; never
//!      a NOT_SERVING flip, whose backend still answers — with tail [`RECOVERY`];
//!    * the kit refusing the call because nothing is eligible (the message names every
//!      target) needs every target to be out for a cause: a fault of any kind, with tail
//!      [`PENALTY`] (the longest quarantine, open breaker or Watch backoff a fault leaves);
//!    * a failure naming no backend needs some disruptive fault, with tail [`RECOVERY`].
//! 4. **Recovery.** From [`SETTLED_AFTER`] (2 s) after the last fault is cleared, every call
//!    succeeds (and there are many such calls), and every backend answers some of them: each
//!    is back in rotation ([`PENALTY`] is shorter than [`SETTLED_AFTER`]).
//! 5. **No leak.** After the kit and every client are dropped, the runtime's live task count
//!    and the process's open sockets (`/proc/self/fd` entries that are sockets) return to what
//!    they were before the kit was built (bounded polling, [`LEAK_WAIT`]).
//!
//! The fault schedule comes from a seeded RNG: `GCK_CHAOS_SEED=<u64>` replays or varies it
//! (the seed is printed; the timing of the calls is real, so a replay is close, not exact).
//! `GCK_CHAOS_VERBOSE=1` prints every failure. The test is alone in its binary because it
//! counts the process's sockets.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use grpc_client_kit::Kit;
use grpc_client_kit::breaker::BreakerConfig;
use grpc_client_kit::health::{Backoff, HealthConfig, ProbeMode};
use grpc_client_kit::quarantine::QuarantineConfig;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::{Backend, Backends};
use tonic::Code;

// ----- the configuration the invariants are derived from -----

/// Backends behind the kit.
const BACKENDS: usize = 4;
/// Concurrent callers.
const CALLERS: usize = 32;
/// Every call's deadline (`grpc-timeout`).
const CALL_DEADLINE: Duration = Duration::from_millis(1_000);
/// How late after its deadline a call may end: timer and scheduling lag on a loaded 2-core
/// machine (the runtime's workers are shared with the backends and the fault driver).
const DEADLINE_SLACK: Duration = Duration::from_millis(300);
/// The health probe's timeout (Watch: connecting and the first message).
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Watch re-subscription backoff after a broken stream: 200 ms × 1.6 per retry, at most
/// [`WATCH_MAX`], ± 20 %.
const WATCH_INITIAL: Duration = Duration::from_millis(200);
const WATCH_MAX: Duration = Duration::from_millis(800);
const WATCH_JITTER: f64 = 0.2;
/// Quarantine: 500 ms, repeated ones longer, at most [`QUARANTINE_MAX`].
const QUARANTINE: Duration = Duration::from_millis(500);
const QUARANTINE_MAX: Duration = Duration::from_secs(1);
/// Breaker (5 consecutive failures): open 500 ms, repeated trips longer, at most
/// [`BREAKER_MAX`] (jitter never exceeds the cap).
const BREAKER_OPEN: Duration = Duration::from_millis(500);
const BREAKER_MAX: Duration = Duration::from_secs(1);
/// Mean time between two faults; each gap is uniform in [0.5, 1.5] × this.
const FAULT_EVERY: Duration = Duration::from_millis(500);
/// How long a fault lasts: uniform in this range.
const FAULT_MIN: Duration = Duration::from_millis(200);
const FAULT_MAX: Duration = Duration::from_millis(900);
/// At most this many backends are faulted at once (so that at least two always serve).
const MAX_FAULTED: usize = 2;
/// How long faults keep coming.
const FAULT_PHASE: Duration = Duration::from_secs(12);
/// Scheduling lag on a loaded 2-core machine: between a fault being applied or cleared and
/// every task having seen it.
const LAG: Duration = Duration::from_millis(300);
/// How long after a fault is cleared a call *routed to that backend* may still fail because of
/// it: the lag. (The kit routes to it again only once its probe saw SERVING, which needs the
/// backend back; a call in flight across the clearing is covered by the window itself.)
const RECOVERY: Duration = LAG;
/// How long after a fault is cleared the kit may still *refuse* its backend: the longest
/// penalty a fault leaves behind — a quarantine ([`QUARANTINE_MAX`]), an open breaker
/// ([`BREAKER_MAX`]), or a Watch stream waiting to re-subscribe (one backoff, at most
/// [`WATCH_MAX`] + jitter, plus a probe that hung on a black hole until [`PROBE_TIMEOUT`]) —
/// plus the lag.
const PENALTY: Duration = Duration::from_millis(
    max_ms(
        max_ms(QUARANTINE_MAX.as_millis(), BREAKER_MAX.as_millis()),
        (WATCH_MAX.as_millis() * 12 / 10) + PROBE_TIMEOUT.as_millis(),
    ) as u64
        + LAG.as_millis() as u64,
);

const fn max_ms(a: u128, b: u128) -> u128 {
    if a > b { a } else { b }
}

/// From this long after the last fault is cleared, every call must succeed (issue 8).
const SETTLED_AFTER: Duration = Duration::from_secs(2);
const _: () = assert!(PENALTY.as_millis() < SETTLED_AFTER.as_millis());
/// Load keeps running this long after the last fault is cleared.
const QUIET_PHASE: Duration = Duration::from_secs(4);
/// Upper bound on the wait for tasks and sockets to return to their baseline.
const LEAK_WAIT: Duration = Duration::from_secs(10);
/// A call that has not ended this long after its deadline is abandoned (and reported).
const HANG_LIMIT: Duration = Duration::from_secs(5);

// ----- faults -----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FaultKind {
    /// `stop()` (RST), later `restart()`.
    Stop,
    /// `black_hole()` (accepts, never answers), later `restart()`.
    BlackHole,
    /// Health NOT_SERVING, later SERVING. Not disruptive: the backend still answers.
    NotServing,
    /// Every call fails with this code, later none.
    Errors(Code),
    /// Every call is delayed this long, later not.
    Delay(Duration),
}

impl FaultKind {
    fn disruptive(self) -> bool {
        !matches!(self, FaultKind::NotServing)
    }

    async fn apply(self, b: &Backend) {
        match self {
            FaultKind::Stop => b.stop().await,
            FaultKind::BlackHole => b.black_hole().await.expect("black hole"),
            FaultKind::NotServing => b.set_serving(false).await,
            FaultKind::Errors(code) => b.fail_always(Some(code)),
            FaultKind::Delay(d) => b.set_delay(d),
        }
    }

    async fn clear(self, b: &Backend) {
        match self {
            FaultKind::Stop | FaultKind::BlackHole => b.restart().await.expect("restart"),
            FaultKind::NotServing => b.set_serving(true).await,
            FaultKind::Errors(_) => b.fail_always(None),
            FaultKind::Delay(_) => b.set_delay(Duration::ZERO),
        }
    }
}

/// One fault, as it happened.
#[derive(Debug, Clone)]
struct Fault {
    backend: usize,
    kind: FaultKind,
    /// Just before it was applied.
    start: Instant,
    /// Just after it was cleared.
    end: Instant,
}

impl Fault {
    /// Whether a call in flight over `[start, end]` overlaps `[fault start, fault end + tail]`.
    fn overlaps(&self, start: Instant, end: Instant, tail: Duration) -> bool {
        start <= self.end + tail && end >= self.start
    }

    /// Whether this fault explains a call failing *on its backend* (a transport error, a
    /// deadline, an injected error): only disruptive faults, until [`RECOVERY`] after.
    fn explains_failure(&self, start: Instant, end: Instant) -> bool {
        self.kind.disruptive() && self.overlaps(start, end, RECOVERY)
    }

    /// Whether this fault explains the kit *refusing* its backend (not eligible): any fault,
    /// NOT_SERVING included, until the penalty it leaves behind has run out.
    fn explains_refusal(&self, start: Instant, end: Instant) -> bool {
        let tail = if self.kind.disruptive() { PENALTY } else { LAG };
        self.overlaps(start, end, tail)
    }
}

/// SplitMix64: a small seeded generator (the schedule only needs to be reproducible).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in `[lo, hi]`.
    fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = (hi - lo).as_micros() as u64;
        lo + Duration::from_micros(self.below(span + 1))
    }

    fn kind(&mut self) -> FaultKind {
        match self.below(5) {
            0 => FaultKind::Stop,
            1 => FaultKind::BlackHole,
            2 => FaultKind::NotServing,
            3 => FaultKind::Errors(if self.below(2) == 0 {
                Code::Unavailable
            } else {
                Code::Internal
            }),
            _ => FaultKind::Delay(if self.below(2) == 0 {
                // Slow but within the deadline: must not fail anything.
                Duration::from_millis(100)
            } else {
                // Past the deadline: calls there fail with DEADLINE_EXCEEDED.
                CALL_DEADLINE * 2
            }),
        }
    }
}

/// Applies faults until `phase` has passed; returns them all, cleared.
async fn drive_faults(backends: Backends, seed: u64, phase: Duration) -> Vec<Fault> {
    let mut rng = Rng(seed);
    let begin = Instant::now();
    let faulted: Arc<Mutex<Vec<bool>>> = Arc::new(Mutex::new(vec![false; backends.len()]));
    let mut running = Vec::new();
    while begin.elapsed() < phase {
        tokio::time::sleep(rng.between(FAULT_EVERY / 2, FAULT_EVERY * 3 / 2)).await;
        let free: Vec<usize> = {
            let f = faulted.lock().unwrap();
            if f.iter().filter(|x| **x).count() >= MAX_FAULTED {
                continue;
            }
            (0..f.len()).filter(|i| !f[*i]).collect()
        };
        let backend = free[rng.below(free.len() as u64) as usize];
        let kind = rng.kind();
        let hold = rng.between(FAULT_MIN, FAULT_MAX);
        faulted.lock().unwrap()[backend] = true;
        let b = backends[backend].clone();
        let faulted = faulted.clone();
        running.push(tokio::spawn(async move {
            let start = Instant::now();
            kind.apply(&b).await;
            tokio::time::sleep(hold).await;
            kind.clear(&b).await;
            let end = Instant::now();
            faulted.lock().unwrap()[backend] = false;
            Fault {
                backend,
                kind,
                start,
                end,
            }
        }));
    }
    let mut faults = Vec::new();
    for t in running {
        faults.push(t.await.expect("fault task panicked"));
    }
    faults
}

// ----- calls -----

#[derive(Debug, Clone)]
struct Call {
    start: Instant,
    end: Instant,
    /// The answering backend, or the failure (`None` code: abandoned after [`HANG_LIMIT`]).
    outcome: Result<usize, (Option<Code>, String)>,
}

/// Calls back to back, each with [`CALL_DEADLINE`], until `until`.
async fn caller<T>(mut client: TestServiceClient<T>, until: Instant) -> Vec<Call>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: http_body::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut calls = Vec::new();
    while Instant::now() < until {
        let mut request = tonic::Request::new(Ping::default());
        request.set_timeout(CALL_DEADLINE);
        let start = Instant::now();
        let outcome = tokio::time::timeout(CALL_DEADLINE + HANG_LIMIT, client.unary(request)).await;
        let end = Instant::now();
        let outcome = match outcome {
            Ok(Ok(pong)) => Ok(backend_index(&pong.get_ref().backend)),
            Ok(Err(status)) => Err((Some(status.code()), status.message().to_string())),
            Err(_) => Err((None, "no answer (abandoned by the test)".to_string())),
        };
        calls.push(Call {
            start,
            end,
            outcome,
        });
    }
    calls
}

fn backend_index(name: &str) -> usize {
    name.strip_prefix('b')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected backend name {name:?}"))
}

/// The backends a failure message names (`b2: ...`, or an address of one).
fn named_backends(message: &str, backends: &Backends) -> Vec<usize> {
    backends
        .iter()
        .enumerate()
        .filter(|(_, b)| {
            let addr = b.addr().to_string();
            message.contains(&addr) || message.starts_with(&format!("{}:", b.name()))
        })
        .map(|(i, _)| i)
        .collect()
}

/// Why a failed call is not explained by the faults, or `None` when it is.
///
/// * A failure that names several backends is the kit refusing the call (nothing eligible):
///   every backend it names must have been out for a cause — a fault of any kind, or the
///   penalty a disruptive one leaves behind ([`PENALTY`]).
/// * A failure that names one backend (a transport error, a deadline, an injected error) must
///   fall in a disruptive fault of that backend, or [`RECOVERY`] after it.
/// * A failure that names none (tonic's own `Timeout expired`) must fall in some disruptive
///   fault's window, or [`RECOVERY`] after it.
fn unexplained(c: &Call, message: &str, faults: &[Fault], backends: &Backends) -> Option<String> {
    let named = named_backends(message, backends);
    match named.len() {
        0 => (!faults.iter().any(|f| f.explains_failure(c.start, c.end)))
            .then(|| "outside every disruptive fault window".to_string()),
        1 => (!faults
            .iter()
            .any(|f| f.backend == named[0] && f.explains_failure(c.start, c.end)))
        .then(|| format!("outside every disruptive fault window of b{}", named[0])),
        _ => {
            let unexcused: Vec<usize> = named
                .iter()
                .copied()
                .filter(|b| {
                    !faults
                        .iter()
                        .any(|f| f.backend == *b && f.explains_refusal(c.start, c.end))
                })
                .collect();
            (!unexcused.is_empty())
                .then(|| format!("refusing {unexcused:?}, which had no fault nor penalty then"))
        }
    }
}

// ----- leak accounting -----

fn open_sockets() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"))
        })
        .count()
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        previous(info);
    }));
}

// ----- the test -----

fn seed() -> u64 {
    std::env::var("GCK_CHAOS_SEED")
        .ok()
        .map(|s| s.parse().expect("GCK_CHAOS_SEED must be a u64"))
        .unwrap_or(0x00C0_FFEE_0008)
}

/// A time relative to the start of the run, for messages.
fn at(t: Instant, t0: Instant) -> String {
    if t >= t0 {
        format!("+{:.3}s", (t - t0).as_secs_f64())
    } else {
        format!("-{:.3}s", (t0 - t).as_secs_f64())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_under_load() {
    count_panics();
    let seed = seed();
    println!("chaos seed: {seed} (set GCK_CHAOS_SEED to replay or vary the schedule)");

    let backends = Backends::start(BACKENDS).await.expect("backends");
    let uris = backends.uris();
    // Baseline: the backends are up and idle; nothing of the kit exists yet.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let tasks_before = alive_tasks();
    let sockets_before = open_sockets();

    let kit = Kit::builder()
        .targets(uris.clone())
        .health(
            HealthConfig::new()
                .mode(ProbeMode::Watch)
                .timeout(PROBE_TIMEOUT)
                .watch_backoff(Backoff {
                    initial: WATCH_INITIAL,
                    multiplier: 1.6,
                    jitter: WATCH_JITTER,
                    max: WATCH_MAX,
                }),
        )
        .quarantine(
            QuarantineConfig::default()
                .duration(QUARANTINE)
                .max_duration(QUARANTINE_MAX),
        )
        .breaker(
            BreakerConfig::default()
                .open_base(BREAKER_OPEN)
                .open_max(BREAKER_MAX),
        )
        .build()
        .expect("kit");
    assert!(
        kit.wait_until_ready(Duration::from_secs(10)).await,
        "every target has a verdict"
    );

    let t0 = Instant::now();
    let load_until = t0 + FAULT_PHASE + FAULT_MAX + QUIET_PHASE + Duration::from_millis(500);
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| tokio::spawn(caller(TestServiceClient::new(kit.channel()), load_until)))
        .collect();
    // The first second is fault-free: everything must succeed there too.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let faults = drive_faults(backends.clone(), seed, FAULT_PHASE).await;
    let last_cleared = faults.iter().map(|f| f.end).max().expect("some faults");

    let mut calls = Vec::new();
    for c in callers {
        calls.extend(c.await.expect("caller task panicked"));
    }
    assert!(
        Instant::now() >= last_cleared + SETTLED_AFTER + Duration::from_secs(1),
        "the load outlived the last fault by enough to check recovery"
    );

    // ----- report -----
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for f in &faults {
        *by_kind.entry(format!("{:?}", f.kind)).or_default() += 1;
    }
    let failed = calls.iter().filter(|c| c.outcome.is_err()).count();
    let mut per_backend = [0usize; BACKENDS];
    for c in &calls {
        if let Ok(i) = c.outcome {
            per_backend[i] += 1;
        }
    }
    println!(
        "{} faults {:?}; {} calls, {} failed; answered per backend {:?}",
        faults.len(),
        by_kind,
        calls.len(),
        failed,
        per_backend
    );
    let timeline: Vec<String> = faults
        .iter()
        .map(|f| {
            format!(
                "b{} {:?} {}..{}",
                f.backend,
                f.kind,
                at(f.start, t0),
                at(f.end, t0)
            )
        })
        .collect();

    let mut violations = Vec::new();
    // 1. Panics (callers and fault tasks were joined above: a panic there already failed).
    let panics = PANICS.load(Ordering::SeqCst);
    if panics > 0 {
        violations.push(format!("{panics} panic(s) in the process (see stderr)"));
    }
    // 2, 3, 4: every call.
    let verbose = std::env::var_os("GCK_CHAOS_VERBOSE").is_some();
    let mut settled_calls = 0;
    let mut settled_per_backend = [0usize; BACKENDS];
    let mut codes: BTreeMap<String, usize> = BTreeMap::new();
    for c in &calls {
        let took = c.end - c.start;
        if took > CALL_DEADLINE + DEADLINE_SLACK {
            violations.push(format!(
                "call {}..{} took {:?}, past its deadline {:?} + slack {:?}: {:?}",
                at(c.start, t0),
                at(c.end, t0),
                took,
                CALL_DEADLINE,
                DEADLINE_SLACK,
                c.outcome
            ));
        }
        let settled = c.start >= last_cleared + SETTLED_AFTER;
        if settled {
            settled_calls += 1;
            if let Ok(i) = c.outcome {
                settled_per_backend[i] += 1;
            }
        }
        let Err((code, message)) = &c.outcome else {
            continue;
        };
        *codes.entry(format!("{code:?}")).or_default() += 1;
        if settled {
            violations.push(format!(
                "call {}..{} failed {} after the last fault was cleared: {code:?} {message}",
                at(c.start, t0),
                at(c.end, t0),
                at(c.start, last_cleared),
            ));
        }
        if verbose {
            // The faults around the call, each with when the call started relative to it.
            let around: Vec<String> = faults
                .iter()
                .filter(|f| f.overlaps(c.start, c.end, PENALTY))
                .map(|f| format!("b{} {:?} {}", f.backend, f.kind, at(c.start, f.start)))
                .collect();
            println!(
                "failed {}..{} {code:?} {message:.200} | call started vs faults: {around:?}",
                at(c.start, t0),
                at(c.end, t0),
            );
        }
        if let Some(why) = unexplained(c, message, &faults, &backends) {
            violations.push(format!(
                "call {}..{} failed {why}: {code:?} {message}",
                at(c.start, t0),
                at(c.end, t0),
            ));
        }
    }
    println!(
        "failures by code: {codes:?}; calls after settling: {settled_calls}, answered per \
         backend {settled_per_backend:?}"
    );
    // Every backend is back in rotation by then: its penalties ran out (PENALTY < SETTLED_AFTER).
    for (i, n) in settled_per_backend.iter().enumerate() {
        if *n == 0 {
            violations.push(format!(
                "b{i} answered no call from {SETTLED_AFTER:?} after the last fault: not back in \
                 rotation"
            ));
        }
    }
    if settled_calls < 100 {
        violations.push(format!(
            "only {settled_calls} calls started {SETTLED_AFTER:?} after the last fault: \
             recovery was not exercised"
        ));
    }

    // 5. Leaks: drop the kit and every channel, then wait (bounded) for the baseline.
    drop(kit);
    let deadline = Instant::now() + LEAK_WAIT;
    let (mut tasks_now, mut sockets_now);
    loop {
        tasks_now = alive_tasks();
        sockets_now = open_sockets();
        if (tasks_now <= tasks_before && sockets_now <= sockets_before)
            || Instant::now() >= deadline
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if tasks_now > tasks_before {
        violations.push(format!(
            "live tasks did not return to the baseline within {LEAK_WAIT:?}: {tasks_before} \
             before the kit, {tasks_now} after it was dropped"
        ));
    }
    if sockets_now > sockets_before {
        violations.push(format!(
            "open sockets did not return to the baseline within {LEAK_WAIT:?}: \
             {sockets_before} before the kit, {sockets_now} after it was dropped"
        ));
    }
    println!(
        "tasks: {tasks_before} before, {tasks_now} after; sockets: {sockets_before} before, \
         {sockets_now} after"
    );

    if !violations.is_empty() {
        let shown: Vec<_> = violations.iter().take(30).collect();
        panic!(
            "{} invariant violation(s) (seed {seed}; showing {}):\n  {}\nfault timeline:\n  {}",
            violations.len(),
            shown.len(),
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n  "),
            timeline.join("\n  ")
        );
    }
    for b in backends.iter() {
        b.stop().await;
    }
}

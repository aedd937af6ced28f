//! Chaos: four real backends (two of them behind a proxy that can freeze), 32 concurrent unary
//! callers and 2 client-stream callers with deadlines, and a random fault about every 500 ms —
//! stop and restart, black hole, an address that drops SYNs, an HTML page where gRPC should be,
//! a frozen connection, NOT_SERVING flip, injected errors, added delay, a long server stream
//! holding a half-open breaker's permit — against the whole kit (health in Watch mode,
//! quarantine, breaker, round-robin). Bounded: about 20 s.
//!
//! The kit's penalties are scaled to the chaos tempo (quarantine 0.5–1 s, breaker open
//! 0.5–1 s, Watch re-subscription 0.2–0.8 s) instead of the production defaults (5 s and
//! more), so that the time a fault may still cost after it is cleared stays short and the
//! windows below stay tight. Every window is a constant derived from that configuration.
//!
//! The faults ([`FaultKind`]), each on one backend, at most [`MAX_FAULTED`] at once:
//!
//! * **stop** (RST, port closed), **black hole** (accepts, never answers), **SYN drop** (a
//!   listener whose accept queue is full: connects hang), **HTML** (HTTP 200 `text/html` for
//!   every request, as a misrouted proxy answers) — each on the backend's own port, then the
//!   backend restarted;
//! * **freeze**: the proxy in front of the backend stops moving bytes on every connection,
//!   keeping them open (a backend that froze after the connection was established);
//! * **NOT_SERVING**, **errors** (`UNAVAILABLE` or `INTERNAL` for every call), **delay** (100 ms,
//!   which must fail nothing; or twice the deadline);
//! * **half-open hold**: the backend's breaker is tripped with errors; when it turns half-open,
//!   a long server stream takes its only probe permit and holds it (its trailers unread) until
//!   the fault is cleared. To make sure the stream is the probe, callers pause before their
//!   next call for the moment the breaker reopens (see [`Rig::gate`]); calls in flight go on.
//!
//! The kinds come in a seeded shuffled cycle, so that a run sees every kind.
//!
//! Invariants checked:
//!
//! 1. **No panic** anywhere in the process (a panic hook counts them: callers, the kit's own
//!    tasks, the backends), and every caller and fault task ends.
//! 2. **Every call ends by its deadline** ([`CALL_DEADLINE`], sent as `grpc-timeout`; a held
//!    stream's own) plus [`DEADLINE_SLACK`] — time spent inside the kit before the channel
//!    (connecting, waiting for a ready target) included.
//! 3. **Every failure names what excuses it** (see [`unexplained`]). A fault's window runs from
//!    the moment it is applied to the moment it is cleared, plus a tail:
//!    * a failure naming one backend (a transport error, a deadline, an injected error, a page
//!      that is not gRPC) needs a *disruptive* fault of *that* backend, with the tail of its
//!      kind ([`FaultKind::tail`]); NOT_SERVING (the backend still answers) and the 100 ms delay
//!      (must not fail anything) excuse nothing;
//!    * the kit refusing a call because nothing is eligible, or a deadline spent waiting for
//!      several targets (the message names every target) needs each named target to be out
//!      for a cause: a fault of any kind of that target, with tail [`PENALTY`] (the longest
//!      quarantine, open breaker or Watch backoff a fault leaves);
//!    * a failure naming no backend is never excused;
//!    * `UNKNOWN` is excused only by an HTML fault of the backend it names (the server's own
//!      answer): the kit makes no `UNKNOWN` of its own.
//! 4. **Recovery.** From [`SETTLED_AFTER`] (2 s) after the last fault is cleared, every call
//!    succeeds (and there are many such calls), and every backend answers some of them: each
//!    is back in rotation ([`PENALTY`] is shorter than [`SETTLED_AFTER`]).
//! 5. **Client streams are let go.** Every client stream the server ended early (`UNIMPLEMENTED`:
//!    no backend implements `Upload`) is dropped by the kit: its producer's next `send` fails
//!    within [`LET_GO`], before its caller's next call — while the channel handle lives on.
//! 6. **No leak.** After the kit and every client are dropped, the runtime's live task count
//!    and the process's open sockets (`/proc/self/fd` entries that are sockets) return to what
//!    they were before the kit was built (bounded polling, [`LEAK_WAIT`]).
//!
//! The fault schedule comes from a seeded RNG: `GCK_CHAOS_SEED=<u64>` replays or varies it
//! (the seed is printed; the timing of the calls is real, so a replay is close, not exact).
//! `GCK_CHAOS_VERBOSE=1` prints every failure. The test is alone in its binary because it
//! counts the process's sockets.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use grpc_client_kit::Kit;
use grpc_client_kit::breaker::BreakerConfig;
use grpc_client_kit::health::{Backoff, HealthConfig, ProbeMode};
use grpc_client_kit::quarantine::QuarantineConfig;
use grpc_client_kit::state::BreakerState;
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::{Ping, Pong, StreamPing};
use test_backends::{Backends, FreezeProxy, HtmlServer, SynDrop};
use tonic::Code;
use tonic::codec::Streaming;

// ----- the configuration the invariants are derived from -----

/// Backends behind the kit.
const BACKENDS: usize = 4;
/// The backends the kit reaches through a [`FreezeProxy`] (the others directly).
const PROXIED: [bool; BACKENDS] = [false, false, true, true];
/// Concurrent unary callers.
const CALLERS: usize = 32;
/// Concurrent callers of a client stream the server ends early.
const UPLOADERS: usize = 2;
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
/// [`BREAKER_MAX`] (jitter never exceeds the cap); one probe permit when half-open.
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
/// Linux's initial SYN retransmission timeout: a connect begun while SYNs were dropped goes
/// through at its next retransmission, up to this long after it began.
const SYN_RETRY: Duration = Duration::from_secs(1);
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
/// How soon after a client stream's call ends its producer must see the stream closed.
const LET_GO: Duration = Duration::from_millis(500);
/// A half-open hold: how long the breaker may take to open under injected errors, and to
/// give its permit to the held stream once it may turn half-open.
const TRIP_WITHIN: Duration = Duration::from_secs(2);
const TAKE_WITHIN: Duration = Duration::from_secs(1);

// ----- the rig: backends, proxies, the kit -----

/// What the faults act on.
struct Rig {
    backends: Backends,
    /// `Some` for a backend the kit reaches through a proxy.
    proxies: Vec<Option<FreezeProxy>>,
    kit: Kit,
    /// Every caller takes it (shared) before each call. A half-open hold takes it (exclusive)
    /// for the moment it needs the next call to be its own; calls in flight go on.
    gate: tokio::sync::RwLock<()>,
}

impl Rig {
    /// The target the kit knows backend `i` by.
    fn target(&self, i: usize) -> String {
        match &self.proxies[i] {
            Some(proxy) => proxy.uri(),
            None => self.backends[i].uri(),
        }
    }

    /// Every address backend `i` is reached at.
    fn addrs(&self, i: usize) -> Vec<SocketAddr> {
        let mut addrs = vec![self.backends[i].addr()];
        addrs.extend(self.proxies[i].as_ref().map(FreezeProxy::addr));
        addrs
    }

    /// The backends a failure message names (`b2: ...`, or an address of one).
    fn named(&self, message: &str) -> Vec<usize> {
        (0..self.backends.len())
            .filter(|&i| {
                let b = &self.backends[i];
                message.starts_with(&format!("{}:", b.name()))
                    || self
                        .addrs(i)
                        .iter()
                        .any(|a| message.contains(&a.to_string()))
            })
            .collect()
    }
}

// ----- faults -----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FaultKind {
    /// `stop()` (RST), later `restart()`.
    Stop,
    /// `black_hole()` (accepts, never answers), later `restart()`.
    BlackHole,
    /// Stopped, its port taken by a [`SynDrop`] (connects hang), later `restart()`.
    SynDrop,
    /// Stopped, its port taken by an [`HtmlServer`], later `restart()`.
    Html,
    /// Its proxy frozen, later thawed.
    Freeze,
    /// Health NOT_SERVING, later SERVING. The backend still answers.
    NotServing,
    /// Every call fails with this code, later none.
    Errors(Code),
    /// Every call is delayed this long, later not.
    Delay(Duration),
    /// Its breaker tripped, and its half-open permit held by a long stream until cleared.
    HalfOpenHold,
}

/// Slow but within the deadline: must not fail anything.
const SHORT_DELAY: Duration = Duration::from_millis(100);

/// Past the deadline: calls there fail with DEADLINE_EXCEEDED naming the backend (the kit's
/// timer, or the server's `CANCELLED: Timeout expired` once the deadline has passed, which the
/// kit reports as the deadline's doing).
const LONG_DELAY: FaultKind =
    FaultKind::Delay(Duration::from_millis(2 * CALL_DEADLINE.as_millis() as u64));

/// Every kind, in the order a cycle is shuffled from.
const KINDS: [FaultKind; 11] = [
    FaultKind::Stop,
    FaultKind::BlackHole,
    FaultKind::SynDrop,
    FaultKind::Html,
    FaultKind::Freeze,
    FaultKind::NotServing,
    FaultKind::Errors(Code::Unavailable),
    FaultKind::Errors(Code::Internal),
    FaultKind::Delay(SHORT_DELAY),
    LONG_DELAY,
    FaultKind::HalfOpenHold,
];

impl FaultKind {
    /// Whether it may fail calls sent to its backend.
    fn disruptive(self) -> bool {
        !matches!(self, FaultKind::NotServing | FaultKind::Delay(SHORT_DELAY))
    }

    /// How long after it is cleared a call sent to its backend may still fail because of it.
    /// The kit routes to the backend again only once its probe saw SERVING, which needs the
    /// backend back; a call in flight across the clearing is covered by the window itself. A
    /// connect begun while SYNs were dropped goes through only at its next retransmission.
    fn tail(self) -> Duration {
        match self {
            FaultKind::SynDrop => LAG + SYN_RETRY,
            _ => LAG,
        }
    }

    /// Whether it can be applied to backend `i`: a SYN drop needs the kit to connect to the
    /// backend's own port, a freeze needs a proxy.
    fn fits(self, i: usize) -> bool {
        match self {
            FaultKind::SynDrop => !PROXIED[i],
            FaultKind::Freeze => PROXIED[i],
            _ => true,
        }
    }
}

/// What an applied fault holds until it is cleared.
enum Holding {
    Nothing,
    SynDrop(SynDrop),
    Html(HtmlServer),
    /// The stream holding the half-open permit, and the call it is.
    Stream(Streaming<Pong>, Instant),
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
    /// What went wrong applying it (a half-open permit it could not take, ...).
    trouble: Option<String>,
}

impl Fault {
    /// Whether a call in flight over `[start, end]` overlaps `[fault start, fault end + tail]`.
    fn overlaps(&self, start: Instant, end: Instant, tail: Duration) -> bool {
        start <= self.end + tail && end >= self.start
    }

    /// Whether this fault explains a call failing *on its backend*: only disruptive faults,
    /// until the tail of their kind.
    fn explains_failure(&self, start: Instant, end: Instant) -> bool {
        self.kind.disruptive() && self.overlaps(start, end, self.kind.tail())
    }

    /// Whether this fault explains the kit *refusing* its backend (not eligible, or not ready):
    /// NOT_SERVING too, until the penalty a disruptive one leaves behind has run out. The
    /// short delay explains nothing.
    fn explains_refusal(&self, start: Instant, end: Instant) -> bool {
        let tail = match self.kind {
            FaultKind::Delay(SHORT_DELAY) => return false,
            FaultKind::NotServing => LAG,
            _ => PENALTY,
        };
        self.overlaps(start, end, tail)
    }
}

impl Rig {
    async fn apply(&self, i: usize, kind: FaultKind) -> Result<Holding, String> {
        let b = &self.backends[i];
        Ok(match kind {
            FaultKind::Stop => {
                b.stop().await;
                Holding::Nothing
            }
            FaultKind::BlackHole => {
                b.black_hole()
                    .await
                    .map_err(|e| format!("black hole: {e}"))?;
                Holding::Nothing
            }
            FaultKind::SynDrop => {
                b.stop().await;
                let hole = SynDrop::bind(b.addr()).await;
                Holding::SynDrop(hole.map_err(|e| format!("SYN drop: {e}"))?)
            }
            FaultKind::Html => {
                b.stop().await;
                let html = HtmlServer::bind(b.addr()).await;
                Holding::Html(html.map_err(|e| format!("HTML server: {e}"))?)
            }
            FaultKind::Freeze => {
                self.proxies[i].as_ref().expect("a proxy").freeze();
                Holding::Nothing
            }
            FaultKind::NotServing => {
                b.set_serving(false).await;
                Holding::Nothing
            }
            FaultKind::Errors(code) => {
                b.fail_always(Some(code));
                Holding::Nothing
            }
            FaultKind::Delay(d) => {
                b.set_delay(d);
                Holding::Nothing
            }
            FaultKind::HalfOpenHold => self.hold_half_open(i).await?,
        })
    }

    async fn clear(&self, i: usize, kind: FaultKind, holding: Holding) -> Option<Call> {
        let b = &self.backends[i];
        match (kind, holding) {
            (FaultKind::Stop | FaultKind::BlackHole, _) => b.restart().await.expect("restart"),
            (FaultKind::SynDrop, Holding::SynDrop(hole)) => {
                hole.stop();
                b.restart().await.expect("restart");
            }
            (FaultKind::Html, Holding::Html(html)) => {
                html.stop().await;
                b.restart().await.expect("restart");
            }
            (FaultKind::SynDrop | FaultKind::Html, _) => b.restart().await.expect("restart"),
            (FaultKind::Freeze, _) => self.proxies[i].as_ref().expect("a proxy").thaw(),
            (FaultKind::NotServing, _) => b.set_serving(true).await,
            (FaultKind::Errors(_), _) => b.fail_always(None),
            (FaultKind::Delay(_), _) => b.set_delay(Duration::ZERO),
            (FaultKind::HalfOpenHold, Holding::Stream(mut stream, start)) => {
                // Read the rest: the trailers give the permit back.
                let outcome = async {
                    while stream.message().await?.is_some() {}
                    Ok::<_, tonic::Status>(Some(i))
                };
                let outcome = tokio::time::timeout(HOLD_DEADLINE + HANG_LIMIT, outcome).await;
                return Some(Call::ended(start, HOLD_DEADLINE, outcome));
            }
            (FaultKind::HalfOpenHold, _) => b.fail_always(None),
        }
        None
    }

    /// Trips backend `i`'s breaker with errors (lifting the quarantine they bring meanwhile),
    /// then — callers paused for the moment it may turn half-open — opens long streams until
    /// one lands on `i`, taking its only probe permit. Returns that stream, its first message
    /// read, the rest left unread. A call that began before the pause may still take the
    /// permit first (its probe then closes the breaker): then it trips the breaker again,
    /// [`HOLD_ROUNDS`] times at most.
    async fn hold_half_open(&self, i: usize) -> Result<Holding, String> {
        let mut missed = Vec::new();
        for _ in 0..HOLD_ROUNDS {
            match self.try_hold_half_open(i).await? {
                Ok(holding) => return Ok(holding),
                Err(miss) => missed.push(miss),
            }
        }
        Err(format!(
            "no long stream took its half-open permit: {missed:?}"
        ))
    }

    /// One round of [`hold_half_open`](Self::hold_half_open): `Err` when the fault cannot be
    /// applied, `Ok(Err)` when another call took the permit.
    async fn try_hold_half_open(&self, i: usize) -> Result<Result<Holding, String>, String> {
        let b = &self.backends[i];
        let target = self.target(i);
        let breaker = self.kit.breaker(&target).expect("a breaker");
        b.fail_always(Some(Code::Unavailable));
        let tripped = Instant::now() + TRIP_WITHIN;
        let until = loop {
            if let BreakerState::Open { until } = breaker.state() {
                break until;
            }
            if Instant::now() > tripped {
                b.fail_always(None);
                let state = breaker.state();
                return Err(format!("breaker not open after {TRIP_WITHIN:?}: {state:?}"));
            }
            // The errors quarantine it too, sooner than they open the breaker (and for longer
            // after an earlier fault's quarantine): lift that, so that calls keep reaching it
            // until the breaker has seen enough of them.
            let _ = self.kit.quarantine().lift(&target);
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        b.fail_always(None);
        // The errors quarantined it too: once the answers already on their way have landed,
        // lift that, so that the breaker alone keeps it out.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _ = self.kit.quarantine().lift(&target);
        let card = self.kit.card(&target).expect("a card");
        let ready_at = card
            .quarantine_state()
            .until
            .map_or(until, |q| q.max(until));
        tokio::time::sleep_until(ready_at - Duration::from_millis(50)).await;
        let _paused = self.gate.write().await;
        let give_up = Instant::now() + TAKE_WITHIN;
        let mut client = TestServiceClient::new(self.kit.channel());
        let mut tries = Vec::new();
        while Instant::now() < give_up {
            let start = Instant::now();
            let mut request = tonic::Request::new(StreamPing { count: 1_000 });
            request.set_timeout(HOLD_DEADLINE);
            // A stream that lands on a slow backend (another fault) is let go at once.
            let attempt = async {
                let mut stream = client.server_stream(request).await?.into_inner();
                let first = stream.message().await?;
                Ok::<_, tonic::Status>((stream, first.map(|m| m.backend)))
            };
            let (stream, landed) = match tokio::time::timeout(ATTEMPT, attempt).await {
                Ok(Ok((stream, Some(landed)))) => (stream, landed),
                other => {
                    tries.push(format!("{other:?}"));
                    continue;
                }
            };
            if landed != b.name() {
                tries.push(landed);
                continue;
            }
            let state = breaker.state();
            return Ok(if matches!(state, BreakerState::HalfOpen { .. }) {
                Ok(Holding::Stream(stream, start))
            } else {
                Err(format!("landed while its breaker was {state:?}"))
            });
        }
        Err(format!(
            "no stream took its half-open permit within {TAKE_WITHIN:?} of its open period's \
             end: its breaker is {:?}, the eligible targets {:?}; the streams tried: {tries:?}",
            breaker.state(),
            self.kit.eligible_targets(),
        ))
    }
}

/// How many times a half-open hold trips the breaker to take its permit.
const HOLD_ROUNDS: usize = 3;
/// How long applying a half-open hold takes at most, near enough: none starts later than this
/// before the end of the fault phase.
const HOLD_TAKES: Duration = Duration::from_secs(3);

/// How long one attempt to take the permit waits for its stream's first message.
const ATTEMPT: Duration = Duration::from_millis(100);

/// The deadline of a stream holding a half-open permit: the longest fault, and a deadline.
const HOLD_DEADLINE: Duration = Duration::from_millis(FAULT_MAX.as_millis() as u64 + 1_000);

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

    /// [`KINDS`] in a shuffled order.
    fn cycle(&mut self) -> Vec<FaultKind> {
        let mut kinds = KINDS.to_vec();
        for i in (1..kinds.len()).rev() {
            kinds.swap(i, self.below(i as u64 + 1) as usize);
        }
        kinds
    }
}

/// Applies faults until `phase` has passed; returns them all, cleared, and the calls they
/// made (held streams).
async fn drive_faults(rig: Arc<Rig>, seed: u64, phase: Duration) -> (Vec<Fault>, Vec<Call>) {
    let mut rng = Rng(seed);
    let begin = Instant::now();
    let faulted: Arc<Mutex<Vec<bool>>> = Arc::new(Mutex::new(vec![false; BACKENDS]));
    let mut running = Vec::new();
    let mut kinds = Vec::new();
    while begin.elapsed() < phase {
        tokio::time::sleep(rng.between(FAULT_EVERY / 2, FAULT_EVERY * 3 / 2)).await;
        let free: Vec<usize> = {
            let f = faulted.lock().unwrap();
            if f.iter().filter(|x| **x).count() >= MAX_FAULTED {
                continue;
            }
            (0..f.len()).filter(|i| !f[*i]).collect()
        };
        if kinds.is_empty() {
            kinds = rng.cycle();
        }
        // The next kind of the cycle that fits a free backend (and, for a half-open hold, which
        // takes a few seconds to apply, the time left).
        let late = begin.elapsed() + HOLD_TAKES > phase;
        let Some(k) = kinds.iter().position(|k| {
            free.iter().any(|&i| k.fits(i)) && !(late && *k == FaultKind::HalfOpenHold)
        }) else {
            continue;
        };
        let kind = kinds.remove(k);
        let fits: Vec<usize> = free.into_iter().filter(|&i| kind.fits(i)).collect();
        let backend = fits[rng.below(fits.len() as u64) as usize];
        let hold = rng.between(FAULT_MIN, FAULT_MAX);
        faulted.lock().unwrap()[backend] = true;
        let (rig, faulted) = (rig.clone(), faulted.clone());
        running.push(tokio::spawn(async move {
            let start = Instant::now();
            let (holding, trouble) = match rig.apply(backend, kind).await {
                Ok(holding) => (holding, None),
                Err(trouble) => (Holding::Nothing, Some(trouble)),
            };
            tokio::time::sleep(hold).await;
            let call = rig.clear(backend, kind, holding).await;
            let end = Instant::now();
            faulted.lock().unwrap()[backend] = false;
            let fault = Fault {
                backend,
                kind,
                start,
                end,
                trouble,
            };
            (fault, call)
        }));
    }
    let (mut faults, mut calls) = (Vec::new(), Vec::new());
    for t in running {
        let (fault, call) = t.await.expect("fault task panicked");
        faults.push(fault);
        calls.extend(call);
    }
    (faults, calls)
}

// ----- calls -----

#[derive(Debug, Clone)]
struct Call {
    start: Instant,
    end: Instant,
    /// Its deadline.
    deadline: Duration,
    /// The answering backend (`None`: a client stream the server ended early, as expected), or
    /// the failure (`None` code: abandoned after [`HANG_LIMIT`]).
    outcome: Result<Option<usize>, (Option<Code>, String)>,
    /// A client stream whose producer could still send [`LET_GO`] after the call ended.
    kept_alive: bool,
}

impl Call {
    /// A call that started at `start` with `deadline`, and ended now with `outcome`.
    fn ended(
        start: Instant,
        deadline: Duration,
        outcome: Result<Result<Option<usize>, tonic::Status>, tokio::time::error::Elapsed>,
    ) -> Call {
        let outcome = match outcome {
            Ok(Ok(i)) => Ok(i),
            Ok(Err(status)) => Err((Some(status.code()), status.message().to_string())),
            Err(_) => Err((None, "no answer (abandoned by the test)".to_string())),
        };
        Call {
            start,
            end: Instant::now(),
            deadline,
            outcome,
            kept_alive: false,
        }
    }
}

/// Unary calls back to back, each with [`CALL_DEADLINE`], until `until`.
async fn caller(rig: Arc<Rig>, until: Instant) -> Vec<Call> {
    let mut client = TestServiceClient::new(rig.kit.channel());
    let mut calls = Vec::new();
    while Instant::now() < until {
        drop(rig.gate.read().await);
        let mut request = tonic::Request::new(Ping::default());
        request.set_timeout(CALL_DEADLINE);
        let start = Instant::now();
        let reply = client.unary(request);
        let outcome = tokio::time::timeout(CALL_DEADLINE + HANG_LIMIT, reply).await;
        let outcome = outcome.map(|r| r.map(|pong| Some(backend_index(&pong.get_ref().backend))));
        calls.push(Call::ended(start, CALL_DEADLINE, outcome));
    }
    calls
}

/// Client streams back to back on one channel handle, each with [`CALL_DEADLINE`], until
/// `until`: a producer feeds each one until its `send` fails. No backend implements `Upload`:
/// each ends early with `UNIMPLEMENTED`, and its producer must then see the stream closed.
async fn uploader(rig: Arc<Rig>, until: Instant) -> Vec<Call> {
    let mut channel = rig.kit.channel();
    let mut calls = Vec::new();
    while Instant::now() < until {
        drop(rig.gate.read().await);
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Ping>(1);
        let pings = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let producer = tokio::spawn(async move {
            while tx.send(Ping::default()).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let mut request = tonic::Request::new(pings);
        request.set_timeout(CALL_DEADLINE);
        let start = Instant::now();
        let reply = test_backends::upload(&mut channel, request);
        let outcome = tokio::time::timeout(CALL_DEADLINE + HANG_LIMIT, reply).await;
        let ended_early = matches!(&outcome, Ok(Err(s)) if s.code() == Code::Unimplemented);
        let outcome = match outcome {
            Ok(Err(_)) if ended_early => Ok(Ok(None)),
            other => other.map(|r| r.map(|_| None)),
        };
        let mut call = Call::ended(start, CALL_DEADLINE, outcome);
        // The server ended the stream: the kit must let it go (within LET_GO), before the
        // handle's next call.
        let abort = producer.abort_handle();
        call.kept_alive = ended_early && tokio::time::timeout(LET_GO, producer).await.is_err();
        abort.abort();
        calls.push(call);
    }
    calls
}

fn backend_index(name: &str) -> usize {
    name.strip_prefix('b')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected backend name {name:?}"))
}

/// Why a failed call is not excused by the faults, or `None` when it is.
///
/// * A failure that names several backends is the kit refusing the call (nothing eligible,
///   or no target ready by the deadline): every backend it names must have been out for a
///   cause — a fault of any kind but the short delay, or the penalty a disruptive one leaves
///   behind ([`PENALTY`]).
/// * A failure that names one backend must fall in a disruptive fault of that backend, or the
///   tail of its kind after it; an `UNKNOWN` one in an HTML fault of that backend.
/// * A failure that names no backend is never excused.
fn unexplained(
    c: &Call,
    code: Option<Code>,
    message: &str,
    faults: &[Fault],
    rig: &Rig,
) -> Option<String> {
    let named = rig.named(message);
    match named.len() {
        0 => Some("naming no backend".to_string()),
        1 if code == Some(Code::Unknown) => (!faults.iter().any(|f| {
            f.backend == named[0] && f.kind == FaultKind::Html && f.explains_failure(c.start, c.end)
        }))
        .then(|| {
            format!(
                "with UNKNOWN outside every HTML fault window of b{}",
                named[0]
            )
        }),
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

fn kit_over(targets: Vec<String>) -> Kit {
    Kit::builder()
        .targets(targets)
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
                .open_max(BREAKER_MAX)
                .half_open_permits(1),
        )
        .build()
        .expect("kit")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_under_load() {
    count_panics();
    let seed = seed();
    println!("chaos seed: {seed} (set GCK_CHAOS_SEED to replay or vary the schedule)");

    let backends = Backends::start(BACKENDS).await.expect("backends");
    let mut proxies = Vec::new();
    for (b, proxied) in backends.iter().zip(PROXIED) {
        proxies.push(if proxied {
            Some(FreezeProxy::start(b.addr()).await.expect("proxy"))
        } else {
            None
        });
    }
    // Baseline: the backends and proxies are up and idle; nothing of the kit exists yet.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let tasks_before = alive_tasks();
    let sockets_before = open_sockets();

    let targets = (0..BACKENDS)
        .map(|i| match &proxies[i] {
            Some(proxy) => proxy.uri(),
            None => backends[i].uri(),
        })
        .collect();
    let rig = Rig {
        backends: backends.clone(),
        proxies,
        kit: kit_over(targets),
        gate: tokio::sync::RwLock::new(()),
    };
    assert!(
        rig.kit.wait_until_ready(Duration::from_secs(10)).await,
        "every target has a verdict"
    );
    let rig = Arc::new(rig);

    let t0 = Instant::now();
    let load_until = t0 + FAULT_PHASE + FAULT_MAX + QUIET_PHASE + Duration::from_millis(500);
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| tokio::spawn(caller(rig.clone(), load_until)))
        .chain((0..UPLOADERS).map(|_| tokio::spawn(uploader(rig.clone(), load_until))))
        .collect();
    // The first second is fault-free: everything must succeed there too.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (faults, mut calls) = drive_faults(rig.clone(), seed, FAULT_PHASE).await;
    let last_cleared = faults.iter().map(|f| f.end).max().expect("some faults");

    for c in callers {
        calls.extend(c.await.expect("caller task panicked"));
    }
    assert!(
        Instant::now() >= last_cleared + SETTLED_AFTER + Duration::from_secs(1),
        "the load outlived the last fault by enough to check recovery"
    );
    // Every task that used the kit has ended: the rig is ours alone.
    let rig = Arc::into_inner(rig).expect("the rig is no longer shared");

    // ----- report -----
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for f in &faults {
        *by_kind.entry(format!("{:?}", f.kind)).or_default() += 1;
    }
    let failed = calls.iter().filter(|c| c.outcome.is_err()).count();
    let uploads = calls.iter().filter(|c| c.outcome == Ok(None)).count();
    let mut per_backend = [0usize; BACKENDS];
    for c in &calls {
        if let Ok(Some(i)) = c.outcome {
            per_backend[i] += 1;
        }
    }
    println!(
        "{} faults {:?}; {} calls ({} client streams ended early), {} failed; answered per \
         backend {:?}",
        faults.len(),
        by_kind,
        calls.len(),
        uploads,
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
    // 1. Panics (callers and fault tasks were joined above: a panic there already failed), and
    // faults that could not be applied.
    let panics = PANICS.load(Ordering::SeqCst);
    if panics > 0 {
        violations.push(format!("{panics} panic(s) in the process (see stderr)"));
    }
    for f in &faults {
        if let Some(trouble) = &f.trouble {
            violations.push(format!(
                "fault b{} {:?} at {} was not applied: {trouble}",
                f.backend,
                f.kind,
                at(f.start, t0)
            ));
        }
    }
    let held = faults
        .iter()
        .filter(|f| f.kind == FaultKind::HalfOpenHold && f.trouble.is_none())
        .count();
    if held == 0 {
        violations
            .push("no long stream held a half-open permit: the fault was not exercised".into());
    }
    // 2, 3, 4, 5: every call.
    let verbose = std::env::var_os("GCK_CHAOS_VERBOSE").is_some();
    let mut settled_calls = 0;
    let mut settled_per_backend = [0usize; BACKENDS];
    let mut codes: BTreeMap<String, usize> = BTreeMap::new();
    for c in &calls {
        let took = c.end - c.start;
        if took > c.deadline + DEADLINE_SLACK {
            violations.push(format!(
                "call {}..{} took {:?}, past its deadline {:?} + slack {:?}: {:?}",
                at(c.start, t0),
                at(c.end, t0),
                took,
                c.deadline,
                DEADLINE_SLACK,
                c.outcome
            ));
        }
        if c.kept_alive {
            violations.push(format!(
                "client stream {}..{}: its producer could still send {LET_GO:?} after the \
                 server ended the call",
                at(c.start, t0),
                at(c.end, t0),
            ));
        }
        let settled = c.start >= last_cleared + SETTLED_AFTER;
        if settled {
            settled_calls += 1;
            if let Ok(Some(i)) = c.outcome {
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
        if let Some(why) = unexplained(c, *code, message, &faults, &rig) {
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
    if uploads == 0 {
        violations.push("no client stream was ended early by a server".to_string());
    }

    // 6. Leaks: drop the kit and every channel, then wait (bounded) for the baseline.
    let Rig { kit, proxies, .. } = rig;
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
    drop(proxies);
    for b in backends.iter() {
        b.stop().await;
    }
}

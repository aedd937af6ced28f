//! The breaker's state machine, shared by every clone of a breaker service and its operator
//! handle.
//!
//! The request path reads one atomic word (mode, free half-open permits, generation); a half-
//! open permit is taken and given back with a compare-and-swap on that word. Outcomes in the
//! closed state touch only atomics (the consecutive-failure count, or a window). A transition
//! is rare: it takes a short lock (never held across an `.await`), stores the new word,
//! publishes the new state on the endpoint's card (which wakes every waiter) and sends the
//! card's event to the breaker's subscribers.

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use endpoint_state::time::Secs;
use endpoint_state::{
    BreakerState, CardEvent, EndpointCard, LineState, Outcome, Reason, Verdict, rng, sync, time,
};
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::config::BreakerConfig;
use crate::reason::{describe, last_status, percent, percent_f};
use crate::trip::TripPolicy;
use crate::window::{Counter, FAILED, SLOW, Totals};
use crate::word::{Mode, Word};

/// The state of the transition side, behind the lock.
#[derive(Debug)]
struct Machine {
    /// Open periods in a row since the breaker last closed (the backoff exponent).
    trips: u32,
    /// Probe calls that succeeded in the current half-open period.
    probes_ok: u32,
    /// The reason of the last trip, kept to explain the half-open period after it.
    trip_reason: Option<Reason>,
}

pub(crate) struct Shared {
    pub(crate) card: EndpointCard,
    pub(crate) config: BreakerConfig,
    origin: Instant,
    word: AtomicU64,
    /// The end of the current open period, in nanoseconds since `origin`.
    open_until: AtomicU64,
    consecutive: AtomicU32,
    failure_window: Option<Counter>,
    slow_window: Option<Counter>,
    /// Whether an outcome needs the call's duration (slow calls) at all.
    pub(crate) timed: bool,
    machine: Mutex<Machine>,
    /// The card's events of this breaker's line, as each transition writes it.
    events: broadcast::Sender<CardEvent>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self.load();
        f.debug_struct("Breaker")
            .field("target", &self.card.target())
            .field("mode", &w.mode())
            .field("free_permits", &w.permits())
            .field("generation", &w.generation())
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// A closed breaker for `card`. `config` has been validated.
    pub(crate) fn new(card: EndpointCard, config: BreakerConfig) -> Self {
        let origin = Instant::now();
        let failure_window = match config.trip {
            TripPolicy::FailureRate { window, .. } => Some(Counter::new(window, origin)),
            TripPolicy::ConsecutiveFailures(_) => None,
        };
        let slow_window = config.slow_calls.map(|s| Counter::new(s.window, origin));
        let (events, _) = broadcast::channel(config.events_capacity);
        card.set_breaker(BreakerState::Closed, None);
        Shared {
            timed: config.slow_calls.is_some(),
            card,
            origin,
            word: AtomicU64::new(Word::new(Mode::Closed, 0, 0).0),
            open_until: AtomicU64::new(0),
            consecutive: AtomicU32::new(0),
            failure_window,
            slow_window,
            machine: Mutex::new(Machine {
                trips: 0,
                probes_ok: 0,
                trip_reason: None,
            }),
            events,
            config,
        }
    }

    #[inline]
    pub(crate) fn load(&self) -> Word {
        Word(self.word.load(Ordering::Acquire))
    }

    /// When the current open period ends (meaningful while the mode is `Open`).
    pub(crate) fn open_until(&self) -> Instant {
        self.origin + Duration::from_nanos(self.open_until.load(Ordering::Acquire))
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<CardEvent> {
        self.events.subscribe()
    }

    fn lock(&self) -> MutexGuard<'_, Machine> {
        // Every store under the lock is whole; a panic elsewhere leaves nothing half-done.
        sync::lock(&self.machine)
    }

    // ----- permits -----

    /// Takes a half-open permit if `w` (the word just read) is half-open with one free. Taking
    /// the last one publishes on the card that the breaker is busy (no other call is admitted).
    pub(crate) fn try_take_permit(self: &Arc<Self>, mut w: Word) -> Option<Permit> {
        loop {
            if w.mode() != Mode::HalfOpen || w.permits() == 0 {
                return None;
            }
            match self.word.compare_exchange_weak(
                w.0,
                w.permit_taken().0,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if w.permits() == 1 {
                        self.publish_permits();
                    }
                    return Some(Permit {
                        shared: Arc::clone(self),
                        generation: w.generation(),
                        live: true,
                    });
                }
                Err(actual) => w = Word(actual),
            }
        }
    }

    /// Gives a permit of `generation` back, if that half-open period is still current. The
    /// first one free again publishes on the card that the breaker admits a call (which wakes
    /// every waiter).
    fn release_permit(&self, generation: u64) {
        let mut w = self.load();
        loop {
            if w.mode() != Mode::HalfOpen || w.generation() != generation {
                return;
            }
            match self.word.compare_exchange_weak(
                w.0,
                w.permit_given_back().0,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => w = Word(actual),
            }
        }
        tracing::debug!(backend = %self.card.target(), "half-open permit given back");
        if w.permits() == 0 {
            self.publish_permits();
        }
    }

    /// Publishes whether every half-open permit is taken, read from the word under the
    /// transition lock. Each permit that crosses zero (the last taken, the first given back)
    /// calls this after its own change, so the last publication reads the last change.
    fn publish_permits(&self) {
        let m = self.lock();
        let w = self.load();
        if w.mode() != Mode::HalfOpen {
            return; // a transition published the state already
        }
        let busy = w.permits() == 0;
        let reason = self.card.breaker().reason.clone();
        if let Some(event) = self
            .card
            .set_breaker(BreakerState::HalfOpen { busy }, reason)
        {
            log(&event);
            let _ = self.events.send(event);
        }
        drop(m);
    }

    // ----- outcomes -----

    /// A call admitted while closed (in `generation`) ended.
    pub(crate) fn record_closed(
        &self,
        generation: u64,
        outcome: &Outcome,
        duration: Option<Duration>,
    ) {
        let verdict = self.config.failure_codes.classify(outcome);
        if verdict == Verdict::Ignored || self.load().generation() != generation {
            return;
        }
        let failed = verdict == Verdict::Failure;
        let slow = self.is_slow(duration);
        // Read the clock at most once, and only for a time window.
        let mut clock = None;
        let mut now = || *clock.get_or_insert_with(Instant::now);

        match self.config.trip {
            TripPolicy::ConsecutiveFailures(limit) => {
                if failed {
                    let n = self.consecutive.fetch_add(1, Ordering::AcqRel) + 1;
                    if n >= limit {
                        self.trip(generation, || {
                            format!(
                                "{n} consecutive failure{} (last: {})",
                                if n == 1 { "" } else { "s" },
                                last_status(outcome)
                            )
                        });
                        return;
                    }
                } else if self.consecutive.load(Ordering::Relaxed) != 0 {
                    self.consecutive.store(0, Ordering::Relaxed);
                }
            }
            TripPolicy::FailureRate {
                threshold,
                window,
                min_calls,
            } => {
                let flags = if failed { FAILED } else { 0 };
                let window_counter = self
                    .failure_window
                    .as_ref()
                    .expect("rate policy has a window");
                let t = window_counter.record(flags, &mut now);
                // Judged on every call: the minimum may be reached by a success.
                if reaches(t.failures, t.calls, threshold, min_calls) {
                    self.trip(generation, || {
                        let mut why = format!(
                            "failure rate {} ({} of {} calls) {} reached {}",
                            percent(t.failures, t.calls),
                            t.failures,
                            t.calls,
                            describe(window),
                            percent_f(threshold),
                        );
                        if failed {
                            why.push_str(&format!(" (last: {})", last_status(outcome)));
                        }
                        why
                    });
                    return;
                }
            }
        }

        if let (Some(policy), Some(counter)) = (&self.config.slow_calls, &self.slow_window) {
            let t: Totals = counter.record(if slow { SLOW } else { 0 }, &mut now);
            if reaches(t.slow, t.calls, policy.rate, policy.min_calls) {
                self.trip(generation, || {
                    format!(
                        "slow-call rate {} ({} of {} calls took {} or more) {} reached {}",
                        percent(t.slow, t.calls),
                        t.slow,
                        t.calls,
                        Secs(policy.threshold),
                        describe(policy.window),
                        percent_f(policy.rate),
                    )
                });
            }
        }
    }

    /// A probe call ended.
    pub(crate) fn record_probe(
        &self,
        mut permit: Permit,
        outcome: &Outcome,
        duration: Option<Duration>,
    ) {
        let verdict = self.config.failure_codes.classify(outcome);
        if verdict == Verdict::Ignored {
            // Abandoned: the permit goes back (when `permit` drops).
            return;
        }
        permit.live = false;
        let generation = permit.generation;
        let slow = self.is_slow(duration);
        let mut m = self.lock();
        let w = self.load();
        if w.mode() != Mode::HalfOpen || w.generation() != generation {
            return;
        }
        if verdict == Verdict::Failure || slow {
            let why = if verdict == Verdict::Failure {
                format!("probe call failed: {}", last_status(outcome))
            } else {
                format!(
                    "probe call took {} (slow from {})",
                    Secs(duration.unwrap_or_default()),
                    Secs(
                        self.config
                            .slow_calls
                            .map(|s| s.threshold)
                            .unwrap_or_default()
                    )
                )
            };
            self.open_locked(&mut m, w, why.into());
        } else {
            m.probes_ok += 1;
            if m.probes_ok >= self.config.half_open_permits {
                let why = if self.config.half_open_permits == 1 {
                    "probe call succeeded".to_owned()
                } else {
                    format!("{} probe calls succeeded", m.probes_ok)
                };
                self.close_locked(&mut m, w, why.into());
            }
        }
    }

    /// A call admitted while the breaker was open (or half-open with every permit taken),
    /// because no peer was eligible (passive signals never empty the choice), ended. A success
    /// closes the breaker — the endpoint has just proven itself — if it is still in the state
    /// of `generation`; any other outcome leaves it as it is (the probes decide).
    pub(crate) fn record_degraded(&self, generation: u64, outcome: &Outcome) {
        if self.config.failure_codes.classify(outcome) != Verdict::Success {
            return;
        }
        let mut m = self.lock();
        let w = self.load();
        if !matches!(w.mode(), Mode::Open | Mode::HalfOpen) || w.generation() != generation {
            return;
        }
        self.close_locked(
            &mut m,
            w,
            "a call admitted while no peer was eligible succeeded".into(),
        );
    }

    fn is_slow(&self, duration: Option<Duration>) -> bool {
        match (&self.config.slow_calls, duration) {
            (Some(policy), Some(d)) => d >= policy.threshold,
            _ => false,
        }
    }

    // ----- transitions -----

    /// Closed → Open, if the breaker is still closed in `generation`.
    fn trip(&self, generation: u64, why: impl FnOnce() -> String) {
        let mut m = self.lock();
        let w = self.load();
        if w.mode() != Mode::Closed || w.generation() != generation {
            return; // someone else tripped it first, or an operator acted
        }
        self.open_locked(&mut m, w, why().into());
    }

    /// Open → HalfOpen once the open period of `generation` has passed.
    pub(crate) fn begin_half_open(&self, generation: u64) {
        let mut m = self.lock();
        let w = self.load();
        if w.mode() != Mode::Open
            || w.generation() != generation
            || Instant::now() < self.open_until()
        {
            return;
        }
        m.probes_ok = 0;
        let permits = self.config.half_open_permits;
        let why: Reason = match &m.trip_reason {
            Some(r) => format!("open period ended; probing after {r}").into(),
            None => "open period ended; probing".into(),
        };
        self.store_locked(
            &mut m,
            Word::new(Mode::HalfOpen, permits, w.generation() + 1),
            BreakerState::HalfOpen { busy: false },
            why,
        );
    }

    fn open_locked(&self, m: &mut Machine, w: Word, why: Reason) {
        // The n-th open period in a row is the backoff's n-th wait (counted from 0).
        let period = self.config.open.delay(m.trips, rng::unit());
        m.trips = m.trips.saturating_add(1);
        let until = time::after(period);
        self.open_until.store(
            until.saturating_duration_since(self.origin).as_nanos() as u64,
            Ordering::Release,
        );
        m.trip_reason = Some(why.clone());
        self.store_locked(
            m,
            Word::new(Mode::Open, 0, w.generation() + 1),
            BreakerState::Open { until },
            why,
        );
    }

    fn close_locked(&self, m: &mut Machine, w: Word, why: Reason) {
        m.trips = 0;
        m.probes_ok = 0;
        m.trip_reason = None;
        // Start counting afresh before any call of the new generation can record.
        self.consecutive.store(0, Ordering::Release);
        if let Some(c) = &self.failure_window {
            c.clear();
        }
        if let Some(c) = &self.slow_window {
            c.clear();
        }
        self.store_locked(
            m,
            Word::new(Mode::Closed, 0, w.generation() + 1),
            BreakerState::Closed,
            why,
        );
    }

    /// Stores the new word (under the transition lock, `_locked`) and publishes `state` on
    /// the card. The card's event — every effective write of its breaker line is one — goes
    /// to the breaker's subscribers.
    fn store_locked(&self, _locked: &mut Machine, next: Word, state: BreakerState, why: Reason) {
        self.word.store(next.0, Ordering::Release);
        if let Some(event) = self.card.set_breaker(state, Some(why)) {
            log(&event);
            // No subscriber is not an error; a full channel drops its oldest event.
            let _ = self.events.send(event);
        }
    }

    // ----- operator -----

    pub(crate) fn force_open(&self, why: Option<Reason>) {
        let why = why.unwrap_or_else(|| "forced open by an operator".into());
        self.hold(Mode::ForcedOpen, BreakerState::ForcedOpen, why);
    }

    pub(crate) fn disable(&self, why: Option<Reason>) {
        let why = why.unwrap_or_else(|| "disabled by an operator".into());
        self.hold(Mode::Disabled, BreakerState::Disabled, why);
    }

    /// An operator's mode (forced open, disabled), held until a reset.
    fn hold(&self, mode: Mode, state: BreakerState, why: Reason) {
        let mut m = self.lock();
        let w = self.load();
        self.store_locked(&mut m, Word::new(mode, 0, w.generation() + 1), state, why);
    }

    pub(crate) fn reset(&self, why: Option<Reason>) {
        let mut m = self.lock();
        let w = self.load();
        let why = why.unwrap_or_else(|| "reset by an operator".into());
        self.close_locked(&mut m, w, why);
    }
}

/// A half-open permit, held by the service from `poll_ready` to `call`, then by the call
/// until its outcome is known. Dropped before that, it goes back to the breaker.
pub(crate) struct Permit {
    shared: Arc<Shared>,
    generation: u64,
    live: bool,
}

impl Permit {
    /// Whether the half-open period it was taken in is still current.
    pub(crate) fn is_current(&self) -> bool {
        let w = self.shared.load();
        w.mode() == Mode::HalfOpen && w.generation() == self.generation
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("generation", &self.generation)
            .field("live", &self.live)
            .finish()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.live {
            self.shared.release_permit(self.generation);
        }
    }
}

fn reaches(part: u32, calls: u32, threshold: f64, min_calls: u32) -> bool {
    calls >= min_calls && calls > 0 && f64::from(part) >= threshold * f64::from(calls)
}

/// An operator's line for a transition of the breaker line.
fn log(event: &CardEvent) {
    let (LineState::Breaker(from), LineState::Breaker(to)) = (event.from, event.to) else {
        return;
    };
    let reason = event.reason.as_deref().unwrap_or_default();
    match to {
        // Probe permits taken and given back: not a transition an operator acts on.
        BreakerState::HalfOpen { busy } if matches!(from, BreakerState::HalfOpen { .. }) => {
            tracing::debug!(backend = %event.target, busy, "half-open permits")
        }
        BreakerState::Open { until } => tracing::info!(
            backend = %event.target,
            %from,
            %to,
            open_for_ms = until.saturating_duration_since(event.at).as_millis() as u64,
            reason,
            "breaker opened"
        ),
        _ => tracing::info!(
            backend = %event.target,
            %from,
            %to,
            reason,
            "breaker transition"
        ),
    }
}

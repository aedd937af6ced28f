//! The endpoint's state card: one shared record per endpoint.
//!
//! Each layer writes only its own line — the health checker the [`HealthLine`], quarantine the
//! [`QuarantineLine`], the breaker the [`BreakerLine`] — and anyone reads any line, or the whole
//! card, in O(1) without taking a lock: every line is an atomically swapped `Arc` snapshot
//! ([`arc_swap`]). Every change of a line bumps the card's version and wakes every task waiting
//! on the card ([`EndpointCard::changed`], or a [`Gate`](crate::Gate)).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::{Notify, broadcast};
use tokio::time::Instant;

pub use crate::eligibility::{Block, CardSnapshot, Ineligible};
use crate::event::{CARD_EVENTS, CardEvent, LineState};
pub use crate::line::{
    BreakerLine, BreakerState, HealthLine, HealthVerdict, Line, LineKind, Quarantine,
    QuarantineLine, Reason,
};

struct Inner {
    target: Arc<str>,
    health: ArcSwap<HealthLine>,
    quarantine: ArcSwap<QuarantineLine>,
    breaker: ArcSwap<BreakerLine>,
    /// One bit per line, set while that line admits calls unconditionally: a single atomic
    /// load answers "eligible?" in the common case.
    fast: AtomicU8,
    /// Serializes writers (never readers): a write is rare, and the lock keeps each line,
    /// its bit and the version in step.
    write: Mutex<()>,
    version: AtomicU64,
    notify: Arc<Notify>,
    /// The peer set the card belongs to (weak: the set holds its cards). Read only on the
    /// slow path, when the card is not eligible, and on a write.
    peers: Mutex<Option<Weak<dyn PeerLink>>>,
    /// The card's event stream, made by its first subscriber.
    events: OnceLock<broadcast::Sender<CardEvent>>,
}

const HEALTH_ADMITS: u8 = 1;
const NOT_QUARANTINED: u8 = 2;
const BREAKER_CLOSED: u8 = 4;

fn line_bit(kind: LineKind) -> u8 {
    match kind {
        LineKind::Health => HEALTH_ADMITS,
        LineKind::Quarantine => NOT_QUARANTINED,
        LineKind::Breaker => BREAKER_CLOSED,
    }
}

/// What a card knows of the peer set it belongs to (implemented by the peer set): where
/// to send its events, and the set itself, for the rule.
pub(crate) trait PeerLink: Send + Sync + 'static {
    /// Sends a change of the card to the set's subscribers.
    fn emit(&self, event: &CardEvent);
    /// The set, for the peer-set code to take back.
    fn as_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync>;
}

/// One endpoint's shared state card.
///
/// Cloning is cheap (one `Arc`); every clone is the same card. Reads never lock: each line is
/// an atomically swapped snapshot, and a one-byte summary answers [`is_eligible`](Self::is_eligible)
/// and [`health_admits`](Self::health_admits) with a single atomic load. Writes are rare (they
/// are transitions) and take a short writer-only lock, so that a line, its summary bit and the
/// version move together; each replaces one line, bumps [`version`](Self::version) and then
/// wakes every waiter. A write that would not change the line (same state and same reason) is
/// skipped and wakes nobody. Every reason is kept bounded (see [`text`](crate::text)): a
/// server's text of any length costs the card at most [`MAX_REASON`](crate::text::MAX_REASON)
/// characters.
///
/// ```
/// use endpoint_state::{EndpointCard, HealthVerdict};
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let card = EndpointCard::new("10.0.0.7:50051");
/// assert!(card.eligibility().is_ok()); // nothing has shut it
///
/// card.set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
/// let why = card.eligibility().unwrap_err();
/// assert_eq!(why.to_string(), "10.0.0.7:50051: unhealthy (NOT_SERVING)");
///
/// card.set_health(HealthVerdict::Healthy, None);
/// card.quarantine_for(Duration::from_secs(5), Some("UNAVAILABLE: connection refused".into()));
/// assert!(card.eligibility().unwrap_err().to_string().contains("quarantined"));
/// assert!(card.is_eligible_ignoring(&[endpoint_state::LineKind::Quarantine]));
/// # }
/// ```
#[derive(Clone)]
pub struct EndpointCard {
    inner: Arc<Inner>,
}

impl fmt::Debug for EndpointCard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let snap = self.snapshot();
        f.debug_struct("EndpointCard")
            .field("target", &self.target())
            .field("version", &snap.version)
            .field("health", &snap.health)
            .field("quarantine", &snap.quarantine)
            .field("breaker", &snap.breaker)
            .finish()
    }
}

impl EndpointCard {
    /// A fresh card for `target`: health not checked, not quarantined, breaker closed.
    pub fn new(target: impl Into<Arc<str>>) -> Self {
        let now = Instant::now();
        EndpointCard {
            inner: Arc::new(Inner {
                target: target.into(),
                health: ArcSwap::from_pointee(Line {
                    state: HealthVerdict::NotChecked,
                    reason: None,
                    since: now,
                }),
                quarantine: ArcSwap::from_pointee(Line {
                    state: Quarantine::NONE,
                    reason: None,
                    since: now,
                }),
                breaker: ArcSwap::from_pointee(Line {
                    state: BreakerState::Closed,
                    reason: None,
                    since: now,
                }),
                fast: AtomicU8::new(HEALTH_ADMITS | NOT_QUARANTINED | BREAKER_CLOSED),
                write: Mutex::new(()),
                version: AtomicU64::new(0),
                notify: Arc::new(Notify::new()),
                peers: Mutex::new(None),
                events: OnceLock::new(),
            }),
        }
    }

    /// The endpoint's name (its address as the user gave it).
    pub fn target(&self) -> &str {
        &self.inner.target
    }

    /// The target name as a shared string, for errors and events that outlive a borrow.
    pub fn target_arc(&self) -> Arc<str> {
        self.inner.target.clone()
    }

    /// Whether two handles are the same card.
    pub fn same_card(&self, other: &EndpointCard) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// How many changes the card has seen. Increases by one on every effective write.
    pub fn version(&self) -> u64 {
        self.inner.version.load(Ordering::Acquire)
    }

    /// The current health line.
    pub fn health(&self) -> Arc<HealthLine> {
        self.inner.health.load_full()
    }

    /// The current quarantine line.
    pub fn quarantine(&self) -> Arc<QuarantineLine> {
        self.inner.quarantine.load_full()
    }

    /// The current breaker line.
    pub fn breaker(&self) -> Arc<BreakerLine> {
        self.inner.breaker.load_full()
    }

    /// Whether the health line admits calls (one atomic load: what a health gate asks on
    /// every `poll_ready`).
    pub fn health_admits(&self) -> bool {
        self.inner.fast.load(Ordering::Acquire) & HEALTH_ADMITS != 0
    }

    /// The health verdict alone (no reference count touched).
    pub fn health_verdict(&self) -> HealthVerdict {
        self.inner.health.load().state
    }

    /// The quarantine state alone.
    pub fn quarantine_state(&self) -> Quarantine {
        self.inner.quarantine.load().state
    }

    /// The breaker state alone.
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.breaker.load().state
    }

    /// Publish a health verdict. Returns the event when the line changed (`None` when the
    /// verdict and the reason were already these).
    pub fn set_health(&self, verdict: HealthVerdict, reason: Option<Reason>) -> Option<CardEvent> {
        let admits = verdict.admits();
        self.write(
            &self.inner.health,
            verdict,
            reason,
            admits,
            LineState::Health,
        )
    }

    /// Quarantine the endpoint until `until`. Returns the event when the line changed.
    pub fn quarantine_until(&self, until: Instant, reason: Option<Reason>) -> Option<CardEvent> {
        self.write(
            &self.inner.quarantine,
            Quarantine { until: Some(until) },
            reason,
            false,
            LineState::Quarantine,
        )
    }

    /// Quarantine the endpoint for `duration` from now (saturating: a duration too long to
    /// represent is a very long quarantine). Returns the event when the line changed.
    pub fn quarantine_for(&self, duration: Duration, reason: Option<Reason>) -> Option<CardEvent> {
        self.quarantine_until(crate::time::after(duration), reason)
    }

    /// Lift the quarantine. Returns the event when the line changed.
    pub fn clear_quarantine(&self) -> Option<CardEvent> {
        self.write(
            &self.inner.quarantine,
            Quarantine::NONE,
            None,
            true,
            LineState::Quarantine,
        )
    }

    /// Publish the breaker's state. Returns the event when the line changed.
    pub fn set_breaker(&self, state: BreakerState, reason: Option<Reason>) -> Option<CardEvent> {
        let closed = matches!(state, BreakerState::Closed | BreakerState::Disabled);
        self.write(
            &self.inner.breaker,
            state,
            reason,
            closed,
            LineState::Breaker,
        )
    }

    /// Replace one line. `admits` says whether the new state admits calls unconditionally
    /// (the line's bit in the fast word). Wakes every waiter, then sends the change to the
    /// card's subscribers and its peer set's. The reason is kept bounded
    /// ([`text::MAX_REASON`](crate::text::MAX_REASON) characters).
    fn write<T: PartialEq + Copy>(
        &self,
        line: &ArcSwap<Line<T>>,
        state: T,
        reason: Option<Reason>,
        admits: bool,
        wrap: fn(T) -> LineState,
    ) -> Option<CardEvent> {
        let reason = reason.map(crate::text::bound);
        let kind = wrap(state).line();
        let (from, at) = {
            // A poisoned lock only means another writer panicked between two stores; every
            // store below is whole, so carry on.
            let _writing = crate::sync::lock(&self.inner.write);
            let current = line.load();
            if current.state == state && current.reason == reason {
                return None;
            }
            let from = current.state;
            let at = Instant::now();
            line.store(Arc::new(Line {
                state,
                reason: reason.clone(),
                since: at,
            }));
            let bit = line_bit(kind);
            if admits {
                self.inner.fast.fetch_or(bit, Ordering::AcqRel);
            } else {
                self.inner.fast.fetch_and(!bit, Ordering::AcqRel);
            }
            self.inner.version.fetch_add(1, Ordering::AcqRel);
            (from, at)
        };
        self.inner.notify.notify_waiters();
        let event = CardEvent {
            target: self.inner.target.clone(),
            line: kind,
            from: wrap(from),
            to: wrap(state),
            reason,
            at,
        };
        if let Some(tx) = self.inner.events.get() {
            // No subscriber is fine; a lagging one loses its oldest events, never us.
            let _ = tx.send(event.clone());
        }
        if let Some(peers) = self.peer_link() {
            peers.emit(&event);
        }
        Some(event)
    }

    /// The card's changes, one [`CardEvent`] per effective write of any line, from now on.
    ///
    /// Each subscriber has its own bounded buffer ([`CARD_EVENTS`]);
    /// writers never wait for it: one that falls further behind loses the oldest events and is
    /// told how many (`RecvError::Lagged`). The card itself always holds the current lines.
    pub fn subscribe(&self) -> broadcast::Receiver<CardEvent> {
        self.inner
            .events
            .get_or_init(|| broadcast::channel(CARD_EVENTS).0)
            .subscribe()
    }

    /// A consistent-enough read of the whole card: each line is read atomically, the lines
    /// one after the other (a write landing between two reads shows as the newer state of
    /// that line and the [`version`](CardSnapshot::version) read first).
    pub fn snapshot(&self) -> CardSnapshot {
        let version = self.version();
        CardSnapshot {
            target: self.inner.target.clone(),
            version,
            health: self.inner.health.load_full(),
            quarantine: self.inner.quarantine.load_full(),
            breaker: self.inner.breaker.load_full(),
        }
    }

    /// Whether every line admits calls now.
    pub fn is_eligible(&self) -> bool {
        self.is_eligible_ignoring(&[])
    }

    /// Whether every line except those in `ignore` admits calls now. Quarantine asks this
    /// with `[LineKind::Quarantine]` to learn whether a peer is *otherwise* eligible.
    pub fn is_eligible_ignoring(&self, ignore: &[LineKind]) -> bool {
        let mask = ignore
            .iter()
            .fold(HEALTH_ADMITS | NOT_QUARANTINED | BREAKER_CLOSED, |m, k| {
                m & !line_bit(*k)
            });
        let fast = self.inner.fast.load(Ordering::Acquire);
        if fast & mask == mask {
            return true;
        }
        if mask & HEALTH_ADMITS != 0 && fast & HEALTH_ADMITS == 0 {
            return false;
        }
        // A quarantine or an open breaker may have expired with time alone: read the line.
        let now = Instant::now();
        if mask & NOT_QUARANTINED != 0
            && fast & NOT_QUARANTINED == 0
            && self.quarantine_state().active_at(now)
        {
            return false;
        }
        if mask & BREAKER_CLOSED != 0
            && fast & BREAKER_CLOSED == 0
            && !self.breaker_state().admits_at(now)
        {
            return false;
        }
        true
    }

    /// `Ok` when the endpoint is eligible now, otherwise every reason it is not.
    pub fn eligibility(&self) -> Result<(), Ineligible> {
        self.snapshot().eligibility_at(Instant::now())
    }

    /// A future that completes at the next change of any line after this call.
    ///
    /// Create it *before* reading the state you want to wait on: a change that lands between
    /// the read and the first poll still completes it (no lost wake-up).
    pub fn changed(&self) -> Changed {
        Changed {
            notified: Box::pin(self.inner.notify.clone().notified_owned()),
        }
    }

    pub(crate) fn notified(&self) -> tokio::sync::futures::OwnedNotified {
        self.inner.notify.clone().notified_owned()
    }

    fn peers_slot(&self) -> std::sync::MutexGuard<'_, Option<Weak<dyn PeerLink>>> {
        crate::sync::lock(&self.inner.peers)
    }

    /// The peer set the card belongs to, if any.
    pub(crate) fn peer_link(&self) -> Option<Arc<dyn PeerLink>> {
        self.peers_slot().as_ref().and_then(Weak::upgrade)
    }

    pub(crate) fn link_peers(&self, peers: Weak<dyn PeerLink>) {
        *self.peers_slot() = Some(peers);
    }

    /// Forgets the peer set, if it is `peers`.
    pub(crate) fn unlink_peers(&self, peers: &Arc<dyn PeerLink>) {
        let mut slot = self.peers_slot();
        if slot
            .as_ref()
            .is_some_and(|w| std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(peers)))
        {
            *slot = None;
        }
    }
}

/// Completes at the next change of the card after it was created. See [`EndpointCard::changed`].
pub struct Changed {
    notified: Pin<Box<tokio::sync::futures::OwnedNotified>>,
}

impl fmt::Debug for Changed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Changed").finish_non_exhaustive()
    }
}

impl Future for Changed {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.notified.as_mut().poll(cx)
    }
}

/// A service that carries its endpoint's state card.
///
/// Every layer of the kit implements it for its service (returning the card it was built
/// with), so that a balancer can read each endpoint's card directly — to keep an exact set of
/// eligible endpoints and to say why one was skipped — without knowing which layers are in the
/// stack. A service with no card returns `None`: it is always eligible, and its readiness
/// still applies.
pub trait HasCard {
    /// This endpoint's card, if the stack has one.
    fn card(&self) -> Option<&EndpointCard>;
}

impl HasCard for EndpointCard {
    fn card(&self) -> Option<&EndpointCard> {
        Some(self)
    }
}

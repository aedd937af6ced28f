//! Peers: the endpoints among which one choice is made, and the one rule every passive signal
//! obeys among them — **it may narrow the choice, never empty it**.
//!
//! Health is evidence from the backend itself; quarantine and an open breaker are *passive*
//! signals, inferred from failed calls. A backend that health says serves but that passive
//! signals have taken out is still the best place for a call when every other peer is out too
//! (Envoy's "panic mode"): degraded service beats refusing to route. So:
//!
//! * a card is **eligible** when every line admits calls ([`EndpointCard::is_eligible`]);
//! * a card is **passively blocked** when the only lines that shut it are passive — an active
//!   quarantine, a breaker open for a while ([`BreakerState::Open`]) — while its health admits
//!   calls and no operator holds its breaker open ([`EndpointCard::passively_blocked`]);
//! * a passively blocked card is **admitted anyway** when no other member of its peer set is
//!   eligible ([`EndpointCard::admission`] says [`Admission::Degraded`]).
//!
//! A card belongs to at most one [`Peers`] set (a quarantine group's, or the one a balancer
//! makes for cards that have none). Every gate of a passive line (quarantine, the breaker) and
//! every balancer asks the card, so they cannot disagree about whether a call may go there. A
//! card in no set has no peers to defer to: its passive lines shut it like any other.
//!
//! ```
//! use std::time::Duration;
//! use endpoint_state::{Admission, EndpointCard, Peers};
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let peers = Peers::new();
//! let (b1, b2) = (EndpointCard::new("b1"), EndpointCard::new("b2"));
//! peers.add(&b1);
//! peers.add(&b2);
//!
//! b1.quarantine_for(Duration::from_secs(5), Some("UNAVAILABLE".into()));
//! assert!(matches!(b1.admission(), Admission::Shut { .. })); // b2 takes the calls
//!
//! b2.quarantine_for(Duration::from_secs(5), Some("UNAVAILABLE".into()));
//! assert_eq!(b1.admission(), Admission::Degraded); // nobody is eligible: admitted anyway
//! # }
//! ```

use std::fmt;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::{Notify, broadcast};
use tokio::time::Instant;

use crate::card::{EndpointCard, PeerLink};
use crate::event::{CardEvent, PEER_EVENTS};
use crate::line::BreakerState;

/// A set of peer endpoints' cards: the endpoints among which one choice is made.
///
/// Cheap to clone (one `Arc`); every clone is the same set. Membership is a snapshot swapped
/// whole on every change (reads take no lock); every change bumps a version, and a member
/// leaving wakes whoever waits on the set.
#[derive(Clone)]
pub struct Peers {
    inner: Arc<PeersInner>,
}

pub(crate) struct PeersInner {
    members: ArcSwap<Members>,
    /// Every change of every member's card.
    events: broadcast::Sender<CardEvent>,
    /// Serializes writers; never taken to read.
    write: Mutex<()>,
    /// Woken when a member leaves (or is replaced).
    left: Arc<Notify>,
}

struct Members {
    version: u64,
    list: Vec<EndpointCard>,
}

impl PeerLink for PeersInner {
    fn emit(&self, event: &CardEvent) {
        if self.events.receiver_count() > 0 {
            let _ = self.events.send(event.clone());
        }
    }

    fn as_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

impl Default for Peers {
    fn default() -> Self {
        Peers::new()
    }
}

impl fmt::Debug for Peers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let members = self.inner.members.load();
        f.debug_struct("Peers")
            .field("version", &members.version)
            .field(
                "targets",
                &members.list.iter().map(|c| c.target()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// An eligible peer that keeps a passively blocked card shut, and the membership version it
/// was found in. While it [`holds`](Peers::witness_holds), the blocked card stays shut.
#[derive(Clone, Debug)]
pub struct Witness {
    /// The eligible peer.
    pub card: EndpointCard,
    /// The membership version it was found in.
    pub version: u64,
}

impl PartialEq for Witness {
    fn eq(&self, other: &Self) -> bool {
        self.version == other.version && self.card.same_card(&other.card)
    }
}

impl Eq for Witness {}

/// What the passive-signal rule says about a card now. See the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Every line admits calls.
    Eligible,
    /// Only passive lines shut it, and no peer is eligible: calls are admitted anyway.
    Degraded,
    /// Shut. `witness` is the eligible peer that takes the calls when only passive lines shut
    /// it; `None` when health or an operator shuts it (or it has no peer set).
    Shut {
        /// The eligible peer, when the card is passively blocked.
        witness: Option<Witness>,
    },
}

impl Admission {
    /// Whether calls may go to the card.
    pub fn admits(&self) -> bool {
        !matches!(self, Admission::Shut { .. })
    }
}

impl Peers {
    /// An empty set.
    pub fn new() -> Self {
        Peers {
            inner: Arc::new(PeersInner {
                members: ArcSwap::from_pointee(Members {
                    version: 0,
                    list: Vec::new(),
                }),
                write: Mutex::new(()),
                left: Arc::new(Notify::new()),
                events: broadcast::channel(PEER_EVENTS).0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        crate::sync::lock(&self.inner.write)
    }

    /// Adds `card` and makes this set its peer set (a card belongs to one set at a time:
    /// joining this one takes it out of any other). A different card with the same target
    /// name is replaced. Returns whether the set changed.
    pub fn add(&self, card: &EndpointCard) -> bool {
        let previous = card.peer_set();
        if let Some(other) = previous.as_ref().filter(|p| !p.same_set(self)) {
            other.remove_card(card);
        }
        let replaced;
        {
            let _writing = self.lock();
            let current = self.inner.members.load();
            let mut list = current.list.clone();
            match list.iter_mut().find(|c| c.target() == card.target()) {
                Some(c) if c.same_card(card) => {
                    card.link_peers(self.link());
                    return false;
                }
                Some(c) => {
                    let old = std::mem::replace(c, card.clone());
                    old.unlink_peers(&self.as_link());
                    replaced = true;
                }
                None => {
                    list.push(card.clone());
                    replaced = false;
                }
            }
            card.link_peers(self.link());
            self.inner.members.store(Arc::new(Members {
                version: current.version + 1,
                list,
            }));
        }
        if replaced {
            self.inner.left.notify_waiters();
        }
        true
    }

    /// Removes the member named `target` and returns its card (no longer in any set).
    pub fn remove(&self, target: &str) -> Option<EndpointCard> {
        let removed = {
            let _writing = self.lock();
            let current = self.inner.members.load();
            let at = current.list.iter().position(|c| c.target() == target)?;
            let mut list = current.list.clone();
            let card = list.remove(at);
            self.inner.members.store(Arc::new(Members {
                version: current.version + 1,
                list,
            }));
            card
        };
        removed.unlink_peers(&self.as_link());
        self.inner.left.notify_waiters();
        Some(removed)
    }

    /// Removes `card` if it is a member (the same card, not merely the same name). Returns
    /// whether it was.
    pub fn remove_card(&self, card: &EndpointCard) -> bool {
        {
            let _writing = self.lock();
            let current = self.inner.members.load();
            let Some(at) = current.list.iter().position(|c| c.same_card(card)) else {
                return false;
            };
            let mut list = current.list.clone();
            list.remove(at);
            self.inner.members.store(Arc::new(Members {
                version: current.version + 1,
                list,
            }));
        }
        card.unlink_peers(&self.as_link());
        self.inner.left.notify_waiters();
        true
    }

    /// Whether a member is named `target`.
    pub fn contains(&self, target: &str) -> bool {
        self.inner
            .members
            .load()
            .list
            .iter()
            .any(|c| c.target() == target)
    }

    /// The member named `target`.
    pub fn get(&self, target: &str) -> Option<EndpointCard> {
        self.inner
            .members
            .load()
            .list
            .iter()
            .find(|c| c.target() == target)
            .cloned()
    }

    /// Every member's card, in the order they joined.
    pub fn cards(&self) -> Vec<EndpointCard> {
        self.inner.members.load().list.clone()
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.inner.members.load().list.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The membership version: increases with every change of membership.
    pub fn version(&self) -> u64 {
        self.inner.members.load().version
    }

    /// Whether `other` is the same set.
    pub fn same_set(&self, other: &Peers) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// An eligible member other than `card`, tried from `hint` first.
    pub fn eligible_peer(&self, card: &EndpointCard, hint: Option<&Witness>) -> Option<Witness> {
        let members = self.inner.members.load();
        if let Some(w) = hint
            && w.version == members.version
            && !w.card.same_card(card)
            && w.card.is_eligible()
        {
            return Some(w.clone());
        }
        members
            .list
            .iter()
            .find(|c| !c.same_card(card) && c.is_eligible())
            .map(|c| Witness {
                card: c.clone(),
                version: members.version,
            })
    }

    /// Whether any member is eligible.
    pub fn any_eligible(&self) -> bool {
        self.inner
            .members
            .load()
            .list
            .iter()
            .any(EndpointCard::is_eligible)
    }

    /// The rule, for the whole set at once: whether passive signals are ignored now for every
    /// member they alone shut — no member is eligible. (For one card, that is
    /// [`EndpointCard::admission`] saying [`Admission::Degraded`]: a card that is not eligible
    /// has no eligible peer exactly when no member is eligible.)
    pub fn ignores_passive_signals(&self) -> bool {
        !self.any_eligible()
    }

    /// Whether `witness` still keeps passively blocked members shut: it is eligible and the
    /// membership has not changed since it was found.
    pub fn witness_holds(&self, witness: &Witness) -> bool {
        self.inner.members.load().version == witness.version && witness.card.is_eligible()
    }

    /// Completes when a member leaves (or is replaced) after this call.
    pub fn member_left(&self) -> OwnedNotified {
        self.inner.left.clone().notified_owned()
    }

    /// Every member's changes, one [`CardEvent`] per effective write of any line of any
    /// member's card, from now on. Bounded as [`EndpointCard::subscribe`] is (with room for
    /// [`PEER_EVENTS`]).
    pub fn subscribe(&self) -> broadcast::Receiver<CardEvent> {
        self.inner.events.subscribe()
    }

    fn as_link(&self) -> Arc<dyn PeerLink> {
        self.inner.clone()
    }

    fn link(&self) -> std::sync::Weak<dyn PeerLink> {
        let weak: std::sync::Weak<PeersInner> = Arc::downgrade(&self.inner);
        weak
    }

    pub(crate) fn from_inner(inner: Arc<PeersInner>) -> Self {
        Peers { inner }
    }
}

impl EndpointCard {
    /// The card's peer set, if it belongs to one.
    pub fn peers(&self) -> Option<Peers> {
        self.peer_set()
    }

    pub(crate) fn peer_set(&self) -> Option<Peers> {
        let inner = self.peer_link()?.as_any().downcast::<PeersInner>().ok()?;
        Some(Peers::from_inner(inner))
    }

    /// Whether the only lines that shut the card now are passive ones: its health admits
    /// calls, no operator holds its breaker open, and an active quarantine or a breaker open
    /// for a while (or both) shut it. `false` for an eligible card.
    pub fn passively_blocked(&self) -> bool {
        if self.is_eligible() || !self.health_admits() {
            return false;
        }
        let now = Instant::now();
        let quarantined = self.quarantine_state().active_at(now);
        match self.breaker_state() {
            BreakerState::Open { until } => quarantined || until > now,
            BreakerState::ForcedOpen => false,
            // Closed, disabled or half-open: only the quarantine can be shutting it.
            _ => quarantined,
        }
    }

    /// The one rule: whether calls may go to this card now — every line admits
    /// ([`Admission::Eligible`]), or only passive lines shut it and no peer is eligible
    /// ([`Admission::Degraded`]). One atomic load when the card is eligible.
    pub fn admission(&self) -> Admission {
        self.admission_with_hint(None)
    }

    /// [`admission`](Self::admission), trying the witness `hint` (from an earlier answer)
    /// first.
    pub fn admission_with_hint(&self, hint: Option<&Witness>) -> Admission {
        if self.is_eligible() {
            return Admission::Eligible;
        }
        if !self.passively_blocked() {
            return Admission::Shut { witness: None };
        }
        let Some(peers) = self.peer_set() else {
            return Admission::Shut { witness: None };
        };
        match peers.eligible_peer(self, hint) {
            Some(witness) => Admission::Shut {
                witness: Some(witness),
            },
            None => Admission::Degraded,
        }
    }
}

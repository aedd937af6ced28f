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
//!   quarantine, a breaker open for a while ([`BreakerState::Open`]), a half-open breaker whose
//!   every probe permit is taken by a call in flight ([`BreakerState::HalfOpen`] `{ busy: true }`)
//!   — while its health admits calls and no operator holds its breaker open
//!   ([`EndpointCard::passively_blocked`]);
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

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
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
/// whole (reads take no lock), published from the writers' roster at the first read after a
/// change: adding or removing a member costs O(1) (amortized), and a burst of changes — ten
/// thousand targets discovered at once — is published once, in O(members). Every change bumps
/// a version, and a member leaving wakes whoever waits on the set.
#[derive(Clone)]
pub struct Peers {
    inner: Arc<PeersInner>,
}

pub(crate) struct PeersInner {
    /// The membership as readers see it: published from `roster` when it is `stale`.
    members: ArcSwap<Members>,
    /// Set by a writer (under the roster's lock) when `members` no longer shows `roster`.
    stale: AtomicBool,
    /// Every change of every member's card.
    events: broadcast::Sender<CardEvent>,
    /// The writers' membership; taken to read only to publish a change.
    roster: Mutex<Roster>,
    /// Woken when a member leaves (or is replaced).
    left: Arc<Notify>,
}

struct Members {
    version: u64,
    list: Vec<EndpointCard>,
}

/// The membership as writers keep it: members in the order they joined (a slot emptied by a
/// removal is skipped, and the slots compacted once most are empty), and each member's slot by
/// target name.
#[derive(Default)]
struct Roster {
    version: u64,
    slots: Vec<Option<EndpointCard>>,
    index: HashMap<Arc<str>, usize>,
}

impl Roster {
    /// Takes the member in `slot` out.
    fn take(&mut self, slot: usize) -> EndpointCard {
        let card = self.slots[slot]
            .take()
            .expect("an indexed slot holds a card");
        self.index.remove(card.target());
        if self.slots.len() > 32 && self.slots.len() > 2 * self.index.len() {
            self.slots.retain(Option::is_some);
            for (i, c) in self.slots.iter().enumerate() {
                let c = c.as_ref().expect("compacted");
                *self.index.get_mut(c.target()).expect("indexed") = i;
            }
        }
        card
    }
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
        let members = self.members();
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
                stale: AtomicBool::new(false),
                roster: Mutex::new(Roster::default()),
                left: Arc::new(Notify::new()),
                events: broadcast::channel(PEER_EVENTS).0,
            }),
        }
    }

    fn roster(&self) -> std::sync::MutexGuard<'_, Roster> {
        crate::sync::lock(&self.inner.roster)
    }

    /// The membership now: the published snapshot, published first if a change is pending.
    fn members(&self) -> arc_swap::Guard<Arc<Members>> {
        if self.inner.stale.load(Ordering::Acquire) {
            let roster = self.roster();
            if self.inner.stale.swap(false, Ordering::AcqRel) {
                self.inner.members.store(Arc::new(Members {
                    version: roster.version,
                    list: roster.slots.iter().flatten().cloned().collect(),
                }));
            }
        }
        self.inner.members.load()
    }

    /// Adds `card` and makes this set its peer set (a card belongs to one set at a time:
    /// joining this one takes it out of any other). A different card with the same target
    /// name is replaced. Returns whether the set changed.
    pub fn add(&self, card: &EndpointCard) -> bool {
        let previous = card.peer_set();
        if let Some(other) = previous.as_ref().filter(|p| !p.same_set(self)) {
            other.remove_card(card);
        }
        let replaced = {
            let mut roster = self.roster();
            let replaced = match roster.index.get(card.target()).copied() {
                Some(slot) => {
                    let current = roster.slots[slot].as_ref().expect("an indexed slot");
                    if current.same_card(card) {
                        card.link_peers(self.link());
                        return false;
                    }
                    let old = roster.slots[slot].replace(card.clone()).expect("indexed");
                    old.unlink_peers(&self.as_link());
                    true
                }
                None => {
                    let slot = roster.slots.len();
                    roster.slots.push(Some(card.clone()));
                    roster.index.insert(card.target_arc(), slot);
                    false
                }
            };
            card.link_peers(self.link());
            roster.version += 1;
            self.inner.stale.store(true, Ordering::Release);
            replaced
        };
        if replaced {
            self.inner.left.notify_waiters();
        }
        true
    }

    /// Removes the member named `target` and returns its card (no longer in any set).
    pub fn remove(&self, target: &str) -> Option<EndpointCard> {
        let removed = {
            let mut roster = self.roster();
            let slot = roster.index.get(target).copied()?;
            let card = roster.take(slot);
            roster.version += 1;
            self.inner.stale.store(true, Ordering::Release);
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
            let mut roster = self.roster();
            let Some(slot) = roster.index.get(card.target()).copied() else {
                return false;
            };
            if !roster.slots[slot]
                .as_ref()
                .is_some_and(|c| c.same_card(card))
            {
                return false;
            }
            roster.take(slot);
            roster.version += 1;
            self.inner.stale.store(true, Ordering::Release);
        }
        card.unlink_peers(&self.as_link());
        self.inner.left.notify_waiters();
        true
    }

    /// Whether a member is named `target`.
    pub fn contains(&self, target: &str) -> bool {
        self.members().list.iter().any(|c| c.target() == target)
    }

    /// The member named `target`.
    pub fn get(&self, target: &str) -> Option<EndpointCard> {
        self.members()
            .list
            .iter()
            .find(|c| c.target() == target)
            .cloned()
    }

    /// Every member's card, in the order they joined.
    pub fn cards(&self) -> Vec<EndpointCard> {
        self.members().list.clone()
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.members().list.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The membership version: increases with every change of membership.
    pub fn version(&self) -> u64 {
        self.members().version
    }

    /// Whether `other` is the same set.
    pub fn same_set(&self, other: &Peers) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// An eligible member other than `card`, tried from `hint` first.
    pub fn eligible_peer(&self, card: &EndpointCard, hint: Option<&Witness>) -> Option<Witness> {
        let members = self.members();
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
        self.members().list.iter().any(EndpointCard::is_eligible)
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
        self.members().version == witness.version && witness.card.is_eligible()
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
    /// calls, no operator holds its breaker open, and an active quarantine, a breaker open
    /// for a while, or a half-open breaker whose every probe permit is taken (or several of
    /// these) shut it. `false` for an eligible card.
    pub fn passively_blocked(&self) -> bool {
        if self.is_eligible() || !self.health_admits() {
            return false;
        }
        let now = Instant::now();
        let breaker = self.breaker_state();
        if breaker == BreakerState::ForcedOpen {
            return false;
        }
        self.quarantine_state().active_at(now) || breaker.passively_shut_at(now)
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

//! The group: the peers among which quarantine narrows the choice, each target's repeat count,
//! and the one place that writes the quarantine line of a card.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use endpoint_state::sync::lock;
use endpoint_state::{CardEvent, ConfigError, EndpointCard, Outcome, Peers, Reason, Verdict};
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::config::{MAX_SETTING, QuarantineConfig};
use crate::error::UnknownTarget;
use crate::member::{Cause, Member, Members};
use crate::outlier::{self, OutlierClock};

/// The peers among which quarantine narrows the choice: one [`EndpointCard`] per endpoint of
/// one logical service, and the policy that quarantines them.
///
/// Cheap to clone (one `Arc`); every clone is the same group. Build one per set of endpoints
/// that a balancer chooses among, [`add`](Self::add) each endpoint's card (or let
/// [`layer`](Self::layer) add it), and put `group.layer(card)` in each endpoint's stack.
///
/// **Quarantine never empties the choice.** The members' cards form a [`Peers`] set, where
/// one rule holds for every passive signal together (quarantine and open breakers): an
/// endpoint shut only by them is admitted anyway while no *other* member is eligible on every
/// line of its card (health, quarantine, breaker) — degraded service beats refusing to route.
/// The next failure renews the verdict; a success of a call admitted that way lifts its
/// endpoint's quarantine (it has just proven itself). See [`endpoint_state::peers`].
///
/// **Renewal and repeats.** A failure of an endpoint that is not quarantined starts a
/// quarantine and counts a repeat: the `n`-th in a row lasts `duration × n`, capped at
/// `max_duration`, and the count drops by one per `decay_after` spent out of quarantine. A
/// failure of an endpoint already quarantined renews it — its end moves to the configured time
/// from now, never earlier — without counting a repeat; a renewal that would gain less than a
/// twentieth of that time is skipped, so a burst of failures from one incident (every call in
/// flight on a connection that died) costs one write.
///
/// The group writes only the quarantine line of its members' cards, and has no task: outlier
/// ejection is judged on call outcomes, so dropping the last handle frees everything.
#[derive(Clone)]
pub struct QuarantineGroup {
    inner: Arc<GroupInner>,
}

pub(crate) struct GroupInner {
    pub(crate) config: QuarantineConfig,
    /// A snapshot of the members, in the order they were added, for whoever walks them all
    /// (outlier ejection, [`QuarantineGroup::cards`]): rebuilt from `membership` on the first
    /// read after a change, so that adding or removing a member costs O(1), not a copy of the
    /// list (10,000 removals would otherwise copy 50 million entries).
    members: ArcSwap<Members>,
    /// Whether `members` is behind `membership` (set under its lock).
    stale: AtomicBool,
    /// The members, by name and in order; never taken on the request path.
    membership: Mutex<Roster>,
    /// The peer set of the members' cards, where the rule "passive signals never empty the
    /// choice" is decided (shared with the breakers of the same endpoints, in the kit).
    pub(crate) peers: Peers,
    pub(crate) outlier: Option<OutlierClock>,
}

/// The members, by name and in the order they were added.
#[derive(Default)]
struct Roster {
    by_name: HashMap<Arc<str>, Arc<Member>>,
    order: BTreeMap<u64, Arc<Member>>,
    next: u64,
}

impl fmt::Debug for QuarantineGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let members = self.inner.snapshot();
        f.debug_struct("QuarantineGroup")
            .field(
                "targets",
                &members
                    .list
                    .iter()
                    .map(|m| m.card.target())
                    .collect::<Vec<_>>(),
            )
            .field("config", &self.inner.config)
            .finish()
    }
}

impl Default for QuarantineGroup {
    /// A group with the default configuration (5 s, `UNAVAILABLE` and `DEADLINE_EXCEEDED`,
    /// no outlier ejection).
    fn default() -> Self {
        QuarantineGroup::new(QuarantineConfig::default()).expect("the defaults are valid")
    }
}

impl QuarantineGroup {
    /// An empty group, after checking `config`. Nothing is started: the group has no task.
    /// The group has a [`Peers`] set of its own; see [`with_peers`](Self::with_peers).
    pub fn new(config: QuarantineConfig) -> Result<Self, ConfigError> {
        Self::with_peers(config, Peers::new())
    }

    /// An empty group whose members' cards join `peers`: the set among which passive signals
    /// (this group's quarantine, and the breakers of cards in the same set) narrow the choice
    /// but never empty it. Share one set between the group and the breakers of the same
    /// endpoints so that, when every endpoint that health says serves is quarantined or has
    /// its breaker open, calls still go through.
    pub fn with_peers(config: QuarantineConfig, peers: Peers) -> Result<Self, ConfigError> {
        config.validate()?;
        let outlier = config.outlier_ejection.clone().map(OutlierClock::new);
        Ok(QuarantineGroup {
            inner: Arc::new(GroupInner {
                config,
                members: ArcSwap::from_pointee(Members { list: Vec::new() }),
                stale: AtomicBool::new(false),
                membership: Mutex::default(),
                peers,
                outlier,
            }),
        })
    }

    /// The configuration the group was built with.
    pub fn config(&self) -> &QuarantineConfig {
        &self.inner.config
    }

    /// The peer set the members' cards belong to.
    pub fn peers(&self) -> &Peers {
        &self.inner.peers
    }

    /// Every change of the members' cards from now on: one [`CardEvent`] per effective write
    /// of any line of any member's card — a quarantine starting, renewed or lifted
    /// (`event.line == LineKind::Quarantine`), and as well the health and breaker lines of the
    /// same cards. It is the group's peer set's stream ([`Peers::subscribe`]): a set shared
    /// with other layers ([`with_peers`](Self::with_peers)) carries their members' changes too.
    /// A quarantine that ends with time is no write, so no event: its event's `to` says until
    /// when it holds.
    ///
    /// Bounded, and it never slows a writer: a subscriber that falls behind loses the oldest
    /// events and is told how many (`RecvError::Lagged`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use endpoint_state::{EndpointCard, LineKind};
    /// use quarantine_layer::QuarantineGroup;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let group = QuarantineGroup::default();
    /// group.add(EndpointCard::new("b1"));
    /// let mut events = group.subscribe();
    /// group.report_failure_with_reason("b1", Some(Duration::from_secs(5)), "health probe: refused").unwrap();
    /// let event = events.recv().await.unwrap();
    /// assert_eq!(event.line, LineKind::Quarantine);
    /// assert!(event.is_transition());
    /// assert_eq!(event.to_string(), "b1: not quarantined -> quarantined (health probe: refused)");
    /// # }
    /// ```
    pub fn subscribe(&self) -> broadcast::Receiver<CardEvent> {
        self.inner.peers.subscribe()
    }

    /// Adds an endpoint's card. A card already in the group is left as it is (`false`); a
    /// different card with the same target name replaces it (`true`), starting a fresh repeat
    /// count.
    pub fn add(&self, card: EndpointCard) -> bool {
        self.inner.insert(card).1
    }

    /// Removes the member named `target` and returns its card (also taken out of the peer
    /// set). Its card is left as it is otherwise; any endpoint that was kept shut because that
    /// member was eligible looks again.
    pub fn remove(&self, target: &str) -> Option<EndpointCard> {
        let removed = {
            let mut roster = lock(&self.inner.membership);
            let member = roster.by_name.remove(target)?;
            roster.order.remove(&member.seq);
            self.inner.changed();
            member
        };
        self.inner.peers.remove_card(&removed.card);
        Some(removed.card.clone())
    }

    /// Whether a member is named `target`.
    pub fn contains(&self, target: &str) -> bool {
        self.inner.find(target).is_some()
    }

    /// Every member's card, in the order they were added.
    pub fn cards(&self) -> Vec<EndpointCard> {
        let members = self.inner.snapshot();
        members.list.iter().map(|m| m.card.clone()).collect()
    }

    /// How many members.
    pub fn len(&self) -> usize {
        lock(&self.inner.membership).by_name.len()
    }

    /// Whether the group has no member.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Quarantines `target` from outside the call path: for `duration`, or for the configured
    /// time of its next repeat (`duration × count`, capped) when `None`. Returns when the
    /// quarantine ends.
    ///
    /// Like a failed call, it starts a quarantine (and counts a repeat) if the target is not
    /// quarantined, or else renews it (moves its end later, never earlier). A `duration` of
    /// zero does nothing; one longer than a year is cut to a year.
    pub fn report_failure(
        &self,
        target: &str,
        duration: Option<Duration>,
    ) -> Result<Instant, UnknownTarget> {
        self.report_failure_with_reason(target, duration, "failure reported")
    }

    /// [`report_failure`](Self::report_failure) with the reason to show on the card (and in
    /// the errors of a balancer that skips the target).
    pub fn report_failure_with_reason(
        &self,
        target: &str,
        duration: Option<Duration>,
        reason: impl Into<Reason>,
    ) -> Result<Instant, UnknownTarget> {
        let member = self
            .inner
            .find(target)
            .ok_or_else(|| UnknownTarget::new(target))?;
        if duration.is_some_and(|d| d.is_zero()) {
            return Ok(Instant::now());
        }
        let duration = duration.map(|d| d.min(MAX_SETTING));
        Ok(self
            .inner
            .quarantine(&member, duration, reason.into(), Cause::Reported))
    }

    /// Lifts `target`'s quarantine now (an operator's override). Its repeat count is kept.
    /// Returns whether it was quarantined.
    pub fn lift(&self, target: &str) -> Result<bool, UnknownTarget> {
        let member = self
            .inner
            .find(target)
            .ok_or_else(|| UnknownTarget::new(target))?;
        let now = Instant::now();
        let mut strikes = lock(&member.strikes);
        let was = member.card.quarantine_state().active_at(now);
        if let Some(event) = member.card.clear_quarantine() {
            strikes.last_end = Some(strikes.last_end.map_or(now, |end| end.min(now)));
            tracing::info!(backend = %event.target, "quarantine lifted by the operator");
        }
        Ok(was)
    }

    /// How many quarantines in a row `target` has had, after the decay it has earned so far
    /// (one per [`decay_after`](QuarantineConfig::decay_after) out of quarantine). Its next
    /// quarantine lasts `duration × (strikes + 1)`, capped.
    pub fn strikes(&self, target: &str) -> Option<u32> {
        let member = self.inner.find(target)?;
        let strikes = lock(&member.strikes);
        Some(strikes.decayed(Instant::now(), self.inner.config.decay_after))
    }

    /// Whether quarantine lets calls reach `target` now: it is not quarantined, or the rule
    /// of its [`Peers`] admits it anyway ([`EndpointCard::admission`]: no peer is eligible).
    ///
    /// This is what the layer's `poll_ready` decides; a balancer that reads cards directly
    /// asks the card the same question.
    pub fn admits(&self, target: &str) -> Result<bool, UnknownTarget> {
        let member = self
            .inner
            .find(target)
            .ok_or_else(|| UnknownTarget::new(target))?;
        let card = &member.card;
        Ok(!card.quarantine_state().active_at(Instant::now()) || card.admission().admits())
    }

    pub(crate) fn bind(&self, card: EndpointCard) -> Arc<Binding> {
        let member = self
            .inner
            .find(card.target())
            .filter(|m| m.card.same_card(&card));
        let member = member.unwrap_or_else(|| self.inner.insert(card).0);
        Arc::new(Binding {
            group: self.inner.clone(),
            member,
        })
    }
}

impl GroupInner {
    /// The member named `target`: O(1).
    fn find(&self, target: &str) -> Option<Arc<Member>> {
        lock(&self.membership).by_name.get(target).cloned()
    }

    /// The members in the order they were added, rebuilt first if they changed since the last
    /// read (O(n) once per change, however many members changed).
    pub(crate) fn snapshot(&self) -> arc_swap::Guard<Arc<Members>> {
        if self.stale.load(Ordering::Acquire) {
            let roster = lock(&self.membership);
            if self.stale.swap(false, Ordering::AcqRel) {
                self.members.store(Arc::new(Members {
                    list: roster.order.values().cloned().collect(),
                }));
            }
        }
        self.members.load()
    }

    /// Records a change of membership (made under the lock).
    fn changed(&self) {
        self.stale.store(true, Ordering::Release);
    }

    /// Adds `card` (or finds it); returns its member and whether the group changed. A card of
    /// the same name replaces the member in its place in the order.
    fn insert(&self, card: EndpointCard) -> (Arc<Member>, bool) {
        let replaced_card;
        let member = {
            let mut roster = lock(&self.membership);
            let name: Arc<str> = Arc::from(card.target());
            let seq = match roster.by_name.get(&name) {
                Some(m) if m.card.same_card(&card) => return (m.clone(), false),
                Some(m) => m.seq,
                None => {
                    roster.next += 1;
                    roster.next
                }
            };
            let member = Arc::new(Member::new(card, seq));
            replaced_card = roster
                .by_name
                .insert(name, member.clone())
                .map(|old| old.card.clone());
            roster.order.insert(seq, member.clone());
            self.changed();
            member
        };
        if let Some(old) = replaced_card {
            // The old card leaves the peer set (which wakes whoever it kept shut).
            self.peers.remove_card(&old);
        }
        self.peers.add(&member.card);
        (member, true)
    }

    /// Quarantines (or renews the quarantine of) `member`: for `fixed`, or for the configured
    /// time of its repeat count. Returns the quarantine's end.
    ///
    /// A member that is not quarantined starts a quarantine: its repeat count (after decay)
    /// goes up by one. One that is quarantined has its end moved later to `now + duration`
    /// (never earlier, count unchanged); a renewal that would gain less than a twentieth of the
    /// duration is skipped, so that a burst of failures from one incident costs one write.
    pub(crate) fn quarantine(
        &self,
        member: &Member,
        fixed: Option<Duration>,
        reason: Reason,
        cause: Cause,
    ) -> Instant {
        let now = Instant::now();
        let card = &member.card;
        let mut strikes = lock(&member.strikes);
        match card.quarantine_state().until.filter(|u| *u > now) {
            Some(until) => {
                let duration = fixed.unwrap_or_else(|| self.config.duration_for(strikes.count));
                let renewed = now + duration;
                if renewed <= until || renewed - until < duration / 20 {
                    return until;
                }
                strikes.last_end = Some(renewed);
                if let Some(event) = card.quarantine_until(renewed, Some(reason)) {
                    tracing::debug!(
                        backend = %event.target,
                        %cause,
                        reason = event.reason.as_deref(),
                        until_in = ?duration,
                        "quarantine renewed"
                    );
                }
                renewed
            }
            None => {
                let count = strikes
                    .decayed(now, self.config.decay_after)
                    .saturating_add(1);
                strikes.count = count;
                let duration = fixed.unwrap_or_else(|| self.config.duration_for(count));
                let until = now + duration;
                strikes.last_end = Some(until);
                if let Some(event) = card.quarantine_until(until, Some(reason)) {
                    tracing::info!(
                        backend = %event.target,
                        %cause,
                        reason = event.reason.as_deref(),
                        duration = ?duration,
                        repeat = count,
                        "quarantined"
                    );
                }
                until
            }
        }
    }

    /// A call admitted while `member`'s quarantine (ending `seen_until`) was ignored has
    /// succeeded: lift that quarantine, unless it was renewed since.
    fn lift_after_success(&self, member: &Member, seen_until: Instant) {
        let now = Instant::now();
        let mut strikes = lock(&member.strikes);
        if member.card.quarantine_state().until != Some(seen_until) {
            return;
        }
        if let Some(event) = member.card.clear_quarantine() {
            strikes.last_end = Some(seen_until.min(now));
            tracing::info!(
                backend = %event.target,
                "quarantine lifted: a call admitted while it was ignored succeeded"
            );
        }
    }
}

impl outlier::Group for GroupInner {
    fn members(&self) -> arc_swap::Guard<Arc<Members>> {
        self.snapshot()
    }

    fn eject(&self, member: &Member, reason: Reason) {
        self.quarantine(member, None, reason, Cause::Outlier);
    }
}

/// One endpoint's place in its group: what its service and its calls' outcomes act on.
pub(crate) struct Binding {
    pub(crate) group: Arc<GroupInner>,
    pub(crate) member: Arc<Member>,
}

impl fmt::Debug for Binding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Binding")
            .field("target", &self.member.card.target())
            .finish_non_exhaustive()
    }
}

impl Binding {
    pub(crate) fn card(&self) -> &EndpointCard {
        &self.member.card
    }

    pub(crate) fn group(&self) -> QuarantineGroup {
        QuarantineGroup {
            inner: self.group.clone(),
        }
    }

    /// A call's outcome: count it for outlier ejection, quarantine on a failure code, lift a
    /// degraded admission's quarantine on success.
    pub(crate) fn record(&self, outcome: Outcome, degraded: Option<Instant>) {
        let Outcome::Completed(status) = &outcome else {
            return;
        };
        if let Some(clock) = &self.group.outlier {
            clock.record(&*self.group, &self.member, &outcome);
        }
        if self.group.config.failure_codes.classify(&outcome) == Verdict::Failure {
            // A transport error's whole chain can be long: bounded as every reason is.
            let reason = endpoint_state::text::reason(&status.to_string());
            self.group
                .quarantine(&self.member, None, reason, Cause::Call);
        } else if let Some(until) = degraded {
            self.group.lift_after_success(&self.member, until);
        }
    }
}

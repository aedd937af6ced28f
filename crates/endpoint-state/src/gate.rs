//! The gate: the reusable readiness piece every gating layer builds its `poll_ready` on.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::futures::OwnedNotified;
use tokio::time::{Instant, Sleep};

use crate::card::{Changed, EndpointCard};
use crate::peers::{Admission, Peers, Witness};

/// What a layer's line says about admitting a call right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateCheck {
    /// Calls may pass.
    Open,
    /// Shut until some line of the card changes.
    Shut,
    /// Shut until the instant (a quarantine or an open breaker expiring) or until the card
    /// changes, whichever comes first.
    ShutUntil(Instant),
}

/// Why [`Gate::poll_open`] returned `Ready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// The check said [`GateCheck::Open`].
    Open,
    /// The instant of a [`GateCheck::ShutUntil`] has passed; the caller decides what that means
    /// for its line (a breaker goes half-open, a quarantine simply ends).
    DeadlinePassed,
}

/// Lets a layer's `poll_ready` return `Pending` until its line of the card opens, with a waker
/// that will fire: a change of the card, or one reused timer at the line's own deadline.
///
/// A gate never returns an error: a shut line is a transient condition, and tower treats an
/// `Err` from `poll_ready` as final (`ReadyCache` evicts the endpoint, `Buffer` fails every
/// clone). It never busy-polls (no `wake_by_ref` followed by `Pending`).
///
/// The open path costs one call of the check and nothing else: the gate subscribes to the
/// card only when the check says shut, and looks again right after subscribing, so a change
/// that lands in between is never lost.
///
/// Cloning a gate gives a fresh, unsubscribed gate on the same card.
///
/// ```
/// use std::task::Poll;
/// use endpoint_state::{EndpointCard, Gate, GateCheck, HealthVerdict};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let card = EndpointCard::new("b1");
/// card.set_health(HealthVerdict::Unknown, None);
/// let mut gate = Gate::new(card.clone());
/// let healthy = |c: &EndpointCard| if c.health_verdict().admits() { GateCheck::Open } else { GateCheck::Shut };
///
/// let mut task = tokio_test::task::spawn(());
/// assert!(task.enter(|cx, _| gate.poll_open(cx, healthy)).is_pending());
/// card.set_health(HealthVerdict::Healthy, None);
/// assert!(task.is_woken());
/// assert!(task.enter(|cx, _| gate.poll_open(cx, healthy)).is_ready());
/// # }
/// ```
pub struct Gate {
    card: EndpointCard,
    notified: Option<Pin<Box<OwnedNotified>>>,
    sleep: Option<Pin<Box<Sleep>>>,
    sleep_armed: bool,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("target", &self.card.target())
            .field("subscribed", &self.notified.is_some())
            .field("timer_armed", &self.sleep_armed)
            .finish()
    }
}

impl Clone for Gate {
    fn clone(&self) -> Self {
        Gate::new(self.card.clone())
    }
}

impl Gate {
    /// A gate on `card`.
    pub fn new(card: EndpointCard) -> Self {
        Gate {
            card,
            notified: None,
            sleep: None,
            sleep_armed: false,
        }
    }

    /// The card this gate watches.
    pub fn card(&self) -> &EndpointCard {
        &self.card
    }

    /// `Ready` once `check` says [`GateCheck::Open`] or the instant of a
    /// [`GateCheck::ShutUntil`] passes; `Pending` otherwise, with `cx`'s waker registered on
    /// the card (and on the timer, when there is an instant).
    ///
    /// `check` is called at least once per poll, and again after each wake-up source fires.
    pub fn poll_open<F>(&mut self, cx: &mut Context<'_>, mut check: F) -> Poll<Opened>
    where
        F: FnMut(&EndpointCard) -> GateCheck,
    {
        loop {
            let until = match check(&self.card) {
                GateCheck::Open => {
                    self.unsubscribe();
                    return Poll::Ready(Opened::Open);
                }
                GateCheck::Shut => None,
                GateCheck::ShutUntil(at) => Some(at),
            };

            if self.notified.is_none() {
                // Subscribe, then look again: a change between the look above and this
                // subscription completes the subscription, so it cannot be missed.
                self.notified = Some(Box::pin(self.card.notified()));
                continue;
            }

            match until {
                Some(at) => {
                    if self.poll_timer(cx, at).is_ready() {
                        self.unsubscribe();
                        return Poll::Ready(Opened::DeadlinePassed);
                    }
                }
                None => self.disarm_timer(),
            }

            let notified = self.notified.as_mut().expect("subscribed above");
            match notified.as_mut().poll(cx) {
                // The card changed: drop the spent subscription and look again.
                Poll::Ready(()) => self.notified = None,
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn poll_timer(&mut self, cx: &mut Context<'_>, at: Instant) -> Poll<()> {
        let sleep = match &mut self.sleep {
            Some(sleep) => {
                if sleep.deadline() != at {
                    sleep.as_mut().reset(at);
                }
                sleep
            }
            None => self.sleep.insert(Box::pin(tokio::time::sleep_until(at))),
        };
        self.sleep_armed = true;
        let ready = sleep.as_mut().poll(cx);
        if ready.is_ready() {
            self.sleep_armed = false;
        }
        ready
    }

    fn disarm_timer(&mut self) {
        if self.sleep_armed {
            if let Some(sleep) = &mut self.sleep {
                sleep.as_mut().reset(crate::time::far_future());
            }
            self.sleep_armed = false;
        }
    }

    /// Stop waiting: forget the card subscription and park the timer, so that nothing wakes
    /// the last task that polled this gate.
    fn unsubscribe(&mut self) {
        self.notified = None;
        self.disarm_timer();
    }
}

/// What the line of a passive signal (quarantine, an open breaker, a half-open breaker with
/// every probe permit taken) says about admitting a call right now. See [`PassiveGate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassiveCheck {
    /// Calls may pass.
    Open,
    /// Shut for a reason that is not passive (an operator's forced-open breaker), until some
    /// line of the card changes.
    Shut,
    /// Shut by the passive signal itself — until the instant, if it has one — unless no peer
    /// is eligible (then calls are admitted anyway).
    Passive(Option<Instant>),
}

/// Why [`PassiveGate::poll_open`] returned `Ready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassiveOpened {
    /// The line is open.
    Open,
    /// The line is shut by its passive signal, but no peer is eligible: the call is admitted
    /// anyway ([`Admission::Degraded`]).
    Degraded,
    /// The instant of a [`PassiveCheck::Passive`] has passed.
    DeadlinePassed,
}

/// The gate of a passive line: like [`Gate`], and while its line is shut by the passive signal
/// it also applies the one rule of [`peers`](crate::peers) — shut while an eligible peer (the
/// *witness*) takes the calls, open ([`PassiveOpened::Degraded`]) when none does.
///
/// While shut it waits on its own card (and the line's instant), on the witness's card, and on
/// members leaving the peer set: when the last eligible peer stops being eligible or leaves,
/// the task is woken and the call goes through. Quarantine and the breaker build their
/// `poll_ready` on it, so they and a balancer (which asks [`EndpointCard::admission`]) always
/// agree.
pub struct PassiveGate {
    gate: Gate,
    watch: Option<WitnessWatch>,
}

struct WitnessWatch {
    peers: Peers,
    witness: Witness,
    changed: Changed,
    left: Pin<Box<OwnedNotified>>,
}

impl fmt::Debug for PassiveGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PassiveGate")
            .field("gate", &self.gate)
            .field(
                "kept_shut_by",
                &self.watch.as_ref().map(|w| w.witness.card.target()),
            )
            .finish()
    }
}

impl Clone for PassiveGate {
    fn clone(&self) -> Self {
        PassiveGate::new(self.gate.card.clone())
    }
}

impl PassiveGate {
    /// A passive gate on `card`.
    pub fn new(card: EndpointCard) -> Self {
        PassiveGate {
            gate: Gate::new(card),
            watch: None,
        }
    }

    /// The card this gate watches.
    pub fn card(&self) -> &EndpointCard {
        &self.gate.card
    }

    /// The eligible peer that keeps the line shut, while it waits.
    pub fn witness(&self) -> Option<&EndpointCard> {
        self.watch.as_ref().map(|w| &w.witness.card)
    }

    /// `Ready` once `check` says [`PassiveCheck::Open`], its instant passes, or its passive
    /// signal shuts the line while no peer is eligible; `Pending` otherwise, with `cx`'s waker
    /// registered on the card (and timer), and on the witness and the peer set when there is
    /// one.
    pub fn poll_open<F>(&mut self, cx: &mut Context<'_>, mut check: F) -> Poll<PassiveOpened>
    where
        F: FnMut(&EndpointCard) -> PassiveCheck,
    {
        loop {
            let hint = self.watch.as_ref().map(|w| w.witness.clone());
            let mut degraded = false;
            let mut found: Option<Witness> = None;
            let opened = self.gate.poll_open(cx, |card| {
                degraded = false;
                found = None;
                match check(card) {
                    PassiveCheck::Open => GateCheck::Open,
                    PassiveCheck::Shut => GateCheck::Shut,
                    PassiveCheck::Passive(until) => {
                        match card.admission_with_hint(hint.as_ref()) {
                            Admission::Degraded => {
                                degraded = true;
                                return GateCheck::Open;
                            }
                            Admission::Shut { witness } => found = witness,
                            // The card says eligible while the line says shut: the line's
                            // own state is a moment ahead; it wins.
                            Admission::Eligible => {}
                        }
                        until.map_or(GateCheck::Shut, GateCheck::ShutUntil)
                    }
                }
            });
            match opened {
                Poll::Ready(Opened::Open) => {
                    self.watch = None;
                    return Poll::Ready(if degraded {
                        PassiveOpened::Degraded
                    } else {
                        PassiveOpened::Open
                    });
                }
                Poll::Ready(Opened::DeadlinePassed) => {
                    self.watch = None;
                    return Poll::Ready(PassiveOpened::DeadlinePassed);
                }
                Poll::Pending => {}
            }
            let Some(witness) = found else {
                self.watch = None;
                return Poll::Pending;
            };
            if self.watch.as_ref().is_none_or(|w| w.witness != witness) {
                let Some(peers) = self.gate.card.peers() else {
                    self.watch = None;
                    continue;
                };
                let watch = self.watch.insert(WitnessWatch {
                    changed: witness.card.changed(),
                    left: Box::pin(peers.member_left()),
                    peers,
                    witness,
                });
                // Subscribed; look again, so that a change in between is not lost.
                if !watch.peers.witness_holds(&watch.witness) {
                    continue;
                }
            }
            let watch = self
                .watch
                .as_mut()
                .expect("watching while shut by a witness");
            if Pin::new(&mut watch.changed).poll(cx).is_ready()
                || watch.left.as_mut().poll(cx).is_ready()
            {
                self.watch = None;
                continue;
            }
            return Poll::Pending;
        }
    }
}

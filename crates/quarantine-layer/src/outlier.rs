//! Outlier ejection by failure percentage, evaluated lazily on call outcomes (no timer task).
//!
//! An interval is judged by the first outcome after it ends. That may be late — nothing is
//! judged while no call comes — but never by more than one interval: counts whose interval
//! ended longer ago than that (a quiet night, say) are dropped unjudged, and the interval that
//! starts with the next call is judged on its own calls.

use std::cmp::Ordering as CmpOrdering;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, TryLockError};

use endpoint_state::{Outcome, Reason, Verdict};
use tokio::time::Instant;

use crate::config::OutlierEjection;
use crate::member::{Member, Members};

/// What an evaluation reads and acts on: the group's members, and a quarantine.
pub(crate) trait Group {
    /// The members now.
    fn members(&self) -> arc_swap::Guard<Arc<Members>>;
    /// Quarantines `member` as an outlier, for `reason`.
    fn eject(&self, member: &Member, reason: Reason);
}

/// The policy and its clock: when the current interval ends, and who is evaluating.
pub(crate) struct OutlierClock {
    policy: OutlierEjection,
    epoch: Instant,
    /// The end of the current interval, in nanoseconds since `epoch`.
    next: AtomicU64,
    /// Held by the one caller that evaluates an interval; others skip.
    evaluating: Mutex<()>,
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl OutlierClock {
    pub(crate) fn new(policy: OutlierEjection) -> Self {
        let next = nanos(policy.interval);
        OutlierClock {
            policy,
            epoch: Instant::now(),
            next: AtomicU64::new(next),
            evaluating: Mutex::new(()),
        }
    }

    /// Counts one outcome of `member`'s, after judging the interval that ended, if one did.
    pub(crate) fn record(&self, group: &impl Group, member: &Member, outcome: &Outcome) {
        let now = Instant::now();
        let since = nanos(now.saturating_duration_since(self.epoch));
        if since >= self.next.load(Ordering::Acquire) {
            self.evaluate_if_due(group, now, since);
        }
        let counter = if self.policy.failure_codes.classify(outcome) == Verdict::Failure {
            &member.failures
        } else {
            &member.successes
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn evaluate_if_due(&self, group: &impl Group, now: Instant, since: u64) {
        let _evaluating = match self.evaluating.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            // Someone else is judging this interval.
            Err(TryLockError::WouldBlock) => return,
        };
        let ended = self.next.load(Ordering::Acquire);
        if since < ended {
            return;
        }
        let interval = nanos(self.policy.interval);
        self.next
            .store(since.saturating_add(interval), Ordering::Release);
        if since - ended >= interval {
            // No call for a whole interval since this one ended: its counts are that old (hours,
            // after a quiet night). They say nothing about the targets now; start afresh.
            tracing::trace!(
                idle_ms = (since - ended) / 1_000_000,
                "outlier ejection: counts from before a quiet spell dropped, not judged"
            );
            for member in &group.members().list {
                member.failures.store(0, Ordering::Relaxed);
                member.successes.store(0, Ordering::Relaxed);
            }
            return;
        }
        self.evaluate(group, now);
    }

    /// Judges the counts gathered since the last evaluation and resets them.
    fn evaluate(&self, group: &impl Group, now: Instant) {
        let policy = &self.policy;
        let members = group.members();
        let hosts = members.list.len();
        let mut with_volume = 0usize;
        let mut outliers: Vec<(&Member, u64, u64)> = Vec::new();
        for member in &members.list {
            let failures = member.failures.swap(0, Ordering::Relaxed);
            let total = failures + member.successes.swap(0, Ordering::Relaxed);
            if total < policy.request_volume {
                continue;
            }
            with_volume += 1;
            if u128::from(failures) * 100
                > u128::from(policy.failure_percentage_threshold) * u128::from(total)
            {
                outliers.push((member, failures, total));
            }
        }
        if with_volume < policy.minimum_hosts {
            tracing::trace!(
                with_volume,
                minimum_hosts = policy.minimum_hosts,
                "outlier ejection skipped: too few targets carried the request volume"
            );
            return;
        }
        if outliers.is_empty() {
            return;
        }
        // The worst first (highest failure ratio), then by name for a stable order.
        outliers.sort_by(|a, b| {
            let (fa, ta) = (u128::from(a.1), u128::from(a.2));
            let (fb, tb) = (u128::from(b.1), u128::from(b.2));
            match (fb * ta).cmp(&(fa * tb)) {
                CmpOrdering::Equal => a.0.card.target().cmp(b.0.card.target()),
                other => other,
            }
        });
        let allowed = policy.max_ejected(hosts);
        let mut out = members
            .list
            .iter()
            .filter(|m| m.card.quarantine_state().active_at(now))
            .count();
        for (member, failures, total) in outliers {
            if member.card.quarantine_state().active_at(now) {
                continue;
            }
            if out >= allowed {
                tracing::debug!(
                    backend = %member.card.target(),
                    failures,
                    total,
                    allowed,
                    "outlier not ejected: the group's maximum ejected share is reached"
                );
                continue;
            }
            let reason = format!(
                "outlier ejection: {failures} of {total} calls failed (over {} %)",
                policy.failure_percentage_threshold
            );
            group.eject(member, reason.into());
            out += 1;
        }
    }
}

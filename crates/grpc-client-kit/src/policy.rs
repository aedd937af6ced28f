//! gRPC's retry policy (gRFC A6), applied over the kit's replay buffer.
//!
//! A method whose service config has a `retryPolicy` gets an [`Attempts`] per call: after
//! each attempt that ended with a status in `retryableStatusCodes` it decides whether the
//! call goes again ([`Verdict::Retry`], after a jittered exponential backoff, or exactly the
//! server's `grpc-retry-pushback-ms`), or ends with that attempt's status
//! ([`Verdict::Commit`]). The call is committed once response headers arrive (a trailers-only
//! response is a status, not a commit), or when its request cannot be replayed whole (the
//! replay buffer's limits, see [`retry`](crate::retry)): then no attempt follows.
//!
//! `retryThrottling` is one [`Throttle`] per kit: each retryable failure takes a token, each
//! success gives back `tokenRatio`; no retry starts while the tokens are at or below half of
//! `maxTokens`.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use http::HeaderMap;
use tonic::Code;

use crate::service_config::{HedgingPolicy, RetryPolicy, RetryThrottling, ServiceConfig};

/// A6 caps `maxAttempts` at 5, whatever the config says.
pub(crate) const MAX_ATTEMPTS: u32 = 5;

/// The header that tells a backend how many attempts of this call came before.
pub(crate) const PREVIOUS_ATTEMPTS: &str = "grpc-previous-rpc-attempts";

/// The header a backend sets to push back on retries.
const PUSHBACK: &str = "grpc-retry-pushback-ms";

/// A kit's retry settings: its service config (when a method has a retry policy) and its
/// throttle.
pub(crate) struct Retries {
    config: Arc<ServiceConfig>,
    /// Each method entry's policy, by its index in the config (shared by its calls).
    policies: Vec<Option<MethodPolicy>>,
    throttle: Option<Arc<Throttle>>,
}

/// A method entry's policy.
#[derive(Clone)]
enum MethodPolicy {
    Retry(Arc<RetryPolicy>),
    Hedge(Arc<HedgingPolicy>),
}

impl fmt::Debug for Retries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retries")
            .field("throttle", &self.throttle)
            .finish_non_exhaustive()
    }
}

impl Retries {
    /// The kit's retry settings, if any method of `config` has a retry or hedging policy.
    pub(crate) fn for_kit(config: Option<&ServiceConfig>) -> Option<Arc<Retries>> {
        let config = config?;
        if !config
            .method_configs()
            .iter()
            .any(|m| m.retry_policy.is_some() || m.hedging_policy.is_some())
        {
            return None;
        }
        let policies = config
            .method_configs()
            .iter()
            .map(|m| match (&m.hedging_policy, &m.retry_policy) {
                (Some(hedging), _) => Some(MethodPolicy::Hedge(Arc::new(hedging.clone()))),
                (None, Some(retry)) => Some(MethodPolicy::Retry(Arc::new(retry.clone()))),
                (None, None) => None,
            })
            .collect();
        Some(Arc::new(Retries {
            config: Arc::new(config.clone()),
            policies,
            throttle: config
                .retry_throttling()
                .map(|t| Arc::new(Throttle::new(t))),
        }))
    }

    /// The policy of a call to the method at `path`, if its method has one.
    pub(crate) fn for_call(&self, path: &str) -> Option<CallPolicy> {
        let index = self.config.method_index(path)?;
        let policy = match self.policies.get(index)?.as_ref()? {
            MethodPolicy::Hedge(hedging) => {
                return Some(CallPolicy::Hedge(
                    Arc::clone(hedging),
                    self.throttle.clone(),
                ));
            }
            MethodPolicy::Retry(retry) => retry,
        };
        Some(CallPolicy::Retry(Box::new(Attempts {
            max: policy.max_attempts.clamp(1, MAX_ATTEMPTS),
            backoff: policy.initial_backoff,
            policy: Arc::clone(policy),
            made: 1,
            tried: Vec::new(),
            throttle: self.throttle.clone(),
            transparent_used: false,
        })))
    }
}

/// A call's policy (gRFC A6 says a method has one or the other).
pub(crate) enum CallPolicy {
    /// Retries after retryable statuses.
    Retry(Box<Attempts>),
    /// Hedged attempts.
    Hedge(Arc<HedgingPolicy>, Option<Arc<Throttle>>),
}

/// A kit's retry throttle (A6's `retryThrottling`), in thousandths of a token.
pub(crate) struct Throttle {
    milli: AtomicU32,
    max: u32,
    ratio: u32,
}

impl fmt::Debug for Throttle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttle")
            .field(
                "tokens",
                &(f64::from(self.milli.load(Ordering::Relaxed)) / 1000.0),
            )
            .field("max", &(self.max / 1000))
            .finish()
    }
}

impl Throttle {
    pub(crate) fn new(config: &RetryThrottling) -> Self {
        let max = config.max_tokens.saturating_mul(1000);
        // Validated: above zero, three decimal places at most.
        let ratio = (config.token_ratio * 1000.0)
            .round()
            .clamp(0.0, f64::from(max)) as u32;
        Throttle {
            milli: AtomicU32::new(max),
            max,
            ratio,
        }
    }

    /// A retryable failure: one token less (never below zero).
    pub(crate) fn failure(&self) {
        let _ = self
            .milli
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_sub(1000))
            });
    }

    /// A success: `tokenRatio` back (never above `maxTokens`).
    pub(crate) fn success(&self) {
        let _ = self
            .milli
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(self.ratio).min(self.max))
            });
    }

    /// Whether a retry may start: more tokens than half of `maxTokens`.
    pub(crate) fn allows(&self) -> bool {
        self.milli.load(Ordering::Acquire) > self.max / 2
    }
}

/// What to do after an attempt's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The call ends with this attempt's status.
    Commit,
    /// The call goes again after this delay.
    Retry(Duration),
}

/// One call's attempts under its method's retry policy.
pub(crate) struct Attempts {
    policy: Arc<RetryPolicy>,
    /// `maxAttempts`, capped.
    max: u32,
    /// The backoff the next retry draws its delay from.
    backoff: Duration,
    /// Attempts sent so far (the first included).
    made: u32,
    /// The targets the attempts went to, in order.
    tried: Vec<Arc<str>>,
    throttle: Option<Arc<Throttle>>,
    /// Whether the call's one transparent retry is spent.
    pub(crate) transparent_used: bool,
}

impl fmt::Debug for Attempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attempts")
            .field("made", &self.made)
            .field("max", &self.max)
            .field("tried", &self.tried)
            .finish_non_exhaustive()
    }
}

impl Attempts {
    /// An attempt went to `target` (when the kit can tell).
    pub(crate) fn tried(&mut self, target: Option<Arc<str>>) {
        if let Some(target) = target
            && self.tried.len() < MAX_ATTEMPTS as usize * 2
        {
            self.tried.push(target);
        }
    }

    /// The targets the attempts went to, in order.
    pub(crate) fn targets(&self) -> &[Arc<str>] {
        &self.tried
    }

    /// Attempts sent so far.
    pub(crate) fn made(&self) -> u32 {
        self.made
    }

    /// The next attempt is sent.
    pub(crate) fn sent_again(&mut self) {
        self.made += 1;
    }

    /// The call is committed with response headers (no status yet): a success for the
    /// throttle.
    pub(crate) fn committed(&self) {
        if let Some(throttle) = &self.throttle {
            throttle.success();
        }
    }

    /// Judges an attempt that ended with `code` (and the trailers-only response's `headers`,
    /// which may push back).
    pub(crate) fn judge(&mut self, code: Code, headers: Option<&HeaderMap>) -> Verdict {
        if code == Code::Ok {
            self.committed();
            return Verdict::Commit;
        }
        if !self.policy.retryable_status_codes.contains(&code) {
            return Verdict::Commit;
        }
        if let Some(throttle) = &self.throttle {
            throttle.failure();
        }
        let Ok(pushback) = pushback(headers) else {
            // Negative or malformed: the server says not to retry.
            return Verdict::Commit;
        };
        if self.made >= self.max || self.throttle.as_ref().is_some_and(|t| !t.allows()) {
            return Verdict::Commit;
        }
        let delay = match pushback {
            Some(delay) => {
                // After a pushback, the backoff starts over.
                self.backoff = self.policy.initial_backoff;
                delay
            }
            None => {
                let delay = self.backoff.mul_f64(endpoint_state::rng::unit());
                let next = self.backoff.as_secs_f64() * self.policy.backoff_multiplier;
                let next = Duration::try_from_secs_f64(next).unwrap_or(self.policy.max_backoff);
                self.backoff = next.min(self.policy.max_backoff);
                delay
            }
        };
        Verdict::Retry(delay)
    }

    /// What the caller's message adds when more than one attempt was made: `(attempts:
    /// http://a, http://b)`.
    pub(crate) fn note(&self) -> Option<String> {
        if self.made < 2 || self.tried.is_empty() {
            return None;
        }
        let mut note = String::from("(attempts: ");
        for (i, target) in self.tried.iter().enumerate() {
            if i > 0 {
                note.push_str(", ");
            }
            note.push_str(target);
        }
        note.push(')');
        Some(note)
    }
}

/// The server's pushback in a trailers-only response's `headers`: `Ok(Some(delay))` for a
/// delay, `Ok(None)` without one, `Err(())` when it says not to retry (negative or
/// malformed).
pub(crate) fn pushback(headers: Option<&HeaderMap>) -> Result<Option<Duration>, ()> {
    let Some(value) = headers.and_then(|h| h.get(PUSHBACK)) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u64>().ok())
        .map(|ms| Some(Duration::from_millis(ms)))
        .ok_or(())
}

/// The status of a trailers-only response (`grpc-status` in its headers), if it is one.
pub(crate) fn trailers_only(headers: &HeaderMap) -> Option<Code> {
    let value = headers.get(&crate::stack::GRPC_STATUS)?.to_str().ok()?;
    value.parse::<i32>().ok().map(Code::from_i32)
}

/// Appends `note` to a trailers-only response's `grpc-message` (percent-encoded as gRPC
/// says: `%`, and bytes outside printable ASCII).
pub(crate) fn append_note(headers: &mut HeaderMap, note: &str) {
    let mut message = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if !message.is_empty() {
        message.push(' ');
    }
    for b in note.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            message.push(char::from(b));
        } else {
            message.push_str(&format!("%{b:02X}"));
        }
    }
    if let Ok(value) = http::HeaderValue::from_str(&message) {
        headers.insert("grpc-message", value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempts(max: u32, throttle: Option<Arc<Throttle>>) -> Attempts {
        Attempts {
            policy: Arc::new(RetryPolicy {
                max_attempts: max,
                initial_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_millis(250),
                backoff_multiplier: 2.0,
                retryable_status_codes: vec![Code::Unavailable],
                per_attempt_recv_timeout: None,
            }),
            max: max.clamp(1, MAX_ATTEMPTS),
            backoff: Duration::from_millis(100),
            made: 1,
            tried: Vec::new(),
            throttle,
            transparent_used: false,
        }
    }

    #[test]
    fn backoff_is_jittered_below_a_growing_capped_bound() {
        let mut a = attempts(5, None);
        for bound in [100, 200, 250, 250] {
            match a.judge(Code::Unavailable, None) {
                Verdict::Retry(d) => assert!(d <= Duration::from_millis(bound), "{d:?}"),
                Verdict::Commit => panic!("should retry"),
            }
            a.sent_again();
        }
        assert_eq!(a.judge(Code::Unavailable, None), Verdict::Commit, "5 made");
    }

    #[test]
    fn max_attempts_is_capped_at_five() {
        let mut a = attempts(9, None);
        while a.judge(Code::Unavailable, None) != Verdict::Commit {
            a.sent_again();
        }
        assert_eq!(a.made(), 5);
    }

    #[test]
    fn pushback_sets_the_delay_or_stops() {
        let mut headers = HeaderMap::new();
        headers.insert(PUSHBACK, "200".parse().unwrap());
        let mut a = attempts(5, None);
        assert_eq!(
            a.judge(Code::Unavailable, Some(&headers)),
            Verdict::Retry(Duration::from_millis(200))
        );
        for bad in ["-1", "abc", "", "1.5"] {
            headers.insert(PUSHBACK, bad.parse().unwrap());
            assert_eq!(
                attempts(5, None).judge(Code::Unavailable, Some(&headers)),
                Verdict::Commit,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn non_retryable_codes_commit() {
        assert_eq!(
            attempts(5, None).judge(Code::InvalidArgument, None),
            Verdict::Commit
        );
    }

    #[test]
    fn the_throttle_stops_retries_at_half_and_recovers_with_successes() {
        let throttle = Arc::new(Throttle::new(&RetryThrottling {
            max_tokens: 10,
            token_ratio: 0.5,
        }));
        // 10 tokens: 4 failures leave 6 (> 5), the 5th leaves 5 (not > 5).
        for i in 0..4 {
            let v = attempts(5, Some(throttle.clone())).judge(Code::Unavailable, None);
            assert!(matches!(v, Verdict::Retry(_)), "failure {i}");
        }
        let v = attempts(5, Some(throttle.clone())).judge(Code::Unavailable, None);
        assert_eq!(v, Verdict::Commit);
        // Three successes give back 1.5 tokens (6.5); the next failure leaves 5.5 (> 5).
        for _ in 0..3 {
            attempts(5, Some(throttle.clone())).judge(Code::Ok, None);
        }
        let v = attempts(5, Some(throttle.clone())).judge(Code::Unavailable, None);
        assert!(matches!(v, Verdict::Retry(_)), "{throttle:?}");
    }

    #[test]
    fn the_note_is_percent_encoded_into_grpc_message() {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-message", "b0: injected failure".parse().unwrap());
        append_note(&mut headers, "(attempts: http://a, http://b%)");
        assert_eq!(
            headers["grpc-message"],
            "b0: injected failure (attempts: http://a, http://b%25)"
        );
    }
}

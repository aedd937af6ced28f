//! gRPC's standard service config, read from its JSON form.
//!
//! A team's other gRPC clients already describe a service in this JSON (gRPC's
//! `doc/service_config.md`; the proto `grpc.service_config.ServiceConfig`, read with proto3's
//! JSON mapping: camelCase field names, durations as `"1.5s"`). The kit takes the same
//! document ([`KitBuilder::service_config`](crate::KitBuilder::service_config), or
//! `service_config` in the configuration file) and applies:
//!
//! | field | in the kit |
//! |---|---|
//! | `loadBalancingConfig` | the first policy the kit knows, in order, is the balancer's [`Strategy`](crate::balance::Strategy): `round_robin`, `pick_first`, `weighted_round_robin`, `least_request` (`least_request_experimental`), `ring_hash` (`ring_hash_experimental`); unknown policies are skipped, as gRPC skips them, and a list of none the kit knows is refused, naming them (see [`LbPolicy`]) |
//! | `loadBalancingPolicy` (deprecated) | as `loadBalancingConfig`, when that is absent |
//! | `healthCheckConfig.serviceName` | the health checker's service name |
//! | `methodConfig[].timeout` | the call's deadline, unless the call's own is sooner |
//! | `methodConfig[].waitForReady` | whether the call waits for an eligible target |
//! | `methodConfig[].maxRequestMessageBytes`, `maxResponseMessageBytes` | a message longer (as sent on the wire) fails the call with `RESOURCE_EXHAUSTED` naming the limit |
//! | `methodConfig[].retryPolicy`, `hedgingPolicy`, `retryThrottling` | read and validated (gRFC A6) into [`RetryPolicy`], [`HedgingPolicy`], [`RetryThrottling`], and applied to calls as A6 says (but `perAttemptRecvTimeout`, read and not applied): see [`RetryPolicy`] and [`HedgingPolicy`] |
//!
//! A method's settings come from the `methodConfig` entry whose `name` is the method itself
//! (`{"service": "pkg.Service", "method": "Method"}`), else the service's
//! (`{"service": "pkg.Service"}`), else the default (`{}`) — gRPC's precedence. One call's
//! [`CallOptions`](crate::CallOptions) combine with them as gRPC's per-call options do: its
//! wait-for-ready overrides the method's; of two timeouts or two size limits, the smaller
//! holds.
//!
//! Fields of the document the kit does not know are ignored, as gRPC's clients ignore them
//! (a newer document still works), with one warning naming them. Every value the kit reads is
//! checked when the kit is built: an invalid one fails the build naming its JSON path and the
//! value (`service_config.methodConfig[0].timeout = "abc": expected a duration like "1.5s"`).

mod parse;

use std::collections::HashMap;
use std::time::Duration;

use endpoint_state::ConfigError;
use tonic::Code;

/// A parsed, validated gRPC service config (see the [module docs](self)).
///
/// ```
/// use std::time::Duration;
/// use grpc_client_kit::service_config::{LbPolicy, ServiceConfig};
///
/// let config = ServiceConfig::from_json(r#"{
///     "loadBalancingConfig": [{ "unknown_policy": {} }, { "round_robin": {} }],
///     "methodConfig": [
///         { "name": [{ "service": "pkg.Billing" }], "timeout": "1.5s" },
///         { "name": [{ "service": "pkg.Billing", "method": "Charge" }], "timeout": "0.25s" }
///     ]
/// }"#).unwrap();
/// assert_eq!(config.load_balancing(), Some(&LbPolicy::RoundRobin));
/// let timeout = |path| config.method(path).and_then(|m| m.timeout);
/// assert_eq!(timeout("/pkg.Billing/Charge"), Some(Duration::from_millis(250)));
/// assert_eq!(timeout("/pkg.Billing/Refund"), Some(Duration::from_millis(1500)));
/// assert_eq!(timeout("/pkg.Other/Get"), None);
///
/// let err = ServiceConfig::from_json(r#"{"methodConfig": [{"name": [{}], "timeout": "abc"}]}"#)
///     .unwrap_err();
/// assert_eq!((err.field(), err.value()), ("methodConfig[0].timeout", r#""abc""#));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServiceConfig {
    load_balancing: Option<LbPolicy>,
    health_check_service_name: Option<String>,
    methods: Vec<MethodConfig>,
    retry_throttling: Option<RetryThrottling>,
    /// `service/method` and `service` → index in `methods`.
    by_name: HashMap<Box<str>, usize>,
    /// The entry named `{}`.
    default: Option<usize>,
    /// Fields the kit ignored (JSON paths), for one warning when a kit is built.
    ignored: Vec<String>,
}

impl ServiceConfig {
    /// Reads and validates a service config in gRPC's JSON form. An error names the JSON path
    /// (`methodConfig[0].retryPolicy.maxAttempts`) and the value as written.
    pub fn from_json(json: &str) -> Result<ServiceConfig, ConfigError> {
        parse::service_config(json)
    }

    /// The load-balancing policy chosen: the first one the kit knows in
    /// `loadBalancingConfig` (or the deprecated `loadBalancingPolicy`). `None`: the document
    /// names none, and the kit's own strategy stands.
    pub fn load_balancing(&self) -> Option<&LbPolicy> {
        self.load_balancing.as_ref()
    }

    /// `healthCheckConfig.serviceName`: the service the health checker asks about.
    pub fn health_check_service_name(&self) -> Option<&str> {
        self.health_check_service_name.as_deref()
    }

    /// Every `methodConfig` entry, in order.
    pub fn method_configs(&self) -> &[MethodConfig] {
        &self.methods
    }

    /// The settings of the method at `path` (`/pkg.Service/Method`, as a request's URI path
    /// has it): its own entry, else its service's, else the default entry, else `None`.
    pub fn method(&self, path: &str) -> Option<&MethodConfig> {
        self.methods.get(self.method_index(path)?)
    }

    /// The index in [`method_configs`](Self::method_configs) of the settings of the method at
    /// `path`, as [`method`](Self::method) finds them.
    pub(crate) fn method_index(&self, path: &str) -> Option<usize> {
        if self.methods.is_empty() {
            return None;
        }
        let name = path.strip_prefix('/').unwrap_or(path);
        self.by_name
            .get(name)
            .or_else(|| {
                let (service, _) = name.split_once('/')?;
                self.by_name.get(service)
            })
            .copied()
            .or(self.default)
    }

    /// Top-level `retryThrottling`: one token bucket per kit for its retries and hedges.
    pub fn retry_throttling(&self) -> Option<&RetryThrottling> {
        self.retry_throttling.as_ref()
    }

    /// Fields of the document the kit does not read (JSON paths).
    pub(crate) fn ignored(&self) -> &[String] {
        &self.ignored
    }

    /// Whether any method has a setting the kit applies to calls.
    pub(crate) fn applies_to_calls(&self) -> bool {
        self.methods.iter().any(|m| {
            m.timeout.is_some()
                || m.wait_for_ready.is_some()
                || m.max_request_message_bytes.is_some()
                || m.max_response_message_bytes.is_some()
        })
    }
}

/// A load-balancing policy of `loadBalancingConfig`, as the kit maps it to the balancer's
/// [`Strategy`](crate::balance::Strategy).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum LbPolicy {
    /// `round_robin` → [`Strategy::RoundRobin`](crate::balance::Strategy::RoundRobin).
    RoundRobin,
    /// `pick_first` → [`Strategy::PickFirst`](crate::balance::Strategy::PickFirst): every
    /// call to the first target that can take it, the next only when it cannot.
    PickFirst {
        /// `shuffleAddressList` (gRFC A62): shuffle the targets first.
        shuffle_address_list: bool,
    },
    /// `weighted_round_robin` → [`Strategy::Weighted`](crate::balance::Strategy::Weighted)
    /// with the kit's own `weights` (a target without one counts 1.0). gRPC's policy weighs
    /// targets by the load they report (ORCA); the kit has no load reports, so its static
    /// weights stand in, and the policy's own fields are read for their types only.
    WeightedRoundRobin,
    /// `least_request` (gRPC's `least_request_experimental`, gRFC A48) →
    /// [`Strategy::LeastInFlight`](crate::balance::Strategy::LeastInFlight), power of two
    /// choices on calls in flight.
    LeastRequest {
        /// `choiceCount` (2 to 10; larger is 10, as gRPC caps it). The kit always draws two:
        /// a larger count is warned about when the kit is built.
        choice_count: u32,
    },
    /// `ring_hash` (gRPC's `ring_hash_experimental`, gRFCs A42 and A76) →
    /// [`Strategy::RingHash`](crate::balance::Strategy::RingHash): a consistent hash of each
    /// call onto a ring of the targets (the balancer caps the ring at its
    /// [`RING_SIZE_CAP`](crate::balance::Strategy::RING_SIZE_CAP), as gRPC does).
    RingHash {
        /// `minRingSize` (default 1,024).
        min_ring_size: u64,
        /// `maxRingSize` (default and largest 8,388,608).
        max_ring_size: u64,
        /// `requestHashHeader` (gRFC A76): the header whose value is hashed; `None`: a
        /// random hash per call.
        request_hash_header: Option<String>,
    },
}

impl LbPolicy {
    /// The policy's name as the kit reads it (`round_robin`, `pick_first`,
    /// `weighted_round_robin`, `least_request`, `ring_hash`).
    pub fn name(&self) -> &'static str {
        match self {
            LbPolicy::RoundRobin => "round_robin",
            LbPolicy::PickFirst { .. } => "pick_first",
            LbPolicy::WeightedRoundRobin => "weighted_round_robin",
            LbPolicy::LeastRequest { .. } => "least_request",
            LbPolicy::RingHash { .. } => "ring_hash",
        }
    }
}

/// One `name` of a `methodConfig` entry: a method (`service` and `method`), a whole service
/// (`method` empty), or every method (both empty: the default entry).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MethodName {
    /// The fully qualified service (`pkg.Service`); empty for the default entry.
    pub service: String,
    /// The method; empty for every method of the service.
    pub method: String,
}

/// One `methodConfig` entry.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct MethodConfig {
    /// The methods it applies to.
    pub names: Vec<MethodName>,
    /// `waitForReady`: whether a call waits for an eligible target instead of failing at once.
    pub wait_for_ready: Option<bool>,
    /// `timeout`: the call's deadline, unless the call's own is sooner.
    pub timeout: Option<Duration>,
    /// `maxRequestMessageBytes`: the longest request message the call may send.
    pub max_request_message_bytes: Option<u32>,
    /// `maxResponseMessageBytes`: the longest response message the call accepts.
    pub max_response_message_bytes: Option<u32>,
    /// `retryPolicy`: the method's calls are retried after a retryable status.
    pub retry_policy: Option<RetryPolicy>,
    /// `hedgingPolicy`: the method's calls are hedged (when it has one, it has no
    /// `retryPolicy`).
    pub hedging_policy: Option<HedgingPolicy>,
}

/// A method's `retryPolicy`, validated and applied as gRFC A6 says.
///
/// A call that ends with a status in `retryableStatusCodes` (a trailers-only response, or an
/// error the kit makes into such a status) is sent again, to another eligible target when
/// there is one, after a random delay between zero and the current backoff (`initialBackoff`,
/// times `backoffMultiplier` after each retry, at most `maxBackoff`) — or after exactly the
/// server's `grpc-retry-pushback-ms` (a negative or malformed one stops retrying), up to
/// `maxAttempts` attempts (at most 5), while the kit's [`RetryThrottling`] allows. Each
/// attempt after the first carries `grpc-previous-rpc-attempts`.
///
/// The call is committed (never sent again) once response headers arrive, or when its
/// request cannot be replayed whole: the kit keeps up to 64 KiB of a call's request body, and
/// 64 MiB for all of a kit's calls. The caller's deadline bounds every attempt and backoff
/// together; each attempt carries what is left of it. The caller sees the last attempt's
/// status, its message ending with the targets tried (`(attempts: http://a, http://b)`).
/// A call no backend acted on is still sent again at once (the transparent retry, once per
/// call), not counted against `maxAttempts`. `perAttemptRecvTimeout` is read, not applied.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// `maxAttempts`, the original call included: at least 2; above 5, 5.
    pub max_attempts: u32,
    /// `initialBackoff` (above zero).
    pub initial_backoff: Duration,
    /// `maxBackoff` (above zero).
    pub max_backoff: Duration,
    /// `backoffMultiplier` (above zero).
    pub backoff_multiplier: f64,
    /// `retryableStatusCodes` (not empty; names or numbers).
    pub retryable_status_codes: Vec<Code>,
    /// `perAttemptRecvTimeout` (gRFC A6's later addition; above zero), if set.
    pub per_attempt_recv_timeout: Option<Duration>,
}

/// A method's `hedgingPolicy`, validated and applied as gRFC A6 says.
///
/// The call's request body is read first and kept whole when it is ready at once, as a unary
/// call's is (up to 64 KiB, within the kit's 64 MiB); a longer one, or one not ready at once (a
/// client stream), is sent once, unhedged. The first attempt goes at once; while none
/// has answered, another goes after each `hedgingDelay`, to another target than the last one
/// when there is one, up to `maxAttempts` (at most 5) while the kit's [`RetryThrottling`]
/// allows; each carries `grpc-previous-rpc-attempts`. The first response headers win and the
/// other attempts are cancelled — counted neither for nor against their targets. A status not
/// in `nonFatalStatusCodes` ends the call at once with it; a non-fatal one ends its attempt
/// only, and the next goes at once (or after the server's `grpc-retry-pushback-ms`; a
/// negative or malformed one stops hedging). When every attempt failed, the call ends with
/// the last status, its message naming the targets tried. The caller's deadline bounds the
/// whole.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct HedgingPolicy {
    /// `maxAttempts`, the original call included: at least 2; above 5, 5.
    pub max_attempts: u32,
    /// `hedgingDelay` (default zero: every attempt at once).
    pub hedging_delay: Duration,
    /// `nonFatalStatusCodes`: codes after which the other attempts go on.
    pub non_fatal_status_codes: Vec<Code>,
}

/// The top-level `retryThrottling`, validated and applied as gRFC A6 says: one bucket of
/// `maxTokens` per kit; each attempt that ends with a retryable (or non-fatal) status takes a
/// token, each success gives back `tokenRatio`; no retry or hedge starts while the tokens are
/// at or below half of `maxTokens`. (A call committed with response headers counts as a
/// success.)
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct RetryThrottling {
    /// `maxTokens`: 1 to 1000.
    pub max_tokens: u32,
    /// `tokenRatio`: above zero, to three decimal places (more are dropped, as gRPC does).
    pub token_ratio: f64,
}

/// Reads the kit's service config, if it has one, when the kit is built: errors name their
/// path under `service_config`; fields the kit ignores are warned about once.
pub(crate) fn for_kit(json: Option<&str>) -> Result<Option<ServiceConfig>, ConfigError> {
    let Some(json) = json else {
        return Ok(None);
    };
    let config = ServiceConfig::from_json(json)
        .map_err(|e| e.within(crate::error::CONFIG, "service_config"))?;
    if !config.ignored().is_empty() {
        tracing::warn!(
            fields = ?config.ignored(),
            "service config: the kit does not read these fields; they are ignored"
        );
    }
    Ok(Some(config))
}

/// The balancer's strategy for a service config's policy (`current`: the kit's own, whose
/// weights `weighted_round_robin` keeps).
pub(crate) fn strategy(
    policy: &LbPolicy,
    current: &crate::balance::Strategy,
) -> Result<crate::balance::Strategy, ConfigError> {
    use crate::balance::{Strategy, Weights};
    Ok(match policy {
        LbPolicy::RoundRobin => Strategy::RoundRobin,
        LbPolicy::WeightedRoundRobin => match current {
            Strategy::Weighted(weights) => Strategy::Weighted(weights.clone()),
            _ => Strategy::Weighted(Weights::new()),
        },
        LbPolicy::LeastRequest { choice_count } => {
            if *choice_count != 2 {
                tracing::warn!(
                    choice_count,
                    "service config: least_request's choiceCount is {choice_count}; the kit \
                     always compares 2 targets"
                );
            }
            Strategy::LeastInFlight
        }
        LbPolicy::PickFirst {
            shuffle_address_list,
        } => Strategy::PickFirst {
            shuffle_address_list: *shuffle_address_list,
        },
        LbPolicy::RingHash {
            min_ring_size,
            max_ring_size,
            request_hash_header,
        } => Strategy::RingHash {
            min_ring_size: *min_ring_size,
            max_ring_size: *max_ring_size,
            request_hash_header: request_hash_header.clone(),
        },
    })
}

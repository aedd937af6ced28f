//! A property of every configuration: `build()` either succeeds or fails naming a field — it
//! never panics — and a kit that builds answers a call within the call's deadline.
//!
//! The configurations are random, with the durations a user may write by mistake among them:
//! zero, a nanosecond, `Duration::MAX`, `u64::MAX` seconds; and fractions and weights out of
//! range (NaN, infinite, negative, huge). The kit runs over one real test backend; each
//! built kit takes one call with a 1 s deadline, which must end (with any status) within the
//! deadline and a slack of 1 s; in half the cases the backend fails every call, so that
//! quarantine and the breaker act on the values. 32 cases, the same ones each run (a failure
//! prints the configuration, shrunk); `PROPTEST_CASES=n PROPTEST_RANDOM=1` hunts further.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use grpc_client_kit::balance::{BalanceConfig, Strategy as Pick, Weights};
use grpc_client_kit::breaker::BreakerConfig;
use grpc_client_kit::health::{HealthConfig, ProbeMode};
use grpc_client_kit::quarantine::QuarantineConfig;
use grpc_client_kit::state::Backoff;
use grpc_client_kit::{BuildError, EndpointSettings, KitConfig};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use test_backends::Backend;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;

const DEADLINE: Duration = Duration::from_secs(1);
const SLACK: Duration = Duration::from_secs(1);
/// Cases per run (`PROPTEST_CASES` overrides it, for a longer hunt).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32)
}

/// Durations: mostly usual ones, often huge ones (which must build, or be refused naming
/// their field where a layer caps them), and now and then zero or a nanosecond, which cannot
/// work for a timeout.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        1 => Just(Duration::ZERO),
        1 => Just(Duration::from_nanos(1)),
        20 => (1u64..3_000).prop_map(Duration::from_millis),
        20 => (1u64..100_000).prop_map(Duration::from_secs),
        2 => Just(Duration::from_secs(u64::MAX)),
        2 => Just(Duration::MAX),
        2 => any::<u64>().prop_map(Duration::from_secs),
    ]
}

/// A duration and one at least as long (a backoff's initial and maximum waits).
fn growing() -> impl Strategy<Value = (Duration, Duration)> {
    (duration(), duration()).prop_map(|(a, b)| (a, a.saturating_add(b)))
}

/// A keepalive: a second or more (huge ones too), and now and then one too short.
fn keepalive() -> impl Strategy<Value = Duration> {
    prop_oneof![
        1 => (0u64..1_000).prop_map(Duration::from_millis),
        20 => (1u64..100_000).prop_map(Duration::from_secs),
        3 => Just(Duration::MAX),
        3 => any::<u64>().prop_map(Duration::from_secs),
    ]
}

/// A fraction, or now and then not quite one.
fn fraction() -> impl Strategy<Value = f64> {
    prop_oneof![
        16 => Just(0.0),
        32 => 0.0..1.0,
        1 => prop_oneof![Just(1.0), Just(f64::NAN), Just(f64::INFINITY), Just(-0.5)],
    ]
}

/// A multiplier or a weight: sane, huge, or now and then impossible.
fn number() -> impl Strategy<Value = f64> {
    prop_oneof![
        40 => 1.0..4.0,
        4 => Just(1e308),
        4 => Just(f64::MAX),
        1 => prop_oneof![Just(0.0), Just(f64::NAN), Just(f64::INFINITY), Just(-1.0)],
    ]
}

/// A count of at least one, and now and then zero.
fn count(max: u32) -> impl Strategy<Value = u32> {
    prop_oneof![1 => Just(0), 20 => 1..=max]
}

/// An optional setting: unset as often as set.
fn maybe<S: Strategy>(s: S) -> impl Strategy<Value = Option<S::Value>> {
    proptest::option::weighted(0.5, s)
}

/// The five optional durations of `[endpoint]`.
type Endpoint5 = (
    Option<Duration>,
    Option<Duration>,
    Option<Duration>,
    Option<Duration>,
    Option<Duration>,
);

#[derive(Debug, Clone)]
struct Random {
    /// timeout, connect timeout, keepalive interval and timeout, TCP keepalive.
    endpoint: Endpoint5,
    watch: bool,
    health: (Duration, Duration, Duration),
    health_jitter: f64,
    probe_keepalive: Option<Duration>,
    watch_backoff: (Duration, f64, Duration, f64),
    quarantine: (Duration, Duration, Duration),
    breaker: (u32, Duration, Duration, f64, f64, u32),
    wait_for_ready: bool,
    max_wait: Option<Duration>,
    connecting_wait: Duration,
    weight: Option<f64>,
    /// Whether the backend fails every call (`UNAVAILABLE`): quarantine and the breaker act.
    failing: bool,
}

fn random() -> impl Strategy<Value = Random> {
    (
        (
            maybe(duration()),
            maybe(duration()),
            maybe(keepalive()),
            maybe(keepalive()),
            maybe(duration()),
        ),
        any::<bool>(),
        (growing(), duration()).prop_map(|((interval, max), timeout)| (interval, timeout, max)),
        fraction(),
        maybe(keepalive()),
        (growing(), number(), fraction()).prop_map(|((i, m), x, j)| (i, x, m, j)),
        (growing(), duration()).prop_map(|((d, max), decay)| (d, max, decay)),
        (count(8), growing(), number(), fraction(), count(3))
            .prop_map(|(n, (base, max), x, j, p)| (n, base, max, x, j, p)),
        (
            any::<bool>(),
            proptest::option::weighted(0.9, duration()),
            duration(),
            maybe(number()),
        ),
        any::<bool>(),
    )
        .prop_map(
            |(
                endpoint,
                watch,
                health,
                health_jitter,
                probe_keepalive,
                watch_backoff,
                quarantine,
                breaker,
                (wait_for_ready, max_wait, connecting_wait, weight),
                failing,
            )| Random {
                endpoint,
                watch,
                health,
                health_jitter,
                probe_keepalive,
                watch_backoff,
                quarantine,
                breaker,
                wait_for_ready,
                max_wait,
                connecting_wait,
                weight,
                failing,
            },
        )
}

impl Random {
    fn config(&self, target: &str) -> KitConfig {
        let mut config = KitConfig::default();
        config.targets = Some(vec![target.to_owned()]);
        let (timeout, connect_timeout, keepalive, keepalive_timeout, tcp_keepalive) = self.endpoint;
        config.endpoint = EndpointSettings {
            timeout,
            connect_timeout,
            http2_keep_alive_interval: keepalive,
            keep_alive_timeout: keepalive_timeout,
            tcp_keepalive,
            ..EndpointSettings::default()
        };
        let (interval, timeout, max_backoff) = self.health;
        let (initial, multiplier, max, jitter) = self.watch_backoff;
        config.health = Some(
            HealthConfig::new()
                .mode(if self.watch {
                    ProbeMode::Watch
                } else {
                    ProbeMode::Check
                })
                .interval(interval)
                .timeout(timeout)
                .max_backoff(max_backoff)
                .jitter(self.health_jitter)
                .probe_keepalive(self.probe_keepalive)
                .watch_backoff(Backoff::new(initial, multiplier, max, jitter)),
        );
        let (duration, max_duration, decay) = self.quarantine;
        config.quarantine = Some(
            QuarantineConfig::default()
                .duration(duration)
                .max_duration(max_duration)
                .decay_after(decay),
        );
        let (failures, base, max, multiplier, jitter, permits) = self.breaker;
        config.breaker = Some(
            BreakerConfig::default()
                .consecutive_failures(failures)
                .open_base(base)
                .open_max(max)
                .open_multiplier(multiplier)
                .open_jitter(jitter)
                .half_open_permits(permits),
        );
        let mut balance = BalanceConfig::new()
            .wait_for_ready(self.wait_for_ready)
            .connecting_wait(self.connecting_wait);
        balance.max_wait = self.max_wait;
        if let Some(weight) = self.weight {
            balance = balance.strategy(Pick::Weighted(Weights::new().weight(target, weight)));
        }
        config.balance = balance;
        config
    }
}

/// One case: build, and if it builds, calls within their deadline (three, to a backend
/// that fails them all in half the cases, so that quarantine and the breaker act).
async fn case(random: Random, backend: &Backend, built: &AtomicUsize) -> Result<(), TestCaseError> {
    let config = random.config(&backend.uri());
    let kit = match config.build() {
        Ok(kit) => {
            built.fetch_add(1, Ordering::Relaxed);
            kit
        }
        Err(BuildError::InvalidConfig(e)) => {
            prop_assert!(!e.field().is_empty(), "an error naming no field: {e}");
            prop_assert!(
                e.to_string().contains(e.field()),
                "the message does not name the field: {e}"
            );
            return Ok(());
        }
        Err(other) => return Err(TestCaseError::fail(format!("not a config error: {other}"))),
    };
    backend.fail_always(random.failing.then_some(tonic::Code::Unavailable));
    let mut client = TestServiceClient::new(kit.channel());
    let calls = if random.failing { 3 } else { 1 };
    let mut answered = Ok(());
    for _ in 0..calls {
        let mut request = tonic::Request::new(Ping::default());
        request.set_timeout(DEADLINE);
        if let Err(e) = tokio::time::timeout(DEADLINE + SLACK, client.unary(request)).await {
            answered = Err(e);
            break;
        }
    }
    let stopped = tokio::time::timeout(SLACK, kit.shutdown()).await;
    backend.fail_always(None);
    prop_assert!(
        answered.is_ok(),
        "no answer within the call's deadline ({DEADLINE:?}) and {SLACK:?}"
    );
    prop_assert!(stopped.is_ok(), "shutdown did not finish");
    Ok(())
}

#[test]
fn every_configuration_builds_or_names_a_field_and_a_built_kit_answers_in_time() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let backend = runtime.block_on(Backend::start("b0")).unwrap();
    // The same cases on every run (a CI failure reproduces); `PROPTEST_RANDOM=1` draws fresh
    // ones.
    let config = Config {
        cases: cases(),
        max_shrink_iters: 64,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = if std::env::var("PROPTEST_RANDOM").as_deref() == Ok("1") {
        TestRunner::new(config)
    } else {
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha))
    };
    let built = AtomicUsize::new(0);
    let outcome = runner.run(&random(), |random| {
        runtime.block_on(case(random, &backend, &built))
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
    // The property says something about built kits only if some were built.
    let built = built.load(Ordering::Relaxed);
    let cases = cases();
    eprintln!("{built} of {cases} random configurations built");
    assert!(built >= cases as usize / 5, "only {built} of {cases} built");
}

//! Scale: 10,000 targets in one kit — build, a call (a pick), the removal of half of them —
//! within a documented time and memory, and with no step that grows with the square of the
//! number of targets.
//!
//! Every target is its own stack (card, breaker, quarantine member, health checker entry,
//! balancer endpoint, lazily connected tonic channel); their endpoints all lead to one test
//! backend, and health comes from an in-memory probe, so the test measures the kit, not the
//! network.
//!
//! Budgets, for a debug build on a busy CI machine (a release build is several times faster;
//! measured on one: build 2.7 s, the call 20 ms, the removal 0.6 s, 27 KiB per target):
//!
//! | step | budget |
//! |---|---|
//! | build and first verdicts, 10,000 targets | 20 s |
//! | a call | 5 s |
//! | remove 5,000 targets | 20 s |
//! | memory held by the kit with 10,000 targets | 400 MiB (40 KiB per target) |
//!
//! Where a target's memory goes: its lazily connected tonic channel (about 11 KiB: a buffer
//! and its worker), its breaker (about 5 KiB: the time windows), its health checker task and
//! record (about 5 KiB), and its card, quarantine member, balancer endpoint and registry entry.
//!
//! No quadratic step: the structures that hold one entry per target — quarantine's members
//! (whose list used to be copied on every removal), the peer set, the health checker's
//! targets — must cost the same per removal at 2,500 and at 10,000 members.

use std::alloc::System;
use std::sync::Arc;
use std::time::{Duration, Instant};

use grpc_client_kit::Kit;
use grpc_client_kit::health::{HealthChecker, HealthConfig, ProbeMode, Target};
use grpc_client_kit::quarantine::QuarantineGroup;
use grpc_client_kit::state::{EndpointCard, Peers};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use test_backends::Backend;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tonic::transport::Endpoint;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const BUILD_BUDGET: Duration = Duration::from_secs(20);
const CALL_BUDGET: Duration = Duration::from_secs(5);
const REMOVE_BUDGET: Duration = Duration::from_secs(20);
const MEMORY_BUDGET: usize = 400 * 1024 * 1024;

/// The tests of this file measure the process's allocations and time: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The name of target `i`: an address of its own (10.x.y.z).
fn name(i: usize) -> String {
    format!(
        "http://10.{}.{}.{}:50051",
        i / 62_500,
        (i / 250) % 250,
        i % 250 + 1
    )
}

/// A kit of `n` targets, every one of whose endpoints leads to `backend`, healthy by an
/// in-memory probe.
async fn kit_of(n: usize, backend: &Backend) -> Kit {
    let uri = backend.uri();
    let kit = Kit::builder()
        .targets((0..n).map(name))
        .endpoint_template(move |_target: &str| Ok(Endpoint::from_shared(uri.clone())?))
        .health(
            HealthConfig::new()
                .mode(ProbeMode::custom(|_: Arc<str>| async { Ok(()) }))
                .max_concurrent_probes(1_000),
        )
        .build()
        .unwrap();
    assert!(
        kit.wait_until_ready(BUILD_BUDGET).await,
        "no first verdicts"
    );
    kit
}

/// Time to remove the targets `from..to`, per target.
async fn removal_cost(kit: &Kit, from: usize, to: usize) -> Duration {
    let t0 = Instant::now();
    for i in from..to {
        assert!(
            kit.remove_target(&name(i)).await,
            "{} was not there",
            name(i)
        );
    }
    t0.elapsed() / u32::try_from(to - from).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_targets_build_pick_and_half_go() {
    const N: usize = 10_000;
    let _alone = ONE_AT_A_TIME.lock().await;
    let backend = Backend::start("b0").await.unwrap();

    let region = Region::new(GLOBAL);
    let t0 = Instant::now();
    let kit = kit_of(N, &backend).await;
    let build = t0.elapsed();
    let held = region.change();
    let held = held.bytes_allocated.saturating_sub(held.bytes_deallocated);
    eprintln!("build: {build:?}, memory held: {} KiB", held / 1024);
    assert!(build < BUILD_BUDGET, "build took {build:?}");
    assert!(
        held < MEMORY_BUDGET,
        "the kit holds {} MiB",
        held / (1024 * 1024)
    );
    assert_eq!(kit.targets().len(), N);
    assert_eq!(kit.eligible_targets().len(), N);

    let t0 = Instant::now();
    let mut client = TestServiceClient::new(kit.channel());
    client.unary(Ping::default()).await.unwrap();
    let call = t0.elapsed();
    eprintln!("first call: {call:?}");
    assert!(call < CALL_BUDGET, "the first call took {call:?}");

    let t0 = Instant::now();
    let per_target = removal_cost(&kit, 0, N / 2).await;
    let remove = t0.elapsed();
    eprintln!("remove {}: {remove:?} ({per_target:?} per target)", N / 2);
    assert!(remove < REMOVE_BUDGET, "removing half took {remove:?}");
    assert_eq!(kit.targets().len(), N / 2);
    // The balancer follows, and picks among what is left.
    let settled = tokio::time::timeout(BUILD_BUDGET, async {
        while kit.eligible_targets().len() != N / 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(settled.is_ok(), "the balancer still has removed targets");
    assert_eq!(kit.quarantine().len(), N / 2);
    assert_eq!(kit.checker().unwrap().targets().len(), N / 2);
    client.unary(Ping::default()).await.unwrap();
    kit.shutdown().await;
}

/// The time per removal of `n / 2` members, from a set of `n`.
fn per_removal(
    n: usize,
    mut add: impl FnMut(&EndpointCard),
    mut remove: impl FnMut(&EndpointCard),
) -> Duration {
    let cards: Vec<EndpointCard> = (0..n).map(|i| EndpointCard::new(name(i))).collect();
    cards.iter().for_each(&mut add);
    let t0 = Instant::now();
    cards[..n / 2].iter().for_each(&mut remove);
    t0.elapsed() / u32::try_from(n / 2).unwrap()
}

/// Whether the cost per removal at 10,000 members is not that of a walk of the members:
/// four times the members, at most twice the cost per removal (a copy of the list per removal
/// makes it four times).
fn flat(what: &str, cost: impl Fn(usize) -> Duration) {
    // The best of three, against a busy machine.
    let best = |n| (0..3).map(|_| cost(n)).min().unwrap();
    let (small, large) = (best(2_500), best(10_000));
    eprintln!("{what}: {small:?} per removal at 2,500, {large:?} at 10,000");
    assert!(
        large < small * 2 + Duration::from_micros(2),
        "{what}: a removal costs more with more members: {small:?} at 2,500, {large:?} at 10,000"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_costs_the_same_per_removal_at_2_500_and_10_000() {
    let _alone = ONE_AT_A_TIME.lock().await;
    flat("quarantine group", |n| {
        let group = QuarantineGroup::default();
        per_removal(
            n,
            |card| {
                group.add(card.clone());
            },
            |card| {
                group.remove(card.target());
            },
        )
    });
    flat("peer set", |n| {
        let peers = Peers::new();
        per_removal(
            n,
            |card| {
                peers.add(card);
            },
            |card| {
                peers.remove_card(card);
            },
        )
    });
    flat("health checker", |n| {
        let checker = HealthChecker::builder()
            .mode(ProbeMode::custom(|_: Arc<str>| async { Ok(()) }))
            .build()
            .unwrap();
        per_removal(
            n,
            |card| {
                checker
                    .add_target(Target::new(card.target().to_owned()).card(card.clone()))
                    .unwrap();
            },
            |card| {
                checker.remove_target(card.target());
            },
        )
    });
}

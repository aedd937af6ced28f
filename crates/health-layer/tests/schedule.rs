//! The schedule, on tokio's paused clock with scripted probes: exact instants.

mod support;

use std::time::Duration;

use health_layer::{HealthChecker, HealthVerdict};
use support::{Script, Step};

const fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

#[tokio::test(start_paused = true)]
async fn first_pass_at_start_runs_concurrently_then_each_target_keeps_its_own_interval() {
    let script = Script::new();
    for t in ["a", "b", "c"] {
        script.set(t, [Step::Slow(s(2))]);
    }
    script.set("late", [Step::Pass]);
    let checker = HealthChecker::builder()
        .mode(script.mode())
        .interval(s(30))
        .build()
        .unwrap();
    checker.start(["a", "b", "c"]).unwrap();
    tokio::time::sleep(s(7)).await;
    checker.add_target("late").unwrap();
    tokio::time::sleep(s(100)).await;

    // Three slow probes all started at 0 (concurrently, not one after the other), and each
    // next check is 30 s after its probe finished (at 2 s).
    for t in ["a", "b", "c"] {
        assert_eq!(script.calls_ms(t), [0, 32_000, 64_000, 96_000], "{t}");
    }
    // A target added later has its own phase: no global tick.
    assert_eq!(script.calls_ms("late"), [7_000, 37_000, 67_000, 97_000]);
    let status = checker.status("late").unwrap();
    assert_eq!(status.next_check, Some(script.t0 + s(127)));
    checker.stop().await;
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_exponentially_capped_and_one_success_resets() {
    let script = Script::new();
    // Six failures, one success, then failures again.
    let mut steps = vec![Step::Fail("down"); 6];
    steps.push(Step::Pass);
    steps.push(Step::Fail("down again"));
    script.set("t", steps);
    let checker = HealthChecker::builder()
        .mode(script.mode())
        .interval(s(30))
        .max_backoff(s(300))
        .build()
        .unwrap();
    checker.start(["t"]).unwrap();
    tokio::time::sleep(s(1_200)).await;

    // interval × 2^(failures−1), capped at 300 s: +30 +60 +120 +240 +300 +300; the success at
    // 1050 resets to +30, and the first failure after it waits one interval again.
    assert_eq!(
        script.calls_ms("t"),
        [
            0, 30_000, 90_000, 210_000, 450_000, 750_000, 1_050_000, 1_080_000, 1_110_000,
            1_170_000
        ]
    );
    let status = checker.status("t").unwrap();
    assert_eq!(status.consecutive_failures, 3);
    assert_eq!(status.verdict, HealthVerdict::Unhealthy);
    assert_eq!(status.next_check, Some(script.t0 + s(1_170 + 120)));
    checker.stop().await;
}

#[tokio::test(start_paused = true)]
async fn interval_zero_checks_once_when_added_then_only_on_demand() {
    let script = Script::new();
    let checker = HealthChecker::builder()
        .mode(script.mode())
        .interval(Duration::ZERO)
        .build()
        .unwrap();
    checker.start(["t"]).unwrap();
    tokio::time::sleep(s(3_600)).await;
    assert_eq!(
        script.calls_ms("t"),
        [0],
        "one probe when added (never left unknown), then no schedule"
    );
    let status = checker.status("t").unwrap();
    assert_eq!(status.verdict, HealthVerdict::Healthy);
    assert_eq!(status.next_check, None);

    // A target added later is probed once too.
    checker.add_target("u").unwrap();
    tokio::time::sleep(s(60)).await;
    assert_eq!(script.calls_ms("u"), [3_600_000]);

    let status = checker.check_now("t").await.unwrap();
    assert_eq!(status.verdict, HealthVerdict::Healthy);
    assert_eq!(status.next_check, None);
    tokio::time::sleep(s(3_600)).await;
    assert_eq!(script.calls_ms("t"), [0, 3_660_000]);
    checker.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_black_holed_target_does_not_delay_any_other_target() {
    let script = Script::new();
    script.set("hole", [Step::Hang]);
    let checker = HealthChecker::builder()
        .mode(script.mode())
        .interval(s(1))
        .timeout(s(5))
        .max_backoff(s(4))
        .build()
        .unwrap();
    checker.start(["ok", "hole"]).unwrap();
    tokio::time::sleep(Duration::from_millis(10_500)).await;

    let ok: Vec<u128> = (0..=10).map(|i| i * 1_000).collect();
    assert_eq!(script.calls_ms("ok"), ok, "one probe a second, undisturbed");
    // The hole: times out at 5 s, next one interval later (6 s), times out at 11 s.
    assert_eq!(script.calls_ms("hole"), [0, 6_000]);
    let hole = checker.status("hole").unwrap();
    assert_eq!(hole.verdict, HealthVerdict::Unhealthy);
    assert_eq!(
        hole.last_error.as_deref(),
        Some("DEADLINE_EXCEEDED: no answer within 5.0 s")
    );
    assert_eq!(
        checker.status("ok").unwrap().verdict,
        HealthVerdict::Healthy
    );
    checker.stop().await;
}

#[tokio::test(start_paused = true)]
async fn probes_in_flight_never_exceed_the_bound() {
    let script = Script::new();
    let names: Vec<String> = (0..20).map(|i| format!("t{i}")).collect();
    for n in &names {
        script.set(n, [Step::Slow(s(1))]);
    }
    let checker = HealthChecker::builder()
        .mode(script.mode())
        .interval(s(60))
        .max_concurrent_probes(3)
        .build()
        .unwrap();
    checker.start(&names).unwrap();
    assert!(checker.wait_until_ready(s(30)).await);
    assert_eq!(
        script.max_in_flight(),
        3,
        "the bound is reached and never exceeded"
    );
    // 20 probes of 1 s, 3 at a time: the first pass takes 7 s.
    let last_start = names.iter().map(|n| script.calls_ms(n)[0]).max().unwrap();
    assert_eq!(last_start, 6_000);
    checker.stop().await;
}

#[tokio::test(start_paused = true)]
async fn jitter_spreads_checks_within_its_band() {
    let script = Script::new();
    let checker = HealthChecker::builder()
        .mode(script.mode())
        .interval(s(10))
        .jitter(0.2)
        .build()
        .unwrap();
    checker.start(["t"]).unwrap();
    tokio::time::sleep(s(1_000)).await;
    let calls = script.calls_ms("t");
    let gaps: Vec<u128> = calls.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.len() > 50);
    assert!(
        gaps.iter().all(|g| (8_000..=12_001).contains(g)),
        "{gaps:?}"
    );
    let distinct: std::collections::HashSet<_> = gaps.iter().collect();
    assert!(distinct.len() > 10, "spread, not one fixed delay: {gaps:?}");
    checker.stop().await;
}

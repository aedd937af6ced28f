//! `is_healthy` without a running checker: an error, and one warning per cause, not one per
//! call. Alone in its test binary: tracing caches whether a log site is enabled per process,
//! so a concurrent test logging without a subscriber could hide the warning from this one.

mod support;

use health_layer::{HealthChecker, NotRunningCause};
use support::Logs;

#[test]
fn not_running_is_an_error_with_one_warning_not_one_per_call() {
    let logs = Logs::default();
    tracing::subscriber::with_default(logs.subscriber(), || {
        let checker = HealthChecker::builder().build().unwrap();
        checker.add_target("http://127.0.0.1:1").unwrap();
        for _ in 0..5 {
            let err = checker.is_healthy("http://127.0.0.1:1").unwrap_err();
            assert_eq!(err.cause, NotRunningCause::NotStarted);
            assert_eq!(
                err.to_string(),
                "no health verdict for http://127.0.0.1:1: the health checker was never started"
            );
        }
        // A target that is not the checker's is the same kind of answer, with its own cause.
        let err = checker.is_healthy("http://127.0.0.1:2").unwrap_err();
        assert_eq!(err.cause, NotRunningCause::UnknownTarget);
    });
    assert_eq!(
        logs.count("WARN"),
        2,
        "one warning per cause, not per call:\n{}",
        logs.text()
    );
    assert_eq!(logs.count("the health checker was never started"), 5);
}

//! Every invalid configuration fails when the layer is built, naming the field and the value,
//! and nothing is written to the card. A configuration file (feature `serde`) reads into the
//! same configuration, refusing unknown fields.

use std::time::Duration;

use breaker_layer::{
    Breaker, BreakerConfig, BreakerLayer, SlowCalls, TripPolicy, WhenOpen, Window,
};
use endpoint_state::{Backoff, EndpointCard, FailureCodes};
use tonic::Code;

fn rejected(config: BreakerConfig) -> (String, String, String) {
    let card = EndpointCard::new("b1");
    let err = BreakerLayer::new(card.clone(), config).unwrap_err();
    assert_eq!(card.version(), 0, "nothing written to the card");
    (
        err.field().to_owned(),
        err.value().to_owned(),
        err.to_string(),
    )
}

#[test]
fn every_bad_field_is_named_with_its_value() {
    let d = BreakerConfig::default;
    let cases: Vec<(BreakerConfig, &str, &str)> = vec![
        (
            d().consecutive_failures(0),
            "trip.consecutive_failures",
            "0",
        ),
        (
            d().failure_rate(0.0, Window::Count(10), 5),
            "trip.threshold",
            "0",
        ),
        (
            d().failure_rate(1.5, Window::Count(10), 5),
            "trip.threshold",
            "1.5",
        ),
        (
            d().failure_rate(f64::NAN, Window::Count(10), 5),
            "trip.threshold",
            "NaN",
        ),
        (
            d().failure_rate(0.5, Window::Count(0), 1),
            "trip.window",
            "Count(0)",
        ),
        (
            d().failure_rate(0.5, Window::Count(2_000_000), 1),
            "trip.window",
            "Count(2000000)",
        ),
        (
            d().failure_rate(0.5, Window::Time(Duration::from_millis(1)), 1),
            "trip.window",
            "Time(1ms)",
        ),
        (
            d().failure_rate(0.5, Window::Count(10), 0),
            "trip.min_calls",
            "0",
        ),
        (
            d().failure_rate(0.5, Window::Count(10), 11),
            "trip.min_calls",
            "11",
        ),
        (
            d().slow_calls(SlowCalls::new(Duration::ZERO, 0.5)),
            "slow_calls.threshold",
            "0ns",
        ),
        (
            d().slow_calls(SlowCalls::new(Duration::from_secs(1), -0.1)),
            "slow_calls.rate",
            "-0.1",
        ),
        (
            d().slow_calls(SlowCalls::new(Duration::from_secs(1), 0.5).min_calls(0)),
            "slow_calls.min_calls",
            "0",
        ),
        (d().open_base(Duration::ZERO), "open.base", "0ns"),
        (d().open_multiplier(0.5), "open.multiplier", "0.5"),
        (d().open_multiplier(f64::INFINITY), "open.multiplier", "inf"),
        (d().open_max(Duration::from_secs(1)), "open.max", "1s"),
        (d().open_jitter(1.0), "open.jitter", "1"),
        (d().open_jitter(-0.1), "open.jitter", "-0.1"),
        (d().half_open_permits(0), "half_open_permits", "0"),
        (d().half_open_permits(20_000), "half_open_permits", "20000"),
        (d().failure_codes(FailureCodes::NONE), "failure_codes", "{}"),
        (
            d().failure_codes(FailureCodes::from_codes([tonic::Code::Ok])),
            "failure_codes",
            "{\"OK\"}",
        ),
        (d().events_capacity(0), "events_capacity", "0"),
    ];
    for (config, field, value) in cases {
        let (f, v, text) = rejected(config);
        assert_eq!((f.as_str(), v.as_str()), (field, value), "{text}");
        assert!(
            text.starts_with(&format!(
                "invalid breaker configuration: {field} = {value}: expected "
            )),
            "{text}"
        );
    }
}

#[test]
fn the_defaults_are_valid_and_as_documented() {
    let c = BreakerConfig::default();
    assert!(c.validate().is_ok());
    assert_eq!(c.trip, breaker_layer::TripPolicy::ConsecutiveFailures(5));
    assert_eq!(c.half_open_permits, 1);
    assert_eq!(c.failure_codes, FailureCodes::breaker_default());
    assert_eq!(c.when_open, breaker_layer::WhenOpen::Wait);
    assert_eq!(c.open.initial, Duration::from_secs(5));
    // An empty code set is fine when slow calls can still trip.
    let slow_only = BreakerConfig::default()
        .failure_codes(FailureCodes::NONE)
        .slow_calls(SlowCalls::new(Duration::from_secs(1), 0.5));
    assert!(slow_only.validate().is_ok());
}

#[test]
fn breaker_new_validates_too() {
    let err = Breaker::new(
        (),
        EndpointCard::new("b1"),
        BreakerConfig::default().open_jitter(2.0),
    )
    .unwrap_err();
    assert_eq!(err.field(), "open.jitter");
}

fn from_toml(document: &str) -> Result<BreakerConfig, toml::de::Error> {
    toml::from_str(document)
}

#[test]
fn a_configuration_file_reads_into_the_config() {
    let config = from_toml(
        r#"
        half_open_permits = 2
        failure_codes = ["UNAVAILABLE", "internal", "4"]
        when_open = "fail_fast"
        events_capacity = 16

        [trip]
        threshold = 0.5
        window = "30s"
        min_calls = 20

        [slow_calls]
        threshold = "2s"
        rate = 0.8
        window = 50

        [open]
        base = "1s"
        jitter = 0.0
        "#,
    )
    .unwrap();
    assert_eq!(
        config,
        BreakerConfig::default()
            .failure_rate(0.5, Window::Time(Duration::from_secs(30)), 20)
            .slow_calls(SlowCalls::new(Duration::from_secs(2), 0.8).window(Window::Count(50)))
            .open_base(Duration::from_secs(1))
            .open_jitter(0.0)
            .half_open_permits(2)
            .failure_codes(FailureCodes::from_codes([
                Code::Unavailable,
                Code::Internal,
                Code::DeadlineExceeded,
            ]))
            .when_open(WhenOpen::FailFast)
            .events_capacity(16)
    );
    // The unset fields of `open` keep their defaults.
    assert_eq!(
        config.open,
        Backoff::new(Duration::from_secs(1), 2.0, Duration::from_secs(60), 0.0)
    );

    // An empty document is the default configuration; a trip by a run of failures.
    assert_eq!(from_toml("").unwrap(), BreakerConfig::default());
    let config = from_toml("[trip]\nconsecutive_failures = 3").unwrap();
    assert_eq!(config.trip, TripPolicy::ConsecutiveFailures(3));
    // A rate with only its threshold: the last 100 calls, once there are 10.
    let config = from_toml("[trip]\nthreshold = 0.25").unwrap();
    assert_eq!(
        config.trip,
        TripPolicy::FailureRate {
            threshold: 0.25,
            window: Window::Count(100),
            min_calls: 10
        }
    );
    // Values are checked when the layer is built, as those set in code are.
    let bad = from_toml("[open]\njitter = 1.5").unwrap();
    assert_eq!(bad.validate().unwrap_err().field(), "open.jitter");
}

#[test]
fn a_configuration_file_with_an_unknown_field_is_refused() {
    for (document, unknown) in [
        ("half_open_permit = 2", "half_open_permit"),
        ("[open]\nbase = \"1s\"\njiter = 0.2", "jiter"),
        ("[trip]\nconsecutive_failures = 3\nwindows = 10", "windows"),
        (
            "[slow_calls]\nthreshold = \"1s\"\nrate = 0.5\nmin = 3",
            "min",
        ),
    ] {
        let err = from_toml(document).unwrap_err().to_string();
        assert!(
            err.contains(&format!("unknown field `{unknown}`")),
            "{document}: {err}"
        );
    }
    // Neither is a name it does not know, nor a trip that is two policies at once.
    let err = from_toml("failure_codes = [\"UNAVALABLE\"]").unwrap_err();
    assert!(err.to_string().contains("a gRPC status code"), "{err}");
    let err = from_toml("[trip]\nconsecutive_failures = 3\nthreshold = 0.5").unwrap_err();
    assert!(err.to_string().contains("not both"), "{err}");
}

//! Every invalid setting is refused when the group is built, with an error naming the field
//! and the value. A configuration file (feature `serde`) reads into the same configuration,
//! refusing unknown fields.

use std::time::Duration;

use endpoint_state::FailureCodes;
use quarantine_layer::{OutlierEjection, QuarantineConfig, QuarantineGroup};
use tonic::Code;

fn refused(config: QuarantineConfig) -> (String, String, String) {
    let err = QuarantineGroup::new(config).unwrap_err();
    (
        err.field().to_owned(),
        err.value().to_owned(),
        err.to_string(),
    )
}

fn with_policy(policy: OutlierEjection) -> QuarantineConfig {
    QuarantineConfig::default().outlier_ejection(Some(policy))
}

#[test]
fn the_defaults_are_valid() {
    let group = QuarantineGroup::new(QuarantineConfig::default()).unwrap();
    assert_eq!(group.config().duration, Duration::from_secs(5));
    assert_eq!(
        group.config().failure_codes,
        FailureCodes::quarantine_default()
    );
    assert!(QuarantineGroup::new(with_policy(OutlierEjection::default())).is_ok());
}

#[test]
fn each_bad_field_is_named_with_its_value() {
    let cases = [
        (
            QuarantineConfig::default().duration(Duration::ZERO),
            "duration",
            "0ns",
            "more than zero",
        ),
        (
            QuarantineConfig::default().max_duration(Duration::from_secs(1)),
            "max_duration",
            "1s",
            "at least duration (5s)",
        ),
        (
            QuarantineConfig::default().decay_after(Duration::ZERO),
            "decay_after",
            "0ns",
            "more than zero",
        ),
        (
            QuarantineConfig::default()
                .duration(Duration::from_secs(400 * 24 * 3600))
                .max_duration(Duration::from_secs(400 * 24 * 3600)),
            "duration",
            "34560000s",
            "at most a year",
        ),
        (
            QuarantineConfig::default()
                .failure_codes(FailureCodes::quarantine_default().with(Code::Ok)),
            "failure_codes",
            "{\"OK\", \"DEADLINE_EXCEEDED\", \"UNAVAILABLE\"}",
            "a set without OK",
        ),
        (
            with_policy(OutlierEjection::default().interval(Duration::ZERO)),
            "outlier_ejection.interval",
            "0ns",
            "more than zero",
        ),
        (
            with_policy(OutlierEjection::default().failure_percentage_threshold(101)),
            "outlier_ejection.failure_percentage_threshold",
            "101",
            "between 0 and 100",
        ),
        (
            with_policy(OutlierEjection::default().request_volume(0)),
            "outlier_ejection.request_volume",
            "0",
            "at least 1",
        ),
        (
            with_policy(OutlierEjection::default().minimum_hosts(0)),
            "outlier_ejection.minimum_hosts",
            "0",
            "at least 1",
        ),
        (
            with_policy(OutlierEjection::default().max_ejection_percent(0)),
            "outlier_ejection.max_ejection_percent",
            "0",
            "between 1 and 100",
        ),
        (
            with_policy(OutlierEjection::default().max_ejection_percent(150)),
            "outlier_ejection.max_ejection_percent",
            "150",
            "between 1 and 100",
        ),
        (
            with_policy(OutlierEjection::default().failure_codes(FailureCodes::NONE)),
            "outlier_ejection.failure_codes",
            "{}",
            "a set of at least one code",
        ),
    ];
    for (config, field, value, rule) in cases {
        let (f, v, text) = refused(config);
        assert_eq!((f.as_str(), v.as_str()), (field, value), "{text}");
        assert!(
            text.starts_with(&format!(
                "invalid quarantine configuration: {field} = {value}: expected "
            )),
            "{text}"
        );
        assert!(text.contains(rule), "{text}");
    }
}

fn from_toml(document: &str) -> Result<QuarantineConfig, toml::de::Error> {
    toml::from_str(document)
}

#[test]
fn a_configuration_file_reads_into_the_config() {
    let config = from_toml(
        r#"
        duration = "2s"
        max_duration = "30s"
        decay_after = "1m"
        failure_codes = ["UNAVAILABLE", "deadline_exceeded", "8"]

        [outlier_ejection]
        interval = "500ms"
        minimum_hosts = 3
        failure_codes = ["INTERNAL"]
        "#,
    )
    .unwrap();
    assert_eq!(
        config,
        QuarantineConfig::default()
            .duration(Duration::from_secs(2))
            .max_duration(Duration::from_secs(30))
            .decay_after(Duration::from_secs(60))
            .failure_codes(FailureCodes::from_codes([
                Code::Unavailable,
                Code::DeadlineExceeded,
                Code::ResourceExhausted,
            ]))
            .outlier_ejection(Some(
                OutlierEjection::default()
                    .interval(Duration::from_millis(500))
                    .minimum_hosts(3)
                    .failure_codes(FailureCodes::from_codes([Code::Internal])),
            ))
    );
    assert!(QuarantineGroup::new(config).is_ok());

    // An empty document is the default configuration (no outlier ejection); an empty
    // `[outlier_ejection]` table turns the policy on with its defaults.
    assert_eq!(from_toml("").unwrap(), QuarantineConfig::default());
    assert_eq!(
        from_toml("[outlier_ejection]").unwrap().outlier_ejection,
        Some(OutlierEjection::default())
    );
    // Values are checked when the group is built, as those set in code are.
    let bad = from_toml("max_duration = \"1s\"").unwrap();
    let err = QuarantineGroup::new(bad).unwrap_err();
    assert_eq!((err.field(), err.value()), ("max_duration", "1s"));
}

#[test]
fn a_configuration_file_with_an_unknown_field_is_refused() {
    for (document, unknown) in [
        ("durations = \"2s\"", "durations"),
        ("[outlier_ejection]\nmax_ejection = 20", "max_ejection"),
    ] {
        let err = from_toml(document).unwrap_err().to_string();
        assert!(
            err.contains(&format!("unknown field `{unknown}`")),
            "{document}: {err}"
        );
    }
    // Nor is a code it does not know, nor a duration it cannot read.
    let err = from_toml("failure_codes = [\"UNAVAILABLE\", \"UNAVALABLE\"]").unwrap_err();
    assert!(err.to_string().contains("a gRPC status code"), "{err}");
    assert!(from_toml("duration = \"5 parsecs\"").is_err());
}

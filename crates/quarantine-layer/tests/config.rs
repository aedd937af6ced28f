//! Every invalid setting is refused when the group is built, with an error naming the field
//! and the value.

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
            "must be more than zero",
        ),
        (
            QuarantineConfig::default().max_duration(Duration::from_secs(1)),
            "max_duration",
            "1s",
            "must be at least duration (5s)",
        ),
        (
            QuarantineConfig::default().decay_after(Duration::ZERO),
            "decay_after",
            "0ns",
            "must be more than zero",
        ),
        (
            QuarantineConfig::default()
                .duration(Duration::from_secs(400 * 24 * 3600))
                .max_duration(Duration::from_secs(400 * 24 * 3600)),
            "duration",
            "34560000s",
            "must be at most a year",
        ),
        (
            QuarantineConfig::default()
                .failure_codes(FailureCodes::quarantine_default().with(Code::Ok)),
            "failure_codes",
            "{\"OK\", \"DEADLINE_EXCEEDED\", \"UNAVAILABLE\"}",
            "must not contain OK",
        ),
        (
            with_policy(OutlierEjection::default().interval(Duration::ZERO)),
            "outlier_ejection.interval",
            "0ns",
            "must be more than zero",
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
            "must not be empty",
        ),
    ];
    for (config, field, value, rule) in cases {
        let (f, v, text) = refused(config);
        assert_eq!((f.as_str(), v.as_str()), (field, value), "{text}");
        assert!(
            text.starts_with(&format!("invalid quarantine config: {field} = {value}: ")),
            "{text}"
        );
        assert!(text.contains(rule), "{text}");
    }
}

//! The configuration file: `target` xor `targets`, unknown fields refused, every invalid value
//! refused at build naming the field and the value — and nothing started then.

mod support;

use std::time::Duration;

use grpc_client_kit::{BuildError, KitConfig};
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;

const EXAMPLE: &str = include_str!("../../../examples/kit.toml");

fn build_error(toml: &str) -> (String, String, String) {
    let config = match KitConfig::from_toml(toml) {
        Ok(c) => c,
        Err(e) => return (e.field().to_owned(), e.value().to_owned(), e.to_string()),
    };
    let err = config
        .build()
        .expect_err("the configuration should be refused");
    let e = err.invalid_config().expect("an invalid configuration");
    (e.field().to_owned(), e.value().to_owned(), e.to_string())
}

#[test]
fn the_example_file_reads_and_validates() {
    let config = KitConfig::from_toml(EXAMPLE).unwrap();
    assert_eq!(config.targets.as_ref().unwrap().len(), 3);
    let health = config.health.as_ref().expect("health checking on");
    assert_eq!(health.get_timeout(), Duration::from_secs(2));
    assert_eq!(config.transparent_retry, Some(true));
    // Valid through and through: only the missing runtime stops it.
    assert!(matches!(config.build(), Err(BuildError::NoRuntime)));
}

#[test]
fn target_and_targets_are_exclusive_and_one_is_required() {
    let (field, _, message) = build_error(
        r#"target = "http://127.0.0.1:1"
           targets = ["http://127.0.0.1:2"]"#,
    );
    assert_eq!(field, "target");
    assert!(
        message.contains("either `target`") && message.contains("not both"),
        "{message}"
    );

    let (field, _, message) = build_error("");
    assert_eq!(field, "targets");
    assert!(message.contains("no target: set `target`"), "{message}");

    let (field, value, _) = build_error("targets = []");
    assert_eq!((field.as_str(), value.as_str()), ("targets", "[]"));
}

#[test]
fn every_invalid_field_is_named_with_its_value() {
    let t = r#"targets = ["http://127.0.0.1:1", "http://127.0.0.1:2"]"#;
    let cases: &[(&str, &str, &str)] = &[
        // (document after the targets line, field, value)
        ("[health]\ntimeout = \"0s\"", "health.timeout", "0ns"),
        ("[health]\njitter = 1.5", "health.jitter", "1.5"),
        (
            "[health.watch_backoff]\nmultiplier = 0.5",
            "health.watch_backoff.multiplier",
            "0.5",
        ),
        (
            "[quarantine]\nmax_duration = \"1s\"",
            "quarantine.max_duration",
            "1s",
        ),
        (
            "[quarantine]\nfailure_codes = [\"UNAVAILABLE\", \"UNAVALABLE\"]",
            "quarantine.failure_codes[1]",
            "\"UNAVALABLE\"",
        ),
        (
            "[quarantine.outlier_ejection]\nmax_ejection_percent = 0",
            "quarantine.outlier_ejection.max_ejection_percent",
            "0",
        ),
        (
            "[breaker.trip]\nconsecutive_failures = 0",
            "breaker.trip.consecutive_failures",
            "0",
        ),
        (
            "[breaker.trip]\nthreshold = 1.5",
            "breaker.trip.threshold",
            "1.5",
        ),
        ("[breaker.open]\njitter = 1.5", "breaker.open.jitter", "1.5"),
        (
            "[breaker]\nhalf_open_permits = 0",
            "breaker.half_open_permits",
            "0",
        ),
        (
            "strategy = \"weighted\"\n[weights]\n\"http://127.0.0.1:2\" = -1.0",
            "weights[http://127.0.0.1:2]",
            "-1",
        ),
        (
            "strategy = \"weighted\"\n[weights]\n\"http://127.0.0.1:2\" = nan",
            "weights[http://127.0.0.1:2]",
            "NaN",
        ),
        (
            "strategy = \"weighted\"\n[weights]\n\"http://127.0.0.1:9\" = 1.0",
            "weights[http://127.0.0.1:9]",
            "1",
        ),
        (
            "[weights]\n\"http://127.0.0.1:2\" = 2.0",
            "weights",
            "{ \"http://127.0.0.1:2\" = 2.0 }",
        ),
        (
            "[endpoint]\nuser_agent = \"bad\\nagent\"",
            "endpoint.user_agent",
            "\"bad\\nagent\"",
        ),
        ("[dns]\nmin_refresh = \"0s\"", "dns.min_refresh", "0ns"),
        ("[dns]\nscheme = \"ftp\"", "dns.scheme", "\"ftp\""),
        // Wrong types and unknown fields are refused as the file is read.
        (
            "[health]\ntimeout = \"2 parsecs\"",
            "health.timeout",
            "\"2 parsecs\"",
        ),
        (
            "[health]\nmode = \"sometimes\"",
            "health.mode",
            "\"sometimes\"",
        ),
        ("strategy = \"fastest\"", "strategy", "\"fastest\""),
    ];
    for (rest, field, value) in cases {
        let (f, v, message) = build_error(&format!("{t}\n{rest}"));
        assert_eq!(
            (f.as_str(), v.as_str()),
            (*field, *value),
            "for {rest:?}: {message}"
        );
        assert!(message.contains(field), "{message}");
    }

    let (field, value, message) =
        build_error(r#"targets = ["http://127.0.0.1:1", "http://bad host:1"]"#);
    assert_eq!(
        (field.as_str(), value.as_str()),
        ("targets[1]", "\"http://bad host:1\"")
    );
    assert!(message.contains("not a valid address"), "{message}");

    let (field, _, message) = build_error(&format!("{t}\n[health]\ntimout = \"2s\""));
    assert_eq!(field, "health.timout");
    assert!(message.contains("unknown field `timout`"), "{message}");
}

/// Tasks alive in the runtime now.
fn alive() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_starts_when_the_configuration_is_refused() {
    let backends = Backends::start(2).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let baseline = alive();
    let targets = format!("targets = {:?}\n", backends.uris());
    // Each refused at a different stage of validation, the last ones after everything else
    // (health, quarantine, breaker) has been checked.
    for rest in [
        "[health]\ntimeout = \"0s\"",
        "[breaker.open]\njitter = 1.5",
        "strategy = \"weighted\"\n[weights]\n\"nowhere:1\" = 1.0",
        "[dns]\nmin_refresh = \"0s\"",
    ] {
        let err = KitConfig::from_toml(&format!("{targets}{rest}"))
            .unwrap()
            .build()
            .unwrap_err();
        assert!(err.invalid_config().is_some(), "{err}");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(alive(), baseline, "a refused configuration started tasks");
    for b in backends.iter() {
        assert_eq!(
            b.connections_accepted(),
            0,
            "a refused configuration connected"
        );
        assert_eq!(b.health_checks(), 0, "a refused configuration probed");
    }

    // The same file with a valid value starts and works.
    let kit = KitConfig::from_toml(&format!("{targets}[health]\nmode = \"watch\""))
        .unwrap()
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
    let mut client = TestServiceClient::new(kit.channel());
    client.unary(Ping::default()).await.unwrap();
}

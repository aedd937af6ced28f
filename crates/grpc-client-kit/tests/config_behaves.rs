#![cfg(feature = "toml")]
//! A configuration that builds must behave: values that cannot work are refused at build,
//! naming the field and the value, and the defaults bound what the user left unbounded
//! (connect timeout, wait-for-ready).

use std::sync::Arc;
use std::time::Duration;

use grpc_client_kit::balance::BalanceConfig;
use grpc_client_kit::health::{HealthConfig, ProbeMode};
use grpc_client_kit::{DnsSettings, EndpointSettings, EndpointTemplate, Kit, KitConfig};
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tonic::Code;
use tonic::transport::Endpoint;

/// The field, the value and the message of the error that refuses `toml`.
fn refused(toml: &str) -> (String, String, String) {
    let err = KitConfig::from_toml(toml)
        .unwrap()
        .build()
        .expect_err("the configuration should be refused");
    let e = err.invalid_config().expect("an invalid configuration");
    (e.field().to_owned(), e.value().to_owned(), e.to_string())
}

const TARGETS: &str = r#"targets = ["http://127.0.0.1:1", "http://127.0.0.1:2"]"#;

#[test]
fn zero_timeouts_and_sub_second_keepalives_are_refused() {
    for (rest, field, value) in [
        ("[endpoint]\ntimeout = \"0s\"", "endpoint.timeout", "0ns"),
        (
            "[endpoint]\nconnect_timeout = \"0s\"",
            "endpoint.connect_timeout",
            "0ns",
        ),
        (
            "[endpoint]\nhttp2_keep_alive_interval = \"0s\"",
            "endpoint.http2_keep_alive_interval",
            "0ns",
        ),
        (
            "[endpoint]\nhttp2_keep_alive_interval = \"500ms\"",
            "endpoint.http2_keep_alive_interval",
            "500ms",
        ),
        (
            "[endpoint]\nkeep_alive_timeout = \"100ms\"",
            "endpoint.keep_alive_timeout",
            "100ms",
        ),
        (
            "[health]\nprobe_keepalive = \"200ms\"",
            "health.probe_keepalive",
            "200ms",
        ),
        ("[dns]\nmin_refresh = \"500ms\"", "dns.min_refresh", "500ms"),
        ("[dns]\nmax_addresses = 0", "dns.max_addresses", "0"),
    ] {
        let (f, v, message) = refused(&format!("{TARGETS}\n{rest}"));
        assert_eq!((f.as_str(), v.as_str()), (field, value), "{message}");
    }
    // One second is enough.
    let config = KitConfig::from_toml(&format!(
        "{TARGETS}\n[endpoint]\nhttp2_keep_alive_interval = \"1s\"\nkeep_alive_timeout = \"1s\"\n\
         [dns]\nmin_refresh = \"1s\""
    ))
    .unwrap();
    assert!(config.builder().is_ok());
}

#[test]
fn weights_whose_total_is_infinite_are_refused() {
    let (field, value, message) = refused(&format!(
        "{TARGETS}\nstrategy = \"weighted\"\n[weights]\n\"http://127.0.0.1:1\" = 1e308\n\
         \"http://127.0.0.1:2\" = 1e308"
    ));
    assert_eq!(field, "weights");
    assert!(value.contains("http://127.0.0.1:1 = 1e308"), "{value}");
    assert!(message.contains("infinity"), "{message}");
}

#[test]
fn targets_that_differ_only_in_the_case_of_scheme_or_host_are_duplicates() {
    let (field, value, message) =
        refused(r#"targets = ["http://billing.test:1", "HTTP://Billing.Test:1"]"#);
    assert_eq!(
        (field.as_str(), value.as_str()),
        ("targets[1]", "\"HTTP://Billing.Test:1\"")
    );
    assert!(
        message.contains("http://billing.test:1 is listed twice"),
        "{message}"
    );
    // The path is not the host: its case is kept, and the two are different targets.
    let config =
        KitConfig::from_toml(r#"targets = ["http://h.test:1/A", "http://h.test:1/a"]"#).unwrap();
    assert!(
        config
            .builder()
            .unwrap()
            .build()
            .is_err_and(|e| e.invalid_config().is_none())
    );
}

#[test]
fn addresses_with_user_info_are_refused_without_repeating_the_credentials() {
    for written in [
        "http://alice:s3cret@10.0.0.7:50051",
        "alice:s3cret@10.0.0.7:50051",
    ] {
        let (field, value, message) = refused(&format!("targets = [{written:?}]"));
        assert_eq!(field, "targets[0]");
        assert!(
            !value.contains("s3cret") && !message.contains("s3cret"),
            "{message}"
        );
        assert!(!message.contains("alice"), "{message}");
        assert!(message.contains("user info"), "{message}");
    }
    let (field, _, _) = refused(r#"target = "http://token@10.0.0.7:50051""#);
    assert_eq!(field, "target");
}

#[test]
fn endpoints_get_a_default_connect_timeout_unless_the_template_sets_one() {
    let default = EndpointTemplate::new()
        .endpoint("http://10.0.0.7:50051")
        .unwrap();
    assert_eq!(default.get_connect_timeout(), Some(Duration::from_secs(20)));
    assert_eq!(
        EndpointTemplate::DEFAULT_CONNECT_TIMEOUT,
        Duration::from_secs(20)
    );
    let settings = EndpointSettings::default().template();
    assert_eq!(
        settings
            .endpoint("http://10.0.0.7:50051")
            .unwrap()
            .get_connect_timeout(),
        Some(Duration::from_secs(20))
    );
    // The user's value wins.
    let own = EndpointTemplate::from_fn(|uri: &str| {
        Ok(Endpoint::from_shared(uri.to_owned())?.connect_timeout(Duration::from_millis(750)))
    });
    assert_eq!(
        own.endpoint("http://10.0.0.7:50051")
            .unwrap()
            .get_connect_timeout(),
        Some(Duration::from_millis(750))
    );
}

#[test]
fn wait_for_ready_has_no_cap_by_default_but_a_bound_for_calls_without_a_deadline() {
    assert_eq!(BalanceConfig::default().max_wait, None);
    assert_eq!(BalanceConfig::DEFAULT_MAX_WAIT, Duration::from_secs(20));
    let waiting = BalanceConfig {
        wait_for_ready: true,
        ..BalanceConfig::default()
    };
    assert!(waiting.validate().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_wait_for_ready_call_without_a_deadline_ends_at_the_default_bound() {
    // A target whose probe always fails: nothing ever becomes eligible.
    let down = ProbeMode::custom(|_: Arc<str>| async { Err("down".into()) });
    let kit = Kit::builder()
        .target("http://127.0.0.1:1")
        .health(HealthConfig::new().mode(down))
        .wait_for_ready(true)
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(5)).await);
    let mut client = TestServiceClient::new(kit.channel());
    let t0 = tokio::time::Instant::now();
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(t0.elapsed(), Duration::from_secs(20));
    kit.shutdown().await;
}

#[test]
fn dns_settings_explain_their_floor() {
    let err = DnsSettings::default()
        .min_refresh(Duration::from_millis(100))
        .validate()
        .unwrap_err();
    assert_eq!((err.field(), err.value()), ("dns.min_refresh", "100ms"));
    assert!(err.to_string().contains("at least 1 s"), "{err}");
}

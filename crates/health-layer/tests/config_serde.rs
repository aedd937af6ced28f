//! `HealthConfig` from a document (cargo feature `serde`): the same configuration as the
//! setters give, defaults for what is missing, unknown fields refused, validation at `build`.

use std::time::Duration;

use health_layer::probe::HttpProbe;
use health_layer::{Backoff, HealthConfig, ProbeMode};

fn parse(doc: &str) -> Result<HealthConfig, toml::de::Error> {
    toml::from_str(doc)
}

/// Configurations compare by what they print (the closures they hold cannot be compared).
fn same(a: &HealthConfig, b: &HealthConfig) {
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
}

#[test]
fn a_document_gives_what_the_setters_give() {
    let config = parse(
        r#"
        mode = "watch"
        interval = "10s"
        timeout = "1s 500ms"
        max_backoff = "2m"
        jitter = 0.1
        service = "orders.v1.Orders"
        unimplemented_is_healthy = false
        probe_keepalive = "5m"
        max_concurrent_probes = 8
        events_capacity = 16
        fail_fast_callbacks = true

        [watch_backoff]
        initial = "250ms"
        multiplier = 2.0
        max = "30s"
        jitter = 0.0
        "#,
    )
    .unwrap();
    let want = HealthConfig::new()
        .mode(ProbeMode::Watch)
        .interval(Duration::from_secs(10))
        .timeout(Duration::from_millis(1_500))
        .max_backoff(Duration::from_secs(120))
        .jitter(0.1)
        .service("orders.v1.Orders")
        .unimplemented_is_healthy(false)
        .probe_keepalive(Some(Duration::from_secs(300)))
        .max_concurrent_probes(8)
        .events_capacity(16)
        .fail_fast_callbacks(true)
        .watch_backoff(Backoff::new(
            Duration::from_millis(250),
            2.0,
            Duration::from_secs(30),
            0.0,
        ));
    same(&config, &want);
    assert!(config.build().is_ok());
}

#[test]
fn missing_fields_keep_their_defaults() {
    same(&parse("").unwrap(), &HealthConfig::default());
    same(
        &parse(r#"mode = "check""#).unwrap(),
        &HealthConfig::default(),
    );
    // A partial backoff keeps the other settings of the default one.
    let config = parse("watch_backoff = { max = \"10s\" }").unwrap();
    same(
        &config,
        &HealthConfig::new().watch_backoff(Backoff {
            max: Duration::from_secs(10),
            ..HealthConfig::DEFAULT_WATCH_BACKOFF
        }),
    );
}

#[test]
fn the_http_probe_takes_its_plain_settings() {
    let config = parse(
        r#"
        [mode.http]
        path = "/records/health-check-missing"
        accept_status = [200, 404]
        require_json_key = "ok"
        max_body = 1024
        "#,
    )
    .unwrap();
    let want = HealthConfig::new().mode(ProbeMode::Http(
        HttpProbe::new("/records/health-check-missing")
            .accept_status([200, 404])
            .require_json_key("ok")
            .max_body(1024),
    ));
    same(&config, &want);
    same(
        &parse("mode = { http = { path = \"/healthz\" } }").unwrap(),
        &HealthConfig::new().mode(ProbeMode::Http(HttpProbe::new("/healthz"))),
    );
}

#[test]
fn unknown_fields_and_modes_are_refused() {
    for doc in [
        "intervall = \"1s\"",
        "watch_backoff = { initial = \"1s\", factor = 2.0 }",
        "mode = \"custom\"",
        "mode = { http = { path = \"/\", predicate = \"x\" } }",
        "timeout = 5",
        "timeout = \"five seconds\"",
    ] {
        assert!(parse(doc).is_err(), "{doc}");
    }
}

#[test]
fn validation_stays_in_build() {
    let config = parse("timeout = \"0s\"").unwrap();
    let err = config.build().unwrap_err();
    assert_eq!((err.field(), err.value()), ("timeout", "0ns"));

    let config = parse("mode = { http = { path = \"no-slash\" } }").unwrap();
    let err = config.build().unwrap_err();
    assert_eq!(err.field(), "http_probe.path");
}

//! gRPC's service config JSON and per-call options, against real backends on loopback: the
//! documents gRPC publishes parse and apply; per-method timeout, wait-for-ready and message
//! size limits; the load-balancing policy; the health service name; and every refusal naming
//! its JSON path and value.

mod support;

use std::time::Duration;

use grpc_client_kit::balance::{Strategy, Weights};
use grpc_client_kit::service_config::{LbPolicy, ServiceConfig};
use grpc_client_kit::{CallOptions, Kit, KitConfig};
use support::{eventually, watch};
use test_backends::Backends;
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::{Ping, StreamPing};
use tokio::time::Instant;
use tonic::Code;
use tonic_health::ServingStatus;

/// How late after its deadline a call may end on a loaded machine.
const SLACK: Duration = Duration::from_millis(250);

const SERVICE: &str = "gck.test.v1.TestService";

type Client = TestServiceClient<grpc_client_kit::KitChannel>;

fn ping(payload: &str) -> tonic::Request<Ping> {
    tonic::Request::new(Ping {
        payload: payload.to_owned(),
    })
}

fn with_options<T>(message: T, options: CallOptions) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.extensions_mut().insert(options);
    request
}

/// A unary call: its outcome and how long it took (the test fails if it outlives 10 s).
async fn timed_unary(
    client: &mut Client,
    request: tonic::Request<Ping>,
) -> (Result<(), tonic::Status>, Duration) {
    let start = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(10), client.unary(request))
        .await
        .expect("the call ended within 10 s");
    (out.map(drop), start.elapsed())
}

async fn server_stream(
    client: &mut Client,
    request: tonic::Request<StreamPing>,
) -> Result<usize, tonic::Status> {
    let mut stream = client.server_stream(request).await?.into_inner();
    let mut n = 0;
    while let Some(pong) = stream.message().await? {
        let _ = pong;
        n += 1;
    }
    Ok(n)
}

fn build_error(json: &str) -> grpc_client_kit::InvalidConfig {
    Kit::builder()
        .target("http://127.0.0.1:1")
        .without_health()
        .service_config(json)
        .build()
        .expect_err(json)
        .invalid_config()
        .cloned()
        .expect("an invalid configuration")
}

// ----- gRPC's own documents -----

/// The retry example of gRPC's C++ documentation (grpc/grpc, `examples/cpp/retry/README.md`),
/// verbatim, and the method-name precedence example of gRPC's `doc/service_config.md` (the
/// `MyService` / `MyService/Foo` entries of its `name` comment), read as gRPC reads them.
#[test]
fn the_examples_of_grpcs_documentation_parse() {
    let retry = ServiceConfig::from_json(
        r#"{"methodConfig" : [{
               "name" : [{"service": "helloworld.Greeter"}],
               "waitForReady": true,
               "retryPolicy": {
                 "maxAttempts": 4,
                 "initialBackoff": "1s",
                 "maxBackoff": "120s",
                 "backoffMultiplier": 1.0,
                 "retryableStatusCodes": ["UNAVAILABLE"]
                }
           }]}"#,
    )
    .unwrap();
    let method = retry.method("/helloworld.Greeter/SayHello").unwrap();
    assert_eq!(method.wait_for_ready, Some(true));
    let policy = method.retry_policy.as_ref().unwrap();
    assert_eq!(policy.max_attempts, 4);
    assert_eq!(policy.initial_backoff, Duration::from_secs(1));
    assert_eq!(policy.max_backoff, Duration::from_secs(120));
    assert_eq!(policy.backoff_multiplier, 1.0);
    assert_eq!(policy.retryable_status_codes, [Code::Unavailable]);
    assert!(retry.method("/other.Service/SayHello").is_none());
    assert_eq!(retry.load_balancing(), None);

    let precedence = ServiceConfig::from_json(
        r#"{"methodConfig": [
              { "name": [ { "service": "MyService" } ], "timeout": "1s" },
              { "name": [ { "service": "MyService", "method": "Foo" } ], "timeout": "2s" }
           ]}"#,
    )
    .unwrap();
    let timeout = |path| precedence.method(path).and_then(|m| m.timeout);
    // "For a request for MyService/Foo, we will use the second entry ... For a request for
    // MyService/Bar, we will use the first entry."
    assert_eq!(timeout("/MyService/Foo"), Some(Duration::from_secs(2)));
    assert_eq!(timeout("/MyService/Bar"), Some(Duration::from_secs(1)));

    // gRFC A6's forms: a hedging policy, retry throttling; maxAttempts above 5 is 5.
    let a6 = ServiceConfig::from_json(
        r#"{"methodConfig": [
              { "name": [{}], "hedgingPolicy": { "maxAttempts": 7, "hedgingDelay": "0.5s",
                "nonFatalStatusCodes": ["UNAVAILABLE", 13, "aborted"] } }
           ],
           "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 }}"#,
    )
    .unwrap();
    let hedging = a6
        .method("/any.Service/Any")
        .unwrap()
        .hedging_policy
        .as_ref()
        .unwrap();
    assert_eq!(hedging.max_attempts, 5);
    assert_eq!(hedging.hedging_delay, Duration::from_millis(500));
    assert_eq!(
        hedging.non_fatal_status_codes,
        [Code::Unavailable, Code::Internal, Code::Aborted]
    );
    let throttling = a6.retry_throttling().unwrap();
    assert_eq!((throttling.max_tokens, throttling.token_ratio), (10, 0.1));
}

/// The same retry example, its service renamed to the test backends' (the only change), on a
/// kit: its `waitForReady` holds a call until the backend serves; its retry policy is
/// available on the kit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_documented_service_config_applies_to_calls() {
    let backends = Backends::start(1).await.unwrap();
    backends[0].set_serving(false).await;
    let json = r#"{"methodConfig" : [{
               "name" : [{"service": "gck.test.v1.TestService"}],
               "waitForReady": true,
               "retryPolicy": {
                 "maxAttempts": 4,
                 "initialBackoff": "1s",
                 "maxBackoff": "120s",
                 "backoffMultiplier": 1.0,
                 "retryableStatusCodes": ["UNAVAILABLE"]
                }
           }]}"#;
    let kit = Kit::builder()
        .targets(backends.uris())
        .health(watch())
        .service_config(json)
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(5)).await);
    assert!(kit.eligible_targets().is_empty());
    let policy = kit
        .service_config()
        .and_then(|c| c.method("/gck.test.v1.TestService/Unary"))
        .and_then(|m| m.retry_policy.clone())
        .unwrap();
    assert_eq!(policy.max_attempts, 4);

    let mut client = TestServiceClient::new(kit.channel());
    let call = tokio::spawn(async move { client.unary(ping("")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!call.is_finished(), "the call waits for ready");
    backends[0].set_serving(true).await;
    let pong = call
        .await
        .unwrap()
        .expect("answered once the backend serves");
    assert_eq!(pong.into_inner().backend, "b0");

    // Without the service config, the same call fails at once.
    backends[0].set_serving(false).await;
    let plain = Kit::builder()
        .targets(backends.uris())
        .health(watch())
        .build()
        .unwrap();
    assert!(plain.wait_until_ready(Duration::from_secs(5)).await);
    let mut client = TestServiceClient::new(plain.channel());
    let (out, took) = timed_unary(&mut client, ping("")).await;
    assert_eq!(out.unwrap_err().code(), Code::Unavailable);
    assert!(took < SLACK, "{took:?}");
}

// ----- timeout -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_methods_timeout_is_its_deadline_unless_the_calls_own_is_sooner() {
    let backends = Backends::start(1).await.unwrap();
    backends[0].set_delay(Duration::from_millis(500));
    let kit = Kit::builder()
        .targets(backends.uris())
        .without_health()
        .service_config(format!(
            r#"{{"methodConfig": [
                  {{ "name": [{{ "service": "{SERVICE}", "method": "Unary" }}], "timeout": "0.2s" }},
                  {{ "name": [{{ "service": "{SERVICE}" }}], "timeout": "5s" }}
               ]}}"#
        ))
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(kit.channel());

    // The slow method (500 ms): it ends at its configured 200 ms, which the server was told.
    let (out, took) = timed_unary(&mut client, ping("")).await;
    ended_at(out, took, 200);
    let sent = backends[0].last_request_headers().unwrap();
    let timeout = grpc_client_kit::balance::grpc_timeout(sent["grpc-timeout"].as_bytes()).unwrap();
    assert!(timeout <= Duration::from_millis(200), "{timeout:?}");

    // The service's other method (5 s) is fine.
    let streamed = server_stream(&mut client, tonic::Request::new(StreamPing { count: 2 })).await;
    assert_eq!(streamed.unwrap(), 2);

    // A call's own sooner deadline wins; a later one does not stretch the method's.
    for (own, ends) in [(60, 60), (1000, 200)] {
        let mut request = ping("");
        request.set_timeout(Duration::from_millis(own));
        let (out, took) = timed_unary(&mut client, request).await;
        ended_at(out, took, ends);
    }
    // So does `CallOptions::timeout`.
    let request = with_options(
        Ping::default(),
        CallOptions::new().timeout(Duration::from_millis(80)),
    );
    let (out, took) = timed_unary(&mut client, request).await;
    ended_at(out, took, 80);

    // Without a service config, `CallOptions::timeout` alone is the call's deadline.
    let plain = Kit::builder()
        .targets(backends.uris())
        .without_health()
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(plain.channel());
    let request = with_options(
        Ping::default(),
        CallOptions::new().timeout(Duration::from_millis(100)),
    );
    let (out, took) = timed_unary(&mut client, request).await;
    ended_at(out, took, 100);
}

/// A call ended by its deadline, `ms` after it was made (the backend would have answered at
/// 500 ms). The kit sends the deadline on (`grpc-timeout`), and the kit's timer and the
/// (in-process) server's run on the same clock: whichever fires first ends the call, and the
/// caller sees `DEADLINE_EXCEEDED` either way (a server's `CANCELLED` once the deadline has
/// passed is the deadline's doing).
#[track_caller]
fn ended_at(out: Result<(), tonic::Status>, took: Duration, ms: u64) {
    let status = out.expect_err("the call ended at its deadline");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    let at = Duration::from_millis(ms);
    assert!(
        took >= at && took < at + SLACK,
        "ended after {took:?}, not {at:?}"
    );
}

// ----- wait for ready -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_ready_per_method_and_per_call() {
    let backends = Backends::start(1).await.unwrap();
    backends[0].set_serving(false).await;
    let kit = Kit::builder()
        .targets(backends.uris())
        .health(watch())
        .service_config(format!(
            r#"{{"methodConfig": [
                  {{ "name": [{{ "service": "{SERVICE}", "method": "Unary" }}], "waitForReady": true }}
               ]}}"#
        ))
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(5)).await);
    assert!(kit.eligible_targets().is_empty());
    let mut client = TestServiceClient::new(kit.channel());

    // ServerStream has no setting: the kit's default, fail at once.
    let status = server_stream(&mut client, tonic::Request::new(StreamPing { count: 1 }))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    // Unary waits, up to its deadline.
    let mut request = ping("");
    request.set_timeout(Duration::from_millis(200));
    let (out, took) = timed_unary(&mut client, request).await;
    assert_eq!(out.unwrap_err().code(), Code::DeadlineExceeded);
    assert!(took >= Duration::from_millis(200), "{took:?}");
    // One call says otherwise: Unary fails at once.
    let request = with_options(Ping::default(), CallOptions::new().wait_for_ready(false));
    let (out, took) = timed_unary(&mut client, request).await;
    assert_eq!(out.unwrap_err().code(), Code::Unavailable);
    assert!(took < SLACK, "{took:?}");

    // ServerStream told to wait, and Unary as configured: both answered once the backend serves.
    let mut streamer = TestServiceClient::new(kit.channel());
    let stream = tokio::spawn(async move {
        let request = with_options(
            StreamPing { count: 3 },
            CallOptions::new().wait_for_ready(true),
        );
        server_stream(&mut streamer, request).await
    });
    let mut unary = TestServiceClient::new(kit.channel());
    let call = tokio::spawn(async move { unary.unary(ping("")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!stream.is_finished() && !call.is_finished());
    backends[0].set_serving(true).await;
    assert_eq!(stream.await.unwrap().unwrap(), 3);
    call.await.unwrap().unwrap();

    // Without transparent retry (the request goes down another path), the same.
    backends[0].set_serving(false).await;
    assert!(eventually(Duration::from_secs(5), || kit.eligible_targets().is_empty()).await);
    let no_retry = Kit::builder()
        .targets(backends.uris())
        .health(watch())
        .transparent_retry(false)
        .build()
        .unwrap();
    assert!(no_retry.wait_until_ready(Duration::from_secs(5)).await);
    let mut client = TestServiceClient::new(no_retry.channel());
    let call = tokio::spawn(async move {
        let request = with_options(Ping::default(), CallOptions::new().wait_for_ready(true));
        client.unary(request).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!call.is_finished());
    backends[0].set_serving(true).await;
    call.await.unwrap().unwrap();
}

// ----- message sizes -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_over_their_limits_fail_with_resource_exhausted() {
    let backends = Backends::start(1).await.unwrap();
    let kit = Kit::builder()
        .targets(backends.uris())
        .without_health()
        .service_config(format!(
            r#"{{"methodConfig": [
                  {{ "name": [{{ "service": "{SERVICE}", "method": "Unary" }}],
                     "maxResponseMessageBytes": 32 }},
                  {{ "name": [{{ "service": "{SERVICE}", "method": "ServerStream" }}],
                     "maxRequestMessageBytes": 1 }}
               ]}}"#
        ))
        .build()
        .unwrap();
    let target = backends[0].uri();
    let mut client = TestServiceClient::new(kit.channel());

    // A small reply is fine.
    client.unary(ping("")).await.unwrap();
    assert_eq!(backends[0].hits(), 1);
    // A reply over 32 bytes (the payload is echoed): the server answered, the client refuses.
    let status = client.unary(ping(&"x".repeat(40))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .contains("is larger than the limit of 32 bytes (maxResponseMessageBytes)"),
        "{status:?}"
    );
    assert!(
        status
            .message()
            .starts_with("/gck.test.v1.TestService/Unary: response message of ")
    );
    assert_eq!(backends[0].hits(), 2);

    // A request over its 1 byte (`count: 5` is 2 bytes): refused, never reaching the service.
    let status = server_stream(&mut client, tonic::Request::new(StreamPing { count: 5 }))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(
        status.message(),
        "/gck.test.v1.TestService/ServerStream: request message of 2 bytes is larger than the \
         limit of 1 bytes (maxRequestMessageBytes); it was not sent"
    );
    assert_eq!(backends[0].hits(), 2);
    // An empty request (`count: 0`) fits.
    assert_eq!(
        server_stream(&mut client, tonic::Request::new(StreamPing { count: 0 }))
            .await
            .unwrap(),
        0
    );

    // Per call, the smaller limit holds: the method has none for requests of Unary.
    let request = with_options(
        Ping {
            payload: "y".repeat(20),
        },
        CallOptions::new().max_request_message_bytes(16),
    );
    let status = client.unary(request).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .contains("request message of 22 bytes is larger than the limit of 16 bytes"),
        "{status:?}"
    );
    let request = with_options(
        Ping::default(),
        CallOptions::new().max_response_message_bytes(64),
    );
    client.unary(request).await.unwrap(); // 32 still holds, and this reply fits it
    assert_eq!(backends[0].hits(), 4);

    // None of it was the backend's fault: not quarantined, breaker closed (5 failures in a
    // row would open it), still picked.
    for _ in 0..6 {
        let request = with_options(
            Ping {
                payload: "y".repeat(20),
            },
            CallOptions::new().max_request_message_bytes(16),
        );
        assert_eq!(
            client.unary(request).await.unwrap_err().code(),
            Code::ResourceExhausted
        );
        let status = client.unary(ping(&"x".repeat(40))).await.unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted);
    }
    let card = kit.card(&target).unwrap();
    assert_eq!(
        card.breaker_state(),
        grpc_client_kit::state::BreakerState::Closed,
        "{card:?}"
    );
    assert!(
        !card.quarantine_state().active_at(Instant::now()),
        "{card:?}"
    );
    assert_eq!(kit.eligible_targets().len(), 1);
    client.unary(ping("")).await.unwrap();
}

// ----- load balancing -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancing_config_picks_the_first_policy_the_kit_knows() {
    let backends = Backends::start(2).await.unwrap();
    let weights = Weights::new().weight(backends[0].uri(), 3.0);
    let run = |json: &'static str| {
        let kit = Kit::builder()
            .targets(backends.uris())
            .without_health()
            .strategy(Strategy::Weighted(weights.clone()))
            .service_config(json)
            .build()
            .unwrap();
        async move {
            let mut client = TestServiceClient::new(kit.channel());
            let mut hits = [0usize; 2];
            for _ in 0..80 {
                match client
                    .unary(ping(""))
                    .await
                    .unwrap()
                    .into_inner()
                    .backend
                    .as_str()
                {
                    "b0" => hits[0] += 1,
                    _ => hits[1] += 1,
                }
            }
            hits
        }
    };
    // Unknown policies are skipped; round_robin replaces the builder's weighted strategy.
    let hits = run(
        r#"{"loadBalancingConfig": [{"grpclb": {}}, {"round_robin": {}}, {"pick_first": {}}]}"#,
    )
    .await;
    assert_eq!(hits, [40, 40]);
    // weighted_round_robin keeps the kit's weights (3:1).
    let hits =
        run(r#"{"loadBalancingConfig": [{"weighted_round_robin": {}}, {"round_robin": {}}]}"#)
            .await;
    assert!((58..=62).contains(&hits[0]), "{hits:?}");
    // No loadBalancingConfig: the kit's own strategy stands.
    let hits = run(r#"{"methodConfig": []}"#).await;
    assert!((58..=62).contains(&hits[0]), "{hits:?}");

    // pick_first: every call to the first target.
    let hits = run(r#"{"loadBalancingConfig": [{"pick_first": {}}, {"round_robin": {}}]}"#).await;
    assert_eq!(hits, [80, 0]);

    // ring_hash on a header: one key, one target; several keys, both.
    let kit = Kit::builder()
        .targets(backends.uris())
        .without_health()
        .service_config(
            r#"{"loadBalancingConfig": [{"ring_hash_experimental": {"requestHashHeader": "x-user"}}]}"#,
        )
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    let mut by_user =
        std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
    for _ in 0..3 {
        for user in 0..16 {
            let mut request = ping("");
            request
                .metadata_mut()
                .insert("x-user", format!("user-{user}").parse().unwrap());
            let backend = client.unary(request).await.unwrap().into_inner().backend;
            by_user
                .entry(format!("user-{user}"))
                .or_default()
                .insert(backend);
        }
    }
    assert!(by_user.values().all(|b| b.len() == 1), "{by_user:?}");
    let used: std::collections::BTreeSet<_> = by_user.values().flatten().collect();
    assert_eq!(used.len(), 2, "{by_user:?}");

    let config = ServiceConfig::from_json(
        r#"{"loadBalancingConfig": [{"xds_wrr_locality_experimental": {}},
            {"least_request_experimental": {"choiceCount": 3}}]}"#,
    )
    .unwrap();
    assert_eq!(
        config.load_balancing(),
        Some(&LbPolicy::LeastRequest { choice_count: 3 })
    );
}

#[test]
fn a_list_of_unknown_policies_is_refused_naming_them() {
    let err = build_error(
        r#"{"loadBalancingConfig": [{"grpclb": {}}, {"xds_cluster_manager_experimental": {"children": {}}}]}"#,
    );
    assert_eq!(err.field(), "service_config.loadBalancingConfig");
    assert!(
        err.to_string().contains(
            "none of these policies is one the kit knows: grpclb, xds_cluster_manager_experimental"
        ),
        "{err}"
    );
    // A known policy with a bad config is refused too, not skipped.
    let err = build_error(
        r#"{"loadBalancingConfig": [{"least_request_experimental": {"choiceCount": 1}}]}"#,
    );
    assert_eq!(
        (err.field(), err.value()),
        (
            "service_config.loadBalancingConfig[0].least_request_experimental.choiceCount",
            "1"
        )
    );
}

// ----- health service name -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_check_config_names_the_service_the_checker_asks_about() {
    let backends = Backends::start(1).await.unwrap();
    backends[0]
        .set_service_status(SERVICE, ServingStatus::NotServing)
        .await;
    let json = format!(r#"{{"healthCheckConfig": {{"serviceName": "{SERVICE}"}}}}"#);
    let kit = Kit::builder()
        .targets(backends.uris())
        .health(watch())
        .service_config(json)
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(5)).await);
    assert!(kit.eligible_targets().is_empty(), "{kit:?}");
    backends[0]
        .set_service_status(SERVICE, ServingStatus::Serving)
        .await;
    assert!(eventually(Duration::from_secs(5), || kit.eligible_targets().len() == 1).await);
}

// ----- refusals -----

#[test]
fn invalid_documents_are_refused_naming_the_json_path_and_value() {
    let retry = |field: &str| {
        let mut policy = serde_json::json!({
            "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
            "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]
        });
        let (key, value) = field.split_once('=').unwrap();
        policy[key] = serde_json::from_str(value).unwrap();
        format!(r#"{{"methodConfig": [{{"name": [{{}}], "retryPolicy": {policy}}}]}}"#)
    };
    let cases: Vec<(String, &str, &str, &str)> = vec![
        (
            r#"{"methodConfig": [{"name": [{}], "timeout": "abc"}]}"#.into(),
            "methodConfig[0].timeout",
            r#""abc""#,
            r#"expected a duration like "1.5s""#,
        ),
        (
            r#"{"methodConfig": [{"name": [{}], "timeout": "0s"}]}"#.into(),
            "methodConfig[0].timeout",
            r#""0s""#,
            "above zero",
        ),
        (
            r#"{"methodConfig": [{"name": [{}], "timeout": 5}]}"#.into(),
            "methodConfig[0].timeout",
            "5",
            "a duration",
        ),
        (
            r#"{"methodConfig": [{"name": [{}], "waitForReady": "yes"}]}"#.into(),
            "methodConfig[0].waitForReady",
            r#""yes""#,
            "true or false",
        ),
        (
            r#"{"methodConfig": [{"name": [{}], "maxRequestMessageBytes": -1}]}"#.into(),
            "methodConfig[0].maxRequestMessageBytes",
            "-1",
            "a whole number",
        ),
        (
            r#"{"methodConfig": [{"name": [{}], "maxResponseMessageBytes": 4294967296}]}"#.into(),
            "methodConfig[0].maxResponseMessageBytes",
            "4294967296",
            "a whole number",
        ),
        (retry(r#"maxAttempts=1"#), "methodConfig[0].retryPolicy.maxAttempts", "1", "at least 2"),
        (retry(r#"initialBackoff="0s""#), "methodConfig[0].retryPolicy.initialBackoff", r#""0s""#, "above zero"),
        (retry(r#"maxBackoff="-1s""#), "methodConfig[0].retryPolicy.maxBackoff", r#""-1s""#, "a duration"),
        (retry(r#"backoffMultiplier=0"#), "methodConfig[0].retryPolicy.backoffMultiplier", "0", "above zero"),
        (retry(r#"retryableStatusCodes=[]"#), "methodConfig[0].retryPolicy.retryableStatusCodes", "[]", "at least one"),
        (
            retry(r#"retryableStatusCodes=["UNAVAILABLE", "SOMETIMES"]"#),
            "methodConfig[0].retryPolicy.retryableStatusCodes[1]",
            r#""SOMETIMES""#,
            "a gRPC status code",
        ),
        (retry(r#"retryableStatusCodes=[17]"#), "methodConfig[0].retryPolicy.retryableStatusCodes[0]", "17", "from 0 to 16"),
        (
            r#"{"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 2}}]}"#.into(),
            "methodConfig[0].retryPolicy.initialBackoff",
            "",
            "missing",
        ),
        (
            r#"{"methodConfig": [{"name": [{}], "retryPolicy": {}, "hedgingPolicy": {"maxAttempts": 2}}]}"#.into(),
            "methodConfig[0].hedgingPolicy",
            r#"{"maxAttempts":2}"#,
            "not both",
        ),
        (
            r#"{"methodConfig": [{"name": [{}], "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "soon"}}]}"#.into(),
            "methodConfig[0].hedgingPolicy.hedgingDelay",
            r#""soon""#,
            "a duration",
        ),
        (
            r#"{"retryThrottling": {"maxTokens": 0, "tokenRatio": 0.1}}"#.into(),
            "retryThrottling.maxTokens",
            "0",
            "from 1 to 1000",
        ),
        (
            r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.0001}}"#.into(),
            "retryThrottling.tokenRatio",
            "0.0001",
            "above zero",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "a.B"}]}, {"name": [{"service": "a.B"}]}]}"#.into(),
            "methodConfig[1].name[0]",
            r#"{"service":"a.B"}"#,
            "in an earlier methodConfig entry",
        ),
        (
            r#"{"methodConfig": [{"name": [{"method": "Get"}]}]}"#.into(),
            "methodConfig[0].name[0]",
            r#"{"method":"Get"}"#,
            "needs its service",
        ),
        (
            r#"{"methodConfig": {"name": []}}"#.into(),
            "methodConfig",
            r#"{"name":[]}"#,
            "a list",
        ),
        (
            r#"{"loadBalancingConfig": [{"round_robin": {}, "pick_first": {}}]}"#.into(),
            "loadBalancingConfig[0]",
            r#"{"pick_first":{},"round_robin":{}}"#,
            "exactly one policy",
        ),
        (
            r#"{"healthCheckConfig": {"serviceName": 7}}"#.into(),
            "healthCheckConfig.serviceName",
            "7",
            "a string",
        ),
        (r#"{"methodConfig": [}"#.into(), "(document)", "", "not valid JSON"),
        (r#"[]"#.into(), "(document)", "[]", "a JSON object"),
    ];
    for (json, field, value, says) in cases {
        let err = build_error(&json);
        assert_eq!(
            (err.field(), err.value()),
            (format!("service_config.{field}").as_str(), value),
            "{json}: {err}"
        );
        assert!(err.to_string().contains(says), "{json}: {err}");
    }
    // The whole message, as the kit prints it.
    let err = build_error(r#"{"methodConfig": [{"name": [{}], "timeout": "abc"}]}"#);
    assert_eq!(
        err.to_string(),
        r#"invalid grpc-client-kit configuration: service_config.methodConfig[0].timeout = "abc": expected a duration like "1.5s""#
    );
}

#[cfg(feature = "toml")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_file_takes_a_service_config() {
    let backends = Backends::start(2).await.unwrap();
    let document = format!(
        r#"
        targets = ["{}", "{}"]
        strategy = "random"
        service_config = '''
        {{
          "loadBalancingConfig": [{{ "round_robin": {{}} }}],
          "methodConfig": [{{ "name": [{{}}], "maxRequestMessageBytes": 8 }}]
        }}
        '''
        [health]
        enabled = false
        "#,
        backends[0].uri(),
        backends[1].uri()
    );
    let kit = KitConfig::from_toml(&document).unwrap().build().unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    let mut b0 = 0;
    for _ in 0..10 {
        if client.unary(ping("")).await.unwrap().into_inner().backend == "b0" {
            b0 += 1;
        }
    }
    assert_eq!(b0, 5, "round_robin from the service config, not random");
    let status = client.unary(ping("0123456789")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);

    let bad = format!(
        "targets = [\"{}\"]\nservice_config = '{{\"methodConfig\": [{{\"name\": [{{}}], \"timeout\": \"1m\"}}]}}'\n",
        backends[0].uri()
    );
    let err = KitConfig::from_toml(&bad).unwrap().build().unwrap_err();
    let err = err.invalid_config().unwrap();
    assert_eq!(
        (err.field(), err.value()),
        ("service_config.methodConfig[0].timeout", r#""1m""#)
    );
}

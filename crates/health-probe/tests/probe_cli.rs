//! The built `grpc-health-probe` binary against real local servers: flags in Go's forms, every
//! exit code with its message, metadata and user agent on the wire, gzip, several addresses,
//! interrupts.

mod support;

use std::time::Duration;

use support::{CheckOnly, Running, no_health_server, probe, standard_health};
use test_backends::{Backend, BlackHole, ServingStatus};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_exits_0_with_every_go_form_of_the_flags() {
    let backend = Backend::start("b0").await.unwrap();
    let addr = backend.addr().to_string();
    let eq = format!("-addr={addr}");
    let eq2 = format!("--addr={addr}");
    for args in [
        vec![eq.as_str()],
        vec!["-addr", &addr],
        vec![eq2.as_str()],
        vec!["--addr", &addr],
        vec!["-addr", &addr, "-service", "gck.test.v1.TestService"],
        vec![
            "-addr",
            &addr,
            "--service=gck.test.v1.TestService",
            "-rpc-timeout=2s",
        ],
        vec![
            "-addr",
            &addr,
            "-connect-timeout",
            "1m30s",
            "--rpc-timeout",
            "1.5s",
        ],
        // Booleans: bare, =true, =false.
        vec!["-addr", &addr, "-v=false", "-tls=false", "-gzip=0"],
    ] {
        let run = probe(&args).await;
        assert_eq!(run.code, 0, "{args:?}: {run:?}");
        assert_eq!(run.line(), "status: SERVING", "{args:?}");
        assert_eq!(run.stdout, "", "the original writes only to stderr");
    }
    assert_eq!(backend.health_checks(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_serving_exits_4() {
    let backend = Backend::start("b0").await.unwrap();
    let addr = backend.addr().to_string();
    backend.set_serving(false).await;
    let run = probe(&["-addr", &addr]).await;
    assert_eq!(run.code, 4, "{run:?}");
    assert_eq!(
        run.line(),
        r#"service unhealthy (responded with "NOT_SERVING")"#
    );

    // Per service name; the whole server going back to SERVING does not change it.
    backend.set_serving(true).await;
    backend
        .set_service_status("orders", ServingStatus::NotServing)
        .await;
    let run = probe(&["-addr", &addr, "-service=orders"]).await;
    assert_eq!(run.code, 4, "{run:?}");
    let run = probe(&["-addr", &addr]).await;
    assert_eq!(run.code, 0, "{run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_service_is_an_rpc_failure() {
    let backend = Backend::start("b0").await.unwrap();
    let run = probe(&["-addr", &backend.addr().to_string(), "-service", "nope"]).await;
    assert_eq!(run.code, 3, "{run:?}");
    assert!(
        run.line()
            .starts_with("error: health rpc failed: rpc error: code = NotFound desc = "),
        "{run:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_health_service_is_an_rpc_failure() {
    let server = no_health_server().await;
    let run = probe(&["-addr", &server.addr()]).await;
    assert_eq!(run.code, 3, "{run:?}");
    assert!(
        run.line().starts_with(
            "error: this server does not implement the grpc health protocol \
             (grpc.health.v1.Health)"
        ),
        "{run:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_health_answer_is_an_rpc_timeout_not_a_connection_failure() {
    let slow = CheckOnly::new(Duration::from_secs(60));
    let server = slow.serve().await;
    let run = probe(&["-addr", &server.addr(), "-rpc-timeout", "300ms"]).await;
    assert_eq!(run.code, 3, "{run:?}");
    assert_eq!(
        run.line(),
        "timeout: health rpc did not complete within 300ms"
    );
    assert!(run.elapsed >= Duration::from_millis(300), "{run:?}");
    assert!(run.elapsed < Duration::from_secs(20), "{run:?}");
    // The deadline went to the server too.
    let headers = server.last_request_headers().unwrap();
    assert!(headers.contains_key("grpc-timeout"), "{headers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_port_is_a_connection_failure() {
    let backend = Backend::start("b0").await.unwrap();
    let addr = backend.addr().to_string();
    backend.stop().await;
    let run = probe(&["-addr", &addr]).await;
    assert_eq!(run.code, 2, "{run:?}");
    let line = run.line();
    assert!(
        line.starts_with(&format!(
            "error: failed to connect service at \"{addr}\": dial tcp {addr}: "
        )),
        "{line}"
    );
    assert!(line.to_lowercase().contains("refused"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_is_a_connection_failure_after_the_connect_timeout() {
    let hole = BlackHole::start().await.unwrap();
    let addr = hole.addr().to_string();
    // The RPC timeout is long: were the black hole "connected", this would be an RPC timeout
    // after 20 s.
    let run = probe(&[
        "-addr",
        &addr,
        "-connect-timeout",
        "700ms",
        "-rpc-timeout",
        "20s",
    ])
    .await;
    assert_eq!(run.code, 2, "{run:?}");
    assert_eq!(
        run.line(),
        format!("timeout: failed to connect service \"{addr}\" within 700ms")
    );
    assert!(run.elapsed >= Duration::from_millis(700), "{run:?}");
    assert!(run.elapsed < Duration::from_secs(15), "{run:?}");
    assert!(hole.connections_accepted() >= 1, "TCP was accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_that_cannot_be_dialled_is_a_connection_failure() {
    let run = probe(&["-addr", "localhost"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert_eq!(
        run.line(),
        "error: failed to connect service at \"localhost\": invalid address \"localhost\": \
         missing port in address"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_exit_1_with_the_originals_messages() {
    let tls_only = [
        (
            "-tls-no-verify",
            "specified -tls-no-verify without specifying -tls",
        ),
        (
            "-tls-ca-cert=ca.pem",
            "specified -tls-ca-cert without specifying -tls",
        ),
        (
            "-tls-client-cert=c.pem",
            "specified -tls-client-cert without specifying -tls",
        ),
        (
            "-tls-server-name=x",
            "specified -tls-server-name without specifying -tls",
        ),
    ];
    for (flag, message) in tls_only {
        let run = probe(&["-addr=127.0.0.1:1", flag]).await;
        assert_eq!(run.code, 1, "{flag}: {run:?}");
        assert_eq!(run.line(), format!("error: {message}"));
    }
    for (args, message) in [
        (&[][..], "error: -addr not specified"),
        (&["-service=x"], "error: -addr not specified"),
        (
            &["-addr=127.0.0.1:1", "-connect-timeout=0"],
            "error: -connect-timeout must be greater than zero (specified: 0s)",
        ),
        (
            &["-addr=127.0.0.1:1", "-rpc-timeout", "0s"],
            "error: -rpc-timeout must be greater than zero (specified: 0s)",
        ),
        (
            &["-addr=127.0.0.1:1", "-rpc-timeout", "-2s"],
            "error: -rpc-timeout must be greater than zero (specified: -2s)",
        ),
        (
            &["-addr=127.0.0.1:1", "-tls", "-tls-client-cert=c.pem"],
            "error: specified -tls-client-cert without specifying -tls-client-key",
        ),
        (
            &["-addr=127.0.0.1:1", "-tls", "-tls-client-key=k.pem"],
            "error: specified -tls-client-key without specifying -tls-client-cert",
        ),
        (
            &[
                "-addr=127.0.0.1:1",
                "-tls",
                "-tls-no-verify",
                "-tls-ca-cert=ca.pem",
            ],
            "error: cannot specify -tls-ca-cert with -tls-no-verify (CA cert would not be used)",
        ),
        (
            &[
                "-addr=127.0.0.1:1",
                "-tls",
                "-tls-no-verify",
                "-tls-server-name=x",
            ],
            "error: cannot specify -tls-server-name with -tls-no-verify (server name would not \
             be used)",
        ),
    ] {
        let run = probe(args).await;
        assert_eq!(run.code, 1, "{args:?}: {run:?}");
        assert_eq!(run.line(), message, "{args:?}");
    }
    // Flag syntax errors: Go's flag package message, then the usage.
    for (args, first_line) in [
        (
            &["-addr=127.0.0.1:1", "-rpc-header", "no colon here"][..],
            "invalid value \"no colon here\" for flag -rpc-header: invalid RPC header, \
             expected 'key: value', got \"no colon here\"",
        ),
        (
            &["-addr=127.0.0.1:1", "-rpc-header=bad name: v"],
            "invalid value \"bad name: v\" for flag -rpc-header: invalid RPC header name \
             \"bad name\"",
        ),
        (
            &["-addr=127.0.0.1:1", "-rpc-timeout=soon"],
            "invalid value \"soon\" for flag -rpc-timeout: parse error",
        ),
        (
            &["-addr=127.0.0.1:1", "-tls=maybe"],
            "invalid boolean value \"maybe\" for -tls: parse error",
        ),
        (&["-alts"], "flag provided but not defined: -alts"),
        (&["-addr"], "flag needs an argument: -addr"),
    ] {
        let run = probe(args).await;
        assert_eq!(run.code, 1, "{args:?}: {run:?}");
        let lines = run.lines();
        assert_eq!(lines[0], first_line, "{args:?}");
        assert_eq!(lines[1], "Usage:", "{args:?}");
        assert!(run.stderr.contains("  -rpc-header value"), "{run:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_and_help() {
    let run = probe(&["-version"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.stdout,
        format!("grpc-health-probe {}\n", env!("CARGO_PKG_VERSION"))
    );
    // As Go's flag package: the usage on stderr, and the original exits 1.
    let run = probe(&["-help"]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.starts_with("Usage:\n  -addr string"), "{run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_after_the_flags_are_ignored_like_the_original() {
    let backend = Backend::start("b0").await.unwrap();
    // Go stops at "extra": -tls is never seen, so this is a plaintext probe that succeeds.
    let run = probe(&["-addr", &backend.addr().to_string(), "extra", "-tls"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.lines(),
        [
            "warning: ignoring the arguments after the flags (as grpc_health_probe does): \
             extra -tls",
            "status: SERVING"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_headers_and_the_user_agent_reach_the_server() {
    let backend = Backend::start("b0").await.unwrap();
    let addr = backend.addr().to_string();
    let run = probe(&[
        "-addr",
        &addr,
        "-rpc-header",
        "X-Tenant: blue",
        "-rpc-header=x-trace:a:b",
        "-rpc-header",
        "x-multi: 1",
        "-rpc-header",
        "x-multi: 2",
        "-rpc-header",
        "blob-bin: hello",
        "-user-agent",
        "kube-probe/1.30",
    ])
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let headers = backend.last_request_headers().unwrap();
    assert_eq!(headers["x-tenant"], "blue");
    assert_eq!(headers["x-trace"], "a:b");
    let multi: Vec<_> = headers.get_all("x-multi").iter().collect();
    assert_eq!(multi, ["1", "2"]);
    // Binary metadata travels base64-encoded.
    let blob = headers["blob-bin"].to_str().unwrap();
    assert!(blob == "aGVsbG8" || blob == "aGVsbG8=", "{blob}");
    let agent = headers["user-agent"].to_str().unwrap();
    assert!(agent.starts_with("kube-probe/1.30 tonic/"), "{agent}");

    // The default user agent is the original's.
    let run = probe(&["-addr", &addr]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let headers = backend.last_request_headers().unwrap();
    let agent = headers["user-agent"].to_str().unwrap();
    assert!(agent.starts_with("grpc_health_probe tonic/"), "{agent}");
    assert!(!headers.contains_key("x-tenant"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_compresses_the_request() {
    let server = standard_health(true, None).await;
    let run = probe(&["-addr", &server.addr(), "-gzip"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let headers = server.last_request_headers().unwrap();
    assert_eq!(headers["grpc-encoding"], "gzip");
    assert!(
        headers["grpc-accept-encoding"]
            .to_str()
            .unwrap()
            .contains("gzip")
    );

    let run = probe(&["-addr", &server.addr()]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let headers = server.last_request_headers().unwrap();
    assert!(!headers.contains_key("grpc-encoding"), "{headers:?}");

    // A server that does not take gzip refuses the compressed request (an RPC failure).
    let backend = Backend::start("b0").await.unwrap();
    let run = probe(&["-addr", &backend.addr().to_string(), "-gzip"]).await;
    assert_eq!(run.code, 3, "{run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_addresses_one_line_each_and_the_worst_exit_code() {
    let b0 = Backend::start("b0").await.unwrap();
    let b1 = Backend::start("b1").await.unwrap();
    b1.set_serving(false).await;
    let (a0, a1) = (b0.addr().to_string(), b1.addr().to_string());
    let refused = {
        let gone = Backend::start("gone").await.unwrap();
        let addr = gone.addr().to_string();
        gone.stop().await;
        addr
    };

    let run = probe(&["-addr", &a0, "-addr", &a0]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.lines(),
        [
            format!("{a0}: status: SERVING"),
            format!("{a0}: status: SERVING")
        ]
    );

    let run = probe(&["-addr", &a1, "-addr", &a0]).await;
    assert_eq!(run.code, 4, "{run:?}");
    assert_eq!(
        run.lines(),
        [
            format!("{a1}: service unhealthy (responded with \"NOT_SERVING\")"),
            format!("{a0}: status: SERVING"),
        ]
    );

    // Lines in the order given; connection failure (2) is worse than not serving (4).
    let run = probe(&["-addr", &a0, "-addr", &refused, "--addr", &a1]).await;
    assert_eq!(run.code, 2, "{run:?}");
    let lines = run.lines();
    assert_eq!(lines.len(), 3, "{run:?}");
    assert_eq!(lines[0], format!("{a0}: status: SERVING"));
    assert!(
        lines[1].starts_with(&format!(
            "{refused}: error: failed to connect service at \"{refused}\""
        )),
        "{run:?}"
    );
    assert_eq!(
        lines[2],
        format!("{a1}: service unhealthy (responded with \"NOT_SERVING\")")
    );

    // An RPC failure (3: b0 does not know "orders") is worse than not serving (4).
    b1.set_service_status("orders", ServingStatus::NotServing)
        .await;
    let run = probe(&["-addr", &a1, "-addr", &a0, "-service", "orders"]).await;
    assert_eq!(run.code, 3, "{run:?}");
    let lines = run.lines();
    assert_eq!(
        lines[0],
        format!("{a1}: service unhealthy (responded with \"NOT_SERVING\")")
    );
    assert!(
        lines[1].starts_with(&format!(
            "{a0}: error: health rpc failed: rpc error: code = NotFound"
        )),
        "{run:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_addresses_are_checked_concurrently() {
    let holes = [
        BlackHole::start().await.unwrap(),
        BlackHole::start().await.unwrap(),
        BlackHole::start().await.unwrap(),
    ];
    let addrs: Vec<String> = holes.iter().map(|h| h.addr().to_string()).collect();
    let mut args = vec!["-connect-timeout", "1500ms"];
    for a in &addrs {
        args.extend(["-addr", a.as_str()]);
    }
    let run = probe(&args).await;
    assert_eq!(run.code, 2, "{run:?}");
    let lines = run.lines();
    for (line, addr) in lines.iter().zip(&addrs) {
        assert_eq!(
            *line,
            format!("{addr}: timeout: failed to connect service \"{addr}\" within 1.5s")
        );
    }
    // One after the other would take at least 4.5 s.
    assert!(run.elapsed < Duration::from_millis(4_000), "{run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_probe_exits_with_the_code_of_where_it_was() {
    // Still connecting: a connection failure.
    let hole = BlackHole::start().await.unwrap();
    let addr = hole.addr().to_string();
    let mut run = Running::start(&["-addr", &addr, "-connect-timeout", "60s", "-v"]);
    run.line_where(|l| l == "establishing connection").await;
    run.signal("INT").await;
    let (code, rest) = run.finish().await;
    assert_eq!(code, 2, "{rest:?}");
    assert_eq!(
        rest,
        [
            "cancellation received".to_owned(),
            format!("error: failed to connect service at \"{addr}\": context canceled"),
        ]
    );

    // Waiting for the answer: an RPC failure.
    let slow = CheckOnly::new(Duration::from_secs(60));
    let server = slow.serve().await;
    let mut run = Running::start(&["-addr", &server.addr(), "-rpc-timeout", "60s", "-v"]);
    run.line_where(|l| l.starts_with("connection established (took "))
        .await;
    run.signal("TERM").await;
    let (code, rest) = run.finish().await;
    assert_eq!(code, 3, "{rest:?}");
    assert_eq!(
        rest,
        [
            "cancellation received",
            "error: health rpc failed: rpc error: code = Canceled desc = context canceled",
        ]
    );
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_address() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("health.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let addr = format!("unix://{}", path.display());
    let run = probe(&["-addr", &addr]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.line(), "status: SERVING");
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    let run = probe(&["-addr", &addr]).await;
    assert_eq!(run.code, 4, "{run:?}");
    server.abort();
}

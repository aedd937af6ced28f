//! The built binary against local TLS servers whose certificates are made in the test: CA
//! verification, server name override, no-verify, client certificates, and the mistakes
//! (wrong CA, plaintext against TLS and back, unreadable files).

mod support;

use support::{Pki, arg, probe, standard_health};
use test_backends::Backend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verifies_the_server_against_the_ca_and_its_name() {
    let pki = Pki::new();
    let server = standard_health(false, Some(pki.server_tls(false))).await;
    let port = server.addr.port();
    let ca = arg(&pki.ca);

    // The certificate is for localhost and probe.test.
    let localhost = format!("localhost:{port}");
    let run = probe(&["-addr", &localhost, "-tls", "-tls-ca-cert", ca]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.line(), "status: SERVING");
    // The request went over TLS with an https :scheme.
    let headers = server.last_request_headers().unwrap();
    assert!(
        headers["user-agent"]
            .to_str()
            .unwrap()
            .starts_with("grpc_health_probe")
    );

    // Not for 127.0.0.1: the name does not match.
    let ip = server.addr();
    let run = probe(&["-addr", &ip, "-tls", "-tls-ca-cert", ca]).await;
    assert_eq!(run.code, 2, "{run:?}");
    let line = run.line();
    assert!(
        line.starts_with(&format!(
            "error: failed to connect service at \"{ip}\": tls handshake with tcp {ip}: "
        )),
        "{line}"
    );
    assert!(line.contains("not valid for name"), "{line}");

    // ... unless -tls-server-name names what the certificate is for.
    let run = probe(&[
        "-addr",
        &ip,
        "-tls",
        "-tls-ca-cert",
        ca,
        "-tls-server-name",
        "probe.test",
    ])
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let run = probe(&[
        "-addr",
        &ip,
        "-tls",
        "-tls-ca-cert",
        ca,
        "-tls-server-name=other.test",
    ])
    .await;
    assert_eq!(run.code, 2, "{run:?}");

    // Another CA did not sign it.
    let run = probe(&[
        "-addr",
        &localhost,
        "-tls",
        "-tls-ca-cert",
        arg(&pki.other_ca),
    ])
    .await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.line().contains("UnknownIssuer"), "{run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_verify_accepts_any_certificate() {
    let pki = Pki::new();
    let server = standard_health(false, Some(pki.server_tls(false))).await;
    // Neither the issuer (no CA given, and the system does not trust ours) nor the name
    // (127.0.0.1) would pass verification.
    let run = probe(&["-addr", &server.addr(), "-tls", "-tls-no-verify"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.line(), "status: SERVING");
    let run = probe(&["-addr", &server.addr(), "-tls"]).await;
    assert_eq!(
        run.code, 2,
        "verification is on without -tls-no-verify: {run:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented_when_the_server_asks() {
    let pki = Pki::new();
    let server = standard_health(false, Some(pki.server_tls(true))).await;
    let addr = format!("localhost:{}", server.addr.port());
    let ca = arg(&pki.ca);

    let run = probe(&["-addr", &addr, "-tls", "-tls-ca-cert", ca]).await;
    assert_eq!(
        run.code, 2,
        "the server requires a client certificate: {run:?}"
    );
    assert!(
        run.line()
            .starts_with(&format!("error: failed to connect service at \"{addr}\": ")),
        "{run:?}"
    );

    let run = probe(&[
        "-addr",
        &addr,
        "-tls",
        "-tls-ca-cert",
        ca,
        "-tls-client-cert",
        arg(&pki.client_cert),
        "-tls-client-key",
        arg(&pki.client_key),
    ])
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.line(), "status: SERVING");

    // With -tls-no-verify too (the client certificate still goes).
    let run = probe(&[
        "-addr",
        &addr,
        "-tls",
        "-tls-no-verify",
        "-tls-client-cert",
        arg(&pki.client_cert),
        "-tls-client-key",
        arg(&pki.client_key),
    ])
    .await;
    assert_eq!(run.code, 0, "{run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_and_tls_mismatches_are_connection_failures() {
    let pki = Pki::new();
    let tls_server = standard_health(false, Some(pki.server_tls(false))).await;
    // Plaintext against a TLS server: it answers the HTTP/2 preface with a TLS alert and
    // closes. Whether the alert is read (then the line ends with "it looks like a TLS server:
    // try -tls") or the next write fails first depends on timing; either way it is a
    // connection failure at once, not a timeout.
    let addr = tls_server.addr();
    let run = probe(&["-addr", &addr, "-connect-timeout", "20s"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.line().starts_with(&format!(
            "error: failed to connect service at \"{addr}\": tcp {addr} closed the connection "
        )),
        "{run:?}"
    );
    assert!(run.elapsed < std::time::Duration::from_secs(15), "{run:?}");

    // TLS against a plaintext server: the handshake fails.
    let backend = Backend::start("b0").await.unwrap();
    let addr = backend.addr().to_string();
    let run = probe(&["-addr", &addr, "-tls", "-tls-no-verify"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.line().starts_with(&format!(
            "error: failed to connect service at \"{addr}\": tls handshake with tcp {addr}: "
        )),
        "{run:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_tls_files_are_bad_arguments() {
    let pki = Pki::new();
    let missing = pki.dir.path().join("missing.pem");
    for (args, start) in [
        (
            vec!["-tls-ca-cert", arg(&missing)],
            format!(
                "failed to initialize tls credentials. error=failed to load root CA \
                 certificates from file ({})",
                missing.display()
            ),
        ),
        (
            vec!["-tls-ca-cert", arg(&pki.not_a_cert)],
            format!(
                "failed to initialize tls credentials. error=no root CA certs parsed from file {}",
                pki.not_a_cert.display()
            ),
        ),
        (
            vec![
                "-tls-client-cert",
                arg(&pki.client_cert),
                "-tls-client-key",
                arg(&missing),
            ],
            "failed to initialize tls credentials. error=failed to load tls client cert/key \
             pair. error="
                .to_owned(),
        ),
        (
            vec![
                "-tls-client-cert",
                arg(&pki.client_cert),
                "-tls-client-key",
                arg(&pki.wrong_key),
            ],
            "failed to initialize tls credentials. error=failed to load tls client cert/key \
             pair. error="
                .to_owned(),
        ),
    ] {
        let mut all = vec!["-addr", "127.0.0.1:1", "-tls"];
        all.extend(args);
        let run = probe(&all).await;
        assert_eq!(run.code, 1, "{all:?}: {run:?}");
        assert!(run.line().starts_with(&start), "{all:?}: {run:?}");
    }
}

use std::time::Duration;

use super::*;

fn probe(args: &[&str]) -> Options {
    match parse_args(args) {
        Ok(Parsed {
            command: Command::Probe(o),
            ..
        }) => o,
        other => panic!("{args:?} gave {other:?}"),
    }
}

fn error(args: &[&str]) -> String {
    parse_args(args).unwrap_err().to_string()
}

#[test]
fn accepts_every_go_form_of_a_value_flag() {
    for args in [
        &["-addr=h:1"][..],
        &["-addr", "h:1"],
        &["--addr=h:1"],
        &["--addr", "h:1"],
    ] {
        assert_eq!(probe(args).addrs, ["h:1"], "{args:?}");
    }
    // The value may itself start with '-' when it is a separate argument.
    let o = probe(&["-addr", "h:1", "-service", "-weird-name"]);
    assert_eq!(o.service, "-weird-name");
    // '=' splits at the first '=' only.
    assert_eq!(probe(&["-addr=h:1", "-service=a=b"]).service, "a=b");
}

#[test]
fn accepts_every_go_form_of_a_boolean_flag() {
    for (args, tls) in [
        (&["-addr=h:1", "-tls"][..], true),
        (&["-addr=h:1", "--tls"], true),
        (&["-addr=h:1", "-tls=true"], true),
        (&["-addr=h:1", "-tls=1"], true),
        (&["-addr=h:1", "-tls=T"], true),
        (&["-addr=h:1", "-tls=True"], true),
        (&["-addr=h:1", "-tls=TRUE"], true),
        (&["-addr=h:1", "-tls=false"], false),
        (&["-addr=h:1", "-tls=0"], false),
        (&["-addr=h:1", "-tls", "-tls=f"], false),
    ] {
        assert_eq!(probe(args).tls.is_some(), tls, "{args:?}");
    }
    assert_eq!(
        error(&["-addr=h:1", "-tls=yes"]),
        "invalid boolean value \"yes\" for -tls: parse error"
    );
}

#[test]
fn a_boolean_flag_does_not_take_the_next_argument() {
    // As in Go: "-tls false" is -tls, then a non-flag that stops parsing.
    let parsed = parse_args(["-addr=h:1", "-tls", "false", "-gzip"]).unwrap();
    let Command::Probe(o) = parsed.command else {
        panic!()
    };
    assert!(o.tls.is_some());
    assert!(!o.gzip, "flags after the first non-flag are ignored");
    assert_eq!(parsed.ignored, ["false", "-gzip"]);
}

#[test]
fn defaults_are_the_originals() {
    let o = probe(&["-addr=h:1"]);
    assert_eq!(o, Options::new("h:1"));
    assert_eq!(o.connect_timeout, Duration::from_secs(1));
    assert_eq!(o.rpc_timeout, Duration::from_secs(1));
    assert_eq!(o.user_agent, "grpc_health_probe");
    assert_eq!(o.service, "");
    assert!(o.tls.is_none() && !o.gzip && !o.verbose && !o.watch && o.headers.is_empty());
}

#[test]
fn every_flag_lands_in_its_field() {
    let o = probe(&[
        "-addr=a:1",
        "-addr",
        "b:2",
        "-service=svc",
        "-connect-timeout=250ms",
        "-rpc-timeout",
        "1m30s",
        "-rpc-header",
        "X-Tenant: blue",
        "-rpc-header=trace-bin:\tabc",
        "-user-agent=probe/2",
        "-tls",
        "-tls-ca-cert=/ca.pem",
        "-tls-client-cert",
        "/c.pem",
        "-tls-client-key=/k.pem",
        "-tls-server-name=api.test",
        "-gzip",
        "-v",
        "-watch",
    ]);
    assert_eq!(o.addrs, ["a:1", "b:2"]);
    assert_eq!(o.service, "svc");
    assert_eq!(o.connect_timeout, Duration::from_millis(250));
    assert_eq!(o.rpc_timeout, Duration::from_secs(90));
    assert_eq!(
        o.headers,
        [
            RpcHeader {
                name: "x-tenant".into(),
                value: "blue".into()
            },
            RpcHeader {
                name: "trace-bin".into(),
                value: "abc".into()
            },
        ]
    );
    assert_eq!(o.user_agent, "probe/2");
    assert_eq!(
        o.tls,
        Some(TlsOptions {
            no_verify: false,
            ca_cert: Some("/ca.pem".into()),
            client_cert: Some("/c.pem".into()),
            client_key: Some("/k.pem".into()),
            server_name: Some("api.test".into()),
        })
    );
    assert!(o.gzip && o.verbose && o.watch);
}

#[test]
fn a_repeated_single_value_flag_keeps_the_last() {
    let o = probe(&[
        "-addr=h:1",
        "-service=a",
        "-service=b",
        "-rpc-timeout=2s",
        "-rpc-timeout=3s",
    ]);
    assert_eq!(o.service, "b");
    assert_eq!(o.rpc_timeout, Duration::from_secs(3));
}

#[test]
fn flag_syntax_errors_read_like_gos() {
    for (args, message) in [
        (&["-nope"][..], "flag provided but not defined: -nope"),
        (
            &["-addr=h:1", "--nope=1"],
            "flag provided but not defined: -nope",
        ),
        (&["-addr"], "flag needs an argument: -addr"),
        (&["---addr=h:1"], "bad flag syntax: ---addr=h:1"),
        (&["-=x"], "bad flag syntax: -=x"),
        (
            &["-addr=h:1", "-rpc-timeout=soon"],
            "invalid value \"soon\" for flag -rpc-timeout: parse error",
        ),
        (
            &["-addr=h:1", "-rpc-header", "no-colon"],
            "invalid value \"no-colon\" for flag -rpc-header: invalid RPC header, \
             expected 'key: value', got \"no-colon\"",
        ),
        (
            &["-addr=h:1", "-rpc-header", "bad key: v"],
            "invalid value \"bad key: v\" for flag -rpc-header: invalid RPC header name \
             \"bad key\"",
        ),
        (
            &["-addr=h:1", "-rpc-header", "k: a\nb"],
            "invalid value \"k: a\\nb\" for flag -rpc-header: invalid RPC header value \
             \"a\\nb\" for \"k\"",
        ),
        (
            &["-addr=h:1", "-user-agent", "a\u{7f}"],
            "invalid value \"a\\u{7f}\" for flag -user-agent: not a valid header value",
        ),
    ] {
        let e = parse_args(args).unwrap_err();
        assert_eq!(e.to_string(), message, "{args:?}");
        assert!(e.shows_usage());
    }
}

#[test]
fn checks_run_in_the_originals_order_with_its_messages() {
    for (args, message) in [
        (&[][..], "-addr not specified"),
        (&["-service=x"], "-addr not specified"),
        (&["-addr="], "-addr not specified"),
        (
            &["-addr=h:1", "-connect-timeout=0"],
            "-connect-timeout must be greater than zero (specified: 0s)",
        ),
        (
            &["-addr=h:1", "-connect-timeout", "-1s"],
            "-connect-timeout must be greater than zero (specified: -1s)",
        ),
        (
            &["-addr=h:1", "-rpc-timeout=0s"],
            "-rpc-timeout must be greater than zero (specified: 0s)",
        ),
        (
            &["-addr=h:1", "-tls-no-verify"],
            "specified -tls-no-verify without specifying -tls",
        ),
        (
            &["-addr=h:1", "-tls-ca-cert=ca.pem"],
            "specified -tls-ca-cert without specifying -tls",
        ),
        (
            &[
                "-addr=h:1",
                "-tls-client-cert=c.pem",
                "-tls-client-key=k.pem",
            ],
            "specified -tls-client-cert without specifying -tls",
        ),
        (
            &["-addr=h:1", "-tls-server-name=x"],
            "specified -tls-server-name without specifying -tls",
        ),
        (
            &["-addr=h:1", "-tls", "-tls-client-cert=c.pem"],
            "specified -tls-client-cert without specifying -tls-client-key",
        ),
        (
            &["-addr=h:1", "-tls", "-tls-client-key=k.pem"],
            "specified -tls-client-key without specifying -tls-client-cert",
        ),
        (
            &["-addr=h:1", "-tls-client-key=k.pem"],
            "specified -tls-client-key without specifying -tls-client-cert",
        ),
        (
            &["-addr=h:1", "-tls", "-tls-no-verify", "-tls-ca-cert=ca.pem"],
            "cannot specify -tls-ca-cert with -tls-no-verify (CA cert would not be used)",
        ),
        (
            &["-addr=h:1", "-tls", "-tls-no-verify", "-tls-server-name=x"],
            "cannot specify -tls-server-name with -tls-no-verify (server name would not be \
             used)",
        ),
    ] {
        let e = parse_args(args).unwrap_err();
        assert_eq!(e.to_string(), format!("error: {message}"), "{args:?}");
        assert!(!e.shows_usage());
    }
}

#[test]
fn version_and_help_need_no_address() {
    assert_eq!(parse_args(["-version"]).unwrap().command, Command::Version);
    assert_eq!(
        parse_args(["--version=true"]).unwrap().command,
        Command::Version
    );
    assert_eq!(parse_args(["-h"]).unwrap().command, Command::Help);
    assert_eq!(parse_args(["--help"]).unwrap().command, Command::Help);
    // -version wins over the checks, as in the original.
    assert_eq!(
        parse_args(["-version", "-rpc-timeout=0"]).unwrap().command,
        Command::Version
    );
}

#[test]
fn double_dash_ends_the_flags() {
    let parsed = parse_args(["-addr=h:1", "--", "-tls"]).unwrap();
    let Command::Probe(o) = parsed.command else {
        panic!()
    };
    assert!(o.tls.is_none());
    assert_eq!(parsed.ignored, ["-tls"]);
    // A lone "-" is a non-flag argument.
    let parsed = parse_args(["-addr=h:1", "-", "-tls"]).unwrap();
    assert_eq!(parsed.ignored, ["-", "-tls"]);
}

#[test]
fn header_parsing_follows_the_original() {
    let h = RpcHeader::parse("Authorization:   Bearer x:y").unwrap();
    assert_eq!(
        (h.name.as_str(), h.value.as_str()),
        ("authorization", "Bearer x:y")
    );
    let h = RpcHeader::parse("k:").unwrap();
    assert_eq!((h.name.as_str(), h.value.as_str()), ("k", ""));
    assert!(RpcHeader::parse(": v").is_err());
    // Binary values may hold anything; they are sent base64-encoded.
    assert!(RpcHeader::parse("blob-bin: \u{1}\u{2}").is_ok());
}

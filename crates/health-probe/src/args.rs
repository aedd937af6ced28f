//! The command line, parsed the way Go's `flag` package parses `grpc_health_probe`'s.
//!
//! Go's rules, which scripts and Kubernetes manifests rely on:
//!
//! * a flag is `-name` or `--name`; a value is `-name=value`, `--name=value`, or the next
//!   argument (`-name value`, even when that argument starts with `-`);
//! * a boolean flag takes no separate value: `-tls`, `-tls=true`, `-tls=false` (`1`, `t`, `T`,
//!   `TRUE`, `true`, `True`, and their false twins);
//! * parsing stops at the first argument that is not a flag (or after `--`); what follows is
//!   ignored by `grpc_health_probe`, and here too (with a warning);
//! * a flag given twice keeps the last value, except `-rpc-header` (repeatable) and, beyond
//!   the original, `-addr`, where every occurrence adds an address.
//!
//! Then the same checks in the same order, with the same messages (`-addr not specified`,
//! `-connect-timeout must be greater than zero (specified: 0s)`, ...).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::duration::GoDuration;

/// What the command line asks for.
// Made once per process: boxing the options would only make matching on it clumsier.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Probe (once, or with `-watch` until interrupted).
    Probe(Options),
    /// `-version`: print the version and exit 0.
    Version,
    /// `-h`, `-help`: print the usage (Go's flag package then exits 1, and so do we).
    Help,
}

/// The probe's settings, validated: at least one address, positive timeouts, consistent TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `-addr` (repeatable here): `host:port`, `:port`, `[v6]:port`, `dns:///host:port` or
    /// `unix:///path`.
    pub addrs: Vec<String>,
    /// `-service`: the service name asked about; `""` (the default) is the whole server.
    pub service: String,
    /// `-connect-timeout` (default 1 s): until the server has spoken HTTP/2.
    pub connect_timeout: Duration,
    /// `-rpc-timeout` (default 1 s): for the health RPC, sent as its deadline too.
    pub rpc_timeout: Duration,
    /// `-rpc-header name: value` (repeatable): metadata sent with the health RPC.
    pub headers: Vec<RpcHeader>,
    /// `-user-agent` (default `grpc_health_probe`); tonic appends its own, as grpc-go does.
    pub user_agent: String,
    /// `-tls` and its options; `None` for plaintext.
    pub tls: Option<TlsOptions>,
    /// `-gzip`: compress the request with gzip and accept a gzip response.
    pub gzip: bool,
    /// `-v`: verbose logs.
    pub verbose: bool,
    /// `-watch` (beyond the original): stream every transition until interrupted.
    pub watch: bool,
}

impl Options {
    /// Defaults for one address, as if `-addr=addr` alone had been given.
    pub fn new(addr: impl Into<String>) -> Self {
        Options {
            addrs: vec![addr.into()],
            service: String::new(),
            connect_timeout: Duration::from_secs(1),
            rpc_timeout: Duration::from_secs(1),
            headers: Vec::new(),
            user_agent: DEFAULT_USER_AGENT.to_owned(),
            tls: None,
            gzip: false,
            verbose: false,
            watch: false,
        }
    }
}

/// The default `-user-agent`, as in the original.
pub const DEFAULT_USER_AGENT: &str = "grpc_health_probe";

/// TLS settings (`-tls` given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// `-tls-no-verify`: accept any server certificate (INSECURE).
    pub no_verify: bool,
    /// `-tls-ca-cert`: PEM file of trusted CA certificates, instead of the system's roots.
    pub ca_cert: Option<PathBuf>,
    /// `-tls-client-cert`: PEM client certificate chain (with `client_key`).
    pub client_cert: Option<PathBuf>,
    /// `-tls-client-key`: PEM private key of the client certificate.
    pub client_key: Option<PathBuf>,
    /// `-tls-server-name`: the name to verify the server certificate against (and send as SNI)
    /// instead of the address's host.
    pub server_name: Option<String>,
}

/// One `-rpc-header`, as `name: value`. The name is lowercased (gRPC metadata keys are); a
/// name ending in `-bin` carries the value's bytes (sent base64-encoded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcHeader {
    /// The metadata key, lowercase.
    pub name: String,
    /// The value, with leading whitespace removed.
    pub value: String,
}

impl RpcHeader {
    /// Parses `name: value` as Go's `grpc_health_probe` does: split at the first `:`, trim
    /// the value's leading whitespace; then checks that the name and value can be sent.
    pub fn parse(text: &str) -> Result<Self, String> {
        let Some((name, value)) = text.split_once(':') else {
            return Err(format!(
                "invalid RPC header, expected 'key: value', got {text:?}"
            ));
        };
        let name = name.to_ascii_lowercase();
        let value = value.trim_start().to_owned();
        if name.ends_with("-bin") {
            tonic::metadata::BinaryMetadataKey::from_bytes(name.as_bytes())
                .map_err(|_| format!("invalid RPC header name {name:?}"))?;
        } else {
            tonic::metadata::AsciiMetadataKey::from_bytes(name.as_bytes())
                .map_err(|_| format!("invalid RPC header name {name:?}"))?;
            tonic::metadata::AsciiMetadataValue::try_from(value.as_str())
                .map_err(|_| format!("invalid RPC header value {value:?} for {name:?}"))?;
        }
        Ok(RpcHeader { name, value })
    }
}

/// A command line that cannot work. Displays as the message `grpc_health_probe` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgsError {
    message: String,
    usage: bool,
}

impl ArgsError {
    /// A flag-syntax error (Go's flag package prints the usage after it).
    fn syntax(message: String) -> Self {
        ArgsError {
            message,
            usage: true,
        }
    }

    /// A failed check after parsing (printed as `error: ...`, no usage).
    fn check(message: String) -> Self {
        ArgsError {
            message: format!("error: {message}"),
            usage: false,
        }
    }

    /// A failure found while preparing the probe, printed as it is (e.g. the original's
    /// `failed to initialize tls credentials. error=...`).
    pub(crate) fn plain(message: String) -> Self {
        ArgsError {
            message,
            usage: false,
        }
    }

    /// Whether the usage should follow the message (flag-syntax errors, as in Go).
    pub fn shows_usage(&self) -> bool {
        self.usage
    }
}

impl fmt::Display for ArgsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ArgsError {}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Flag {
    Addr,
    Service,
    UserAgent,
    ConnectTimeout,
    RpcTimeout,
    RpcHeader,
    Tls,
    TlsNoVerify,
    TlsCaCert,
    TlsClientCert,
    TlsClientKey,
    TlsServerName,
    Gzip,
    Verbose,
    Version,
    Watch,
}

impl Flag {
    fn lookup(name: &str) -> Option<Flag> {
        Some(match name {
            "addr" => Flag::Addr,
            "service" => Flag::Service,
            "user-agent" => Flag::UserAgent,
            "connect-timeout" => Flag::ConnectTimeout,
            "rpc-timeout" => Flag::RpcTimeout,
            "rpc-header" => Flag::RpcHeader,
            "tls" => Flag::Tls,
            "tls-no-verify" => Flag::TlsNoVerify,
            "tls-ca-cert" => Flag::TlsCaCert,
            "tls-client-cert" => Flag::TlsClientCert,
            "tls-client-key" => Flag::TlsClientKey,
            "tls-server-name" => Flag::TlsServerName,
            "gzip" => Flag::Gzip,
            "v" => Flag::Verbose,
            "version" => Flag::Version,
            "watch" => Flag::Watch,
            _ => return None,
        })
    }

    fn is_bool(self) -> bool {
        matches!(
            self,
            Flag::Tls
                | Flag::TlsNoVerify
                | Flag::Gzip
                | Flag::Verbose
                | Flag::Version
                | Flag::Watch
        )
    }
}

/// Go's `strconv.ParseBool`.
fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Everything as given, before the checks.
struct Raw {
    addrs: Vec<String>,
    service: String,
    user_agent: String,
    connect_timeout: GoDuration,
    rpc_timeout: GoDuration,
    headers: Vec<RpcHeader>,
    tls: bool,
    no_verify: bool,
    ca_cert: String,
    client_cert: String,
    client_key: String,
    server_name: String,
    gzip: bool,
    verbose: bool,
    version: bool,
    watch: bool,
}

impl Default for Raw {
    fn default() -> Self {
        let one_second = GoDuration::from_std(Duration::from_secs(1));
        Raw {
            addrs: Vec::new(),
            service: String::new(),
            user_agent: DEFAULT_USER_AGENT.to_owned(),
            connect_timeout: one_second,
            rpc_timeout: one_second,
            headers: Vec::new(),
            tls: false,
            no_verify: false,
            ca_cert: String::new(),
            client_cert: String::new(),
            client_key: String::new(),
            server_name: String::new(),
            gzip: false,
            verbose: false,
            version: false,
            watch: false,
        }
    }
}

impl Raw {
    fn set_bool(&mut self, flag: Flag, value: bool) {
        match flag {
            Flag::Tls => self.tls = value,
            Flag::TlsNoVerify => self.no_verify = value,
            Flag::Gzip => self.gzip = value,
            Flag::Verbose => self.verbose = value,
            Flag::Version => self.version = value,
            Flag::Watch => self.watch = value,
            _ => unreachable!("not a boolean flag"),
        }
    }

    /// Go's `flag.Value.Set`: the error is the part after `invalid value "..." for flag -x: `.
    fn set_value(&mut self, flag: Flag, value: &str) -> Result<(), String> {
        match flag {
            Flag::Addr => {
                if !value.is_empty() {
                    self.addrs.push(value.to_owned());
                }
            }
            Flag::Service => self.service = value.to_owned(),
            Flag::UserAgent => {
                http::HeaderValue::from_str(value)
                    .map_err(|_| "not a valid header value".to_owned())?;
                self.user_agent = value.to_owned();
            }
            Flag::ConnectTimeout => {
                self.connect_timeout = GoDuration::parse(value).map_err(|e| e.to_string())?
            }
            Flag::RpcTimeout => {
                self.rpc_timeout = GoDuration::parse(value).map_err(|e| e.to_string())?
            }
            Flag::RpcHeader => self.headers.push(RpcHeader::parse(value)?),
            Flag::TlsCaCert => self.ca_cert = value.to_owned(),
            Flag::TlsClientCert => self.client_cert = value.to_owned(),
            Flag::TlsClientKey => self.client_key = value.to_owned(),
            Flag::TlsServerName => self.server_name = value.to_owned(),
            _ => unreachable!("a boolean flag"),
        }
        Ok(())
    }
}

/// The parsed command line plus what Go would have ignored after the flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// What to do.
    pub command: Command,
    /// Arguments after the flags (from the first non-flag, or after `--`), ignored as
    /// `grpc_health_probe` ignores them.
    pub ignored: Vec<String>,
}

/// Parses the arguments (without the program name) as `grpc_health_probe` does, then checks
/// them in the original's order.
///
/// ```
/// use std::time::Duration;
/// use health_probe::{Command, parse_args};
///
/// let parsed = parse_args(["-addr=localhost:5000", "--rpc-timeout", "250ms", "-tls"]).unwrap();
/// let Command::Probe(options) = parsed.command else { unreachable!() };
/// assert_eq!(options.addrs, ["localhost:5000"]);
/// assert_eq!(options.rpc_timeout, Duration::from_millis(250));
/// assert!(options.tls.is_some());
///
/// let error = parse_args(["-addr", "localhost:5000", "-connect-timeout=0"]).unwrap_err();
/// assert_eq!(
///     error.to_string(),
///     "error: -connect-timeout must be greater than zero (specified: 0s)",
/// );
/// ```
pub fn parse_args<I, S>(args: I) -> Result<Parsed, ArgsError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let args: Vec<String> = args.into_iter().map(|s| s.as_ref().to_owned()).collect();
    let mut raw = Raw::default();
    let mut i = 0;
    let mut ignored = Vec::new();
    while i < args.len() {
        let arg = &args[i];
        if arg.len() < 2 || !arg.starts_with('-') {
            ignored = args[i..].to_vec();
            break;
        }
        let mut name = &arg[1..];
        if let Some(rest) = name.strip_prefix('-') {
            if rest.is_empty() {
                // "--" ends the flags and is consumed.
                ignored = args[i + 1..].to_vec();
                break;
            }
            name = rest;
        }
        if name.is_empty() || name.starts_with('-') || name.starts_with('=') {
            return Err(ArgsError::syntax(format!("bad flag syntax: {arg}")));
        }
        let (name, inline_value) = match name.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (name, None),
        };
        let Some(flag) = Flag::lookup(name) else {
            if name == "h" || name == "help" {
                return Ok(Parsed {
                    command: Command::Help,
                    ignored,
                });
            }
            return Err(ArgsError::syntax(format!(
                "flag provided but not defined: -{name}"
            )));
        };
        i += 1;
        if flag.is_bool() {
            let value = match inline_value {
                None => true,
                Some(text) => parse_bool(text).ok_or_else(|| {
                    ArgsError::syntax(format!(
                        "invalid boolean value {text:?} for -{name}: parse error"
                    ))
                })?,
            };
            raw.set_bool(flag, value);
        } else {
            let value = match inline_value {
                Some(v) => v.to_owned(),
                None => {
                    let Some(next) = args.get(i) else {
                        return Err(ArgsError::syntax(format!(
                            "flag needs an argument: -{name}"
                        )));
                    };
                    i += 1;
                    next.clone()
                }
            };
            raw.set_value(flag, &value).map_err(|reason| {
                ArgsError::syntax(format!(
                    "invalid value {value:?} for flag -{name}: {reason}"
                ))
            })?;
        }
    }
    let command = check(raw)?;
    Ok(Parsed { command, ignored })
}

/// The original's checks, in its order, then ours.
fn check(raw: Raw) -> Result<Command, ArgsError> {
    if raw.version {
        return Ok(Command::Version);
    }
    let fail = |message: &str| Err(ArgsError::check(message.to_owned()));
    if raw.addrs.is_empty() {
        return fail("-addr not specified");
    }
    let Some(connect_timeout) = raw.connect_timeout.positive() else {
        return fail(&format!(
            "-connect-timeout must be greater than zero (specified: {})",
            raw.connect_timeout
        ));
    };
    let Some(rpc_timeout) = raw.rpc_timeout.positive() else {
        return fail(&format!(
            "-rpc-timeout must be greater than zero (specified: {})",
            raw.rpc_timeout
        ));
    };
    let given = |s: &str| !s.is_empty();
    if !raw.tls && raw.no_verify {
        return fail("specified -tls-no-verify without specifying -tls");
    }
    if !raw.tls && given(&raw.ca_cert) {
        return fail("specified -tls-ca-cert without specifying -tls");
    }
    if !raw.tls && given(&raw.client_cert) {
        return fail("specified -tls-client-cert without specifying -tls");
    }
    if !raw.tls && given(&raw.server_name) {
        return fail("specified -tls-server-name without specifying -tls");
    }
    if given(&raw.client_cert) && !given(&raw.client_key) {
        return fail("specified -tls-client-cert without specifying -tls-client-key");
    }
    if !given(&raw.client_cert) && given(&raw.client_key) {
        return fail("specified -tls-client-key without specifying -tls-client-cert");
    }
    if raw.no_verify && given(&raw.ca_cert) {
        return fail("cannot specify -tls-ca-cert with -tls-no-verify (CA cert would not be used)");
    }
    if raw.no_verify && given(&raw.server_name) {
        return fail(
            "cannot specify -tls-server-name with -tls-no-verify (server name would not be used)",
        );
    }
    let path = |s: String| (!s.is_empty()).then(|| PathBuf::from(s));
    let tls = raw.tls.then(|| TlsOptions {
        no_verify: raw.no_verify,
        ca_cert: path(raw.ca_cert),
        client_cert: path(raw.client_cert),
        client_key: path(raw.client_key),
        server_name: (!raw.server_name.is_empty()).then_some(raw.server_name),
    });
    Ok(Command::Probe(Options {
        addrs: raw.addrs,
        service: raw.service,
        connect_timeout,
        rpc_timeout,
        headers: raw.headers,
        user_agent: raw.user_agent,
        tls,
        gzip: raw.gzip,
        verbose: raw.verbose,
        watch: raw.watch,
    }))
}

/// The usage text (Go's `PrintDefaults` layout), printed on stderr after a flag error and for
/// `-h`.
pub fn usage() -> &'static str {
    "Usage:
  -addr string
    \t(required) tcp host:port to connect; repeat to check several addresses at once
  -connect-timeout duration
    \ttimeout for establishing connection (default 1s)
  -gzip
    \tuse GZIPCompressor for requests and GZIPDecompressor for response (default: false)
  -rpc-header value
    \tadditional RPC headers in 'name: value' format. May specify more than one via multiple flags.
  -rpc-timeout duration
    \ttimeout for health check rpc (default 1s)
  -service string
    \tservice name to check (default: \"\")
  -tls
    \tuse TLS (default: false, INSECURE plaintext transport)
  -tls-ca-cert string
    \t(with -tls, optional) file containing trusted certificates for verifying server
  -tls-client-cert string
    \t(with -tls, optional) client certificate for authenticating to the server (requires -tls-client-key)
  -tls-client-key string
    \t(with -tls) client private key for authenticating to the server (requires -tls-client-cert)
  -tls-no-verify
    \t(with -tls) don't verify the certificate (INSECURE) presented by the server (default: false)
  -tls-server-name string
    \t(with -tls) override the hostname used to verify the server certificate
  -user-agent string
    \tuser-agent header value of health check requests (default \"grpc_health_probe\")
  -v\tverbose logs
  -version
    \tprint the probe version and exit
  -watch
    \tkeep watching and print every status change with a timestamp until interrupted;
    \tthe exit code is then that of the last status
"
}

#[cfg(test)]
mod tests {
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
}

//! What a command line says, once parsed and checked: the probe's [`Options`], or why it
//! cannot work ([`ArgsError`]).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

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
    pub(super) fn syntax(message: String) -> Self {
        ArgsError {
            message,
            usage: true,
        }
    }

    /// A failed check after parsing (printed as `error: ...`, no usage).
    pub(super) fn check(message: String) -> Self {
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

/// The parsed command line plus what Go would have ignored after the flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// What to do.
    pub command: Command,
    /// Arguments after the flags (from the first non-flag, or after `--`), ignored as
    /// `grpc_health_probe` ignores them.
    pub ignored: Vec<String>,
}

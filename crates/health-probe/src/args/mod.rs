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
//!
//! The parts: what a command line says (`options`), Go's flag syntax (`flags`), the
//! original's checks (`check`).

mod check;
mod flags;
mod options;
#[cfg(test)]
mod tests;

pub use options::{ArgsError, Command, DEFAULT_USER_AGENT, Options, Parsed, RpcHeader, TlsOptions};

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
    let (raw, ignored) = flags::read(args)?;
    let command = if raw.help {
        Command::Help
    } else {
        check::check(raw)?
    };
    Ok(Parsed { command, ignored })
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

//! Go's `flag` syntax: which arguments are flags, which take a value, and what each sets.

use std::time::Duration;

use super::options::{ArgsError, DEFAULT_USER_AGENT, RpcHeader};
use crate::duration::GoDuration;

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
pub(super) struct Raw {
    pub(super) addrs: Vec<String>,
    pub(super) service: String,
    pub(super) user_agent: String,
    pub(super) connect_timeout: GoDuration,
    pub(super) rpc_timeout: GoDuration,
    pub(super) headers: Vec<RpcHeader>,
    pub(super) tls: bool,
    pub(super) no_verify: bool,
    pub(super) ca_cert: String,
    pub(super) client_cert: String,
    pub(super) client_key: String,
    pub(super) server_name: String,
    pub(super) gzip: bool,
    pub(super) verbose: bool,
    pub(super) version: bool,
    pub(super) watch: bool,
    /// `-h` or `-help` (Go's flag package then prints the usage; nothing after it is read).
    pub(super) help: bool,
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
            help: false,
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

/// Reads the arguments (without the program name) as Go's `flag` package does: stops at the
/// first one that is not a flag (or after `--`), and returns the flags with the rest, which is
/// ignored; or at `-h`.
pub(super) fn read(args: Vec<String>) -> Result<(Raw, Vec<String>), ArgsError> {
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
                raw.help = true;
                return Ok((raw, ignored));
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
    Ok((raw, ignored))
}

//! `-addr` values: what to connect to.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// One `-addr`, parsed: a TCP `host:port` or a Unix socket path.
///
/// Accepted as grpc-go accepts them for `grpc_health_probe`: `host:port`, `:port` (this
/// machine), `[::1]:port`, the same behind `dns:///` or `passthrough:///`, and
/// `unix:///abs/path`, `unix:/abs/path` or `unix:rel/path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    given: Arc<str>,
    kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

impl Target {
    /// Parses an `-addr` value.
    pub fn parse(addr: &str) -> Result<Target, InvalidAddress> {
        let invalid = |reason: &'static str| InvalidAddress {
            addr: addr.to_owned(),
            reason,
        };
        let kind = if let Some(path) = addr.strip_prefix("unix:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(invalid("no socket path after unix:"));
            }
            Kind::Unix(PathBuf::from(path))
        } else {
            let hostport = addr
                .strip_prefix("dns:///")
                .or_else(|| addr.strip_prefix("passthrough:///"))
                .unwrap_or(addr);
            let Some((host, port)) = hostport.rsplit_once(':') else {
                return Err(invalid("missing port in address"));
            };
            let host = if let Some(inner) = host.strip_prefix('[') {
                inner
                    .strip_suffix(']')
                    .ok_or_else(|| invalid("missing ']' in address"))?
            } else if host.contains(['/', '[', ']', '@', ' ']) {
                return Err(invalid("not a host name or IP address"));
            } else if host.contains(':') {
                return Err(invalid("too many colons in address"));
            } else {
                host
            };
            let port: u16 = port.parse().map_err(|_| invalid("invalid port"))?;
            let host = if host.is_empty() { "localhost" } else { host };
            Kind::Tcp {
                host: host.to_owned(),
                port,
            }
        };
        Ok(Target {
            given: addr.into(),
            kind,
        })
    }

    /// The address as given on the command line.
    pub fn as_str(&self) -> &str {
        &self.given
    }

    pub(crate) fn kind(&self) -> &Kind {
        &self.kind
    }

    /// `host:port` for a URI (IPv6 in brackets); `localhost` for a Unix socket.
    pub(crate) fn authority(&self) -> String {
        match &self.kind {
            Kind::Tcp { host, port } if host.contains(':') => format!("[{host}]:{port}"),
            Kind::Tcp { host, port } => format!("{host}:{port}"),
            Kind::Unix(_) => "localhost".to_owned(),
        }
    }

    /// The name a server certificate is checked against when `-tls-server-name` is not given.
    pub(crate) fn host(&self) -> &str {
        match &self.kind {
            Kind::Tcp { host, .. } => host,
            Kind::Unix(_) => "localhost",
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.given)
    }
}

/// An `-addr` that names nothing to connect to. A connection failure (exit code 2), as with
/// the original, where the dial fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidAddress {
    addr: String,
    reason: &'static str,
}

impl fmt::Display for InvalidAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid address {:?}: {}", self.addr, self.reason)
    }
}

impl std::error::Error for InvalidAddress {}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(addr: &str) -> (String, u16) {
        match Target::parse(addr).unwrap().kind {
            Kind::Tcp { host, port } => (host, port),
            other => panic!("{addr}: {other:?}"),
        }
    }

    #[test]
    fn parses_the_forms_grpc_go_dials() {
        assert_eq!(tcp("localhost:5000"), ("localhost".into(), 5000));
        assert_eq!(tcp("10.0.0.7:50051"), ("10.0.0.7".into(), 50051));
        assert_eq!(tcp(":5000"), ("localhost".into(), 5000));
        assert_eq!(tcp("[::1]:5000"), ("::1".into(), 5000));
        assert_eq!(tcp("dns:///svc.ns.svc:80"), ("svc.ns.svc".into(), 80));
        assert_eq!(tcp("passthrough:///h:1"), ("h".into(), 1));
        for (addr, path) in [
            ("unix:///run/app.sock", "/run/app.sock"),
            ("unix:/run/app.sock", "/run/app.sock"),
            ("unix:app.sock", "app.sock"),
        ] {
            assert_eq!(
                Target::parse(addr).unwrap().kind,
                Kind::Unix(PathBuf::from(path))
            );
        }
    }

    #[test]
    fn authority_and_host() {
        let t = Target::parse("[::1]:5000").unwrap();
        assert_eq!(t.authority(), "[::1]:5000");
        assert_eq!(t.host(), "::1");
        assert_eq!(t.as_str(), "[::1]:5000");
        let t = Target::parse(":7").unwrap();
        assert_eq!(t.authority(), "localhost:7");
        assert_eq!(Target::parse("unix:/s").unwrap().authority(), "localhost");
    }

    #[test]
    fn rejects_what_cannot_be_dialled() {
        for (addr, reason) in [
            ("localhost", "missing port in address"),
            ("::1:5000", "too many colons in address"),
            ("[::1:5000", "missing ']' in address"),
            ("h:http", "invalid port"),
            ("h:70000", "invalid port"),
            ("h:", "invalid port"),
            ("http://h:1", "not a host name or IP address"),
            ("unix:", "no socket path after unix:"),
        ] {
            let e = Target::parse(addr).unwrap_err();
            assert_eq!(e.reason, reason, "{addr}");
            assert_eq!(e.to_string(), format!("invalid address {addr:?}: {reason}"));
        }
    }
}

//! What a probe concluded, in the original's words and exit codes.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use endpoint_state::error::error_chain as chain;
use health_layer::probe::{ProbeError, ProbeFailure, ServingStatus, status_text};
use tonic::{Code, Status};

use crate::duration::GoDuration;
use crate::output::escape_control;

/// What a probe of one address concluded, as `grpc_health_probe`'s exit codes say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Exit code 0: the answer was `SERVING`.
    Serving,
    /// Exit code 1: the command line (or the TLS files it names) cannot work.
    InvalidArguments,
    /// Exit code 2: no connection within `-connect-timeout` (refused, unreachable, TLS
    /// handshake failed, or the server never spoke HTTP/2).
    ConnectionFailure,
    /// Exit code 3: connected, but the health RPC failed (`UNIMPLEMENTED`, `NOT_FOUND` for an
    /// unknown service, no answer within `-rpc-timeout`, ...).
    RpcFailure,
    /// Exit code 4: the server answered, and not `SERVING`.
    NotServing,
}

impl Outcome {
    /// The process exit code.
    pub fn code(self) -> u8 {
        match self {
            Outcome::Serving => 0,
            Outcome::InvalidArguments => 1,
            Outcome::ConnectionFailure => 2,
            Outcome::RpcFailure => 3,
            Outcome::NotServing => 4,
        }
    }

    /// How bad it is, for [`worst`](Self::worst): serving < not serving < RPC failure <
    /// connection failure < bad arguments. An address that cannot even be reached is worse
    /// than one that answers badly, which is worse than one that answers "not serving".
    fn severity(self) -> u8 {
        match self {
            Outcome::Serving => 0,
            Outcome::NotServing => 1,
            Outcome::RpcFailure => 2,
            Outcome::ConnectionFailure => 3,
            Outcome::InvalidArguments => 4,
        }
    }

    /// The worst of several outcomes ([`Serving`](Self::Serving) for none): the exit code of
    /// a probe of several addresses.
    pub fn worst(outcomes: impl IntoIterator<Item = Outcome>) -> Outcome {
        outcomes
            .into_iter()
            .max_by_key(|o| o.severity())
            .unwrap_or(Outcome::Serving)
    }

    pub(crate) fn from_code(code: u8) -> Option<Outcome> {
        Some(match code {
            0 => Outcome::Serving,
            1 => Outcome::InvalidArguments,
            2 => Outcome::ConnectionFailure,
            3 => Outcome::RpcFailure,
            4 => Outcome::NotServing,
            _ => return None,
        })
    }
}

impl From<Outcome> for std::process::ExitCode {
    fn from(outcome: Outcome) -> Self {
        std::process::ExitCode::from(outcome.code())
    }
}

/// The result of probing one address.
#[derive(Debug)]
pub struct Report {
    address: String,
    result: Result<ServingStatus, ProbeError>,
    connect_time: Option<Duration>,
    rpc_time: Option<Duration>,
    rpc_timeout: Duration,
}

impl Report {
    pub(crate) fn new(
        address: &str,
        result: Result<ServingStatus, ProbeError>,
        connect_time: Option<Duration>,
        rpc_time: Option<Duration>,
        rpc_timeout: Duration,
    ) -> Self {
        Report {
            address: address.to_owned(),
            result,
            connect_time,
            rpc_time,
            rpc_timeout,
        }
    }

    /// The address as given.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// What the server answered, or why there was no answer. [`ProbeError::is_connect`]
    /// tells a connection failure from an RPC failure.
    pub fn result(&self) -> &Result<ServingStatus, ProbeError> {
        &self.result
    }

    /// How long connecting took (until the server's HTTP/2 preface), when it succeeded.
    pub fn connect_time(&self) -> Option<Duration> {
        self.connect_time
    }

    /// How long the health RPC took, when it succeeded.
    pub fn rpc_time(&self) -> Option<Duration> {
        self.rpc_time
    }

    /// The exit code's meaning.
    pub fn outcome(&self) -> Outcome {
        match &self.result {
            Ok(ServingStatus::Serving) => Outcome::Serving,
            Ok(_) => Outcome::NotServing,
            Err(e) if e.is_connect() => Outcome::ConnectionFailure,
            Err(_) => Outcome::RpcFailure,
        }
    }

    /// The line `grpc_health_probe` prints for this result (on stderr): `status: SERVING`,
    /// `service unhealthy (responded with "NOT_SERVING")`,
    /// `timeout: failed to connect service "h:1" within 1s`, ... The server's text in it (a
    /// status message, an error) has its control characters escaped (`\n`, `\u{1b}`): one
    /// line, that cannot drive the terminal.
    pub fn message(&self) -> String {
        let message = self.raw_message();
        match escape_control(&message) {
            Cow::Borrowed(_) => message,
            Cow::Owned(escaped) => escaped,
        }
    }

    fn raw_message(&self) -> String {
        match &self.result {
            Ok(ServingStatus::Serving) => "status: SERVING".to_owned(),
            Ok(other) => format!(
                "service unhealthy (responded with {:?})",
                other.as_str_name()
            ),
            Err(e) => failure_message(&self.address, e, self.rpc_timeout),
        }
    }
}

fn failure_message(address: &str, e: &ProbeError, rpc_timeout: Duration) -> String {
    match e.failure() {
        ProbeFailure::Connect {
            timed_out: Some(limit),
            ..
        } => format!(
            "timeout: failed to connect service {address:?} within {}",
            GoDuration::from_std(*limit)
        ),
        ProbeFailure::Connect {
            source: Some(source),
            ..
        } => format!(
            "error: failed to connect service at {address:?}: {}",
            chain(&**source)
        ),
        ProbeFailure::Connect { .. } => {
            format!("error: failed to connect service at {address:?}")
        }
        ProbeFailure::Rpc { status, .. } => rpc_message(status, rpc_timeout),
        ProbeFailure::TimedOut { .. } => format!(
            "timeout: health rpc did not complete within {}",
            GoDuration::from_std(rpc_timeout)
        ),
        _ => format!("error: health rpc failed: {}", e.reason()),
    }
}

fn rpc_message(status: &Status, rpc_timeout: Duration) -> String {
    match status.code() {
        Code::Unimplemented => format!(
            "error: this server does not implement the grpc health protocol \
             (grpc.health.v1.Health): {}",
            status.message()
        ),
        Code::DeadlineExceeded => format!(
            "timeout: health rpc did not complete within {}",
            GoDuration::from_std(rpc_timeout)
        ),
        // grpc-go's status error text.
        code => format!(
            "error: health rpc failed: rpc error: code = {code:?} desc = {}",
            status_text(status)
        ),
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Outcome::Serving => "serving",
            Outcome::InvalidArguments => "invalid arguments",
            Outcome::ConnectionFailure => "connection failure",
            Outcome::RpcFailure => "rpc failure",
            Outcome::NotServing => "not serving",
        };
        write!(f, "{text} (exit code {})", self.code())
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;

    #[test]
    fn the_worst_outcome_wins() {
        use Outcome::*;
        assert_eq!(Outcome::worst([]), Serving);
        assert_eq!(Outcome::worst([Serving, Serving]), Serving);
        assert_eq!(Outcome::worst([Serving, NotServing]), NotServing);
        assert_eq!(
            Outcome::worst([NotServing, RpcFailure, Serving]),
            RpcFailure
        );
        assert_eq!(
            Outcome::worst([RpcFailure, ConnectionFailure, NotServing]),
            ConnectionFailure
        );
        for o in [
            Serving,
            InvalidArguments,
            ConnectionFailure,
            RpcFailure,
            NotServing,
        ] {
            assert_eq!(Outcome::from_code(o.code()), Some(o));
        }
        assert_eq!(Outcome::from_code(5), None);
    }

    fn report(result: Result<ServingStatus, ProbeError>) -> Report {
        Report::new("h:1", result, None, None, Duration::from_millis(250))
    }

    fn rpc(status: Status) -> Result<ServingStatus, ProbeError> {
        Err(ProbeError::new(
            "h:1",
            ProbeFailure::Rpc {
                service: "".into(),
                status,
            },
        ))
    }

    #[test]
    fn messages_are_the_originals() {
        for (result, outcome, message) in [
            (
                Ok(ServingStatus::Serving),
                Outcome::Serving,
                "status: SERVING".to_owned(),
            ),
            (
                Ok(ServingStatus::NotServing),
                Outcome::NotServing,
                "service unhealthy (responded with \"NOT_SERVING\")".to_owned(),
            ),
            (
                Ok(ServingStatus::Unknown),
                Outcome::NotServing,
                "service unhealthy (responded with \"UNKNOWN\")".to_owned(),
            ),
            (
                Err(ProbeError::new(
                    "h:1",
                    ProbeFailure::Connect {
                        timed_out: Some(Duration::from_millis(1_500)),
                        source: None,
                    },
                )),
                Outcome::ConnectionFailure,
                "timeout: failed to connect service \"h:1\" within 1.5s".to_owned(),
            ),
            (
                Err(ProbeError::new(
                    "h:1",
                    ProbeFailure::Connect {
                        timed_out: None,
                        source: Some("dial tcp h:1: refused".into()),
                    },
                )),
                Outcome::ConnectionFailure,
                "error: failed to connect service at \"h:1\": dial tcp h:1: refused".to_owned(),
            ),
            (
                rpc(Status::unimplemented("no health")),
                Outcome::RpcFailure,
                "error: this server does not implement the grpc health protocol \
                 (grpc.health.v1.Health): no health"
                    .to_owned(),
            ),
            (
                rpc(Status::deadline_exceeded("late")),
                Outcome::RpcFailure,
                "timeout: health rpc did not complete within 250ms".to_owned(),
            ),
            (
                rpc(Status::not_found("unknown service")),
                Outcome::RpcFailure,
                "error: health rpc failed: rpc error: code = NotFound desc = unknown service"
                    .to_owned(),
            ),
        ] {
            let r = report(result);
            assert_eq!(r.outcome(), outcome);
            assert_eq!(r.message(), message);
        }
    }

    #[test]
    fn server_text_is_printed_with_its_control_characters_escaped() {
        // A server (or a proxy) chooses its status message: it must not move the cursor,
        // clear the screen, recolour the terminal or forge a second line.
        let hostile = "no\x1b[2J\x1b[31mpe\r\nstatus: SERVING\u{7}\u{202e}";
        for result in [
            rpc(Status::not_found(hostile)),
            rpc(Status::unimplemented(hostile)),
            Err(ProbeError::new(
                "h:1",
                ProbeFailure::Connect {
                    timed_out: None,
                    source: Some(hostile.into()),
                },
            )),
        ] {
            let message = report(result).message();
            assert!(
                !message.chars().any(|c| c.is_control() || c == '\u{202e}'),
                "{message:?}"
            );
            assert!(
                message.contains(r"no\u{1b}[2J\u{1b}[31mpe\r\nstatus"),
                "{message}"
            );
        }
    }

    #[test]
    fn chain_does_not_repeat_itself() {
        let plain = Wrapper("dial", std::io::Error::other("refused"));
        assert_eq!(chain(&plain), "dial: refused");
        let repeats = Wrapper("dial: refused", std::io::Error::other("refused"));
        assert_eq!(chain(&repeats), "dial: refused");
    }

    #[derive(Debug)]
    struct Wrapper(&'static str, std::io::Error);
    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }
    impl Error for Wrapper {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.1)
        }
    }
}

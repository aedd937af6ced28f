//! One look at one address: connect, ask `grpc.health.v1.Health/Check`, say what was seen in
//! the original's words, with its exit code.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use health_layer::probe::{ProbeError, ProbeFailure, ServingStatus};
use http::HeaderValue;
use tokio::time::Instant;
use tonic::codec::CompressionEncoding;
use tonic::metadata::{
    AsciiMetadataKey, AsciiMetadataValue, BinaryMetadataKey, BinaryMetadataValue, MetadataMap,
};
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::args::{ArgsError, Options};
use crate::connect::{self, Dialer};
use crate::duration::GoDuration;
use crate::output::Log;
use crate::target::Target;
use crate::tls::TlsSetup;

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
    /// `timeout: failed to connect service "h:1" within 1s`, ...
    pub fn message(&self) -> String {
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
        code => {
            let mut desc = status.message().to_owned();
            if let Some(source) = status.source() {
                let more = chain(source);
                if !desc.ends_with(&more) {
                    if !desc.is_empty() {
                        desc.push_str(": ");
                    }
                    desc.push_str(&more);
                }
            }
            // grpc-go's status error text.
            format!("error: health rpc failed: rpc error: code = {code:?} desc = {desc}")
        }
    }
}

pub(crate) use endpoint_state::error_chain as chain;

/// Everything a probe needs, built once from the options.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) dialer: Dialer,
    pub(crate) metadata: MetadataMap,
    pub(crate) service: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) rpc_timeout: Duration,
    pub(crate) gzip: bool,
}

impl Prepared {
    pub(crate) fn new(options: &Options) -> Result<Self, ArgsError> {
        let tls = options
            .tls
            .as_ref()
            .map(TlsSetup::new)
            .transpose()
            .map_err(|e| ArgsError::plain(e.to_string()))?;
        let user_agent = if options.user_agent.is_empty() {
            None
        } else {
            Some(HeaderValue::from_str(&options.user_agent).map_err(|_| {
                ArgsError::plain(format!(
                    "error: invalid -user-agent {:?}",
                    options.user_agent
                ))
            })?)
        };
        let mut metadata = MetadataMap::new();
        for h in &options.headers {
            let bad = || ArgsError::plain(format!("error: invalid RPC header {h:?}"));
            if h.name.ends_with("-bin") {
                let key = BinaryMetadataKey::from_bytes(h.name.as_bytes()).map_err(|_| bad())?;
                metadata.append_bin(key, BinaryMetadataValue::from_bytes(h.value.as_bytes()));
            } else {
                let key = AsciiMetadataKey::from_bytes(h.name.as_bytes()).map_err(|_| bad())?;
                let value = AsciiMetadataValue::try_from(h.value.as_str()).map_err(|_| bad())?;
                metadata.append(key, value);
            }
        }
        Ok(Prepared {
            dialer: Dialer { tls, user_agent },
            metadata,
            service: options.service.clone(),
            connect_timeout: options.connect_timeout,
            rpc_timeout: options.rpc_timeout,
            gzip: options.gzip,
        })
    }

    /// A health request about the service, with the `-rpc-header` metadata.
    pub(crate) fn request(&self) -> tonic::Request<HealthCheckRequest> {
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: self.service.clone(),
        });
        *request.metadata_mut() = self.metadata.clone();
        request
    }

    /// A health client on `channel`, compressing with gzip under `-gzip`.
    pub(crate) fn client(&self, channel: Channel) -> HealthClient<Channel> {
        let client = HealthClient::new(channel);
        if self.gzip {
            client
                .send_compressed(CompressionEncoding::Gzip)
                .accept_compressed(CompressionEncoding::Gzip)
        } else {
            client
        }
    }

    pub(crate) fn rpc_error(&self, target: &str, status: Status) -> ProbeError {
        ProbeError::new(
            target,
            ProbeFailure::Rpc {
                service: self.service.as_str().into(),
                status,
            },
        )
    }

    /// One `Check` on `channel`.
    ///
    /// Without `-gzip` this is health-layer's [`check_on`](health_layer::probe::check_on).
    /// With it, the same call on a client that compresses, which `check_on` (it builds its
    /// own client) cannot do.
    pub(crate) async fn check(
        &self,
        channel: Channel,
        target: &str,
    ) -> Result<ServingStatus, ProbeError> {
        let mut request = self.request();
        if !self.gzip {
            return health_layer::probe::check_on(channel, target, request, self.rpc_timeout).await;
        }
        request.set_timeout(self.rpc_timeout);
        let mut client = self.client(channel);
        match tokio::time::timeout(self.rpc_timeout, client.check(request)).await {
            Ok(Ok(answer)) => {
                Ok(ServingStatus::try_from(answer.get_ref().status)
                    .unwrap_or(ServingStatus::Unknown))
            }
            Ok(Err(status)) => Err(self.rpc_error(target, local_timeout_is_deadline(status))),
            Err(_) => Err(self.rpc_error(target, Status::deadline_exceeded("no answer in time"))),
        }
    }

    fn report(
        &self,
        address: &str,
        result: Result<ServingStatus, ProbeError>,
        connect_time: Option<Duration>,
        rpc_time: Option<Duration>,
    ) -> Report {
        Report {
            address: address.to_owned(),
            result,
            connect_time,
            rpc_time,
            rpc_timeout: self.rpc_timeout,
        }
    }

    /// A report of an answer or failure seen outside a one-shot probe (watch mode).
    pub(crate) fn report_of(
        &self,
        address: &str,
        result: Result<ServingStatus, ProbeError>,
    ) -> Report {
        self.report(address, result, None, None)
    }
}

/// tonic reports its own client-side timeout as `CANCELLED: Timeout expired`; it is a deadline.
pub(crate) fn local_timeout_is_deadline(status: Status) -> Status {
    if status.code() == Code::Cancelled && status.message() == tonic::TimeoutExpired(()).to_string()
    {
        Status::deadline_exceeded(status.message().to_owned())
    } else {
        status
    }
}

/// Where a probe is, so that an interrupted probe can say how far it got.
#[derive(Debug, Default)]
pub(crate) struct Phase(AtomicU8);

impl Phase {
    const CONNECTING: u8 = 0;
    const RPC: u8 = 1;

    pub(crate) fn connecting(&self) {
        self.0.store(Self::CONNECTING, Ordering::Relaxed);
    }

    pub(crate) fn rpc(&self) {
        self.0.store(Self::RPC, Ordering::Relaxed);
    }

    /// What an interruption now means: the original cancels its context, which fails the dial
    /// (exit code 2) or the RPC (exit code 3).
    pub(crate) fn interrupted(&self, address: &str) -> (Outcome, String) {
        if self.0.load(Ordering::Relaxed) == Self::RPC {
            (
                Outcome::RpcFailure,
                "error: health rpc failed: rpc error: code = Canceled desc = context canceled"
                    .to_owned(),
            )
        } else {
            (
                Outcome::ConnectionFailure,
                format!("error: failed to connect service at {address:?}: context canceled"),
            )
        }
    }
}

/// Probes one address once.
pub(crate) async fn probe(prepared: &Prepared, address: &str, phase: &Phase, log: &Log) -> Report {
    phase.connecting();
    let target = match Target::parse(address) {
        Ok(target) => target,
        Err(invalid) => {
            let e = ProbeError::new(
                address,
                ProbeFailure::Connect {
                    timed_out: None,
                    source: Some(Box::new(invalid)),
                },
            );
            return prepared.report(address, Err(e), None, None);
        }
    };
    log.verbose("establishing connection");
    let started = Instant::now();
    let channel = match connect::connect(&target, &prepared.dialer, prepared.connect_timeout).await
    {
        Ok(channel) => channel,
        Err(e) => return prepared.report(address, Err(e), None, None),
    };
    let connect_time = started.elapsed();
    log.verbose(&format!(
        "connection established (took {})",
        GoDuration::from_std(connect_time)
    ));
    phase.rpc();
    let started = Instant::now();
    let result = prepared.check(channel, address).await;
    let rpc_time = started.elapsed();
    if matches!(result, Ok(ServingStatus::Serving)) {
        log.verbose(&format!(
            "time elapsed: connect={} rpc={}",
            GoDuration::from_std(connect_time),
            GoDuration::from_std(rpc_time)
        ));
    }
    prepared.report(address, result, Some(connect_time), Some(rpc_time))
}

/// Probes every address of `options` once, concurrently, and reports in the order given.
///
/// Nothing is printed; [`Report::message`] has the line the command would print.
///
/// ```
/// use health_probe::{Options, Outcome, check_all};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = test_backends::Backend::start("b0").await?;
/// let mut options = Options::new(backend.addr().to_string());
/// options.addrs.push("127.0.0.1:1".to_owned()); // nothing listens there
///
/// let reports = check_all(&options).await?;
/// assert_eq!(reports[0].outcome(), Outcome::Serving);
/// assert_eq!(reports[0].message(), "status: SERVING");
/// assert_eq!(reports[1].outcome(), Outcome::ConnectionFailure);
/// assert_eq!(Outcome::worst(reports.iter().map(|r| r.outcome())).code(), 2);
/// # Ok(())
/// # }
/// ```
pub async fn check_all(options: &Options) -> Result<Vec<Report>, ArgsError> {
    let prepared = Arc::new(Prepared::new(options)?);
    let tasks: Vec<_> = options
        .addrs
        .iter()
        .map(|address| {
            let prepared = Arc::clone(&prepared);
            let address = address.clone();
            tokio::spawn(async move {
                probe(&prepared, &address, &Phase::default(), &Log::silent()).await
            })
        })
        .collect();
    let mut reports = Vec::with_capacity(tasks.len());
    for task in tasks {
        reports.push(task.await.expect("a probe task panicked"));
    }
    Ok(reports)
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
        Report {
            address: "h:1".into(),
            result,
            connect_time: None,
            rpc_time: None,
            rpc_timeout: Duration::from_millis(250),
        }
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
    fn an_interrupted_probe_says_where_it_was() {
        let phase = Phase::default();
        assert_eq!(
            phase.interrupted("h:1"),
            (
                Outcome::ConnectionFailure,
                "error: failed to connect service at \"h:1\": context canceled".to_owned()
            )
        );
        phase.rpc();
        assert_eq!(phase.interrupted("h:1").0, Outcome::RpcFailure);
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

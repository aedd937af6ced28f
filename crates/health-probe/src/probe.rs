//! One look at one address: connect, ask `grpc.health.v1.Health/Check`, report what was seen
//! ([`Report`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use health_layer::probe::{ProbeError, ProbeFailure, ServingStatus, check_with};
use http::HeaderValue;
use tokio::time::Instant;
use tonic::Status;
use tonic::codec::CompressionEncoding;
use tonic::metadata::{
    AsciiMetadataKey, AsciiMetadataValue, BinaryMetadataKey, BinaryMetadataValue, MetadataMap,
};
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::args::{ArgsError, Options};
use crate::connect::{self, Dialer};
use crate::duration::GoDuration;
use crate::outcome::{Outcome, Report};
use crate::output::Log;
use crate::target::Target;
use crate::tls::TlsSetup;
use crate::watch::WatchTiming;

/// Everything a probe needs, built once from the options.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) dialer: Dialer,
    pub(crate) metadata: MetadataMap,
    pub(crate) service: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) rpc_timeout: Duration,
    pub(crate) gzip: bool,
    /// When `-watch` reconnects and verifies quiet streams.
    pub(crate) watch_timing: WatchTiming,
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
            watch_timing: WatchTiming::default(),
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

    /// One `Check` on `channel`: health-layer's
    /// [`check_with`](health_layer::probe::check_with), on a client that compresses under
    /// `-gzip`.
    pub(crate) async fn check(
        &self,
        channel: Channel,
        target: &str,
    ) -> Result<ServingStatus, ProbeError> {
        let mut client = self.client(channel);
        check_with(&mut client, target, self.request(), self.rpc_timeout).await
    }

    fn report(
        &self,
        address: &str,
        result: Result<ServingStatus, ProbeError>,
        connect_time: Option<Duration>,
        rpc_time: Option<Duration>,
    ) -> Report {
        Report::new(address, result, connect_time, rpc_time, self.rpc_timeout)
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

//! `-watch`: follow each address with `grpc.health.v1.Health/Watch` and print every change,
//! timestamped, until interrupted; the exit code is then that of the last status seen.
//!
//! Per address, in a loop: connect (as a one-shot probe does), open `Watch` (its first
//! message must come within `-rpc-timeout`), print each status that differs from the last line
//! printed. When the stream breaks after it has delivered statuses, reconnect at once (after
//! 100 ms); after a failure (no connection, RPC error), wait 1 s, doubling up to 30 s, reset
//! by the next status received. A server without `Watch` (`UNIMPLEMENTED`) is polled with
//! `Check` every second instead. Lines are the one-shot probe's (`status: SERVING`,
//! `service unhealthy (responded with "NOT_SERVING")`, `timeout: failed to connect ...`), so
//! a line is printed when the exit code or the reason changes.
//!
//! A `SERVICE_UNKNOWN` message (how the protocol says "no such service" on `Watch`) is "not
//! serving" (4); a server that ends the call with `NOT_FOUND` instead (tonic-health does) gives
//! an RPC failure (3), as a one-shot `Check` would, and is retried.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use endpoint_state::Backoff;
use health_layer::probe::{
    ProbeError, ProbeFailure, ServingStatus, local_timeout_is_deadline, serving_status,
};
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::connect;
use crate::outcome::Outcome;
use crate::output::Log;
use crate::probe::{Phase, Prepared};
use crate::target::Target;

/// The wait after the n-th failure in a row (from 0): 1 s, doubled after each further one, at
/// most 30 s.
const RETRY: Backoff = Backoff::new(Duration::from_secs(1), 2.0, Duration::from_secs(30), 0.0);
/// The wait before reconnecting after a stream that delivered statuses ended.
const AFTER_STREAM: Duration = Duration::from_millis(100);
/// How often `Check` is asked when the server has no `Watch`.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// What one watched address has seen, read when the watch is interrupted.
#[derive(Debug)]
pub(crate) struct Watched {
    phase: Phase,
    /// The exit code of the last line printed; `NONE` before the first.
    last: AtomicU8,
}

impl Watched {
    const NONE: u8 = u8::MAX;

    pub(crate) fn new() -> Self {
        Watched {
            phase: Phase::default(),
            last: AtomicU8::new(Self::NONE),
        }
    }

    /// The outcome that stands for this address now: the last status seen, or, before any,
    /// what an interrupted one-shot probe would say.
    pub(crate) fn outcome(&self, address: &str) -> Outcome {
        Outcome::from_code(self.last.load(Ordering::Relaxed))
            .unwrap_or_else(|| self.phase.interrupted(address).0)
    }
}

/// Failures in a row, and the wait each calls for.
#[derive(Default)]
struct Retries {
    failures: u32,
}

impl Retries {
    /// The wait after one more failure.
    fn next(&mut self) -> Duration {
        let wait = RETRY.nominal(self.failures);
        self.failures = self.failures.saturating_add(1);
        wait
    }

    /// A status came: the next failure waits the first wait again.
    fn reset(&mut self) {
        self.failures = 0;
    }
}

/// Prints a result when its line differs from the last one printed.
struct Emitter<'a> {
    prepared: &'a Prepared,
    address: &'a str,
    watched: &'a Watched,
    log: &'a Log,
    last_line: Option<String>,
}

impl Emitter<'_> {
    fn emit(&mut self, result: Result<ServingStatus, ProbeError>) {
        let report = self.prepared.report_of(self.address, result);
        self.watched
            .last
            .store(report.outcome().code(), Ordering::Relaxed);
        let message = report.message();
        if self.last_line.as_deref() != Some(message.as_str()) {
            self.log.line(&message);
            self.last_line = Some(message);
        }
    }
}

/// How a watch of one connection ended.
enum Ended {
    /// It delivered statuses, then broke: reconnect soon.
    AfterStatuses,
    /// It failed without delivering any: back off.
    Failed,
}

/// Watches one address until the task is aborted.
pub(crate) async fn watch(
    prepared: Arc<Prepared>,
    address: String,
    watched: Arc<Watched>,
    log: Log,
) {
    let mut emitter = Emitter {
        prepared: &prepared,
        address: &address,
        watched: &watched,
        log: &log,
        last_line: None,
    };
    let target = match Target::parse(&address) {
        Ok(target) => target,
        Err(invalid) => {
            emitter.emit(Err(ProbeError::new(
                address.as_str(),
                ProbeFailure::Connect {
                    timed_out: None,
                    source: Some(Box::new(invalid)),
                },
            )));
            return;
        }
    };
    let mut retries = Retries::default();
    loop {
        watched.phase.connecting();
        log.verbose("establishing connection");
        let connected = connect::connect(&target, &prepared.dialer, prepared.connect_timeout).await;
        let delay = match connected {
            Err(e) => {
                emitter.emit(Err(e));
                retries.next()
            }
            Ok(channel) => {
                log.verbose("connection established");
                watched.phase.rpc();
                match follow(&prepared, channel, &mut emitter).await {
                    Ended::AfterStatuses => {
                        retries.reset();
                        AFTER_STREAM
                    }
                    Ended::Failed => retries.next(),
                }
            }
        };
        log.verbose(&format!(
            "next attempt in {}",
            crate::duration::GoDuration::from_std(delay)
        ));
        tokio::time::sleep(delay).await;
    }
}

/// Follows `Watch` on one connection until it ends.
async fn follow(prepared: &Prepared, channel: Channel, emitter: &mut Emitter<'_>) -> Ended {
    let address = emitter.address;
    let mut client = prepared.client(channel.clone());
    let opened = tokio::time::timeout(prepared.rpc_timeout, async {
        let mut stream = client.watch(prepared.request()).await?.into_inner();
        let first = stream.message().await?;
        Ok::<_, Status>((stream, first))
    })
    .await;
    let (mut stream, first) = match opened {
        Ok(Ok((stream, Some(first)))) => (stream, first),
        Ok(Ok((_, None))) => {
            let status = Status::unknown("the server ended the health watch without a status");
            emitter.emit(Err(prepared.rpc_error(address, status)));
            return Ended::Failed;
        }
        Ok(Err(status)) if status.code() == Code::Unimplemented => {
            emitter
                .log
                .verbose("the server has no health Watch; polling Check every second");
            return poll(prepared, channel, emitter).await;
        }
        Ok(Err(status)) => {
            let status = local_timeout_is_deadline(status, prepared.rpc_timeout);
            emitter.emit(Err(prepared.rpc_error(address, status)));
            return Ended::Failed;
        }
        Err(_) => {
            let status = Status::deadline_exceeded("no first health status in time");
            emitter.emit(Err(prepared.rpc_error(address, status)));
            return Ended::Failed;
        }
    };
    let mut answer = first;
    loop {
        emitter.emit(Ok(serving_status(answer.status)));
        answer = match stream.message().await {
            Ok(Some(next)) => next,
            // Ended or broke: what the next connection finds is the news.
            Ok(None) | Err(_) => return Ended::AfterStatuses,
        };
    }
}

/// Asks `Check` every second on one connection until it fails.
async fn poll(prepared: &Prepared, channel: Channel, emitter: &mut Emitter<'_>) -> Ended {
    let mut answered = false;
    loop {
        match prepared.check(channel.clone(), emitter.address).await {
            Ok(status) => {
                emitter.emit(Ok(status));
                answered = true;
            }
            Err(e) => {
                emitter.emit(Err(e));
                return if answered {
                    Ended::AfterStatuses
                } else {
                    Ended::Failed
                };
            }
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = Retries::default();
        let waits: Vec<u64> = (0..8).map(|_| b.next().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
        b.reset();
        assert_eq!(b.next(), Duration::from_secs(1));
    }

    #[test]
    fn an_address_without_a_status_counts_by_phase() {
        let w = Watched::new();
        assert_eq!(w.outcome("h:1"), Outcome::ConnectionFailure);
        w.phase.rpc();
        assert_eq!(w.outcome("h:1"), Outcome::RpcFailure);
        w.last.store(Outcome::NotServing.code(), Ordering::Relaxed);
        assert_eq!(w.outcome("h:1"), Outcome::NotServing);
    }
}

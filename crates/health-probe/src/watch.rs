//! `-watch`: follow each address with `grpc.health.v1.Health/Watch` and print every change,
//! timestamped, until interrupted; the exit code is then that of the last status seen.
//!
//! Per address, in a loop: connect (as a one-shot probe does), open `Watch` (its first
//! message must come within `-rpc-timeout`), print each status that differs from the last line
//! printed. A stream that stays quiet for 10 s has its connection verified with one `Check` on
//! it, as health-layer's checker does: a call with data, which no server counts as an abusive
//! ping; any answer within `-rpc-timeout` proves the connection alive, none is printed as the
//! failure it is (a server that froze, a connection a middlebox dropped) and the address is
//! connected again.
//!
//! When a stream that lasted 10 s or more ends (a server's max connection age, a restart), the
//! address is connected again at once (after 100 ms). Anything else — a failure (no
//! connection, an RPC error, a silent connection) or a stream that ended sooner (a server that
//! sends one status and closes) — waits 1 s, doubling up to 30 s; the wait goes back to 1 s
//! after a stream that lasted. A server without `Watch` (`UNIMPLEMENTED`) is polled with
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
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::connect;
use crate::outcome::Outcome;
use crate::output::Log;
use crate::probe::{Phase, Prepared};
use crate::target::Target;

/// When a watch reconnects and verifies: see the [module docs](self).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WatchTiming {
    /// The wait after the n-th failure in a row (from 0): 1 s, doubled after each further
    /// one, at most 30 s.
    pub(crate) retry: Backoff,
    /// The wait before reconnecting after a stream that lasted ended.
    pub(crate) after_stream: Duration,
    /// How long a stream must have lasted for its end to be news rather than a fault.
    pub(crate) stable: Duration,
    /// How long a stream may stay quiet before its connection is verified with a `Check`.
    pub(crate) verify_after: Duration,
    /// How often `Check` is asked when the server has no `Watch`.
    pub(crate) poll_interval: Duration,
}

impl Default for WatchTiming {
    fn default() -> Self {
        WatchTiming {
            retry: Backoff::new(Duration::from_secs(1), 2.0, Duration::from_secs(30), 0.0),
            after_stream: Duration::from_millis(100),
            stable: Duration::from_secs(10),
            verify_after: Duration::from_secs(10),
            poll_interval: Duration::from_secs(1),
        }
    }
}

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
struct Retries {
    backoff: Backoff,
    failures: u32,
}

impl Retries {
    fn new(backoff: Backoff) -> Self {
        Retries {
            backoff,
            failures: 0,
        }
    }

    /// The wait after one more failure.
    fn next(&mut self) -> Duration {
        let wait = self.backoff.nominal(self.failures);
        self.failures = self.failures.saturating_add(1);
        wait
    }

    /// A stream lasted: the next failure waits the first wait again.
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
    /// It delivered statuses, then ended or broke, after lasting this long: reconnect soon if
    /// it lasted, back off if not.
    AfterStatuses(Duration),
    /// It failed without delivering any, or its connection went silent: back off.
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
    let timing = prepared.watch_timing;
    let mut retries = Retries::new(timing.retry);
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
                    Ended::AfterStatuses(lasted) if lasted >= timing.stable => {
                        retries.reset();
                        timing.after_stream
                    }
                    Ended::AfterStatuses(_) | Ended::Failed => retries.next(),
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
    let started = Instant::now();
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
    emitter.emit(Ok(serving_status(first.status)));
    let verify_after = prepared.watch_timing.verify_after;
    let quiet = tokio::time::sleep(verify_after);
    let mut quiet = std::pin::pin!(quiet);
    loop {
        tokio::select! {
            next = stream.message() => match next {
                Ok(Some(answer)) => {
                    emitter.emit(Ok(serving_status(answer.status)));
                    quiet.as_mut().reset(Instant::now() + verify_after);
                }
                // Ended or broke: what the next connection finds is the news.
                Ok(None) | Err(_) => return Ended::AfterStatuses(started.elapsed()),
            },
            () = quiet.as_mut() => {
                emitter.log.verbose("the health watch is quiet; verifying its connection with Check");
                match prepared.check(channel.clone(), address).await {
                    // No answer in time, or the connection broke: the stream is dead.
                    Err(e) if e.connection_ended() || is_local_timeout(&e) => {
                        emitter.emit(Err(e));
                        return Ended::Failed;
                    }
                    // Any answer proves the connection alive; the stream says the status.
                    _ => quiet.as_mut().reset(Instant::now() + verify_after),
                }
            }
        }
    }
}

/// Whether a `Check` found no answer within its time (rather than an answer of the server's).
fn is_local_timeout(e: &ProbeError) -> bool {
    matches!(
        e.failure(),
        ProbeFailure::Rpc { status, .. } if status.code() == Code::DeadlineExceeded
    ) && !e.connection_ended()
}

/// Asks `Check` every second on one connection until it fails.
async fn poll(prepared: &Prepared, channel: Channel, emitter: &mut Emitter<'_>) -> Ended {
    let started = Instant::now();
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
                    Ended::AfterStatuses(started.elapsed())
                } else {
                    Ended::Failed
                };
            }
        }
        tokio::time::sleep(prepared.watch_timing.poll_interval).await;
    }
}

#[cfg(test)]
mod live;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = Retries::new(WatchTiming::default().retry);
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

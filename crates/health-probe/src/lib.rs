//! `grpc-health-probe`: a drop-in for [`grpc_health_probe`], built on health-layer's probe.
//!
//! People call `grpc_health_probe` from Kubernetes exec probes and scripts; this binary takes
//! the same command line and behaves the same, so the binaries can be swapped without touching
//! a manifest:
//!
//! * the same flags, in Go's forms (`-addr=h:p`, `-addr h:p`, `--addr=h:p`, `-tls`,
//!   `-tls=true`): `-addr`, `-service`, `-connect-timeout`, `-rpc-timeout` (Go durations,
//!   default `1s`), `-rpc-header` (repeatable `name: value`), `-user-agent` (default
//!   `grpc_health_probe`), `-tls`, `-tls-ca-cert`, `-tls-client-cert`, `-tls-client-key`,
//!   `-tls-no-verify`, `-tls-server-name`, `-gzip`, `-v`, `-version`;
//! * the same exit codes ([`Outcome`]): 0 `SERVING`, 1 bad arguments, 2 connection failure,
//!   3 RPC failure, 4 not `SERVING`;
//! * the same messages, on stderr: `status: SERVING`,
//!   `service unhealthy (responded with "NOT_SERVING")`,
//!   `timeout: failed to connect service "10.0.0.7:5000" within 1s`,
//!   `error: this server does not implement the grpc health protocol (grpc.health.v1.Health): ...`,
//!   `timeout: health rpc did not complete within 1s`, `error: -addr not specified`, ...
//!
//! "Connected" means what it means to the original (grpc-go's blocking dial): TCP up, TLS done,
//! and the server's HTTP/2 settings received — so an address that accepts TCP and never
//! answers is a connection failure after `-connect-timeout`, not an RPC timeout.
//!
//! Beyond the original:
//!
//! * `-watch` follows each address with `grpc.health.v1.Health/Watch` and prints every change
//!   with a timestamp until interrupted (SIGINT or SIGTERM); the exit code is then that of the
//!   last status;
//! * `-addr` may be repeated: the addresses are checked concurrently, one line each
//!   (`addr: status: SERVING`), and the exit code is the worst ([`Outcome::worst`]).
//!
//! The library under the binary: [`parse_args`] reads a command line, [`check_all`] probes
//! without printing, [`run`] is the whole command. (The examples start a server from
//! `test_backends`, this repository's unpublished crate of test servers, so that they run as
//! tests; in your code the address is your server's.)
//!
//! ```
//! use health_probe::{Command, Outcome, check_all, parse_args};
//! use test_backends::{Backend, ServingStatus};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = Backend::start("b0").await?;
//! backend.set_service_status("orders", ServingStatus::NotServing).await;
//! let addr = backend.addr().to_string();
//!
//! let parsed = parse_args(["-addr", addr.as_str(), "-service=orders", "-rpc-timeout=500ms"])?;
//! let Command::Probe(options) = parsed.command else { unreachable!() };
//! let reports = check_all(&options).await?;
//! assert_eq!(reports[0].message(), r#"service unhealthy (responded with "NOT_SERVING")"#);
//! assert_eq!(reports[0].outcome(), Outcome::NotServing);
//! assert_eq!(reports[0].outcome().code(), 4);
//! # Ok(())
//! # }
//! ```
//!
//! [`grpc_health_probe`]: https://github.com/grpc-ecosystem/grpc-health-probe
#![cfg_attr(docsrs, feature(doc_cfg))]

mod args;
mod connect;
mod duration;
mod outcome;
mod output;
mod probe;
mod target;
mod tls;
mod watch;

use std::process::ExitCode;
use std::sync::Arc;

use tokio::sync::mpsc;

pub use args::{
    ArgsError, Command, DEFAULT_USER_AGENT, Options, Parsed, RpcHeader, TlsOptions, parse_args,
    usage,
};
pub use connect::ConnectFailed;
pub use outcome::{Outcome, Report};
pub use probe::check_all;
pub use target::{InvalidAddress, Target};

#[doc(no_inline)]
pub use health_layer::probe::{ProbeError, ProbeFailure, ServingStatus};

use output::Log;
use probe::{Phase, Prepared};
use watch::Watched;

/// This crate's version, printed by `-version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The whole command: parse `args` (without the program name), run, and return the exit
/// code. Builds its own single-threaded tokio runtime.
pub fn main_with_args<I, S>(args: I) -> ExitCode
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut text = Vec::new();
    for arg in args {
        match arg.as_ref().to_str() {
            Some(s) => text.push(s.to_owned()),
            None => {
                eprintln!("error: argument {:?} is not valid UTF-8", arg.as_ref());
                return Outcome::InvalidArguments.into();
            }
        }
    }
    let parsed = match parse_args(&text) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("{e}");
            if e.shows_usage() {
                eprint!("{}", usage());
            }
            return Outcome::InvalidArguments.into();
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return Outcome::ConnectionFailure.into();
        }
    };
    let outcome = runtime.block_on(run(parsed));
    // A name lookup stuck in the blocking pool must not hold the exit.
    runtime.shutdown_background();
    outcome.into()
}

/// Runs a parsed command line: prints what `grpc_health_probe` prints (on stderr; the version
/// on stdout) and returns the outcome whose [`code`](Outcome::code) is the exit code.
///
/// SIGINT and SIGTERM are handled from the start: a one-shot probe prints
/// `cancellation received` and exits 2 or 3 for the addresses still connecting or waiting
/// for their answer; a watch exits with its last status.
pub async fn run(parsed: Parsed) -> Outcome {
    let options = match parsed.command {
        Command::Version => {
            println!("grpc-health-probe {VERSION}");
            return Outcome::Serving;
        }
        Command::Help => {
            eprint!("{}", usage());
            return Outcome::InvalidArguments;
        }
        Command::Probe(options) => options,
    };
    let mut signals = match Signals::install() {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("error: cannot listen for signals: {e}");
            return Outcome::InvalidArguments;
        }
    };
    let log = Log::new(options.verbose, options.watch);
    if !parsed.ignored.is_empty() {
        log.line(&format!(
            "warning: ignoring the arguments after the flags (as grpc_health_probe does): {}",
            parsed.ignored.join(" ")
        ));
    }
    if options.verbose {
        log_options(&log, &options);
    }
    let prepared = match Prepared::new(&options) {
        Ok(prepared) => Arc::new(prepared),
        Err(e) => {
            log.line(&e.to_string());
            return Outcome::InvalidArguments;
        }
    };
    // Roots of the platform that could not be loaded while others could: said, not hidden.
    for warning in prepared.dialer.tls.iter().flat_map(|tls| &tls.warnings) {
        log.line(warning);
    }
    if options.watch {
        watch_all(&options, prepared, &log, &mut signals).await
    } else {
        probe_all(&options, prepared, &log, &mut signals).await
    }
}

/// The log of one address: prefixed with the address when there are several.
fn log_for(log: &Log, options: &Options, address: &str) -> Log {
    if options.addrs.len() > 1 {
        log.for_address(address)
    } else {
        log.clone()
    }
}

async fn probe_all(
    options: &Options,
    prepared: Arc<Prepared>,
    log: &Log,
    signals: &mut Signals,
) -> Outcome {
    let n = options.addrs.len();
    // Bounded by the number of probes: each sends exactly one report.
    let (done, mut reports) = mpsc::channel(n);
    let mut phases = Vec::with_capacity(n);
    let mut tasks = Vec::with_capacity(n);
    for (i, address) in options.addrs.iter().enumerate() {
        let phase = Arc::new(Phase::default());
        let task_log = log_for(log, options, address);
        let (prepared, phase_, done, address) = (
            Arc::clone(&prepared),
            Arc::clone(&phase),
            done.clone(),
            address.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let report = probe::probe(&prepared, &address, &phase_, &task_log).await;
            let _ = done.send((i, report)).await;
        }));
        phases.push(phase);
    }
    drop(done);
    let mut results: Vec<Option<Report>> = (0..n).map(|_| None).collect();
    let mut received = 0;
    let interrupted = loop {
        if received == n {
            break false;
        }
        tokio::select! {
            next = reports.recv() => match next {
                Some((i, report)) => {
                    results[i] = Some(report);
                    received += 1;
                }
                None => break false,
            },
            () = signals.recv() => break true,
        }
    };
    if interrupted {
        log.line("cancellation received");
        for task in &tasks {
            task.abort();
        }
        // Reports that made it before the interruption still count.
        while let Ok((i, report)) = reports.try_recv() {
            results[i] = Some(report);
        }
    }
    let mut outcomes = Vec::with_capacity(n);
    for (i, address) in options.addrs.iter().enumerate() {
        let line_log = log_for(log, options, address);
        let (outcome, message) = match &results[i] {
            Some(report) => (report.outcome(), report.message()),
            None => phases[i].interrupted(address),
        };
        line_log.line(&message);
        outcomes.push(outcome);
    }
    Outcome::worst(outcomes)
}

async fn watch_all(
    options: &Options,
    prepared: Arc<Prepared>,
    log: &Log,
    signals: &mut Signals,
) -> Outcome {
    let mut watched = Vec::with_capacity(options.addrs.len());
    let mut tasks = Vec::with_capacity(options.addrs.len());
    for address in &options.addrs {
        let state = Arc::new(Watched::new());
        tasks.push(tokio::spawn(watch::watch(
            Arc::clone(&prepared),
            address.clone(),
            Arc::clone(&state),
            log_for(log, options, address),
        )));
        watched.push((address, state));
    }
    signals.recv().await;
    log.line("cancellation received");
    for task in &tasks {
        task.abort();
    }
    Outcome::worst(
        watched
            .iter()
            .map(|(address, state)| state.outcome(address)),
    )
}

/// The original's `-v` preamble.
fn log_options(log: &Log, options: &Options) {
    log.line("parsed options:");
    log.line(&format!(
        "> addr={} conn_timeout={} rpc_timeout={}",
        options.addrs.join(","),
        duration::GoDuration::from_std(options.connect_timeout),
        duration::GoDuration::from_std(options.rpc_timeout)
    ));
    let mut headers: Vec<(&str, Vec<&str>)> = Vec::new();
    for h in &options.headers {
        match headers.iter_mut().find(|(name, _)| *name == h.name) {
            Some((_, values)) => values.push(&h.value),
            None => headers.push((&h.name, vec![&h.value])),
        }
    }
    headers.sort();
    let headers: Vec<String> = headers
        .iter()
        .map(|(name, values)| format!("{name}:[{}]", values.join(" ")))
        .collect();
    log.line(&format!("> headers: map[{}]", headers.join(" ")));
    log.line(&format!("> tls={}", options.tls.is_some()));
    if let Some(tls) = &options.tls {
        let path = |p: &Option<std::path::PathBuf>| {
            p.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        log.line(&format!("  > no-verify={} ", tls.no_verify));
        log.line(&format!("  > ca-cert={}", path(&tls.ca_cert)));
        log.line(&format!("  > client-cert={}", path(&tls.client_cert)));
        log.line(&format!("  > client-key={}", path(&tls.client_key)));
        log.line(&format!(
            "  > server-name={}",
            tls.server_name.as_deref().unwrap_or("")
        ));
    }
    log.line(&format!(
        "> service={:?} user_agent={:?} gzip={} watch={}",
        options.service, options.user_agent, options.gzip, options.watch
    ));
}

/// SIGINT and SIGTERM (Ctrl-C elsewhere), listened to from the start of a run.
struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                interrupt: signal(SignalKind::interrupt())?,
                terminate: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Signals {})
        }
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.interrupt.recv() => {}
                _ = self.terminate.recv() => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

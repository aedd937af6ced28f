//! `-watch` against servers that misbehave: one that sends one status and closes every stream,
//! and one that goes silent (its `Watch` stream and its `Check` both stop answering).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use endpoint_state::Backoff;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use super::{WatchTiming, Watched, watch};
use crate::args::{Command, parse_args};
use crate::outcome::Outcome;
use crate::output::Log;
use crate::probe::Prepared;

#[derive(Clone, Copy)]
enum Behaviour {
    /// Every `Watch` sends `SERVING` and ends; `Check` answers `SERVING`.
    OneThenClose,
    /// Every `Watch` sends `SERVING`, then nothing; `Check` never answers.
    OneThenSilent,
}

#[derive(Clone)]
struct Misbehaving {
    behaviour: Behaviour,
    watches: Arc<AtomicUsize>,
    checks: Arc<AtomicUsize>,
}

fn serving() -> HealthCheckResponse {
    HealthCheckResponse {
        status: ServingStatus::Serving as i32,
    }
}

#[tonic::async_trait]
impl Health for Misbehaving {
    async fn check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.checks.fetch_add(1, Ordering::SeqCst);
        if let Behaviour::OneThenSilent = self.behaviour {
            std::future::pending::<()>().await;
        }
        Ok(Response::new(serving()))
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

    async fn watch(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.watches.fetch_add(1, Ordering::SeqCst);
        let first = tokio_stream::once(Ok(serving()));
        Ok(Response::new(match self.behaviour {
            Behaviour::OneThenClose => Box::pin(first),
            Behaviour::OneThenSilent => Box::pin(first.chain(tokio_stream::pending())),
        }))
    }
}

/// Starts a server with `behaviour` on loopback: its address and its `Watch` and `Check`
/// counters.
async fn serve(behaviour: Behaviour) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = Misbehaving {
        behaviour,
        watches: Arc::default(),
        checks: Arc::default(),
    };
    let (watches, checks) = (server.watches.clone(), server.checks.clone());
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(HealthServer::new(server))
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    (addr, watches, checks)
}

/// Watches `addr` (with `-rpc-timeout=300ms` and `timing`) in a task; what it has seen.
fn start_watch(addr: &str, timing: WatchTiming) -> (Arc<Watched>, tokio::task::JoinHandle<()>) {
    let parsed = parse_args(["-addr", addr, "-watch", "-rpc-timeout=300ms"]).unwrap();
    let Command::Probe(options) = parsed.command else {
        panic!("{:?}", parsed.command)
    };
    let mut prepared = Prepared::new(&options).unwrap();
    prepared.watch_timing = timing;
    let watched = Arc::new(Watched::new());
    let task = tokio::spawn(watch(
        Arc::new(prepared),
        addr.to_owned(),
        watched.clone(),
        Log::silent(),
    ));
    (watched, task)
}

/// Short waits, so that the tests take a second or two.
fn quick() -> WatchTiming {
    WatchTiming {
        retry: Backoff::new(
            Duration::from_millis(200),
            2.0,
            Duration::from_secs(30),
            0.0,
        ),
        after_stream: Duration::from_millis(10),
        stable: Duration::from_secs(1),
        verify_after: Duration::from_millis(200),
        poll_interval: Duration::from_millis(100),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_sends_one_status_and_closes_is_reconnected_with_backoff() {
    let (addr, watches, _) = serve(Behaviour::OneThenClose).await;
    let (watched, task) = start_watch(&addr, quick());
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    task.abort();
    // Waits of 200, 400, 800 ms: subscriptions at 0, 0.2, 0.6 and 1.4 s. Reconnecting after
    // every stream's end (10 ms here, 100 ms before) would have made a hundred.
    let n = watches.load(Ordering::SeqCst);
    assert!((3..=5).contains(&n), "{n} subscriptions in 1.5 s");
    assert_eq!(watched.outcome(&addr), Outcome::Serving);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_lasted_is_reconnected_at_once() {
    let (addr, watches, _) = serve(Behaviour::OneThenClose).await;
    // Every stream "lasts" (stable from zero): each end reconnects after 10 ms.
    let timing = WatchTiming {
        stable: Duration::ZERO,
        ..quick()
    };
    let (_, task) = start_watch(&addr, timing);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    task.abort();
    let n = watches.load(Ordering::SeqCst);
    assert!(n > 10, "{n} subscriptions in 1.5 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_goes_silent_is_detected_and_reconnected() {
    let (addr, watches, checks) = serve(Behaviour::OneThenSilent).await;
    let (watched, task) = start_watch(&addr, quick());
    // SERVING at once; after 200 ms of quiet a Check, which gets no answer within 300 ms:
    // the connection is given up (an RPC failure) and made again after 200 ms.
    let mut detected = false;
    for _ in 0..200 {
        if watches.load(Ordering::SeqCst) >= 2 {
            detected = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    task.abort();
    assert!(detected, "the silent stream was followed forever");
    assert!(checks.load(Ordering::SeqCst) >= 1, "no verification");
    // The last line printed was the failure, or the new stream's SERVING.
    let outcome = watched.outcome(&addr);
    assert!(
        matches!(outcome, Outcome::RpcFailure | Outcome::Serving),
        "{outcome:?}"
    );
}

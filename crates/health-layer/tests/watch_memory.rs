//! `Watch` on tokio's paused clock, against a scripted health server over an in-memory
//! transport: exact re-subscription instants, `SERVICE_UNKNOWN`, reset on a message.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::Stream;
use health_layer::{HealthChecker, HealthVerdict, ProbeMode, WatchBackoff};
use hyper_util::rt::TokioIo;
use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::transport::{Endpoint, Server};
use tonic::{Code, Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

#[derive(Clone)]
enum Item {
    Send(ServingStatus),
    Wait(Arc<Notify>),
    Fail(Code),
}

/// A health server whose n-th `Watch` plays the n-th script (then holds forever).
#[derive(Clone)]
struct Scripted {
    t0: Instant,
    scripts: Arc<Mutex<VecDeque<Vec<Item>>>>,
    watches: Arc<Mutex<Vec<u128>>>,
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for Scripted {
    async fn check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        Ok(Response::new(HealthCheckResponse {
            status: ServingStatus::Serving as i32,
        }))
    }

    type WatchStream = WatchStream;

    async fn watch(&self, _: Request<HealthCheckRequest>) -> Result<Response<WatchStream>, Status> {
        self.watches
            .lock()
            .unwrap()
            .push((Instant::now() - self.t0).as_millis());
        let items = self.scripts.lock().unwrap().pop_front().unwrap_or_default();
        let stream = futures_util::stream::unfold(items.into_iter(), |mut items| async move {
            loop {
                match items.next() {
                    Some(Item::Send(s)) => {
                        return Some((Ok(HealthCheckResponse { status: s as i32 }), items));
                    }
                    Some(Item::Wait(n)) => n.notified().await,
                    Some(Item::Fail(code)) => {
                        return Some((Err(Status::new(code, "scripted break")), items));
                    }
                    None => std::future::pending::<()>().await,
                }
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// A checker whose probe channels connect in memory to `server`.
fn checker(server: Scripted) -> HealthChecker {
    HealthChecker::builder()
        .mode(ProbeMode::Watch)
        .timeout(Duration::from_secs(5))
        .watch_backoff(WatchBackoff {
            jitter: 0.0, // exact instants; the jittered band is unit-tested
            ..WatchBackoff::default()
        })
        .connector(move |endpoint: Endpoint| {
            let server = server.clone();
            async move {
                let connector = tower::service_fn(move |_| {
                    let server = server.clone();
                    async move {
                        let (client, served) = tokio::io::duplex(64 * 1024);
                        tokio::spawn(
                            Server::builder()
                                .add_service(HealthServer::new(server))
                                .serve_with_incoming(tokio_stream::once(Ok::<_, io::Error>(
                                    served,
                                ))),
                        );
                        Ok::<_, io::Error>(TokioIo::new(client))
                    }
                });
                Ok(endpoint.connect_with_connector(connector).await?)
            }
        })
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn watch_reacts_to_each_message_and_re_subscribes_with_backoff() {
    let more = Arc::new(Notify::new());
    let brk = Arc::new(Notify::new());
    use Item::*;
    let t0 = Instant::now();
    let server = Scripted {
        t0,
        scripts: Arc::new(Mutex::new(VecDeque::from([
            vec![Send(ServingStatus::Serving), Fail(Code::Unavailable)],
            vec![Fail(Code::Unavailable)],
            vec![Fail(Code::Internal)],
            vec![
                Send(ServingStatus::ServiceUnknown),
                Wait(more.clone()),
                Send(ServingStatus::Serving),
                Wait(brk.clone()),
                Fail(Code::Unavailable),
            ],
            vec![Send(ServingStatus::NotServing)],
        ]))),
        watches: Arc::default(),
    };
    let checker = checker(server.clone());
    let card = checker.add_target("http://in-memory").unwrap();
    let mut events = checker.subscribe();
    checker.start(Vec::<&str>::new()).unwrap();
    let at = |ms| tokio::time::sleep_until(t0 + Duration::from_millis(ms));

    at(500).await;
    // SERVING, then the stream broke: unhealthy while it re-subscribes.
    assert_eq!(card.health_verdict(), HealthVerdict::Unhealthy);
    assert_eq!(
        card.health().reason.as_deref(),
        Some("UNAVAILABLE: scripted break")
    );
    at(2_000).await;
    assert_eq!(card.health_verdict(), HealthVerdict::Unhealthy);
    at(5_000).await;
    assert_eq!(card.health_verdict(), HealthVerdict::Unhealthy);
    assert_eq!(
        checker
            .status("http://in-memory")
            .unwrap()
            .last_error
            .as_deref(),
        Some("INTERNAL: scripted break")
    );

    at(6_000).await;
    // The fourth subscription answered SERVICE_UNKNOWN and stays open.
    assert_eq!(card.health_verdict(), HealthVerdict::Unhealthy);
    assert_eq!(
        card.health().reason.as_deref(),
        Some("SERVICE_UNKNOWN: the server does not know service \"\"")
    );
    more.notify_one();
    at(6_001).await;
    assert_eq!(
        card.health_verdict(),
        HealthVerdict::Healthy,
        "on the same stream"
    );

    at(20_000).await;
    brk.notify_one();
    at(30_000).await;
    assert_eq!(card.health_verdict(), HealthVerdict::Unhealthy);
    assert_eq!(card.health().reason.as_deref(), Some("NOT_SERVING"));

    // Re-subscriptions: 1 s after the first break (a message had reset the backoff), then
    // 1.6 s, 2.56 s; after messages again, 1 s.
    assert_eq!(
        *server.watches.lock().unwrap(),
        [0, 1_000, 2_600, 5_160, 21_000]
    );
    let transitions: Vec<_> = std::iter::from_fn(|| events.try_recv().ok())
        .map(|t| t.to)
        .collect();
    use HealthVerdict::*;
    assert_eq!(transitions, [Healthy, Unhealthy, Healthy, Unhealthy]);
    checker.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_watch_that_never_answers_times_out_and_retries() {
    let t0 = Instant::now();
    let hold = Arc::new(Notify::new());
    let server = Scripted {
        t0,
        // Never sends a first message.
        scripts: Arc::new(Mutex::new(VecDeque::from([vec![Item::Wait(hold.clone())]]))),
        watches: Arc::default(),
    };
    let checker = checker(server.clone());
    let card = checker.add_target("http://in-memory").unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    tokio::time::sleep_until(t0 + Duration::from_millis(5_500)).await;
    assert_eq!(card.health_verdict(), HealthVerdict::Unhealthy);
    assert_eq!(
        card.health().reason.as_deref(),
        Some("DEADLINE_EXCEEDED: no Watch message within 5.0 s")
    );
    tokio::time::sleep_until(t0 + Duration::from_millis(6_500)).await;
    // Timed out at 5 s, re-subscribed 1 s later.
    assert_eq!(*server.watches.lock().unwrap(), [0, 6_000]);
    checker.stop().await;
}

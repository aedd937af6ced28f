//! `Watch` on tokio's paused clock, against a scripted health server over an in-memory
//! transport: exact re-subscription instants, `SERVICE_UNKNOWN`, reset on a message, a stream
//! the server closes (verdict kept), silent streams verified with `Check`, and gRFC A17's
//! `UNIMPLEMENTED`.

mod support;

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::Stream;
use health_layer::{Backoff, HealthChecker, HealthConfig, HealthVerdict, ProbeMode};
use hyper_util::rt::TokioIo;
use support::transitions;
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

/// How the scripted server answers `Check`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum CheckAnswer {
    Serving,
    Unimplemented,
    /// Never answers.
    Hang,
}

/// A health server whose n-th `Watch` plays the n-th script (then holds forever).
#[derive(Clone)]
struct Scripted {
    t0: Instant,
    scripts: Arc<Mutex<VecDeque<Vec<Item>>>>,
    watches: Arc<Mutex<Vec<u128>>>,
    check: Arc<Mutex<CheckAnswer>>,
    checks: Arc<Mutex<Vec<u128>>>,
}

impl Scripted {
    fn new(t0: Instant, scripts: impl IntoIterator<Item = Vec<Item>>) -> Self {
        Scripted {
            t0,
            scripts: Arc::new(Mutex::new(scripts.into_iter().collect())),
            watches: Arc::default(),
            check: Arc::new(Mutex::new(CheckAnswer::Serving)),
            checks: Arc::default(),
        }
    }

    fn watches(&self) -> Vec<u128> {
        self.watches.lock().unwrap().clone()
    }

    fn checks(&self) -> Vec<u128> {
        self.checks.lock().unwrap().clone()
    }

    fn answer_checks(&self, answer: CheckAnswer) {
        *self.check.lock().unwrap() = answer;
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for Scripted {
    async fn check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.checks
            .lock()
            .unwrap()
            .push((Instant::now() - self.t0).as_millis());
        let answer = *self.check.lock().unwrap();
        match answer {
            CheckAnswer::Serving => Ok(Response::new(HealthCheckResponse {
                status: ServingStatus::Serving as i32,
            })),
            CheckAnswer::Unimplemented => Err(Status::unimplemented("no health service")),
            CheckAnswer::Hang => std::future::pending().await,
        }
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
    checker_with(server, |c| c)
}

fn checker_with(
    server: Scripted,
    adjust: impl FnOnce(health_layer::HealthConfig) -> health_layer::HealthConfig,
) -> HealthChecker {
    adjust(HealthChecker::builder())
        .mode(ProbeMode::Watch)
        .timeout(Duration::from_secs(5))
        .watch_backoff(Backoff {
            jitter: 0.0, // exact instants; the jittered band is unit-tested
            ..HealthConfig::DEFAULT_WATCH_BACKOFF
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
    let server = Scripted::new(
        t0,
        [
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
        ],
    );
    let checker = checker(server.clone());
    let card = checker.add_target("http://in-memory").unwrap();
    let mut events = checker.subscribe();
    checker.start(Vec::<&str>::new()).unwrap();
    let at = |ms| tokio::time::sleep_until(t0 + Duration::from_millis(ms));

    at(500).await;
    // SERVING, then the server ended the stream: re-subscribed at once, and that subscription
    // failing is the evidence.
    assert_eq!(card.health_verdict(), HealthVerdict::Unhealthy);
    assert_eq!(
        card.health().reason.as_deref(),
        Some("UNAVAILABLE: scripted break")
    );
    at(2_000).await;
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

    // Re-subscriptions: at once after a stream that had answered ended (0 and 20 s); after
    // failures 1 s, then 1.6 s.
    assert_eq!(server.watches(), [0, 0, 1_000, 2_600, 20_000]);
    let transitions = transitions(&mut events);
    use HealthVerdict::*;
    assert_eq!(transitions, [Healthy, Unhealthy, Healthy, Unhealthy]);
    assert_eq!(
        server.checks(),
        [] as [u128; 0],
        "no stream was silent for 30 s"
    );
    checker.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_watch_that_never_answers_times_out_and_retries() {
    let t0 = Instant::now();
    let hold = Arc::new(Notify::new());
    // Never sends a first message.
    let server = Scripted::new(t0, [vec![Item::Wait(hold.clone())]]);
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
    assert_eq!(server.watches(), [0, 6_000]);
    checker.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_stream_the_server_ends_is_re_subscribed_at_once_and_keeps_its_verdict() {
    use Item::*;
    let t0 = Instant::now();
    let hold = Arc::new(Notify::new());
    let server = Scripted::new(
        t0,
        [
            // A max connection age, a restart, a GOAWAY: the stream ends after answering.
            vec![Send(ServingStatus::Serving), Fail(Code::Unavailable)],
            // The new subscription does not answer (yet).
            vec![Wait(hold.clone())],
            vec![Send(ServingStatus::Serving)],
        ],
    );
    let checker = checker(server.clone());
    let card = checker.add_target("http://in-memory").unwrap();
    let mut events = checker.subscribe();
    checker.start(Vec::<&str>::new()).unwrap();
    let at = |ms| tokio::time::sleep_until(t0 + Duration::from_millis(ms));

    at(4_999).await;
    assert_eq!(server.watches(), [0, 0], "re-subscribed at once");
    assert_eq!(
        card.health_verdict(),
        HealthVerdict::Healthy,
        "no evidence yet: the verdict is kept until the new stream answers or times out"
    );
    at(5_001).await;
    assert_eq!(card.health_verdict(), HealthVerdict::Unhealthy);
    assert_eq!(
        card.health().reason.as_deref(),
        Some("DEADLINE_EXCEEDED: no Watch message within 5.0 s")
    );
    at(6_001).await;
    assert_eq!(card.health_verdict(), HealthVerdict::Healthy);
    assert_eq!(server.watches(), [0, 0, 6_000]);
    let transitions = transitions(&mut events);
    use HealthVerdict::*;
    assert_eq!(transitions, [Healthy, Unhealthy, Healthy]);
    checker.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_server_that_ends_every_stream_at_once_costs_one_subscription_a_second() {
    use Item::*;
    let t0 = Instant::now();
    let server = Scripted::new(
        t0,
        std::iter::repeat_n(
            vec![Send(ServingStatus::Serving), Fail(Code::Unavailable)],
            100,
        ),
    );
    let checker = checker(server.clone());
    let card = checker.add_target("http://in-memory").unwrap();
    let mut events = checker.subscribe();
    checker.start(Vec::<&str>::new()).unwrap();
    tokio::time::sleep_until(t0 + Duration::from_millis(4_500)).await;
    assert_eq!(server.watches(), [0, 0, 1_000, 2_000, 3_000, 4_000]);
    assert_eq!(card.health_verdict(), HealthVerdict::Healthy);
    let transitions = transitions(&mut events);
    assert_eq!(transitions, [HealthVerdict::Healthy], "never unhealthy");
    checker.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_silent_stream_is_verified_with_a_check_and_no_answer_is_evidence() {
    use Item::*;
    let t0 = Instant::now();
    let quiet = Arc::new(Notify::new());
    let server = Scripted::new(
        t0,
        [
            vec![
                Send(ServingStatus::Serving),
                Wait(quiet.clone()),
                Send(ServingStatus::Serving),
            ],
            vec![Send(ServingStatus::Serving)],
        ],
    );
    let checker = checker_with(server.clone(), |c| c.interval(Duration::from_secs(10)));
    let card = checker.add_target("http://in-memory").unwrap();
    checker.start(Vec::<&str>::new()).unwrap();
    let at = |ms| tokio::time::sleep_until(t0 + Duration::from_millis(ms));

    at(25_000).await;
    // Silent for 10 s: a Check on the stream's connection, answered; again 10 s later.
    assert_eq!(server.checks(), [10_000, 20_000]);
    // A message proves the connection alive: the next check is 10 s after it.
    quiet.notify_one();
    at(34_999).await;
    assert_eq!(server.checks(), [10_000, 20_000]);
    server.answer_checks(CheckAnswer::Hang);
    at(35_001).await;
    assert_eq!(server.checks(), [10_000, 20_000, 35_000]);
    assert_eq!(card.health_verdict(), HealthVerdict::Healthy);
    // No answer within the 5 s timeout: evidence; re-subscribed 1 s later.
    at(40_001).await;
    assert_eq!(card.health_verdict(), HealthVerdict::Unhealthy);
    let reason = card.health().reason.clone().unwrap();
    assert!(reason.starts_with("DEADLINE_EXCEEDED"), "{reason}");
    at(41_001).await;
    assert_eq!(server.watches(), [0, 41_000]);
    assert_eq!(card.health_verdict(), HealthVerdict::Healthy);
    checker.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_unimplemented_watch_is_healthy_and_not_subscribed_again_on_the_same_connection() {
    use Item::*;
    let t0 = Instant::now();
    let server = Scripted::new(
        t0,
        [
            vec![Fail(Code::Unimplemented)],
            vec![Fail(Code::Unimplemented)],
        ],
    );
    server.answer_checks(CheckAnswer::Unimplemented);
    let checker = checker_with(server.clone(), |c| c.interval(Duration::from_secs(10)));
    let card = checker.add_target("http://in-memory").unwrap();
    let mut events = checker.subscribe();
    checker.start(Vec::<&str>::new()).unwrap();
    let at = |ms| tokio::time::sleep_until(t0 + Duration::from_millis(ms));

    at(600_500).await;
    // gRFC A17: healthy, and no new Watch on this connection (the strict mode re-subscribes
    // every 120 s); every 10 s a Check verifies the connection (UNIMPLEMENTED is an answer).
    assert_eq!(card.health_verdict(), HealthVerdict::Healthy);
    assert_eq!(
        card.health().reason.as_deref(),
        Some("UNIMPLEMENTED: no health service; counted as healthy")
    );
    assert_eq!(server.watches(), [0]);
    assert_eq!(server.checks().len(), 60);
    // The connection stops answering: evidence; then a new connection, a new Watch.
    server.answer_checks(CheckAnswer::Hang);
    at(615_001).await;
    assert_eq!(card.health_verdict(), HealthVerdict::Unhealthy);
    at(616_001).await;
    assert_eq!(server.watches(), [0, 616_000]);
    assert_eq!(card.health_verdict(), HealthVerdict::Healthy);
    let transitions = transitions(&mut events);
    use HealthVerdict::*;
    assert_eq!(transitions, [Healthy, Unhealthy, Healthy]);
    checker.stop().await;
}

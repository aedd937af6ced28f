//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use health_layer::ProbeMode;
use health_layer::error::BoxError;
use tokio::time::Instant;

/// What a scripted probe does on one call.
#[derive(Clone, Debug)]
pub enum Step {
    Pass,
    Fail(&'static str),
    /// Never answers (the checker's timeout ends it).
    Hang,
    /// Takes this long, then passes.
    Slow(Duration),
}

/// A custom probe whose answers per target follow a script (the last step repeats; no script
/// means `Pass`), recording when each call started (relative to `t0`).
#[derive(Clone)]
pub struct Script {
    pub t0: Instant,
    steps: Arc<Mutex<HashMap<String, VecDeque<Step>>>>,
    calls: Arc<Mutex<Vec<(String, Duration)>>>,
    in_flight: Arc<Mutex<(usize, usize)>>,
}

impl Script {
    pub fn new() -> Self {
        Script {
            t0: Instant::now(),
            steps: Arc::default(),
            calls: Arc::default(),
            in_flight: Arc::default(),
        }
    }

    pub fn set(&self, target: &str, steps: impl IntoIterator<Item = Step>) -> &Self {
        self.steps
            .lock()
            .unwrap()
            .insert(target.to_owned(), steps.into_iter().collect());
        self
    }

    /// Start times (whole milliseconds since `t0`) of the calls for `target`.
    pub fn calls_ms(&self, target: &str) -> Vec<u128> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| t == target)
            .map(|(_, d)| d.as_millis())
            .collect()
    }

    pub fn total_calls(&self) -> usize {
        self.calls.lock().unwrap().len()
    }

    /// The most probes that ran at once.
    pub fn max_in_flight(&self) -> usize {
        self.in_flight.lock().unwrap().1
    }

    pub fn mode(&self) -> ProbeMode {
        let script = self.clone();
        ProbeMode::custom(move |target: Arc<str>| {
            let script = script.clone();
            async move {
                let step = {
                    let mut steps = script.steps.lock().unwrap();
                    match steps.get_mut(&*target) {
                        Some(q) if q.len() > 1 => q.pop_front().unwrap(),
                        Some(q) => q.front().cloned().unwrap_or(Step::Pass),
                        None => Step::Pass,
                    }
                };
                script
                    .calls
                    .lock()
                    .unwrap()
                    .push((target.to_string(), Instant::now() - script.t0));
                let _guard = InFlight::enter(&script.in_flight);
                match step {
                    Step::Pass => Ok(()),
                    Step::Fail(why) => Err::<(), BoxError>(why.into()),
                    Step::Hang => std::future::pending().await,
                    Step::Slow(d) => {
                        tokio::time::sleep(d).await;
                        Ok(())
                    }
                }
            }
        })
    }
}

struct InFlight(Arc<Mutex<(usize, usize)>>);

impl InFlight {
    fn enter(counter: &Arc<Mutex<(usize, usize)>>) -> Self {
        let mut c = counter.lock().unwrap();
        c.0 += 1;
        c.1 = c.1.max(c.0);
        InFlight(counter.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.lock().unwrap().0 -= 1;
    }
}

/// Polls `cond` every 10 ms until it holds or `limit` (real time) passes.
pub async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls an async condition every 10 ms until it holds or `limit` (real time) passes.
pub async fn eventually_async<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + limit;
    loop {
        if cond().await {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (real time, bounded) until the card's health verdict is `want`.
pub async fn wait_verdict(
    card: &health_layer::EndpointCard,
    want: health_layer::HealthVerdict,
    limit: Duration,
) -> bool {
    let wait = async {
        loop {
            let changed = card.changed();
            if card.health_verdict() == want {
                return;
            }
            changed.await;
        }
    };
    tokio::time::timeout(limit, wait).await.is_ok()
}

/// A `MakeWriter` collecting formatted log lines, to count warnings.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    pub fn count(&self, needle: &str) -> usize {
        self.text().lines().filter(|l| l.contains(needle)).count()
    }

    pub fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        tracing_subscriber::fmt()
            .with_writer(self.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish()
    }
}

impl io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

/// A gRPC server on loopback with no services at all: every call is `UNIMPLEMENTED`.
pub async fn server_without_health() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap());
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_routes(tonic::service::Routes::default())
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    (uri, task)
}

/// A loopback port where nothing listens (connections are refused).
pub fn refused_uri() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

/// The verdict of a health line's state (the checker's events are all of the health line).
pub fn verdict(state: health_layer::LineState) -> health_layer::HealthVerdict {
    match state {
        health_layer::LineState::Health(v) => v,
        other => panic!("not a health line: {other:?}"),
    }
}

/// The verdicts of the transitions received so far (without waiting).
pub fn transitions(
    events: &mut tokio::sync::broadcast::Receiver<health_layer::CardEvent>,
) -> Vec<health_layer::HealthVerdict> {
    std::iter::from_fn(|| events.try_recv().ok())
        .map(|t| verdict(t.to))
        .collect()
}

/// Resets every backend's counters, makes `n` calls with `call`, and returns each backend's
/// hits.
pub async fn hits_after(
    backends: &test_backends::Backends,
    n: usize,
    call: &mut impl AsyncFnMut(),
) -> Vec<u64> {
    backends.iter().for_each(|b| b.reset_counters());
    for _ in 0..n {
        call().await;
    }
    backends.iter().map(|b| b.hits()).collect()
}

/// Waits (bounded) for a transition of `target` to `to` on a subscription.
pub async fn wait_transition(
    events: &mut tokio::sync::broadcast::Receiver<health_layer::CardEvent>,
    target: &str,
    to: health_layer::HealthVerdict,
    limit: Duration,
) -> bool {
    let wait = async {
        loop {
            match events.recv().await {
                Ok(t) if &*t.target == target && verdict(t.to) == to => return true,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return false,
            }
        }
    };
    tokio::time::timeout(limit, wait).await.unwrap_or(false)
}

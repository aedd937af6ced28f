//! The test-service implementation and the state it shares with the backend handle: injected
//! faults and counters.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use endpoint_state::sync::lock;
use futures_core::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status};

use crate::pb::test_service_server::TestService;
use crate::pb::{HEALTH_CHECK_PATH, HEALTH_WATCH_PATH, Ping, Pong, StreamPing};

/// Marker for "no code" in the atomic code slots.
const NO_CODE: i32 = -1;

/// Faults injected into the test service, read on every call (atomics only).
#[derive(Debug)]
pub(crate) struct Faults {
    delay_nanos: AtomicU64,
    fail_remaining: AtomicU64,
    fail_next_code: AtomicI32,
    fail_always: AtomicI32,
    /// `grpc-retry-pushback-ms` sent with injected failures (read only when a call fails).
    pushback: Mutex<Option<String>>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            delay_nanos: AtomicU64::new(0),
            fail_remaining: AtomicU64::new(0),
            fail_next_code: AtomicI32::new(NO_CODE),
            fail_always: AtomicI32::new(NO_CODE),
            pushback: Mutex::new(None),
        }
    }
}

impl Faults {
    pub(crate) fn set_delay(&self, delay: Duration) {
        let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.delay_nanos.store(nanos, Ordering::Relaxed);
    }

    pub(crate) fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_nanos.load(Ordering::Relaxed))
    }

    pub(crate) fn fail_next(&self, n: u64, code: Code) {
        // The code is published before the count that makes it visible.
        self.fail_next_code.store(code as i32, Ordering::Release);
        self.fail_remaining.store(n, Ordering::Release);
    }

    pub(crate) fn fail_always(&self, code: Option<Code>) {
        let raw = code.map_or(NO_CODE, |c| c as i32);
        self.fail_always.store(raw, Ordering::Release);
    }

    pub(crate) fn set_pushback(&self, value: Option<&str>) {
        *lock(&self.pushback) = value.map(str::to_owned);
    }

    /// An injected failure's status, with the pushback if one is set.
    fn failure_status(&self, code: Code, name: &str) -> Status {
        let mut status = Status::new(code, format!("{name}: injected failure"));
        if let Some(value) = lock(&self.pushback).as_deref()
            && let Ok(value) = value.parse()
        {
            status
                .metadata_mut()
                .insert("grpc-retry-pushback-ms", value);
        }
        status
    }

    /// Decides, once per call on arrival, whether this call fails and with which code.
    fn take_failure(&self) -> Option<Code> {
        let always = self.fail_always.load(Ordering::Acquire);
        if always != NO_CODE {
            return Some(Code::from_i32(always));
        }
        self.fail_remaining
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .ok()
            .map(|_| Code::from_i32(self.fail_next_code.load(Ordering::Acquire)))
    }
}

/// Everything a backend counts. Survives restarts.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) hits: AtomicU64,
    pub(crate) health_checks: AtomicU64,
    pub(crate) open_connections: AtomicU64,
    pub(crate) connections_accepted: AtomicU64,
    /// Test-service calls whose client went away before they were answered.
    pub(crate) cancelled: AtomicU64,
    per_path: Mutex<HashMap<String, u64>>,
    last_headers: Mutex<Option<http::HeaderMap>>,
    /// The headers of the last [`HEADERS_KEPT`] test-service requests, oldest first.
    recent_headers: Mutex<std::collections::VecDeque<http::HeaderMap>>,
    /// The `x-call-id` values of the requests received, while recording them is on.
    call_ids: Mutex<Option<Vec<u64>>>,
}

/// How many requests' headers a backend keeps (the oldest go first).
const HEADERS_KEPT: usize = 32;

/// The request header whose value (a decimal `u64`) a backend records while
/// [`Backend::record_call_ids`](crate::Backend::record_call_ids) is on.
pub const CALL_ID_HEADER: &str = "x-call-id";

impl Counters {
    /// Called by the server's recording layer for every request, of any service.
    pub(crate) fn record_request<B>(&self, req: &http::Request<B>) {
        let path = req.uri().path();
        if path == HEALTH_CHECK_PATH || path == HEALTH_WATCH_PATH {
            self.health_checks.fetch_add(1, Ordering::Relaxed);
        }
        let mut per_path = lock(&self.per_path);
        match per_path.get_mut(path) {
            Some(count) => *count += 1,
            None => {
                per_path.insert(path.to_owned(), 1);
            }
        }
        drop(per_path);
        *lock(&self.last_headers) = Some(req.headers().clone());
        if path != HEALTH_CHECK_PATH && path != HEALTH_WATCH_PATH {
            let mut recent = lock(&self.recent_headers);
            if recent.len() == HEADERS_KEPT {
                recent.pop_front();
            }
            recent.push_back(req.headers().clone());
            drop(recent);
            if let Some(id) = req
                .headers()
                .get(CALL_ID_HEADER)
                .and_then(|v| v.to_str().ok()?.parse().ok())
                && let Some(ids) = lock(&self.call_ids).as_mut()
            {
                ids.push(id);
            }
        }
    }

    /// Starts recording the `x-call-id` of every test-service request (from empty).
    pub(crate) fn record_call_ids(&self) {
        *lock(&self.call_ids) = Some(Vec::new());
    }

    /// The call ids recorded so far (recording goes on, from empty).
    pub(crate) fn take_call_ids(&self) -> Vec<u64> {
        lock(&self.call_ids)
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    pub(crate) fn hits_for(&self, path: &str) -> u64 {
        lock(&self.per_path).get(path).copied().unwrap_or(0)
    }

    pub(crate) fn last_request_headers(&self) -> Option<http::HeaderMap> {
        lock(&self.last_headers).clone()
    }

    pub(crate) fn recent_request_headers(&self) -> Vec<http::HeaderMap> {
        lock(&self.recent_headers).iter().cloned().collect()
    }

    /// Resets every counter except `open_connections` (a gauge of what is open now).
    pub(crate) fn reset(&self) {
        self.hits.store(0, Ordering::Relaxed);
        self.health_checks.store(0, Ordering::Relaxed);
        self.connections_accepted.store(0, Ordering::Relaxed);
        self.cancelled.store(0, Ordering::Relaxed);
        lock(&self.per_path).clear();
        *lock(&self.last_headers) = None;
        lock(&self.recent_headers).clear();
    }
}

/// One serving generation's implementation of `TestService`.
#[derive(Debug)]
pub(crate) struct TestServiceImpl {
    pub(crate) name: Arc<str>,
    pub(crate) faults: Arc<Faults>,
    pub(crate) counters: Arc<Counters>,
    /// Cancelled when this generation is stopped abruptly: pending delays end at once.
    pub(crate) killed: CancellationToken,
}

impl TestServiceImpl {
    /// Counts the call, decides its fate, and waits out the configured delay.
    async fn admit(&self) -> Result<(u64, Option<Status>), Status> {
        let seq = self.counters.hits.fetch_add(1, Ordering::Relaxed) + 1;
        let failure = self
            .faults
            .take_failure()
            .map(|code| self.faults.failure_status(code, &self.name));
        let delay = self.faults.delay();
        if !delay.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = self.killed.cancelled() => {
                    return Err(Status::unavailable(format!("{}: backend stopped", self.name)));
                }
            }
        }
        Ok((seq, failure))
    }

    fn pong(&self, seq: u64, payload: String) -> Pong {
        Pong {
            backend: self.name.to_string(),
            seq,
            payload,
        }
    }
}

/// Counts a call dropped (its client went away) before it was answered.
struct CancelWatch<'a>(Option<&'a Counters>);

impl CancelWatch<'_> {
    fn answered(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelWatch<'_> {
    fn drop(&mut self) {
        if let Some(counters) = self.0 {
            counters.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The response stream of `ServerStream`.
type PongStream = Pin<Box<dyn Stream<Item = Result<Pong, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl TestService for TestServiceImpl {
    async fn unary(&self, request: Request<Ping>) -> Result<Response<Pong>, Status> {
        // Counts the call as cancelled if it is dropped before it is answered.
        let watch = CancelWatch(Some(&self.counters));
        let (seq, failure) = self.admit().await?;
        watch.answered();
        if let Some(status) = failure {
            // Trailers-only response.
            return Err(status);
        }
        Ok(Response::new(self.pong(seq, request.into_inner().payload)))
    }

    type ServerStreamStream = PongStream;

    async fn server_stream(
        &self,
        request: Request<StreamPing>,
    ) -> Result<Response<Self::ServerStreamStream>, Status> {
        let (_, failure) = self.admit().await?;
        let stream: PongStream = match failure {
            // One message, then the error in the trailers.
            Some(status) => Box::pin(tokio_stream::iter([
                Ok(self.pong(0, String::new())),
                Err(status),
            ])),
            None => {
                let name = Arc::clone(&self.name);
                let count = u64::from(request.into_inner().count);
                Box::pin(tokio_stream::iter((0..count).map(move |seq| {
                    Ok(Pong {
                        backend: name.to_string(),
                        seq,
                        payload: String::new(),
                    })
                })))
            }
        };
        Ok(Response::new(stream))
    }
}

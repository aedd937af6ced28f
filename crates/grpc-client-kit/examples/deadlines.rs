//! Per-method deadlines: a fast method with a short deadline succeeds, a slow stream that
//! outlives its own deadline ends with `DEADLINE_EXCEEDED` at that deadline, mid-stream, and a
//! per-call deadline overrides the method's.
//!
//! ```text
//! cargo run -p grpc-client-kit --example deadlines
//! ```
//!
//! The kit has no per-method table of its own: a call's deadline is its `grpc-timeout`, which
//! tonic's `Request::set_timeout` sets, and the kit holds every call to it — waiting for a
//! target, connecting, the response and the whole of a stream. So per-method deadlines are a
//! tonic interceptor on the generated client: it reads the method the generated code names in
//! the request (`tonic::GrpcMethod`) and sets that method's deadline unless the call set its
//! own. (`Endpoint::timeout` in the endpoint template is tonic's own timeout, the same for
//! every call, and it bounds only the start of a response, not a stream's messages.)
//!
//! A deadline that passes is `DEADLINE_EXCEEDED`, which by default also quarantines the
//! target that was too slow (the example prints it). When short deadlines are expected on
//! purpose, leave the code out of quarantine's failure codes:
//! `QuarantineConfig::default().failure_codes(FailureCodes::quarantine_default().without(Code::DeadlineExceeded))`.
//!
//! Exits non-zero unless the fast calls succeed, the slow stream ends with `DEADLINE_EXCEEDED`
//! no sooner than its deadline and before its last message, and the overridden one succeeds.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use grpc_client_kit::Kit;
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::test_service_server::{TestService, TestServiceServer};
use test_backends::pb::{Ping, Pong, StreamPing};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::service::Interceptor;
use tonic::transport::server::TcpIncoming;
use tonic::{Code, GrpcMethod, Request, Response, Status};

type Error = Box<dyn std::error::Error>;

/// How long the slow method (`ServerStream`, a stream of reports) takes per message.
const SLOW: Duration = Duration::from_millis(300);

#[tokio::main]
async fn main() -> Result<(), Error> {
    let b0 = Backend::start("b0").await?;
    let b1 = Backend::start("b1").await?;
    let kit = Kit::builder()
        .targets([b0.uri.clone(), b1.uri.clone()])
        .build()?;
    if !kit.wait_until_ready(Duration::from_secs(5)).await {
        return Err(format!("the backends never became ready: {kit:?}").into());
    }

    // Every method's deadline, by its name in the .proto; anything else gets `default`.
    let deadlines = MethodDeadlines::new(Duration::from_secs(1))
        .method("Unary", Duration::from_millis(200))
        .method("ServerStream", Duration::from_millis(400));
    let mut client = TestServiceClient::with_interceptor(kit.channel(), deadlines);

    // The fast method, well within its 200 ms.
    for _ in 0..10 {
        client.unary(Ping::default()).await?;
    }
    println!("Unary (deadline 200 ms): 10 calls succeeded");

    // The slow method: a stream of 3 reports, one every 300 ms. Its 400 ms pass after the
    // first; the kit ends the stream there (tonic's own timeout covers only the response's
    // start, not its messages).
    let started = Instant::now();
    let (messages, end) = read_stream(&mut client, Request::new(StreamPing { count: 3 })).await;
    let took = started.elapsed();
    let status = match end {
        Ok(()) => return Err("the slow method beat its deadline".into()),
        Err(status) => status,
    };
    println!(
        "ServerStream (deadline 400 ms): {messages} message(s), then {:?} after {} ms: {}",
        status.code(),
        took.as_millis(),
        status.message()
    );
    if status.code() != Code::DeadlineExceeded {
        return Err(format!("expected DEADLINE_EXCEEDED, got {status:?}").into());
    }
    // Not before its deadline, and before the stream's end (3 × 300 ms).
    if messages >= 3 || took < Duration::from_millis(400) || took >= 3 * SLOW {
        return Err(format!("the stream did not end at its deadline ({took:?})").into());
    }
    for target in kit.targets() {
        if let Some(Err(why)) = kit.card(&target).map(|card| card.eligibility()) {
            println!("  and the kit's view of the target that was too slow: {why}");
        }
    }

    // A call's own deadline wins over its method's.
    let mut request = Request::new(StreamPing { count: 3 });
    request.set_timeout(Duration::from_secs(2));
    let (messages, end) = read_stream(&mut client, request).await;
    end?;
    println!("ServerStream with its own 2 s deadline: {messages} messages");
    if messages != 3 {
        return Err(format!("expected 3 messages, got {messages}").into());
    }

    // The fast method still succeeds (on the target that is not quarantined, if one is).
    for _ in 0..10 {
        client.unary(Ping::default()).await?;
    }
    println!("Unary (deadline 200 ms): 10 more calls succeeded");
    kit.shutdown().await;
    Ok(())
}

/// Reads a `ServerStream` call to its end: how many messages came, and how it ended.
async fn read_stream<T>(
    client: &mut TestServiceClient<T>,
    request: Request<StreamPing>,
) -> (usize, Result<(), Status>)
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut stream = match client.server_stream(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => return (0, Err(status)),
    };
    let mut messages = 0;
    loop {
        match stream.message().await {
            Ok(Some(_)) => messages += 1,
            Ok(None) => return (messages, Ok(())),
            Err(status) => return (messages, Err(status)),
        }
    }
}

/// A tonic interceptor that gives each call its method's deadline, unless the call set its
/// own (`Request::set_timeout`, which writes `grpc-timeout`).
#[derive(Debug, Clone)]
struct MethodDeadlines {
    by_method: Arc<HashMap<&'static str, Duration>>,
    default: Duration,
}

impl MethodDeadlines {
    fn new(default: Duration) -> Self {
        MethodDeadlines {
            by_method: Arc::default(),
            default,
        }
    }

    fn method(mut self, name: &'static str, deadline: Duration) -> Self {
        Arc::make_mut(&mut self.by_method).insert(name, deadline);
        self
    }
}

impl Interceptor for MethodDeadlines {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if request.metadata().get("grpc-timeout").is_none() {
            let deadline = request
                .extensions()
                .get::<GrpcMethod<'static>>()
                .and_then(|m| self.by_method.get(m.method()))
                .copied()
                .unwrap_or(self.default);
            request.set_timeout(deadline);
        }
        Ok(request)
    }
}

/// A backend whose `Unary` answers at once and whose `ServerStream` sends a message every
/// [`SLOW`].
struct Backend {
    uri: String,
    task: JoinHandle<()>,
}

impl Backend {
    async fn start(name: &'static str) -> Result<Self, Error> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let uri = format!("http://{}", listener.local_addr()?);
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        let router = tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(TestServiceServer::new(Reports { name }));
        let task = tokio::spawn(async move {
            if let Err(e) = router
                .serve_with_incoming(TcpIncoming::from(listener))
                .await
            {
                eprintln!("{name}: server failed: {e}");
            }
        });
        Ok(Backend { uri, task })
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The test service: a fast `Unary`, a slow `ServerStream`.
struct Reports {
    name: &'static str,
}

type PongStream = Pin<Box<dyn futures_core::Stream<Item = Result<Pong, Status>> + Send>>;

#[tonic::async_trait]
impl TestService for Reports {
    async fn unary(&self, request: Request<Ping>) -> Result<Response<Pong>, Status> {
        Ok(Response::new(Pong {
            backend: self.name.to_owned(),
            seq: 0,
            payload: request.into_inner().payload,
        }))
    }

    type ServerStreamStream = PongStream;

    async fn server_stream(
        &self,
        request: Request<StreamPing>,
    ) -> Result<Response<PongStream>, Status> {
        // The response starts at once; each message takes SLOW to make.
        let backend = self.name;
        let count = u64::from(request.into_inner().count);
        let pongs = futures_util::stream::unfold(0, move |seq| async move {
            if seq == count {
                return None;
            }
            tokio::time::sleep(SLOW).await;
            let pong = Pong {
                backend: backend.to_owned(),
                seq,
                payload: String::new(),
            };
            Some((Ok(pong), seq + 1))
        });
        Ok(Response::new(Box::pin(pongs)))
    }
}

//! Transparent retry: a call that never left the client (connecting was refused, or the
//! connection closed before taking it) goes to another target; a call that may have reached a
//! backend is never sent twice. Real backends on loopback.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use grpc_client_kit::Kit;
use grpc_client_kit::quarantine::QuarantineConfig;
use support::{eventually, watch};
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tonic::Code;

/// Two targets, no health checking: the kit learns that `b1` is gone only from calls.
fn kit_over(backends: &Backends, retry: bool) -> Kit {
    Kit::builder()
        .targets(backends.uris())
        .without_health()
        .transparent_retry(retry)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_sends_the_call_to_another_target() {
    let backends = Backends::start(2).await.unwrap();
    backends[1].stop().await; // its port refuses connections; the kit does not know yet
    let kit = kit_over(&backends, true);
    let mut client = TestServiceClient::new(kit.channel());
    for i in 0..10 {
        let reply = client.unary(Ping::default()).await;
        assert!(reply.is_ok(), "call {i}: {reply:?}");
    }
    assert_eq!(backends[0].hits(), 10, "every call was answered by b0");
    // The refused target is quarantined, not forgotten.
    let eligible: Vec<String> = kit
        .eligible_targets()
        .iter()
        .map(|t| t.to_string())
        .collect();
    assert_eq!(eligible, vec![backends.uris()[0].clone()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_transparent_retry_the_refused_call_fails_naming_its_target() {
    let backends = Backends::start(2).await.unwrap();
    backends[1].stop().await;
    let kit = kit_over(&backends, false);
    let mut client = TestServiceClient::new(kit.channel());
    let mut failures = Vec::new();
    for _ in 0..10 {
        if let Err(status) = client.unary(Ping::default()).await {
            failures.push(status);
        }
    }
    // Round-robin sends one of the first two calls to b1; then quarantine keeps it out.
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].code(), Code::Unavailable);
    let b1 = &backends.uris()[1];
    assert!(
        failures[0].message().contains(&format!("{b1}: ")),
        "{}",
        failures[0].message()
    );
    assert!(
        failures[0].message().contains("Connection refused"),
        "{}",
        failures[0].message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_from_a_backend_is_never_sent_again() {
    let backends = Backends::start(2).await.unwrap();
    for b in backends.iter() {
        b.fail_always(Some(Code::Unavailable));
    }
    let kit = kit_over(&backends, true);
    let mut client = TestServiceClient::new(kit.channel());
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(backends.total_hits(), 1, "the failed call was sent again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_when_its_backend_dies_is_never_sent_again() {
    let backends = Backends::start(2).await.unwrap();
    for b in backends.iter() {
        b.set_delay(Duration::from_secs(5));
    }
    let kit = kit_over(&backends, true);
    let mut client = TestServiceClient::new(kit.channel());
    let call = tokio::spawn(async move { client.unary(Ping::default()).await });
    assert!(eventually(Duration::from_secs(5), || backends.total_hits() == 1).await);
    let victim = backends.iter().find(|b| b.hits() == 1).unwrap();
    victim.stop().await; // reset while the call is in flight
    let status = call.await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains(&victim.uri()), "{status:?}");
    assert_eq!(
        backends.total_hits(),
        1,
        "the call that reached b went out twice"
    );
}

/// The reaction benchmark's sequential case as a test: with Watch health, a backend stopped
/// gracefully (`GOAWAY`, port closed at once) costs a caller calling back to back no call —
/// the one call that meets the closed port is sent to another target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_costs_a_sequential_watch_caller_nothing() {
    let backends = Backends::start(3).await.unwrap();
    let kit = Kit::builder()
        .targets(backends.uris())
        .health(watch())
        .quarantine(QuarantineConfig::default().duration(Duration::from_millis(100)))
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
    let mut client = TestServiceClient::new(kit.channel());
    for trial in 0..3 {
        let victim = &backends[1];
        let stopper = {
            let victim = victim.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                victim.stop_graceful(Duration::from_millis(100)).await;
            })
        };
        let before = victim.hits();
        let end = Instant::now() + Duration::from_millis(400);
        let mut calls = 0;
        while Instant::now() < end {
            let reply = client.unary(Ping::default()).await;
            assert!(reply.is_ok(), "trial {trial}, call {calls}: {reply:?}");
            calls += 1;
        }
        stopper.await.unwrap();
        assert!(
            victim.hits() > before,
            "trial {trial}: b1 got no call before its stop"
        );
        victim.restart().await.unwrap();
        assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
        assert!(
            eventually(Duration::from_secs(10), || kit.eligible_targets().len()
                == 3)
            .await,
            "trial {trial}: b1 did not come back"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_sent_again_once_at_most() {
    let backends = Backends::start(3).await.unwrap();
    for b in backends.iter() {
        b.stop().await; // every port refuses
    }
    let kit = kit_over(&backends, true);
    let mut client = TestServiceClient::new(kit.channel());
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("Connection refused"),
        "{}",
        status.message()
    );
    // The first target and the one the retry chose are quarantined; the third was never tried
    // (had it been, all three would be quarantined, and the balancer would ignore quarantine
    // and list them all).
    assert!(
        eventually(Duration::from_secs(5), || kit.eligible_targets().len() == 1).await,
        "{:?}",
        kit.eligible_targets()
    );
}

/// How [`refusing_server`] turns every stream away.
#[derive(Clone, Copy, Debug)]
enum Refuse {
    /// `GOAWAY` naming stream 0 as the last processed: every stream is above it.
    GoAway,
    /// `RST_STREAM` with `REFUSED_STREAM`.
    Reset,
}

/// A bare HTTP/2 server that refuses every stream it is sent, in a way HTTP/2 defines as "not
/// processed": what a backend does while it shuts down or is overloaded. Counts the streams.
async fn refusing_server(how: Refuse) -> (SocketAddr, Arc<AtomicUsize>) {
    refusing_server_after(how, Duration::ZERO).await
}

/// As [`refusing_server`], taking `delay` to refuse each stream.
async fn refusing_server_after(how: Refuse, delay: Duration) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let streams = Arc::new(AtomicUsize::new(0));
    let counted = streams.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(refuse_on(sock, how, delay, counted.clone()));
        }
    });
    (addr, streams)
}

async fn refuse_on(mut sock: TcpStream, how: Refuse, delay: Duration, streams: Arc<AtomicUsize>) {
    let mut preface = [0u8; 24];
    if sock.read_exact(&mut preface).await.is_err() {
        return;
    }
    // Our SETTINGS (none changed).
    let _ = sock.write_all(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]).await;
    loop {
        let mut head = [0u8; 9];
        if sock.read_exact(&mut head).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let stream = [head[5] & 0x7f, head[6], head[7], head[8]];
        let mut payload = vec![0u8; len];
        if sock.read_exact(&mut payload).await.is_err() {
            return;
        }
        let reply: Vec<u8> = match kind {
            // SETTINGS, not an ack: acknowledge.
            0x4 if flags & 0x1 == 0 => vec![0, 0, 0, 0x4, 0x1, 0, 0, 0, 0],
            // PING: answer.
            0x6 if flags & 0x1 == 0 => [&[0, 0, 8, 0x6, 0x1, 0, 0, 0, 0][..], &payload].concat(),
            // HEADERS: a new stream, refused.
            0x1 => {
                streams.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                match how {
                    Refuse::GoAway => vec![0, 0, 8, 0x7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    Refuse::Reset => [
                        &[0, 0, 4, 0x3, 0][..],
                        &stream,
                        &[0, 0, 0, 0x7], // REFUSED_STREAM
                    ]
                    .concat(),
                }
            }
            _ => continue,
        };
        if sock.write_all(&reply).await.is_err() {
            return;
        }
    }
}

async fn refused_streams_go_to_another_target(how: Refuse) {
    let backends = Backends::start(1).await.unwrap();
    let (addr, refused) = refusing_server(how).await;
    let targets = vec![format!("http://{addr}"), backends.uris()[0].clone()];
    for retry in [true, false] {
        backends[0].reset_counters();
        refused.store(0, Ordering::SeqCst);
        let kit = Kit::builder()
            .targets(targets.clone())
            .without_health()
            .transparent_retry(retry)
            .build()
            .unwrap();
        let mut client = TestServiceClient::new(kit.channel());
        let mut failures = Vec::new();
        for _ in 0..4 {
            if let Err(status) = client.unary(Ping::default()).await {
                failures.push(status);
            }
        }
        let refusals = refused.load(Ordering::SeqCst);
        assert!(
            refusals >= 1,
            "{how:?}: streams sent to the refusing server"
        );
        if retry {
            assert!(failures.is_empty(), "{how:?}: {failures:?}");
            assert_eq!(backends[0].hits(), 4, "{how:?}");
        } else {
            assert_eq!(failures.len(), refusals, "{how:?}: {failures:?}");
            assert!(
                failures.iter().all(|f| f.code() == Code::Unavailable
                    && f.message().contains(&targets[0])
                    && f.message().contains("not processed by the server")),
                "{how:?}: {failures:?}"
            );
            assert_eq!(backends[0].hits() as usize, 4 - refusals, "{how:?}");
        }
        // A stream the server refused is no evidence against it (a server closing a
        // connection for its age refuses the streams that race its GOAWAY): neither
        // quarantine nor the breaker counts it.
        let card = kit.card(&targets[0]).unwrap();
        assert!(card.is_eligible(), "{how:?}: {card:?}");
        assert_eq!(
            card.version(),
            0,
            "{how:?}: no line of its card changed: {card:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_above_the_servers_goaway_goes_to_another_target() {
    refused_streams_go_to_another_target(Refuse::GoAway).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_goes_to_another_target() {
    refused_streams_go_to_another_target(Refuse::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_sent_again_carries_what_is_left_of_its_deadline() {
    // The first target takes 300 ms to refuse the stream; the call goes to the second with
    // what is left of its second, not a whole second again.
    let backends = Backends::start(1).await.unwrap();
    let (addr, refused) = refusing_server_after(Refuse::Reset, Duration::from_millis(300)).await;
    let kit = Kit::builder()
        .targets([format!("http://{addr}"), backends.uris()[0].clone()])
        .without_health()
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    let mut request = tonic::Request::new(Ping::default());
    request.set_timeout(Duration::from_secs(1));
    client.unary(request).await.unwrap();
    assert_eq!(
        refused.load(Ordering::SeqCst),
        1,
        "round-robin starts with the refusing one"
    );
    let headers = backends[0].last_request_headers().unwrap();
    let sent = grpc_client_kit::balance::grpc_timeout(headers["grpc-timeout"].as_bytes()).unwrap();
    assert!(
        sent <= Duration::from_millis(700),
        "sent again with {sent:?} of a 1 s deadline after 300 ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_sent_again_never_lands_on_the_target_that_refused_it() {
    // A refused stream is no evidence against its target (it stays eligible), and the random
    // strategy could choose it again for the second attempt: the retry avoids it.
    let backends = Backends::start(1).await.unwrap();
    let (addr, refused) = refusing_server(Refuse::Reset).await;
    let kit = Kit::builder()
        .targets([format!("http://{addr}"), backends.uris()[0].clone()])
        .without_health()
        .balance(
            grpc_client_kit::balance::BalanceConfig::new()
                .strategy(grpc_client_kit::balance::Strategy::Random)
                .seed(14),
        )
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    for i in 0..40 {
        let reply = client.unary(Ping::default()).await;
        assert!(reply.is_ok(), "call {i}: {reply:?}");
    }
    assert!(
        refused.load(Ordering::SeqCst) >= 5,
        "the refusing target was chosen"
    );
    assert_eq!(backends[0].hits(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stream_the_server_ended_early_is_let_go() {
    // The server ends the call without reading the stream; the channel handle then stays idle.
    // The stream must be dropped all the same, so that its producer learns that nobody reads.
    let backends = Backends::start(1).await.unwrap();
    let kit = kit_over(&backends, true);
    let mut channel = kit.channel();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Ping>(1);
    let pings = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let producer = tokio::spawn(async move {
        let mut sent = 0;
        while tx.send(Ping::default()).await.is_ok() {
            sent += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        sent
    });
    let status = test_backends::upload(&mut channel, tonic::Request::new(pings))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    let sent = tokio::time::timeout(Duration::from_secs(2), producer)
        .await
        .expect("the producer still feeds a stream nobody reads")
        .unwrap();
    assert!(sent >= 1, "{sent}");
    drop(channel);
}

/// Calls through `kit` until `mute` has reset a connection with a call on it: what came back.
async fn calls_until_a_mute_reset(
    kit: &Kit,
    mute: &test_backends::MuteServer,
) -> Vec<Result<(), tonic::Status>> {
    let mut client = TestServiceClient::new(kit.channel());
    let mut results = Vec::new();
    for _ in 0..6 {
        results.push(client.unary(Ping::default()).await.map(drop));
    }
    assert!(mute.resets() >= 1, "no call reached the mute server");
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_reset_before_the_server_spoke_sends_the_call_elsewhere() {
    // A stopping server resets the connections left in its accept queue: a call on one failed
    // before the server sent a single byte, so no server code saw it — it goes to another
    // target.
    let mute = test_backends::MuteServer::start().await.unwrap();
    let backends = Backends::start(1).await.unwrap();
    let kit = Kit::builder()
        .targets([mute.uri(), backends[0].uri()])
        .without_health()
        .build()
        .unwrap();
    let results = calls_until_a_mute_reset(&kit, &mute).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(backends[0].hits(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_template_function_such_a_reset_fails_the_call_naming_its_target() {
    // The same reset through tonic's own connector (a template function may set what the kit
    // cannot read back): it cannot be told from a reset after the server spoke.
    let mute = test_backends::MuteServer::start().await.unwrap();
    let backends = Backends::start(1).await.unwrap();
    let template = grpc_client_kit::EndpointTemplate::from_fn(|uri: &str| {
        Ok(tonic::transport::Endpoint::from_shared(uri.to_owned())?)
    });
    let kit = Kit::builder()
        .targets([mute.uri(), backends[0].uri()])
        .template(template)
        .without_health()
        .build()
        .unwrap();
    let results = calls_until_a_mute_reset(&kit, &mute).await;
    let failed: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(!failed.is_empty(), "{results:?}");
    for status in failed {
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(status.message().starts_with(&mute.uri()), "{status:?}");
    }
}

/// A per-target layer that refuses the first call it sees, as a connection refused (so no
/// backend acted on it), but holds that call's request body for a while after the error has
/// gone up: the way hyper's connection task drops a request body a moment after the stream's
/// error reached the caller.
#[derive(Clone)]
struct LateBody {
    inner: grpc_client_kit::TargetService,
    refused: Arc<AtomicUsize>,
    hold: Duration,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<http::Request<tonic::body::Body>> for LateBody {
    type Response = http::Response<tonic::body::Body>;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, BoxError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if self.refused.fetch_add(1, Ordering::SeqCst) == 0 {
            let hold = self.hold;
            tokio::spawn(async move {
                tokio::time::sleep(hold).await;
                drop(req);
            });
            let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
            return Box::pin(async move { Err(refused.into()) });
        }
        Box::pin(self.inner.call(req))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_call_whose_body_comes_back_late_is_still_sent_again() {
    let backends = Backends::start(2).await.unwrap();
    let refused = Arc::new(AtomicUsize::new(0));
    let layer = {
        let refused = Arc::clone(&refused);
        tower::layer::layer_fn(move |inner| LateBody {
            inner,
            refused: Arc::clone(&refused),
            hold: Duration::from_millis(30),
        })
    };
    let kit = Kit::builder()
        .targets(backends.uris())
        .without_health()
        .per_target_layer(layer)
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    let started = Instant::now();
    let reply = client.unary(Ping::default()).await;
    assert!(reply.is_ok(), "the call was sent again: {reply:?}");
    assert_eq!(
        refused.load(Ordering::SeqCst),
        2,
        "refused once, then sent again"
    );
    assert_eq!(backends[0].hits() + backends[1].hits(), 1);
    // It waited for the body (30 ms), not for the whole bound.
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

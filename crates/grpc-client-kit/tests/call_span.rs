//! A `debug` span per call, named `grpc.call`, with the call's method, the kit's name
//! (`grpc.target`), the backend picked, the attempt and the status — read back from a
//! subscriber's output after calls against a real test server.

use std::io;
use std::sync::{Arc, Mutex};

use grpc_client_kit::Kit;
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tonic::Code;
use tracing_subscriber::fmt::format::FmtSpan;

/// What the subscriber wrote.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_has_a_debug_span_with_method_backend_attempt_and_status() {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(FmtSpan::CLOSE)
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let backends = Backends::start(1).await.unwrap();
    let backend = backends[0].uri();
    let kit = Kit::builder()
        .name("spanned")
        .target(backend.clone())
        .without_health()
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    client.unary(Ping::default()).await.unwrap();
    backends[0].fail_next(1, Code::Internal);
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    // (A span closes when its last handle goes: the call's trace, dropped with the response
    // body that tonic has read to its end before the call returns.)
    kit.shutdown().await;

    let text = logs.text();
    let closed: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("grpc.call{") && l.contains("}: grpc_client_kit::observe: close "))
        .collect();
    assert_eq!(closed.len(), 2, "{text}");
    for (line, status) in closed.iter().zip(["OK", "INTERNAL"]) {
        assert!(line.contains(" DEBUG "), "{line}");
        assert!(
            line.contains("grpc.method=\"gck.test.v1.TestService/Unary\""),
            "{line}"
        );
        assert!(line.contains("grpc.target=\"spanned\""), "{line}");
        assert!(line.contains(&format!("backend=\"{backend}\"")), "{line}");
        assert!(line.contains("attempt=1"), "{line}");
        assert!(
            line.contains(&format!("grpc.status=\"{status}\"")),
            "{line}"
        );
    }
}

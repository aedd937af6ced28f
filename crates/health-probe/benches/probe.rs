//! What a probe costs, against a real tonic server (test-backends) on loopback.
//!
//! * `parse_args/kubernetes_line`: parsing a typical exec-probe command line.
//! * `one_shot/check_all`: this crate's probe in process — a fresh connection (TCP, the
//!   server's HTTP/2 settings awaited), `Check`, close — compared in the same run with
//!   `one_shot/health_layer_check_once`, health-layer's `probe::check_once` (tonic's own
//!   connect, which does not wait for the server's settings, then the same `Check`).
//! * `binary/spawn_and_exit`: the whole `grpc-health-probe -addr ...` process, as a kubelet
//!   exec probe runs it (process start, runtime, connect, RPC, exit).
//!
//! ```text
//! cargo bench -p health-probe --bench probe
//! ```

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use health_probe::{Options, Outcome, check_all, parse_args};
use test_backends::Backend;
use tonic::transport::Endpoint;

fn benches(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let backend = runtime.block_on(Backend::start("b0")).unwrap();
    let addr = backend.addr().to_string();

    c.bench_function("parse_args/kubernetes_line", |b| {
        let line = [
            "-addr=:5000",
            "-connect-timeout=250ms",
            "-rpc-timeout",
            "1s",
            "-rpc-header",
            "x-probe: kubelet",
            "-service=orders.v1.Orders",
        ];
        b.iter(|| parse_args(std::hint::black_box(line)).unwrap())
    });

    let mut one_shot = c.benchmark_group("one_shot");
    let options = Options::new(addr.clone());
    one_shot.bench_function("check_all", |b| {
        b.to_async(&runtime).iter(|| async {
            let reports = check_all(&options).await.unwrap();
            assert_eq!(reports[0].outcome(), Outcome::Serving);
        })
    });
    let endpoint = Endpoint::from_shared(backend.uri())
        .unwrap()
        .connect_timeout(Duration::from_secs(1));
    one_shot.bench_function("health_layer_check_once", |b| {
        b.to_async(&runtime).iter(|| async {
            let status = health_layer::probe::check_once(&endpoint, "", Duration::from_secs(1))
                .await
                .unwrap();
            assert_eq!(status, health_layer::probe::ServingStatus::Serving);
        })
    });
    one_shot.finish();

    let mut binary = c.benchmark_group("binary");
    binary.sample_size(30);
    binary.bench_function("spawn_and_exit", |b| {
        b.iter(|| {
            let status = std::process::Command::new(env!("CARGO_BIN_EXE_grpc-health-probe"))
                .args(["-addr", &addr])
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap();
            assert_eq!(status.code(), Some(0));
        })
    });
    binary.finish();
}

criterion_group!(probe, benches);
criterion_main!(probe);

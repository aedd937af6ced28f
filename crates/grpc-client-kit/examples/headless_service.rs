//! A Kubernetes headless service: one `dns:` target, re-resolved as pods come and go, each pod
//! health-checked for the one gRPC service the client calls.
//!
//! ```text
//! cargo run -p grpc-client-kit --example headless_service
//! ```
//!
//! In a cluster, a Service with `clusterIP: None` named `billing` in namespace `default` makes
//! the cluster DNS answer `billing.default.svc.cluster.local` with one A record per *ready*
//! pod (see examples/README.md for the manifests), and the kit takes it as
//!
//! ```text
//! .target("dns:///billing.default.svc.cluster.local:50051")   // the pods' containerPort
//! ```
//!
//! Here, with nothing but loopback, the "pods" are three servers on 127.0.0.1, 127.0.0.2 and
//! 127.0.0.3 (all of 127/8 is loopback on Linux), on one port as pods of a Deployment are, and
//! the "cluster DNS" is a small nameserver on 127.0.0.1 that answers the same name with the
//! records this example chooses. The only difference in the kit's configuration is that
//! nameserver, named in the target: `dns://127.0.0.1:PORT/billing.default.svc.cluster.local:PORT`.
//!
//! What it shows, and checks (it exits non-zero otherwise):
//!
//! 1. two ready pods share the calls;
//! 2. a pod whose `gck.test.v1.TestService` health says `NOT_SERVING` leaves the rotation at
//!    once — its DNS record is still there (Kubernetes removes it only after the readiness
//!    probe fails enough times) and the server itself still says `SERVING` for `""`;
//! 3. scale up: a new record, a new target, within the refresh;
//! 4. scale down: a record gone from two answers in a row, its target removed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use grpc_client_kit::health::{HealthConfig, ProbeMode};
use grpc_client_kit::{DnsSettings, Kit, KitChannel};
use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};
use test_backends::pb::test_service_client::TestServiceClient;
use test_backends::pb::test_service_server::{TestService, TestServiceServer};
use test_backends::pb::{Ping, Pong, SERVICE_NAME, StreamPing};
use tokio::net::{TcpListener, UdpSocket};
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

type Error = Box<dyn std::error::Error>;

/// The headless service's name, as the cluster DNS knows it.
const NAME: &str = "billing.default.svc.cluster.local";

#[tokio::main]
async fn main() -> Result<(), Error> {
    let pods = three_pods().await?;
    let port = pods[0].addr.port();
    let dns = ClusterDns::start(NAME).await?;
    dns.set(&[pods[0].ip(), pods[1].ip()]);

    let target = format!("dns://{}/{NAME}:{port}", dns.addr);
    println!("target: {target}");
    println!("   (in a cluster: dns:///{NAME}:50051, the pods' containerPort)");
    let kit = Kit::builder()
        .target(target)
        // Each pod is asked about the service this client calls, not the whole server.
        .health(
            HealthConfig::new()
                .mode(ProbeMode::Watch)
                .service(SERVICE_NAME),
        )
        // Re-resolve every second (here, to keep the example short; the default follows the
        // records' TTL, between 1 s and 30 s).
        .dns(
            DnsSettings::default()
                .min_refresh(Duration::from_secs(1))
                .refresh(Duration::from_secs(1)),
        )
        .build()?;
    if !kit.wait_until_ready(Duration::from_secs(10)).await {
        return Err(format!("the pods never became ready: {kit:?}").into());
    }
    let mut client = TestServiceClient::new(kit.channel());

    // 1. Two ready pods.
    show("1. pod-1 and pod-2 ready", &kit);
    let split = calls(&mut client, 20).await?;
    expect(&split, &[("pod-1", 10), ("pod-2", 10)])?;

    // 2. pod-2 stops serving the billing service (its readiness is about to fail): the kit
    // stops sending it calls at once, while DNS still lists it.
    pods[1]
        .health
        .set_service_status(SERVICE_NAME, ServingStatus::NotServing)
        .await;
    wait_for(&kit, 2, 1).await?;
    show(
        "2. pod-2 NOT_SERVING for gck.test.v1.TestService (still in DNS)",
        &kit,
    );
    let split = calls(&mut client, 20).await?;
    expect(&split, &[("pod-1", 20)])?;
    pods[1]
        .health
        .set_service_status(SERVICE_NAME, ServingStatus::Serving)
        .await;
    wait_for(&kit, 2, 2).await?;

    // 3. Scale up: pod-3 is ready, the cluster DNS lists it.
    dns.set(&[pods[0].ip(), pods[1].ip(), pods[2].ip()]);
    wait_for(&kit, 3, 3).await?;
    show("3. scaled up: pod-3 in DNS", &kit);
    let split = calls(&mut client, 30).await?;
    expect(&split, &[("pod-1", 10), ("pod-2", 10), ("pod-3", 10)])?;

    // 4. Scale down: pod-1 is gone from DNS; after two answers without it, so is its target.
    dns.set(&[pods[1].ip(), pods[2].ip()]);
    wait_for(&kit, 2, 2).await?;
    show("4. scaled down: pod-1 gone from DNS", &kit);
    let split = calls(&mut client, 20).await?;
    expect(&split, &[("pod-2", 10), ("pod-3", 10)])?;

    kit.shutdown().await;
    Ok(())
}

/// Prints the phase and the kit's targets.
fn show(phase: &str, kit: &Kit) {
    println!("\n{phase}");
    let eligible = kit.eligible_targets();
    for target in kit.targets() {
        if eligible.contains(&target) {
            println!("   {target}: eligible");
        } else if let Some(Err(why)) = kit.card(&target).map(|card| card.eligibility()) {
            println!("   {why}"); // names the target
        }
    }
}

/// Waits (at most 10 s) until the kit has `targets` targets, `eligible` of them eligible.
async fn wait_for(kit: &Kit, targets: usize, eligible: usize) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while kit.targets().len() != targets || kit.eligible_targets().len() != eligible {
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("never {targets} targets, {eligible} eligible: {kit:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Makes `n` calls; counts the replies by pod, and prints them.
async fn calls(
    client: &mut TestServiceClient<KitChannel>,
    n: usize,
) -> Result<BTreeMap<String, usize>, Status> {
    let mut split = BTreeMap::new();
    for _ in 0..n {
        let pod = client.unary(Ping::default()).await?.into_inner().backend;
        *split.entry(pod).or_insert(0) += 1;
    }
    println!("   {n} calls: {split:?}");
    Ok(split)
}

/// Fails unless `split` is exactly `want`.
fn expect(split: &BTreeMap<String, usize>, want: &[(&str, usize)]) -> Result<(), String> {
    let want: BTreeMap<String, usize> = want.iter().map(|&(s, n)| (s.to_owned(), n)).collect();
    if *split == want {
        Ok(())
    } else {
        Err(format!("expected {want:?}, got {split:?}"))
    }
}

/// One "pod": a tonic server on its own loopback address, with `grpc.health.v1.Health`
/// (`""` and `gck.test.v1.TestService` serving) and the test service answering its name.
struct Pod {
    addr: SocketAddr,
    health: HealthReporter,
    task: JoinHandle<()>,
}

impl Pod {
    async fn start(name: &'static str, addr: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_service_status("", ServingStatus::Serving).await;
        health
            .set_service_status(SERVICE_NAME, ServingStatus::Serving)
            .await;
        let router = tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(TestServiceServer::new(Named(name)));
        let task = tokio::spawn(async move {
            if let Err(e) = router
                .serve_with_incoming(TcpIncoming::from(listener))
                .await
            {
                eprintln!("{name}: server failed: {e}");
            }
        });
        Ok(Pod { addr, health, task })
    }

    fn ip(&self) -> Ipv4Addr {
        match self.addr.ip() {
            IpAddr::V4(ip) => ip,
            IpAddr::V6(_) => unreachable!("pods are on 127.0.0.x"),
        }
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// pod-1, pod-2 and pod-3 on 127.0.0.1, 127.0.0.2 and 127.0.0.3, one port for all three.
async fn three_pods() -> Result<Vec<Pod>, Error> {
    for _ in 0..20 {
        let first = Pod::start("pod-1", SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let port = first.addr.port();
        let mut pods = vec![first];
        for (name, last) in [("pod-2", 2), ("pod-3", 3)] {
            // Another program may hold the port on that address: try another port.
            match Pod::start(name, SocketAddr::from(([127, 0, 0, last], port))).await {
                Ok(pod) => pods.push(pod),
                Err(_) => break,
            }
        }
        if pods.len() == 3 {
            return Ok(pods);
        }
    }
    Err("could not bind one port on 127.0.0.1, 127.0.0.2 and 127.0.0.3".into())
}

/// The "cluster DNS": a nameserver on 127.0.0.1 (UDP) that answers one name with the A
/// records it is given (TTL 0, as the kit re-resolves anyway), and NXDOMAIN for any other.
struct ClusterDns {
    addr: SocketAddr,
    records: Arc<Mutex<BTreeSet<Ipv4Addr>>>,
    task: JoinHandle<()>,
}

impl ClusterDns {
    async fn start(name: &str) -> std::io::Result<Self> {
        let socket = UdpSocket::bind("127.0.0.1:0").await?;
        let addr = socket.local_addr()?;
        let records = Arc::new(Mutex::new(BTreeSet::new()));
        let fqdn = format!("{name}.");
        let answer_with = records.clone();
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                let Ok(query) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let ips = answer_with.lock().expect("not poisoned").clone();
                if let Some(reply) = answer(&query, &fqdn, &ips) {
                    let _ = socket.send_to(&reply, from).await;
                }
            }
        });
        Ok(ClusterDns {
            addr,
            records,
            task,
        })
    }

    /// The pods the name resolves to from now on.
    fn set(&self, ips: &[Ipv4Addr]) {
        *self.records.lock().expect("not poisoned") = ips.iter().copied().collect();
    }
}

impl Drop for ClusterDns {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The reply to `query`: A records of `ips` for `fqdn`, no records for its other types (AAAA),
/// NXDOMAIN for any other name.
fn answer(query: &Message, fqdn: &str, ips: &BTreeSet<Ipv4Addr>) -> Option<Vec<u8>> {
    let mut reply = Message::new(query.metadata.id, MessageType::Response, OpCode::Query);
    reply.metadata.authoritative = true;
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.edns = query.edns.clone();
    for q in &query.queries {
        reply.add_query(q.clone());
        if !q.name().to_ascii().eq_ignore_ascii_case(fqdn) {
            reply.metadata.response_code = ResponseCode::NXDomain;
        } else if q.query_type() == RecordType::A {
            for ip in ips {
                reply.add_answer(Record::from_rdata(q.name().clone(), 0, RData::A(A(*ip))));
            }
        }
    }
    reply.to_vec().ok()
}

/// The test service, answering with the pod's name.
struct Named(&'static str);

#[tonic::async_trait]
impl TestService for Named {
    async fn unary(&self, request: Request<Ping>) -> Result<Response<Pong>, Status> {
        Ok(Response::new(Pong {
            backend: self.0.to_owned(),
            seq: 0,
            payload: request.into_inner().payload,
        }))
    }

    type ServerStreamStream =
        Pin<Box<dyn futures_core::Stream<Item = Result<Pong, Status>> + Send + 'static>>;

    async fn server_stream(
        &self,
        _request: Request<StreamPing>,
    ) -> Result<Response<Self::ServerStreamStream>, Status> {
        Err(Status::unimplemented("not in this example"))
    }
}

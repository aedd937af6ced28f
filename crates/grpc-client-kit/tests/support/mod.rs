//! Shared test support: bounded polling, a DNS server on loopback, test servers on any
//! loopback address.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};
use test_backends::pb::test_service_server::{TestService, TestServiceServer};
use test_backends::pb::{Ping, Pong, StreamPing};
use tokio::net::{TcpListener, UdpSocket};
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status};

/// Health checking over `Watch` streams (the checker's other settings at their defaults).
pub fn watch() -> grpc_client_kit::health::HealthConfig {
    grpc_client_kit::health::HealthConfig::new().mode(grpc_client_kit::health::ProbeMode::Watch)
}

/// A kit over `backends` with `Watch` health checking, once every target has a first verdict
/// (panics if that takes 10 s).
pub async fn ready_watch_kit(backends: &test_backends::Backends) -> grpc_client_kit::Kit {
    let kit = grpc_client_kit::Kit::builder()
        .targets(backends.uris())
        .health(watch())
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(Duration::from_secs(10)).await);
    kit
}

/// Polls `cond` every 10 ms until it holds or `limit` passes; returns whether it held.
pub async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What the loopback DNS server answers for its one name.
#[derive(Debug, Clone)]
pub enum Answer {
    /// A records (TTL 0).
    Addresses(BTreeSet<Ipv4Addr>),
    /// NXDOMAIN.
    NxDomain,
}

/// A minimal authoritative DNS server on `127.0.0.1` (UDP) for one name, whose answer the test
/// changes at will. Records have TTL 0.
pub struct LoopbackDns {
    pub addr: SocketAddr,
    answer: Arc<Mutex<Answer>>,
    pub queries: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl LoopbackDns {
    pub async fn start(name: &str, answer: Answer) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let answer = Arc::new(Mutex::new(answer));
        let queries = Arc::new(AtomicU64::new(0));
        let wanted = format!("{}.", name.trim_end_matches('.')).to_ascii_lowercase();
        let (a, q) = (answer.clone(), queries.clone());
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
                    return;
                };
                let Ok(request) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                q.fetch_add(1, Ordering::Relaxed);
                let mut response =
                    Message::new(request.metadata.id, MessageType::Response, OpCode::Query);
                response.metadata.authoritative = true;
                response.metadata.recursion_desired = request.metadata.recursion_desired;
                response.metadata.recursion_available = true;
                response.edns = request.edns.clone();
                let answer = a.lock().unwrap().clone();
                for query in &request.queries {
                    response.add_query(query.clone());
                    let matches = query.name().to_ascii().to_ascii_lowercase() == wanted;
                    match (&answer, matches) {
                        (Answer::NxDomain, _) | (_, false) => {
                            response.metadata.response_code = ResponseCode::NXDomain;
                        }
                        (Answer::Addresses(ips), true) => {
                            if query.query_type() == RecordType::A {
                                for ip in ips {
                                    response.add_answer(Record::from_rdata(
                                        query.name().clone(),
                                        0,
                                        RData::A(A(*ip)),
                                    ));
                                }
                            }
                        }
                    }
                }
                if let Ok(bytes) = response.to_vec() {
                    let _ = socket.send_to(&bytes, peer).await;
                }
            }
        });
        LoopbackDns {
            addr,
            answer,
            queries,
            task,
        }
    }

    pub fn set(&self, answer: Answer) {
        *self.answer.lock().unwrap() = answer;
    }

    pub fn addresses(ips: &[Ipv4Addr]) -> Answer {
        Answer::Addresses(ips.iter().copied().collect())
    }
}

impl Drop for LoopbackDns {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A test server (health + `TestService`) on a given address, answering with its name.
pub struct IpServer {
    pub name: String,
    pub addr: SocketAddr,
    pub hits: Arc<AtomicU64>,
    pub health: tonic_health::server::HealthReporter,
    task: JoinHandle<()>,
}

#[derive(Clone)]
struct Svc {
    name: String,
    hits: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl TestService for Svc {
    async fn unary(&self, request: Request<Ping>) -> Result<Response<Pong>, Status> {
        let seq = self.hits.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(Response::new(Pong {
            backend: self.name.clone(),
            seq,
            payload: request.into_inner().payload,
        }))
    }

    type ServerStreamStream =
        Pin<Box<dyn futures_core::Stream<Item = Result<Pong, Status>> + Send + 'static>>;

    async fn server_stream(
        &self,
        _request: Request<StreamPing>,
    ) -> Result<Response<Self::ServerStreamStream>, Status> {
        Err(Status::unimplemented("not in this test server"))
    }
}

impl IpServer {
    /// Starts a server named `name` on `ip:port` (`port` 0: any).
    pub async fn start(name: &str, ip: IpAddr, port: u16) -> std::io::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::new(ip, port)).await?;
        let addr = listener.local_addr()?;
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        let hits = Arc::new(AtomicU64::new(0));
        let svc = Svc {
            name: name.to_owned(),
            hits: hits.clone(),
        };
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(health_service)
                .add_service(TestServiceServer::new(svc))
                .serve_with_incoming(incoming)
                .await;
        });
        Ok(IpServer {
            name: name.to_owned(),
            addr,
            hits,
            health,
            task,
        })
    }

    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
}

impl Drop for IpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Three servers on 127.0.0.1, 127.0.0.2 and 127.0.0.3, all on one port.
pub async fn three_ip_servers() -> Vec<IpServer> {
    for _ in 0..20 {
        let first = IpServer::start("s1", Ipv4Addr::new(127, 0, 0, 1).into(), 0)
            .await
            .unwrap();
        let port = first.addr.port();
        let mut servers = vec![first];
        let mut ok = true;
        for i in 2..=3u8 {
            match IpServer::start(&format!("s{i}"), Ipv4Addr::new(127, 0, 0, i).into(), port).await
            {
                Ok(s) => servers.push(s),
                Err(_) => {
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            return servers;
        }
    }
    panic!("could not bind one port on 127.0.0.1, .2 and .3");
}

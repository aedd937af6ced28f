//! A service of your own through the kit: `proto/greeter.proto` compiled by `build.rs` (protox,
//! a protobuf compiler in Rust, so no `protoc`; then tonic-prost-build), three greeter servers
//! with the standard health service, and the generated `GreeterClient` over the kit's channel.
//!
//! ```text
//! cargo run -p greeter
//! ```
//!
//! The kit asks each server's health service about `greeter.v1.Greeter` itself, not the whole
//! server (`""`): a server that stops serving that one service (draining it, say) leaves the
//! rotation while its other services, and its health service, keep running. Exits non-zero if
//! any of that does not happen.

use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use grpc_client_kit::health::{HealthConfig, ProbeMode};
use grpc_client_kit::{Kit, KitChannel};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};
use tonic_health::server::HealthReporter;

/// The code generated from `proto/greeter.proto`.
mod pb {
    #![allow(
        missing_docs,
        unreachable_pub,
        missing_debug_implementations,
        rust_2018_idioms,
        clippy::all,
        clippy::pedantic
    )]
    tonic::include_proto!("greeter.v1");
}

use pb::greeter_client::GreeterClient;
use pb::greeter_server::{Greeter, GreeterServer};
use pb::{HelloReply, HelloRequest};

/// One server's greeter: it signs its replies.
#[derive(Debug)]
struct Greeting {
    server: String,
}

#[tonic::async_trait]
impl Greeter for Greeting {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        let name = request.into_inner().name;
        Ok(Response::new(HelloReply {
            message: format!("Hello, {name}!"),
            server: self.server.clone(),
        }))
    }
}

/// The health service's name for the greeter: `greeter.v1.Greeter`.
const GREETER: &str = <GreeterServer<Greeting> as NamedService>::NAME;

/// A greeter server on `127.0.0.1`, with `grpc.health.v1.Health`.
struct LocalGreeter {
    name: String,
    uri: String,
    health: HealthReporter,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl LocalGreeter {
    async fn start(name: &str) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let uri = format!("http://{}", listener.local_addr()?);
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<GreeterServer<Greeting>>().await;
        let greeter = GreeterServer::new(Greeting {
            server: name.to_owned(),
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health_service)
                .add_service(greeter)
                .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                    let _ = stopped.await;
                }),
        );
        Ok(LocalGreeter {
            name: name.to_owned(),
            uri,
            health,
            stop,
            task,
        })
    }

    async fn shutdown(self) -> Result<(), Box<dyn std::error::Error>> {
        let _ = self.stop.send(());
        self.task.await??;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut servers = Vec::new();
    for name in ["g0", "g1", "g2"] {
        servers.push(LocalGreeter::start(name).await?);
    }
    for s in &servers {
        println!("{} = {}", s.name, s.uri);
    }

    // The kit over the three servers, health-checked over Watch streams about the greeter
    // service itself.
    let kit = Kit::builder()
        .targets(servers.iter().map(|s| s.uri.clone()))
        .health(HealthConfig::new().mode(ProbeMode::Watch).service(GREETER))
        .build()?;
    if !kit.wait_until_ready(Duration::from_secs(5)).await {
        return Err("the greeters never became ready".into());
    }

    // The generated client takes the kit's channel as it takes a tonic `Channel`.
    let mut client = GreeterClient::new(kit.channel());
    let reply = client
        .say_hello(HelloRequest { name: "kit".into() })
        .await?
        .into_inner();
    println!("{} (from {})", reply.message, reply.server);
    if reply.message != "Hello, kit!" {
        return Err(format!("unexpected reply: {reply:?}").into());
    }

    let split = greet(&mut client, 30).await?;
    println!("30 calls, all serving:            {split:?}");
    expect(&split, &[("g0", 10), ("g1", 10), ("g2", 10)])?;

    // g1 stops serving the greeter (its health service says NOT_SERVING for
    // `greeter.v1.Greeter`): it leaves the rotation at once.
    servers[1]
        .health
        .set_not_serving::<GreeterServer<Greeting>>()
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while kit.eligible_targets().len() != 2 {
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("g1 never left the rotation: {kit:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let split = greet(&mut client, 30).await?;
    println!("30 calls, g1 NOT_SERVING greeter: {split:?}");
    expect(&split, &[("g0", 15), ("g2", 15)])?;

    kit.shutdown().await;
    for s in servers {
        s.shutdown().await?;
    }
    Ok(())
}

/// Makes `n` calls; counts the replies by server.
async fn greet(
    client: &mut GreeterClient<KitChannel>,
    n: usize,
) -> Result<BTreeMap<String, usize>, Status> {
    let mut split = BTreeMap::new();
    for i in 0..n {
        let request = HelloRequest {
            name: format!("caller {i}"),
        };
        let server = client.say_hello(request).await?.into_inner().server;
        *split.entry(server).or_insert(0) += 1;
    }
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

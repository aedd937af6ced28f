//! The kit from a configuration file: `examples/kit.toml` at the top of the repository, with its
//! addresses replaced by three local backends.
//!
//! ```text
//! cargo run -p grpc-client-kit --example config_file
//! ```

use std::time::Duration;

use grpc_client_kit::KitConfig;
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;

const FILE: &str = include_str!("../../../examples/kit.toml");

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backends = Backends::start(3).await?;
    let file = FILE
        .replace("127.0.0.1:50051", &backends[0].addr().to_string())
        .replace("127.0.0.1:50052", &backends[1].addr().to_string())
        .replace("127.0.0.1:50053", &backends[2].addr().to_string());

    let config = KitConfig::from_toml(&file)?; // unknown fields and bad types are refused here
    let kit = config.build()?; // every invalid value here, naming it; nothing starts then
    kit.wait_until_ready(Duration::from_secs(5)).await;
    let mut client = TestServiceClient::new(kit.channel());

    for _ in 0..40 {
        client.unary(Ping::default()).await?;
    }
    // b0 weighs 2, the others 1.
    let hits: Vec<u64> = backends.iter().map(|b| b.hits()).collect();
    println!("40 calls, weighted 2:1:1 -> {hits:?}");
    Ok(())
}

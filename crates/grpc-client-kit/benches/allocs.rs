//! Heap allocations per unary call, client side: the kit against tonic's
//! `Channel::balance_list` and a bare `Channel`, over three in-process backends.
//!
//! `cargo bench -p grpc-client-kit --bench allocs`
//!
//! A counting global allocator counts every allocation in the process, the in-process servers'
//! included; those are the same for every row, so the differences are the clients'.

use std::alloc::System;

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;

mod support;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const CALLS: u64 = 5_000;

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let backends = Backends::start(3).await.unwrap();
        let uris = backends.uris();
        let (kit, bare, list) = support::kit_bare_and_list(&uris).await;

        macro_rules! measure {
            ($name:expr, $client:expr) => {{
                let mut client = $client;
                for _ in 0..500 {
                    client.unary(Ping::default()).await.unwrap();
                }
                let region = Region::new(GLOBAL);
                for _ in 0..CALLS {
                    client.unary(Ping::default()).await.unwrap();
                }
                let per = region.change().allocations as f64 / CALLS as f64;
                println!(
                    "{:<14} {per:>6.1} allocations per call (client and server)",
                    $name
                );
                per
            }};
        }
        let bare = measure!("bare_channel", TestServiceClient::new(bare));
        let list = measure!("balance_list", TestServiceClient::new(list));
        let ours = measure!("kit", TestServiceClient::new(kit.channel()));
        println!(
            "kit - balance_list: {:+.1} per call; kit - bare_channel: {:+.1} per call",
            ours - list,
            ours - bare
        );
        kit.shutdown().await;
    });
}

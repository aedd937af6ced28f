//! The discover filter driving tonic's own `Channel::balance_channel` over three real backends:
//! a NOT_SERVING backend gets zero calls, and calls again once SERVING.

mod support;

use std::convert::Infallible;
use std::pin::Pin;
use std::time::Duration;

use futures_util::StreamExt;
use health_layer::{HealthChecker, HealthFilter, HealthVerdict, ProbeMode};
use support::hits_after;
use test_backends::Backends;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tonic::transport::channel::Change as TonicChange;
use tonic::transport::{Channel, Endpoint};
use tower::discover::Change;

const LIMIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_serving_backend_leaves_the_balanced_channel_and_comes_back() {
    let backends = Backends::start(3).await.unwrap();
    let checker = HealthChecker::builder()
        .mode(ProbeMode::Watch)
        .build()
        .unwrap();
    checker.start(Vec::<&str>::new()).unwrap();

    // Whatever discovers endpoints (a fixed list here), filtered by health.
    let discovered = futures_util::stream::iter(backends.uris().into_iter().map(|uri| {
        let endpoint = Endpoint::from_shared(uri.clone()).unwrap();
        Ok::<_, Infallible>(Change::Insert(uri, endpoint))
    }));
    let mut filter = Box::pin(HealthFilter::tonic_endpoints(discovered, checker.clone()));
    let (channel, changes) = Channel::balance_channel::<String>(16);
    let mut client = TestServiceClient::new(channel);

    // Forward exactly one filtered change, the way `drive_balance_channel` does, and say which.
    async fn forward(
        filter: &mut Pin<
            Box<
                HealthFilter<
                    impl tower::discover::Discover<Key = String, Service = Endpoint, Error = Infallible>
                    + futures_util::Stream,
                >,
            >,
        >,
        changes: &tokio::sync::mpsc::Sender<TonicChange<String, Endpoint>>,
    ) -> String {
        let change = tokio::time::timeout(LIMIT, filter.next())
            .await
            .expect("a change in time")
            .expect("the filter goes on")
            .unwrap();
        let (said, change) = match change {
            Change::Insert(k, e) => (format!("insert {k}"), TonicChange::Insert(k, e)),
            Change::Remove(k) => (format!("remove {k}"), TonicChange::Remove(k)),
        };
        changes.send(change).await.unwrap();
        said
    }

    // Every backend is inserted once its first Watch message says SERVING.
    let mut inserted: Vec<String> = Vec::new();
    for _ in 0..3 {
        inserted.push(forward(&mut filter, &changes).await);
    }
    inserted.sort();
    let mut want: Vec<String> = backends
        .uris()
        .iter()
        .map(|u| format!("insert {u}"))
        .collect();
    want.sort();
    assert_eq!(inserted, want);

    let mut ping = async || {
        client.unary(Ping::default()).await.unwrap();
    };
    let hits = hits_after(&backends, 60, &mut ping).await;
    assert!(hits.iter().all(|h| *h > 0), "{hits:?}");

    let b1 = backends[1].uri();
    backends[1].set_serving(false).await;
    assert_eq!(forward(&mut filter, &changes).await, format!("remove {b1}"));
    assert_eq!(
        checker.status(&b1).unwrap().verdict,
        HealthVerdict::Unhealthy
    );
    let hits = hits_after(&backends, 60, &mut ping).await;
    assert_eq!(hits[1], 0, "{hits:?}");
    assert_eq!(hits.iter().sum::<u64>(), 60);

    backends[1].set_serving(true).await;
    assert_eq!(forward(&mut filter, &changes).await, format!("insert {b1}"));
    let hits = hits_after(&backends, 60, &mut ping).await;
    assert!(hits[1] > 0, "back in the balanced channel: {hits:?}");
    checker.stop().await;
}

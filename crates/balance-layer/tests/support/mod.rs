//! Shared test helpers: counting no-op endpoints, discovery streams, a request type.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::{Ready, ready};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use balance_layer::error::BoxError;
use balance_layer::{RequestDeadline, RequestHashKey};
use endpoint_state::{EndpointCard, HasCard};
use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tower::discover::Change;
use tower::{Service, ServiceExt};

/// A request that may carry a deadline (as `grpc-timeout` would).
#[derive(Debug, Default, Clone, Copy)]
pub struct Req {
    pub budget: Option<Duration>,
}

impl RequestDeadline for Req {
    fn time_budget(&self) -> Option<Duration> {
        self.budget
    }
}

/// No hash: under ring hash, a call goes to a random endpoint.
impl RequestHashKey for Req {}

/// An always-ready endpoint that answers its own name at once and counts its calls and its
/// clones.
#[derive(Debug)]
pub struct Counted {
    pub name: Arc<str>,
    pub card: Option<EndpointCard>,
    pub hits: Arc<AtomicUsize>,
    pub clones: Arc<AtomicUsize>,
}

impl Clone for Counted {
    fn clone(&self) -> Self {
        self.clones.fetch_add(1, Ordering::SeqCst);
        Counted {
            name: self.name.clone(),
            card: self.card.clone(),
            hits: self.hits.clone(),
            clones: self.clones.clone(),
        }
    }
}

impl Counted {
    pub fn carded(name: &str) -> Self {
        Counted {
            name: name.into(),
            card: Some(EndpointCard::new(name)),
            hits: Arc::default(),
            clones: Arc::default(),
        }
    }

    pub fn plain(name: &str) -> Self {
        Counted {
            name: name.into(),
            card: None,
            hits: Arc::default(),
            clones: Arc::default(),
        }
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    pub fn clones(&self) -> usize {
        self.clones.load(Ordering::SeqCst)
    }

    /// How many clones of this endpoint are alive (this one included).
    pub fn alive(&self) -> usize {
        Arc::strong_count(&self.hits)
    }

    pub fn card(&self) -> &EndpointCard {
        self.card.as_ref().expect("a carded endpoint")
    }
}

impl HasCard for Counted {
    fn card(&self) -> Option<&EndpointCard> {
        self.card.as_ref()
    }
}

impl<R> Service<R> for Counted {
    type Response = Arc<str>;
    type Error = Infallible;
    type Future = Ready<Result<Arc<str>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: R) -> Self::Future {
        self.hits.fetch_add(1, Ordering::SeqCst);
        ready(Ok(self.name.clone()))
    }
}

/// `n` carded endpoints named `b0`..`b{n-1}`.
pub fn carded(n: usize) -> Vec<Counted> {
    (0..n).map(|i| Counted::carded(&format!("b{i}"))).collect()
}

/// A discovery that inserts `services` (keyed by name) and then ends.
pub fn list<S>(
    services: &[(Arc<str>, S)],
) -> impl Stream<Item = Result<Change<String, S>, Infallible>> + Send + use<S>
where
    S: Clone + Send + 'static,
{
    let changes: Vec<_> = services
        .iter()
        .map(|(name, svc)| Ok(Change::Insert(name.to_string(), svc.clone())))
        .collect();
    futures_util::stream::iter(changes)
}

/// A discovery of `Counted` endpoints keyed by their names.
pub fn list_counted(
    endpoints: &[Counted],
) -> impl Stream<Item = Result<Change<String, Counted>, Infallible>> + Send + use<> {
    let pairs: Vec<_> = endpoints
        .iter()
        .map(|e| (e.name.clone(), e.clone()))
        .collect();
    list(&pairs)
}

/// A discovery stream of changes that never fails.
pub type Changes<K, S> = futures_util::stream::Map<
    ReceiverStream<Change<K, S>>,
    fn(Change<K, S>) -> Result<Change<K, S>, Infallible>,
>;

/// A discovery fed through a bounded channel of capacity `capacity`.
pub fn channel<K: Send + 'static, S: Send + 'static>(
    capacity: usize,
) -> (mpsc::Sender<Change<K, S>>, Changes<K, S>) {
    let (tx, rx) = mpsc::channel(capacity);
    (tx, ReceiverStream::new(rx).map(Ok as fn(_) -> _))
}

/// Calls per endpoint name.
pub fn tally<I: IntoIterator<Item = Arc<str>>>(names: I) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for n in names {
        *out.entry(n.to_string()).or_default() += 1;
    }
    out
}

/// Lets the balancer's background task run until `done` holds (bounded: panics after ~5 s of
/// real time, which only a broken balancer reaches).
pub async fn settle(mut done: impl FnMut() -> bool) {
    for _ in 0..50_000 {
        if done() {
            return;
        }
        tokio::task::yield_now().await;
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    panic!("the balancer did not settle");
}

/// One call: `ready`, then `call`.
pub async fn call<S>(svc: &mut S, req: Req) -> Result<Arc<str>, BoxError>
where
    S: Service<Req, Response = Arc<str>, Error = BoxError>,
{
    svc.ready().await?.call(req).await
}

/// `n` sequential calls, each of which must succeed; the names of the endpoints that answered.
pub async fn calls<S>(svc: &mut S, n: usize) -> Vec<Arc<str>>
where
    S: Service<Req, Response = Arc<str>, Error = BoxError>,
{
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(call(svc, Req::default()).await.unwrap());
    }
    out
}

//! Half-open without queues: a long server stream holding the only probe permit makes its
//! target ineligible for every other call — the card says so, the balancer sends the calls
//! elsewhere at once, and with nowhere else to go the passive-signal rule answers (the call
//! is admitted degraded) instead of an unbounded wait for the permit.

mod support;

use std::convert::Infallible;
use std::time::Duration;

use balance_layer::{Balance, BalanceConfig};
use breaker_layer::{Breaker, BreakerConfig, BreakerLayer};
use endpoint_state::{Admission, EndpointCard, Peers};
use futures_util::FutureExt;
use http::Request;
use http_body::Body;
use support::{Answer, Reply, Script, fails, is_open, run, send};
use tower::discover::Change;
use tower::{Layer, Service, ServiceExt};

/// Trips on one failure, open for 1 s, one probe permit.
fn config() -> BreakerConfig {
    BreakerConfig::default()
        .consecutive_failures(1)
        .open_base(std::time::Duration::from_secs(1))
        .open_jitter(0.0)
        .half_open_permits(1)
}

fn named(name: &str) -> (Breaker<Script>, Script, EndpointCard) {
    let card = EndpointCard::new(name);
    let script = Script::new();
    let layer = BreakerLayer::new(card.clone(), config()).unwrap();
    (layer.layer(script.clone()), script, card)
}

/// Trips `svc`, lets the open period pass, and starts a probe that is a long server stream:
/// its headers and first message arrive, and the stream goes on. The returned response holds
/// the only permit until its body ends or is dropped.
async fn streaming_probe(
    svc: &mut Breaker<Script>,
    script: &Script,
    card: &EndpointCard,
) -> Answer {
    run(svc, script, &fails(1)).await;
    assert!(is_open(card));
    tokio::time::advance(Duration::from_secs(1)).await;
    script.push([Reply::HangBody]);
    let mut probe = send(svc).await.unwrap();
    let first = std::future::poll_fn(|cx| std::pin::Pin::new(probe.body_mut()).poll_frame(cx))
        .await
        .unwrap()
        .unwrap();
    assert!(first.is_data(), "the stream's first message");
    probe
}

fn discovery(
    svcs: Vec<(&str, Breaker<Script>)>,
) -> impl futures_util::Stream<Item = Result<Change<String, Breaker<Script>>, Infallible>> + use<> {
    let changes: Vec<_> = svcs
        .into_iter()
        .map(|(name, svc)| Ok(Change::Insert(name.to_owned(), svc)))
        .collect();
    futures_util::stream::iter(changes)
}

/// Lets the balancer's task run until `done` holds (bounded).
async fn settle(mut done: impl FnMut() -> bool) {
    for _ in 0..1_000 {
        if done() {
            return;
        }
        tokio::task::yield_now().await;
    }
    assert!(done(), "the balancer did not settle");
}

#[tokio::test(start_paused = true)]
async fn a_stream_holding_the_only_permit_makes_its_target_ineligible() {
    let (mut b1, script, card) = named("b1");
    let probe = streaming_probe(&mut b1, &script, &card).await;
    assert!(
        !card.is_eligible(),
        "every probe permit is taken: {:?}",
        card.breaker()
    );
    let why = card.eligibility().unwrap_err().to_string();
    assert_eq!(
        why,
        "b1: breaker half-open, every probe permit taken (open period ended; probing after \
         1 consecutive failure (last: UNAVAILABLE: scripted))"
    );

    // The stream ends (its caller drops it): the permit is free, the target eligible again.
    drop(probe);
    assert!(card.is_eligible(), "{:?}", card.breaker());
}

#[tokio::test(start_paused = true)]
async fn other_calls_go_to_other_targets_at_once() {
    let (mut b1, script1, card1) = named("b1");
    let (b2, script2, _card2) = named("b2");
    let mut balance = Balance::<_, Request<()>>::new(
        discovery(vec![("b1", b1.clone()), ("b2", b2)]),
        BalanceConfig::new(),
    )
    .unwrap();
    let _probe = streaming_probe(&mut b1, &script1, &card1).await;
    settle(|| balance.eligible_targets().len() == 1).await;
    assert_eq!(balance.eligible_targets(), ["b2".into()]);

    // Every call is admitted and answered at once, by b2.
    for i in 0..10 {
        let call = async {
            let svc = balance.ready().await.unwrap();
            let resp = svc.call(Request::new(())).await.unwrap();
            http_body_util::BodyExt::collect(resp.into_body())
                .await
                .unwrap()
        };
        assert!(call.now_or_never().is_some(), "call {i} had to wait");
    }
    assert_eq!(script2.calls(), 10);
    assert_eq!(
        script1.calls(),
        2,
        "b1: the failure and the probe, nothing else"
    );
}

#[tokio::test(start_paused = true)]
async fn with_no_other_target_the_rule_answers_without_waiting_for_the_permit() {
    let (mut b1, script, card) = named("b1");
    let mut balance =
        Balance::<_, Request<()>>::new(discovery(vec![("b1", b1.clone())]), BalanceConfig::new())
            .unwrap();
    let _probe = streaming_probe(&mut b1, &script, &card).await;
    // Admitted at once (degraded), not queued behind the stream.
    let call = tokio::time::timeout(Duration::from_secs(1), async {
        let svc = balance.ready().await.unwrap();
        svc.call(Request::new(())).await.unwrap()
    })
    .await;
    assert!(call.is_ok(), "the call waited for the permit");
    assert_eq!(script.calls(), 3, "the failure, the probe, and this call");
    assert!(card.peers().is_some(), "the balancer's endpoints are peers");
    assert_eq!(
        card.admission(),
        Admission::Degraded,
        "no peer is eligible: passive signals never empty the choice"
    );
}

#[tokio::test(start_paused = true)]
async fn a_busy_half_open_peer_is_no_witness() {
    let (mut b1, script, card1) = named("b1");
    let card2 = EndpointCard::new("b2");
    let peers = Peers::new();
    peers.add(&card1);
    peers.add(&card2);
    let _probe = streaming_probe(&mut b1, &script, &card1).await;
    card2.quarantine_for(Duration::from_secs(5), Some("UNAVAILABLE".into()));
    // b1 takes no call while its stream holds the permit: it cannot keep b2 shut.
    assert_eq!(card2.admission(), Admission::Degraded);
    assert!(!peers.any_eligible());
}

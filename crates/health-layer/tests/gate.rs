//! `Health<S>`: pending while the card's health line is shut, woken when it opens, never an
//! error of its own.

use endpoint_state::HasCard;
use health_layer::{EndpointCard, Health, HealthLayer, HealthVerdict};
use tokio_test::{assert_pending, assert_ready_err, assert_ready_ok};
use tower::Layer;
use tower_test::mock;

type Gated = mock::Spawn<Health<mock::Mock<u32, u32>>>;

fn gated(card: &EndpointCard) -> (Gated, mock::Handle<u32, u32>) {
    let (svc, handle) = mock::pair::<u32, u32>();
    (
        mock::Spawn::new(HealthLayer::new(card.clone()).layer(svc)),
        handle,
    )
}

#[tokio::test]
async fn pending_while_unknown_or_unhealthy_then_woken_and_ready() {
    let card = EndpointCard::new("b1");
    card.set_health(HealthVerdict::Unknown, None);
    let (mut svc, mut handle) = gated(&card);
    handle.allow(10);

    assert_pending!(svc.poll_ready());
    card.set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    assert!(svc.is_woken(), "a change of the card wakes the waiter");
    assert_pending!(svc.poll_ready());
    assert!(!svc.is_woken());

    card.set_health(HealthVerdict::Healthy, None);
    assert!(svc.is_woken());
    assert_ready_ok!(svc.poll_ready());

    // Calls go straight to the inner service.
    let response = svc.call(7);
    let (request, send) = handle.next_request().await.unwrap();
    assert_eq!(request, 7);
    send.send_response(8);
    assert_eq!(response.await.unwrap(), 8);

    // And it shuts again.
    card.set_health(HealthVerdict::Unhealthy, Some("NOT_SERVING".into()));
    assert_pending!(svc.poll_ready());
}

#[tokio::test]
async fn the_inner_readiness_still_applies_and_its_error_passes_unchanged() {
    let card = EndpointCard::new("b1");
    card.set_health(HealthVerdict::Healthy, None);
    let (mut svc, mut handle) = gated(&card);
    handle.allow(0);
    assert_pending!(svc.poll_ready(), "the inner service is not ready");
    handle.allow(1);
    assert!(svc.is_woken());
    assert_ready_ok!(svc.poll_ready());

    let (mut svc, mut handle) = gated(&card);
    handle.send_error("inner failure");
    let err = assert_ready_err!(svc.poll_ready());
    assert_eq!(err.to_string(), "inner failure");
}

#[tokio::test]
async fn a_card_no_checker_watches_does_not_shut_the_gate() {
    let card = EndpointCard::new("b1"); // NotChecked
    let (mut svc, mut handle) = gated(&card);
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
}

#[test]
fn it_carries_its_card_and_unwraps() {
    let card = EndpointCard::new("b1");
    let svc = Health::new(5u8, card.clone());
    assert!(HasCard::card(&svc).unwrap().same_card(&card));
    assert_eq!(*svc.get_ref(), 5);
    assert_eq!(svc.clone().into_inner(), 5);
    assert!(format!("{svc:?}").contains("b1"));
}

//! Quarantine against real tonic servers over loopback: a refused connection, a local timeout,
//! a status in the trailers, and codes that must not quarantine (real time, generous bounds).

use std::time::Duration;

use endpoint_state::EndpointCard;
use quarantine_layer::{Quarantine, QuarantineGroup};
use test_backends::Backend;
use test_backends::fixture::{self, LocalTimeout};
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::Channel;

type Client = TestServiceClient<Quarantine<Channel>>;

/// A client for `b` whose stack is under quarantine, in a group with one other (eligible)
/// member so that the quarantine is enforced.
fn client(b: &Backend, channel: Channel) -> (Client, EndpointCard, QuarantineGroup) {
    let group = QuarantineGroup::default();
    group.add(EndpointCard::new("peer"));
    let card = EndpointCard::new(b.name());
    let svc = Quarantine::new(channel, &group, card.clone());
    (TestServiceClient::new(svc), card, group)
}

fn remaining(card: &EndpointCard) -> Option<Duration> {
    let until = card.quarantine_state().until?;
    Some(until.saturating_duration_since(Instant::now()))
}

fn assert_quarantined_about_5s(card: &EndpointCard) {
    let left = remaining(card).expect("quarantined");
    assert!(
        left > Duration::from_secs(3) && left <= Duration::from_secs(5),
        "{left:?}"
    );
}

#[tokio::test]
async fn a_refused_connection_quarantines() {
    let (b, channel) = fixture::refused("b0").await.unwrap();
    let (mut c, card, _group) = client(&b, channel);
    let err = c.unary(Ping::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_quarantined_about_5s(&card);
    let why = card.eligibility().unwrap_err().to_string().to_lowercase();
    assert!(
        why.contains("after unavailable") && why.contains("refused"),
        "{why}"
    );
}

#[tokio::test]
async fn a_local_timeout_quarantines() {
    let slow = LocalTimeout::start("b0").await.unwrap();
    let (mut c, card, _group) = client(&slow.backend, slow.channel.clone());
    let err = c.unary(Ping::default()).await.unwrap_err();
    LocalTimeout::assert_cancelled(&err);
    assert_quarantined_about_5s(&card);
    let why = card.eligibility().unwrap_err().to_string();
    assert!(why.contains("after DEADLINE_EXCEEDED"), "{why}");
}

#[tokio::test]
async fn unavailable_in_the_trailers_of_a_stream_quarantines() {
    let b = Backend::start("b0").await.unwrap();
    let channel = fixture::connect(&b).await;
    let (mut c, card, _group) = client(&b, channel);
    let mut stream = fixture::failing_stream(&b, &mut c, Code::Unavailable).await;
    assert!(stream.message().await.unwrap().is_some());
    assert!(remaining(&card).is_none(), "not known before the trailers");
    let err = stream.message().await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_quarantined_about_5s(&card);
}

#[tokio::test]
async fn client_errors_and_internal_do_not_quarantine() {
    let b = Backend::start("b0").await.unwrap();
    let channel = fixture::connect(&b).await;
    let (mut c, card, _group) = client(&b, channel);
    for code in [
        Code::InvalidArgument,
        Code::NotFound,
        Code::PermissionDenied,
        Code::Internal,
    ] {
        b.fail_next(1, code);
        assert_eq!(c.unary(Ping::default()).await.unwrap_err().code(), code);
    }
    assert!(c.unary(Ping::default()).await.is_ok());
    assert!(card.eligibility().is_ok());
    assert_eq!(b.hits(), 5);
}

//! The kit against every server implementation, in `Watch` and `Check` mode, with the servers'
//! default settings and with what production servers set (max connection age with grace, max
//! connection idle, keepalive enforcement): routing by health, stops, kills, restarts, every
//! target down, an unknown service name, a server without the health service, and an idle soak
//! with a steady caller during which nothing may change.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use grpc_client_kit::Kit;
use grpc_client_kit::health::{HealthConfig, ProbeMode};
use grpc_client_kit::state::HealthVerdict;
use test_backends::pb::Ping;
use test_backends::pb::test_service_client::TestServiceClient;
use tokio::time::Instant;
use tonic::Code;
use tonic_health::ServingStatus;

use crate::support::{Implementation, InteropBackend, ServerSettings};

/// How the kit checks health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Watch,
    Check,
}

/// Which server settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settings {
    /// The implementation's defaults.
    Defaults,
    /// What production servers set, short enough to bite within seconds (only what the
    /// implementation supports): max connection age 3 s with 1 s grace, max idle 2 s,
    /// keepalive enforcement (pings closer than 1.5 s are strikes; C-core tolerates one).
    Production,
}

impl Settings {
    fn of(self, imp: Implementation) -> ServerSettings {
        match self {
            Settings::Defaults => ServerSettings::defaults(),
            Settings::Production => ServerSettings {
                max_connection_age: Some(Duration::from_secs(3)),
                ..ServerSettings::production(imp)
            },
        }
    }
}

const LIMIT: Duration = Duration::from_secs(15);

fn health(mode: Mode, interval: Duration) -> HealthConfig {
    let config = HealthConfig::new()
        .timeout(Duration::from_secs(2))
        .interval(interval);
    match mode {
        Mode::Watch => config.mode(ProbeMode::Watch),
        Mode::Check => config,
    }
}

async fn backends(imp: Implementation, settings: &ServerSettings) -> Vec<InteropBackend> {
    let mut out = Vec::new();
    for name in ["b0", "b1", "b2"] {
        out.push(InteropBackend::start(imp, name, settings).await);
    }
    out
}

fn uris(backends: &[InteropBackend]) -> Vec<String> {
    backends.iter().map(InteropBackend::uri).collect()
}

type Client = TestServiceClient<grpc_client_kit::KitChannel>;

/// `n` sequential calls: how many each backend answered, and the failures.
async fn calls(client: &mut Client, n: usize) -> (BTreeMap<String, usize>, Vec<tonic::Status>) {
    let mut answered = BTreeMap::new();
    let mut failed = Vec::new();
    for _ in 0..n {
        match client.unary(Ping::default()).await {
            Ok(pong) => *answered.entry(pong.into_inner().backend).or_default() += 1,
            Err(status) => failed.push(status),
        }
    }
    (answered, failed)
}

fn split(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(b, n)| ((*b).to_owned(), *n))
        .collect()
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !cond() {
        assert!(Instant::now() < deadline, "not within {LIMIT:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn eligible(kit: &Kit) -> Vec<String> {
    let mut names: Vec<String> = kit
        .eligible_targets()
        .iter()
        .map(|t| t.to_string())
        .collect();
    names.sort();
    names
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Routing by health, stops, kills, restarts and every target down, with one kit over three
/// backends of `imp`; then an unknown service name and a server without the health service.
pub(crate) async fn behaviour(imp: Implementation, mode: Mode, settings: Settings) {
    let server = settings.of(imp);
    let mut bs = backends(imp, &server).await;
    let all = sorted(uris(&bs));
    let kit = Kit::builder()
        .targets(uris(&bs))
        .health(health(mode, Duration::from_secs(1)))
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(kit.channel());
    let tag = format!("{imp} {mode:?} {settings:?}");

    // The first call, right after build: the targets are connecting, the call waits.
    client
        .unary(Ping::default())
        .await
        .unwrap_or_else(|s| panic!("{tag}: the first call: {s:?}"));
    eventually("every target eligible", || eligible(&kit) == all).await;

    // 20/20/20 → 30/0/30 → back.
    let (answered, failed) = calls(&mut client, 60).await;
    assert!(failed.is_empty(), "{tag}: {failed:?}");
    assert_eq!(
        answered,
        split(&[("b0", 20), ("b1", 20), ("b2", 20)]),
        "{tag}"
    );
    bs[1].set_health("", ServingStatus::NotServing).await;
    let without_b1 = sorted(vec![bs[0].uri(), bs[2].uri()]);
    eventually("b1 out", || eligible(&kit) == without_b1).await;
    let (answered, failed) = calls(&mut client, 60).await;
    assert!(failed.is_empty(), "{tag}: {failed:?}");
    assert_eq!(answered, split(&[("b0", 30), ("b2", 30)]), "{tag}");
    bs[1].set_health("", ServingStatus::Serving).await;
    eventually("b1 back", || eligible(&kit) == all).await;
    let (answered, failed) = calls(&mut client, 60).await;
    assert!(failed.is_empty(), "{tag}: {failed:?}");
    assert_eq!(
        answered,
        split(&[("b0", 20), ("b1", 20), ("b2", 20)]),
        "{tag}"
    );

    // Every target NOT_SERVING: UNAVAILABLE naming each one and why.
    for b in &bs {
        b.set_health("", ServingStatus::NotServing).await;
    }
    eventually("nothing eligible", || eligible(&kit).is_empty()).await;
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{tag}: {status:?}");
    for uri in &all {
        assert!(
            status
                .message()
                .contains(&format!("{uri}: unhealthy (NOT_SERVING)")),
            "{tag}: {}",
            status.message()
        );
    }
    for b in &bs {
        b.set_health("", ServingStatus::Serving).await;
    }
    eventually("all back", || eligible(&kit) == all).await;

    // A graceful stop, under a sequential caller: no call lost; the port then refuses, and the
    // target leaves the rotation. Then a restart on the same port brings it back.
    let caller = Caller::start(kit.channel());
    let window = Instant::now();
    bs[2].stop_graceful(Duration::from_secs(1)).await;
    let without_b2 = sorted(vec![bs[0].uri(), bs[1].uri()]);
    eventually("b2 out after its graceful stop", || {
        eligible(&kit) == without_b2
    })
    .await;
    bs[2].restart().await;
    eventually("b2 back after the restart", || eligible(&kit) == all).await;
    let (ok, failed) = caller.stop().await;
    let failed = not_forced_closes(imp, settings, window.elapsed(), failed, &tag);
    assert!(ok > 0, "{tag}: the caller made calls");
    assert!(
        failed.is_empty(),
        "{tag}: a graceful stop costs no call: {failed:?}"
    );

    // kill -9, under a sequential caller: at most the call in flight is lost.
    let caller = Caller::start(kit.channel());
    let window = Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    bs[2].kill().await;
    eventually("b2 out after kill -9", || eligible(&kit) == without_b2).await;
    bs[2].restart().await;
    eventually("b2 back after the restart", || eligible(&kit) == all).await;
    let (ok, failed) = caller.stop().await;
    let failed = not_forced_closes(imp, settings, window.elapsed(), failed, &tag);
    assert!(ok > 0, "{tag}: the caller made calls");
    assert!(
        failed.len() <= 1,
        "{tag}: kill -9 costs at most the call in flight: {failed:?}"
    );
    let b2_calls = calls(&mut client, 30).await.0;
    assert_eq!(b2_calls.get("b2"), Some(&10), "{tag}: {b2_calls:?}");
    kit.shutdown().await;

    // An unknown service name: every target unhealthy, and the error says so.
    let unknown = Kit::builder()
        .targets(uris(&bs))
        .health(health(mode, Duration::from_secs(1)).service("no.such.Service"))
        .build()
        .unwrap();
    let mut client = TestServiceClient::new(unknown.channel());
    let started = Instant::now();
    let status = client.unary(Ping::default()).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{tag}: fails as soon as every target has answered, not after the connecting wait: {:?}",
        started.elapsed()
    );
    assert_eq!(status.code(), Code::Unavailable, "{tag}: {status:?}");
    for uri in &all {
        let named = status.message().contains(&format!("{uri}: unhealthy (NOT_FOUND: unknown service \"no.such.Service\""))
            || status.message().contains(&format!(
                "{uri}: unhealthy (SERVICE_UNKNOWN: the server does not know service \"no.such.Service\")"
            ));
        assert!(named, "{tag}: {}", status.message());
    }
    unknown.shutdown().await;
    drop(bs);

    // A server without the health service: healthy (gRFC A17), calls flow.
    let bare = backends(
        imp,
        &ServerSettings {
            health: false,
            ..server
        },
    )
    .await;
    let kit = Kit::builder()
        .targets(uris(&bare))
        .health(health(mode, Duration::from_secs(1)))
        .build()
        .unwrap();
    let bare_all = sorted(uris(&bare));
    eventually("every target without a health service eligible", || {
        eligible(&kit) == bare_all
    })
    .await;
    let mut client = TestServiceClient::new(kit.channel());
    let (answered, failed) = calls(&mut client, 60).await;
    assert!(failed.is_empty(), "{tag}: {failed:?}");
    assert_eq!(
        answered,
        split(&[("b0", 20), ("b1", 20), ("b2", 20)]),
        "{tag}"
    );
    for b in &bare {
        let card = kit.card(&b.uri()).unwrap();
        assert_eq!(card.health_verdict(), HealthVerdict::Healthy, "{tag}");
    }
    kit.shutdown().await;
}

/// The failures of a sequential caller over `window` that are not explained by tonic's forced
/// close. tonic's server with a max connection age and a grace closes every connection when
/// both have passed, abruptly and without a `GOAWAY` (`production.rs` shows it), so a call in
/// flight then fails with a transport error whatever the client: the server's choice, not the
/// scenario's doing. For tonic with production settings, such failures (`UNAVAILABLE`, the
/// connection reset or its pipe broken) are taken out and printed, at most one per connection
/// lifetime begun on each of the three backends in the window (the caller has one call in
/// flight at a time); every other failure, and every failure elsewhere, is returned.
fn not_forced_closes(
    imp: Implementation,
    settings: Settings,
    window: Duration,
    failed: Vec<tonic::Status>,
    tag: &str,
) -> Vec<tonic::Status> {
    let server = settings.of(imp);
    let (Implementation::Tonic, Some(age), Some(grace)) = (
        imp,
        server.max_connection_age,
        server.max_connection_age_grace,
    ) else {
        return failed;
    };
    let forced = |s: &tonic::Status| {
        s.code() == Code::Unavailable
            && (s.message().contains("connection reset") || s.message().contains("broken pipe"))
    };
    let (closes, rest): (Vec<_>, Vec<_>) = failed.into_iter().partition(forced);
    // One call in flight at a time, on one of the three backends' connections.
    let most = 3 * (window.as_secs_f64() / (age + grace).as_secs_f64()).ceil() as usize;
    assert!(
        closes.len() <= most,
        "{tag}: more calls lost to tonic's forced closes than it made in {window:?}: {closes:?}"
    );
    if !closes.is_empty() {
        println!(
            "{tag}: {} call(s) in flight when tonic force-closed their connection at its age + \
             grace: {closes:?}",
            closes.len()
        );
    }
    rest
}

/// Each backend's card version, in the order of `bs`.
fn card_versions(kit: &Kit, bs: &[InteropBackend]) -> Vec<u64> {
    bs.iter()
        .map(|b| kit.card(&b.uri()).unwrap().version())
        .collect()
}

/// The probe connections the checker has made to each backend, in the order of `bs`.
fn probe_connections(kit: &Kit, bs: &[InteropBackend]) -> Vec<u64> {
    bs.iter()
        .map(|b| kit.checker().unwrap().status(&b.uri()).unwrap().connections)
        .collect()
}

/// A kit over `bs` with `Watch` probes that ping every `keepalive` and verify nothing
/// (interval 0: a verifying `Check`'s data would reset the servers' ping strikes), once every
/// target is eligible.
async fn ready_watch_kit(bs: &[InteropBackend], keepalive: Duration) -> Kit {
    let all = sorted(uris(bs));
    let kit = Kit::builder()
        .targets(uris(bs))
        .health(health(Mode::Watch, Duration::ZERO).probe_keepalive(Some(keepalive)))
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(LIMIT).await);
    eventually("every target eligible", || eligible(&kit) == all).await;
    kit
}

/// The health transitions received since subscribing. A target's first verdict
/// (`health unknown` → `healthy`) can reach a subscriber made just after the card showed it:
/// the checker writes the card, then sends the event (a preempted publisher makes the gap
/// visible). Health is `unknown` only until a target's first verdict, so such an event is
/// never a change during a soak: it is left out. (Every other change, of any line, also moves
/// the card's version, which the soaks compare.)
fn transitions_since(
    transitions: &mut tokio::sync::broadcast::Receiver<grpc_client_kit::state::CardEvent>,
) -> Vec<grpc_client_kit::state::CardEvent> {
    let first = grpc_client_kit::state::LineState::Health(HealthVerdict::Unknown);
    std::iter::from_fn(|| transitions.try_recv().ok())
        .filter(|event| event.from != first)
        .collect()
}

/// A sequential caller in the background: calls until stopped, every `PACE`.
struct Caller {
    stop: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<(u64, Vec<tonic::Status>)>,
}

impl Caller {
    fn start(channel: grpc_client_kit::KitChannel) -> Self {
        Self::with_pace(channel, Duration::from_millis(20))
    }

    fn with_pace(channel: grpc_client_kit::KitChannel, pace: Duration) -> Self {
        let stop = Arc::new(AtomicU64::new(0));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut client = TestServiceClient::new(channel);
            let (mut ok, mut failed) = (0, Vec::new());
            while flag.load(Ordering::Acquire) == 0 {
                let mut request = tonic::Request::new(Ping::default());
                request.set_timeout(Duration::from_secs(5));
                match client.unary(request).await {
                    Ok(_) => ok += 1,
                    Err(status) => failed.push(status),
                }
                tokio::time::sleep(pace).await;
            }
            (ok, failed)
        });
        Caller { stop, task }
    }

    async fn stop(self) -> (u64, Vec<tonic::Status>) {
        self.stop.store(1, Ordering::Release);
        self.task.await.unwrap()
    }
}

/// An idle soak: three backends, a steady caller, nothing changing on the servers, for
/// `duration`. Not one eligibility change, not one failed call.
///
/// With the servers' defaults the soak lasts past the point where C-core's and grpc-go's
/// default keepalive enforcement (a ping without data every 5 minutes, 2 strikes) cut off the
/// 10 s Watch keepalive the checker used to force (at about 40 s). With production settings,
/// connections are closed for their age (3 s + 1 s grace) and idleness (2 s) several times
/// over — at least three times for every probe connection, counted — the probes of `Check` mode
/// (every 3 s) find their connection closed for idleness between checks, the caller's
/// connections go idle between its calls. (No probe keepalive of the checker's own here: the
/// shortest it takes, 1 s, needs four pings for a server to refuse it, longer than a probe
/// connection lives at these settings; the refusal and the doubling are shown by
/// [`soak_with_a_10s_keepalive`], against servers at their default settings.)
pub(crate) async fn soak(imp: Implementation, mode: Mode, settings: Settings) {
    let duration = match settings {
        // Past the 40 s at which the old checker's Watch streams were cut off, where servers
        // enforce pings; the others enforce nothing.
        Settings::Defaults if imp.enforces_pings() => Duration::from_secs(45),
        Settings::Defaults => Duration::from_secs(10),
        // Age (3 s + 1 s grace) three times over and more; idleness (2 s) more.
        Settings::Production => Duration::from_secs(18),
    };
    let server = settings.of(imp);
    let bs = backends(imp, &server).await;
    let all = sorted(uris(&bs));
    let health = health(mode, Duration::from_secs(3));
    let kit = Kit::builder()
        .targets(uris(&bs))
        .health(health)
        .build()
        .unwrap();
    assert!(kit.wait_until_ready(LIMIT).await);
    eventually("every target eligible", || eligible(&kit) == all).await;
    let tag = format!("{imp} {mode:?} {settings:?} soak");

    // Every change of any target's card (health, quarantine, breaker) is an eligibility change.
    let versions = card_versions(&kit, &bs);
    let mut transitions = kit.checker().unwrap().subscribe();
    // With production settings, slow enough that each target's application connection goes
    // idle (2 s) between calls, so that idleness closes it under the caller too.
    let pace = match settings {
        Settings::Defaults => Duration::from_millis(250),
        Settings::Production => Duration::from_millis(800),
    };
    let caller = Caller::with_pace(kit.channel(), pace);
    let connected = probe_connections(&kit, &bs);
    let started = Instant::now();
    let mut smallest = all.len();
    while started.elapsed() < duration {
        smallest = smallest.min(kit.eligible_targets().len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (ok, failed) = caller.stop().await;
    let changes = transitions_since(&mut transitions);
    let after = card_versions(&kit, &bs);
    let replaced: Vec<u64> = probe_connections(&kit, &bs)
        .iter()
        .zip(&connected)
        .map(|(now, before)| now - before)
        .collect();
    println!(
        "{tag}: {:.0} s, {ok} calls, {} failed, {} health transitions, smallest eligible set \
         {smallest}, probe connections replaced per target {replaced:?}",
        duration.as_secs_f64(),
        failed.len(),
        changes.len()
    );
    if settings == Settings::Production {
        // Each target's probe connection was closed by the server (age, idleness, refused
        // pings) at least three times — and no verdict changed.
        assert!(
            replaced.iter().all(|n| *n >= 3),
            "{tag}: the settings bit at least three times: {replaced:?}"
        );
    }
    assert!(failed.is_empty(), "{tag}: failed calls: {failed:?}");
    assert!(changes.is_empty(), "{tag}: health transitions: {changes:?}");
    assert_eq!(
        versions, after,
        "{tag}: a card changed (quarantine, breaker or health)"
    );
    assert_eq!(smallest, all.len(), "{tag}: the eligible set shrank");
    assert!(
        ok as f64 >= 0.8 * duration.as_secs_f64() / pace.as_secs_f64(),
        "{tag}: a steady caller ({ok} calls)"
    );
    kit.shutdown().await;
}

/// The soak of the issue that started this matrix: `Watch` probes with a 10 s keepalive (the
/// checker used to force one) against a server with its default ping enforcement (a ping
/// without data every 5 minutes at most, 2 strikes). The server closes the connection with
/// `GOAWAY too_many_pings` after 30–40 s; the checker reconnects, keeps every verdict and
/// doubles the keepalive (gRFC A8). Not one eligibility change, not one failed call. (Quiet
/// streams are not verified here — interval 0 — since the data of a verifying `Check` resets
/// the server's strikes, which is how the checker stays clear of the policy by default.)
pub(crate) async fn soak_with_a_10s_keepalive(imp: Implementation) {
    let bs = backends(imp, &ServerSettings::defaults()).await;
    let kit = ready_watch_kit(&bs, Duration::from_secs(10)).await;
    let tag = format!("{imp} Watch defaults with a 10 s probe keepalive");
    let versions = card_versions(&kit, &bs);
    let mut transitions = kit.checker().unwrap().subscribe();
    let caller = Caller::with_pace(kit.channel(), Duration::from_millis(250));
    let doubled = || {
        bs.iter().all(|b| {
            let status = kit.checker().unwrap().status(&b.uri()).unwrap();
            status.probe_keepalive == Some(Duration::from_secs(20))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !doubled() {
        assert!(
            Instant::now() < deadline,
            "{tag}: the server did not refuse the pings within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A few seconds more on the new connections.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (ok, failed) = caller.stop().await;
    let changes = transitions_since(&mut transitions);
    let after = card_versions(&kit, &bs);
    println!(
        "{tag}: keepalive doubled to 20 s on every target; {ok} calls, {} failed, {} transitions",
        failed.len(),
        changes.len()
    );
    assert!(failed.is_empty(), "{tag}: failed calls: {failed:?}");
    assert!(changes.is_empty(), "{tag}: health transitions: {changes:?}");
    assert_eq!(versions, after, "{tag}: a card changed");
    kit.shutdown().await;
}

/// A production server's ping enforcement and the shortest probe keepalive the checker takes:
/// `Watch` probes pinging every second against servers that allow a ping only every 5 s while
/// calls are open (two strikes, then `GOAWAY too_many_pings`), with no connection age or
/// idleness to close the probe connections first. Each refusal doubles the probe keepalive
/// (gRFC A8): 1 s → 2 s → 4 s, each refused in turn, → 8 s, which the server accepts. Three
/// refusals on every target, and meanwhile not one eligibility change, not one failed call.
/// (Interval 0, as in [`soak_with_a_10s_keepalive`]: a verifying `Check`'s data would reset
/// the server's strikes.)
pub(crate) async fn soak_with_ping_enforcement(imp: Implementation) {
    let settings = ServerSettings {
        min_ping_interval: Some(Duration::from_secs(5)),
        ..ServerSettings::defaults()
    };
    let bs = backends(imp, &settings).await;
    let all = sorted(uris(&bs));
    let kit = ready_watch_kit(&bs, Duration::from_secs(1)).await;
    let tag = format!("{imp} Watch, pings every 1 s, server allows one every 5 s");
    let versions = card_versions(&kit, &bs);
    let connected = probe_connections(&kit, &bs);
    let mut transitions = kit.checker().unwrap().subscribe();
    let caller = Caller::with_pace(kit.channel(), Duration::from_millis(250));
    let keepalives = || -> Vec<Option<Duration>> {
        bs.iter()
            .map(|b| {
                kit.checker()
                    .unwrap()
                    .status(&b.uri())
                    .unwrap()
                    .probe_keepalive
            })
            .collect()
    };
    let mut smallest = all.len();
    // Refusals after about 3 pings each: 3 s + 6 s + 12 s, and the reconnections.
    let started = Instant::now();
    let settled = vec![Some(Duration::from_secs(8)); bs.len()];
    while keepalives() != settled {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{tag}: not three refusals on every target within 60 s: {:?}",
            keepalives()
        );
        smallest = smallest.min(kit.eligible_targets().len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refused_in = started.elapsed();
    // 8 s pings are allowed: two of them, and no fourth refusal.
    let quiet = Instant::now();
    while quiet.elapsed() < Duration::from_secs(17) {
        smallest = smallest.min(kit.eligible_targets().len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (ok, failed) = caller.stop().await;
    let changes = transitions_since(&mut transitions);
    let after = card_versions(&kit, &bs);
    let replaced: Vec<u64> = probe_connections(&kit, &bs)
        .iter()
        .zip(&connected)
        .map(|(now, before)| now - before)
        .collect();
    println!(
        "{tag}: keepalive 1 s → 8 s on every target in {:.1} s, probe connections replaced \
         {replaced:?}; {ok} calls, {} failed, {} transitions, smallest eligible set {smallest}",
        refused_in.as_secs_f64(),
        failed.len(),
        changes.len()
    );
    assert_eq!(keepalives(), settled, "{tag}: 8 s pings refused too");
    assert!(
        replaced.iter().all(|n| *n == 3),
        "{tag}: one new probe connection per refusal, three each: {replaced:?}"
    );
    assert!(failed.is_empty(), "{tag}: failed calls: {failed:?}");
    assert!(changes.is_empty(), "{tag}: health transitions: {changes:?}");
    assert_eq!(versions, after, "{tag}: a card changed");
    assert_eq!(smallest, all.len(), "{tag}: the eligible set shrank");
    kit.shutdown().await;
}

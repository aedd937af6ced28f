//! Half-open: exactly the configured number of probe calls, even under 100 concurrent
//! callers; a permit is released when its service, response future or body is dropped;
//! success closes, failure reopens for longer (exponential, capped, jitter within bounds).

mod support;

use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use breaker_layer::{Breaker, BreakerConfig};
use endpoint_state::{Backoff, BreakerState, EndpointCard};
use http::Request;
use http_body::Body;
use support::{
    Reply, Script, breaker, call, fails, is_open, oks, open_for, reason, run, send, states,
};
use tokio_test::{assert_pending, assert_ready_ok, task};
use tower::{Service, ServiceExt};

/// Trips on one failure; opens for exactly `base`, doubling, capped at 4 × base.
fn config(permits: u32) -> BreakerConfig {
    BreakerConfig::default()
        .consecutive_failures(1)
        .open_base(Duration::from_secs(1))
        .open_multiplier(2.0)
        .open_max(Duration::from_secs(4))
        .open_jitter(0.0)
        .half_open_permits(permits)
}

#[tokio::test(start_paused = true)]
async fn exactly_the_permits_among_100_callers() {
    let (mut svc, script, card) = breaker(config(3));
    run(&mut svc, &script, &fails(1)).await;
    assert!(is_open(&card));
    tokio::time::advance(Duration::from_secs(1)).await;

    // 100 callers, each its own clone of the service, all asking at once.
    let mut callers: Vec<_> = (0..100).map(|_| (svc.clone(), task::spawn(()))).collect();
    let mut ready = Vec::new();
    for (i, (svc, t)) in callers.iter_mut().enumerate() {
        if let Poll::Ready(r) = t.enter(|cx, _| svc.poll_ready(cx)) {
            r.unwrap();
            ready.push(i);
        }
    }
    assert_eq!(ready.len(), 3, "half-open admits exactly 3: {ready:?}");
    assert_eq!(card.breaker_state(), BreakerState::HalfOpen { busy: true });

    // Asking again never takes a second permit, and nobody else got one meanwhile.
    let ready_now: Vec<_> = callers
        .iter_mut()
        .enumerate()
        .filter_map(|(i, (svc, t))| t.enter(|cx, _| svc.poll_ready(cx)).is_ready().then_some(i))
        .collect();
    assert_eq!(
        ready_now, ready,
        "the same three, still holding their permits"
    );

    // The three probes go out and hang.
    script.push([Reply::Hang, Reply::Hang, Reply::Hang]);
    let mut probes: Vec<_> = ready
        .iter()
        .map(|&i| task::spawn(callers[i].0.call(Request::new(()))))
        .collect();
    for p in &mut probes {
        assert_pending!(p.poll());
    }
    assert_eq!(script.calls(), 4, "one failure, then three probes");

    // Dropping one probe's response future frees one permit and wakes the waiters.
    drop(probes.pop());
    let woken = callers.iter().filter(|(_, t)| t.is_woken()).count();
    assert!(woken > 0, "a released permit wakes the waiters");
    let got: Vec<_> = callers
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| !ready.contains(i))
        .filter_map(|(i, (svc, t))| t.enter(|cx, _| svc.poll_ready(cx)).is_ready().then_some(i))
        .collect();
    assert_eq!(got.len(), 1, "exactly one more caller admitted: {got:?}");
}

#[tokio::test(start_paused = true)]
async fn exactly_the_permits_under_concurrency() {
    let (mut svc, script, card) = breaker(config(2));
    run(&mut svc, &script, &fails(1)).await;
    assert!(is_open(&card));
    tokio::time::advance(Duration::from_secs(1)).await;
    // From now on every call hangs, so an admitted probe never reports.
    script.push(vec![Reply::Hang; 200]);

    // 100 threads, each with its own clone, ask at the same instant (a real race on the
    // permits; the clock stays paused, so the outcome does not depend on timing).
    let runtime = tokio::runtime::Handle::current();
    let start = Arc::new(std::sync::Barrier::new(100));
    let racers: Vec<_> = (0..100)
        .map(|_| {
            let (mut svc, start, runtime) = (svc.clone(), start.clone(), runtime.clone());
            std::thread::spawn(move || {
                let _runtime = runtime.enter();
                let mut t = task::spawn(());
                start.wait();
                let ready = match t.enter(|cx, _| svc.poll_ready(cx)) {
                    Poll::Ready(r) => {
                        r.unwrap();
                        true
                    }
                    Poll::Pending => false,
                };
                (svc, t, ready)
            })
        })
        .collect();
    let mut callers: Vec<_> = racers.into_iter().map(|r| r.join().unwrap()).collect();
    let admitted = callers.iter().filter(|(_, _, ready)| *ready).count();
    assert_eq!(admitted, 2, "half-open admits exactly its 2 permits");

    // The two probes go out and hang.
    let mut probes: Vec<_> = callers
        .iter_mut()
        .filter(|(_, _, ready)| *ready)
        .map(|(svc, _, _)| task::spawn(svc.call(Request::new(()))))
        .collect();
    for p in &mut probes {
        assert_pending!(p.poll());
    }

    // No late admission: however long the probes take, and however often the others ask
    // (woken or not), nobody else gets in.
    for _ in 0..6 {
        tokio::time::advance(Duration::from_secs(3_600)).await;
        for (svc, t, _) in callers.iter_mut().filter(|(_, _, ready)| !*ready) {
            assert_pending!(t.enter(|cx, _| svc.poll_ready(cx)));
        }
    }
    assert_eq!(script.calls(), 1 + 2, "one failure, then the two probes");
    assert!(!card.is_eligible(), "both permits are taken");
    drop(probes);
}

/// Trips the breaker and lets the open period pass.
async fn half_open(permits: u32) -> (Breaker<Script>, Script, EndpointCard) {
    let (mut svc, script, card) = breaker(config(permits));
    run(&mut svc, &script, &fails(1)).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    (svc, script, card)
}

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_future_releases_its_permit() {
    let (svc, script, _card) = half_open(1).await;
    let (mut a, mut b) = (svc.clone(), svc.clone());
    let (mut ta, mut tb) = (task::spawn(()), task::spawn(()));
    assert_ready_ok!(ta.enter(|cx, _| a.poll_ready(cx)));
    assert_pending!(tb.enter(|cx, _| b.poll_ready(cx)));
    script.push([Reply::Hang]);
    let mut probe = task::spawn(a.call(Request::new(())));
    assert_pending!(probe.poll());
    assert!(!tb.is_woken());
    drop(probe);
    assert!(tb.is_woken());
    assert_ready_ok!(tb.enter(|cx, _| b.poll_ready(cx)));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_body_releases_its_permit() {
    let (svc, script, card) = half_open(1).await;
    let (mut a, mut b) = (svc.clone(), svc.clone());
    let mut tb = task::spawn(());
    script.push([Reply::HangBody]);
    let resp = send(&mut a).await.unwrap();
    assert_pending!(tb.enter(|cx, _| b.poll_ready(cx)));
    // The headers and one message arrived; the status is still to come.
    let mut body = Box::pin(resp.into_body());
    let first = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await;
    assert!(first.unwrap().unwrap().is_data());
    assert!(!tb.is_woken());
    assert_eq!(card.breaker_state(), BreakerState::HalfOpen { busy: true });
    drop(body);
    assert!(tb.is_woken());
    assert_eq!(
        card.breaker_state(),
        BreakerState::HalfOpen { busy: false },
        "an abandoned probe decides nothing; its permit is free again"
    );
    assert_ready_ok!(tb.enter(|cx, _| b.poll_ready(cx)));
    assert_eq!(card.breaker_state(), BreakerState::HalfOpen { busy: true });
}

#[tokio::test(start_paused = true)]
async fn a_dropped_service_releases_its_permit_when_call_never_comes() {
    let (svc, _script, _card) = half_open(1).await;
    let (mut a, mut b) = (svc.clone(), svc.clone());
    let (mut ta, mut tb) = (task::spawn(()), task::spawn(()));
    assert_ready_ok!(ta.enter(|cx, _| a.poll_ready(cx)));
    assert_pending!(tb.enter(|cx, _| b.poll_ready(cx)));
    drop(a);
    assert!(tb.is_woken());
    assert_ready_ok!(tb.enter(|cx, _| b.poll_ready(cx)));
}

#[tokio::test(start_paused = true)]
async fn a_service_never_takes_a_second_permit() {
    let (svc, _script, _card) = half_open(2).await;
    let (mut a, mut b, mut c) = (svc.clone(), svc.clone(), svc.clone());
    let mut t = task::spawn(());
    assert_ready_ok!(t.enter(|cx, _| a.poll_ready(cx)));
    assert_ready_ok!(t.enter(|cx, _| a.poll_ready(cx)));
    assert_ready_ok!(t.enter(|cx, _| a.poll_ready(cx)));
    assert_ready_ok!(
        t.enter(|cx, _| b.poll_ready(cx)),
        "the second permit is still free"
    );
    assert_pending!(t.enter(|cx, _| c.poll_ready(cx)));
}

#[tokio::test(start_paused = true)]
async fn success_closes_failure_reopens_longer_capped_and_success_resets_the_backoff() {
    let (mut svc, script, card) = breaker(config(1));
    let mut events = svc.handle().subscribe();
    run(&mut svc, &script, &fails(1)).await;
    assert_eq!(open_for(&card), Duration::from_secs(1));

    // Each failed probe reopens for twice as long, up to the cap of 4 s.
    for expected in [2, 4, 4] {
        tokio::time::advance(open_for(&card)).await;
        run(&mut svc, &script, &fails(1)).await;
        assert_eq!(open_for(&card), Duration::from_secs(expected));
        assert!(reason(&card).starts_with("probe call failed: UNAVAILABLE"));
    }
    assert_eq!(script.calls(), 4);

    // A successful probe closes; the next trip starts from the base again.
    tokio::time::advance(open_for(&card)).await;
    run(&mut svc, &script, &oks(1)).await;
    assert_eq!(card.breaker_state(), BreakerState::Closed);
    assert_eq!(
        card.breaker().reason.as_deref(),
        Some("probe call succeeded")
    );
    run(&mut svc, &script, &fails(1)).await;
    assert_eq!(open_for(&card), Duration::from_secs(1));

    // Every step was an event, in order.
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push(match states(&e).1 {
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen { busy: false } => "half-open",
            BreakerState::HalfOpen { busy: true } => "probing",
            BreakerState::Closed => "closed",
            _ => "other",
        });
    }
    // (Each probe takes the only permit: the card says so, and says so again when the
    // probe's outcome moves the breaker on.)
    assert_eq!(
        seen,
        [
            "open",
            "half-open",
            "probing",
            "open",
            "half-open",
            "probing",
            "open",
            "half-open",
            "probing",
            "open",
            "half-open",
            "probing",
            "closed",
            "open"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn closes_only_when_every_probe_succeeded() {
    let (svc, script, card) = half_open(2).await;
    let (mut a, mut b) = (svc.clone(), svc.clone());
    script.push([Reply::Ok, Reply::Ok]);
    call(&mut a).await.unwrap();
    assert_eq!(
        card.breaker_state(),
        BreakerState::HalfOpen { busy: false },
        "one of two"
    );
    call(&mut b).await.unwrap();
    assert_eq!(card.breaker_state(), BreakerState::Closed);
    assert_eq!(
        card.breaker().reason.as_deref(),
        Some("2 probe calls succeeded")
    );
}

#[tokio::test(start_paused = true)]
async fn jitter_stays_within_its_stated_bounds() {
    // Base 1 s, × 2, at most 3 s, jitter 0.5; the n-th open period in a row is the
    // backoff's wait n - 1.
    let open = Backoff::new(Duration::from_secs(1), 2.0, Duration::from_secs(3), 0.5);
    assert_eq!(
        open.bounds(0),
        (Duration::from_millis(500), Duration::from_millis(1500))
    );
    assert_eq!(
        open.bounds(1),
        (Duration::from_secs(1), Duration::from_secs(3))
    );
    // Third trip: 4 s capped at 3 s; the upper bound never passes the cap.
    assert_eq!(
        open.bounds(2),
        (Duration::from_millis(1500), Duration::from_secs(3))
    );

    let (mut svc, script, card) = breaker(
        BreakerConfig::default()
            .consecutive_failures(1)
            .open_period(open),
    );
    let handle = svc.handle();
    let mut firsts = Vec::new();
    for _ in 0..50 {
        run(&mut svc, &script, &fails(1)).await;
        firsts.push(open_for(&card));
        handle.reset();
    }
    for d in &firsts {
        assert!(
            *d >= Duration::from_millis(500) && *d <= Duration::from_millis(1500),
            "{d:?}"
        );
    }
    let min = firsts.iter().min().unwrap();
    let max = firsts.iter().max().unwrap();
    assert!(
        *max - *min > Duration::from_millis(200),
        "jitter spreads: {min:?}..{max:?}"
    );

    // Repeated trips: the third open period in a row stays within [1.5 s, 3 s].
    for _ in 0..20 {
        handle.reset();
        run(&mut svc, &script, &fails(1)).await;
        for _ in 0..2 {
            tokio::time::advance(open_for(&card)).await;
            run(&mut svc, &script, &fails(1)).await;
        }
        let d = open_for(&card);
        assert!(
            d >= Duration::from_millis(1500) && d <= Duration::from_secs(3),
            "{d:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_stale_permit_is_not_used_after_the_breaker_moved_on() {
    // A service holding a permit while another probe fails: the breaker reopens, and the
    // holder must wait again rather than call with its old permit.
    let (svc, script, card) = half_open(2).await;
    let (mut a, mut b) = (svc.clone(), svc.clone());
    let mut ta = task::spawn(());
    assert_ready_ok!(ta.enter(|cx, _| a.poll_ready(cx)));
    script.push([Reply::TrailersOnly(tonic::Code::Unavailable)]);
    let _ = call(&mut b).await;
    assert!(is_open(&card));
    // Asked again (as tower's balancers do before they call), the holder waits.
    assert_pending!(ta.enter(|cx, _| a.poll_ready(cx)));
    assert!(!ta.is_woken());
    tokio::time::advance(open_for(&card)).await;
    assert!(ta.is_woken(), "woken when the new open period ends");
    assert_ready_ok!(ta.enter(|cx, _| a.poll_ready(cx)));
    assert_eq!(card.breaker_state(), BreakerState::HalfOpen { busy: false });
}

#[tokio::test(start_paused = true)]
async fn a_permit_is_held_while_the_inner_service_is_not_ready_and_given_back_on_its_error() {
    use tower_test::mock;
    let (inner, mut handle) = mock::pair::<Request<()>, http::Response<String>>();
    let layer = breaker_layer::BreakerLayer::new(EndpointCard::new("b1"), config(1)).unwrap();
    let card = layer.card().clone();
    let svc = tower::Layer::layer(&layer, inner);

    // Trip it with one trailers-only UNAVAILABLE.
    let mut first = svc.clone();
    handle.allow(1);
    let call = tokio::spawn(async move {
        let _ = first.ready().await.unwrap().call(Request::new(())).await;
    });
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_response(
        http::Response::builder()
            .header("grpc-status", "14")
            .body(String::new())
            .unwrap(),
    );
    call.await.unwrap();
    assert!(is_open(&card));
    tokio::time::advance(Duration::from_secs(1)).await;

    let (mut a, mut b) = (svc.clone(), svc.clone());
    let (mut ta, mut tb) = (task::spawn(()), task::spawn(()));
    handle.allow(0);
    assert_pending!(
        ta.enter(|cx, _| a.poll_ready(cx)),
        "the channel is not ready"
    );
    assert_eq!(card.breaker_state(), BreakerState::HalfOpen { busy: true });
    assert_pending!(
        tb.enter(|cx, _| b.poll_ready(cx)),
        "a holds the only permit"
    );
    handle.allow(1);
    assert!(ta.is_woken());
    assert_ready_ok!(ta.enter(|cx, _| a.poll_ready(cx)));

    // The channel fails a's readiness check: the error passes through, the permit goes back.
    // (a gives its permit up first, so that c can take it.)
    let mut c = svc.clone();
    drop(a);
    assert!(tb.is_woken());
    handle.send_error("connection pool closed");
    let mut tc = task::spawn(());
    let err = tc.enter(|cx, _| c.poll_ready(cx));
    let err = match err {
        Poll::Ready(Err(e)) => e,
        other => panic!("expected the inner error, got {other:?}"),
    };
    assert_eq!(err.to_string(), "connection pool closed");
    handle.allow(1);
    assert_ready_ok!(tb.enter(|cx, _| b.poll_ready(cx)), "the permit came back");
}

#[tokio::test(start_paused = true)]
async fn a_slow_probe_reopens() {
    let slow = breaker_layer::SlowCalls::new(Duration::from_secs(1), 0.5)
        .window(breaker_layer::Window::Count(10))
        .min_calls(10);
    let (mut svc, script, card) = breaker(config(1).slow_calls(slow));
    run(&mut svc, &script, &fails(1)).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    run(
        &mut svc,
        &script,
        &[Reply::After(Duration::from_secs(3), Box::new(Reply::Ok))],
    )
    .await;
    assert!(is_open(&card), "{:?}", card.breaker());
    assert_eq!(
        card.breaker().reason.as_deref(),
        Some("probe call took 3.0 s (slow from 1.0 s)")
    );
}

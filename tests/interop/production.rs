//! "Production" server settings: each one is live, seen frame by frame with the raw HTTP/2 probe
//! and by a tonic client that pings every second.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::support::client::{assert_within, endpoint, error_chain, secs};
use crate::support::h2_probe::{Probe, observe};
use crate::support::{Implementation, InteropBackend, ServerSettings};

/// What a tonic client pinging every second (`http2_keep_alive_interval(1 s)`,
/// `keep_alive_while_idle(true)`) saw on a health `Watch` it kept open.
#[derive(Debug)]
struct PingerReport {
    /// When the `Watch` ended, from its start, and the error (with its source chain) or `None`
    /// for a clean end; `None` overall if still open at the limit.
    ended: Option<(Duration, Option<String>)>,
}

async fn tonic_pinger(uri: &str, limit: Duration) -> PingerReport {
    let channel = endpoint(uri)
        .timeout(limit * 2)
        .http2_keep_alive_interval(Duration::from_secs(1))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(true)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect {uri}: {e}"));
    let mut health = HealthClient::new(channel);
    let started = Instant::now();
    let request = HealthCheckRequest {
        service: String::new(),
    };
    let mut watch = health.watch(request).await.expect("watch").into_inner();
    let watched = async {
        loop {
            match watch.message().await {
                Ok(Some(_)) => {}
                Ok(None) => return (started.elapsed(), None),
                Err(status) => return (started.elapsed(), Some(error_chain(&status))),
            }
        }
    };
    PingerReport {
        ended: tokio::time::timeout(limit, watched).await.ok(),
    }
}

pub(crate) async fn production_settings_are_live(imp: Implementation) {
    let settings = ServerSettings::production(imp);
    let backend = InteropBackend::start(imp, "p0", &settings).await;
    let addr = SocketAddr::from(([127, 0, 0, 1], backend.port()));
    println!("{imp}: {settings:?}");
    let age = settings.max_connection_age.expect("production sets an age");
    let grace = settings.max_connection_age_grace.expect("and a grace");
    let age_limit = age.mul_f64(1.1) + grace + Duration::from_secs(3);
    let second = Duration::from_secs(1);

    // Five connections at once, each showing one setting.
    // Idle (2 s) is told from age (8 s, less 10 % jitter) by when the GOAWAY comes: anything
    // before 7 s is idleness. The margin over 2 s is for a loaded machine (grpc-js's timers
    // run late when node gets little CPU).
    let idle_limit = age.mul_f64(0.85);
    let idle = observe(
        addr,
        Probe {
            watch: false,
            pings: None,
            limit: idle_limit,
        },
    );
    let aged = observe(
        addr,
        Probe {
            watch: true,
            pings: None,
            limit: age_limit,
        },
    );
    // Pings just slower than the minimum interval: no strike (the 5-minute default would strike
    // each but the first, and end the connection by the fourth at the latest).
    let spaced = async {
        let every = settings.min_ping_interval? + Duration::from_millis(300);
        let limit = every * 3 + second;
        Some(
            observe(
                addr,
                Probe {
                    watch: true,
                    pings: Some((4, every)),
                    limit,
                },
            )
            .await,
        )
    };
    // Pings 100 ms apart: how many are tolerated.
    let burst = observe(
        addr,
        Probe {
            watch: true,
            pings: Some((10, Duration::from_millis(100))),
            limit: Duration::from_secs(4),
        },
    );
    let uri = backend.uri();
    let pinger = tonic_pinger(&uri, age_limit);
    let (idle, aged, spaced, burst, pinger) = tokio::join!(idle, aged, spaced, burst, pinger);
    println!("{imp}: idle connection: {idle}");
    println!("{imp}: connection with a watch open: {aged}");
    if let Some(spaced) = &spaced {
        println!("{imp}: watch, pings every min interval + 0.3 s: {spaced}");
    }
    println!("{imp}: watch, pings every 0.1 s: {burst}");
    match &pinger.ended {
        Some((at, Some(error))) => println!(
            "{imp}: tonic 1 s pinger's watch failed at {}: {error}",
            secs(*at)
        ),
        Some((at, None)) => println!(
            "{imp}: tonic 1 s pinger's watch ended cleanly at {}",
            secs(*at)
        ),
        None => println!(
            "{imp}: tonic 1 s pinger's watch still open at {}",
            secs(age_limit)
        ),
    }

    // Max connection idle.
    match settings.max_connection_idle {
        Some(max_idle) => {
            let goaway = idle
                .first_goaway()
                .unwrap_or_else(|| panic!("{imp}: idle: {idle}"));
            // C-core says INTERNAL_ERROR "connection idle"; grpc-go and grpc-js NO_ERROR.
            let code = if imp == Implementation::CCore { 2 } else { 0 };
            assert_eq!(goaway.code, code, "{imp}: idle: {idle}");
            let high = idle_limit;
            assert_within("idle GOAWAY", goaway.at, max_idle.mul_f64(0.8), high);
            assert!(
                idle.closed.is_some(),
                "{imp}: idle connection not closed: {idle}"
            );
        }
        None => assert!(
            idle.goaways.is_empty() && idle.closed.is_none(),
            "{imp} has no idle timeout, yet: {idle}"
        ),
    }

    // Max connection age and grace, on a connection that always has a call open.
    let closed = aged
        .closed_at()
        .unwrap_or_else(|| panic!("{imp}: aged: {aged}"));
    if imp == Implementation::Tonic {
        // tonic 0.14 with a grace sends no GOAWAY at the age: it drops the connection at
        // age + grace (no jitter).
        assert!(aged.goaways.is_empty(), "tonic: {aged}");
        assert_within(
            "tonic's close",
            closed,
            age + grace - second / 10,
            age + grace + second,
        );
    } else {
        let goaway = aged
            .first_goaway()
            .unwrap_or_else(|| panic!("{imp}: aged: {aged}"));
        assert_eq!(goaway.code, 0, "{imp}: aged: {aged}");
        // ±10 % jitter.
        let high = age.mul_f64(1.1) + second / 2;
        assert_within(
            "age GOAWAY",
            goaway.at,
            age.mul_f64(0.9) - second / 10,
            high,
        );
        let after = closed - goaway.at;
        assert_within(
            "close after the age GOAWAY",
            after,
            grace.mul_f64(0.8),
            grace + 2 * second,
        );
    }

    // Keepalive enforcement. (`permit_without_calls` stays false, every implementation's
    // default: nothing to show for it.)
    if let Some(spaced) = &spaced {
        assert_eq!(
            spaced.pings_acked, 4,
            "{imp}: pings above the minimum interval: {spaced}"
        );
        assert!(
            spaced.goaways.iter().all(|g| g.code != 11),
            "{imp}: pings above the minimum interval: {spaced}"
        );
    }
    let calm = burst.goaways.iter().find(|g| g.code == 11);
    let pinger_error = match &pinger.ended {
        Some((at, Some(error))) => Some((*at, error.as_str())),
        _ => None,
    };
    if imp.enforces_pings() {
        // C-core: `max_ping_strikes` (default 2); grpc-go: fixed at 2. The first ping is free,
        // each next one too soon is a strike, GOAWAY once strikes exceed the limit.
        let strikes = settings.max_ping_strikes.unwrap_or(2);
        let calm = calm.unwrap_or_else(|| panic!("{imp}: no too_many_pings: {burst}"));
        assert_eq!(calm.debug, "too_many_pings", "{imp}: {burst}");
        assert_eq!(
            calm.pings_sent,
            strikes + 2,
            "{imp}: pings before the GOAWAY: {burst}"
        );
        // The tonic pinger's watch ends once its pings have used up the strikes, well before
        // the connection's age. What its error says differs (see the printed line): C-core ends
        // the call with UNAVAILABLE "Too many pings"; after grpc-go's GOAWAY the call only sees
        // the connection close.
        let (at, _) = pinger_error.unwrap_or_else(|| panic!("{imp}: {pinger:?}"));
        assert_within("the pinger's end", at, 2 * second, age.mul_f64(0.85));
    } else {
        assert!(calm.is_none(), "{imp}: {burst}");
        assert_eq!(burst.pings_acked, 10, "{imp}: {burst}");
        if let Some((at, error)) = pinger_error {
            assert!(
                at >= age.mul_f64(0.85),
                "{imp}: the pinger failed early: {error}"
            );
        }
    }
}

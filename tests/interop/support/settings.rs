//! Server settings, the programs' flags for them, and tonic's subset.

use std::time::Duration;

use test_backends::ServerOptions;

use super::Implementation;

/// Server settings of a backend; `None`/`false` is the implementation's default. A setting an
/// implementation cannot honour makes [`InteropBackend::start`] panic (the programs exit with
/// code 2): a test never believes a setting is active when it is not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServerSettings {
    /// A connection older than this gets a GOAWAY (all four).
    pub(crate) max_connection_age: Option<Duration>,
    /// How long a connection past its age may still live (all four; see tonic's quirk in
    /// `test_backends::ServerOptions`).
    pub(crate) max_connection_age_grace: Option<Duration>,
    /// A connection without calls for this long gets a GOAWAY (C-core, grpc-go, grpc-js).
    pub(crate) max_connection_idle: Option<Duration>,
    /// Keepalive enforcement: the shortest time between client pings tolerated while calls are
    /// open (C-core, grpc-go).
    pub(crate) min_ping_interval: Option<Duration>,
    /// Pings too soon tolerated before `GOAWAY too_many_pings` (C-core only, at least 1: C-core
    /// reads 0 as unlimited; grpc-go's is fixed at 2).
    pub(crate) max_ping_strikes: Option<u32>,
    /// Pings on a connection without calls are held to the minimum interval, not to two hours
    /// (C-core, grpc-go).
    pub(crate) permit_without_calls: bool,
    /// Whether `grpc.health.v1.Health` is served; without it a check gets `UNIMPLEMENTED`.
    pub(crate) health: bool,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self::defaults()
    }
}

impl ServerSettings {
    /// The implementation's defaults, with the health service.
    pub(crate) fn defaults() -> Self {
        Self {
            max_connection_age: None,
            max_connection_age_grace: None,
            max_connection_idle: None,
            min_ping_interval: None,
            max_ping_strikes: None,
            permit_without_calls: false,
            health: true,
        }
    }

    /// Production-like settings for `imp`, only those it supports, short enough that each bites
    /// within seconds and spread so that a test can see each one on its own: idle connections
    /// closed after 2 s, any connection after 8 s (±10 % jitter, except tonic) plus 1 s grace,
    /// client pings closer than 1.5 s apart are strikes, C-core tolerating 1 strike (grpc-go's
    /// fixed limit is 2), no pings without calls.
    pub(crate) fn production(imp: Implementation) -> Self {
        let mut settings = Self {
            max_connection_age: Some(Duration::from_secs(8)),
            max_connection_age_grace: Some(Duration::from_secs(1)),
            ..Self::defaults()
        };
        if imp != Implementation::Tonic {
            settings.max_connection_idle = Some(Duration::from_secs(2));
        }
        if imp.enforces_pings() {
            settings.min_ping_interval = Some(Duration::from_millis(1500));
        }
        if imp == Implementation::CCore {
            settings.max_ping_strikes = Some(1);
        }
        settings
    }

    /// The backend programs' command-line flags for these settings.
    pub(super) fn args(&self) -> Vec<String> {
        let mut args = Vec::new();
        let durations = [
            ("--max-connection-age-ms", self.max_connection_age),
            (
                "--max-connection-age-grace-ms",
                self.max_connection_age_grace,
            ),
            ("--max-connection-idle-ms", self.max_connection_idle),
            ("--min-ping-interval-ms", self.min_ping_interval),
        ];
        for (flag, value) in durations {
            if let Some(value) = value {
                args.extend([flag.to_owned(), value.as_millis().to_string()]);
            }
        }
        if let Some(strikes) = self.max_ping_strikes {
            args.extend(["--max-ping-strikes".to_owned(), strikes.to_string()]);
        }
        if self.permit_without_calls {
            args.push("--permit-without-calls".to_owned());
        }
        if !self.health {
            args.push("--no-health".to_owned());
        }
        args
    }

    /// tonic's server options, or why these settings cannot be honoured by tonic.
    pub(super) fn tonic_options(&self) -> Result<ServerOptions, String> {
        let unsupported = [
            ("max_connection_idle", self.max_connection_idle.is_some()),
            ("min_ping_interval", self.min_ping_interval.is_some()),
            ("max_ping_strikes", self.max_ping_strikes.is_some()),
            ("permit_without_calls", self.permit_without_calls),
        ];
        if let Some((name, _)) = unsupported.iter().find(|(_, set)| *set) {
            return Err(format!(
                "tonic's server has no {name} setting (no max-connection-idle, no keepalive \
                 enforcement)"
            ));
        }
        Ok(ServerOptions {
            max_connection_age: self.max_connection_age,
            max_connection_age_grace: self.max_connection_age_grace,
            health: self.health,
        })
    }
}

//! Reading a [`HealthConfig`](super::HealthConfig) from a document (cargo feature `serde`): the
//! fields whose types do not deserialize on their own.

use std::sync::Arc;
use std::time::Duration;

use endpoint_state::Backoff;
use serde::{Deserialize, Deserializer};

#[cfg(feature = "http-probe")]
use crate::probe::HttpProbe;

/// A string, shared.
pub(super) fn shared_str<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<str>, D::Error> {
    String::deserialize(d).map(Arc::from)
}

/// `watch_backoff = { initial = "1s", multiplier = 1.6, max = "2m", jitter = 0.2 }`: a missing
/// setting keeps [`DEFAULT_WATCH_BACKOFF`](super::HealthConfig::DEFAULT_WATCH_BACKOFF)'s.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BackoffSettings {
    #[serde(default, with = "humantime_serde")]
    initial: Option<Duration>,
    #[serde(default)]
    multiplier: Option<f64>,
    #[serde(default, with = "humantime_serde")]
    max: Option<Duration>,
    #[serde(default)]
    jitter: Option<f64>,
}

pub(super) fn watch_backoff<'de, D: Deserializer<'de>>(d: D) -> Result<Backoff, D::Error> {
    let given = BackoffSettings::deserialize(d)?;
    let default = super::HealthConfig::DEFAULT_WATCH_BACKOFF;
    Ok(Backoff::new(
        given.initial.unwrap_or(default.initial),
        given.multiplier.unwrap_or(default.multiplier),
        given.max.unwrap_or(default.max),
        given.jitter.unwrap_or(default.jitter),
    ))
}

/// An HTTP probe's plain settings (its predicate is code).
#[cfg(feature = "http-probe")]
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpSettings {
    path: String,
    #[serde(default)]
    accept_status: Option<Vec<u16>>,
    #[serde(default)]
    require_json_key: Option<String>,
    #[serde(default)]
    max_body: Option<usize>,
}

/// `{ path = "/healthz", accept_status = [200, 404], require_json_key = "ok", max_body = 65536 }`:
/// [`HttpProbe::new`]`(path)` and the setters of the settings given (validated when the checker
/// is built).
#[cfg(feature = "http-probe")]
impl<'de> Deserialize<'de> for HttpProbe {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let given = HttpSettings::deserialize(d)?;
        let mut probe = HttpProbe::new(given.path);
        if let Some(codes) = given.accept_status {
            probe = probe.accept_status(codes);
        }
        if let Some(key) = given.require_json_key {
            probe = probe.require_json_key(key);
        }
        if let Some(bytes) = given.max_body {
            probe = probe.max_body(bytes);
        }
        Ok(probe)
    }
}

//! Reading a service config's JSON: every value checked where it stands, each error naming its
//! JSON path (`methodConfig[0].timeout`) and the value as written.

use std::time::Duration;

use endpoint_state::ConfigError;
use endpoint_state::classify::code_by_name;
use endpoint_state::text::clip;
use serde_json::{Map, Value};
use tonic::Code;

use super::{
    HedgingPolicy, LbPolicy, MethodConfig, MethodName, RetryPolicy, RetryThrottling, ServiceConfig,
};

/// The configuration's name in errors: the kit's (a service config error is one of the kit's
/// settings, under `service_config`).
const CONFIG: &str = crate::error::CONFIG;

/// The policies the kit knows, as `loadBalancingConfig` names them.
const KNOWN_POLICIES: &str = "round_robin, pick_first, weighted_round_robin, least_request \
                              (least_request_experimental), ring_hash (ring_hash_experimental)";

/// gRFC A6: `maxAttempts` above this is this.
const MAX_ATTEMPTS: u32 = 5;

type Result<T> = std::result::Result<T, ConfigError>;

/// A JSON value being read, and where it stands.
#[derive(Clone, Copy)]
struct At<'a> {
    path: &'a str,
    value: &'a Value,
}

impl<'a> At<'a> {
    fn error(&self, expected: impl Into<std::borrow::Cow<'static, str>>) -> ConfigError {
        ConfigError::new(CONFIG, self.path.to_owned(), shown(self.value), expected)
    }

    fn problem(&self, problem: impl Into<std::borrow::Cow<'static, str>>) -> ConfigError {
        ConfigError::problem(CONFIG, self.path.to_owned(), shown(self.value), problem)
    }

    fn object(&self) -> Result<&'a Map<String, Value>> {
        self.value
            .as_object()
            .ok_or_else(|| self.error("an object"))
    }

    fn array(&self) -> Result<&'a Vec<Value>> {
        self.value.as_array().ok_or_else(|| self.error("a list"))
    }

    fn string(&self) -> Result<&'a str> {
        self.value.as_str().ok_or_else(|| self.error("a string"))
    }

    fn bool(&self) -> Result<bool> {
        self.value
            .as_bool()
            .ok_or_else(|| self.error("true or false"))
    }

    /// A protobuf `uint32`: a JSON number, or a string of one (proto3's JSON takes both).
    fn u32(&self) -> Result<u32> {
        let n = match self.value {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.parse::<u64>().ok(),
            _ => None,
        };
        n.and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| self.error("a whole number from 0 to 4294967295"))
    }

    /// A protobuf `float`/`double`: a number, or a string of one.
    fn f64(&self) -> Result<f64> {
        let n = match self.value {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.parse::<f64>().ok(),
            _ => None,
        };
        n.filter(|n| n.is_finite())
            .ok_or_else(|| self.error("a number"))
    }

    /// A `google.protobuf.Duration` in proto3's JSON form: decimal seconds with an `s`
    /// (`"1.5s"`, `"0.000000001s"`), not negative.
    fn duration(&self) -> Result<Duration> {
        let expected = "a duration like \"1.5s\"";
        let text = self.value.as_str().ok_or_else(|| self.error(expected))?;
        parse_duration(text).ok_or_else(|| self.error(expected))
    }

    /// A duration above zero.
    fn positive_duration(&self) -> Result<Duration> {
        let d = self.duration()?;
        if d.is_zero() {
            return Err(self.error("a duration above zero, like \"1.5s\""));
        }
        Ok(d)
    }

    /// A status code: a name (`"UNAVAILABLE"`) or a number (`14`).
    fn code(&self) -> Result<Code> {
        let code = match self.value {
            Value::String(s) => code_by_name(s),
            Value::Number(n) => n
                .as_u64()
                .filter(|n| *n <= 16)
                .map(|n| Code::from_i32(n as i32)),
            _ => None,
        };
        code.ok_or_else(|| {
            self.error("a gRPC status code: a name (\"UNAVAILABLE\") or a number from 0 to 16")
        })
    }
}

/// A value as an error shows it: its JSON, clipped.
fn shown(value: &Value) -> String {
    clip(&value.to_string(), 120).into_owned()
}

/// `path.key`, or `key` at the top.
fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// The fields of an object, read one by one; what was not read is reported as ignored.
struct Fields<'a> {
    path: &'a str,
    map: &'a Map<String, Value>,
    read: Vec<&'static str>,
}

impl<'a> Fields<'a> {
    fn new(at: At<'a>) -> Result<Self> {
        Ok(Fields {
            path: at.path,
            map: at.object()?,
            read: Vec::new(),
        })
    }

    /// The field `key`, unless absent (or `null`, which proto3's JSON reads as absent).
    fn get<'p>(&mut self, key: &'static str, path: &'p mut String) -> Option<At<'p>>
    where
        'a: 'p,
    {
        self.read.push(key);
        let value = self.map.get(key).filter(|v| !v.is_null())?;
        *path = child(self.path, key);
        Some(At { path, value })
    }

    /// The paths of fields not read.
    fn ignored(&self, out: &mut Vec<String>) {
        for key in self.map.keys() {
            if !self.read.contains(&key.as_str()) {
                out.push(child(self.path, key));
            }
        }
    }
}

/// Reads a whole document.
pub(super) fn service_config(json: &str) -> Result<ServiceConfig> {
    let value: Value = serde_json::from_str(json).map_err(|e| {
        ConfigError::problem(CONFIG, "(document)", "", format!("not valid JSON: {e}"))
            .with_source(e)
    })?;
    let top = At {
        path: "",
        value: &value,
    };
    if !value.is_object() {
        return Err(ConfigError::new(
            CONFIG,
            "(document)",
            shown(&value),
            "a JSON object (a service config)",
        ));
    }
    let mut fields = Fields::new(top)?;
    let mut config = ServiceConfig::default();
    let (mut p1, mut p2, mut p3, mut p4, mut p5) = Default::default();
    let lb_config = fields.get("loadBalancingConfig", &mut p1);
    let lb_policy = fields.get("loadBalancingPolicy", &mut p2);
    config.load_balancing = match (lb_config, lb_policy) {
        (Some(list), _) => Some(load_balancing_config(list)?),
        (None, Some(name)) => Some(load_balancing_policy(name)?),
        (None, None) => None,
    };
    if let Some(health) = fields.get("healthCheckConfig", &mut p3) {
        let mut health_fields = Fields::new(health)?;
        let mut p = String::new();
        if let Some(name) = health_fields.get("serviceName", &mut p) {
            config.health_check_service_name = Some(name.string()?.to_owned());
        }
        health_fields.ignored(&mut config.ignored);
    }
    if let Some(methods) = fields.get("methodConfig", &mut p4) {
        for (i, entry) in methods.array()?.iter().enumerate() {
            let path = format!("{}[{i}]", methods.path);
            let at = At {
                path: &path,
                value: entry,
            };
            let method = method_config(at, &mut config.ignored)?;
            index(&mut config, &method, &path, entry)?;
            config.methods.push(method);
        }
    }
    if let Some(throttling) = fields.get("retryThrottling", &mut p5) {
        config.retry_throttling = Some(retry_throttling(throttling, &mut config.ignored)?);
    }
    fields.ignored(&mut config.ignored);
    Ok(config)
}

/// Files each name of the entry about to be pushed; a name given twice is refused, as gRPC
/// refuses it.
fn index(
    config: &mut ServiceConfig,
    method: &MethodConfig,
    path: &str,
    entry: &Value,
) -> Result<()> {
    let at = config.methods.len();
    for (j, name) in method.names.iter().enumerate() {
        let key = match (name.service.is_empty(), name.method.is_empty()) {
            (true, _) => None,
            (false, true) => Some(name.service.clone()),
            (false, false) => Some(format!("{}/{}", name.service, name.method)),
        };
        let taken = match key {
            None => config.default.replace(at).is_some(),
            Some(key) => config.by_name.insert(key.into(), at).is_some(),
        };
        if taken {
            let value = entry
                .get("name")
                .and_then(|n| n.get(j))
                .map_or_else(String::new, shown);
            return Err(ConfigError::problem(
                CONFIG,
                format!("{path}.name[{j}]"),
                value,
                "this name is in an earlier methodConfig entry already (each name may be in \
                 one entry only)",
            ));
        }
    }
    Ok(())
}

/// `loadBalancingConfig`: the first policy the kit knows.
fn load_balancing_config(list: At<'_>) -> Result<LbPolicy> {
    let mut skipped = Vec::new();
    for (i, entry) in list.array()?.iter().enumerate() {
        let path = format!("{}[{i}]", list.path);
        let at = At {
            path: &path,
            value: entry,
        };
        let map = at.object()?;
        let mut keys = map.iter();
        let (Some((name, config)), None) = (keys.next(), keys.next()) else {
            return Err(at.error("an object with exactly one policy, like {\"round_robin\": {}}"));
        };
        let inner = format!("{path}.{name}");
        let config = At {
            path: &inner,
            value: config,
        };
        match policy(name, config)? {
            Some(policy) => return Ok(policy),
            None => skipped.push(name.clone()),
        }
    }
    Err(ConfigError::problem(
        CONFIG,
        list.path.to_owned(),
        shown(list.value),
        if skipped.is_empty() {
            "the list names no policy: name at least one the kit knows".to_owned()
        } else {
            format!(
                "none of these policies is one the kit knows: {}; it knows {KNOWN_POLICIES}",
                skipped.join(", ")
            )
        },
    ))
}

/// The deprecated `loadBalancingPolicy`: a policy's name (gRPC takes `round_robin` and
/// `pick_first`, any case).
fn load_balancing_policy(name: At<'_>) -> Result<LbPolicy> {
    let text = name.string()?;
    let empty = Value::Object(Map::new());
    let config = At {
        path: name.path,
        value: &empty,
    };
    policy(&text.to_ascii_lowercase(), config)?
        .ok_or_else(|| name.error(format!("a policy the kit knows: {KNOWN_POLICIES}")))
}

/// One policy of `loadBalancingConfig`, if the kit knows it (an error if its config is
/// invalid).
fn policy(name: &str, config: At<'_>) -> Result<Option<LbPolicy>> {
    let policy = match name {
        "round_robin" => {
            Fields::new(config)?;
            LbPolicy::RoundRobin
        }
        "pick_first" => {
            let mut fields = Fields::new(config)?;
            let mut p = String::new();
            let shuffle_address_list = match fields.get("shuffleAddressList", &mut p) {
                Some(v) => v.bool()?,
                None => false,
            };
            LbPolicy::PickFirst {
                shuffle_address_list,
            }
        }
        "weighted_round_robin" => {
            let mut fields = Fields::new(config)?;
            for key in [
                "blackoutPeriod",
                "weightExpirationPeriod",
                "weightUpdatePeriod",
                "oobReportingPeriod",
            ] {
                let mut p = String::new();
                if let Some(d) = fields.get(key, &mut p) {
                    d.duration()?;
                }
            }
            let mut p = String::new();
            if let Some(b) = fields.get("enableOobLoadReport", &mut p) {
                b.bool()?;
            }
            let mut p = String::new();
            if let Some(f) = fields.get("errorUtilizationPenalty", &mut p)
                && f.f64()? < 0.0
            {
                return Err(f.error("a penalty that is not negative"));
            }
            LbPolicy::WeightedRoundRobin
        }
        "least_request" | "least_request_experimental" => {
            let mut fields = Fields::new(config)?;
            let mut p = String::new();
            let choice_count = match fields.get("choiceCount", &mut p) {
                Some(n) => {
                    let count = n.u32()?;
                    if count < 2 {
                        return Err(n.error("a choice count of at least 2"));
                    }
                    count.min(10)
                }
                None => 2,
            };
            LbPolicy::LeastRequest { choice_count }
        }
        "ring_hash" | "ring_hash_experimental" => {
            let mut fields = Fields::new(config)?;
            const MAX_RING: u64 = 8 * 1024 * 1024;
            let mut size = |key: &'static str, default: u64| -> Result<(u64, Option<String>)> {
                let mut p = String::new();
                match fields.get(key, &mut p) {
                    Some(n) => {
                        let v = u64::from(n.u32()?);
                        if v == 0 || v > MAX_RING {
                            return Err(n.error("a ring size from 1 to 8388608"));
                        }
                        Ok((v, Some(p)))
                    }
                    None => Ok((default, None)),
                }
            };
            let (min_ring_size, _) = size("minRingSize", 1024)?;
            let (max_ring_size, max_path) = size("maxRingSize", MAX_RING)?;
            if min_ring_size > max_ring_size {
                let path = max_path.unwrap_or_else(|| child(config.path, "maxRingSize"));
                return Err(ConfigError::new(
                    CONFIG,
                    path,
                    max_ring_size,
                    format!("a maxRingSize no smaller than minRingSize ({min_ring_size})"),
                ));
            }
            let mut p = String::new();
            let request_hash_header = match fields.get("requestHashHeader", &mut p) {
                Some(h) => {
                    let header = h.string()?;
                    if http::HeaderName::from_bytes(header.as_bytes()).is_err()
                        || header.to_ascii_lowercase().ends_with("-bin")
                    {
                        return Err(h.error("a header name that is not a binary (`-bin`) one"));
                    }
                    Some(header.to_ascii_lowercase())
                }
                None => None,
            };
            LbPolicy::RingHash {
                min_ring_size,
                max_ring_size,
                request_hash_header,
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(policy))
}

/// One `methodConfig` entry.
fn method_config(at: At<'_>, ignored: &mut Vec<String>) -> Result<MethodConfig> {
    let mut fields = Fields::new(at)?;
    let mut method = MethodConfig::default();
    let (mut p1, mut p2, mut p3, mut p4, mut p5, mut p6, mut p7) = Default::default();
    if let Some(names) = fields.get("name", &mut p1) {
        for (j, name) in names.array()?.iter().enumerate() {
            let path = format!("{}[{j}]", names.path);
            let at = At {
                path: &path,
                value: name,
            };
            method.names.push(method_name(at, ignored)?);
        }
    }
    if let Some(v) = fields.get("waitForReady", &mut p2) {
        method.wait_for_ready = Some(v.bool()?);
    }
    if let Some(v) = fields.get("timeout", &mut p3) {
        method.timeout = Some(v.positive_duration()?);
    }
    if let Some(v) = fields.get("maxRequestMessageBytes", &mut p4) {
        method.max_request_message_bytes = Some(v.u32()?);
    }
    if let Some(v) = fields.get("maxResponseMessageBytes", &mut p5) {
        method.max_response_message_bytes = Some(v.u32()?);
    }
    let retry = fields.get("retryPolicy", &mut p6);
    let hedging = fields.get("hedgingPolicy", &mut p7);
    if let (Some(_), Some(hedging)) = (retry, hedging) {
        return Err(
            hedging.problem("an entry has a retryPolicy or a hedgingPolicy, not both (gRFC A6)")
        );
    }
    if let Some(v) = retry {
        method.retry_policy = Some(retry_policy(v, ignored)?);
    }
    if let Some(v) = hedging {
        method.hedging_policy = Some(hedging_policy(v, ignored)?);
    }
    fields.ignored(ignored);
    Ok(method)
}

fn method_name(at: At<'_>, ignored: &mut Vec<String>) -> Result<MethodName> {
    let mut fields = Fields::new(at)?;
    let (mut p1, mut p2) = Default::default();
    let service = match fields.get("service", &mut p1) {
        Some(s) => s.string()?.to_owned(),
        None => String::new(),
    };
    let method = match fields.get("method", &mut p2) {
        Some(m) => m.string()?.to_owned(),
        None => String::new(),
    };
    if service.is_empty() && !method.is_empty() {
        return Err(
            at.problem("a method needs its service (only the default entry, {}, names no service)")
        );
    }
    if service.contains('/') || method.contains('/') {
        return Err(at.error("a service (`pkg.Service`) and a method name without `/`"));
    }
    fields.ignored(ignored);
    Ok(MethodName { service, method })
}

/// `maxAttempts` of a retry or hedging policy: at least 2; above 5 is 5 (gRFC A6).
fn max_attempts(at: At<'_>) -> Result<u32> {
    let n = at.u32()?;
    if n < 2 {
        return Err(at.error("at least 2 attempts (the original call is one)"));
    }
    Ok(n.min(MAX_ATTEMPTS))
}

fn codes(at: At<'_>) -> Result<Vec<Code>> {
    let mut out = Vec::new();
    for (i, value) in at.array()?.iter().enumerate() {
        let path = format!("{}[{i}]", at.path);
        let code = At { path: &path, value }.code()?;
        if !out.contains(&code) {
            out.push(code);
        }
    }
    Ok(out)
}

fn retry_policy(at: At<'_>, ignored: &mut Vec<String>) -> Result<RetryPolicy> {
    let mut fields = Fields::new(at)?;
    let (mut p1, mut p2, mut p3, mut p4, mut p5, mut p6) = Default::default();
    let missing = |key: &str| {
        ConfigError::problem(
            CONFIG,
            child(at.path, key),
            "",
            "missing: a retryPolicy needs maxAttempts, initialBackoff, maxBackoff, \
             backoffMultiplier and retryableStatusCodes (gRFC A6)",
        )
    };
    let max_attempts = max_attempts(
        fields
            .get("maxAttempts", &mut p1)
            .ok_or_else(|| missing("maxAttempts"))?,
    )?;
    let initial_backoff = fields
        .get("initialBackoff", &mut p2)
        .ok_or_else(|| missing("initialBackoff"))?
        .positive_duration()?;
    let max_backoff = fields
        .get("maxBackoff", &mut p3)
        .ok_or_else(|| missing("maxBackoff"))?
        .positive_duration()?;
    let multiplier = fields
        .get("backoffMultiplier", &mut p4)
        .ok_or_else(|| missing("backoffMultiplier"))?;
    let backoff_multiplier = multiplier.f64()?;
    if backoff_multiplier <= 0.0 {
        return Err(multiplier.error("a multiplier above zero"));
    }
    let list = fields
        .get("retryableStatusCodes", &mut p5)
        .ok_or_else(|| missing("retryableStatusCodes"))?;
    let retryable_status_codes = codes(list)?;
    if retryable_status_codes.is_empty() {
        return Err(list.error("at least one status code"));
    }
    let per_attempt_recv_timeout = match fields.get("perAttemptRecvTimeout", &mut p6) {
        Some(d) => Some(d.positive_duration()?),
        None => None,
    };
    fields.ignored(ignored);
    Ok(RetryPolicy {
        max_attempts,
        initial_backoff,
        max_backoff,
        backoff_multiplier,
        retryable_status_codes,
        per_attempt_recv_timeout,
    })
}

fn hedging_policy(at: At<'_>, ignored: &mut Vec<String>) -> Result<HedgingPolicy> {
    let mut fields = Fields::new(at)?;
    let (mut p1, mut p2, mut p3) = Default::default();
    let max_attempts = max_attempts(fields.get("maxAttempts", &mut p1).ok_or_else(|| {
        ConfigError::problem(
            CONFIG,
            child(at.path, "maxAttempts"),
            "",
            "missing: a hedgingPolicy needs maxAttempts (gRFC A6)",
        )
    })?)?;
    let hedging_delay = match fields.get("hedgingDelay", &mut p2) {
        Some(d) => d.duration()?,
        None => Duration::ZERO,
    };
    let non_fatal_status_codes = match fields.get("nonFatalStatusCodes", &mut p3) {
        Some(list) => codes(list)?,
        None => Vec::new(),
    };
    fields.ignored(ignored);
    Ok(HedgingPolicy {
        max_attempts,
        hedging_delay,
        non_fatal_status_codes,
    })
}

fn retry_throttling(at: At<'_>, ignored: &mut Vec<String>) -> Result<RetryThrottling> {
    let mut fields = Fields::new(at)?;
    let (mut p1, mut p2) = Default::default();
    let missing = |key: &str| {
        ConfigError::problem(
            CONFIG,
            child(at.path, key),
            "",
            "missing: retryThrottling needs maxTokens and tokenRatio (gRFC A6)",
        )
    };
    let tokens = fields
        .get("maxTokens", &mut p1)
        .ok_or_else(|| missing("maxTokens"))?;
    let max_tokens = tokens.u32()?;
    if !(1..=1000).contains(&max_tokens) {
        return Err(tokens.error("a number of tokens from 1 to 1000"));
    }
    let ratio = fields
        .get("tokenRatio", &mut p2)
        .ok_or_else(|| missing("tokenRatio"))?;
    // Three decimal places, as gRPC keeps them.
    let token_ratio = (ratio.f64()? * 1000.0).trunc() / 1000.0;
    if token_ratio <= 0.0 {
        return Err(ratio.error("a ratio above zero (to three decimal places)"));
    }
    fields.ignored(ignored);
    Ok(RetryThrottling {
        max_tokens,
        token_ratio,
    })
}

/// proto3's JSON `Duration`: `[-]seconds[.fraction]s`, up to 9 fraction digits, at most
/// 315,576,000,000 seconds (about 10,000 years). Negative durations are refused (no setting
/// read here takes one).
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
    const MAX_SECONDS: u64 = 315_576_000_000;
    let number = text.strip_suffix('s')?;
    let (secs, frac) = match number.split_once('.') {
        Some((s, f)) => (s, f),
        None => (number, ""),
    };
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    if secs.is_empty() && frac.is_empty() || !digits(secs) || !digits(frac) || frac.len() > 9 {
        return None;
    }
    let secs: u64 = if secs.is_empty() {
        0
    } else {
        secs.parse().ok()?
    };
    if secs > MAX_SECONDS {
        return None;
    }
    let nanos: u32 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<9}").parse().ok()?
    };
    Some(Duration::new(secs, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_proto3_json_writes_them() {
        let ok = [
            ("1.5s", Duration::from_millis(1500)),
            ("1s", Duration::from_secs(1)),
            ("0.000000001s", Duration::from_nanos(1)),
            ("0.25s", Duration::from_millis(250)),
            (".5s", Duration::from_millis(500)),
            ("3.s", Duration::from_secs(3)),
            ("315576000000s", Duration::from_secs(315_576_000_000)),
        ];
        for (text, d) in ok {
            assert_eq!(parse_duration(text), Some(d), "{text}");
        }
        for bad in [
            "",
            "s",
            ".s",
            "1",
            "abc",
            "1.5",
            "-1s",
            "1.0000000001s",
            "1e3s",
            " 1s",
            "1 s",
            "315576000001s",
            "99999999999999999999999s",
            "1.5S",
            "+1s",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn unknown_fields_are_collected_not_refused() {
        let config = service_config(
            r#"{"methodConfig": [{"name": [{"service": "a.B", "colour": 1}], "extra": true}],
                "newTopLevel": {}}"#,
        )
        .unwrap();
        let mut ignored = config.ignored().to_vec();
        ignored.sort();
        assert_eq!(
            ignored,
            [
                "methodConfig[0].extra",
                "methodConfig[0].name[0].colour",
                "newTopLevel"
            ]
        );
    }

    #[test]
    fn no_value_panics() {
        // Every JSON type in every place the parser reads.
        let values = [
            "null",
            "true",
            "0",
            "-1",
            "1.5",
            "4294967296",
            "1e400",
            "\"\"",
            "\"x\"",
            "[]",
            "[1]",
            "{}",
            "{\"a\":1}",
        ];
        let places = [
            "{\"loadBalancingConfig\": V}",
            "{\"loadBalancingConfig\": [V]}",
            "{\"loadBalancingConfig\": [{\"pick_first\": V}]}",
            "{\"loadBalancingConfig\": [{\"ring_hash\": {\"minRingSize\": V}}]}",
            "{\"loadBalancingConfig\": [{\"least_request\": {\"choiceCount\": V}}]}",
            "{\"loadBalancingConfig\": [{\"weighted_round_robin\": {\"blackoutPeriod\": V}}]}",
            "{\"loadBalancingPolicy\": V}",
            "{\"healthCheckConfig\": V}",
            "{\"healthCheckConfig\": {\"serviceName\": V}}",
            "{\"methodConfig\": V}",
            "{\"methodConfig\": [V]}",
            "{\"methodConfig\": [{\"name\": V}]}",
            "{\"methodConfig\": [{\"name\": [V]}]}",
            "{\"methodConfig\": [{\"timeout\": V}]}",
            "{\"methodConfig\": [{\"maxRequestMessageBytes\": V}]}",
            "{\"methodConfig\": [{\"retryPolicy\": V}]}",
            "{\"methodConfig\": [{\"retryPolicy\": {\"maxAttempts\": V}}]}",
            "{\"methodConfig\": [{\"retryPolicy\": {\"maxAttempts\": 2, \"initialBackoff\": \"1s\", \"maxBackoff\": \"1s\", \"backoffMultiplier\": 2, \"retryableStatusCodes\": V}}]}",
            "{\"methodConfig\": [{\"retryPolicy\": {\"maxAttempts\": 2, \"initialBackoff\": \"1s\", \"maxBackoff\": \"1s\", \"backoffMultiplier\": 2, \"retryableStatusCodes\": [V]}}]}",
            "{\"methodConfig\": [{\"hedgingPolicy\": {\"maxAttempts\": 2, \"hedgingDelay\": V}}]}",
            "{\"retryThrottling\": V}",
            "{\"retryThrottling\": {\"maxTokens\": V, \"tokenRatio\": V}}",
            "V",
        ];
        for place in places {
            for value in values {
                let json = place.replace('V', value);
                let _ = service_config(&json);
            }
        }
    }
}

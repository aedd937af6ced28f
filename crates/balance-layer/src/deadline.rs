//! The caller's deadline, read from the request (and written again when the request is sent
//! after waiting), for wait-for-ready calls.

use std::time::Duration;

use http::HeaderValue;

/// `grpc-timeout`, as a ready header name.
static GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

/// A request that may say how long its caller is prepared to wait.
///
/// With [`wait_for_ready`](crate::BalanceConfig::wait_for_ready), a call made while no
/// endpoint is eligible waits for one up to this budget (capped by
/// [`max_wait`](crate::BalanceConfig::max_wait)). Implemented for `http::Request` and
/// `tonic::Request`, where it reads the `grpc-timeout` header that tonic sets from
/// `Request::set_timeout`. Any other request type needs a one-line implementation; the
/// default says "no deadline":
///
/// ```
/// struct Job(u32);
/// impl balance_layer::RequestDeadline for Job {}
/// ```
pub trait RequestDeadline {
    /// How long from now the caller is prepared to wait, if it said.
    fn time_budget(&self) -> Option<Duration> {
        None
    }

    /// Says that the caller is prepared to wait `budget` from now: a call sent after waiting
    /// (for an eligible endpoint, or to be sent again) carries what is left of its deadline,
    /// never the whole of it again. The default does nothing (a request with no deadline).
    fn set_time_budget(&mut self, budget: Duration) {
        let _ = budget;
    }

    /// Whether this call waits for an eligible endpoint when none is (gRPC's per-call
    /// wait-for-ready), overriding [`BalanceConfig::wait_for_ready`](crate::BalanceConfig::wait_for_ready)
    /// for this one call; `None` (the default) leaves the balancer's setting. For
    /// `http::Request` and `tonic::Request`, a [`WaitForReady`] extension says it.
    fn wait_for_ready(&self) -> Option<bool> {
        None
    }
}

/// A request extension that overrides the balancer's
/// [`wait_for_ready`](crate::BalanceConfig::wait_for_ready) for one call (read through
/// [`RequestDeadline::wait_for_ready`]):
///
/// ```
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(balance_layer::WaitForReady(true));
/// # use balance_layer::RequestDeadline;
/// assert_eq!(request.wait_for_ready(), Some(true));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitForReady(pub bool);

/// Whether a call made while nothing is eligible waits: its own say, else the balancer's.
#[inline]
pub(crate) fn waits_for_ready<R: RequestDeadline>(req: &R, configured: bool) -> bool {
    req.wait_for_ready().unwrap_or(configured)
}

impl<B> RequestDeadline for http::Request<B> {
    fn time_budget(&self) -> Option<Duration> {
        grpc_timeout(self.headers().get(&GRPC_TIMEOUT)?.as_bytes())
    }

    fn set_time_budget(&mut self, budget: Duration) {
        self.headers_mut()
            .insert(GRPC_TIMEOUT.clone(), grpc_timeout_value(budget));
    }

    fn wait_for_ready(&self) -> Option<bool> {
        self.extensions().get::<WaitForReady>().map(|w| w.0)
    }
}

impl<T> RequestDeadline for tonic::Request<T> {
    fn time_budget(&self) -> Option<Duration> {
        grpc_timeout(self.metadata().get("grpc-timeout")?.as_bytes())
    }

    fn set_time_budget(&mut self, budget: Duration) {
        let value = grpc_timeout_value(budget);
        // The value is ASCII digits and a unit letter: always valid metadata.
        if let Ok(value) = tonic::metadata::AsciiMetadataValue::try_from(value.as_bytes()) {
            self.metadata_mut().insert("grpc-timeout", value);
        }
    }

    fn wait_for_ready(&self) -> Option<bool> {
        self.extensions().get::<WaitForReady>().map(|w| w.0)
    }
}

/// Writes a `grpc-timeout` value: the finest unit (`n`, `u`, `m`, `S`, `M`, `H`) in which
/// `budget` fits in 8 digits, rounded down (a deadline sent on never ends later than the
/// caller's). Saturates at `99999999H`.
pub(crate) fn grpc_timeout_value(budget: Duration) -> HeaderValue {
    const MAX: u128 = 99_999_999;
    let units: [(u128, u8); 6] = [
        (budget.as_nanos(), b'n'),
        (budget.as_micros(), b'u'),
        (budget.as_millis(), b'm'),
        (u128::from(budget.as_secs()), b'S'),
        (u128::from(budget.as_secs() / 60), b'M'),
        (u128::from(budget.as_secs() / 3600), b'H'),
    ];
    let (n, unit) = units
        .into_iter()
        .find(|(n, _)| *n <= MAX)
        .unwrap_or((MAX, b'H'));
    let mut text = n.to_string().into_bytes();
    text.push(unit);
    HeaderValue::from_bytes(&text).expect("digits and a unit letter are a valid header value")
}

/// Parses a `grpc-timeout` value: at most 8 ASCII digits and a unit (`H`, `M`, `S`, `m`,
/// `u`, `n`).
pub fn grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!(grpc_timeout(b"2S"), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout(b"1500m"), Some(Duration::from_millis(1500)));
        assert_eq!(grpc_timeout(b"3M"), Some(Duration::from_secs(180)));
        assert_eq!(grpc_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(grpc_timeout(b"7u"), Some(Duration::from_micros(7)));
        assert_eq!(grpc_timeout(b"9n"), Some(Duration::from_nanos(9)));
    }

    #[test]
    fn rejects_malformed_values() {
        for bad in [&b""[..], b"S", b"123456789S", b"12x", b"-1S", b"1.5S"] {
            assert_eq!(grpc_timeout(bad), None, "{:?}", std::str::from_utf8(bad));
        }
    }

    #[test]
    fn a_written_budget_reads_back_rounded_down_to_its_unit() {
        let cases = [
            (Duration::from_nanos(7), "7n"),
            (Duration::from_millis(250), "250000u"),
            (Duration::from_millis(999), "999000u"),
            (Duration::from_secs(2), "2000000u"),
            (Duration::from_micros(100_000_001), "100000m"),
            (Duration::from_secs(100_000_000), "1666666M"),
            (Duration::from_secs(99_999_999 * 60 * 60), "99999999H"),
            (Duration::MAX, "99999999H"),
            (Duration::ZERO, "0n"),
        ];
        for (budget, text) in cases {
            let value = grpc_timeout_value(budget);
            assert_eq!(value, text, "{budget:?}");
            let back = grpc_timeout(value.as_bytes()).unwrap();
            assert!(back <= budget, "{budget:?} read back as {back:?}");
        }
    }

    #[test]
    fn requests_sent_again_carry_the_budget_left() {
        let mut http = http::Request::builder()
            .header("grpc-timeout", "1S")
            .body(())
            .unwrap();
        http.set_time_budget(Duration::from_millis(300));
        assert_eq!(http.headers()["grpc-timeout"], "300000u");
        assert_eq!(http.time_budget(), Some(Duration::from_millis(300)));
        let mut req = tonic::Request::new(());
        req.set_timeout(Duration::from_secs(1));
        req.set_time_budget(Duration::from_millis(300));
        assert_eq!(req.time_budget(), Some(Duration::from_millis(300)));
    }

    #[test]
    fn tonic_requests_carry_their_timeout() {
        let mut req = tonic::Request::new(());
        assert_eq!(req.time_budget(), None);
        req.set_timeout(Duration::from_millis(250));
        assert_eq!(req.time_budget(), Some(Duration::from_millis(250)));
        let http = http::Request::builder()
            .header("grpc-timeout", "250m")
            .body(())
            .unwrap();
        assert_eq!(http.time_budget(), Some(Duration::from_millis(250)));
    }
}

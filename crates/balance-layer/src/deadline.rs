//! The caller's deadline, read from the request, for wait-for-ready calls.

use std::time::Duration;

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
}

impl<B> RequestDeadline for http::Request<B> {
    fn time_budget(&self) -> Option<Duration> {
        grpc_timeout(self.headers().get("grpc-timeout")?.as_bytes())
    }
}

impl<T> RequestDeadline for tonic::Request<T> {
    fn time_budget(&self) -> Option<Duration> {
        grpc_timeout(self.metadata().get("grpc-timeout")?.as_bytes())
    }
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

//! Go's `time.Duration` text: what `-connect-timeout 250ms` parses and how `1.5s` prints.
//!
//! `grpc_health_probe` takes its timeouts with Go's `flag.DurationVar` and prints them with
//! Go's `Duration.String()`, so a drop-in must read and write the same text: `1s`, `250ms`,
//! `1m30s`, `1.5h`, `-1s`, a bare `0`, and units `ns`, `us`/`µs`, `ms`, `s`, `m`, `h`.

use std::fmt;
use std::time::Duration;

/// A signed duration in nanoseconds, as Go's `time.Duration` (an `i64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct GoDuration(pub(crate) i64);

const NANOS_PER_SEC: u64 = 1_000_000_000;

impl GoDuration {
    /// Parses Go's duration syntax: an optional sign, then one or more decimal numbers each
    /// with a unit (`1h30m`, `1.5s`, `.5ms`), or `0` alone.
    pub(crate) fn parse(text: &str) -> Result<Self, DurationSyntax> {
        let err = || DurationSyntax;
        let (negative, mut rest) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        if rest == "0" {
            return Ok(GoDuration(0));
        }
        if rest.is_empty() {
            return Err(err());
        }
        let mut total: u128 = 0;
        while !rest.is_empty() {
            // The number: digits, optionally a '.' and more digits; at least one digit overall.
            let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
            let (int_part, after) = rest.split_at(int_len);
            let (frac_part, after) = match after.strip_prefix('.') {
                Some(after_dot) => {
                    let len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
                    after_dot.split_at(len)
                }
                None => ("", after),
            };
            if int_part.is_empty() && frac_part.is_empty() {
                return Err(err());
            }
            // The unit: everything up to the next digit or '.'.
            let unit_len = after
                .char_indices()
                .find(|&(_, c)| c == '.' || c.is_ascii_digit())
                .map_or(after.len(), |(i, _)| i);
            if unit_len == 0 {
                return Err(err());
            }
            let (unit, after) = after.split_at(unit_len);
            let unit_nanos: u128 = match unit {
                "ns" => 1,
                "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
                "ms" => 1_000_000,
                "s" => 1_000_000_000,
                "m" => 60 * 1_000_000_000,
                "h" => 3_600 * 1_000_000_000,
                _ => return Err(err()),
            };
            let int: u128 = if int_part.is_empty() {
                0
            } else {
                // More digits than any i64 of nanoseconds can hold is an overflow anyway.
                if int_part.len() > 20 {
                    return Err(err());
                }
                int_part.parse().map_err(|_| err())?
            };
            // Keep at most 18 fraction digits: finer than a nanosecond of an hour.
            let frac_digits = &frac_part[..frac_part.len().min(18)];
            let mut value = int * unit_nanos;
            if !frac_digits.is_empty() {
                let frac: u128 = frac_digits.parse().map_err(|_| err())?;
                value += frac * unit_nanos / 10u128.pow(frac_digits.len() as u32);
            }
            total += value;
            if total > i64::MAX as u128 + u128::from(negative) {
                return Err(err());
            }
            rest = after;
        }
        let nanos = if negative {
            // total <= 2^63 here, so this is exact (and -2^63 is i64::MIN).
            (-(total as i128)) as i64
        } else {
            total as i64
        };
        Ok(GoDuration(nanos))
    }

    /// The duration as a `std` one; `None` when it is zero or negative.
    pub(crate) fn positive(self) -> Option<Duration> {
        (self.0 > 0).then(|| Duration::from_nanos(self.0 as u64))
    }

    /// A `std` duration, saturating at Go's maximum (about 292 years).
    pub(crate) fn from_std(d: Duration) -> Self {
        GoDuration(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    }
}

/// Formats `value / 10^prec` with the fraction's trailing zeros (and then the point) left out.
fn push_fixed(out: &mut String, value: u64, prec: u32) {
    let scale = 10u64.pow(prec);
    out.push_str(&(value / scale).to_string());
    let frac = value % scale;
    if frac != 0 {
        let digits = format!("{frac:0width$}", width = prec as usize);
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
}

impl fmt::Display for GoDuration {
    /// Go's `Duration.String()`: `0s`, `1.5µs`, `250ms`, `1s`, `1m30s`, `1h0m0s`, `-1s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        if self.0 < 0 {
            out.push('-');
        }
        let u = self.0.unsigned_abs();
        if u == 0 {
            out.push_str("0s");
        } else if u < 1_000 {
            out.push_str(&u.to_string());
            out.push_str("ns");
        } else if u < 1_000_000 {
            push_fixed(&mut out, u, 3);
            out.push_str("\u{b5}s");
        } else if u < NANOS_PER_SEC {
            push_fixed(&mut out, u, 6);
            out.push_str("ms");
        } else {
            let secs_nanos = u % (60 * NANOS_PER_SEC);
            let minutes = u / (60 * NANOS_PER_SEC);
            if minutes >= 60 {
                out.push_str(&format!("{}h{}m", minutes / 60, minutes % 60));
            } else if minutes > 0 {
                out.push_str(&format!("{minutes}m"));
            }
            push_fixed(&mut out, secs_nanos, 9);
            out.push('s');
        }
        f.write_str(&out)
    }
}

/// The text is not a Go duration. Go's flag package says just "parse error".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DurationSyntax;

impl fmt::Display for DurationSyntax {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("parse error")
    }
}

impl std::error::Error for DurationSyntax {}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<i64, DurationSyntax> {
        GoDuration::parse(s).map(|d| d.0)
    }

    #[test]
    fn parses_what_go_parses() {
        let ms = 1_000_000;
        let s = 1_000 * ms;
        for (text, nanos) in [
            ("0", 0),
            ("-0", 0),
            ("0s", 0),
            ("1s", s),
            ("+1s", s),
            ("250ms", 250 * ms),
            ("1.5s", 1_500 * ms),
            (".5s", 500 * ms),
            ("1.s", s),
            ("1m30s", 90 * s),
            ("1h", 3_600 * s),
            ("1.5h", 5_400 * s),
            ("2h45m", 9_900 * s),
            ("10us", 10_000),
            ("10\u{b5}s", 10_000),
            ("10\u{3bc}s", 10_000),
            ("7ns", 7),
            ("-1s", -s),
            ("1.000000001s", s + 1),
            ("2562047h47m16.854775807s", i64::MAX),
            ("-2562047h47m16.854775808s", i64::MIN),
        ] {
            assert_eq!(parse(text), Ok(nanos), "{text}");
        }
    }

    #[test]
    fn rejects_what_go_rejects() {
        for text in [
            "",
            "-",
            "1",
            "s",
            ".s",
            "1x",
            "1 s",
            "1s ",
            "one",
            "1e3s",
            "--1s",
            "1.2.3s",
            "9223372036854775808ns",
            "2562047h47m16.854775808s",
            "99999999999999999999999h",
        ] {
            assert_eq!(parse(text), Err(DurationSyntax), "{text:?}");
        }
    }

    #[test]
    fn formats_like_go_duration_string() {
        let ms = 1_000_000;
        let s = 1_000 * ms;
        for (nanos, text) in [
            (0, "0s"),
            (1, "1ns"),
            (999, "999ns"),
            (1_000, "1\u{b5}s"),
            (1_500, "1.5\u{b5}s"),
            (ms, "1ms"),
            (1_234_567, "1.234567ms"),
            (250 * ms, "250ms"),
            (s, "1s"),
            (1_500 * ms, "1.5s"),
            (60 * s, "1m0s"),
            (90 * s, "1m30s"),
            (3_600 * s, "1h0m0s"),
            (3_661 * s + 500 * ms, "1h1m1.5s"),
            (-s, "-1s"),
            (-250 * ms, "-250ms"),
            (i64::MAX, "2562047h47m16.854775807s"),
            (i64::MIN, "-2562047h47m16.854775808s"),
        ] {
            assert_eq!(GoDuration(nanos).to_string(), text, "{nanos}");
        }
    }

    #[test]
    fn round_trips_and_converts() {
        for text in ["1s", "250ms", "1m30s", "1h0m0s", "1.5\u{b5}s", "-3ms"] {
            assert_eq!(GoDuration::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(
            GoDuration::parse("250ms").unwrap().positive(),
            Some(Duration::from_millis(250))
        );
        assert_eq!(GoDuration(0).positive(), None);
        assert_eq!(GoDuration(-5).positive(), None);
        assert_eq!(
            GoDuration::from_std(Duration::from_millis(1_500)).to_string(),
            "1.5s"
        );
    }
}

//! Where lines go: stderr, as the original's Go `log` writes them, one `eprintln!` (one
//! locked write) per line so concurrent probes never interleave within a line. Every line is
//! printed with its control characters escaped ([`escape_control`]): much of what the probe
//! prints is the server's own text (a status message, an HTTP body, an error), and a server
//! must not be able to move the cursor, recolour or clear the terminal, or forge a line.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// How one probe (or the whole run) prints.
#[derive(Debug, Clone, Default)]
pub(crate) struct Log {
    /// `addr: ` before every line when several addresses are probed.
    prefix: Option<Arc<str>>,
    /// `-v`.
    verbose: bool,
    /// A wall-clock timestamp before every line (watch mode).
    timestamps: bool,
    /// Print nothing at all (the library's `check_all`).
    silent: bool,
}

impl Log {
    pub(crate) fn new(verbose: bool, timestamps: bool) -> Self {
        Log {
            prefix: None,
            verbose,
            timestamps,
            silent: false,
        }
    }

    pub(crate) fn silent() -> Self {
        Log {
            silent: true,
            ..Log::default()
        }
    }

    /// The same log, with `address: ` before every line.
    pub(crate) fn for_address(&self, address: &str) -> Self {
        Log {
            prefix: Some(format!("{address}: ").into()),
            ..self.clone()
        }
    }

    /// The line as printed (control characters escaped).
    pub(crate) fn format(&self, message: &str) -> String {
        let mut line = String::new();
        if self.timestamps {
            line.push_str(&rfc3339_millis(SystemTime::now()));
            line.push(' ');
        }
        if let Some(prefix) = &self.prefix {
            line.push_str(prefix);
        }
        line.push_str(&escape_control(message));
        line
    }

    /// Prints a line.
    pub(crate) fn line(&self, message: &str) {
        if !self.silent {
            eprintln!("{}", self.format(message));
        }
    }

    /// Prints a line under `-v` only.
    pub(crate) fn verbose(&self, message: &str) {
        if self.verbose {
            self.line(message);
        }
    }
}

/// `text` with every control character (C0, DEL, C1) and every bidirectional-override
/// character written as Rust writes it in a string literal (`\n`, `\u{1b}`, `\u{202e}`), so
/// that it prints on one line as what it is. Borrows when there is nothing to escape (the
/// common case); printable text, quotes and backslashes are kept as they are.
pub(crate) fn escape_control(text: &str) -> Cow<'_, str> {
    fn escaped(c: char) -> bool {
        c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    }
    if !text.chars().any(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if escaped(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `2025-11-29T17:30:01.123Z`: UTC, milliseconds.
pub(crate) fn rfc3339_millis(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// The proleptic Gregorian date of a count of days since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_utc_timestamps() {
        let at = |secs: u64, millis: u64| {
            rfc3339_millis(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis))
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400, 7), "2000-02-29T00:00:00.007Z");
        assert_eq!(at(1_709_251_199, 999), "2024-02-29T23:59:59.999Z");
        assert_eq!(at(1_764_437_401, 123), "2025-11-29T17:30:01.123Z");
        assert_eq!(at(4_102_444_800, 0), "2100-01-01T00:00:00.000Z");
    }

    #[test]
    fn every_printed_line_has_its_control_characters_escaped() {
        let log = Log::new(false, false).for_address("h:1");
        assert_eq!(
            log.format("error: \u{1b}]0;owned\u{7}\ttab\r\nline"),
            r"h:1: error: \u{1b}]0;owned\u{7}\ttab\r\nline"
        );
        // Printable text, quotes and non-ASCII letters are kept as they are.
        assert_eq!(log.format("état \"ok\" ✓"), "h:1: état \"ok\" ✓");
    }

    #[test]
    fn lines_carry_timestamp_then_prefix() {
        let log = Log::new(false, false).for_address("h:1");
        assert_eq!(log.format("status: SERVING"), "h:1: status: SERVING");
        let log = Log::new(false, true);
        let line = log.format("status: SERVING");
        assert_eq!(line.len(), "2025-11-29T17:30:01.123Z status: SERVING".len());
        assert!(line.ends_with("Z status: SERVING"), "{line}");
    }
}

//! Text the kit keeps or passes on, bounded: a reason on a card holds at most
//! [`MAX_REASON`] characters, whatever a server or a transport error said.
//!
//! Reasons quote server text (a status message, an HTTP body, an error chain), and a server
//! chooses its length. Every line of a card is bounded when it is written
//! ([`EndpointCard`](crate::EndpointCard) clips what it is given), and every writer that builds
//! a reason from server text clips it here first, so nothing of unbounded size is kept, logged,
//! or sent on in an error status.
//!
//! ```
//! use endpoint_state::text::{MAX_REASON, clip, reason};
//! assert_eq!(clip("connection refused", 10), "connection…");
//! assert_eq!(clip("short", 10), "short");
//! assert_eq!(reason(&"x".repeat(10_000)).chars().count(), MAX_REASON + 1);
//! ```

use std::borrow::Cow;

use crate::line::Reason;

/// The most characters of a reason a card keeps (a longer one is clipped and ends with `…`).
pub const MAX_REASON: usize = 240;

/// The first `max_chars` characters of `text`, followed by `…` when anything was cut. Borrows
/// when nothing is cut.
pub fn clip(text: &str, max_chars: usize) -> Cow<'_, str> {
    // A string of at most `max_chars` bytes has at most `max_chars` characters: no scan.
    if text.len() <= max_chars {
        return Cow::Borrowed(text);
    }
    match text.char_indices().nth(max_chars) {
        None => Cow::Borrowed(text),
        Some((end, _)) => {
            let mut out = String::with_capacity(end + '…'.len_utf8());
            out.push_str(&text[..end]);
            out.push('…');
            Cow::Owned(out)
        }
    }
}

/// `text` as a reason for a card, clipped to [`MAX_REASON`] characters.
pub fn reason(text: &str) -> Reason {
    clip(text, MAX_REASON).into()
}

/// `reason` clipped to [`MAX_REASON`] characters; the same allocation when it already fits.
pub fn bound(reason: Reason) -> Reason {
    match clip(&reason, MAX_REASON) {
        Cow::Borrowed(_) => reason,
        Cow::Owned(clipped) => clipped.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clips_on_character_boundaries() {
        assert_eq!(clip("", 0), "");
        assert_eq!(clip("abc", 0), "…");
        assert_eq!(clip("abc", 3), "abc");
        // Multi-byte characters: counted as characters, never cut in the middle.
        assert_eq!(clip("ééé", 2), "éé…");
        assert_eq!(clip("ééé", 3), "ééé");
        let long: Reason = "é".repeat(1_000).into();
        let bounded = bound(long);
        assert_eq!(bounded.chars().count(), MAX_REASON + 1);
        assert!(bounded.ends_with("é…"));
        let short: Reason = "UNAVAILABLE".into();
        assert!(std::sync::Arc::ptr_eq(&bound(short.clone()), &short));
    }
}

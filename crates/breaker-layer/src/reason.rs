//! The words of a transition: why the breaker tripped, in an operator's terms
//! (`failure rate 60% (6 of 10 calls) over the last 10 calls reached 50%`).

use endpoint_state::Outcome;
use endpoint_state::text;
use endpoint_state::time::Secs;

use crate::trip::Window;

/// `part` of `whole` as a percentage (`60%`, `33.3%`).
pub(crate) fn percent(part: u32, whole: u32) -> String {
    percent_f(f64::from(part) / f64::from(whole.max(1)))
}

/// A share as a percentage, without decimals when it is whole.
pub(crate) fn percent_f(share: f64) -> String {
    let p = share * 100.0;
    if (p - p.round()).abs() < 0.05 {
        format!("{:.0}%", p)
    } else {
        format!("{:.1}%", p)
    }
}

/// Which calls a window holds (`over the last 100 calls`, `in the last 30.0 s`).
pub(crate) fn describe(window: Window) -> String {
    match window {
        Window::Count(n) => format!("over the last {n} calls"),
        Window::Time(d) => format!("in the last {}", Secs(d)),
    }
}

/// How a call ended (`UNAVAILABLE: connection refused`), clipped: the status message is the
/// server's text, of the server's length (the card keeps a bounded reason in any case; this
/// keeps the words before it from being cut instead).
pub(crate) fn last_status(outcome: &Outcome) -> String {
    let status = match outcome {
        Outcome::Completed(status) => status.to_string(),
        Outcome::NotProcessed(status) => format!("{status} (not processed)"),
        Outcome::Abandoned => return "abandoned".to_owned(),
    };
    text::clip(&status, LAST_STATUS).into_owned()
}

/// The most characters of a call's status a reason quotes.
const LAST_STATUS: usize = 160;

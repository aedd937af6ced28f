//! Time, as the kit's layers count it: seconds as operators read them, and deadlines that never
//! overflow.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

/// Seconds with one decimal, as operators read them (`3.2 s`).
///
/// ```
/// use std::time::Duration;
/// use endpoint_state::time::Secs;
/// assert_eq!(Secs(Duration::from_millis(3_250)).to_string(), "3.2 s");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Secs(pub Duration);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.1} s", self.0.as_secs_f64())
    }
}

/// How far ahead [`far_future`] is: 30 years, beyond any timer a test or a process waits for.
pub const FAR: Duration = Duration::from_secs(60 * 60 * 24 * 365 * 30);

/// An instant no timer reaches (a disarmed or unbounded one).
pub fn far_future() -> Instant {
    Instant::now() + FAR
}

/// `duration` from now, or [`far_future`] when that does not fit (`Duration::MAX`).
pub fn after(duration: Duration) -> Instant {
    Instant::now()
        .checked_add(duration.min(FAR))
        .unwrap_or_else(far_future)
}

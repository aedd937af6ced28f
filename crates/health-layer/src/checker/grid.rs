//! Shared wake-ups for jittered schedules.
//!
//! With jitter, a target's next check may come anywhere in a band (`interval × (1 ± jitter)`).
//! Drawn freely, 1,000 targets checked every second wake the runtime about once per
//! millisecond, one check per wake-up: every check then pays for a worker thread leaving and
//! re-entering its sleep (futex, epoll) on its own. The [`Grid`] moves each drawn instant to
//! the nearest point of a checker-wide grid *inside the band*, so that checks drawn within the
//! same few milliseconds share one timer tick and one wake-up, and their calls and answers
//! travel together. The spread stays what the jitter asks for (every point of the band is at
//! most one grid step from a drawn instant); without jitter (or a band too narrow for the grid)
//! instants are exact.

use std::time::Duration;

use endpoint_state::time::{FAR, far_future};
use tokio::time::Instant;

/// The widest grid step: 1,000 targets checked every second (jitter 0.1) share a wake-up in
/// groups of about 100. Measured (`benches/many_targets.rs`, the two steps alternately in one
/// session): 7.4–8.8 % of a core with a 16 ms step, 5.5–6.3 % with 100 ms — a wake-up of the
/// runtime's workers costs about as much as a few checks.
const MAX_STEP: Duration = Duration::from_millis(100);

/// The grid has at least this many points across a band (a narrower band is not moved): a
/// check is never moved by more than half the band's width.
const MIN_POINTS: u32 = 2;

/// A checker's grid of wake-up instants (see the [module docs](self)).
#[derive(Debug, Clone, Copy)]
pub(super) struct Grid {
    origin: Instant,
}

impl Grid {
    pub(super) fn new(origin: Instant) -> Self {
        Grid { origin }
    }

    /// The instant for a wait of `delay` from `now`, drawn from the band `[low, high]`: the
    /// nearest grid point within the band, or `now + delay` when the band is too narrow for
    /// the grid (no jitter). Saturating: a wait beyond any clock is as far as the clock goes.
    pub(super) fn place(
        &self,
        now: Instant,
        delay: Duration,
        low: Duration,
        high: Duration,
    ) -> Instant {
        let exact = now.checked_add(delay.min(FAR)).unwrap_or_else(far_future);
        let band = high.saturating_sub(low);
        let step = MAX_STEP.min(band / MIN_POINTS);
        if step < Duration::from_millis(1) {
            return exact;
        }
        if high > FAR {
            return exact;
        }
        let (earliest, latest) = (now + low, now + high);
        let Some(offset) = exact.checked_duration_since(self.origin) else {
            return exact;
        };
        let step_ns = step.as_nanos();
        let rounded = (offset.as_nanos() + step_ns / 2) / step_ns * step_ns;
        let Ok(rounded) = u64::try_from(rounded) else {
            return exact;
        };
        let Some(mut at) = self.origin.checked_add(Duration::from_nanos(rounded)) else {
            return exact;
        };
        // The band holds at least `MIN_POINTS` grid points: one step back or on stays in it.
        if at > latest {
            at -= step;
        } else if at < earliest {
            at += step;
        }
        if at < earliest || at > latest {
            return exact;
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn without_a_band_the_instant_is_exact() {
        let origin = Instant::now();
        let grid = Grid::new(origin);
        tokio::time::advance(Duration::from_micros(3_456)).await;
        let now = Instant::now();
        let d = Duration::from_secs(30);
        assert_eq!(grid.place(now, d, d, d), now + d);
        // A band narrower than the grid needs is not moved either.
        let d = Duration::from_micros(10_300);
        assert_eq!(grid.place(now, d, 10 * MS, 11 * MS), now + d);
    }

    #[tokio::test(start_paused = true)]
    async fn instants_drawn_close_together_share_a_grid_point_within_the_band() {
        let origin = Instant::now();
        let grid = Grid::new(origin);
        tokio::time::advance(Duration::from_micros(123_456)).await;
        let now = Instant::now();
        let (low, high) = (900 * MS, 1_100 * MS);
        let mut points = std::collections::BTreeSet::new();
        for i in 0..2_000u64 {
            let delay = low + Duration::from_micros(i * 100); // the whole band, 0.1 ms apart
            let at = grid.place(now, delay, low, high);
            assert!(at >= now + low && at <= now + high, "{i}: within the band");
            let on_grid = (at - origin).as_nanos() % MAX_STEP.as_nanos();
            assert_eq!(on_grid, 0, "{i}: on the grid");
            assert!(
                at.max(now + delay) - at.min(now + delay) <= MAX_STEP,
                "{i}: at most one step from the drawn instant"
            );
            points.insert(at);
        }
        // 200 ms of band, a point every 100 ms: 2 or 3 wake-ups instead of 2,000.
        assert!((2..=3).contains(&points.len()), "{}", points.len());
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_beyond_any_clock_does_not_panic() {
        let grid = Grid::new(Instant::now());
        let now = Instant::now();
        let at = grid.place(now, Duration::MAX, Duration::MAX / 2, Duration::MAX);
        assert!(at > now);
    }
}

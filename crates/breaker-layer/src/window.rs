//! Lock-free sliding windows of call outcomes: the last `n` calls, or the calls of the last
//! `d` seconds.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::trip::{MAX_CALLS_PER_BUCKET, TIME_WINDOW_BUCKETS, Window};

/// One call, as a window records it.
pub(crate) const FAILED: u8 = 0b010;
pub(crate) const SLOW: u8 = 0b100;
const PRESENT: u8 = 0b001;

/// What a window holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Totals {
    pub(crate) calls: u32,
    pub(crate) failures: u32,
    pub(crate) slow: u32,
}

/// A window of either kind.
#[derive(Debug)]
pub(crate) enum Counter {
    Count(CountWindow),
    Time(TimeWindow),
}

impl Counter {
    pub(crate) fn new(window: Window, origin: Instant) -> Self {
        match window {
            Window::Count(n) => Counter::Count(CountWindow::new(n)),
            Window::Time(d) => Counter::Time(TimeWindow::new(d, origin)),
        }
    }

    /// Records one call (`flags` of [`FAILED`] and [`SLOW`]) and returns the totals after it.
    /// `now` is read only by a time window.
    pub(crate) fn record(&self, flags: u8, now: impl FnOnce() -> Instant) -> Totals {
        match self {
            Counter::Count(w) => w.record(flags),
            Counter::Time(w) => w.record(flags, now()),
        }
    }

    /// Forgets every call. Called with the breaker's transition lock held, before the breaker
    /// closes (so no current call records concurrently).
    pub(crate) fn clear(&self) {
        match self {
            Counter::Count(w) => w.clear(),
            Counter::Time(w) => w.clear(),
        }
    }
}

// ----- count window -----

/// Field width of the packed totals of a count window (enough for `MAX_COUNT_WINDOW` plus
/// headroom for concurrent writers).
const COUNT_FIELD: u32 = 21;
const COUNT_MASK: u64 = (1 << COUNT_FIELD) - 1;

fn pack_count(flags: u8) -> u64 {
    let mut v = 0;
    if flags & PRESENT != 0 {
        v += 1;
    }
    if flags & FAILED != 0 {
        v += 1 << COUNT_FIELD;
    }
    if flags & SLOW != 0 {
        v += 1 << (2 * COUNT_FIELD);
    }
    v
}

/// The last `n` calls: a ring of one byte per call and the three totals packed in one word,
/// so that a reader sees calls, failures and slow calls from the same moment.
///
/// A record takes a slot (one `fetch_add` on the head), swaps its byte and, only when the
/// byte changed (a failure replacing a success, say), adjusts the totals by the difference
/// with one `fetch_add`. A healthy endpoint therefore costs two atomic operations per call.
#[derive(Debug)]
pub(crate) struct CountWindow {
    slots: Box<[AtomicU8]>,
    head: AtomicU64,
    totals: AtomicU64,
}

impl CountWindow {
    fn new(n: u32) -> Self {
        CountWindow {
            slots: (0..n).map(|_| AtomicU8::new(0)).collect(),
            head: AtomicU64::new(0),
            totals: AtomicU64::new(0),
        }
    }

    fn record(&self, flags: u8) -> Totals {
        let flags = flags | PRESENT;
        let len = self.slots.len() as u64;
        let i = (self.head.fetch_add(1, Ordering::Relaxed) % len) as usize;
        let old = self.slots[i].swap(flags, Ordering::AcqRel);
        let totals = if old == flags {
            self.totals.load(Ordering::Acquire)
        } else {
            // Wrapping arithmetic on the packed word is exact: each field's true value stays
            // within its width, so the integer sum decomposes into the right fields.
            let delta = pack_count(flags).wrapping_sub(pack_count(old));
            self.totals
                .fetch_add(delta, Ordering::AcqRel)
                .wrapping_add(delta)
        };
        unpack_count(totals, len as u32)
    }

    fn clear(&self) {
        for slot in self.slots.iter() {
            slot.store(0, Ordering::Relaxed);
        }
        self.head.store(0, Ordering::Relaxed);
        self.totals.store(0, Ordering::Release);
    }
}

fn unpack_count(v: u64, len: u32) -> Totals {
    let t = Totals {
        calls: (v & COUNT_MASK) as u32,
        failures: ((v >> COUNT_FIELD) & COUNT_MASK) as u32,
        slow: ((v >> (2 * COUNT_FIELD)) & COUNT_MASK) as u32,
    };
    // More writers than slots at once can leave the word briefly out of step (a slot
    // overwritten twice before the first adjustment lands): report nothing rather than
    // nonsense; the next record sees the settled totals.
    if t.calls > len || t.failures > t.calls || t.slow > t.calls {
        Totals::default()
    } else {
        t
    }
}

// ----- time window -----

/// Bits of the bucket's epoch tag and of each count in a time-window bucket word.
const TAG_SHIFT: u32 = 48;
const FIELD: u32 = 16;
const FIELD_MASK: u64 = (1 << FIELD) - 1;

/// The calls of the last `duration`, in [`TIME_WINDOW_BUCKETS`] buckets of a tenth each.
///
/// Each bucket is one word: a 16-bit tag of the bucket's epoch (its index since the breaker
/// started) and three 16-bit counts. A record is one compare-and-swap on the current bucket,
/// which also starts the bucket afresh when its tag is from an older epoch; a sum reads every
/// bucket and keeps those whose tag is one of the last ten epochs. A bucket counts at most
/// [`MAX_CALLS_PER_BUCKET`] calls; later calls in the same bucket are skipped, so the rate
/// is then a sample of the bucket's first calls.
///
/// A 16-bit tag repeats every 65,536 epochs (65.5 s for a 10 ms window), so an old bucket must
/// never live that long: each sum clears the buckets that have left the window (a bucket is
/// gone within a window of its leaving while calls come), and the first call after a quiet
/// spell of a whole window clears them all — so a tag is only ever compared with epochs less
/// than two windows from the one it was written in. (That first call races only the calls of
/// the same instant: at worst one of those goes uncounted.)
#[derive(Debug)]
pub(crate) struct TimeWindow {
    origin: Instant,
    bucket_nanos: u64,
    buckets: Box<[AtomicU64]>,
    /// The latest epoch recorded, plus one (0: none yet).
    latest: AtomicU64,
}

impl TimeWindow {
    fn new(duration: Duration, origin: Instant) -> Self {
        let bucket_nanos = (duration.as_nanos() / u128::from(TIME_WINDOW_BUCKETS)).max(1) as u64;
        TimeWindow {
            origin,
            bucket_nanos,
            buckets: (0..TIME_WINDOW_BUCKETS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            latest: AtomicU64::new(0),
        }
    }

    fn epoch(&self, now: Instant) -> u64 {
        // u64 nanoseconds last 584 years; u64 division is much cheaper than u128.
        let elapsed = now.saturating_duration_since(self.origin).as_nanos() as u64;
        elapsed / self.bucket_nanos
    }

    fn record(&self, flags: u8, now: Instant) -> Totals {
        let epoch = self.epoch(now);
        let n = self.buckets.len() as u64;
        // A new epoch (once per bucket, not per call): after a quiet spell of a whole window,
        // every bucket is out of it; forget them before a tag can repeat.
        if self.latest.load(Ordering::Acquire) <= epoch {
            let previous = self.latest.fetch_max(epoch + 1, Ordering::AcqRel);
            if previous != 0 && previous <= epoch && epoch - (previous - 1) >= n {
                self.forget_all();
            }
        }
        let bucket = &self.buckets[(epoch % n) as usize];
        let tag = epoch & FIELD_MASK;
        let add = 1
            | u64::from(flags & FAILED != 0) << FIELD
            | u64::from(flags & SLOW != 0) << (2 * FIELD);
        let mut cur = bucket.load(Ordering::Acquire);
        loop {
            let next = if cur >> TAG_SHIFT != tag {
                tag << TAG_SHIFT | add
            } else if cur & FIELD_MASK >= u64::from(MAX_CALLS_PER_BUCKET) {
                break; // full: this call is not counted
            } else {
                cur + add
            };
            match bucket.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
        self.totals(epoch)
    }

    /// The sum of the buckets of the last ten epochs up to `epoch`. Clears, on the way, the
    /// buckets that have left the window (a tag from ten or more epochs back — not one from a
    /// newer epoch that a concurrent call has just written).
    fn totals(&self, epoch: u64) -> Totals {
        let n = self.buckets.len();
        let mut slot = (epoch % n as u64) as usize;
        let mut t = Totals::default();
        for back in 0..n as u64 {
            let Some(e) = epoch.checked_sub(back) else {
                break;
            };
            let bucket = &self.buckets[slot];
            let word = bucket.load(Ordering::Acquire);
            slot = if slot == 0 { n - 1 } else { slot - 1 };
            let tag = word >> TAG_SHIFT;
            if tag == e & FIELD_MASK {
                t.calls += (word & FIELD_MASK) as u32;
                t.failures += ((word >> FIELD) & FIELD_MASK) as u32;
                t.slow += ((word >> (2 * FIELD)) & FIELD_MASK) as u32;
            } else if word != 0 {
                // How far back the tag is, modulo the tag's range: ten or more (but not so far
                // that it wraps round to a newer epoch) is a bucket out of the window.
                let age = epoch.wrapping_sub(tag) & FIELD_MASK;
                if age >= n as u64 && age <= FIELD_MASK - n as u64 {
                    // Lost to a concurrent record (which made it current): nothing to do.
                    let _ = bucket.compare_exchange(word, 0, Ordering::AcqRel, Ordering::Acquire);
                }
            }
        }
        t
    }

    /// Empties every bucket (each one as it was seen: a record landing meanwhile stays).
    fn forget_all(&self) {
        for bucket in self.buckets.iter() {
            let word = bucket.load(Ordering::Acquire);
            if word != 0 {
                let _ = bucket.compare_exchange(word, 0, Ordering::AcqRel, Ordering::Acquire);
            }
        }
    }

    fn clear(&self) {
        for bucket in self.buckets.iter() {
            // Tag 0 with zero counts is an empty bucket whatever its epoch.
            bucket.store(0, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_window_slides() {
        let w = CountWindow::new(4);
        assert_eq!(w.record(FAILED).failures, 1);
        assert_eq!(
            w.record(0),
            Totals {
                calls: 2,
                failures: 1,
                slow: 0
            }
        );
        w.record(FAILED | SLOW);
        let t = w.record(0);
        assert_eq!(
            t,
            Totals {
                calls: 4,
                failures: 2,
                slow: 1
            }
        );
        // The fifth call replaces the first (a failure).
        assert_eq!(
            w.record(0),
            Totals {
                calls: 4,
                failures: 1,
                slow: 1
            }
        );
        w.record(0);
        assert_eq!(
            w.record(0),
            Totals {
                calls: 4,
                failures: 0,
                slow: 0
            }
        );
        w.clear();
        assert_eq!(
            w.record(0),
            Totals {
                calls: 1,
                failures: 0,
                slow: 0
            }
        );
    }

    #[test]
    fn time_window_forgets_old_buckets() {
        let origin = Instant::now();
        let w = TimeWindow::new(Duration::from_secs(10), origin);
        let at = |ms: u64| origin + Duration::from_millis(ms);
        w.record(FAILED, at(0));
        w.record(0, at(500));
        assert_eq!(w.record(FAILED, at(9_000)).failures, 2);
        // At 10.5 s the bucket of [0, 1) s has left the window; [9, 10) is still in.
        let t = w.record(0, at(10_500));
        assert_eq!(
            t,
            Totals {
                calls: 2,
                failures: 1,
                slow: 0
            }
        );
        // Long after, a bucket whose tag is stale counts for nothing.
        let t = w.record(0, at(1_000_000));
        assert_eq!(
            t,
            Totals {
                calls: 1,
                failures: 0,
                slow: 0
            }
        );
    }

    #[test]
    fn time_window_never_mistakes_an_old_bucket_for_a_current_one() {
        // 10 ms windows: 1 ms buckets. 327,680 buckets later (5 × 65,536), the bucket of
        // epoch 0 has the same slot and the same 16-bit tag as the current one.
        let origin = Instant::now();
        let w = TimeWindow::new(Duration::from_millis(10), origin);
        let at = |ms: u64| origin + Duration::from_millis(ms);
        w.record(FAILED, at(0));
        let t = w.record(0, at(327_680));
        assert_eq!(
            t,
            Totals {
                calls: 1,
                failures: 0,
                slow: 0
            },
            "idle for 327.68 s"
        );
        // Calls in another slot, every 5 ms, never touch the failed bucket's slot: it must not
        // come back when its tag matches again (65,536 × 5 buckets after it was written).
        let w = TimeWindow::new(Duration::from_millis(10), origin);
        w.record(FAILED, at(0));
        let mut last = Totals::default();
        for ms in (3..=327_683).step_by(5) {
            last = w.record(0, at(ms));
            let expected = u32::from(ms < 10); // in the window for its first 10 ms only
            assert_eq!(last.failures, expected, "the failure of 0 ms at {ms} ms");
        }
        assert_eq!(last.calls, 2, "{last:?}");
        // Idle for exactly a tag period (65,536 buckets): nothing old comes back either.
        let w = TimeWindow::new(Duration::from_millis(10), origin);
        for ms in 0..10 {
            w.record(FAILED, at(ms));
        }
        let t = w.record(0, at(9 + 65_536));
        assert_eq!(
            t,
            Totals {
                calls: 1,
                failures: 0,
                slow: 0
            }
        );
    }

    #[test]
    fn time_window_bucket_saturates() {
        let origin = Instant::now();
        let w = TimeWindow::new(Duration::from_secs(10), origin);
        for _ in 0..MAX_CALLS_PER_BUCKET + 10 {
            w.record(0, origin);
        }
        let t = w.record(FAILED, origin);
        assert_eq!(t.calls, MAX_CALLS_PER_BUCKET);
        assert_eq!(t.failures, 0, "a full bucket samples its first calls");
    }
}

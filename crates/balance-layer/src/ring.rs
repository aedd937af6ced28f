//! The consistent-hash ring of [`Strategy::RingHash`](crate::Strategy::RingHash): built by the
//! driver when discovery changes the set of endpoints, viewed through each snapshot's
//! eligible set, searched per call in O(log ring size).

use std::fmt::Write as _;
use std::sync::Arc;

use crate::hash::xxh64;
use crate::shared::{Endpoint, Snapshot};

/// "No such position" in the `u32` tables.
const NONE: u32 = u32::MAX;

/// How many ring positions a pick reads past the snapshot's choice when cards have changed
/// since it was built (the driver is rebuilding it): then the call waits for the new one.
const WALK: usize = 64;

/// Every endpoint's points, sorted: the ring. Built from the endpoints in discovery order
/// (`Snapshot::all`), whose positions `owners` holds.
#[derive(Debug)]
pub(crate) struct Ring {
    /// The points' hashes, ascending.
    points: Box<[u64]>,
    /// `owners[i]`: the position, in the endpoints the ring was built from, of the endpoint
    /// that holds `points[i]`.
    owners: Box<[u32]>,
    /// Points per endpoint.
    per_endpoint: usize,
}

impl Ring {
    /// A ring over endpoints named `names` (in the order of `Snapshot::all`), each holding
    /// the same number of points (see [`points_per_endpoint`]): endpoint `e`'s `i`-th point is
    /// the XXH64 of `"{name}_{i}"`, so that its points do not depend on the other endpoints.
    pub(crate) fn build<'a>(
        names: impl ExactSizeIterator<Item = &'a str>,
        min: usize,
        max: usize,
    ) -> Ring {
        let n = names.len();
        let per_endpoint = points_per_endpoint(n, min, max);
        let mut entries: Vec<(u64, u32)> = Vec::with_capacity(n * per_endpoint);
        let mut key = String::new();
        let mut names_by_owner = Vec::with_capacity(n);
        for (owner, name) in names.enumerate() {
            names_by_owner.push(name);
            for i in 0..per_endpoint {
                key.clear();
                let _ = write!(key, "{name}_{i}");
                entries.push((xxh64(key.as_bytes()), owner as u32));
            }
        }
        // Equal hashes (rare) are ordered by name, so that every client that sees the same
        // endpoints builds the same ring, whatever the order discovery gave them in.
        entries.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| names_by_owner[a.1 as usize].cmp(names_by_owner[b.1 as usize]))
        });
        let (points, owners) = entries.into_iter().unzip::<_, _, Vec<_>, Vec<_>>();
        Ring {
            points: points.into_boxed_slice(),
            owners: owners.into_boxed_slice(),
            per_endpoint,
        }
    }

    /// How many points the ring holds.
    pub(crate) fn len(&self) -> usize {
        self.points.len()
    }

    /// How many points each endpoint holds.
    pub(crate) fn per_endpoint(&self) -> usize {
        self.per_endpoint
    }

    /// The position of the first point at or after `hash`, round the ring. O(log len).
    fn position(&self, hash: u64) -> usize {
        let i = self.points.partition_point(|&p| p < hash);
        if i == self.points.len() { 0 } else { i }
    }
}

/// Points per endpoint for `n` endpoints on a ring of `min..=max` points (both at least 1):
/// the largest power of two that keeps the ring within `max` — so that it stays the same
/// while `n` stays between two powers of two, and an endpoint inserted or removed there moves
/// only its own keys — unless that falls short of `min`, then the least count that reaches
/// it. At least one.
pub(crate) fn points_per_endpoint(n: usize, min: usize, max: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let fits = (max / n).max(1);
    // The largest power of two at most `fits`.
    let per = 1usize << (usize::BITS - 1 - fits.leading_zeros());
    if n.saturating_mul(per) < min {
        min.div_ceil(n)
    } else {
        per
    }
}

/// The ring with one snapshot's eligible set: where a hash lands among the endpoints that
/// may be picked. Built by the driver with every snapshot (O(ring size)); the ring itself is
/// shared until the set of endpoints changes.
#[derive(Debug)]
pub(crate) struct RingView {
    ring: Arc<Ring>,
    /// `next[i]`: the first position at or after `i`, round the ring, whose endpoint is in
    /// the snapshot's `picks`; `NONE` when none is.
    next: Box<[u32]>,
    /// For each endpoint of `Snapshot::all`, its position in `picks`, or `NONE`.
    pick_of: Box<[u32]>,
}

impl RingView {
    /// `ring` (built over `all`) seen through `picks` (a subset of `all`, in `all`'s order).
    pub(crate) fn new<K, S>(
        ring: Arc<Ring>,
        all: &[Arc<Endpoint<K, S>>],
        picks: &[Arc<Endpoint<K, S>>],
    ) -> RingView {
        let mut pick_of = vec![NONE; all.len()];
        let mut p = 0;
        for (i, endpoint) in all.iter().enumerate() {
            if p < picks.len() && Arc::ptr_eq(endpoint, &picks[p]) {
                pick_of[i] = p as u32;
                p += 1;
            }
        }
        debug_assert_eq!(p, picks.len(), "picks in the order of all");
        let len = ring.len();
        let mut next = vec![NONE; len];
        let pickable = |i: usize| pick_of[ring.owners[i] as usize] != NONE;
        // The first pickable position from the start carries round from the end.
        let mut after = (0..len).find(|&i| pickable(i)).map_or(NONE, |i| i as u32);
        for i in (0..len).rev() {
            if pickable(i) {
                after = i as u32;
            }
            next[i] = after;
        }
        RingView {
            ring,
            next: next.into_boxed_slice(),
            pick_of: pick_of.into_boxed_slice(),
        }
    }

    /// The endpoint of `picks` whose point is the first at or after `hash` and that `accept`
    /// takes, going on round the ring past those it refuses (a card changed since the
    /// snapshot was built). `None` when the first [`WALK`] positions hold none it takes.
    fn find<'a, K, S>(
        &self,
        picks: &'a [Arc<Endpoint<K, S>>],
        hash: u64,
        accept: impl Fn(&Endpoint<K, S>) -> bool,
    ) -> Option<&'a Arc<Endpoint<K, S>>> {
        let len = self.ring.len();
        if len == 0 {
            return None;
        }
        let mut at = self.ring.position(hash);
        let mut refused: Option<u32> = None;
        for _ in 0..WALK.min(len) {
            let position = self.next[at];
            if position == NONE {
                return None;
            }
            let owner = self.ring.owners[position as usize];
            if refused != Some(owner) {
                let endpoint = &picks[self.pick_of[owner as usize] as usize];
                if accept(endpoint) {
                    return Some(endpoint);
                }
                refused = Some(owner);
            }
            at = (position as usize + 1) % len;
        }
        None
    }
}

/// The endpoint for a request of hash `hash`: the first on the ring from `hash` that is in the
/// snapshot's eligible set and still admits calls — other than `avoid`, unless it is the only
/// one found. O(log ring size). `None` when the snapshot is not a ring's or lags the cards
/// (the caller has it rebuilt and waits for it).
pub(crate) fn pick<'a, K, S>(
    snap: &'a Snapshot<K, S>,
    hash: u64,
    avoid: Option<&str>,
) -> Option<&'a Arc<Endpoint<K, S>>> {
    let view = snap.ring.as_ref()?;
    let admits = |e: &Endpoint<K, S>| e.admits(snap.ignoring_passive);
    match avoid {
        Some(avoid) => view
            .find(&snap.picks, hash, |e| admits(e) && &*e.name != avoid)
            .or_else(|| view.find(&snap.picks, hash, admits)),
        None => view.find(&snap.picks, hash, admits),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_per_endpoint_is_a_power_of_two_within_max() {
        // The defaults, capped: 1,024..4,096.
        let per = |n| points_per_endpoint(n, 1024, 4096);
        assert_eq!(per(1), 4096);
        assert_eq!(per(2), 2048);
        assert_eq!((per(3), per(4)), (1024, 1024));
        assert_eq!((per(5), per(8)), (512, 512));
        assert_eq!(per(4096), 1);
        assert_eq!(per(10_000), 1);
        // A narrow range: the least count that reaches min.
        assert_eq!(points_per_endpoint(3, 1000, 1200), 334);
        assert_eq!(points_per_endpoint(0, 1, 1), 0);
    }

    #[test]
    fn the_ring_is_sorted_and_owned_evenly() {
        let names = ["a", "b", "c"];
        let ring = Ring::build(names.iter().copied(), 1024, 4096);
        assert_eq!(ring.len(), 3 * 1024);
        assert!(ring.points.windows(2).all(|w| w[0] <= w[1]));
        for owner in 0..3 {
            assert_eq!(ring.owners.iter().filter(|&&o| o == owner).count(), 1024);
        }
        // The same endpoints in another order: the same points.
        let again = Ring::build(["c", "a", "b"].iter().copied(), 1024, 4096);
        assert_eq!(ring.points, again.points);
    }
}

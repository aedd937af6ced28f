//! The consistent-hash ring of [`Strategy::RingHash`](crate::Strategy::RingHash): a table of
//! positions, each owned by the endpoint that scores highest on it (rendezvous hashing),
//! kept by the driver and updated when discovery changes the set of endpoints; viewed through
//! each snapshot's eligible set; read per call in O(1).
//!
//! Why a table rather than points on a ring: its size depends only on the configuration, and
//! a position changes owner only when the endpoint that wins it arrives or leaves. Inserting
//! an endpoint moves exactly the keys it wins (about 1/(n+1) of them), removing one moves
//! exactly its own keys, whatever the number of endpoints.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use endpoint_state::rng;

use crate::Strategy;
use crate::hash::xxh64;
use crate::shared::{Endpoint, Snapshot};

/// "No such position" (or "no owner") in the `u32` tables.
const NONE: u32 = u32::MAX;

/// How many table positions a pick reads past the snapshot's choice when cards have changed
/// since it was built (the driver is rebuilding it): then the call waits for the new one.
const WALK: usize = 64;

/// The number of positions of the table for ring sizes `min..=max` (as `Settings` holds
/// them: both at least 1, `min <= max`, both capped at [`Strategy::RING_SIZE_CAP`]):
/// `RING_SIZE_CAP` brought into `min..=max`. It depends on the configuration only, never on
/// the endpoints, so that a request's position stays put while they come and go.
pub(crate) fn table_size(min: usize, max: usize) -> usize {
    (Strategy::RING_SIZE_CAP as usize).max(min).min(max).max(1)
}

/// Endpoint `key`'s score for position `position`: the `position + 1`-th output of a
/// SplitMix64 generator seeded with the key (the XXH64 of the endpoint's name).
fn score(key: u64, position: usize) -> u64 {
    rng::mix(key.wrapping_add(rng::weyl(position as u64 + 1)))
}

/// The position, in a table of `len`, of a request of hash `hash`: its share of 2^64 times
/// `len`, rounded down.
fn position(hash: u64, len: usize) -> usize {
    ((u128::from(hash) * len as u128) >> 64) as usize
}

/// The driver's table, from which it makes each [`Ring`]: every position's owner and that
/// owner's score, over the endpoints' distinct names. Kept between changes of the set of
/// endpoints so that a change costs O(size) per endpoint inserted or removed rather than a
/// full build's O(size × endpoints). 12 bytes a position: at most 48 KiB.
#[derive(Debug)]
pub(crate) struct Table {
    /// The distinct names of the endpoints, in the order they first appear in the endpoints
    /// the table was last updated with.
    names: Vec<Arc<str>>,
    /// Each name's XXH64.
    keys: Vec<u64>,
    /// `owners[s]`: the position in `names` of position `s`'s owner; `NONE` while no
    /// endpoint (or, during an update, the owner just removed).
    owners: Box<[u32]>,
    /// `scores[s]`: its owner's score of `s`.
    scores: Box<[u64]>,
}

impl Table {
    /// An empty table of `size` positions (at least one).
    pub(crate) fn new(size: usize) -> Table {
        let size = size.max(1);
        Table {
            names: Vec::new(),
            keys: Vec::new(),
            owners: vec![NONE; size].into_boxed_slice(),
            scores: vec![0; size].into_boxed_slice(),
        }
    }

    /// Updates the table to the endpoints named `names` (in the order of `Snapshot::all`) and
    /// returns the ring over them. Incremental when few endpoints came or went, a full
    /// build otherwise; both give the same table.
    pub(crate) fn update<'a>(&mut self, names: impl IntoIterator<Item = &'a Arc<str>>) -> Ring {
        self.reconcile(names, None)
    }

    /// [`update`](Self::update), incremental or not as `incremental` says (`None`: whichever
    /// costs less).
    fn reconcile<'a>(
        &mut self,
        names: impl IntoIterator<Item = &'a Arc<str>>,
        incremental: Option<bool>,
    ) -> Ring {
        // The distinct names, and where each first appears among the endpoints. (Two
        // endpoints with one name have the same scores: the first takes the positions; the
        // other owns none, as an endpoint among more endpoints than positions may.)
        let mut index: HashMap<&'a str, u32> = HashMap::new();
        let mut members: Vec<Arc<str>> = Vec::new();
        let mut first: Vec<u32> = Vec::new();
        for (i, name) in names.into_iter().enumerate() {
            if let Entry::Vacant(slot) = index.entry(&**name) {
                slot.insert(members.len() as u32);
                members.push(name.clone());
                first.push(i as u32);
            }
        }
        let mut known = vec![false; members.len()];
        let remap: Vec<u32> = self
            .names
            .iter()
            .map(|name| match index.get(&**name) {
                Some(&j) => {
                    known[j as usize] = true;
                    j
                }
                None => NONE,
            })
            .collect();
        let removed = remap.iter().filter(|&&j| j == NONE).count();
        let added: Vec<u32> = (0..members.len() as u32)
            .filter(|&j| !known[j as usize])
            .collect();
        // Incremental: O(size) per endpoint inserted, and about as much per endpoint removed
        // (its share of the positions, each over every endpoint); full: O(size × endpoints).
        let incremental = incremental.unwrap_or(added.len() + removed < members.len());
        self.keys = members.iter().map(|name| xxh64(name.as_bytes())).collect();
        self.names = members;

        if incremental {
            for owner in self.owners.iter_mut().filter(|o| **o != NONE) {
                *owner = remap[*owner as usize];
            }
            // The positions of the endpoints removed (or, in a new table, every position) go
            // to the best of all the endpoints now; the others only to an endpoint inserted
            // that beats their owner.
            for s in 0..self.owners.len() {
                if self.owners[s] == NONE {
                    self.refill(s);
                }
            }
            for &j in &added {
                self.offer(j);
            }
        } else {
            self.owners.fill(NONE);
            for j in 0..self.names.len() as u32 {
                self.offer(j);
            }
        }
        self.ring(&first)
    }

    /// Whether endpoint `j`'s score `score` beats `best`, the score of the owner `owner`:
    /// higher, or equal with a lesser name (so that the table does not depend on the order
    /// discovery gave the endpoints in).
    fn beats(names: &[Arc<str>], j: u32, score: u64, owner: u32, best: u64) -> bool {
        owner == NONE
            || score > best
            || (score == best && names[j as usize] < names[owner as usize])
    }

    /// Gives endpoint `j` every position where it beats the owner. O(size): the loop of a
    /// full build, one SplitMix64 step and one comparison a position.
    fn offer(&mut self, j: u32) {
        let Table {
            names,
            keys,
            owners,
            scores,
        } = self;
        // `score(key, s)`, stepped: the generator's state before position `s`'s output.
        let mut state = keys[j as usize];
        for (owner, best) in owners.iter_mut().zip(scores.iter_mut()) {
            state = state.wrapping_add(rng::weyl(1));
            let score = rng::mix(state);
            // The common case first: a lower score than the owner's.
            if score < *best && *owner != NONE {
                continue;
            }
            if Self::beats(names, j, score, *owner, *best) {
                *owner = j;
                *best = score;
            }
        }
    }

    /// Gives position `s` to the best of all the endpoints (none if there are none).
    /// O(endpoints).
    fn refill(&mut self, s: usize) {
        self.owners[s] = NONE;
        for j in 0..self.names.len() as u32 {
            let score = score(self.keys[j as usize], s);
            if Self::beats(&self.names, j, score, self.owners[s], self.scores[s]) {
                self.owners[s] = j;
                self.scores[s] = score;
            }
        }
    }

    /// The ring over the endpoints the table was updated with, `first[j]` being where the
    /// `j`-th name first appears among them. Empty when there is none.
    fn ring(&self, first: &[u32]) -> Ring {
        if self.names.is_empty() {
            return Ring {
                owners: Box::new([]),
                owning: 0,
            };
        }
        let mut owns = vec![false; self.names.len()];
        let owners = self
            .owners
            .iter()
            .map(|&j| {
                owns[j as usize] = true;
                first[j as usize]
            })
            .collect();
        Ring {
            owners,
            owning: owns.iter().filter(|&&o| o).count(),
        }
    }
}

/// Every position's owner: the ring, shared by the snapshots until the set of endpoints
/// changes. Positions are implicit: a request of hash `h` lands on position
/// `h × len / 2^64`.
#[derive(Debug)]
pub(crate) struct Ring {
    /// `owners[s]`: the position, in the endpoints the ring was built from
    /// (`Snapshot::all`), of the endpoint that owns position `s`.
    owners: Box<[u32]>,
    /// How many endpoints own at least one position.
    owning: usize,
}

impl Ring {
    /// How many positions the ring has (none without endpoints).
    pub(crate) fn len(&self) -> usize {
        self.owners.len()
    }

    /// How many endpoints own at least one position (all of them but a few when there are
    /// more endpoints than positions).
    pub(crate) fn owning(&self) -> usize {
        self.owning
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

    /// The endpoint of `picks` that owns the first position at or after `hash`'s and that
    /// `accept` takes, going on round the ring past those it refuses (a card changed since
    /// the snapshot was built). `None` when the first [`WALK`] positions hold none it takes.
    ///
    /// When no endpoint of `picks` owns a position (possible only with more endpoints than
    /// positions), the hash chooses among `picks` directly.
    fn find<'a, K, S>(
        &self,
        picks: &'a [Arc<Endpoint<K, S>>],
        hash: u64,
        accept: impl Fn(&Endpoint<K, S>) -> bool,
    ) -> Option<&'a Arc<Endpoint<K, S>>> {
        let len = self.ring.len();
        if len == 0 || picks.is_empty() {
            return None;
        }
        let mut at = position(hash, len);
        if self.next[at] == NONE {
            let start = position(hash, picks.len());
            return (0..WALK.min(picks.len()))
                .map(|i| &picks[(start + i) % picks.len()])
                .find(|endpoint| accept(endpoint));
        }
        let mut refused: Option<u32> = None;
        for _ in 0..WALK.min(len) {
            let position = self.next[at];
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

/// The endpoint for a request of hash `hash`: the first on the ring from `hash`'s position
/// that is in the snapshot's eligible set and still admits calls — other than those in `avoid`,
/// unless it is the only one found. O(1). `None` when the snapshot is not a ring's or lags
/// the cards (the caller has it rebuilt and waits for it).
pub(crate) fn pick<'a, K, S>(
    snap: &'a Snapshot<K, S>,
    hash: u64,
    avoid: &[Arc<str>],
) -> Option<&'a Arc<Endpoint<K, S>>> {
    let view = snap.ring.as_ref()?;
    let admits = |e: &Endpoint<K, S>| e.admits(snap.ignoring_passive);
    if avoid.is_empty() {
        return view.find(&snap.picks, hash, admits);
    }
    view.find(&snap.picks, hash, |e| admits(e) && !avoid.contains(&e.name))
        .or_else(|| view.find(&snap.picks, hash, admits))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BalanceConfig;
    use crate::shared::Settings;
    use endpoint_state::rng::Rng;

    fn names(names: &[&str]) -> Vec<Arc<str>> {
        names.iter().map(|&n| Arc::from(n)).collect()
    }

    fn size_of(min: u64, max: u64) -> usize {
        let config = BalanceConfig::new().strategy(Strategy::RingHash {
            min_ring_size: min,
            max_ring_size: max,
            request_hash_header: None,
        });
        config.validate().unwrap();
        let settings = Settings::from_config(&config);
        table_size(settings.ring_min, settings.ring_max)
    }

    #[test]
    fn the_table_size_comes_from_the_configuration_only() {
        // The defaults (1,024..8,388,608): the cap.
        assert_eq!(size_of(1024, 8 * 1024 * 1024), 4096);
        assert_eq!(size_of(8 * 1024 * 1024, 8 * 1024 * 1024), 4096);
        assert_eq!(size_of(1, 4096), 4096);
        // A smaller max_ring_size wins.
        assert_eq!(size_of(1, 1000), 1000);
        assert_eq!(size_of(1000, 1000), 1000);
        assert_eq!(size_of(1, 1), 1);
        assert_eq!(table_size(0, 0), 1);
    }

    #[test]
    fn each_position_goes_to_the_highest_score_whatever_the_order() {
        let mut table = Table::new(4096);
        let ring = table.update(&names(&["a", "b", "c"]));
        assert_eq!((ring.len(), ring.owning()), (4096, 3));
        let keys = ["a", "b", "c"].map(|n| xxh64(n.as_bytes()));
        for (s, &owner) in ring.owners.iter().enumerate() {
            let best = (0..3).max_by_key(|&j| score(keys[j], s)).unwrap();
            assert_eq!(owner as usize, best, "position {s}");
        }
        // About a third each (binomial: the standard deviation is 30 positions).
        for owner in 0..3 {
            let n = ring.owners.iter().filter(|&&o| o == owner).count();
            assert!((1265..=1465).contains(&n), "{owner}: {n}");
        }
        // The same endpoints in another order: the same owners, by name.
        let again = Table::new(4096).update(&names(&["c", "a", "b"]));
        fn by_name(r: &Ring, order: [&'static str; 3]) -> Vec<&'static str> {
            r.owners.iter().map(|&o| order[o as usize]).collect()
        }
        assert_eq!(
            by_name(&ring, ["a", "b", "c"]),
            by_name(&again, ["c", "a", "b"])
        );
    }

    #[test]
    fn an_update_equals_a_full_build() {
        let pool: Vec<Arc<str>> = (0..40)
            .map(|i| Arc::from(format!("10.0.0.{i}:50051")))
            .collect();
        let mut rng = Rng::new(7);
        let mut current: Vec<Arc<str>> = pool[..12].to_vec();
        let mut table = Table::new(512);
        table.reconcile(&current, Some(true));
        for step in 0..300 {
            // Remove some, insert some, now and then reorder (and once in a while a name twice).
            for _ in 0..rng.below(3) {
                if !current.is_empty() {
                    current.remove(rng.below(current.len()));
                }
            }
            for _ in 0..rng.below(3) {
                let name = &pool[rng.below(pool.len())];
                if !current.contains(name) || step % 50 == 0 {
                    current.push(name.clone());
                }
            }
            if step % 7 == 0 {
                for i in (1..current.len()).rev() {
                    current.swap(i, rng.below(i + 1));
                }
            }
            let incremental = table.reconcile(&current, Some(true));
            let full = Table::new(512).reconcile(&current, Some(false));
            assert_eq!(incremental.owners, full.owners, "step {step}: {current:?}");
            assert_eq!(incremental.owning, full.owning, "step {step}");
            // And what `update` chooses.
            let mut chosen = Table::new(512);
            chosen.update(&current[..current.len() / 2]);
            assert_eq!(chosen.update(&current).owners, full.owners, "step {step}");
        }
    }

    #[test]
    fn an_insert_takes_only_positions_and_a_removal_gives_back_only_its_own() {
        let three = names(&["a", "b", "c"]);
        let four = names(&["a", "b", "c", "d"]);
        let mut table = Table::new(4096);
        let before = table.update(&three);
        let after = table.update(&four);
        let mut taken = 0;
        for s in 0..4096 {
            if after.owners[s] != before.owners[s] {
                assert_eq!(after.owners[s], 3, "position {s} went to an old endpoint");
                taken += 1;
            }
        }
        assert!((824..=1224).contains(&taken), "{taken} of 4096");
        let back = table.update(&three);
        assert_eq!(back.owners, before.owners);
        let empty = table.update(&[]);
        assert_eq!((empty.len(), empty.owning()), (0, 0));
    }
}

//! The calls in flight on each endpoint (least-loaded strategies), kept side by side in
//! memory.
//!
//! Least-in-flight compares two random endpoints' counts on every pick. With thousands of
//! endpoints, a count kept in its endpoint costs a cache miss of its own (the endpoints and
//! their cards span megabytes); kept here, in blocks of contiguous counters, the two counts
//! are two reads in a few tens of kilobytes that stay in cache, and only the winner's endpoint
//! is read.
//!
//! Each endpoint owns one counter ([`Counter`]) from its insertion until it is dropped — that
//! is, until the last call made on it has finished, since every call in flight holds its
//! endpoint — and only then is the counter free for another endpoint, at zero. A counter is
//! therefore never shared by two endpoints, and an endpoint removed (or replaced) by discovery
//! keeps counting its own calls down to zero while its successor counts from zero.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use endpoint_state::sync::lock;

/// Counters per block: 4 KiB.
const BLOCK: usize = 1024;

/// A block of counters; its place in memory never changes.
pub(crate) struct Block {
    counts: [AtomicU32; BLOCK],
    /// The counters of this block no endpoint owns.
    free: Mutex<Free>,
}

struct Free {
    /// Counters from here on have never been used.
    next: usize,
    /// Counters given back by dropped endpoints (at zero).
    returned: Vec<usize>,
}

impl Block {
    fn new() -> Self {
        Block {
            counts: std::array::from_fn(|_| AtomicU32::new(0)),
            free: Mutex::new(Free {
                next: 0,
                returned: Vec::new(),
            }),
        }
    }

    /// Takes a free counter of this block, if any (its position in the block).
    fn take(&self) -> Option<usize> {
        let mut free = lock(&self.free);
        if let Some(at) = free.returned.pop() {
            return Some(at);
        }
        (free.next < BLOCK).then(|| {
            free.next += 1;
            free.next - 1
        })
    }
}

/// One endpoint's count of calls in flight; freed for another endpoint when dropped.
pub(crate) struct Counter {
    block: Arc<Block>,
    /// The position in the table (block number × [`BLOCK`] + position in the block).
    index: u32,
}

impl Counter {
    fn count(&self) -> &AtomicU32 {
        &self.block.counts[self.index as usize % BLOCK]
    }

    /// Its position in the table, for [`Loads`].
    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    pub(crate) fn get(&self) -> usize {
        self.count().load(Ordering::Relaxed) as usize
    }

    pub(crate) fn add(&self) {
        self.count().fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn sub(&self) {
        self.count().fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        // Every call in flight holds the endpoint, so none is left: the count is back at zero.
        debug_assert_eq!(self.get(), 0, "an endpoint dropped with calls in flight");
        self.count().store(0, Ordering::Relaxed);
        let at = self.index as usize % BLOCK;
        lock(&self.block.free).returned.push(at);
    }
}

/// The counters of one balancer: grown by its background task (the only one that inserts
/// endpoints), read by every snapshot through [`Loads`].
#[derive(Default)]
pub(crate) struct Counters {
    blocks: Vec<Arc<Block>>,
}

impl Counters {
    /// A counter at zero for a new endpoint: the first free one, so that the counters of the
    /// endpoints in use stay close together.
    pub(crate) fn counter(&mut self) -> Counter {
        let found = self
            .blocks
            .iter()
            .enumerate()
            .find_map(|(b, block)| block.take().map(|at| (b, at)));
        let (b, at) = found.unwrap_or_else(|| {
            let block = Arc::new(Block::new());
            let at = block.take().expect("a new block has free counters");
            self.blocks.push(block);
            (self.blocks.len() - 1, at)
        });
        let index = u32::try_from(b * BLOCK + at).expect("fewer than 2^32 endpoints");
        Counter {
            block: self.blocks[b].clone(),
            index,
        }
    }

    /// The counts of `indices` (in that order), for a snapshot.
    pub(crate) fn loads(&self, indices: impl Iterator<Item = u32>) -> Loads {
        Loads {
            blocks: self.blocks.clone().into_boxed_slice(),
            indices: indices.collect(),
        }
    }
}

/// A snapshot's view of the counts of its endpoints, by position in its `picks`: reading one
/// touches the table only, not the endpoint.
pub(crate) struct Loads {
    blocks: Box<[Arc<Block>]>,
    indices: Box<[u32]>,
}

impl Loads {
    /// No counts (strategies that do not count calls in flight).
    pub(crate) fn none() -> Self {
        Loads {
            blocks: Box::new([]),
            indices: Box::new([]),
        }
    }

    /// The calls in flight on the endpoint at position `i`.
    #[inline]
    pub(crate) fn at(&self, i: usize) -> u32 {
        let index = self.indices[i] as usize;
        self.blocks[index / BLOCK].counts[index % BLOCK].load(Ordering::Relaxed)
    }

    pub(crate) fn len(&self) -> usize {
        self.indices.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_contiguous_and_each_has_its_own() {
        let mut counters = Counters::default();
        let held: Vec<Counter> = (0..BLOCK + 3).map(|_| counters.counter()).collect();
        let indices: Vec<u32> = held.iter().map(Counter::index).collect();
        assert_eq!(indices, (0..(BLOCK + 3) as u32).collect::<Vec<_>>());
        assert_eq!(counters.blocks.len(), 2);

        held[1].add();
        held[1].add();
        held[BLOCK + 1].add();
        let loads = counters.loads([1, 0, BLOCK as u32 + 1].into_iter());
        assert_eq!((loads.at(0), loads.at(1), loads.at(2)), (2, 0, 1));
        assert_eq!(loads.len(), 3);
        held[1].sub();
        held[1].sub();
        held[BLOCK + 1].sub();
    }

    #[test]
    fn a_counter_is_reused_only_once_dropped_and_starts_at_zero() {
        let mut counters = Counters::default();
        let a = counters.counter();
        let b = counters.counter();
        a.add();
        // Still owned: a new endpoint gets another counter.
        let c = counters.counter();
        assert_eq!((a.index(), b.index(), c.index()), (0, 1, 2));
        a.sub();
        drop(a);
        let d = counters.counter();
        assert_eq!(d.index(), 0, "the freed counter is reused");
        assert_eq!(d.get(), 0);
        let loads = counters.loads([d.index(), b.index()].into_iter());
        d.add();
        assert_eq!((loads.at(0), loads.at(1)), (1, 0));
        d.sub();
    }
}

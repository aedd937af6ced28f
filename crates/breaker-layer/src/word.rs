//! The breaker's state word: its mode, its free half-open permits and its generation, packed
//! in one `u64` that the request path reads with a single atomic load.

/// The breaker's mode, as packed in the state word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
    ForcedOpen = 3,
    Disabled = 4,
}

const MODE_BITS: u32 = 3;
const MODE_MASK: u64 = (1 << MODE_BITS) - 1;
const PERMIT_BITS: u32 = 16;
const PERMIT_ONE: u64 = 1 << MODE_BITS;
const PERMIT_MASK: u64 = ((1 << PERMIT_BITS) - 1) << MODE_BITS;
const GEN_SHIFT: u32 = MODE_BITS + PERMIT_BITS;

/// A copy of the state word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Word(pub(crate) u64);

impl Word {
    pub(crate) fn new(mode: Mode, permits: u32, generation: u64) -> Self {
        Word(generation << GEN_SHIFT | u64::from(permits) << MODE_BITS | mode as u64)
    }

    pub(crate) fn mode(self) -> Mode {
        match self.0 & MODE_MASK {
            0 => Mode::Closed,
            1 => Mode::Open,
            2 => Mode::HalfOpen,
            3 => Mode::ForcedOpen,
            _ => Mode::Disabled,
        }
    }

    pub(crate) fn permits(self) -> u32 {
        ((self.0 & PERMIT_MASK) >> MODE_BITS) as u32
    }

    /// Every transition starts a new generation: outcomes of calls admitted in an older one
    /// are not counted, and their permits are not given back to a newer one.
    pub(crate) fn generation(self) -> u64 {
        self.0 >> GEN_SHIFT
    }

    /// The same word with one free permit less (there must be one).
    pub(crate) fn permit_taken(self) -> Word {
        Word(self.0 - PERMIT_ONE)
    }

    /// The same word with one free permit more.
    pub(crate) fn permit_given_back(self) -> Word {
        Word(self.0 + PERMIT_ONE)
    }
}

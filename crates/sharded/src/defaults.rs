//! Changing a table's default quota while it is in use: the generations of the default algorithm,
//! the two slot tiers that mark which generation wrote a word, and the carry-over of every key's
//! state ([`Algorithm::carry_over`]: as-is in units at the change).
//!
//! # The protocol
//! Generation `g` of the default quota decides the slots whose tier is `default_tier(g)`: tier 0 for
//! even generations, tier 15 for odd ones (overrides use tiers 1..=14). A change to generation
//! `g + 1`, under every stripe lock (so no insert, override change or overflow decision is under
//! way), appends the new algorithm with its instant `at`, publishes `g + 1`, and carries each
//! stripe's overflow state over. From then on a slot still in the old tier is read as its carried
//! state: every decision, peek or refund that meets such a word decides on
//! `old.carry_over(state, at, new)` and, when it writes, writes that in the new tier, in the same
//! compare-and-swap as its own change. A sweep then carries over every slot still in the old tier,
//! so that when the change returns no slot holds the old tier: the next change can reuse it.
//!
//! Why it is exact: the tier and the state are one 128-bit word, so no word is ever read under a
//! generation other than the one that wrote it (or carried from the one before). A thread that read
//! `current` before the switch and meets a word written after it cannot happen: a word changes tier
//! only with a Release exchange made after an Acquire load saw the new generation, and every reader
//! loads the word (Acquire) before it loads `current`. A decision computed on a stale word is
//! discarded by its failed exchange.

use tollgate_core::{Algorithm, Nanos};

use crate::slot::TIER_MASK;
use crate::sync::{AtomicUsize, Ordering};

/// The tier of the slots generation `generation` of the default quota decides.
#[inline]
pub(crate) const fn default_tier(generation: usize) -> u8 {
    if generation % 2 == 0 {
        0
    } else {
        TIER_MASK as u8
    }
}

/// Whether `tier` is one of the two default-quota tiers (not an override).
#[inline]
pub(crate) const fn is_default_tier(tier: u8) -> bool {
    tier == 0 || tier == TIER_MASK as u8
}

/// Every default algorithm a table has had. The first is a plain field, so a table whose quota
/// never changes pays one load and a predictable branch; later ones live in an append-only list
/// whose entries never move, so a decision borrows one without a lock or a reference count (about a
/// hundred bytes per change, kept for the table's life).
pub(crate) struct Defaults<A> {
    first: A,
    /// Generation `g ≥ 1` at index `g − 1`, with the instant it took over.
    later: boxcar::Vec<(A, Nanos)>,
    current: AtomicUsize,
}

impl<A: Algorithm> Defaults<A> {
    pub(crate) fn new(first: A) -> Self {
        Defaults {
            first,
            later: boxcar::Vec::new(),
            current: AtomicUsize::new(0),
        }
    }

    /// The generation in force.
    #[inline]
    pub(crate) fn generation(&self) -> usize {
        // Acquire: pairs with the Release store in `push`, so the entry it names is written before we
        // read it (boxcar's own entry flag makes this doubly sure).
        self.current.load(Ordering::Acquire)
    }

    /// Generation `generation`'s algorithm.
    #[inline]
    pub(crate) fn get(&self, generation: usize) -> &A {
        match generation {
            0 => &self.first,
            // Entries are pushed before they are named, so this is always there; the first
            // generation is a non-panicking fallback that cannot be reached.
            g => self.later.get(g - 1).map_or(&self.first, |(a, _)| a),
        }
    }

    /// The instant generation `generation` took over (0 for the first).
    pub(crate) fn since(&self, generation: usize) -> Nanos {
        match generation {
            0 => 0,
            g => self.later.get(g - 1).map_or(0, |(_, at)| *at),
        }
    }

    /// The algorithm in force.
    #[inline]
    pub(crate) fn current(&self) -> &A {
        self.get(self.generation())
    }

    /// Appends `algorithm` as of `at` and makes it current; its generation.
    pub(crate) fn push(&self, algorithm: A, at: Nanos) -> usize {
        let generation = self.later.push((algorithm, at)) + 1;
        // Release: publishes the pushed entry to the Acquire load in `generation`.
        self.current.store(generation, Ordering::Release);
        generation
    }
}

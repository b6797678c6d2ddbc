//! [`Shared`]: the one GCRA word every stripe takes its leases from, and the switch of the alone
//! path (plain GCRA on that word while one thread decides alone).

use crossbeam_utils::CachePadded;
use tollgate_core::{AtomicState, Nanos};

use crate::sync::{AtomicU64, Ordering};

/// Refills in a row by one stripe with nobody else taking from the shared word in between, after
/// which the limiter returns to the alone path (crate docs, "One thread alone").
pub(crate) const ALONE_AFTER: u64 = 4;

/// The shared GCRA word and the alone switch, each on its own cache line. Every decision reads the
/// switch and every lease writes the word: beside the word, the switch's line would move between
/// cores on every decision of a limiter whose leases are small (a hot key's, whose burst is split
/// over 16 stripes), where on its own it stays in every reader's cache (it changes only when the
/// limiter goes alone or stops being alone). The alone path reads both lines, which only its one
/// thread then writes.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The shared TAT (all `Relaxed`: see [`AtomicState`]).
    pub(crate) tat: AtomicState,
    /// The costs decided on `tat` directly (the alone path) are those below this: `burst + 1`
    /// while threads take that path, 0 while they decide on their stripes. A hint only: every
    /// decision is exact on either path, so a stale read costs speed, never a unit (crate docs,
    /// "One thread alone"). A bound rather than a flag so that a decision tests the switch and
    /// its cost in one compare ([`alone_takes`](Self::alone_takes)): a denial then costs what
    /// plain GCRA's does, whose cost check it replaces.
    alone_below: CachePadded<AtomicU64>,
    /// What `alone_below` holds while the alone path is on: the burst + 1.
    on: u64,
}

impl Shared {
    /// `tat`, with the alone path on (`alone`) or off; `burst`: the quota's.
    pub(crate) fn new(tat: Nanos, alone: bool, burst: u64) -> Self {
        let on = burst.saturating_add(1);
        Shared {
            tat: AtomicState::new(tat),
            alone_below: CachePadded::new(AtomicU64::new(if alone { on } else { 0 })),
            on,
        }
    }

    /// Whether a decision of `cost` takes the alone path: it is on, and `cost ≤ burst` (a cost
    /// above the burst goes to the stripes' path, which refuses it as GCRA does).
    #[inline(always)]
    pub(crate) fn alone_takes(&self, cost: u64) -> bool {
        // Relaxed: a hint that publishes nothing (see `alone_below`).
        cost < self.alone_below.load(Ordering::Relaxed)
    }

    /// Whether the alone path is on.
    #[inline]
    pub(crate) fn is_alone(&self) -> bool {
        // Relaxed: a hint (see `alone_below`).
        self.alone_below.load(Ordering::Relaxed) != 0
    }

    /// A stripe found nobody else taking from the shared word: back to the alone path.
    pub(crate) fn go_alone(&self) {
        // Relaxed: a hint that publishes nothing (see `alone_below`).
        self.alone_below.store(self.on, Ordering::Relaxed);
    }

    /// The shared TAT.
    #[inline]
    pub(crate) fn load(&self) -> Nanos {
        self.tat.load()
    }

    /// [`AtomicState::update`] on the shared TAT.
    #[inline]
    pub(crate) fn update<T, E>(
        &self,
        current: Nanos,
        transition: impl FnMut(Nanos) -> Result<(T, Option<Nanos>), E>,
    ) -> Result<(T, Nanos), E> {
        self.tat.update(current, transition)
    }

    /// Another thread wrote the shared word under us: leave the alone path.
    #[cold]
    pub(crate) fn contended(&self) {
        // Relaxed: a hint that publishes nothing (see `alone_below`). Written only when set, so
        // that failed exchanges among leasing threads do not keep taking the line from readers.
        if self.is_alone() {
            self.alone_below.store(0, Ordering::Relaxed);
        }
    }
}

//! [`Shared`]: the one GCRA word every stripe takes its leases from, and the switch of the alone
//! path (plain GCRA on that word while one thread decides alone).

use crossbeam_utils::CachePadded;
use tollgate_core::{AtomicState, Nanos};

use crate::sync::{AtomicBool, Ordering};

/// Refills in a row by one stripe with nobody else taking from the shared word in between, after
/// which the limiter returns to the alone path (crate docs, "One thread alone").
pub(crate) const ALONE_AFTER: u64 = 4;

/// The shared GCRA word and the alone flag, each on its own cache line. Every decision reads the
/// flag and every lease writes the word: beside the word, the flag's line would move between cores
/// on every decision of a limiter whose leases are small (a hot key's, whose burst is split over 16
/// stripes), where on its own it stays in every reader's cache (it changes only when the limiter
/// goes alone or stops being alone). The alone path reads both lines, which only its one thread
/// then writes.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The shared TAT (all `Relaxed`: see [`AtomicState`]).
    pub(crate) tat: AtomicState,
    /// Whether threads decide on `tat` directly (the alone path). A hint only: every decision is
    /// exact on either path, so a stale read costs speed, never a unit (crate docs, "One thread
    /// alone").
    pub(crate) alone: CachePadded<AtomicBool>,
}

impl Shared {
    pub(crate) fn new(tat: Nanos, alone: bool) -> Self {
        Shared {
            tat: AtomicState::new(tat),
            alone: CachePadded::new(AtomicBool::new(alone)),
        }
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
        // Relaxed: a hint that publishes nothing (see `alone`). Written only when set, so that
        // failed exchanges among leasing threads do not keep taking the flag's line from readers.
        if self.alone.load(Ordering::Relaxed) {
            self.alone.store(false, Ordering::Relaxed);
        }
    }
}

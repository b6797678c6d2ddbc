//! [`Stripe`]: one stripe's lease word and the lease's bookkeeping.

use crate::lease::LeaseWord;
use crate::sync::AtomicU64;
#[cfg(feature = "diagnostics")]
use crate::sync::Ordering;

/// One stripe: its lease word and the lease's bookkeeping, alone on its cache line(s).
///
/// Only `word` is written outside the lock; every other field is written by the thread holding the
/// stripe's lock (see [`LeaseWord`]) before it publishes the unlocked word with `Release`.
#[derive(Debug)]
pub(crate) struct Stripe {
    /// The packed [`LeaseWord`].
    pub(crate) word: AtomicU64,
    /// End of the current lease's segment on the shared timeline (ns).
    pub(crate) end: AtomicU64,
    /// Current lease size in units (adaptive).
    pub(crate) size: AtomicU64,
    /// When the current lease was taken.
    pub(crate) taken_at: AtomicU64,
    /// Units the current lease held when installed.
    pub(crate) installed: AtomicU64,
    /// The shared TAT right after the current lease was taken (for the approximate `reset_after`).
    pub(crate) tat_seen: AtomicU64,
    /// Units the shared state had free right after the current lease was taken (for the approximate
    /// `remaining`).
    pub(crate) free_seen: AtomicU64,
    /// Units that expired unused or could not be given back (monotone). Read only by
    /// `stranded_units` (feature `diagnostics`), so kept only in that build: in any other, a
    /// leased decision would pay an atomic add whenever time had passed units of its lease by
    /// (every decision of a quota faster than its callers).
    #[cfg(feature = "diagnostics")]
    pub(crate) wasted: AtomicU64,
    /// Refills in a row that found the shared TAT at this stripe's previous lease end (nobody else
    /// took from the shared word in between); at [`ALONE_AFTER`](crate::shared::ALONE_AFTER) the
    /// limiter takes the alone path.
    pub(crate) alone_streak: AtomicU64,
}

impl Stripe {
    pub(crate) fn new(size: u64) -> Self {
        Stripe {
            word: AtomicU64::new(LeaseWord::new(0, 0).bits()),
            end: AtomicU64::new(0),
            size: AtomicU64::new(size),
            taken_at: AtomicU64::new(0),
            installed: AtomicU64::new(0),
            tat_seen: AtomicU64::new(0),
            free_seen: AtomicU64::new(0),
            #[cfg(feature = "diagnostics")]
            wasted: AtomicU64::new(0),
            alone_streak: AtomicU64::new(0),
        }
    }

    /// Counts `units` as wasted (see `wasted`; nothing without feature `diagnostics`).
    #[inline(always)]
    pub(crate) fn count_wasted(&self, units: u64) {
        #[cfg(feature = "diagnostics")]
        if units > 0 {
            // Relaxed RMW: a diagnostic counter that publishes nothing; an RMW because other
            // threads on this stripe add to it too.
            self.wasted.fetch_add(units, Ordering::Relaxed);
        }
        #[cfg(not(feature = "diagnostics"))]
        let _ = units;
    }
}

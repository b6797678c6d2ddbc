//! [`HotTable`]: a table's hot-key state (the detection cells and the promotion entries) and the
//! marker a promoted key's slot holds. Below both the limiter (which holds a table) and the
//! promotion code in `hot.rs` (which reads and writes it).

use tollgate_core::{ManualClock, Nanos};
use tollgate_striped::StripedLimiter;

use crate::hot_config::HotKeyConfig;
use crate::sync::{AtomicU64, AtomicUsize, OnceLock, Ordering};

/// The two top bits of a slot state that mark a promoted key (the entry number is below them). A
/// GCRA TAT this far ahead (2⁶² ns, 146 years) denies every request, so a path that does not know
/// about promotion fails closed on it.
pub(crate) const MARK: u64 = 0b11 << 62;
/// Detection cells (a power of two); a slot uses cell `index % CELLS`.
const CELLS: usize = 64;

/// Whether `state` is a promoted key's marker (not yet checked against its entry).
#[inline(always)]
pub(crate) fn is_marker(state: u64) -> bool {
    state & MARK == MARK
}

/// The marker naming entry `entry`.
pub(crate) fn marker(entry: usize) -> u64 {
    MARK | entry as u64
}

/// One detection cell: the slot whose failures it counts (index + 1; 0 = none), how many, since when.
/// Written only on failed exchanges; a hint (the three words need not agree).
#[derive(Debug)]
struct Cell {
    slot: AtomicUsize,
    count: AtomicU64,
    since: AtomicU64,
}

/// A promoted key: its striped limiter and the slot it serves.
pub(crate) struct Promoted {
    pub(crate) limiter: StripedLimiter<ManualClock>,
    /// The slot's absolute index.
    pub(crate) slot: usize,
    /// The key's tag hash.
    pub(crate) hash_part: u64,
}

/// A table's hot-key state: detection cells and promotion entries.
pub(crate) struct HotTable {
    pub(crate) config: HotKeyConfig,
    cells: Box<[Cell]>,
    /// Entry `e` serves the key whose slot holds `marker(e)`; set once, never reused.
    pub(crate) entries: Box<[OnceLock<Box<Promoted>>]>,
    /// Entries handed out.
    pub(crate) claimed: AtomicUsize,
    /// Keys demoted (monitoring).
    pub(crate) demoted: AtomicUsize,
}

impl HotTable {
    pub(crate) fn new(config: HotKeyConfig) -> Self {
        HotTable {
            config,
            cells: (0..CELLS)
                .map(|_| Cell {
                    slot: AtomicUsize::new(0),
                    count: AtomicU64::new(0),
                    since: AtomicU64::new(0),
                })
                .collect(),
            entries: (0..config.max_promotions)
                .map(|_| OnceLock::new())
                .collect(),
            claimed: AtomicUsize::new(0),
            demoted: AtomicUsize::new(0),
        }
    }

    /// Counts a failed exchange on slot `index` at `now`; whether its key is now hot.
    pub(crate) fn count_failure(&self, index: usize, now: Nanos) -> bool {
        // All Relaxed: the cells are a heuristic that publishes nothing; a lost or torn update only
        // delays or hastens a promotion, and every promotion is safe.
        let cell = &self.cells[index % CELLS];
        let since = cell.since.load(Ordering::Relaxed);
        if cell.slot.load(Ordering::Relaxed) != index + 1
            || now.saturating_sub(since) > self.config.within
        {
            cell.slot.store(index + 1, Ordering::Relaxed);
            cell.since.store(now, Ordering::Relaxed);
            cell.count.store(1, Ordering::Relaxed);
            return self.config.failures <= 1;
        }
        let count = cell.count.fetch_add(1, Ordering::Relaxed) + 1;
        if count < self.config.failures {
            return false;
        }
        cell.slot.store(0, Ordering::Relaxed);
        true
    }

    /// Takes a new entry number; `None` when all are used.
    pub(crate) fn claim(&self) -> Option<usize> {
        // Relaxed: only hands out distinct numbers; the entry is published by the slot's Release
        // exchange (see `promote_locked`).
        let mut claimed = self.claimed.load(Ordering::Relaxed);
        loop {
            if claimed >= self.entries.len() {
                return None;
            }
            match self.claimed.compare_exchange(
                claimed,
                claimed + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(claimed),
                Err(found) => claimed = found,
            }
        }
    }
}

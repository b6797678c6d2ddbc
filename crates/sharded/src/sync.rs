//! The one place that names the atomics and locks this crate uses.
//!
//! Built normally this re-exports `std` and wraps [`portable_atomic::AtomicU128`] (a real 128-bit
//! atomic: `cmpxchg16b` on x86_64, with 16-byte SSE loads where the CPU guarantees their atomicity);
//! built with `RUSTFLAGS="--cfg tollgate_loom"` it re-exports loom's model-checked doubles. Loom has no
//! 128-bit atomic, so under loom [`AtomicPair`] is a `loom::sync::Mutex<u128>`: a linearizable cell with
//! the same `load`/`compare_exchange` API, whose every access is a scheduling point loom explores. That
//! models the real type's guarantees (each access is atomic and all accesses to one cell are totally
//! ordered) though not its weaker-than-lock ordering; the slot protocol never relies on more than
//! per-cell linearizability plus the Acquire/Release pairing described in `table.rs`.

#[cfg(tollgate_loom)]
pub(crate) use loom::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicUsize, Ordering},
};

#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicUsize, Ordering},
};

/// Locks `mutex`, ignoring poisoning: every critical section in this crate leaves the table
/// consistent before anything in it can panic (it only runs pure algorithm code and atomics).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A 16-byte cell read and compare-and-swapped as one unit.
#[cfg(not(tollgate_loom))]
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct AtomicPair(portable_atomic::AtomicU128);

#[cfg(not(tollgate_loom))]
impl AtomicPair {
    /// A cell holding `value`.
    pub(crate) const fn new(value: u128) -> Self {
        AtomicPair(portable_atomic::AtomicU128::new(value))
    }

    /// Atomically reads all 16 bytes.
    #[inline]
    pub(crate) fn load(&self, order: Ordering) -> u128 {
        self.0.load(order)
    }

    /// Replaces the cell with `new` iff it holds `current`; on failure returns what it held.
    #[inline]
    pub(crate) fn compare_exchange(
        &self,
        current: u128,
        new: u128,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u128, u128> {
        self.0.compare_exchange(current, new, success, failure)
    }
}

/// A 16-byte cell read and compare-and-swapped as one unit (loom model: a mutex-guarded `u128`).
#[cfg(tollgate_loom)]
#[derive(Debug)]
pub(crate) struct AtomicPair(loom::sync::Mutex<u128>);

#[cfg(tollgate_loom)]
impl AtomicPair {
    /// A cell holding `value`.
    pub(crate) fn new(value: u128) -> Self {
        AtomicPair(loom::sync::Mutex::new(value))
    }

    /// Atomically reads all 16 bytes.
    pub(crate) fn load(&self, _order: Ordering) -> u128 {
        *lock(&self.0)
    }

    /// Replaces the cell with `new` iff it holds `current`; on failure returns what it held.
    pub(crate) fn compare_exchange(
        &self,
        current: u128,
        new: u128,
        _success: Ordering,
        _failure: Ordering,
    ) -> Result<u128, u128> {
        let mut cell = lock(&self.0);
        if *cell == current {
            *cell = new;
            Ok(current)
        } else {
            Err(*cell)
        }
    }
}

//! The one place that names the atomics this crate uses.
//!
//! Built normally this re-exports `std`; built with `RUSTFLAGS="--cfg tollgate_loom"` it re-exports
//! loom's model-checked doubles, so the loom model in `loom-tests/tests/policy.rs` explores the same
//! code. The thread ordinal that picks a counter stripe is plain `std` in both builds: it is not part
//! of any synchronised state (any stripe is correct, the choice only spreads contention).

#[cfg(tollgate_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// A small number fixed per thread at its first call, handed out round robin.
#[inline]
pub(crate) fn thread_ordinal() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
    static NEXT: StdAtomicUsize = StdAtomicUsize::new(0);
    thread_local! {
        static ORDINAL: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    ORDINAL.with(|ordinal| {
        let mut value = ordinal.get();
        if value == usize::MAX {
            // Relaxed: a distinct-enough number; it orders nothing.
            value = NEXT.fetch_add(1, StdOrdering::Relaxed);
            ordinal.set(value);
        }
        value
    })
}

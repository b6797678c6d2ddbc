//! The one place that names the atomics this crate uses, and the thread-local stripe ordinal.
//!
//! Built normally this re-exports `std`; built with `RUSTFLAGS="--cfg tollgate_loom"` it re-exports
//! loom's model-checked doubles, so the lease protocol the loom models in `loom-tests/` explore is
//! this very code.

#[cfg(tollgate_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};

#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

/// This thread's ordinal: 0 for the first thread that asks, 1 for the next, and so on (round robin
/// over stripes once masked). Assigned at first use and kept for the thread's life, so it works for
/// threads that are not pinned to a core.
#[cfg(not(tollgate_loom))]
#[inline]
pub(crate) fn thread_ordinal() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        // `const` and no destructor: the access is one thread-pointer-relative load.
        static ORDINAL: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    ORDINAL.with(|ordinal| {
        let mut value = ordinal.get();
        if value == usize::MAX {
            // Relaxed: the counter only hands out distinct numbers; it publishes nothing.
            value = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) & (usize::MAX >> 1);
            ordinal.set(value);
        }
        value
    })
}

/// Under loom every thread maps to stripe 0; the models choose stripes explicitly with
/// `check_on_stripe` (feature `diagnostics`).
#[cfg(tollgate_loom)]
#[inline]
pub(crate) fn thread_ordinal() -> usize {
    0
}

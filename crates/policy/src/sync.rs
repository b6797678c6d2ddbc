//! The one place that names the atomics this crate uses.
//!
//! Built normally this re-exports `std`; built with `RUSTFLAGS="--cfg tollgate_loom"` it re-exports
//! loom's model-checked doubles, so the loom model in `loom-tests/tests/policy.rs` explores the same
//! code. The thread ordinal that picks a counter stripe is plain `std` TLS: it is not synchronised
//! state. Under loom every model thread runs on one OS thread and so would share one ordinal, which
//! would break the one-writer-per-stripe rule of `stats.rs`; the loom build therefore reports no
//! ordinal, and every count takes the shared read-modify-write path.

#[cfg(tollgate_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};

#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};

/// This thread's ordinal: fixed at its first call, unique for the life of the process (handed out
/// in order, never reused), so that a counter stripe indexed by it has exactly one writer.
#[cfg(not(tollgate_loom))]
#[inline]
pub(crate) fn thread_ordinal() -> Option<usize> {
    Some(std_thread_ordinal())
}

/// The loom build: no ordinal (see the module docs).
#[cfg(tollgate_loom)]
#[inline]
pub(crate) fn thread_ordinal() -> Option<usize> {
    None
}

#[cfg_attr(tollgate_loom, allow(dead_code))]
#[inline]
fn std_thread_ordinal() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
    static NEXT: StdAtomicUsize = StdAtomicUsize::new(0);
    thread_local! {
        static ORDINAL: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    ORDINAL.with(|ordinal| {
        let mut value = ordinal.get();
        if value == usize::MAX {
            // Relaxed: the RMW alone makes each value unique; it orders nothing else.
            value = NEXT.fetch_add(1, StdOrdering::Relaxed);
            ordinal.set(value);
        }
        value
    })
}

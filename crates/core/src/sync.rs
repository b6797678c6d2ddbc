//! The one place that names the atomics and locks the core uses.
//!
//! Built normally this re-exports `std`; built with `RUSTFLAGS="--cfg tollgate_loom"` it re-exports
//! [loom]'s model-checked doubles, so the same algorithm code is what the loom models in `loom-tests/`
//! explore. The project-specific cfg (rather than `cfg(loom)`) keeps tokio and other dependencies on
//! their ordinary code paths.
//!
//! [loom]: https://docs.rs/loom

#[cfg(tollgate_loom)]
pub(crate) use loom::sync::{
    Arc, Mutex, MutexGuard,
    atomic::{AtomicU64, Ordering},
};

#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::{
    Arc, Mutex, MutexGuard,
    atomic::{AtomicU64, Ordering},
};

/// Locks `mutex`, ignoring poisoning: every critical section in this crate leaves its data consistent
/// before anything in it can panic, so a poisoned lock still guards valid state.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

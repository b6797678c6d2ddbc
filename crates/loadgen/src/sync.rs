//! The only file in this crate that names `std::sync::atomic` (the project's one-shim habit). The load
//! generator is not loom-modelled, so there is no loom switch here.

pub(crate) use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
// Only the runner's tests count with it now that the allocator lives in tollgate-test-support.
#[cfg(test)]
pub(crate) use std::sync::atomic::AtomicUsize;

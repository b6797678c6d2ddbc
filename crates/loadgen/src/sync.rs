//! The only file in this crate that names `std::sync::atomic` (the project's one-shim habit). The load
//! generator is not loom-modelled, so there is no loom switch here.

pub(crate) use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};

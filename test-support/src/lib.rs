//! Helpers shared by Tollgate's tests and benchmarks (never published):
//!
//! * [`stress`]: N std threads released together by a barrier, round after round, each round's total
//!   checked against an exact expectation: the `cargo test` companion of the loom models, which
//!   catches a lost update (a broken compare-and-swap) without the loom build.
//! * [`alloc`]: a counting global allocator (live bytes, peak, and allocation calls made by one
//!   thread while it counts), for the memory figures and the allocation-free assertions.
//!
//! It depends on nothing but `std`, so every crate of the workspace can take it as a dev-dependency
//! without a dependency cycle.

pub mod alloc;
pub mod stress;

//! Criterion benchmarks for Tollgate live in this crate's `benches/` folder; this library is empty.

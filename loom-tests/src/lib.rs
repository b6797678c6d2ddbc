//! Loom models of Tollgate's lock-free state machines live in `tests/`; this library is empty.
//!
//! Run them with `loom-tests/run.sh` (which sets `RUSTFLAGS="--cfg tollgate_loom"`).

//! A counting global allocator, so keyed runs can report bytes per key.
//!
//! The binary installs [`CountingAlloc`] with `#[global_allocator]`; [`allocated_bytes`] then reads
//! the live heap size. It adds a few relaxed atomic operations per allocation and nothing on paths
//! that do not allocate (every Tollgate decision path). The allocator itself is the workspace's one
//! copy, in the unpublished `tollgate-test-support` crate (shared with the sharded flood test and
//! the keyed-memory bench).

pub use tollgate_test_support::alloc::{CountingAlloc, allocated_bytes};

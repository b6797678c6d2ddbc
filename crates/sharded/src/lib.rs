//! A bounded, lock-free keyed rate limiter: one core [`Algorithm`](tollgate_core::Algorithm) state
//! word per key, in a fixed-size, preallocated, striped table with automatic eviction.
//!
//! ```
//! use std::net::IpAddr;
//! use tollgate_core::{Gcra, Quota};
//! use tollgate_sharded::KeyedLimiter;
//!
//! // 100 requests per second per client IP, for up to 1 M clients (≈ 23 MB, allocated now).
//! let limiter: KeyedLimiter<IpAddr, Gcra> = KeyedLimiter::new(Quota::per_second(100)?, 1_000_000)?;
//! let ip: IpAddr = "192.0.2.1".parse()?;
//! assert!(limiter.check_key(&ip, 1)?.is_allowed());
//! assert!(limiter.memory_bytes() < 24 * 1_000_000);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Capacity, eviction and the full-table policy
//! * **Capacity** is a hard memory bound: `capacity × 10/7` slots of 16 bytes (≈ 22.9 B per key) are
//!   allocated at construction and the table never grows.
//! * **Eviction** is automatic: when a new key finds no empty slot in its probe window, it may take
//!   one whose key's state is [fresh](tollgate_core::Algorithm::is_fresh) (GCRA: bucket full again;
//!   windows: expired). That key's next request sees a fresh state — exactly what it would have seen
//!   had it been kept.
//! * **Full window**: a new key whose probe window (default 32 slots) holds only live keys is not
//!   inserted; it is decided by its stripe's shared overflow state under the default quota. Live keys are
//!   never evicted or reset, so flooding keys cannot buy anyone a fresh burst; it can only make new keys
//!   stricter while the flood lasts. A key that overflowed and is inserted later (the table has room
//!   again) starts from the overflow state, not fresh, so its admissions — through the overflow state
//!   and its own slot together — never exceed what its own quota allows.
//! * **Overrides** ([`KeyedLimiter::set_override`]): up to [`MAX_OVERRIDE_QUOTAS`] quotas, chosen by a
//!   4-bit tier in the key's own slot (no second table); such slots are pinned.
//! * **Changing the default quota** in use ([`KeyedLimiter::set_default`]): every key's state carries
//!   over as-is in units ([`Algorithm::carry_over`](tollgate_core::Algorithm::carry_over): it keeps
//!   `min(what it had, the new capacity)`), exactly, while decisions go on; so do override changes.
//!
//! # Keys and hashing
//! Any `Hash` key (integers, [`IpAddr`](std::net::IpAddr), `str`, `[u8]`, `String`, …); lookups accept
//! any borrowed form (`KeyedLimiter<String, _>` takes `&str`). Keys are hashed once with a per-limiter
//! randomly seeded `foldhash` (quality variant); the table stores a 60-bit hash tag, not the key. Two
//! keys sharing a tag share one budget (stricter, never looser): the probability that any pair among
//! 10 M keys does so is below 5 × 10⁻⁵.
//!
//! # Many keys at once
//! In a table larger than the CPU cache, a decision costs about one memory round trip (the slot's
//! line), and one call cannot overlap its round trip with the next call's. [`KeyedLimiter::check_keys`]
//! takes a stream of keys and requests each key's slot [`CHECK_KEYS_LOOKAHEAD`] keys before deciding
//! it, so the round trips overlap (≈ 3× the throughput of `check_key` at 1 M uniform keys in
//! `results/keyed`); [`KeyedLimiter::prefetch_key`] is the same hint for one key known early.
//!
//! # Concurrency
//! Decisions on known keys are lock-free: a window scan of 16-byte atomic loads, then one 128-bit
//! compare-and-swap of the (tag, state) pair when admitting (none when denying). Inserting a new key
//! takes its stripe's mutex for a rescan and one CAS. No allocation after construction (except,
//! with hot keys on, one striped limiter per promotion). The slot
//! protocol and its memory orderings are described in `IMPLEMENTATION.md`; loom models live in
//! `loom-tests/tests/sharded.rs`.
//!
//! # Hot keys
//! A GCRA table built with [`Builder::promote_hot_keys`] serves a key whose slot keeps losing its
//! compare-and-swap through a leased striped limiter continuing the key's own timeline, until the
//! key cools (its bucket is full again); never more admissions than the plain key would make. Off
//! by default; the proof and the limits are in `src/hot.rs`.

mod batch;
mod builder;
mod defaults;
mod error;
mod headroom;
mod hot;
mod hot_config;
mod hot_table;
mod inflight;
mod insert;
mod ledger;
mod limiter;
mod overrides;
mod receipt;
mod refund;
mod requota;
mod slot;
mod sync;
mod table;

pub use batch::{CHECK_KEYS_LOOKAHEAD, CheckKeys};
pub use builder::Builder;
pub use error::KeyedError;
pub use hot_config::{HotKeyConfig, MAX_PROMOTIONS};
pub use inflight::{KeyPermit, KeyedInFlight};
pub use limiter::{
    DEFAULT_WINDOW, KeyedLimiter, MAX_OVERRIDE_QUOTAS, MAX_STRIPES, MAX_WINDOW, MIN_WINDOW,
};
pub use receipt::SlotReceipt;

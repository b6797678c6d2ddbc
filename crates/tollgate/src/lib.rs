//! Tollgate: fast, proven rate limiting for hot paths (load balancers, API gateways, services).
//!
//! One [`Decision`] (allowed with `remaining`/`reset_after`, or denied with `retry_after`) across
//! five algorithms; a bounded keyed table for millions of clients ([`KeyedLimiter`], feature
//! `sharded`); one global quota shared by many cores ([`StripedLimiter`], feature `striped`); and,
//! behind features, Redis for a fleet (`redis`), the tower edge (`http`), the retry client
//! (`client`) and the policy engine (`policy`); `full` turns on all of them.
//!
//! ```
//! use tollgate::{Decision, GcraLimiter, Limiter, Quota};
//!
//! // 100 per second, bursts of 10: lock-free, one atomic word.
//! let limiter = GcraLimiter::new(Quota::per_second(100)?.with_burst(10)?)?;
//! match limiter.check() {
//!     Decision::Allowed { remaining, .. } => assert_eq!(remaining, 9),
//!     Decision::Denied { .. } => unreachable!("a fresh limiter admits its burst"),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The guides, each a file under `guides/` in the repository, are rendered in [`guide`].
#![forbid(unsafe_code)]

pub mod guide;

// The README's code blocks run as doctests without being rendered here (its relative links are for
// the repository, not for docs.rs).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

pub use tollgate_core::*;

#[cfg(feature = "sharded")]
pub use tollgate_sharded::{self as sharded, KeyedLimiter};

#[cfg(feature = "striped")]
pub use tollgate_striped::{self as striped, StripedLimiter};

#[cfg(feature = "redis")]
pub use tollgate_redis as redis;

#[cfg(feature = "http")]
pub use tollgate_http as http;

#[cfg(feature = "client")]
pub use tollgate_client as client;

#[cfg(feature = "policy")]
pub use tollgate_policy::{self as policy, Policy, PolicyConfig, PolicyDecision};

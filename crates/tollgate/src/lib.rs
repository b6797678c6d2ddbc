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
//! # One verb family
//!
//! Every limiter in the workspace decides with the same verbs, and each verb means one thing:
//!
//! | verb | what it does | on |
//! |---|---|---|
//! | `check` | decides a request of some cost and, when admitted, counts it; a denial writes nothing | [`Limiter::check`] / `check_n` (every core algorithm), `KeyedLimiter::check_key`, `StripedLimiter::check`, the Redis limiters' `check`, `Policy::check` |
//! | `peek` | the same decision, counting nothing | [`Limiter::peek`], `KeyedLimiter::peek_key`, `Policy::peek_rule_at` |
//! | `try_acquire` | takes an in-flight permit, given back when the permit drops | `InFlightLimiter`, `KeyedInFlight` (`_scoped`: a permit that borrows the table) |
//! | `admit` | checks rate rules and takes in-flight permits as one | `Policy::admit` |
//! | `reserve`, `settle`, `charge` | costs known after the response: take an estimate, bring it to the actual cost; or charge after the fact | `Policy`, `RedisPolicy` |
//! | `decide` | an edge's verdict (status, `Retry-After`, `RateLimit` fields) from a check | `EdgeVerdict::decide`, `PolicyEdge::decide` (feature `http`) |
//! | `validate` | a config's checks; decides nothing | `PolicyConfig::validate`, the server's config |
//!
//! Suffixes say how: `_at` takes the time (nanoseconds on the limiter's clock) instead of reading
//! the clock; `_key` names the key of a keyed table; `_all` decides several requests as one;
//! `_next` also answers the `RateLimit` field's `t`; `_detailed` answers each rule's outcome; a
//! `try_` on a Redis call answers the store's error instead of applying the fail policy.
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

//! Tollgate's core: rate-limiting algorithms as pure state transitions, the lock-free single limiters
//! that store them, and the clocks that time them.
//!
//! # Quick start
//! ```
//! use tollgate_core::{Decision, GcraLimiter, Limiter, Quota};
//!
//! let limiter = GcraLimiter::new(Quota::per_second(100)?.with_burst(10)?)?;
//! match limiter.check() {
//!     Decision::Allowed { remaining, .. } => println!("ok, {remaining} left"),
//!     Decision::Denied { retry_after, .. } => println!("slow down for {retry_after:?}"),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The pieces
//! * [`Quota`]: how many per how long, validated once ([`QuotaError`]).
//! * [`Decision`]: allowed with `remaining`/`reset_after`, or denied with `retry_after`; a cost that
//!   can never pass is a [`CheckError`], not a denial.
//! * [`algorithm`]: [`Gcra`], [`LeakyBucket`] (meter), [`FixedWindow`], [`SlidingWindow`] — each a pure
//!   `decide(state, now, cost)` over one `u64` word.
//! * Storage: [`AtomicLimiter`] (one cache-padded atomic word, lock-free), [`SlidingLog`] (exact, a
//!   ring of timestamps under a mutex), [`Shaper`] (leaky bucket as a pacer: callers wait for a slot).
//! * [`Limiter`]: the trait all single limiters implement.
//! * [`Clock`]: [`MonotonicClock`] (default, TSC), [`CoarseClock`] (cached), [`ManualClock`] (tests).
//!
//! # Choosing an algorithm
//! | algorithm | bound | memory | pick it when |
//! |---|---|---|---|
//! | [`Gcra`] | ≤ burst + rate × elapsed, exact | 8 B | default: smooth, exact, cheapest |
//! | [`LeakyBucket`] | same as GCRA (it is GCRA) | 8 B | you think in water levels |
//! | [`FixedWindow`] | ≤ limit per aligned window; 2 × limit across a boundary | 8 B | counting per calendar window (billing) |
//! | [`SlidingWindow`] | ≤ limit per aligned window, ≤ 2 × limit per trailing window, small error on real traffic | 8 B | window semantics without the boundary burst, cheaply |
//! | [`SlidingLog`] | exactly ≤ limit per trailing window | 8 B × limit | exactness matters and limits are small |
//! | [`Shaper`] | output ≤ burst + rate × elapsed | 8 B | smooth outgoing traffic instead of refusing it |
//!
//! # Failure policy
//! Every path fails closed: an error ([`CheckError`], [`ShapeError`]) admits and records nothing; a
//! clock that goes backwards makes decisions stricter, never looser; time past the 584-year end of the
//! clock's range denies.
//!
//! # Concurrency
//! The four word algorithms run lock-free on [`AtomicState`]: one load, and one compare-and-swap only
//! when admitting, all `Relaxed` (the word publishes nothing else; see [`state`]). No allocation, lock
//! or syscall on the decision path; one clock read per decision. Code that touches atomics names them
//! through one private `sync` module, which the loom models in `loom-tests/` swap for loom's.

#![forbid(unsafe_code)]

pub mod algorithm;
mod atomic_limiter;
pub mod clock;
mod decision;
mod inflight_limiter;
mod limiter;
mod quota;
mod shaper;
mod sliding_log;
pub mod state;
mod sync;

pub use algorithm::fixed_window::FixedWindow;
pub use algorithm::gcra::Gcra;
pub use algorithm::inflight::{InFlight, MAX_IN_FLIGHT, Release};
pub use algorithm::leaky_bucket::LeakyBucket;
pub use algorithm::sliding_window::SlidingWindow;
pub use algorithm::{Algorithm, Transition};
pub use atomic_limiter::{
    AtomicLimiter, FixedWindowLimiter, GcraLimiter, LeakyBucketLimiter, SlidingWindowLimiter,
};
pub use clock::{Clock, ClockError, CoarseClock, ManualClock, MonotonicClock, Nanos};
pub use decision::{CheckError, Decision};
pub use inflight_limiter::{InFlightLimiter, Permit};
pub use limiter::Limiter;
pub use quota::{Quota, QuotaError};
pub use shaper::{ShapeError, Shaper};
pub use sliding_log::{SLIDING_LOG_MAX_LIMIT, SlidingLog};
pub use state::AtomicState;

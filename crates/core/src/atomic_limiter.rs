//! A single limiter: one algorithm, one cache-padded atomic word, one clock.

use crossbeam_utils::CachePadded;

use crate::algorithm::Algorithm;
use crate::algorithm::fixed_window::FixedWindow;
use crate::algorithm::gcra::Gcra;
use crate::algorithm::leaky_bucket::LeakyBucket;
use crate::algorithm::sliding_window::SlidingWindow;
use crate::clock::{Clock, MonotonicClock, Nanos};
use crate::decision::{CheckError, Decision};
use crate::limiter::Limiter;
use crate::quota::{Quota, QuotaError};
use crate::state::AtomicState;

/// A lock-free limiter running algorithm `A` on one atomic word, timed by clock `C`.
///
/// The word sits alone on its cache line(s) ([`CachePadded`]) so sharing the limiter across threads
/// does not also bounce unrelated data. A decision reads the clock once, loads the word, and — only
/// when admitting — compare-and-swaps it; it never allocates, locks or makes a syscall. See
/// [`AtomicState`] for the memory-ordering argument.
///
/// Fails closed: errors (a cost above capacity) consume nothing and admit nothing.
///
/// ```
/// use tollgate_core::{GcraLimiter, Limiter, Quota};
/// let limiter = GcraLimiter::new(Quota::per_second(100)?)?;
/// assert!(limiter.check().is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct AtomicLimiter<A, C = MonotonicClock> {
    state: CachePadded<AtomicState>,
    algorithm: A,
    clock: C,
}

/// Token bucket (GCRA) on one atomic word.
pub type GcraLimiter<C = MonotonicClock> = AtomicLimiter<Gcra, C>;
/// Leaky bucket meter on one atomic word.
pub type LeakyBucketLimiter<C = MonotonicClock> = AtomicLimiter<LeakyBucket, C>;
/// Fixed window counter on one atomic word.
pub type FixedWindowLimiter<C = MonotonicClock> = AtomicLimiter<FixedWindow, C>;
/// Sliding window counter on one atomic word.
pub type SlidingWindowLimiter<C = MonotonicClock> = AtomicLimiter<SlidingWindow, C>;

impl<A: Algorithm> AtomicLimiter<A, MonotonicClock> {
    /// A fresh limiter on the default monotonic clock.
    ///
    /// # Errors
    /// A [`QuotaError`] when `A` cannot represent the quota.
    pub fn new(quota: Quota) -> Result<Self, QuotaError> {
        Self::with_clock(quota, MonotonicClock::new())
    }
}

impl<A: Algorithm, C: Clock> AtomicLimiter<A, C> {
    /// A fresh limiter reading `clock`.
    ///
    /// # Errors
    /// A [`QuotaError`] when `A` cannot represent the quota.
    pub fn with_clock(quota: Quota, clock: C) -> Result<Self, QuotaError> {
        Ok(Self::from_algorithm(A::from_quota(quota)?, clock))
    }

    /// A fresh limiter for an already-built algorithm.
    pub fn from_algorithm(algorithm: A, clock: C) -> Self {
        AtomicLimiter {
            state: CachePadded::new(AtomicState::new(0)),
            algorithm,
            clock,
        }
    }

    /// The algorithm's parameters.
    pub fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Gives back an admission of `cost` units that [`check_at`](Limiter::check_at) granted at `now`,
    /// in the one CAS loop every decision uses. Exact when applied at the admission's `now` (see
    /// [`Algorithm::refund`] for each algorithm's statement); never looser. Returns whether the state
    /// changed.
    ///
    /// ```
    /// use tollgate_core::{GcraLimiter, Limiter, ManualClock, Quota};
    /// let limiter = GcraLimiter::with_clock(Quota::per_second(1)?, ManualClock::new())?;
    /// let now = limiter.now();
    /// assert!(limiter.check_at(now, 1)?.is_allowed());
    /// assert!(limiter.refund_at(now, 1)); // as if it had not come
    /// assert!(limiter.check_at(now, 1)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn refund_at(&self, now: Nanos, cost: u64) -> bool {
        self.state.refund(&self.algorithm, now, cost)
    }

    /// The raw state word (feature `diagnostics`, for tests and models).
    #[cfg(feature = "diagnostics")]
    pub fn state_word(&self) -> u64 {
        self.state.load()
    }
}

impl<A: Algorithm, C: Clock> Limiter for AtomicLimiter<A, C> {
    #[inline]
    fn now(&self) -> Nanos {
        self.clock.now()
    }

    fn quota(&self) -> &Quota {
        self.algorithm.quota()
    }

    #[inline]
    fn check_at(&self, now: Nanos, cost: u64) -> Result<Decision, CheckError> {
        self.state.apply(&self.algorithm, now, cost)
    }

    #[inline]
    fn peek_at(&self, now: Nanos, cost: u64) -> Result<Decision, CheckError> {
        self.state.peek(&self.algorithm, now, cost)
    }
}

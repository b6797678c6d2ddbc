//! The interface every single (unkeyed) limiter offers.

use crate::clock::Nanos;
use crate::decision::{CheckError, Decision};
use crate::quota::Quota;

/// A rate limiter for one logical quota: what the load generator, the HTTP layer and users' code can be
/// generic over.
///
/// The `_at` methods take the time explicitly, for simulation and tests; the others read the limiter's
/// clock once.
///
/// ```
/// use tollgate_core::{Decision, GcraLimiter, Limiter, ManualClock, Quota};
///
/// let limiter = GcraLimiter::with_clock(Quota::per_second(2)?, ManualClock::new())?;
/// assert!(limiter.check().is_allowed());
/// assert!(limiter.check_n(1)?.is_allowed());
/// match limiter.check() {
///     Decision::Denied { retry_after, .. } => assert_eq!(retry_after.as_millis(), 500),
///     Decision::Allowed { .. } => unreachable!("the bucket of 2 is empty"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Limiter: Send + Sync {
    /// The limiter's current time.
    fn now(&self) -> Nanos;

    /// The quota enforced.
    fn quota(&self) -> &Quota;

    /// Decides a request of `cost` units at `now`, consuming capacity if allowed.
    ///
    /// # Errors
    /// [`CheckError::CostExceedsCapacity`] when `cost` can never be admitted.
    fn check_at(&self, now: Nanos, cost: u64) -> Result<Decision, CheckError>;

    /// What [`check_at`](Self::check_at) would decide, without consuming anything.
    ///
    /// # Errors
    /// As [`check_at`](Self::check_at).
    fn peek_at(&self, now: Nanos, cost: u64) -> Result<Decision, CheckError>;

    /// Decides a request of `cost` units now.
    ///
    /// # Errors
    /// As [`check_at`](Self::check_at).
    #[inline]
    fn check_n(&self, cost: u64) -> Result<Decision, CheckError> {
        self.check_at(self.now(), cost)
    }

    /// Decides a request of one unit now.
    ///
    /// Infallible: every validated quota admits at least one unit. Should an implementation still
    /// report an error, this fails closed (denied, `retry_after` of [`Decision::NEVER`]).
    #[inline]
    fn check(&self) -> Decision {
        self.check_n(1)
            .unwrap_or(Decision::denied(Nanos::MAX, Nanos::MAX))
    }

    /// What a request of `cost` units would get now, without consuming anything.
    ///
    /// # Errors
    /// As [`check_at`](Self::check_at).
    #[inline]
    fn peek(&self, cost: u64) -> Result<Decision, CheckError> {
        self.peek_at(self.now(), cost)
    }
}

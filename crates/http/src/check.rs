//! The one thing the layer needs from a limiter.

use std::hash::Hash;
use std::sync::Arc;

use tollgate_core::{
    Algorithm, AtomicLimiter, CheckError, Clock, Decision, Limiter, Quota, SlidingLog,
};
use tollgate_sharded::KeyedLimiter;

/// A limiter that decides a cost for a key: what each policy of a
/// [`RateLimitLayer`](crate::RateLimitLayer) wraps.
///
/// Implemented for [`tollgate_sharded::KeyedLimiter`] (one state per key) and for the core single
/// limiters ([`AtomicLimiter`], [`SlidingLog`]), which ignore the key: a global limit. Implement it
/// for your own synchronous storage (a tiered lookup) to put it behind the layer; storage that
/// decides over the network (a Redis limiter) implements
/// [`AsyncKeyedCheck`](crate::AsyncKeyedCheck) and sits behind
/// [`AsyncRateLimitLayer`](crate::AsyncRateLimitLayer).
pub trait KeyedCheck<K: ?Sized>: Send + Sync + 'static {
    /// Decides `cost` units for `key` now, consuming them if allowed.
    ///
    /// # Errors
    /// [`CheckError::CostExceedsCapacity`] when `cost` can never be admitted.
    fn check_key(&self, key: &K, cost: u64) -> Result<Decision, CheckError>;

    /// What [`check_key`](Self::check_key) would decide for `cost` units now, consuming nothing.
    ///
    /// The layer asks it for the `RateLimit` field's `t` (see [`crate::headers`]): after a
    /// decision that leaves `r` units, `peek_key(key, r + 1)` says how long until more than `r`
    /// would be admitted. It must not change the key's state.
    ///
    /// # Errors
    /// [`CheckError::CostExceedsCapacity`] when `cost` can never be admitted (the layer then reads
    /// `r` as the whole quota: `t` is 0).
    fn peek_key(&self, key: &K, cost: u64) -> Result<Decision, CheckError>;

    /// The quota advertised in the `RateLimit-Policy` header.
    fn quota(&self) -> &Quota;
}

impl<K, A, C> KeyedCheck<K> for KeyedLimiter<K, A, C>
where
    K: Hash + ?Sized + 'static,
    A: Algorithm + 'static,
    C: Clock + 'static,
{
    #[inline]
    fn check_key(&self, key: &K, cost: u64) -> Result<Decision, CheckError> {
        KeyedLimiter::check_key(self, key, cost)
    }

    #[inline]
    fn peek_key(&self, key: &K, cost: u64) -> Result<Decision, CheckError> {
        KeyedLimiter::peek_key(self, key, cost)
    }

    fn quota(&self) -> &Quota {
        KeyedLimiter::quota(self)
    }
}

impl<K, A, C> KeyedCheck<K> for AtomicLimiter<A, C>
where
    K: ?Sized,
    A: Algorithm + Send + Sync + 'static,
    C: Clock + 'static,
{
    #[inline]
    fn check_key(&self, _: &K, cost: u64) -> Result<Decision, CheckError> {
        self.check_n(cost)
    }

    #[inline]
    fn peek_key(&self, _: &K, cost: u64) -> Result<Decision, CheckError> {
        self.peek(cost)
    }

    fn quota(&self) -> &Quota {
        Limiter::quota(self)
    }
}

impl<K: ?Sized, C: Clock + 'static> KeyedCheck<K> for SlidingLog<C> {
    #[inline]
    fn check_key(&self, _: &K, cost: u64) -> Result<Decision, CheckError> {
        self.check_n(cost)
    }

    #[inline]
    fn peek_key(&self, _: &K, cost: u64) -> Result<Decision, CheckError> {
        self.peek(cost)
    }

    fn quota(&self) -> &Quota {
        Limiter::quota(self)
    }
}

impl<K: ?Sized, L: KeyedCheck<K> + ?Sized> KeyedCheck<K> for Arc<L> {
    #[inline]
    fn check_key(&self, key: &K, cost: u64) -> Result<Decision, CheckError> {
        (**self).check_key(key, cost)
    }

    #[inline]
    fn peek_key(&self, key: &K, cost: u64) -> Result<Decision, CheckError> {
        (**self).peek_key(key, cost)
    }

    fn quota(&self) -> &Quota {
        (**self).quota()
    }
}

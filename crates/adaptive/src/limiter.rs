//! [`ConcurrencyLimiter`]: admission against a limit that a [`LimitAlgorithm`] moves.
//!
//! # Concurrency
//! Admission is lock-free: one load of the limit and a compare-and-swap on the in-flight count, so
//! a denial never waits for anything. A finished request takes one `std::sync::Mutex` (a futex:
//! one uncontended atomic exchange on entry and one on exit) around the algorithm's `on_sample`,
//! which runs a few float operations and, once per window, the update. The lock is taken after
//! the request's slot is already given back, so it never delays an admission; a lock-free sample
//! path (atomic sums swapped out per window) was not worth its subtlety: a window's mean and its
//! sample count would be swapped out separately, and the update would need a lock anyway.
//!
//! # Ordering
//! Every atomic here is `Relaxed`. The in-flight count and the limit publish no other memory: an
//! admission depends only on the count's own value (all read-modify-writes of one location are
//! totally ordered whatever their ordering, so no two admissions take the same last slot), and a
//! limit read a moment late only means one decision against the previous limit, which any
//! ordering would allow too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::algorithm::{LimitAlgorithm, Sample};

/// An in-flight limit: [`acquire`](Self::acquire) a [`Token`] before forwarding a request,
/// [`complete`](Token::complete) it with the request's latency when the response is done (or drop
/// it: cancelled, failed). At most `limit()` tokens are out at once, except right after the limit
/// fell: tokens already out are never recalled, so the count drains down to the new limit.
///
/// ```
/// use std::time::Duration;
/// use tollgate_adaptive::{AimdConfig, AimdLimit, ConcurrencyLimiter};
/// let limiter = ConcurrencyLimiter::new(AimdLimit::new(AimdConfig::default())?);
/// let token = limiter.acquire().expect("20 slots to start with");
/// assert_eq!(limiter.in_flight(), 1);
/// token.complete(Duration::from_millis(5));
/// assert_eq!(limiter.in_flight(), 0);
/// # Ok::<(), tollgate_adaptive::LimitConfigError>(())
/// ```
#[derive(Debug)]
pub struct ConcurrencyLimiter<A> {
    in_flight: AtomicU64,
    limit: AtomicU64,
    algorithm: Mutex<A>,
}

impl<A: LimitAlgorithm> ConcurrencyLimiter<A> {
    /// A limiter starting at `algorithm`'s initial limit (at least 1).
    pub fn new(algorithm: A) -> Self {
        ConcurrencyLimiter {
            in_flight: AtomicU64::new(0),
            limit: AtomicU64::new(algorithm.initial_limit().max(1)),
            algorithm: Mutex::new(algorithm),
        }
    }

    /// A slot, or `None` when `limit()` requests are already in flight.
    #[inline]
    pub fn acquire(&self) -> Option<Token<'_, A>> {
        self.take().map(|(in_flight, limit)| Token {
            limiter: Some(self),
            in_flight,
            limit,
        })
    }

    /// [`acquire`](Self::acquire) for a token that must outlive the borrow (moved into a response
    /// body, a spawned task): it holds an `Arc` of the limiter.
    #[inline]
    pub fn acquire_owned(self: &Arc<Self>) -> Option<OwnedToken<A>> {
        self.take().map(|(in_flight, limit)| OwnedToken {
            limiter: Some(Arc::clone(self)),
            in_flight,
            limit,
        })
    }

    /// The limit now.
    #[inline]
    pub fn limit(&self) -> u64 {
        // Relaxed: see the module's ordering notes.
        self.limit.load(Ordering::Relaxed)
    }

    /// Requests in flight now.
    #[inline]
    pub fn in_flight(&self) -> u64 {
        // Relaxed: see the module's ordering notes.
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The algorithm's name.
    pub fn algorithm_name(&self) -> &'static str {
        self.lock().name()
    }

    /// Takes a slot: the in-flight count after taking it, and the limit it was taken under.
    #[inline]
    fn take(&self) -> Option<(u64, u64)> {
        let limit = self.limit();
        // Relaxed on all three: see the module's ordering notes.
        self.in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|before| (before + 1, limit))
    }

    /// Gives a slot back and shows the algorithm how the request went.
    fn release(&self, in_flight: u64, limit: u64, latency: Option<Duration>) {
        // Relaxed: see the module's ordering notes. Each token releases exactly once (its
        // `limiter` is taken), so the count never goes below 0.
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        let sample = Sample {
            latency,
            in_flight,
            limit,
        };
        let limit = self.lock().on_sample(sample).max(1);
        // Relaxed: as above. Two releases may store in either order; each stored value is one the
        // algorithm returned, and the next sample stores again.
        self.limit.store(limit, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, A> {
        // A panic inside `on_sample` leaves the algorithm's state as it was mid-update; every field
        // is still within its bounds (clamped on each write), so carry on with it.
        self.algorithm
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A slot held for one request; give it back with [`complete`](Self::complete), or by dropping it
/// (counted as a drop: no latency sample).
#[derive(Debug)]
#[must_use = "dropping the token at once releases the slot"]
pub struct Token<'a, A: LimitAlgorithm> {
    limiter: Option<&'a ConcurrencyLimiter<A>>,
    in_flight: u64,
    limit: u64,
}

impl<A: LimitAlgorithm> Token<'_, A> {
    /// The request finished after `latency`: the slot is given back and the latency sampled.
    pub fn complete(mut self, latency: Duration) {
        if let Some(limiter) = self.limiter.take() {
            limiter.release(self.in_flight, self.limit, Some(latency));
        }
    }
}

impl<A: LimitAlgorithm> Drop for Token<'_, A> {
    fn drop(&mut self) {
        if let Some(limiter) = self.limiter.take() {
            limiter.release(self.in_flight, self.limit, None);
        }
    }
}

/// A [`Token`] that owns an `Arc` of its limiter ([`ConcurrencyLimiter::acquire_owned`]).
#[derive(Debug)]
#[must_use = "dropping the token at once releases the slot"]
pub struct OwnedToken<A: LimitAlgorithm> {
    limiter: Option<Arc<ConcurrencyLimiter<A>>>,
    in_flight: u64,
    limit: u64,
}

impl<A: LimitAlgorithm> OwnedToken<A> {
    /// As [`Token::complete`].
    pub fn complete(mut self, latency: Duration) {
        if let Some(limiter) = self.limiter.take() {
            limiter.release(self.in_flight, self.limit, Some(latency));
        }
    }
}

impl<A: LimitAlgorithm> Drop for OwnedToken<A> {
    fn drop(&mut self) {
        if let Some(limiter) = self.limiter.take() {
            limiter.release(self.in_flight, self.limit, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::FixedLimit;

    #[test]
    fn never_more_in_flight_than_a_fixed_limit_and_back_to_zero() {
        let limiter = Arc::new(ConcurrencyLimiter::new(FixedLimit::new(3).unwrap()));
        let most = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (limiter, most) = (Arc::clone(&limiter), Arc::clone(&most));
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        if let Some(token) = limiter.acquire_owned() {
                            most.fetch_max(limiter.in_flight(), Ordering::Relaxed);
                            if (i + t) % 3 == 0 {
                                drop(token);
                            } else {
                                token.complete(Duration::from_micros(i % 7));
                            }
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(limiter.in_flight(), 0);
        assert!(most.load(Ordering::Relaxed) <= 3);
    }
}

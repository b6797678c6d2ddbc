//! [`InFlightLimiter`]: one in-flight limit (no key) on one atomic word, and the [`Permit`] guard
//! that gives its units back when dropped.

use std::fmt;
// std's Arc even under loom: a permit's reference count is not part of what the models check,
// and a loom Arc cannot be a method receiver.
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::algorithm::Algorithm;
use crate::algorithm::inflight::{InFlight, Release};
use crate::clock::{Clock, MonotonicClock, Nanos};
use crate::decision::{CheckError, Decision};
use crate::quota::QuotaError;
use crate::state::AtomicState;
use crate::sync::{AtomicU64, Ordering};

/// At most `limit` units in flight across every caller: permits taken with
/// [`try_acquire`](Self::try_acquire), given back when their [`Permit`] is dropped (the request
/// finished, was cancelled, or its task panicked and unwound).
///
/// Lock-free: a take is one load and one compare-and-swap of the [`InFlight`] state word, a release
/// one more. A permit held past the limit's maximum hold time is reclaimed (see [`InFlight`]) and
/// counted in [`reclaimed`](Self::reclaimed); its late release is a no-op, counted in
/// [`late_releases`](Self::late_releases).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tollgate_core::InFlightLimiter;
///
/// let limiter = Arc::new(InFlightLimiter::new(1, Duration::from_secs(30))?);
/// let permit = limiter.try_acquire(1)?.expect("nothing in flight yet");
/// assert!(limiter.try_acquire(1)?.is_err()); // full: the denial's Decision
/// drop(permit);
/// assert_eq!(limiter.in_flight(), 0);
/// assert!(limiter.try_acquire(1)?.is_ok());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct InFlightLimiter<C = MonotonicClock> {
    state: CachePadded<AtomicState>,
    algorithm: InFlight,
    clock: C,
    reclaimed: AtomicU64,
    late: AtomicU64,
}

impl InFlightLimiter<MonotonicClock> {
    /// At most `limit` units in flight, permits reclaimed after at most `2 × max_hold`.
    ///
    /// # Errors
    /// As [`InFlight::new`]: a zero limit, a limit above [`MAX_IN_FLIGHT`](crate::MAX_IN_FLIGHT),
    /// a zero `max_hold`.
    pub fn new(limit: u64, max_hold: std::time::Duration) -> Result<Self, QuotaError> {
        Ok(Self::from_algorithm(
            InFlight::new(limit, max_hold)?,
            MonotonicClock::new(),
        ))
    }
}

impl<C: Clock + 'static> InFlightLimiter<C> {
    /// A limiter running `algorithm`, reading `clock`.
    pub fn from_algorithm(algorithm: InFlight, clock: C) -> Self {
        InFlightLimiter {
            state: CachePadded::new(AtomicState::new(0)),
            algorithm,
            clock,
            reclaimed: AtomicU64::new(0),
            late: AtomicU64::new(0),
        }
    }

    /// The limit's parameters.
    pub fn algorithm(&self) -> &InFlight {
        &self.algorithm
    }

    /// Takes `cost` units now: `Ok(permit)`, or `Err(denial)` when they would exceed the limit
    /// (nothing is taken).
    ///
    /// # Errors
    /// [`CheckError::CostExceedsCapacity`] when `cost` exceeds the limit (it could never pass).
    pub fn try_acquire(
        self: &Arc<Self>,
        cost: u64,
    ) -> Result<Result<Permit, Decision>, CheckError> {
        self.try_acquire_at(self.clock.now(), cost)
    }

    /// [`try_acquire`](Self::try_acquire) at `now` (nanoseconds on this limiter's clock).
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub fn try_acquire_at(
        self: &Arc<Self>,
        now: Nanos,
        cost: u64,
    ) -> Result<Result<Permit, Decision>, CheckError> {
        let ((decision, reclaimed), _) = self.state.update(self.state.load(), |word| {
            let transition = self.algorithm.decide(word, now, cost)?;
            // Counted only for the word actually written (the last transition of the loop).
            let reclaimed = match transition.next {
                Some(_) => self.algorithm.reclaimable(word, now),
                None => 0,
            };
            Ok::<_, CheckError>(((transition.decision, reclaimed), transition.next))
        })?;
        if reclaimed > 0 {
            // Relaxed: a monitoring counter; publishes nothing.
            self.reclaimed.fetch_add(reclaimed, Ordering::Relaxed);
        }
        if !decision.is_allowed() {
            return Ok(Err(decision));
        }
        Ok(Ok(Permit {
            limiter: Arc::clone(self) as Arc<dyn GiveBack>,
            taken_at: now,
            cost,
            decision,
        }))
    }

    /// Units in flight now (permits past their maximum hold time not counted).
    pub fn in_flight(&self) -> u64 {
        self.algorithm
            .in_flight(self.state.load(), self.clock.now())
    }

    /// Units reclaimed from holders that kept them past the maximum hold time.
    pub fn reclaimed(&self) -> u64 {
        // Relaxed: a monitoring figure.
        self.reclaimed.load(Ordering::Relaxed)
    }

    /// Releases that came after their permit had been reclaimed (and changed nothing).
    pub fn late_releases(&self) -> u64 {
        // Relaxed: a monitoring figure.
        self.late.load(Ordering::Relaxed)
    }
}

/// What a [`Permit`] gives its units back to, whatever the limiter's clock type.
trait GiveBack: Send + Sync {
    fn release(&self, taken_at: Nanos, cost: u64);
}

impl<C: Clock> GiveBack for InFlightLimiter<C> {
    fn release(&self, taken_at: Nanos, cost: u64) {
        // The same Relaxed CAS loop as a take (see `AtomicState`): the count's read-modify-writes
        // are totally ordered on the one word, so no release is lost or applied twice. A permit
        // guards capacity, not memory, so nothing needs to be published with it.
        let result: Result<(bool, u64), std::convert::Infallible> =
            self.state.update(self.state.load(), |word| {
                Ok(match self.algorithm.release(word, taken_at, cost) {
                    Release::Released(next) => (true, Some(next)),
                    Release::Reclaimed => (false, None),
                })
            });
        if matches!(result, Ok((false, _))) && cost > 0 {
            // Relaxed: a monitoring counter.
            self.late.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl<C> fmt::Debug for InFlightLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLimiter")
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

/// Units taken from an [`InFlightLimiter`], given back exactly once, when this is dropped. There
/// is no other way to release them, so a double release cannot be written.
#[must_use = "dropping a permit releases it at once"]
pub struct Permit {
    limiter: Arc<dyn GiveBack>,
    taken_at: Nanos,
    cost: u64,
    decision: Decision,
}

impl Permit {
    /// The admission (`remaining`: units still free after this one).
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// When it was taken (nanoseconds on the limiter's clock).
    pub fn taken_at(&self) -> Nanos {
        self.taken_at
    }

    /// Units held.
    pub fn cost(&self) -> u64 {
        self.cost
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.limiter.release(self.taken_at, self.cost);
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("taken_at", &self.taken_at)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

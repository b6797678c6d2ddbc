//! The algorithms as pure state transitions over one `u64` state word.
//!
//! An [`Algorithm`] holds only validated parameters; it never reads a clock and never touches an
//! atomic. Storage — one atomic word ([`AtomicLimiter`](crate::AtomicLimiter)), a slot in a keyed
//! table, a Redis key — applies its [`decide`](Algorithm::decide) function. That same function is what
//! the unit, property and loom tests exercise and what the Redis scripts are checked against.

use crate::clock::Nanos;
use crate::decision::{CheckError, Decision};
use crate::quota::{Quota, QuotaError};

pub mod fixed_window;
pub mod gcra;
pub mod inflight;
pub mod leaky_bucket;
pub mod sliding_window;
mod window;

/// What a decision does to the state: the answer, and the word to store (`None`: store nothing).
///
/// A denial always has `next == None`: denying never writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    /// The answer to give the caller.
    pub decision: Decision,
    /// The new state word, if the decision consumed capacity.
    pub next: Option<u64>,
}

impl Transition {
    /// An admission that stores `next`.
    #[inline]
    pub fn allow(decision: Decision, next: u64) -> Self {
        Transition {
            decision,
            next: Some(next),
        }
    }

    /// A decision that stores nothing (a denial, or an admission of cost 0).
    #[inline]
    pub fn unchanged(decision: Decision) -> Self {
        Transition {
            decision,
            next: None,
        }
    }
}

/// A rate-limiting algorithm whose whole per-limiter state is one `u64` word.
///
/// The word's layout is the algorithm's own business (each documents it on its packed state type);
/// storage only loads, stores and compares it. The fresh state is `0` for every algorithm, so a
/// zeroed slot is a fresh limiter.
pub trait Algorithm: Clone + Send + Sync + 'static {
    /// A short stable name (`"gcra"`, `"fixed_window"`, ...), for reports and metrics.
    const NAME: &'static str;

    /// Whether a key that a keyed table's shared overflow state decided starts, once it gets a slot
    /// of its own, from a copy of that state (true for the rate algorithms: it cannot buy a second
    /// burst). False for an in-flight count, whose inherited units no release would ever give back.
    const INHERITS_OVERFLOW: bool = true;

    /// Builds the algorithm's parameters from a quota.
    ///
    /// # Errors
    /// A [`QuotaError`] when the quota is beyond what this algorithm's state can represent.
    fn from_quota(quota: Quota) -> Result<Self, QuotaError>;

    /// The quota this algorithm enforces.
    fn quota(&self) -> &Quota;

    /// The largest cost one request may have; anything above is a [`CheckError`].
    fn capacity(&self) -> u64;

    /// Decides a request of `cost` units arriving at `now` against `state`.
    ///
    /// Pure: the same inputs always give the same output. A `now` earlier than the time the state was
    /// last written (a clock gone backwards) is handled conservatively: never more admissions than at
    /// the later time, and no panic.
    ///
    /// # Errors
    /// [`CheckError::CostExceedsCapacity`] when `cost > self.capacity()`.
    fn decide(&self, state: u64, now: Nanos, cost: u64) -> Result<Transition, CheckError>;

    /// [`decide`](Self::decide) with **headroom**: admits `cost` units only if at least `reserve`
    /// more would still fit afterwards, i.e. only if `cost + reserve` units could be admitted now.
    /// What it writes on admission is exactly what `decide(state, now, cost)` writes; a denial
    /// writes nothing. This is how a priority class below a reserved share is kept out of that
    /// share: it sees the bucket (or window) as `reserve` units smaller, while higher classes see
    /// it whole. `remaining` on an admission is what this caller could still take (the reserve
    /// taken off).
    ///
    /// A `cost + reserve` above [`capacity`](Self::capacity) can never leave the reserve: a denial
    /// with `retry_after` = [`Decision::NEVER`]. A cost above capacity is still the
    /// [`CheckError`] of [`decide`](Self::decide). Pure, like `decide`; the storages apply it in the
    /// same compare-and-swap loop.
    ///
    /// ```
    /// use tollgate_core::{algorithm::Algorithm, Gcra, Quota};
    /// let gcra = Gcra::from_quota(Quota::per_second(10)?)?; // burst 10
    /// let mut state = 0;
    /// // A lower class, 2 units kept for higher ones: 8 pass, then it is refused ...
    /// for _ in 0..8 {
    ///     state = gcra.decide_reserving(state, 0, 1, 2)?.next.unwrap();
    /// }
    /// let refused = gcra.decide_reserving(state, 0, 1, 2)?;
    /// assert!(!refused.decision.is_allowed());
    /// assert_eq!(refused.next, None);
    /// // ... while the reserved 2 are still there for a higher class.
    /// assert!(gcra.decide(state, 0, 2)?.decision.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`decide`](Self::decide).
    #[inline]
    fn decide_reserving(
        &self,
        state: u64,
        now: Nanos,
        cost: u64,
        reserve: u64,
    ) -> Result<Transition, CheckError> {
        if reserve == 0 {
            return self.decide(state, now, cost);
        }
        self.check_cost(cost)?;
        let Some(probe) = cost
            .checked_add(reserve)
            .filter(|&probe| probe <= self.capacity())
        else {
            let reset_after = self.decide(state, now, cost)?.decision.reset_after();
            return Ok(Transition::unchanged(Decision::Denied {
                retry_after: Decision::NEVER,
                reset_after,
            }));
        };
        // Every algorithm here admits `cost + reserve` iff after admitting `cost` at least
        // `reserve` more would fit (each test is `used + cost <= capacity` in its own units), so
        // the probe decides and the real cost writes.
        let probed = self.decide(state, now, probe)?;
        if !probed.decision.is_allowed() {
            return Ok(Transition::unchanged(probed.decision));
        }
        let mut transition = self.decide(state, now, cost)?;
        if let Decision::Allowed { remaining, .. } = &mut transition.decision {
            *remaining = remaining.saturating_sub(reserve);
        }
        Ok(transition)
    }

    /// Whether `state` at `now` behaves exactly like the fresh state `0` for every future request,
    /// so a keyed table may drop it (eviction is then invisible to the key's next caller).
    fn is_fresh(&self, state: u64, now: Nanos) -> bool;

    /// Undoes an admission of `cost` units that [`decide`](Self::decide) granted at `now`: the state
    /// word to store instead of `state`, or `None` to store nothing.
    ///
    /// Contract, checked by the property tests: applied at the admission's own `now`, to the word the
    /// admission wrote or to any word later admissions at the same `now` made of it, the result
    /// decides every later request exactly as if the refunded request had never come — or, where
    /// the algorithm cannot tell (documented per algorithm), more strictly. It never makes a state
    /// looser than that. The default refunds nothing, which is always safe (stricter).
    ///
    /// A refund is what a multi-limit decision (`tollgate-policy`) uses to give back what one limit
    /// admitted when another denied the same request.
    #[inline]
    fn refund(&self, state: u64, now: Nanos, cost: u64) -> Option<u64> {
        let _ = (state, now, cost);
        None
    }

    /// Counts `cost` units at `now` **without a decision**: the state word to store instead of
    /// `state` (`None`: store nothing, for a cost of 0). What a settlement does when a request's
    /// actual cost turned out above what it reserved (`tollgate-policy`'s `Reservation::settle`): the
    /// difference is owed whatever the state, so the key goes into debt and its next requests wait
    /// exactly as long as the overdraft takes to refill (buckets), or its window counts beyond the
    /// limit (windows). Never a decision, never a denial; the state only ever grows stricter.
    ///
    /// Bound, per algorithm: the same as its decisions', plus the units charged. Counts saturate at
    /// what the state word can hold (a bucket's debt at the end of the clock's range: the key then
    /// stays denied), so an absurd cost never wraps or panics and is never looser than a smaller one.
    fn charge(&self, state: u64, now: Nanos, cost: u64) -> Option<u64>;

    /// The state under `to` (the same algorithm with other parameters: a reloaded quota, another
    /// override tier) that `state` carries over into at the instant `at`: **as-is in units, capped by
    /// the new capacity**. The key keeps exactly `min(available, to.capacity())` units available at
    /// `at`, where `available` is what a request could take from `state` under `self` at `at`
    /// (bucket4j's `TokensInheritanceStrategy::AS_IS`), and from then on it refills, or its window
    /// runs, under `to` alone.
    ///
    /// So a change of parameters never hands a key more at `at` than it had, nor more than `to`
    /// allows; a key that had spent everything stays empty. Fractional progress towards the next
    /// unit is dropped (stricter). The one exception: a state that is [fresh](Self::is_fresh) at `at`
    /// (indistinguishable from a key never seen, which a keyed table may drop at any time) stays
    /// fresh, with `to`'s whole capacity, exactly as a new key gets.
    ///
    /// The default works for every algorithm whose [`decide`](Self::decide) of cost 0 reports in
    /// `remaining` exactly the largest cost it would admit (all of this crate's): it asks for that,
    /// then builds the new state as a fresh one that admitted `to.capacity() − kept` units at `at`.
    /// A caller may skip it when both hold the same quota (it would only drop a fraction).
    /// It is pure and reads no clock.
    ///
    /// ```
    /// use tollgate_core::{algorithm::Algorithm, Gcra, Quota};
    /// let fast = Gcra::from_quota(Quota::per_second(10)?)?; // burst 10
    /// let slow = Gcra::from_quota(Quota::per_minute(10)?)?; // burst 10, one unit per 6 s
    /// let now = 1_000_000_000_000;
    /// let spent = fast.decide(0, now, 10)?.next.unwrap(); // the whole burst, just now
    /// let carried = fast.carry_over(spent, now, &slow);
    /// // In-time, `spent` read under `slow` would have 9 units back at once; as-is it has none.
    /// assert!(slow.decide(spent, now, 9)?.decision.is_allowed());
    /// assert!(!slow.decide(carried, now, 1)?.decision.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn carry_over(&self, state: u64, at: Nanos, to: &Self) -> u64 {
        if self.is_fresh(state, at) {
            return 0;
        }
        let available = self
            .decide(state, at, 0)
            .map_or(0, |t| t.decision.remaining());
        let capacity = to.capacity();
        let spent = capacity - available.min(capacity);
        if spent == 0 {
            return 0;
        }
        match to.decide(0, at, spent) {
            Ok(Transition {
                next: Some(next), ..
            }) => next,
            // Unreachable for a valid `to` (a fresh state admits its whole capacity at once); the
            // strictest word we can build is still a state of `to`: the same instant, all spent.
            _ => to
                .decide(0, at, capacity)
                .ok()
                .and_then(|t| t.next)
                .unwrap_or(state),
        }
    }

    /// The error for a cost above capacity, if `cost` is one.
    #[inline]
    fn check_cost(&self, cost: u64) -> Result<(), CheckError> {
        let capacity = self.capacity();
        if cost > capacity {
            Err(CheckError::CostExceedsCapacity { cost, capacity })
        } else {
            Ok(())
        }
    }
}

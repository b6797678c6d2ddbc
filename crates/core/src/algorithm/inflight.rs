//! An in-flight (concurrency) limit as a state word: how many permits are out, not how many
//! requests arrived per period.
//!
//! A permit is taken at admission ([`decide`](Algorithm::decide)) and given back when the request
//! ends ([`InFlight::release`]). A holder that never gives its permit back (a stuck request, a
//! leaked guard) must not lower the limit for ever, so permits age out: time is cut into epochs of
//! length `max_hold`, the word counts the permits taken in the current epoch and in the one before,
//! and permits older than that are **reclaimed** (dropped from the count) at the key's next
//! admission. A permit is therefore reclaimed no earlier than `max_hold` and no later than
//! `2 × max_hold` after it was taken (plus the wait for the key's next admission, which is when a
//! reclaim is applied). Its late release is then a no-op ([`Release::Reclaimed`]), never a second
//! decrement.
//!
//! ```text
//! bit 63            40 39              20 19               0
//!     [ epoch (24 b)  | previous epoch's | current epoch's  ]
//!                       permits (20 b)     permits (20 b)
//! ```
//! The fresh state `0` is "nothing in flight". Epochs are compared modulo 2²⁴: a state more than
//! 2²³ epochs ahead of a reading is taken as a clock gone backwards and kept as it is (stricter),
//! never reclaimed.
//!
//! As an [`Algorithm`] it runs on every storage the rate algorithms run on (one atomic word, a
//! slot of the keyed table, with eviction of keys whose count is 0); its [`Quota`] is read as
//! `limit` = the most units in flight, `period` = `max_hold`.

use std::time::Duration;

use crate::algorithm::{Algorithm, Transition};
use crate::clock::Nanos;
use crate::decision::{CheckError, Decision};
use crate::quota::{Quota, QuotaError};

/// The largest in-flight limit one state word can count (2²⁰ − 1).
pub const MAX_IN_FLIGHT: u64 = COUNT_MASK;

const COUNT_BITS: u32 = 20;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const EPOCH_SHIFT: u32 = 2 * COUNT_BITS;
const EPOCH_MASK: u64 = (1 << (64 - EPOCH_SHIFT)) - 1;
/// Epoch differences at or above this are read as "the state is ahead of the clock".
const EPOCH_HALF: u64 = 1 << (63 - EPOCH_SHIFT);
/// The default `retry_after` of a denial: an in-flight limit cannot know when a holder finishes.
const DEFAULT_RETRY: Nanos = 1_000_000_000;

/// An in-flight limit: at most `limit` units held at once, each permit reclaimed after at most
/// `2 × max_hold` if never released. See the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{Algorithm, InFlight};
/// let limit = InFlight::new(2, Duration::from_secs(30))?;
/// let now = 1_000;
/// let one = limit.decide(0, now, 1)?.next.unwrap();
/// let two = limit.decide(one, now, 1)?.next.unwrap();
/// assert!(!limit.decide(two, now, 1)?.decision.is_allowed()); // two out: full
/// let back = limit.release(two, now, 1).state().unwrap();   // one comes back
/// assert_eq!(limit.in_flight(back, now), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlight {
    quota: Quota,
    limit: u64,
    /// Epoch length: `max_hold` in nanoseconds (≥ 1).
    hold: Nanos,
    /// The `retry_after` reported by a denial.
    retry: Nanos,
}

/// The state split into its fields, after applying reclaims at some instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Counts {
    current: u64,
    previous: u64,
    epoch: u64,
    /// Permits dropped by this roll (older than the previous epoch).
    reclaimed: u64,
}

/// What [`InFlight::release`] does with a permit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// The permit was counted: store this word.
    Released(u64),
    /// The permit had already been reclaimed (held past its maximum hold time): nothing to store.
    Reclaimed,
}

impl Release {
    /// The word to store, if any.
    pub fn state(self) -> Option<u64> {
        match self {
            Release::Released(word) => Some(word),
            Release::Reclaimed => None,
        }
    }
}

impl InFlight {
    /// At most `limit` units in flight; a permit not released within `max_hold` is reclaimed
    /// between `max_hold` and `2 × max_hold` after it was taken.
    ///
    /// # Errors
    /// [`QuotaError::ZeroLimit`], [`QuotaError::LimitTooLarge`] above [`MAX_IN_FLIGHT`],
    /// [`QuotaError::ZeroPeriod`] for a zero `max_hold`, and [`Quota::per`]'s other errors.
    pub fn new(limit: u64, max_hold: Duration) -> Result<Self, QuotaError> {
        Self::from_quota(Quota::per(max_hold, limit)?)
    }

    /// The same limit with denials reporting `retry_after` (default 1 s; zero is allowed).
    pub fn with_retry_after(self, retry_after: Duration) -> Self {
        InFlight {
            retry: u64::try_from(retry_after.as_nanos()).unwrap_or(u64::MAX),
            ..self
        }
    }

    /// The most units in flight at once.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The maximum hold time (the epoch length).
    pub fn max_hold(&self) -> Duration {
        Duration::from_nanos(self.hold)
    }

    /// The `retry_after` a denial reports.
    pub fn retry_after(&self) -> Duration {
        Duration::from_nanos(self.retry)
    }

    #[inline]
    fn epoch(&self, now: Nanos) -> u64 {
        (now / self.hold) & EPOCH_MASK
    }

    #[inline]
    fn unpack(word: u64) -> (u64, u64, u64) {
        (
            word & COUNT_MASK,
            (word >> COUNT_BITS) & COUNT_MASK,
            word >> EPOCH_SHIFT,
        )
    }

    #[inline]
    fn pack(current: u64, previous: u64, epoch: u64) -> u64 {
        (epoch << EPOCH_SHIFT) | (previous << COUNT_BITS) | current
    }

    /// The state's counts seen at `now`: permits older than the previous epoch dropped.
    #[inline]
    fn roll(&self, state: u64, now: Nanos) -> Counts {
        let (current, previous, epoch) = Self::unpack(state);
        let now_epoch = self.epoch(now);
        if current == 0 && previous == 0 {
            return Counts {
                current: 0,
                previous: 0,
                epoch: now_epoch,
                reclaimed: 0,
            };
        }
        match now_epoch.wrapping_sub(epoch) & EPOCH_MASK {
            // Same epoch, or the clock reads earlier than the state (kept as is: stricter).
            d if d == 0 || d >= EPOCH_HALF => Counts {
                current,
                previous,
                epoch,
                reclaimed: 0,
            },
            1 => Counts {
                current: 0,
                previous: current,
                epoch: now_epoch,
                reclaimed: previous,
            },
            _ => Counts {
                current: 0,
                previous: 0,
                epoch: now_epoch,
                reclaimed: current + previous,
            },
        }
    }

    /// Units in flight in `state` at `now` (reclaims applied).
    pub fn in_flight(&self, state: u64, now: Nanos) -> u64 {
        let counts = self.roll(state, now);
        counts.current + counts.previous
    }

    /// Units an admission at `now` would reclaim from `state` (permits held past their maximum
    /// hold time): what a storage counts when its write of an admission succeeds.
    pub fn reclaimable(&self, state: u64, now: Nanos) -> u64 {
        self.roll(state, now).reclaimed
    }

    /// Gives back a permit of `cost` units taken at `taken_at` (the `now` of its admission).
    ///
    /// A permit of the state's epoch is taken off the current count; one of the epoch before off
    /// the previous count (or, if that holds fewer, the current one: a taker whose clock read lagged
    /// a concurrent taker's was counted in the newer epoch); an older one was reclaimed already
    /// ([`Release::Reclaimed`]). Counts saturate at 0, so no sequence of calls makes them negative;
    /// the guards that call this release each permit once by construction.
    pub fn release(&self, state: u64, taken_at: Nanos, cost: u64) -> Release {
        let (current, previous, epoch) = Self::unpack(state);
        if (current == 0 && previous == 0) || cost == 0 {
            return Release::Reclaimed;
        }
        let taken = self.epoch(taken_at);
        match epoch.wrapping_sub(taken) & EPOCH_MASK {
            0 => Release::Released(Self::pack(current.saturating_sub(cost), previous, epoch)),
            1 if previous >= cost => Release::Released(Self::pack(current, previous - cost, epoch)),
            1 => Release::Released(Self::pack(current.saturating_sub(cost), previous, epoch)),
            _ => Release::Reclaimed,
        }
    }
}

impl Algorithm for InFlight {
    const NAME: &'static str = "in_flight";
    // A new key never inherits a stripe's shared overflow count: its releases only ever subtract
    // its own permits, so an inherited count would never come back.
    const INHERITS_OVERFLOW: bool = false;

    /// `limit` = the most units in flight, `period` = the maximum hold time.
    fn from_quota(quota: Quota) -> Result<Self, QuotaError> {
        let limit = quota.limit();
        if limit > MAX_IN_FLIGHT {
            return Err(QuotaError::LimitTooLarge { max: MAX_IN_FLIGHT });
        }
        Ok(InFlight {
            quota,
            limit,
            hold: quota.period_nanos(),
            retry: DEFAULT_RETRY,
        })
    }

    fn quota(&self) -> &Quota {
        &self.quota
    }

    fn capacity(&self) -> u64 {
        self.limit
    }

    /// Admits iff the units in flight (reclaims applied) plus `cost` stay within the limit.
    /// `remaining` is what is left to take; `reset_after` is zero (when holders finish is unknown);
    /// a denial's `retry_after` is [`retry_after`](InFlight::retry_after).
    fn decide(&self, state: u64, now: Nanos, cost: u64) -> Result<Transition, CheckError> {
        self.check_cost(cost)?;
        let counts = self.roll(state, now);
        let held = counts.current + counts.previous;
        if held + cost > self.limit {
            return Ok(Transition::unchanged(Decision::denied(
                self.retry, self.retry,
            )));
        }
        let decision = Decision::allowed(self.limit - held - cost, 0);
        if cost == 0 {
            return Ok(Transition::unchanged(decision));
        }
        Ok(Transition::allow(
            decision,
            Self::pack(counts.current + cost, counts.previous, counts.epoch),
        ))
    }

    /// Nothing in flight, or every permit past its maximum hold time.
    fn is_fresh(&self, state: u64, now: Nanos) -> bool {
        self.in_flight(state, now) == 0
    }

    /// Counts `cost` more units in flight without a decision (capped at what the count holds): no
    /// guard releases them, so they count until reclaimed, one to two maximum hold times later.
    fn charge(&self, state: u64, now: Nanos, cost: u64) -> Option<u64> {
        if cost == 0 {
            return None;
        }
        let counts = self.roll(state, now);
        Some(Self::pack(
            counts.current.saturating_add(cost).min(COUNT_MASK),
            counts.previous,
            counts.epoch,
        ))
    }

    /// A release ([`InFlight::release`]) of a permit taken at `now`.
    fn refund(&self, state: u64, now: Nanos, cost: u64) -> Option<u64> {
        self.release(state, now, cost).state()
    }

    /// Counts carry over unchanged (permits out stay out; a lower limit admits nothing new until
    /// enough come back). With a different `max_hold`, the permits are restamped into `to`'s epoch
    /// at `at`: releases of permits taken before may then find them reclaimed early or late by up
    /// to one epoch of either, and a lost release only makes the key stricter until the reclaim.
    fn carry_over(&self, state: u64, at: Nanos, to: &Self) -> u64 {
        let counts = self.roll(state, at);
        let held = counts.current + counts.previous;
        if held == 0 {
            0
        } else if self.hold == to.hold {
            Self::pack(counts.current, counts.previous, counts.epoch)
        } else {
            Self::pack(held, 0, to.epoch(at))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Nanos = 1_000_000_000;

    fn limit(n: u64) -> InFlight {
        InFlight::new(n, Duration::from_secs(10)).unwrap()
    }

    #[test]
    fn takes_up_to_the_limit_and_release_frees_one() {
        let l = limit(2);
        let a = l.decide(0, SEC, 1).unwrap().next.unwrap();
        let b = l.decide(a, SEC, 1).unwrap().next.unwrap();
        assert_eq!(l.decide(b, SEC, 1).unwrap().decision.remaining(), 0);
        assert!(!l.decide(b, SEC, 1).unwrap().decision.is_allowed());
        let c = l.release(b, SEC, 1).state().unwrap();
        assert_eq!(l.in_flight(c, SEC), 1);
        assert!(l.decide(c, SEC, 1).unwrap().decision.is_allowed());
    }

    #[test]
    fn limits_zero_and_too_large_are_typed_errors() {
        assert_eq!(
            InFlight::new(0, Duration::from_secs(1)),
            Err(QuotaError::ZeroLimit)
        );
        assert_eq!(
            InFlight::new(MAX_IN_FLIGHT + 1, Duration::from_secs(1)),
            Err(QuotaError::LimitTooLarge { max: MAX_IN_FLIGHT })
        );
        assert_eq!(
            InFlight::new(1, Duration::ZERO),
            Err(QuotaError::ZeroPeriod)
        );
        assert!(matches!(
            limit(3).decide(0, 0, 4),
            Err(CheckError::CostExceedsCapacity { .. })
        ));
    }

    #[test]
    fn a_stuck_permit_is_reclaimed_between_one_and_two_holds_and_its_late_release_is_a_no_op() {
        let l = limit(1); // max_hold 10 s
        let taken_at = 3 * SEC;
        let held = l.decide(0, taken_at, 1).unwrap().next.unwrap();
        // Still held just before the next-but-one epoch (20 s).
        assert_eq!(l.in_flight(held, 19 * SEC), 1);
        assert!(!l.decide(held, 19 * SEC, 1).unwrap().decision.is_allowed());
        // Reclaimed at 20 s (17 s after the take: between 10 s and 20 s).
        assert_eq!(l.reclaimable(held, 20 * SEC), 1);
        assert!(l.is_fresh(held, 20 * SEC));
        let next = l.decide(held, 20 * SEC, 1).unwrap().next.unwrap();
        // The stuck holder's late release changes nothing; the new holder's counts.
        assert_eq!(l.release(next, taken_at, 1), Release::Reclaimed);
        assert_eq!(l.in_flight(next, 20 * SEC), 1);
        let freed = l.release(next, 20 * SEC, 1).state().unwrap();
        assert_eq!(l.in_flight(freed, 20 * SEC), 0);
    }

    #[test]
    fn a_clock_gone_backwards_keeps_the_count() {
        let l = limit(1);
        let held = l.decide(0, 100 * SEC, 1).unwrap().next.unwrap();
        assert_eq!(l.in_flight(held, 0), 1);
        assert!(!l.decide(held, 0, 1).unwrap().decision.is_allowed());
    }

    #[test]
    fn a_taker_whose_clock_lagged_is_released_from_the_newer_epoch() {
        let l = limit(2);
        // B takes at 10 s (epoch 1) first; A, whose clock read 9 s, lands in epoch 1 as well.
        let b = l.decide(0, 10 * SEC, 1).unwrap().next.unwrap();
        let both = l.decide(b, 9 * SEC, 1).unwrap().next.unwrap();
        assert_eq!(l.in_flight(both, 10 * SEC), 2);
        let a_gone = l.release(both, 9 * SEC, 1).state().unwrap();
        let none = l.release(a_gone, 10 * SEC, 1).state().unwrap();
        assert_eq!(l.in_flight(none, 10 * SEC), 0);
    }
}

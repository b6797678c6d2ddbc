//! Token bucket as GCRA, the generic cell rate algorithm: one timestamp is the whole state.
//!
//! The state is the *theoretical arrival time* (TAT): the instant at which the bucket would be full
//! again. Admitting `cost` units moves it `cost × T` later (`T` = emission interval); a request is
//! admitted iff the new TAT is no more than `burst × T` ahead of now. This is exactly a token bucket of
//! capacity `burst` refilling one token every `T`, without a refill loop or a second word.
//!
//! Bound: over any interval of length `d`, admissions total at most `burst + d / T` units, and since
//! `T` is `period / limit` rounded *up*, that is at most `burst + rate × d`.

use strength_reduce::StrengthReducedU64;

use crate::algorithm::{Algorithm, Transition};
use crate::clock::Nanos;
use crate::decision::{CheckError, Decision};
use crate::quota::{Quota, QuotaError};

/// One step on a [`Timeline`]: where a request of some cost would move the TAT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TatStep {
    /// The TAT after admitting the request.
    pub new_tat: Nanos,
    /// The earliest instant at which the request fits within the bucket depth.
    pub allow_at: Nanos,
}

/// GCRA's timeline: emission interval `T` and bucket depth `D = burst × T`, in nanoseconds, and the
/// arithmetic on a theoretical arrival time (TAT) that every GCRA storage shares: [`Gcra`] and
/// [`LeakyBucket`](crate::LeakyBucket) (one word), the [`Shaper`](crate::Shaper) (a queue as extra
/// depth), the striped limiter's leases (units of a lease still ahead of `now`, units the shared TAT
/// can still grant), the Redis lease mode's core oracle. One home, so a rounding rule cannot differ
/// between them.
///
/// Division by `T` ([`units_in`](Self::units_in)) is a multiply and shift (a shift for a
/// power-of-two `T`): a hardware 64-bit divide is the slowest instruction on the allow path, and
/// `remaining` needs one per admission.
///
/// ```
/// use tollgate_core::{Quota, algorithm::gcra::Timeline};
/// // 10 per second, bucket of 5: T = 100 ms, D = 500 ms.
/// let timeline = Timeline::new(&Quota::per_second(10)?.with_burst(5)?);
/// let second = 1_000_000_000;
/// // A TAT 200 ms ahead of now: 3 of the 5 units can still be granted.
/// assert_eq!(timeline.available(second + 200_000_000, second), 3);
/// let step = timeline.step(second + 200_000_000, second, 3).unwrap();
/// assert_eq!(step.new_tat, second + 500_000_000);
/// assert_eq!(step.allow_at, second); // fits exactly now
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Timeline {
    interval: Nanos,
    depth: Nanos,
    per_interval: StrengthReducedU64,
}

impl PartialEq for Timeline {
    fn eq(&self, other: &Self) -> bool {
        (self.interval, self.depth) == (other.interval, other.depth)
    }
}

impl Eq for Timeline {}

impl Timeline {
    /// The timeline of `quota`: `T` = its emission interval, `D` = burst × `T`.
    pub fn new(quota: &Quota) -> Self {
        let interval = quota.emission_interval_nanos();
        Timeline {
            interval,
            depth: quota.burst_nanos(),
            // `interval >= 1`: checked when the quota was built.
            per_interval: StrengthReducedU64::new(interval),
        }
    }

    /// The emission interval `T` in nanoseconds.
    #[inline]
    pub fn interval(&self) -> Nanos {
        self.interval
    }

    /// The bucket depth `D = burst × T` in nanoseconds.
    #[inline]
    pub fn depth(&self) -> Nanos {
        self.depth
    }

    /// `x / T`, rounded down: how many whole emission intervals `x` nanoseconds hold.
    #[inline]
    pub fn units_in(&self, x: Nanos) -> u64 {
        x / self.per_interval
    }

    /// Units a GCRA at `tat` could grant at `now`: `(now + D − max(tat, now)) / T`, 0 when the TAT is
    /// a whole depth or more ahead.
    #[inline]
    pub fn available(&self, tat: Nanos, now: Nanos) -> u64 {
        self.units_in(now.saturating_add(self.depth).saturating_sub(tat.max(now)))
    }

    /// `cost` units arriving at `now` against `tat`. `None` when the new TAT would pass the end of the
    /// clock's range (584 years): callers then deny, which fails closed.
    ///
    /// `cost × interval` cannot overflow: callers check `cost <= burst`, and `burst × interval` was
    /// checked when the quota was built.
    #[inline]
    pub fn step(&self, tat: Nanos, now: Nanos, cost: u64) -> Option<TatStep> {
        // A TAT in the past means a full bucket: start from now. A TAT ahead of now (including when
        // the clock went backwards) is kept, so a backwards clock only ever makes us stricter.
        let new_tat = tat.max(now).checked_add(cost * self.interval)?;
        Some(TatStep {
            new_tat,
            allow_at: new_tat.saturating_sub(self.depth),
        })
    }

    /// `tat − cost × T` (see [`Gcra::refund`](crate::Algorithm::refund)); `None` when there is
    /// nothing to give back. `cost × interval` cannot overflow for a cost that was admitted.
    #[inline]
    pub fn refund(&self, tat: Nanos, cost: u64) -> Option<Nanos> {
        let back = cost.checked_mul(self.interval)?;
        (cost > 0 && tat > 0).then(|| tat.saturating_sub(back))
    }

    /// `max(tat, now) + cost × T`, saturating at the end of the clock's range: `cost` units counted
    /// at `now` with no depth check (see [`Algorithm::charge`]). `None` for
    /// a cost of 0. A TAT beyond `now + D` is debt: the next unit fits at `TAT + T − D`.
    #[inline]
    pub fn charge(&self, tat: Nanos, now: Nanos, cost: u64) -> Option<Nanos> {
        (cost > 0).then(|| {
            tat.max(now)
                .saturating_add(cost.saturating_mul(self.interval))
        })
    }

    /// The decision for a step at `now`: allowed with the tokens left, or denied until `allow_at`.
    #[inline]
    pub fn transition(&self, tat: Nanos, now: Nanos, cost: u64) -> Transition {
        let Some(step) = self.step(tat, now, cost) else {
            return Transition::unchanged(Decision::denied(Nanos::MAX, Nanos::MAX));
        };
        if now < step.allow_at {
            return Transition::unchanged(Decision::denied(
                step.allow_at - now,
                tat.saturating_sub(now),
            ));
        }
        // Here `now <= new_tat <= now + depth`, so neither subtraction wraps.
        let ahead = step.new_tat - now;
        let decision = Decision::allowed(self.units_in(self.depth - ahead), ahead);
        if cost == 0 {
            // Asking for nothing consumes nothing: do not move a stale TAT up to `now`.
            Transition::unchanged(decision)
        } else {
            Transition::allow(decision, step.new_tat)
        }
    }
}

/// Token bucket as GCRA: capacity `quota.burst()`, refilling one unit every
/// `quota.emission_interval()`.
///
/// State word: the theoretical arrival time in [`Nanos`] (0 = fresh). A denial is one load and no
/// write; an admission one compare-and-swap. Memory: 8 bytes per limiter or key.
///
/// ```
/// use tollgate_core::{algorithm::Algorithm, Gcra, Quota};
///
/// // 10 per second, bucket of 100.
/// let gcra = Gcra::from_quota(Quota::per_second(10)?.with_burst(100)?)?;
/// let mut state = 0;
/// for _ in 0..100 {
///     let t = gcra.decide(state, 0, 1)?;
///     assert!(t.decision.is_allowed());
///     state = t.next.unwrap();
/// }
/// let t = gcra.decide(state, 0, 1)?;
/// assert_eq!(t.decision.retry_after(), Some(std::time::Duration::from_millis(100)));
/// assert_eq!(t.next, None); // a denial writes nothing
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gcra {
    quota: Quota,
    params: Timeline,
}

impl Gcra {
    /// The emission interval `T` in nanoseconds.
    pub fn interval(&self) -> Nanos {
        self.params.interval()
    }

    /// The bucket depth `burst × T` in nanoseconds.
    pub fn depth(&self) -> Nanos {
        self.params.depth()
    }

    /// The timeline arithmetic this algorithm decides with.
    pub fn timeline(&self) -> &Timeline {
        &self.params
    }
}

impl Algorithm for Gcra {
    const NAME: &'static str = "gcra";

    fn from_quota(quota: Quota) -> Result<Self, QuotaError> {
        Ok(Gcra {
            quota,
            params: Timeline::new(&quota),
        })
    }

    fn quota(&self) -> &Quota {
        &self.quota
    }

    #[inline]
    fn capacity(&self) -> u64 {
        self.quota.burst()
    }

    #[inline]
    fn decide(&self, tat: u64, now: Nanos, cost: u64) -> Result<Transition, CheckError> {
        self.check_cost(cost)?;
        Ok(self.params.transition(tat, now, cost))
    }

    #[inline]
    fn is_fresh(&self, tat: u64, now: Nanos) -> bool {
        tat <= now
    }

    /// `TAT − cost × T`. At the admission's `now` this is exact: the admission moved the TAT from
    /// `max(TAT₀, now)` to `max(TAT₀, now) + cost × T`, and any TAT at or before `now` means a full
    /// bucket, so `max(TAT₀, now)` decides every later request as `TAT₀` does. Admissions at the same
    /// `now` in between only add their own `cost × T`, so it stays exact.
    ///
    /// The one inexact case needs a *later* `now`: if another admission at `u > now + cost × T` lands
    /// between the admission and its refund, it found this request's positions already expired and
    /// started from `u`, so taking `cost × T` off its TAT frees up to `cost` units too many (those
    /// units had expired anyway; the state is never looser than fresh-at-`u` plus `cost`).
    #[inline]
    fn refund(&self, tat: u64, _now: Nanos, cost: u64) -> Option<u64> {
        self.params.refund(tat, cost)
    }

    /// `max(TAT, now) + cost × T` ([`Timeline::charge`]): the bucket goes `cost` units further, past
    /// its depth if need be (debt).
    #[inline]
    fn charge(&self, tat: u64, now: Nanos, cost: u64) -> Option<u64> {
        self.params.charge(tat, now, cost)
    }
}

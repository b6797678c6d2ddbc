//! [`StripedLimiter`]: the limiter, its construction, and the decision's entry points: the alone
//! path, the cached denial and the choice of stripe. The lease path is in `lease_path.rs`, refunds
//! in `refund.rs`, the timeline hand-over in `handover.rs`.

use std::fmt;

use crossbeam_utils::CachePadded;
use tollgate_core::algorithm::Algorithm;
use tollgate_core::algorithm::gcra::Timeline;
use tollgate_core::{CheckError, Clock, Decision, Gcra, Limiter, MonotonicClock, Nanos, Quota};

use crate::config::{LeaseSize, MAX_STRIPES, StripedConfig};
use crate::error::StripedError;
use crate::grant::alive_units;
use crate::lease::LeaseWord;
use crate::receipt::LeaseReceipt;
use crate::shared::Shared;
use crate::stripe::Stripe;
use crate::sync::{Ordering, thread_ordinal};

/// One GCRA quota shared by many threads, scaled by per-stripe leases.
///
/// See the [crate docs](crate) for the design, the exact bounds and their proofs, and how to choose
/// the lease size.
///
/// ```
/// use tollgate_core::{Limiter, ManualClock, Quota};
/// use tollgate_striped::{StripedConfig, StripedLimiter};
///
/// let clock = ManualClock::new();
/// let limiter = StripedLimiter::with_config(
///     Quota::per_second(1_000)?,
///     StripedConfig::default().stripes(4),
///     clock.clone(),
/// )?;
/// assert!(limiter.check().is_allowed());
/// assert!(limiter.check_n(5)?.is_allowed());
/// assert!(limiter.check_n(5_000).is_err()); // above the burst: an error, not a denial
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct StripedLimiter<C = MonotonicClock> {
    pub(crate) shared: CachePadded<Shared>,
    /// `config.always_lease`.
    pub(crate) always_lease: bool,
    pub(crate) gcra: Gcra,
    /// The GCRA timeline arithmetic (core's, shared with `Gcra` and the shaper).
    pub(crate) timeline: Timeline,
    pub(crate) stripes: Box<[CachePadded<Stripe>]>,
    pub(crate) mask: usize,
    pub(crate) min_lease: u64,
    pub(crate) max_lease: u64,
    pub(crate) clock: C,
}

impl<C> fmt::Debug for StripedLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StripedLimiter")
            .field("quota", self.gcra.quota())
            .field("stripes", &self.stripes.len())
            .field("lease", &(self.min_lease..=self.max_lease))
            .finish_non_exhaustive()
    }
}

impl StripedLimiter<MonotonicClock> {
    /// A limiter with the default layout on the default monotonic clock.
    ///
    /// # Errors
    /// [`StripedError::Quota`] when GCRA cannot represent `quota`.
    pub fn new(quota: Quota) -> Result<Self, StripedError> {
        Self::with_config(quota, StripedConfig::default(), MonotonicClock::new())
    }
}

impl<C: Clock> StripedLimiter<C> {
    /// A limiter with the default layout reading `clock`.
    ///
    /// # Errors
    /// As [`with_config`](Self::with_config).
    pub fn with_clock(quota: Quota, clock: C) -> Result<Self, StripedError> {
        Self::with_config(quota, StripedConfig::default(), clock)
    }

    /// A limiter laid out by `config`, reading `clock`.
    ///
    /// # Errors
    /// [`StripedError`] for an unrepresentable quota, a stripe count of 0 or above
    /// [`MAX_STRIPES`], or a zero lease.
    pub fn with_config(
        quota: Quota,
        config: StripedConfig,
        clock: C,
    ) -> Result<Self, StripedError> {
        let gcra = Gcra::from_quota(quota)?;
        let wanted = config.stripes.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        });
        if wanted == 0 || wanted > MAX_STRIPES {
            return Err(StripedError::Stripes(wanted));
        }
        let count = wanted.next_power_of_two();
        let stripes_u64 = count as u64;
        let cap = (quota.burst() / stripes_u64).clamp(1, LeaseWord::UNITS_MASK);
        let (min_lease, max_lease) = match config.lease {
            None => (
                1,
                (quota.burst() / (4 * stripes_u64))
                    .clamp(1, 1 << 16)
                    .min(cap),
            ),
            Some(LeaseSize::Adaptive { max: 0 } | LeaseSize::Fixed(0)) => {
                return Err(StripedError::ZeroLease);
            }
            Some(LeaseSize::Adaptive { max }) => (1, max.min(cap)),
            Some(LeaseSize::Fixed(size)) => (size.min(cap), size.min(cap)),
        };
        let stripes = (0..count)
            .map(|_| CachePadded::new(Stripe::new(min_lease)))
            .collect();
        Ok(StripedLimiter {
            shared: CachePadded::new(Shared::new(0, !config.always_lease, quota.burst())),
            always_lease: config.always_lease,
            timeline: *gcra.timeline(),
            gcra,
            stripes,
            mask: count - 1,
            min_lease,
            max_lease,
            clock,
        })
    }

    /// The number of stripes (a power of two).
    pub fn stripes(&self) -> usize {
        self.stripes.len()
    }

    /// The largest lease a stripe may hold, in units: the stranded-capacity bound is this times
    /// [`stripes`](Self::stripes).
    pub fn max_lease(&self) -> u64 {
        self.max_lease
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The stripe the calling thread uses.
    #[inline]
    pub fn current_stripe(&self) -> usize {
        thread_ordinal() & self.mask
    }

    /// [`check_at`](Limiter::check_at) on the calling thread's stripe, with the [`LeaseReceipt`] that
    /// [`refund`](Self::refund) needs to give the admission back.
    ///
    /// # Errors
    /// [`CheckError::CostExceedsCapacity`] when `cost` is above the burst.
    #[inline]
    pub fn check_at_with_receipt(
        &self,
        now: Nanos,
        cost: u64,
    ) -> Result<(Decision, LeaseReceipt), CheckError> {
        // A hint (see `Shared::alone_below`); either path decides exactly.
        if self.shared.alone_takes(cost) {
            let (decision, word) = self.alone(now, cost);
            // An admission of `cost > 0` always moves the TAT (by `cost × T`), so `word` is the
            // end of the units it took; a cost of 0 took nothing.
            let receipt = if decision.is_allowed() && cost > 0 {
                LeaseReceipt::Shared { end: word }
            } else {
                LeaseReceipt::Nothing
            };
            return Ok((decision, receipt));
        }
        self.on_stripe(self.current_stripe(), now, cost)
    }

    /// The alone path: plain GCRA on the shared word (the same CAS loop and transition as
    /// [`tollgate_core::GcraLimiter`]), for a thread that found the limiter uncontended, deciding a
    /// cost of `0..=burst` (`Shared::alone_takes`: the cost check GCRA would make). A compare
    /// and swap that fails (another thread wrote the word between our load and our CAS) is the
    /// contention this path watches for: the limiter turns to its stripes for everyone's next
    /// decision. The decision itself is still exact (the loop re-decides on the word it found).
    /// Returns the decision and the word it was based on or wrote.
    #[inline(always)]
    fn alone(&self, now: Nanos, cost: u64) -> (Decision, Nanos) {
        // A denial writes nothing, so it is answered before the CAS loop, with nothing to count:
        // the loop's bookkeeping (the tries, the contention it watches for) is left out of a
        // flood's path. The first transition is then the loop's first.
        let current = self.shared.load();
        let first = self.timeline.transition(current, now, cost);
        if first.next.is_none_or(|next| next == current) {
            return (first.decision, current);
        }
        let mut first = Some(first);
        let mut tries = 0u32;
        let result = self.shared.update(current, |tat| {
            tries += 1;
            let transition = first
                .take()
                .unwrap_or_else(|| self.timeline.transition(tat, now, cost));
            Ok::<_, std::convert::Infallible>((transition.decision, transition.next))
        });
        if tries > 1 {
            // A failed exchange: another thread wrote the word between our read and our CAS.
            self.shared.contended();
        }
        let Ok(decided) = result;
        decided
    }

    /// The lease path on the calling thread's stripe `index`, whose word `word` (read with
    /// `Acquire`) the caller found not to be a cached denial. Kept out of line so that `check_at`
    /// (the alone path, and the cached denial a flood over the quota meets) inlines into its caller
    /// as plain GCRA's does.
    #[inline(never)]
    fn check_on_own_stripe(
        &self,
        index: usize,
        word: LeaseWord,
        now: Nanos,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        if !(1..=self.max_lease).contains(&cost) {
            return self
                .on_stripe(index, now, cost)
                .map(|(decision, _)| decision);
        }
        // `1 ≤ cost ≤ max_lease ≤ burst`: the cost checks of `on_stripe` cannot fail.
        self.on_lease(index, word, now, cost)
            .map(|(decision, _)| decision)
    }

    /// The cached denial: `Some` when the stripe's `word` holds no unit and the shared word refuses
    /// `cost` at `now`. With no unit in the lease there is nothing to give back, so a refill would
    /// be exactly GCRA on the shared word; the shared word is what remembers until when this stripe
    /// is refused (its TAT, which a refusal never writes), so we answer from it: one load and a
    /// compare, no lock and no CAS, the same work as plain GCRA's denial. When it could grant, the
    /// caller locks the stripe and takes a lease. A locked word is not answered here either (the
    /// caller decides on the shared word directly). The load is `Relaxed` (`AtomicState::load`): a
    /// denial publishes nothing and reads nothing but the word; whatever value coherence lets us
    /// read, the denial is one the shared word gave at some point since our own last operation on
    /// it, and it writes nothing, so it cannot over-admit; and it is not remembered anywhere, so a
    /// give-back or refund that lowers the TAT is seen by the next decision (crate docs,
    /// "Denials"; loom-tests: `a_cached_denial_does_not_outlive_a_refund`).
    #[inline(always)]
    pub(crate) fn cached_denial(&self, word: LeaseWord, now: Nanos, cost: u64) -> Option<Decision> {
        if word.units() != 0 || word.is_locked() {
            return None;
        }
        let transition = self.timeline.transition(self.shared.load(), now, cost);
        (!transition.decision.is_allowed()).then_some(transition.decision)
    }

    /// A decision on stripe `stripe` (masked to the stripe count), with the receipt of where the
    /// units came from: the one decision path (`check_at` and `check_at_with_receipt` pick the
    /// calling thread's stripe).
    #[inline]
    pub(crate) fn on_stripe(
        &self,
        stripe: usize,
        now: Nanos,
        cost: u64,
    ) -> Result<(Decision, LeaseReceipt), CheckError> {
        self.gcra.check_cost(cost)?;
        if cost == 0 {
            return self
                .peek_stripe(stripe, now, 0)
                .map(|decision| (decision, LeaseReceipt::Nothing));
        }
        let index = stripe & self.mask;
        let stripe = &self.stripes[index];
        if cost > self.max_lease {
            return Ok(self.direct(now, cost));
        }
        // Acquire: pairs with the lock holder's Release store of the word, so the `end` we read next
        // is at least the one installed with this word (loom-tests/tests/striped.rs: the
        // `a_reader_*` models).
        let word = LeaseWord::from_bits(stripe.word.load(Ordering::Acquire));
        self.on_lease(index, word, now, cost)
    }

    /// [`peek_at`](Limiter::peek_at) as seen from stripe `stripe`.
    pub(crate) fn peek_stripe(
        &self,
        stripe: usize,
        now: Nanos,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        self.gcra.check_cost(cost)?;
        let stripe = &self.stripes[stripe & self.mask];
        // Acquire (both): as in `on_stripe`, so the pair is never older than the word. Peek
        // is advisory and its answer may be stale under concurrent checks anyway, so no model
        // asserts on it: these two are argued, not loom-checked (loom-tests/README.md).
        let word = LeaseWord::from_bits(stripe.word.load(Ordering::Acquire));
        let end = stripe.end.load(Ordering::Acquire);
        let alive = if word.is_locked() {
            0
        } else {
            alive_units(word.units(), end, now, &self.timeline).unwrap_or(0)
        };
        let tat = self.shared.load();
        if alive >= cost {
            let free = self.timeline.available(tat, now);
            return Ok(Self::allowed(alive - cost, free, tat.max(end), now));
        }
        Ok(self.gcra.decide(tat, now, cost)?.decision)
    }

    /// Counts `cost` units at `now` without a decision (see [`Algorithm::charge`]: a settlement's
    /// overdraft): the shared TAT moves `cost × T` past `max(TAT, now)`, past the bucket's depth if
    /// need be, so every stripe's next lease waits for the debt to refill. Units the stripes'
    /// leases already hold are theirs to use (they were granted before the debt). Returns whether
    /// the shared word changed (`false` for a cost of 0).
    ///
    /// ```
    /// use tollgate_core::{Limiter, ManualClock, Quota};
    /// use tollgate_striped::{StripedConfig, StripedLimiter};
    /// let limiter = StripedLimiter::with_config(
    ///     Quota::per_second(1)?.with_burst(4)?,
    ///     StripedConfig::default().stripes(1),
    ///     ManualClock::new(),
    /// )?;
    /// assert!(limiter.charge_at(0, 6)); // 2 units beyond the burst
    /// assert_eq!(limiter.check_at(0, 1)?.retry_after(), Some(std::time::Duration::from_secs(3)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge_at(&self, now: Nanos, cost: u64) -> bool {
        self.shared.tat.charge(&self.gcra, now, cost)
    }

    /// An admission with `lease_left` units left in the stripe's lease, `shared_free` units free in
    /// the shared state when last looked at, and `tat` the latest shared TAT the stripe knows of.
    #[inline]
    pub(crate) fn allowed(lease_left: u64, shared_free: u64, tat: Nanos, now: Nanos) -> Decision {
        Decision::allowed(
            lease_left.saturating_add(shared_free),
            tat.saturating_sub(now),
        )
    }

    /// The denial the shared GCRA gives `cost` at `now` from `tat`.
    pub(crate) fn denied(&self, tat: Nanos, now: Nanos, cost: u64) -> Decision {
        match self.gcra.decide(tat, now, cost) {
            Ok(transition) if !transition.decision.is_allowed() => transition.decision,
            // The shared state freed up between our attempt and this call's arithmetic (cannot
            // happen: same inputs); fail closed with the shortest honest wait.
            _ => Decision::denied(self.timeline.interval(), tat.saturating_sub(now)),
        }
    }

    /// The GCRA parameters.
    pub fn gcra(&self) -> &Gcra {
        &self.gcra
    }
}

impl<C: Clock> Limiter for StripedLimiter<C> {
    #[inline]
    fn now(&self) -> Nanos {
        self.clock.now()
    }

    fn quota(&self) -> &Quota {
        self.gcra.quota()
    }

    /// Decides on the calling thread's stripe. `remaining` is approximate: this stripe's lease plus
    /// what the shared state had free when the lease was taken (other stripes' leases and later
    /// grants are not seen).
    #[inline(always)]
    fn check_at(&self, now: Nanos, cost: u64) -> Result<Decision, CheckError> {
        // A hint (see `Shared::alone_below`); either path decides exactly.
        if self.shared.alone_takes(cost) {
            return Ok(self.alone(now, cost).0);
        }
        let index = self.current_stripe();
        // Acquire: as the word's load in `on_stripe` (the `end` the lease path may read next must
        // be at least the one installed with this word).
        let word = LeaseWord::from_bits(self.stripes[index].word.load(Ordering::Acquire));
        // The cached denial first, inline: a denial costs plain GCRA's work plus one load, and
        // no call (costs outside `1..=max_lease` take the general path, which checks them).
        if (1..=self.max_lease).contains(&cost) {
            if let Some(denied) = self.cached_denial(word, now, cost) {
                return Ok(denied);
            }
        }
        self.check_on_own_stripe(index, word, now, cost)
    }

    /// What the calling thread's stripe would decide; approximate, as for `check_at`.
    fn peek_at(&self, now: Nanos, cost: u64) -> Result<Decision, CheckError> {
        self.peek_stripe(self.current_stripe(), now, cost)
    }
}

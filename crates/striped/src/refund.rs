//! [`StripedLimiter::refund`]: `cost` units given back where a [`LeaseReceipt`] says they came
//! from, when that is still exact.

use tollgate_core::Clock;

use crate::lease::LeaseWord;
use crate::limiter::StripedLimiter;
use crate::receipt::LeaseReceipt;
use crate::sync::Ordering;

impl<C: Clock> StripedLimiter<C> {
    /// Gives back `cost` units admitted with `receipt` (from
    /// [`check_at_with_receipt`](Self::check_at_with_receipt)). Returns whether anything was given
    /// back.
    ///
    /// * Units taken from a stripe's lease go back into that lease if it is still the same lease (its
    ///   generation unchanged, not being replaced): exact, as if the request had not come, because a
    ///   lease's units are interchangeable top positions of one segment.
    /// * Units taken from the shared state directly go back when nothing was granted above them
    ///   since (the shared TAT is still their end): exact.
    /// * Otherwise (the lease was replaced in between, or a later grant sits above the units) nothing
    ///   is given back: the units are lost to this quota, exactly like a lease's expired units —
    ///   stricter by at most `cost`, never looser.
    ///
    /// ```
    /// use tollgate_core::{Limiter, ManualClock, Quota};
    /// use tollgate_striped::{StripedConfig, StripedLimiter};
    /// let limiter = StripedLimiter::with_config(
    ///     Quota::per_second(1)?.with_burst(4)?,
    ///     StripedConfig::default().stripes(1),
    ///     ManualClock::new(),
    /// )?;
    /// let (decision, receipt) = limiter.check_at_with_receipt(0, 4)?;
    /// assert!(decision.is_allowed());
    /// assert!(limiter.refund(receipt, 4));
    /// assert!(limiter.check_at(0, 4)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund(&self, receipt: LeaseReceipt, cost: u64) -> bool {
        match receipt {
            LeaseReceipt::Nothing => false,
            LeaseReceipt::Lease { stripe, generation } => {
                let Some(stripe) = self.stripes.get(stripe) else {
                    return false;
                };
                // Relaxed: giving units back publishes nothing (the lease's `end` and bookkeeping
                // are unchanged within a generation); the CAS itself orders us against the fast
                // path's and the lock holder's writes of this word.
                let mut word = LeaseWord::from_bits(stripe.word.load(Ordering::Relaxed));
                loop {
                    let units = word.units().saturating_add(cost);
                    if word.is_locked()
                        || word.generation() != generation
                        || units > LeaseWord::UNITS_MASK
                    {
                        return false;
                    }
                    match stripe.word.compare_exchange_weak(
                        word.bits(),
                        word.with_units(units).bits(),
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => return true,
                        Err(actual) => word = LeaseWord::from_bits(actual),
                    }
                }
            }
            LeaseReceipt::Shared { end } => {
                let back = cost.saturating_mul(self.timeline.interval());
                self.shared
                    .update(self.shared.load(), |tat| {
                        let next = (tat == end && cost > 0).then(|| tat.saturating_sub(back));
                        Ok::<_, std::convert::Infallible>((next.is_some(), next))
                    })
                    .map(|(written, _)| written)
                    .unwrap_or_else(|never| match never {})
            }
        }
    }
}

//! What feature `diagnostics` adds to a [`StripedLimiter`]: decisions on a chosen stripe, for
//! models and tests that place requests explicitly, and snapshots of the leases' units and of the
//! alone path.

use tollgate_core::{CheckError, Clock, Decision, Nanos};

use crate::grant::alive_units;
use crate::lease::LeaseWord;
use crate::limiter::StripedLimiter;
use crate::receipt::LeaseReceipt;
use crate::sync::Ordering;

impl<C: Clock> StripedLimiter<C> {
    /// [`check_at`](tollgate_core::Limiter::check_at) on stripe `stripe` (masked to the stripe
    /// count), for models and tests that place requests on stripes explicitly (feature
    /// `diagnostics`).
    ///
    /// # Errors
    /// [`CheckError::CostExceedsCapacity`] when `cost` is above the burst.
    pub fn check_on_stripe(
        &self,
        stripe: usize,
        now: Nanos,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        self.on_stripe(stripe, now, cost)
            .map(|(decision, _)| decision)
    }

    /// `check_on_stripe` with the receipt of where the units came from (feature `diagnostics`).
    ///
    /// # Errors
    /// As `check_on_stripe`.
    pub fn check_on_stripe_with_receipt(
        &self,
        stripe: usize,
        now: Nanos,
        cost: u64,
    ) -> Result<(Decision, LeaseReceipt), CheckError> {
        self.on_stripe(stripe, now, cost)
    }

    /// [`peek_at`](tollgate_core::Limiter::peek_at) as seen from stripe `stripe` (feature
    /// `diagnostics`).
    ///
    /// # Errors
    /// As `check_on_stripe`.
    pub fn peek_on_stripe(
        &self,
        stripe: usize,
        now: Nanos,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        self.peek_stripe(stripe, now, cost)
    }

    /// Units currently held by leases (live or expired-but-not-yet-retired) plus units wasted so
    /// far: the quantity the lower-bound property test subtracts. Not synchronised with concurrent
    /// callers. Feature `diagnostics`.
    pub fn stranded_units(&self) -> u64 {
        self.stripes
            .iter()
            .map(|stripe| {
                // Relaxed: a diagnostic snapshot.
                let word = LeaseWord::from_bits(stripe.word.load(Ordering::Relaxed));
                word.units() + stripe.wasted.load(Ordering::Relaxed)
            })
            .sum()
    }

    /// Units held by live leases at `now` (not synchronised with concurrent callers). Feature
    /// `diagnostics`.
    pub fn held_units(&self, now: Nanos) -> u64 {
        self.stripes
            .iter()
            .map(|stripe| {
                // Relaxed: a diagnostic snapshot.
                let word = LeaseWord::from_bits(stripe.word.load(Ordering::Relaxed));
                let end = stripe.end.load(Ordering::Relaxed);
                alive_units(word.units(), end, now, &self.timeline).unwrap_or(0)
            })
            .sum()
    }

    /// Whether decisions currently take the alone path (plain GCRA on the shared word). Feature
    /// `diagnostics`.
    pub fn is_alone(&self) -> bool {
        self.shared.is_alone()
    }

    /// Leaves the alone path as a failed compare-and-swap on it does, for models and tests that
    /// cannot make one fail on purpose (feature `diagnostics`).
    pub fn mark_contended(&self) {
        self.shared.contended();
    }
}

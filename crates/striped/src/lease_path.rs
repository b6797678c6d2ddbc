//! The lease path of a [`StripedLimiter`] decision: units taken from the stripe's lease with one
//! compare-and-swap, the lease replaced from the shared word under the stripe's lock when it runs
//! out (its size adapting to how often that happens), and costs above a lease decided on the
//! shared word directly.

use tollgate_core::{CheckError, Clock, Decision, Nanos};

use crate::grant::{Grant, alive_units, grant};
use crate::lease::LeaseWord;
use crate::limiter::StripedLimiter;
use crate::receipt::LeaseReceipt;
use crate::shared::ALONE_AFTER;
use crate::stripe::Stripe;
use crate::sync::Ordering;

/// A lease is replaced sooner than this after it was taken → the stripe is "refilling often" and an
/// adaptive lease doubles.
const REFILL_TARGET_NANOS: Nanos = 20_000;

impl<C: Clock> StripedLimiter<C> {
    /// The lease path of `on_stripe` for `1 ≤ cost ≤ max_lease` on stripe `index` (in range), from
    /// its word `word` read with `Acquire`.
    #[inline]
    pub(crate) fn on_lease(
        &self,
        index: usize,
        mut word: LeaseWord,
        now: Nanos,
        cost: u64,
    ) -> Result<(Decision, LeaseReceipt), CheckError> {
        let stripe = &self.stripes[index];
        loop {
            if word.is_locked() {
                // Someone is replacing this stripe's lease: go to the shared state, do not wait.
                return Ok(self.direct(now, cost));
            }
            if let Some(denied) = self.cached_denial(word, now, cost) {
                return Ok((denied, LeaseReceipt::Nothing));
            }
            // Acquire: pairs with the Release store of `end` by any later lock holder; if we read a
            // newer `end` than `word`'s, that holder's locking CAS happens-before our CAS below,
            // which therefore fails. Without the edge the memory model would allow a
            // load-buffering cycle (our CAS ordered before that holder's locking CAS although we
            // read a store it made after locking) and we would spend old units against the new
            // lease's end. CPUs do not make a store visible before a load it is control-dependent
            // on, and loom explores no load-buffering executions, so no model can fail without
            // this Acquire (or that Release): they are kept on the memory-model argument alone.
            let end = stripe.end.load(Ordering::Acquire);
            let alive = alive_units(word.units(), end, now, &self.timeline);
            match alive {
                Some(alive) if alive >= cost => {
                    let next = word.with_units(alive - cost);
                    // Relaxed: estimates for `remaining`/`reset_after`, written by the lock holder
                    // (read before the CAS, which on x86 is a full barrier).
                    let tat_seen = stripe.tat_seen.load(Ordering::Relaxed);
                    let free_seen = stripe.free_seen.load(Ordering::Relaxed);
                    // Success Relaxed: the new count publishes nothing (the other fields are
                    // unchanged). Failure Acquire: we re-read `end` for the word we found
                    // (`a_reader_whose_cas_fails_on_a_replaced_lease_finds_its_end`).
                    match stripe.word.compare_exchange_weak(
                        word.bits(),
                        next.bits(),
                        Ordering::Relaxed,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => {
                            // Units whose positions time has passed left the lease unused.
                            stripe.count_wasted(word.units().saturating_sub(alive));
                            let receipt = LeaseReceipt::Lease {
                                stripe: index,
                                generation: word.generation(),
                            };
                            return Ok((
                                Self::allowed(alive - cost, free_seen, tat_seen.max(end), now),
                                receipt,
                            ));
                        }
                        Err(actual) => word = LeaseWord::from_bits(actual),
                    }
                }
                _ => {
                    // Lock the stripe to replace its lease.
                    // Success Relaxed: we need the previous lock holder's bookkeeping (and `end`)
                    // visible, and already have it: the CAS succeeds only on exactly the value
                    // `word`, which we read with an Acquire load or an Acquire failed CAS. Each
                    // word value is written once (units only fall within a generation; a new
                    // generation is a new publication, short of 2^43 of them), so that read saw
                    // the very store we now replace: a publisher's Release store or a fast-path
                    // RMW continuing its release sequence, and it synchronised us with that
                    // publisher. (No loom model can fail without it, so it is not asked for.)
                    // Failure Acquire: as for the fast-path CAS (loom-tests: see README).
                    match stripe.word.compare_exchange_weak(
                        word.bits(),
                        word.locked().bits(),
                        Ordering::Relaxed,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => {
                            return Ok(self.refill(index, stripe, word, end, alive, now, cost));
                        }
                        Err(actual) => word = LeaseWord::from_bits(actual),
                    }
                }
            }
        }
    }

    /// Replaces the lease of `stripe`, which the caller has locked (its word was `word`, with lease
    /// end `end` and `alive` usable units), and decides `cost` from the new lease.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn refill(
        &self,
        index: usize,
        stripe: &Stripe,
        word: LeaseWord,
        end: Nanos,
        alive: Option<u64>,
        now: Nanos,
        cost: u64,
    ) -> (Decision, LeaseReceipt) {
        // Relaxed loads of the bookkeeping: we hold the lock, and the Acquire read of the word we
        // locked synchronised us with the last holder's writes (see the lock CAS).
        let alive = alive.unwrap_or(0);
        let dead = word.units() - alive.min(word.units());
        let mut size = stripe.size.load(Ordering::Relaxed);
        if self.min_lease < self.max_lease {
            let installed = stripe.installed.load(Ordering::Relaxed);
            let taken_at = stripe.taken_at.load(Ordering::Relaxed);
            if now.saturating_sub(taken_at) < REFILL_TARGET_NANOS {
                // Refilling often (used up, or expired before the next request came): grow.
                size = size.saturating_mul(2).min(self.max_lease);
            } else if dead > 0 && word.units() >= installed {
                // A lease that lived a while expired with none of its units used: shrink.
                size = (size / 2).max(self.min_lease);
            }
        }
        // Offered even when no unit is alive: `returned` then still says whether the shared TAT was
        // our old lease's end, i.e. nobody took from the shared word since our last lease (with
        // `lo == end` the grant starts where it would have anyway).
        let give_back = Some((end - alive * self.timeline.interval(), end));
        let want = size.max(cost);
        let outcome = self.take(now, cost, want, give_back);
        match outcome {
            Grant::Granted {
                base,
                units,
                returned,
            } => {
                let lost = if returned { dead } else { dead + alive };
                let new_end = base + units * self.timeline.interval();
                // Relaxed load and store: the streak is the lock holder's alone (published to the
                // next holder like the rest of the bookkeeping, by the Release store of the word).
                let streak = if returned {
                    stripe.alone_streak.load(Ordering::Relaxed) + 1
                } else {
                    0
                };
                if streak >= ALONE_AFTER && !self.always_lease {
                    // This stripe alone has taken from the shared word `ALONE_AFTER` times running:
                    // nobody else is deciding.
                    self.shared.go_alone();
                    stripe.alone_streak.store(0, Ordering::Relaxed);
                } else {
                    stripe.alone_streak.store(streak, Ordering::Relaxed);
                }
                // Relaxed stores: published by the Release store of the word below.
                stripe.size.store(size, Ordering::Relaxed);
                stripe.taken_at.store(now, Ordering::Relaxed);
                stripe.installed.store(units - cost, Ordering::Relaxed);
                // The shared TAT is now `new_end` (our grant's end), unless someone grants above it.
                let free = self.timeline.available(new_end, now);
                stripe.tat_seen.store(new_end, Ordering::Relaxed);
                stripe.free_seen.store(free, Ordering::Relaxed);
                // Fast-path callers that won their CAS before our lock may still be adding.
                stripe.count_wasted(lost);
                // Release: a fast-path reader that Acquire-loads `end` and finds this value must
                // also find our lock (see `on_stripe`: argued, not loom-checkable).
                stripe.end.store(new_end, Ordering::Release);
                // Release: publishes `end` and the bookkeeping to whoever Acquire-loads this word
                // (loom-tests/tests/striped.rs: `a_reader_of_a_replaced_lease_finds_its_end`).
                let published = word.next(units - cost);
                stripe.word.store(published.bits(), Ordering::Release);
                let receipt = LeaseReceipt::Lease {
                    stripe: index,
                    generation: published.generation(),
                };
                (Self::allowed(units - cost, free, new_end, now), receipt)
            }
            Grant::Denied { tat } => {
                stripe.count_wasted(dead);
                stripe.size.store(size, Ordering::Relaxed);
                // Release: unlock, keeping the old lease's live units (fewer than `cost`); a reader
                // of this word needs the `end` our lock acquired (loom-tests/tests/striped.rs:
                // `a_reader_after_a_denied_refill_finds_the_kept_lease`).
                stripe
                    .word
                    .store(word.next(alive).bits(), Ordering::Release);
                (self.denied(tat, now, cost), LeaseReceipt::Nothing)
            }
        }
    }

    /// One CAS on the shared GCRA word: gives back `give_back` (if still on top) and grants up to
    /// `want` units, at least `cost` (see [`grant`]).
    fn take(&self, now: Nanos, cost: u64, want: u64, give_back: Option<(Nanos, Nanos)>) -> Grant {
        self.shared
            .update(self.shared.load(), |tat| {
                Ok::<_, std::convert::Infallible>(grant(
                    tat,
                    now,
                    cost,
                    want,
                    give_back,
                    &self.timeline,
                ))
            })
            .map(|(result, _)| result)
            .unwrap_or_else(|never| match never {})
    }

    /// Decides `cost` on the shared state alone (no lease): for costs above the lease size and for
    /// stripes whose lease is being replaced.
    pub(crate) fn direct(&self, now: Nanos, cost: u64) -> (Decision, LeaseReceipt) {
        let outcome = self.take(now, cost, cost, None);
        match outcome {
            Grant::Granted { base, units, .. } => {
                let tat = base + units * self.timeline.interval();
                (
                    Self::allowed(0, self.timeline.available(tat, now), tat, now),
                    LeaseReceipt::Shared { end: tat },
                )
            }
            Grant::Denied { tat } => (self.denied(tat, now, cost), LeaseReceipt::Nothing),
        }
    }
}

//! New keys: under the stripe lock, claim an empty slot or evict a fresh key, or decide by the stripe's
//! overflow state (the full-table policy), and the state an inserted key starts from.

use tollgate_core::{Algorithm, CheckError, Clock, Decision, Nanos};

use crate::defaults::default_tier;
use crate::headroom::Headroom;
use crate::ledger::OverflowLedger;
use crate::limiter::{KeyedLimiter, Place, SlotAt, Stripe};
use crate::slot::SlotWord;
use crate::sync::{Ordering, lock};

/// Which state decided a new key: its own slot, at this index (for a decision that wrote nothing,
/// the slot it would have taken, which does not hold it: a [`SlotReceipt`](crate::SlotReceipt)
/// checks the slot's tag before it gives anything back), or its stripe's overflow state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Landed {
    Slot(usize),
    Overflow,
}

impl<K: ?Sized, A: Algorithm, C: Clock> KeyedLimiter<K, A, C> {
    /// Under the stripe lock (`ledger` is what it guards): the key's slot if present, and the slot a
    /// new key may take: the first empty one, or when the window has none, the first holding a key
    /// fresh at `now` that is pinned neither by an override tier nor by [`pin_key`](Self::pin_key).
    /// Empty first, so idle keys stay resident (and are found lock-free when they come back) for as
    /// long as there is room: evicting them early only turns their next decision into an insert.
    pub(crate) fn scan_locked(
        &self,
        place: Place,
        now: Nanos,
        ledger: &OverflowLedger,
    ) -> (Option<SlotAt>, Option<SlotAt>) {
        let mut candidate = None;
        // Under the stripe lock the generation cannot change (a change holds every stripe lock).
        let generation = self.defaults.generation();
        let (tier, algorithm) = (default_tier(generation), self.defaults.get(generation));
        for index in self.window_indices(place) {
            let word = self.load(index);
            if word.is_empty() {
                return (None, Some((index, word)));
            }
            if word.hash_part() == place.hash_part {
                return (Some((index, word)), None);
            }
            if candidate.is_none()
                && word.tier() == tier
                && algorithm.is_fresh(word.state, now)
                && !ledger.is_pinned(word.hash_part())
            {
                candidate = Some((index, word));
            }
        }
        (None, candidate)
    }

    /// A key the lock-free scan did not find: under the stripe lock, find it (a racing insert may have
    /// added it), or claim a slot for it, or decide it by the stripe's overflow state.
    #[cold]
    pub(crate) fn insert(
        &self,
        place: Place,
        now: Nanos,
        cost: u64,
        reserve: impl Headroom,
    ) -> Result<Decision, CheckError> {
        self.insert_located(place, now, cost, reserve)
            .map(|(decision, _)| decision)
    }

    /// [`insert`](Self::insert), also saying where the decision was made (an in-flight permit must
    /// be given back to that same state).
    #[cold]
    pub(crate) fn insert_located(
        &self,
        place: Place,
        now: Nanos,
        cost: u64,
        reserve: impl Headroom,
    ) -> Result<(Decision, Landed), CheckError> {
        let stripe = &self.stripes[place.stripe];
        let mut ledger = lock(&stripe.insert);
        // Stable while we hold the stripe lock (see `scan_locked`).
        let generation = self.defaults.generation();
        let (tier, algorithm) = (default_tier(generation), self.defaults.get(generation));
        loop {
            match self.scan_locked(place, now, &ledger) {
                (Some((index, found)), _) => {
                    if let Some(result) = self.apply(index, found, now, cost, reserve) {
                        return result.map(|decision| (decision, Landed::Slot(index)));
                    }
                    // Only inserts re-tag slots and we hold the stripe's lock: unreachable, but
                    // rescanning is correct anyway.
                }
                (None, Some((index, old))) => {
                    let state = self.new_key_state(stripe, &mut ledger, place.hash_part, now);
                    let transition = reserve.decide(algorithm, state, now, cost)?;
                    let Some(next) = transition.next else {
                        // A decision that writes nothing (cost 0) does not insert the key.
                        return Ok((transition.decision, Landed::Slot(index)));
                    };
                    // Evicting a fresh key: this exchange fails if an admission on it landed after
                    // our load (its state is then no longer `old.state`), and we rescan.
                    if self.replace(index, old, SlotWord::new(place.hash_part, tier, next)) {
                        if old.is_empty() {
                            self.count_insert(place.stripe);
                        }
                        ledger.settle(place.hash_part);
                        return Ok((transition.decision, Landed::Slot(index)));
                    }
                }
                (None, None) => {
                    // Relaxed: a monitoring counter; publishes nothing.
                    stripe.overflowed.fetch_add(1, Ordering::Relaxed);
                    let decision = reserve.apply(&stripe.overflow, algorithm, now, cost)?;
                    if decision.is_allowed() {
                        ledger.record(place.hash_part);
                    }
                    return Ok((decision, Landed::Overflow));
                }
            }
        }
    }

    /// The state a key starts from when it takes a slot (under the stripe lock): fresh (`0`), unless
    /// the stripe's overflow state decided this key and is not fresh yet, in which case a copy of it.
    ///
    /// Why: every admission the overflow state made, this key's included, is recorded in it, and each
    /// algorithm's state only grows stricter as it records more admissions; so starting from it, the
    /// key's admitted stream (overflow and slot together) still conforms to its own quota, where
    /// starting fresh would hand it a second burst. Keys the ledger does not name never overflowed
    /// (or settled their debt in a slot since) and start fresh; a saturated ledger names every key.
    /// Once the overflow state is fresh again no key owes it anything.
    pub(crate) fn new_key_state(
        &self,
        stripe: &Stripe,
        ledger: &mut OverflowLedger,
        hash_part: u64,
        now: Nanos,
    ) -> u64 {
        let overflow = stripe.overflow.load();
        if self.algorithm().is_fresh(overflow, now) {
            ledger.clear();
            0
        } else if A::INHERITS_OVERFLOW && ledger.owes(hash_part) {
            overflow
        } else {
            0
        }
    }

    pub(crate) fn count_insert(&self, stripe: usize) {
        // Relaxed: a monitoring counter, written under the stripe lock; publishes nothing.
        self.stripes[stripe].len.fetch_add(1, Ordering::Relaxed);
    }
}

//! Giving an admission back: what the policy engine does for the rules that admitted a request
//! another rule denied. And charging units without a decision: what a settlement does when a
//! request's actual cost exceeded its reservation.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use tollgate_core::state::cas_loop;
use tollgate_core::{Algorithm, Clock, Nanos};

use crate::defaults::default_tier;
use crate::limiter::{KeyedLimiter, Place, Scan};
use crate::slot::SlotWord;
use crate::sync::lock;

impl<K: ?Sized, A: Algorithm, C: Clock> KeyedLimiter<K, A, C> {
    /// Gives back an admission of `cost` units that [`check_key_at`](Self::check_key_at) granted `key`
    /// at `now` (see [`Algorithm::refund`]): in the key's own slot, through the same pair CAS as a
    /// decision, or — when the key has no slot and its window has no room, so the admission was
    /// decided by the stripe's overflow state — in that overflow state. Returns whether a state
    /// changed.
    ///
    /// Exact at the admission's `now` as long as the key's slot did not change hands between the
    /// admission and the refund. Races with inserts and evictions in the key's window are resolved
    /// towards strictness (nothing is given back), with one exception: a key admitted in its own slot,
    /// then evicted by a caller that found it fresh at a later time, while the window filled up —
    /// its refund then lands on the overflow state, at most `cost` units looser there.
    ///
    /// ```
    /// use tollgate_core::{Gcra, ManualClock, Quota};
    /// use tollgate_sharded::KeyedLimiter;
    /// let limiter = KeyedLimiter::<str, Gcra, _>::with_clock(Quota::per_second(1)?, 100, ManualClock::new())?;
    /// let now = limiter.now();
    /// assert!(limiter.check_key_at("alice", now, 1)?.is_allowed());
    /// assert!(limiter.refund_key_at("alice", now, 1));
    /// assert!(limiter.check_key_at("alice", now, 1)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund_key_at<Q>(&self, key: &Q, now: Nanos, cost: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let place = self.place(self.hasher.hash_one(key));
        loop {
            match self.scan(place, None, Some(now)) {
                Scan::Found(index, found) => {
                    if let Some(written) = self.refund_slot(index, found, now, cost) {
                        return written;
                    }
                    // Re-tagged under us: look again.
                }
                Scan::Missing { room: true } => return false,
                Scan::Missing { room: false } => {
                    // Under the stripe lock, like every other write of the overflow state, so a
                    // change of the default quota never races it (see `set_default`).
                    let stripe = &self.stripes[place.stripe];
                    let _ledger = lock(&stripe.insert);
                    return stripe.overflow.refund(self.algorithm(), now, cost);
                }
            }
        }
    }

    /// The refund on one slot through the one CAS loop, as [`apply`](Self::apply): `None` when the
    /// slot no longer holds the key.
    pub(crate) fn refund_slot(
        &self,
        index: usize,
        current: SlotWord,
        now: Nanos,
        cost: u64,
    ) -> Option<bool> {
        let hash_part = current.hash_part();
        let outcome = cas_loop(
            current,
            |word: SlotWord| {
                if word.hash_part() != hash_part {
                    return Err(());
                }
                if self.promoted(index, word).is_some() {
                    // A promoted key's refund is refused (stricter; `hot.rs`).
                    return Ok((false, None));
                }
                let (algorithm, seen) = self.resolve(word);
                let next = algorithm
                    .refund(seen.state, now, cost)
                    .map(|state| seen.with_state(state));
                Ok((next.is_some_and(|next| next != word), next))
            },
            |old, new| self.exchange(index, old, new).map(drop),
        );
        outcome.ok().map(|(written, _)| written)
    }
    /// Counts `cost` units for `key` at `now` without a decision ([`Algorithm::charge`]: the key
    /// goes into debt if need be), through the same pair CAS as a decision. A key without a slot
    /// is inserted as a decision would insert it (from the overflow state it owes, else fresh), or
    /// charged in the stripe's overflow state when its window has no room, so an overdraft is never
    /// lost to an eviction. Returns whether a state changed (`false` for a cost of 0).
    ///
    /// ```
    /// use tollgate_core::{Gcra, ManualClock, Quota};
    /// use tollgate_sharded::KeyedLimiter;
    /// let limiter = KeyedLimiter::<str, Gcra, _>::with_clock(Quota::per_second(1)?, 100, ManualClock::new())?;
    /// let now = limiter.now();
    /// assert!(limiter.charge_key_at("alice", now, 3)); // 2 units of debt beyond the burst of 1
    /// let denied = limiter.check_key_at("alice", now, 1)?;
    /// assert_eq!(denied.retry_after(), Some(std::time::Duration::from_secs(3)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge_key_at<Q>(&self, key: &Q, now: Nanos, cost: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        if cost == 0 {
            return false;
        }
        let place = self.place(self.hasher.hash_one(key));
        loop {
            match self.scan(place, None, None) {
                Scan::Found(index, found) => {
                    if let Some(written) = self.charge_slot(index, found, now, cost) {
                        return written;
                    }
                    // Re-tagged under us: look again.
                }
                Scan::Missing { .. } => return self.charge_missing(place, now, cost),
            }
        }
    }

    /// A charge for a key the lock-free scan did not find: under the stripe lock, as
    /// [`insert`](Self::insert) does for a decision.
    #[cold]
    fn charge_missing(&self, place: Place, now: Nanos, cost: u64) -> bool {
        let stripe = &self.stripes[place.stripe];
        let mut ledger = lock(&stripe.insert);
        // Stable while we hold the stripe lock (see `scan_locked`).
        let generation = self.defaults.generation();
        let (tier, algorithm) = (default_tier(generation), self.defaults.get(generation));
        loop {
            match self.scan_locked(place, now, &ledger) {
                (Some((index, found)), _) => {
                    if let Some(written) = self.charge_slot(index, found, now, cost) {
                        return written;
                    }
                }
                (None, Some((index, old))) => {
                    let state = self.new_key_state(stripe, &mut ledger, place.hash_part, now);
                    let Some(next) = algorithm.charge(state, now, cost) else {
                        return false;
                    };
                    // Fails if an admission landed on the evicted key after our load: rescan.
                    if self.replace(index, old, SlotWord::new(place.hash_part, tier, next)) {
                        if old.is_empty() {
                            self.count_insert(place.stripe);
                        }
                        ledger.settle(place.hash_part);
                        return true;
                    }
                }
                (None, None) => {
                    let charged = stripe.overflow.charge(algorithm, now, cost);
                    // The key owes the overflow state now: it starts from it when inserted later.
                    ledger.record(place.hash_part);
                    return charged;
                }
            }
        }
    }

    /// The charge on one slot through the one CAS loop: `None` when the slot no longer holds the
    /// key.
    fn charge_slot(&self, index: usize, current: SlotWord, now: Nanos, cost: u64) -> Option<bool> {
        let hash_part = current.hash_part();
        let outcome = cas_loop(
            current,
            |word: SlotWord| {
                if word.hash_part() != hash_part {
                    return Err(());
                }
                if let Some(promoted) = self.promoted(index, word) {
                    // A promoted key is charged on its striped limiter (`hot.rs`).
                    return Ok((promoted.limiter.charge_at(now, cost), None));
                }
                let (algorithm, seen) = self.resolve(word);
                let next = algorithm
                    .charge(seen.state, now, cost)
                    .map(|state| seen.with_state(state));
                Ok((next.is_some_and(|next| next != word), next))
            },
            |old, new| self.exchange(index, old, new).map(drop),
        );
        outcome.ok().map(|(written, _)| written)
    }
}

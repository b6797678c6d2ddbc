//! Per-key override quotas (tiers): a 4-bit tier in the key's own slot selects one of at most
//! [`MAX_OVERRIDE_QUOTAS`](crate::MAX_OVERRIDE_QUOTAS) quotas; such slots are pinned.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use tollgate_core::{Algorithm, Clock, Nanos, Quota};

use crate::defaults::{default_tier, is_default_tier};
use crate::error::KeyedError;
use crate::limiter::{KeyedLimiter, Scan};
use crate::slot::SlotWord;
use crate::sync::lock;

impl<K: ?Sized, A: Algorithm, C: Clock> KeyedLimiter<K, A, C> {
    /// Gives `key` its own `quota` instead of the default (e.g. a premium API key). The key's state
    /// carries over as-is in units ([`Algorithm::carry_over`]): it keeps `min(what it had, the new
    /// quota's capacity)` available now, so a new override never hands a key more than it had. The
    /// key's slot is pinned: never evicted while it has an override.
    ///
    /// Overrides live in the table itself: a 4-bit tier in the slot's tag indexes one of at most
    /// [`MAX_OVERRIDE_QUOTAS`](crate::MAX_OVERRIDE_QUOTAS) override quotas. Keys sharing a quota
    /// share its tier.
    ///
    /// # Errors
    /// [`KeyedError::Quota`] for a quota the algorithm cannot represent,
    /// [`KeyedError::TooManyOverrideQuotas`] when the quota is new and all tiers are taken,
    /// [`KeyedError::WindowFull`] when the key is not in the table and its window has no room.
    pub fn set_override<Q>(&self, key: &Q, quota: Quota) -> Result<(), KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let tier = self.tier_for(quota)?;
        let to = self.override_algorithm(tier);
        let place = self.place(self.hasher.hash_one(key));
        let stripe = &self.stripes[place.stripe];
        let mut ledger = lock(&stripe.insert);
        let now = self.clock.now();
        // A promoted key goes back to its slot first, so its state is carried over (`hot.rs`).
        self.demote_at_locked(place, now);
        loop {
            let (found, candidate) = self.scan_locked(place, now, &ledger);
            let (index, old, new) = match (found, candidate) {
                (Some((index, old)), _) => {
                    let (from, seen) = self.resolve(old);
                    let state = carry(from, seen.state, now, to);
                    (index, old, SlotWord::new(place.hash_part, tier, state))
                }
                (None, Some((index, old))) => {
                    let state = self.new_key_state(stripe, &mut ledger, place.hash_part, now);
                    let state = carry(self.algorithm(), state, now, to);
                    (index, old, SlotWord::new(place.hash_part, tier, state))
                }
                (None, None) => return Err(KeyedError::WindowFull),
            };
            if self.replace(index, old, new) {
                if old.is_empty() {
                    self.count_insert(place.stripe);
                }
                ledger.settle(place.hash_part);
                return Ok(());
            }
        }
    }

    /// Returns `key` to the default quota (its state carried over as-is in units, as in
    /// [`set_override`](Self::set_override)) and unpins its slot. Returns whether the key had an
    /// override.
    pub fn remove_override<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let place = self.place(self.hasher.hash_one(key));
        let ledger = lock(&self.stripes[place.stripe].insert);
        let now = self.clock.now();
        self.demote_at_locked(place, now);
        // Stable under the stripe lock (a default change holds every stripe lock).
        let generation = self.defaults.generation();
        let to = self.defaults.get(generation);
        loop {
            let (found, _) = self.scan_locked(place, 0, &ledger);
            let Some((index, old)) = found else {
                return false;
            };
            if is_default_tier(old.tier()) {
                return false;
            }
            let state = carry(self.override_algorithm(old.tier()), old.state, now, to);
            let new = SlotWord::new(place.hash_part, default_tier(generation), state);
            if self.replace(index, old, new) {
                return true;
            }
        }
    }

    /// Makes `key` resident and unevictable until [`unpin_key`](Self::unpin_key), without changing
    /// what it is decided by: a key already in the table keeps its slot and state; a key that is not
    /// takes a slot with the state an insert would give it (fresh, or the overflow state it owes), as
    /// its next decision would have. Pins count: each needs its own `unpin_key`.
    ///
    /// What it is for: a later [`set_override`](Self::set_override) of a pinned key cannot fail with
    /// [`KeyedError::WindowFull`] (so a reload can place overrides after it has committed). While a
    /// key is pinned, a lock-free peek or refund of a *missing* key in its window may count the
    /// pinned slot as room.
    ///
    /// # Errors
    /// [`KeyedError::WindowFull`] when the key is not in the table and its window has no room.
    pub fn pin_key<Q>(&self, key: &Q) -> Result<(), KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let place = self.place(self.hasher.hash_one(key));
        let stripe = &self.stripes[place.stripe];
        let mut ledger = lock(&stripe.insert);
        let now = self.clock.now();
        let tier = default_tier(self.defaults.generation());
        loop {
            match self.scan_locked(place, now, &ledger) {
                (Some(_), _) => break,
                (None, Some((index, old))) => {
                    let state = self.new_key_state(stripe, &mut ledger, place.hash_part, now);
                    if self.replace(index, old, SlotWord::new(place.hash_part, tier, state)) {
                        if old.is_empty() {
                            self.count_insert(place.stripe);
                        }
                        ledger.settle(place.hash_part);
                        break;
                    }
                }
                (None, None) => return Err(KeyedError::WindowFull),
            }
        }
        ledger.pin(place.hash_part);
        Ok(())
    }

    /// Takes away one [`pin_key`](Self::pin_key) of `key`; whether it had one. The key stays in the
    /// table (evictable again once fresh).
    pub fn unpin_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let place = self.place(self.hasher.hash_one(key));
        lock(&self.stripes[place.stripe].insert).unpin(place.hash_part)
    }

    /// Whether [`set_override`](Self::set_override) with each of `quotas` would find a tier: each is
    /// a quota the algorithm holds, and the ones no tier has yet fit in the free tiers. Stays true
    /// until someone else sets an override with a new quota.
    ///
    /// # Errors
    /// [`KeyedError::Quota`] for a quota the algorithm cannot represent,
    /// [`KeyedError::TooManyOverrideQuotas`] when the new quotas do not fit.
    pub fn check_override_quotas(&self, quotas: &[Quota]) -> Result<(), KeyedError> {
        let _guard = lock(&self.tiers_lock);
        let mut free = self.tiers.iter().filter(|t| t.get().is_none()).count();
        let mut counted: Vec<Quota> = Vec::new();
        for quota in quotas {
            A::from_quota(*quota)?;
            let known = self
                .tiers
                .iter()
                .any(|t| t.get().is_some_and(|a| a.quota() == quota));
            if known || counted.contains(quota) {
                continue;
            }
            free = free
                .checked_sub(1)
                .ok_or(KeyedError::TooManyOverrideQuotas)?;
            counted.push(*quota);
        }
        Ok(())
    }

    /// The quota `key` is limited by: its override, or the default.
    pub fn quota_for<Q>(&self, key: &Q) -> &Quota
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let place = self.place(self.hasher.hash_one(key));
        match self.scan(place, None, None) {
            Scan::Found(_, found) => self.resolve(found).0.quota(),
            Scan::Missing { .. } => self.algorithm().quota(),
        }
    }

    /// The tier for an override quota: an existing one with the same quota, or a new one.
    fn tier_for(&self, quota: Quota) -> Result<u8, KeyedError> {
        let algorithm = A::from_quota(quota)?;
        let _guard = lock(&self.tiers_lock);
        for (i, tier) in self.tiers.iter().enumerate() {
            let number = u8::try_from(i + 1).map_err(|_| KeyedError::TooManyOverrideQuotas)?;
            match tier.get() {
                Some(existing) if *existing.quota() == quota => return Ok(number),
                Some(_) => {}
                None => {
                    // Only this function sets tiers, under `tiers_lock`, so the cell is still empty.
                    let _ = tier.set(algorithm);
                    return Ok(number);
                }
            }
        }
        Err(KeyedError::TooManyOverrideQuotas)
    }
}

/// `state` under `from` carried over to `to` at `now`; unchanged when both hold the same quota (a
/// carry-over would only drop the fraction of a unit).
fn carry<A: Algorithm>(from: &A, state: u64, now: Nanos, to: &A) -> u64 {
    if from.quota() == to.quota() {
        state
    } else {
        from.carry_over(state, now, to)
    }
}

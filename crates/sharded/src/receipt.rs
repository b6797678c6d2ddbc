//! [`SlotReceipt`]: where a keyed admission was recorded, so that giving it back goes to that very
//! state, without hashing the key or probing for it again.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use tollgate_core::{Algorithm, CheckError, Clock, Decision, Nanos};

use crate::headroom::{Headroom, Plain};
use crate::insert::Landed;
use crate::limiter::{KeyedLimiter, Place, Scan};
use crate::slot::TIER_MASK;
use crate::sync::lock;

/// Where [`KeyedLimiter::check_key_at_with_receipt`] decided a key: its slot (with the key's tag, so
/// a slot that changed hands since is recognised) or its stripe's overflow state.
/// [`KeyedLimiter::refund_receipt_at`] gives an admission back there. Made for every decision,
/// denials included (no test on the decision's path): as with
/// [`refund_key_at`](KeyedLimiter::refund_key_at), only an admission is ever refunded. The
/// default receipt names nothing.
///
/// Two words, no separate variant tag: `mark` is the key's tag hash part (whose low tier bits are
/// always 0) with the kind in those bits, `at` the slot or stripe index. A policy decision keeps one
/// per keyed rule that admits, so building and moving it is paid on every admission (7
/// instructions per keyed rule, `results/engine/refund.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotReceipt {
    mark: u64,
    at: usize,
}

/// `mark`'s kind bits: nothing recorded (`mark == 0`), the key's slot `at`, the overflow state of
/// stripe `at`.
const IN_SLOT: u64 = 1;
const IN_OVERFLOW: u64 = 2;

impl SlotReceipt {
    /// The receipt of a decision made in the state `landed` says, for the key at `place`. Made
    /// for a denial too (no test on the decision's path): a refund is only ever of an admission,
    /// as for [`refund_key_at`](KeyedLimiter::refund_key_at).
    #[inline(always)]
    fn new(landed: Landed, place: Place) -> Self {
        match landed {
            Landed::Slot(index) => SlotReceipt {
                mark: place.hash_part | IN_SLOT,
                at: index,
            },
            Landed::Overflow => SlotReceipt {
                mark: place.hash_part | IN_OVERFLOW,
                at: place.stripe,
            },
        }
    }

    /// Whether the receipt names no state: the default value, which gives nothing back.
    pub fn is_nothing(&self) -> bool {
        self.mark == 0
    }
}

impl<K: ?Sized, A: Algorithm, C: Clock> KeyedLimiter<K, A, C> {
    /// [`check_key_at`](Self::check_key_at), with the [`SlotReceipt`] that
    /// [`refund_receipt_at`](Self::refund_receipt_at) needs to give the admission back.
    ///
    /// ```
    /// use tollgate_core::{Gcra, ManualClock, Quota};
    /// use tollgate_sharded::KeyedLimiter;
    /// let limiter = KeyedLimiter::<str, Gcra, _>::with_clock(Quota::per_second(1)?, 100, ManualClock::new())?;
    /// let now = limiter.now();
    /// let (decision, receipt) = limiter.check_key_at_with_receipt("alice", now, 1)?;
    /// assert!(decision.is_allowed());
    /// assert!(limiter.refund_receipt_at(receipt, now, 1));
    /// assert!(limiter.check_key_at("alice", now, 1)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`check_key`](Self::check_key).
    #[inline]
    pub fn check_key_at_with_receipt<Q>(
        &self,
        key: &Q,
        now: Nanos,
        cost: u64,
    ) -> Result<(Decision, SlotReceipt), CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.decide_with_receipt(self.place(self.hasher.hash_one(key)), now, cost, Plain)
    }

    /// [`check_key_reserving_at`](Self::check_key_reserving_at), with the [`SlotReceipt`] of the
    /// admission.
    ///
    /// # Errors
    /// As [`check_key`](Self::check_key).
    #[inline]
    pub fn check_key_reserving_at_with_receipt<Q>(
        &self,
        key: &Q,
        now: Nanos,
        cost: u64,
        reserve: u64,
    ) -> Result<(Decision, SlotReceipt), CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.decide_with_receipt(self.place(self.hasher.hash_one(key)), now, cost, reserve)
    }

    /// The decision path (`decide` in `table.rs`), saying where the admission was recorded. A loop
    /// of its own: `decide` written as this one with the receipt dropped (the slot index and the
    /// cold insert's `Landed` carried out of the loop) cost the plain keyed check 19 more
    /// instructions per decision (242 -> 261 at one key, `results/keyed/floor.sh`).
    #[inline(always)]
    fn decide_with_receipt(
        &self,
        place: Place,
        now: Nanos,
        cost: u64,
        reserve: impl Headroom,
    ) -> Result<(Decision, SlotReceipt), CheckError> {
        loop {
            match self.scan(place, None, None) {
                Scan::Found(index, found) => {
                    if let Some(result) = self.apply(index, found, now, cost, reserve) {
                        let receipt = SlotReceipt::new(Landed::Slot(index), place);
                        return result.map(|decision| (decision, receipt));
                    }
                    // Re-tagged (evicted) under us: look again.
                }
                Scan::Missing { .. } => {
                    return self
                        .insert_located(place, now, cost, reserve)
                        .map(|(decision, landed)| (decision, SlotReceipt::new(landed, place)));
                }
            }
        }
    }

    /// Gives back an admission of `cost` units made at `now` where `receipt` (from this limiter's
    /// [`check_key_at_with_receipt`](Self::check_key_at_with_receipt)) says it was recorded, as
    /// [`refund_key_at`](Self::refund_key_at) does, without hashing the key or probing for it.
    /// Returns whether a state changed.
    ///
    /// Exact, or stricter: when the key's slot changed hands since (the key was evicted, and
    /// perhaps inserted again elsewhere with a state of its own), nothing is given back; an
    /// admission the overflow state made goes back to the overflow state, even if the key has
    /// taken a slot since. A key evicted and inserted again into the same slot gets the refund in
    /// its new state, as `refund_key_at` would give it (it had to be fresh to be evicted). A
    /// promoted key's refund is refused, as `refund_key_at`'s is.
    pub fn refund_receipt_at(&self, receipt: SlotReceipt, now: Nanos, cost: u64) -> bool {
        let (index, hash_part) = (receipt.at, receipt.mark & !TIER_MASK);
        match receipt.mark & TIER_MASK {
            IN_SLOT => {
                if index >= self.slots.len() {
                    // Not a receipt of this limiter: nothing to give back.
                    return false;
                }
                let current = self.load(index);
                if current.hash_part() != hash_part {
                    return false;
                }
                // `None`: re-tagged between our load and the exchange; the key is gone.
                self.refund_slot(index, current, now, cost).unwrap_or(false)
            }
            IN_OVERFLOW => {
                let Some(stripe) = self.stripes.get(index) else {
                    return false;
                };
                // Under the stripe lock, like every other write of the overflow state.
                let _ledger = lock(&stripe.insert);
                stripe.overflow.refund(self.algorithm(), now, cost)
            }
            _ => false,
        }
    }
}

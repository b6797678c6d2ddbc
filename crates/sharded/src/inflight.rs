//! [`KeyedInFlight`]: an in-flight limit per key on the keyed table, and the [`KeyPermit`] guard.
//!
//! The table is the same one the rate limits use, running the [`InFlight`] state machine: a key's
//! slot counts its permits out, a take is the table's admission and a release its refund. An
//! in-flight count is [fresh](tollgate_core::Algorithm::is_fresh) only at 0 (or when every permit
//! is past its maximum hold time), so the table's eviction rule gives exactly "a key with permits
//! out is never evicted"; a new key whose probe window holds only such keys is decided by its
//! stripe's overflow count under the default limit, and its permit is given back there.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::state::cas_loop;
use tollgate_core::{CheckError, Clock, Decision, InFlight, MonotonicClock, Nanos, Quota, Release};

use crate::error::KeyedError;
use crate::headroom::{Headroom, Plain};
use crate::insert::Landed;
use crate::limiter::{KeyedLimiter, Place, Scan};
use crate::slot::SlotWord;
use crate::sync::{AtomicUsize, Ordering, lock};

/// At most `limit` units in flight per key, in the keyed table's fixed memory.
///
/// * [`try_acquire`](Self::try_acquire) takes a permit (lock-free for a known key: a window scan
///   and one 128-bit compare-and-swap) and returns a [`KeyPermit`] that gives it back when dropped:
///   when the response finishes, the request is cancelled or its task unwinds from a panic. There
///   is no other way to release, so a permit cannot be released twice.
/// * **Eviction**: only keys with nothing in flight (or only permits past their maximum hold time)
///   are evicted; a flood of new keys while permits are out never resets a holder's count. New
///   keys that find no room share their stripe's overflow count (the default limit for them all).
/// * **Stuck holders**: a permit not released within the limit's maximum hold time is reclaimed
///   between `max_hold` and `2 × max_hold` after its take, at the key's next admission, and
///   counted in [`reclaimed`](Self::reclaimed); its late release changes nothing and is counted in
///   [`late_releases`](Self::late_releases). A key whose permits are all past their hold time may
///   be evicted before such an admission, uncounted.
/// * Per-key limits: the table's overrides ([`KeyedLimiter::set_override`] with
///   `Quota::per(max_hold, limit)`); a new default: [`KeyedLimiter::set_default`] (counts carry
///   over as they are).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tollgate_sharded::KeyedInFlight;
///
/// // 2 requests in flight per client, 10 000 clients, a permit reclaimed after at most 60 s.
/// let limits = Arc::new(KeyedInFlight::<str>::new(2, Duration::from_secs(30), 10_000)?);
/// let a = limits.try_acquire("alice", 1)?.expect("free");
/// let b = limits.try_acquire("alice", 1)?.expect("free");
/// assert!(limits.try_acquire("alice", 1)?.is_err()); // denied: two out
/// assert!(limits.try_acquire("bob", 1)?.is_ok());    // keys are independent
/// drop(a);
/// assert_eq!(limits.in_flight("alice"), 1);
/// drop(b);
/// assert_eq!(limits.in_flight("alice"), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct KeyedInFlight<K: ?Sized, C = MonotonicClock> {
    table: KeyedLimiter<K, InFlight, C>,
    reclaimed: AtomicUsize,
    late: AtomicUsize,
}

impl<K: ?Sized + 'static> KeyedInFlight<K, MonotonicClock> {
    /// At most `limit` units in flight per key, for up to `capacity` keys with permits out at once,
    /// permits reclaimed between `max_hold` and `2 × max_hold` after their take.
    ///
    /// # Errors
    /// [`KeyedError::Quota`] for a zero limit (`ZeroLimit`), a limit above
    /// [`MAX_IN_FLIGHT`](tollgate_core::MAX_IN_FLIGHT) (`LimitTooLarge`) or a zero `max_hold`;
    /// the table's own errors ([`KeyedError::ZeroCapacity`], ...).
    pub fn new(limit: u64, max_hold: Duration, capacity: usize) -> Result<Self, KeyedError> {
        Ok(Self::from_table(KeyedLimiter::new(
            Quota::per(max_hold, limit)?,
            capacity,
        )?))
    }
}

impl<K: ?Sized + 'static, C: Clock + 'static> KeyedInFlight<K, C> {
    /// Wraps a table built with [`KeyedLimiter::builder`] (clock, stripes, window, seed); its quota
    /// reads `limit` = the most units in flight per key, `period` = the maximum hold time.
    pub fn from_table(table: KeyedLimiter<K, InFlight, C>) -> Self {
        KeyedInFlight {
            table,
            reclaimed: AtomicUsize::new(0),
            late: AtomicUsize::new(0),
        }
    }

    /// The table (capacity, memory, overrides, default limit).
    pub fn table(&self) -> &KeyedLimiter<K, InFlight, C> {
        &self.table
    }

    /// Takes `cost` units for `key` now: `Ok(permit)`, or `Err(denial)` (nothing taken).
    ///
    /// # Errors
    /// [`CheckError::CostExceedsCapacity`] when `cost` exceeds the key's limit.
    pub fn try_acquire<Q>(
        self: &Arc<Self>,
        key: &Q,
        cost: u64,
    ) -> Result<Result<KeyPermit<'static>, Decision>, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.try_acquire_at(key, self.table.now(), cost)
    }

    /// [`try_acquire`](Self::try_acquire) at `now` (nanoseconds on the table's clock).
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub fn try_acquire_at<Q>(
        self: &Arc<Self>,
        key: &Q,
        now: Nanos,
        cost: u64,
    ) -> Result<Result<KeyPermit<'static>, Decision>, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.acquire_with(key, now, cost, Plain)
    }

    /// [`try_acquire_at`](Self::try_acquire_at) leaving `reserve` units of the key's limit for
    /// higher priority classes: admitted only if, after it, at least `reserve` more units could
    /// still be taken ([`Algorithm::decide_reserving`](tollgate_core::Algorithm::decide_reserving),
    /// in the same compare-and-swap; a denial takes nothing). A denial because of the reserve
    /// alone says [`Decision::NEVER`] when `cost + reserve` exceeds the limit.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tollgate_sharded::KeyedInFlight;
    /// let limits = Arc::new(KeyedInFlight::<str>::new(10, Duration::from_secs(60), 100)?);
    /// let now = limits.table().now();
    /// // Batch traffic must leave 2 of each key's 10 for critical traffic.
    /// let batch: Vec<_> = (0..10)
    ///     .filter_map(|_| limits.try_acquire_reserving_at("acme", now, 1, 2).unwrap().ok())
    ///     .collect();
    /// assert_eq!(batch.len(), 8);
    /// assert!(limits.try_acquire_at("acme", now, 2)?.is_ok()); // the reserved 2
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub fn try_acquire_reserving_at<Q>(
        self: &Arc<Self>,
        key: &Q,
        now: Nanos,
        cost: u64,
        reserve: u64,
    ) -> Result<Result<KeyPermit<'static>, Decision>, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        if reserve == 0 {
            return self.acquire_with(key, now, cost, Plain);
        }
        self.acquire_with(key, now, cost, reserve)
    }

    fn acquire_with<Q>(
        self: &Arc<Self>,
        key: &Q,
        now: Nanos,
        cost: u64,
        reserve: impl Headroom,
    ) -> Result<Result<KeyPermit<'static>, Decision>, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.take_key(key, now, cost, reserve, || {
            Owner::Shared(Arc::clone(self) as Arc<dyn GiveBack>)
        })
    }

    /// [`try_acquire`](Self::try_acquire) for a permit that borrows the table rather than sharing
    /// it: no reference count to bump and drop, which every take and release would otherwise write
    /// on one cache line shared by every thread (the table's `Arc`). For a permit held within a
    /// scope, or from a table that lives for the whole program (a `&'static` table gives a
    /// `KeyPermit<'static>`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_sharded::KeyedInFlight;
    /// let limits = KeyedInFlight::<str>::new(1, Duration::from_secs(30), 100)?;
    /// {
    ///     let _permit = limits.try_acquire_scoped("alice", 1)?.expect("free");
    ///     assert!(limits.try_acquire_scoped("alice", 1)?.is_err());
    /// }
    /// assert!(limits.try_acquire_scoped("alice", 1)?.is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub fn try_acquire_scoped<Q>(
        &self,
        key: &Q,
        cost: u64,
    ) -> Result<Result<KeyPermit<'_>, Decision>, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.try_acquire_scoped_at(key, self.table.now(), cost)
    }

    /// [`try_acquire_scoped`](Self::try_acquire_scoped) at `now` (nanoseconds on the table's
    /// clock).
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub fn try_acquire_scoped_at<Q>(
        &self,
        key: &Q,
        now: Nanos,
        cost: u64,
    ) -> Result<Result<KeyPermit<'_>, Decision>, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.take_key(key, now, cost, Plain, || Owner::Borrowed(self))
    }

    /// The take for `key`, and its permit from `owner` when admitted.
    fn take_key<'a, Q>(
        &self,
        key: &Q,
        now: Nanos,
        cost: u64,
        reserve: impl Headroom,
        owner: impl FnOnce() -> Owner<'a>,
    ) -> Result<Result<KeyPermit<'a>, Decision>, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let place = self.table.place(self.table.hasher.hash_one(key));
        let (decision, landed) = self.take(place, now, cost, reserve)?;
        if !decision.is_allowed() {
            return Ok(Err(decision));
        }
        Ok(Ok(KeyPermit {
            owner: owner(),
            place,
            landed,
            taken_at: now,
            cost,
            decision,
        }))
    }

    /// Units `key` has in flight now in its own slot (0 for a key not in the table; permits a full
    /// window sent to the overflow count are not attributed to a key).
    pub fn in_flight<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let place = self.table.place(self.table.hasher.hash_one(key));
        match self.table.scan(place, None, None) {
            Scan::Found(_, word) => {
                let (algorithm, seen) = self.table.resolve(word);
                algorithm.in_flight(seen.state, self.table.now())
            }
            Scan::Missing { .. } => 0,
        }
    }

    /// Units reclaimed from holders that kept them past the maximum hold time (counted at the
    /// key's next admission).
    pub fn reclaimed(&self) -> usize {
        // Relaxed: a monitoring figure.
        self.reclaimed.load(Ordering::Relaxed)
    }

    /// Releases that came after their permit had been reclaimed (and changed nothing).
    pub fn late_releases(&self) -> usize {
        // Relaxed: a monitoring figure.
        self.late.load(Ordering::Relaxed)
    }

    /// The take: the key's slot lock-free, else the table's insert path (which may decide it by the
    /// stripe's overflow count); says which.
    fn take(
        &self,
        place: Place,
        now: Nanos,
        cost: u64,
        reserve: impl Headroom,
    ) -> Result<(Decision, Landed), CheckError> {
        loop {
            match self.table.scan(place, None, None) {
                Scan::Found(index, found) => {
                    if let Some(result) = self.take_slot(index, found, now, cost, reserve) {
                        return result.map(|decision| (decision, Landed::Slot(index)));
                    }
                    // Re-tagged under us (the key was evicted at count 0): look again.
                }
                Scan::Missing { .. } => {
                    return self.table.insert_located(place, now, cost, reserve);
                }
            }
        }
    }

    /// The table's `apply` for one slot, counting the permits the written word reclaimed.
    fn take_slot(
        &self,
        index: usize,
        current: SlotWord,
        now: Nanos,
        cost: u64,
        reserve: impl Headroom,
    ) -> Option<Result<Decision, CheckError>> {
        let hash_part = current.hash_part();
        let outcome = cas_loop(
            current,
            |word: SlotWord| {
                if word.hash_part() != hash_part {
                    return Err(None);
                }
                let (algorithm, seen) = self.table.resolve(word);
                let transition = reserve
                    .decide(algorithm, seen.state, now, cost)
                    .map_err(|error| Some(Err(error)))?;
                let reclaimed = match transition.next {
                    Some(_) => algorithm.reclaimable(seen.state, now),
                    None => 0,
                };
                let next = transition.next.map(|state| seen.with_state(state));
                Ok(((transition.decision, reclaimed), next))
            },
            // The table's admission exchange; its orderings are argued there (`exchange`).
            |old, new| self.table.exchange(index, old, new).map(drop),
        );
        match outcome {
            Ok(((decision, reclaimed), _)) => {
                if reclaimed > 0 {
                    // Relaxed: a monitoring counter; publishes nothing.
                    self.reclaimed.fetch_add(
                        usize::try_from(reclaimed).unwrap_or(usize::MAX),
                        Ordering::Relaxed,
                    );
                }
                Some(Ok(decision))
            }
            Err(stopped) => stopped,
        }
    }
}

/// What a [`KeyPermit`] gives its units back to, whatever the table's key and clock types.
trait GiveBack: Send + Sync {
    /// Gives a permit back to the state that counted it.
    fn release(&self, place: Place, landed: Landed, taken_at: Nanos, cost: u64);
}

impl<K: ?Sized, C: Clock> GiveBack for KeyedInFlight<K, C> {
    fn release(&self, place: Place, landed: Landed, taken_at: Nanos, cost: u64) {
        if cost == 0 {
            return;
        }
        let released = match landed {
            Landed::Slot(_) => self.release_slot(place, taken_at, cost),
            Landed::Overflow => {
                // Under the stripe lock, like every other write of the overflow state (a change of
                // the default limit carries it over under every stripe lock).
                let stripe = &self.table.stripes[place.stripe];
                let _ledger = lock(&stripe.insert);
                let algorithm = self.table.algorithm();
                let result: Result<(bool, u64), std::convert::Infallible> =
                    stripe.overflow.update(stripe.overflow.load(), |word| {
                        Ok(release_step(algorithm.release(word, taken_at, cost)))
                    });
                matches!(result, Ok((true, _)))
            }
        };
        if !released {
            // Relaxed: a monitoring counter.
            self.late.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl<K: ?Sized, C: Clock> KeyedInFlight<K, C> {
    /// A release in the key's slot. The key cannot have moved: a slot is only re-tagged when its
    /// key is fresh, which with a permit out means the permit was reclaimed; then the key is
    /// missing, or a later incarnation whose epoch finds the permit reclaimed.
    fn release_slot(&self, place: Place, taken_at: Nanos, cost: u64) -> bool {
        loop {
            let Scan::Found(index, current) = self.table.scan(place, None, None) else {
                return false;
            };
            let hash_part = current.hash_part();
            let outcome = cas_loop(
                current,
                |word: SlotWord| {
                    if word.hash_part() != hash_part {
                        return Err(());
                    }
                    let (algorithm, seen) = self.table.resolve(word);
                    let (released, next) =
                        release_step(algorithm.release(seen.state, taken_at, cost));
                    Ok((released, next.map(|state| seen.with_state(state))))
                },
                |old, new| self.table.exchange(index, old, new).map(drop),
            );
            if let Ok((released, _)) = outcome {
                return released;
            }
            // Re-tagged under us: look again.
        }
    }
}

/// A release as a CAS-loop step: whether it counted, and the word to store.
fn release_step(release: Release) -> (bool, Option<u64>) {
    match release {
        Release::Released(next) => (true, Some(next)),
        Release::Reclaimed => (false, None),
    }
}

impl<K: ?Sized, C> fmt::Debug for KeyedInFlight<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedInFlight")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

/// What a permit gives its units back to: the table it shares ([`KeyedInFlight::try_acquire`]) or
/// borrows ([`KeyedInFlight::try_acquire_scoped`]).
enum Owner<'a> {
    Shared(Arc<dyn GiveBack>),
    Borrowed(&'a dyn GiveBack),
}

/// Units a key holds in a [`KeyedInFlight`], given back exactly once, when this is dropped.
/// `KeyPermit<'static>` shares the table ([`KeyedInFlight::try_acquire`]); a shorter lifetime
/// borrows it ([`KeyedInFlight::try_acquire_scoped`]).
#[must_use = "dropping a permit releases it at once"]
pub struct KeyPermit<'a> {
    owner: Owner<'a>,
    place: Place,
    landed: Landed,
    taken_at: Nanos,
    cost: u64,
    decision: Decision,
}

impl KeyPermit<'_> {
    /// The admission (`remaining`: units the key may still take).
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// When it was taken (nanoseconds on the table's clock).
    pub fn taken_at(&self) -> Nanos {
        self.taken_at
    }

    /// Units held.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// Whether the key's stripe-shared overflow count holds it (the key's window was full of keys
    /// with permits out when it was taken).
    pub fn in_overflow(&self) -> bool {
        self.landed == Landed::Overflow
    }
}

impl Drop for KeyPermit<'_> {
    fn drop(&mut self) {
        let owner: &dyn GiveBack = match &self.owner {
            Owner::Shared(owner) => owner.as_ref(),
            Owner::Borrowed(owner) => *owner,
        };
        owner.release(self.place, self.landed, self.taken_at, self.cost);
    }
}

impl fmt::Debug for KeyPermit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyPermit")
            .field("taken_at", &self.taken_at)
            .field("cost", &self.cost)
            .field("in_overflow", &self.in_overflow())
            .finish_non_exhaustive()
    }
}

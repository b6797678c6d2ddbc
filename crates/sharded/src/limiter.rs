//! [`KeyedLimiter`]: the table type, its constructors and accessors, and the public per-key calls.
//! The slot operations and lock-free path are in `table.rs`, inserts in `insert.rs`, overrides in
//! `overrides.rs`, the options in `builder.rs`, streams of keys in `batch.rs`.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;

use crossbeam_utils::CachePadded;
use tollgate_core::{
    Algorithm, AtomicState, CheckError, Clock, Decision, MonotonicClock, Nanos, Quota,
};

use crate::defaults::Defaults;
use crate::error::KeyedError;
use crate::headroom::Plain;
use crate::hot_table::HotTable;
use crate::ledger::OverflowLedger;
use crate::slot::{SlotWord, TIER_MASK};
use crate::sync::{AtomicPair, AtomicUsize, Mutex, OnceLock, Ordering, lock};

/// The most stripes a table may have.
pub const MAX_STRIPES: usize = 1 << 16;
/// The smallest probe window (slots scanned from a key's home slot).
pub const MIN_WINDOW: usize = 4;
/// The largest probe window.
pub const MAX_WINDOW: usize = 64;
/// The default probe window: 32 slots of 16 B, 512 B (8 cache lines). Lookups of present keys stop at
/// the key, misses at the first empty slot, so at 70 % load a lookup touches one or two lines.
pub const DEFAULT_WINDOW: usize = 32;
/// How many distinct override quotas (tiers) one limiter can hold: tiers 1..=14 (tiers 0 and 15
/// mark the default quota's generations, see [`KeyedLimiter::set_default`]).
pub const MAX_OVERRIDE_QUOTAS: usize = TIER_MASK as usize - 1;

/// One stripe's shared, rarely written data; each sits on its own cache line(s).
pub(crate) struct Stripe {
    /// Serialises inserts (and override changes) in this stripe's slots, and guards the ledger of
    /// keys the overflow state decided. Lookups never take it.
    pub(crate) insert: Mutex<OverflowLedger>,
    /// Slots of this stripe that hold a key (eviction re-tags a slot, so this only grows).
    pub(crate) len: AtomicUsize,
    /// The shared state that decides new keys when their window has no room (the full-table policy).
    pub(crate) overflow: AtomicState,
    /// Decisions made by `overflow` (monitoring).
    pub(crate) overflowed: AtomicUsize,
}

/// A rate limiter per key, over a fixed-size, preallocated, striped open-addressing table.
///
/// * **Memory** is fixed at construction: `capacity × 10/7` slots of 16 bytes (≈ 22.9 B per key of
///   capacity) plus one cache-padded header per stripe; the table never grows.
/// * **Known keys** are decided without a lock or allocation: hash, scan the key's probe window for its
///   tag, then one 128-bit compare-and-swap of the (tag, state) pair (none for a denial).
/// * **New keys** take their stripe's short critical section, which claims the window's first empty
///   slot or, when it has none, evicts a key whose state is [fresh](Algorithm::is_fresh)
///   (indistinguishable from a new key: eviction is invisible to its next caller). A live key is never
///   evicted, and an idle one only when its window is full.
/// * **Full windows**: a new key whose window holds only live keys is decided by its stripe's shared
///   overflow state under the default quota (strict, bounded, never a fresh burst per key: a key that
///   overflowed starts from that state when it is inserted later).
///
/// See the [crate docs](crate) for the design, collision probability and memory-ordering argument.
///
/// ```
/// use tollgate_core::{Gcra, ManualClock, Quota};
/// use tollgate_sharded::KeyedLimiter;
///
/// let clock = ManualClock::new();
/// let limiter = KeyedLimiter::<str, Gcra, _>::builder(Quota::per_second(2)?, 1_000)
///     .clock(clock.clone())
///     .build()?;
/// assert!(limiter.check_key("alice", 1)?.is_allowed());
/// assert!(limiter.check_key("alice", 1)?.is_allowed());
/// assert!(!limiter.check_key("alice", 1)?.is_allowed());
/// assert!(limiter.check_key("bob", 1)?.is_allowed()); // keys are independent
/// assert_eq!(limiter.len(), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct KeyedLimiter<K: ?Sized, A, C = MonotonicClock> {
    pub(crate) slots: Box<[AtomicPair]>,
    pub(crate) stripes: Box<[CachePadded<Stripe>]>,
    /// `64 - log2(stripes)`, or 64 with one stripe (then the stripe index is always 0).
    pub(crate) stripe_shift: u32,
    pub(crate) slots_per_stripe: usize,
    pub(crate) window: usize,
    /// The default quota's generations (tiers 0 and 15).
    pub(crate) defaults: Defaults<A>,
    /// Serialises changes of the default quota.
    pub(crate) requota: Mutex<()>,
    /// Override quotas; tier `t` (1..=14) uses `tiers[t - 1]`, set once and never changed.
    pub(crate) tiers: Box<[OnceLock<A>]>,
    pub(crate) tiers_lock: Mutex<()>,
    pub(crate) hasher: foldhash::quality::FixedState,
    pub(crate) capacity: usize,
    pub(crate) clock: C,
    /// Hot-key promotion (`hot.rs`); `None` unless enabled (GCRA tables only).
    pub(crate) hot: Option<Box<HotTable>>,
    pub(crate) _key: PhantomData<fn(&K)>,
}

/// Where a key lives: its stripe, its tag's hash part, and its home slot (absolute index).
#[derive(Clone, Copy, Default)]
pub(crate) struct Place {
    pub(crate) stripe: usize,
    pub(crate) hash_part: u64,
    /// First slot of the stripe.
    pub(crate) base: usize,
    /// Home offset within the stripe.
    pub(crate) home: usize,
}

/// A slot's absolute index and the content read from it.
pub(crate) type SlotAt = (usize, SlotWord);

/// What the lock-free scan of a window found.
pub(crate) enum Scan {
    /// The key, at this absolute slot index, with this content.
    Found(usize, SlotWord),
    /// Not found; whether the window has room (an empty or fresh unpinned slot).
    Missing { room: bool },
}

impl<K: ?Sized, A: Algorithm> KeyedLimiter<K, A, MonotonicClock> {
    /// A limiter for up to `capacity` keys under `quota`, on the default clock, with a random seed.
    ///
    /// # Errors
    /// [`KeyedError::Quota`] when `A` cannot represent the quota, [`KeyedError::ZeroCapacity`],
    /// [`KeyedError::CapacityTooLarge`].
    pub fn new(quota: Quota, capacity: usize) -> Result<Self, KeyedError> {
        Self::builder(quota, capacity).build()
    }
}

impl<K: ?Sized, A: Algorithm, C: Clock> KeyedLimiter<K, A, C> {
    /// A limiter reading `clock`; otherwise as [`new`](KeyedLimiter::new).
    ///
    /// # Errors
    /// As [`new`](KeyedLimiter::new).
    pub fn with_clock(quota: Quota, capacity: usize, clock: C) -> Result<Self, KeyedError> {
        Self::builder_with_clock(quota, capacity, clock).build()
    }

    /// The default quota's algorithm (the current one, after [`set_default`](Self::set_default)).
    pub fn algorithm(&self) -> &A {
        self.defaults.current()
    }

    /// The default quota.
    pub fn quota(&self) -> &Quota {
        self.algorithm().quota()
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The clock's current reading.
    #[inline]
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// The configured capacity in keys: the table is sized to hold this many keys at ≤ 70 % load.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The number of slots (≥ `capacity × 10/7`): the hard upper bound on [`len`](Self::len).
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// The number of stripes.
    pub fn stripes(&self) -> usize {
        self.stripes.len()
    }

    /// The probe window in slots.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Slots holding a key: live keys plus idle ones not yet reclaimed (eviction happens when a new
    /// key needs the slot, so an idle key is counted until then). Never above [`slots`](Self::slots).
    pub fn len(&self) -> usize {
        self.stripes
            .iter()
            // Relaxed: a monitoring figure; it publishes nothing and may lag concurrent inserts.
            .map(|stripe| stripe.len.load(Ordering::Relaxed))
            .sum()
    }

    /// How many decisions were made by the stripes' shared overflow states (new keys whose probe
    /// window had no room): a non-zero, growing figure means the table is too small for its live keys.
    pub fn overflow_decisions(&self) -> usize {
        self.stripes
            .iter()
            // Relaxed: a monitoring figure; it publishes nothing.
            .map(|stripe| stripe.overflowed.load(Ordering::Relaxed))
            .sum()
    }

    /// Whether no key was ever inserted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes this limiter owns: the slot table, the stripe headers, the override quota slots and the
    /// struct itself. Fixed at construction.
    pub fn memory_bytes(&self) -> usize {
        size_of_val::<[AtomicPair]>(&self.slots)
            + size_of_val::<[CachePadded<Stripe>]>(&self.stripes)
            + size_of_val::<[OnceLock<A>]>(&self.tiers)
            + size_of::<Self>()
    }

    /// Decides `cost` units for `key` now.
    ///
    /// # Errors
    /// [`CheckError::CostExceedsCapacity`] when `cost` exceeds the key's quota capacity; nothing is
    /// recorded.
    #[inline]
    pub fn check_key<Q>(&self, key: &Q, cost: u64) -> Result<Decision, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let place = self.place(self.hasher.hash_one(key));
        // Issue the load of the key's home slot (in a large table, usually a cache miss) before
        // reading the clock, so the clock read overlaps the miss instead of adding to it.
        let home = self.load(place.base + place.home);
        self.decide(place, Some(home), self.clock.now(), cost, Plain)
    }

    /// Starts fetching `key`'s slot into the CPU cache and returns at once: a hint for callers that
    /// know a key some time before deciding it (say, right after parsing a request). In a large table
    /// a decision's cost is mostly one memory round trip; prefetched a few keys ahead, those round
    /// trips overlap. [`check_keys`](Self::check_keys) does this for a stream of keys. Changes no
    /// state; a no-op except on x86_64.
    ///
    /// ```
    /// use tollgate_core::{Gcra, Quota};
    /// use tollgate_sharded::KeyedLimiter;
    ///
    /// let limiter = KeyedLimiter::<u64, Gcra>::new(Quota::per_second(10)?, 1_000)?;
    /// limiter.prefetch_key(&42);
    /// // ... other work for this request ...
    /// assert!(limiter.check_key(&42, 1)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn prefetch_key<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.locate(key);
    }

    /// The key's place, with its home slot's line already requested from memory.
    #[inline]
    pub(crate) fn locate<Q>(&self, key: &Q) -> Place
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let place = self.place(self.hasher.hash_one(key));
        crate::sync::prefetch(&self.slots[place.base + place.home]);
        place
    }

    /// Decides `cost` units for `key` at `now` (nanoseconds on this limiter's clock).
    ///
    /// # Errors
    /// As [`check_key`](Self::check_key).
    #[inline]
    pub fn check_key_at<Q>(&self, key: &Q, now: Nanos, cost: u64) -> Result<Decision, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.decide(
            self.place(self.hasher.hash_one(key)),
            None,
            now,
            cost,
            Plain,
        )
    }

    /// [`check_key_at`](Self::check_key_at) keeping `reserve` units of headroom: admits only if at
    /// least `reserve` more units would still fit in the key's quota afterwards
    /// ([`Algorithm::decide_reserving`]), in the same compare-and-swap loop; a denial writes
    /// nothing. A priority class below a reserved share decides this way.
    ///
    /// ```
    /// use tollgate_core::{Gcra, Quota};
    /// use tollgate_sharded::KeyedLimiter;
    /// let limiter = KeyedLimiter::<str, Gcra>::new(Quota::per_second(10)?, 100)?;
    /// let now = limiter.now();
    /// let batch = (0..20).filter(|_| limiter.check_key_reserving_at("k", now, 1, 3).unwrap().is_allowed());
    /// assert_eq!(batch.count(), 7); // 3 of 10 kept back
    /// assert!(limiter.check_key_at("k", now, 3)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`check_key`](Self::check_key).
    #[inline]
    pub fn check_key_reserving_at<Q>(
        &self,
        key: &Q,
        now: Nanos,
        cost: u64,
        reserve: u64,
    ) -> Result<Decision, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.decide(
            self.place(self.hasher.hash_one(key)),
            None,
            now,
            cost,
            reserve,
        )
    }

    /// What [`check_key`](Self::check_key) would decide now, without recording anything.
    ///
    /// # Errors
    /// As [`check_key`](Self::check_key).
    pub fn peek_key<Q>(&self, key: &Q, cost: u64) -> Result<Decision, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.peek_key_at(key, self.clock.now(), cost)
    }

    /// What [`check_key_at`](Self::check_key_at) would decide, without recording anything.
    ///
    /// # Errors
    /// As [`check_key`](Self::check_key).
    pub fn peek_key_at<Q>(&self, key: &Q, now: Nanos, cost: u64) -> Result<Decision, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let place = self.place(self.hasher.hash_one(key));
        match self.scan(place, None, Some(now)) {
            Scan::Found(index, found) => {
                if let Some(promoted) = self.promoted(index, found) {
                    return tollgate_core::Limiter::peek_at(&promoted.limiter, now, cost);
                }
                let (algorithm, found) = self.resolve(found);
                algorithm.decide(found.state, now, cost).map(|t| t.decision)
            }
            Scan::Missing { room: true } => {
                let stripe = &self.stripes[place.stripe];
                let state =
                    self.new_key_state(stripe, &mut lock(&stripe.insert), place.hash_part, now);
                self.algorithm()
                    .decide(state, now, cost)
                    .map(|t| t.decision)
            }
            Scan::Missing { room: false } => {
                self.stripes[place.stripe]
                    .overflow
                    .peek(self.algorithm(), now, cost)
            }
        }
    }
}

impl<K: ?Sized, A: Algorithm + fmt::Debug, C> fmt::Debug for KeyedLimiter<K, A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("algorithm", self.defaults.current())
            .field("capacity", &self.capacity)
            .field("slots", &self.slots.len())
            .field("stripes", &self.stripes.len())
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

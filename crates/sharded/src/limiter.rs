//! [`KeyedLimiter`]: the fixed-size striped table and its decision path.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;

use crossbeam_utils::CachePadded;
use tollgate_core::{
    Algorithm, AtomicState, CheckError, Clock, Decision, MonotonicClock, Nanos, Quota,
};

use crate::batch::CheckKeys;
use crate::error::KeyedError;
use crate::slot::{SlotWord, TIER_MASK, tag_hash};
use crate::sync::{AtomicPair, AtomicUsize, Mutex, OnceLock, Ordering, lock};

/// Slots allocated per key of capacity, as a fraction: the table runs at most 70 % full at its
/// configured capacity (16 B / 0.7 ≈ 22.9 B per key).
const SLOTS_PER_KEY_NUM: usize = 10;
const SLOTS_PER_KEY_DEN: usize = 7;

/// The most stripes a table may have.
pub const MAX_STRIPES: usize = 1 << 16;
/// The smallest probe window (slots scanned from a key's home slot).
pub const MIN_WINDOW: usize = 4;
/// The largest probe window.
pub const MAX_WINDOW: usize = 64;
/// The default probe window: 32 slots of 16 B, 512 B (8 cache lines). Lookups of present keys stop at
/// the key, misses at the first empty slot, so at 70 % load a lookup touches one or two lines.
pub const DEFAULT_WINDOW: usize = 32;
/// How many distinct override quotas (tiers) one limiter can hold.
pub const MAX_OVERRIDE_QUOTAS: usize = TIER_MASK as usize;

/// One stripe's shared, rarely written data; each sits on its own cache line(s).
struct Stripe {
    /// Serialises inserts (and override changes) in this stripe's slots. Lookups never take it.
    insert: Mutex<()>,
    /// Slots of this stripe that hold a key (eviction re-tags a slot, so this only grows).
    len: AtomicUsize,
    /// The shared state that decides new keys when their window has no room (the full-table policy).
    overflow: AtomicState,
    /// Decisions made by `overflow` (monitoring).
    overflowed: AtomicUsize,
}

/// Options for a [`KeyedLimiter`], from [`KeyedLimiter::builder`].
pub struct Builder<K: ?Sized, A, C = MonotonicClock> {
    quota: Quota,
    capacity: usize,
    clock: C,
    seed: Option<u64>,
    stripes: Option<usize>,
    window: usize,
    _key: PhantomData<fn(&K)>,
    _algorithm: PhantomData<A>,
}

impl<K: ?Sized, A: Algorithm, C: Clock> Builder<K, A, C> {
    /// Uses `clock` instead of the default [`MonotonicClock`].
    pub fn clock<C2: Clock>(self, clock: C2) -> Builder<K, A, C2> {
        Builder {
            quota: self.quota,
            capacity: self.capacity,
            clock,
            seed: self.seed,
            stripes: self.stripes,
            window: self.window,
            _key: PhantomData,
            _algorithm: PhantomData,
        }
    }

    /// Fixes the hash seed (default: random per limiter). A fixed seed makes slot placement
    /// reproducible, for tests; in production it lets anyone who learns it aim keys at one window.
    pub fn hasher_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The number of stripes: a power of two, at most [`MAX_STRIPES`]. Default: the smallest power of
    /// two ≥ 4 × available parallelism, reduced while stripes would hold fewer than 4 windows.
    pub fn stripes(mut self, stripes: usize) -> Self {
        self.stripes = Some(stripes);
        self
    }

    /// The probe window in slots ([`MIN_WINDOW`]..=[`MAX_WINDOW`], default [`DEFAULT_WINDOW`]).
    pub fn window(mut self, window: usize) -> Self {
        self.window = window;
        self
    }

    /// Builds the limiter, allocating the whole table now.
    ///
    /// # Errors
    /// [`KeyedError`] for an invalid quota, capacity, stripe count or window.
    pub fn build(self) -> Result<KeyedLimiter<K, A, C>, KeyedError> {
        KeyedLimiter::from_builder(self)
    }
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
///   overflow state under the default quota (strict, bounded, never a fresh burst per key).
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
    slots: Box<[AtomicPair]>,
    stripes: Box<[CachePadded<Stripe>]>,
    /// `64 - log2(stripes)`, or 64 with one stripe (then the stripe index is always 0).
    stripe_shift: u32,
    slots_per_stripe: usize,
    window: usize,
    algorithm: A,
    /// Override quotas; tier `t` (1..=15) uses `tiers[t - 1]`, set once and never changed.
    tiers: Box<[OnceLock<A>]>,
    tiers_lock: Mutex<()>,
    hasher: foldhash::quality::FixedState,
    capacity: usize,
    clock: C,
    _key: PhantomData<fn(&K)>,
}

/// Where a key lives: its stripe, its tag's hash part, and its home slot (absolute index).
#[derive(Clone, Copy, Default)]
pub(crate) struct Place {
    stripe: usize,
    hash_part: u64,
    /// First slot of the stripe.
    base: usize,
    /// Home offset within the stripe.
    home: usize,
}

/// A slot's absolute index and the content read from it.
type SlotAt = (usize, SlotWord);

/// What the lock-free scan of a window found.
enum Scan {
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

    /// Options beyond [`new`](Self::new): clock, seed, stripes, window.
    pub fn builder(quota: Quota, capacity: usize) -> Builder<K, A, MonotonicClock> {
        Builder {
            quota,
            capacity,
            clock: MonotonicClock::new(),
            seed: None,
            stripes: None,
            window: DEFAULT_WINDOW,
            _key: PhantomData,
            _algorithm: PhantomData,
        }
    }
}

impl<K: ?Sized, A: Algorithm, C: Clock> KeyedLimiter<K, A, C> {
    /// Options as [`builder`](KeyedLimiter::builder), reading `clock` (no default clock is created).
    pub fn builder_with_clock(quota: Quota, capacity: usize, clock: C) -> Builder<K, A, C> {
        Builder {
            quota,
            capacity,
            clock,
            seed: None,
            stripes: None,
            window: DEFAULT_WINDOW,
            _key: PhantomData,
            _algorithm: PhantomData,
        }
    }

    /// A limiter reading `clock`; otherwise as [`new`](KeyedLimiter::new).
    ///
    /// # Errors
    /// As [`new`](KeyedLimiter::new).
    pub fn with_clock(quota: Quota, capacity: usize, clock: C) -> Result<Self, KeyedError> {
        Self::builder_with_clock(quota, capacity, clock).build()
    }

    fn from_builder(builder: Builder<K, A, C>) -> Result<Self, KeyedError> {
        let algorithm = A::from_quota(builder.quota)?;
        let capacity = builder.capacity;
        if capacity == 0 {
            return Err(KeyedError::ZeroCapacity);
        }
        let window = builder.window;
        if !(MIN_WINDOW..=MAX_WINDOW).contains(&window) {
            return Err(KeyedError::InvalidWindow { window });
        }
        let too_large = KeyedError::CapacityTooLarge { capacity };
        let wanted_slots = capacity
            .checked_mul(SLOTS_PER_KEY_NUM)
            .ok_or(too_large)?
            .div_ceil(SLOTS_PER_KEY_DEN);
        let stripes = match builder.stripes {
            Some(stripes) => {
                if stripes == 0 || !stripes.is_power_of_two() || stripes > MAX_STRIPES {
                    return Err(KeyedError::InvalidStripes { stripes });
                }
                stripes
            }
            None => default_stripes(wanted_slots, window),
        };
        // Every stripe holds at least one window, so a window never wraps onto itself.
        let slots_per_stripe = wanted_slots.div_ceil(stripes).max(window);
        let total = slots_per_stripe.checked_mul(stripes).ok_or(too_large)?;
        if total
            .checked_mul(size_of::<AtomicPair>())
            .is_none_or(|bytes| bytes > isize::MAX as usize)
        {
            return Err(too_large);
        }
        let slots = AtomicPair::zeroed_slice(total);
        let stripe_list: Box<[CachePadded<Stripe>]> = (0..stripes)
            .map(|_| {
                CachePadded::new(Stripe {
                    insert: Mutex::new(()),
                    len: AtomicUsize::new(0),
                    overflow: AtomicState::new(0),
                    overflowed: AtomicUsize::new(0),
                })
            })
            .collect();
        let seed = builder.seed.unwrap_or_else(random_seed);
        Ok(KeyedLimiter {
            slots,
            stripes: stripe_list,
            stripe_shift: 64 - stripes.trailing_zeros(),
            slots_per_stripe,
            window,
            algorithm,
            tiers: (0..MAX_OVERRIDE_QUOTAS).map(|_| OnceLock::new()).collect(),
            tiers_lock: Mutex::new(()),
            hasher: foldhash::quality::FixedState::with_seed(seed),
            capacity,
            clock: builder.clock,
            _key: PhantomData,
        })
    }

    /// The default quota's algorithm.
    pub fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The default quota.
    pub fn quota(&self) -> &Quota {
        self.algorithm.quota()
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
        self.decide(place, Some(home), self.clock.now(), cost)
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

    /// Decides `cost` units for each key of `keys`, in order, fetching each key's slot a few keys
    /// ahead of its decision so that the memory latency of consecutive lookups overlaps (one
    /// decision in a table larger than the CPU cache is mostly one memory round trip). Each item is
    /// exactly what [`check_key`](Self::check_key) would return for that key at the moment the item
    /// is produced (the clock is read per decision). Lazy, allocation-free: up to
    /// [`CHECK_KEYS_LOOKAHEAD`](crate::CHECK_KEYS_LOOKAHEAD) keys are hashed ahead of the one decided.
    ///
    /// ```
    /// use tollgate_core::{Gcra, ManualClock, Quota};
    /// use tollgate_sharded::KeyedLimiter;
    ///
    /// let limiter = KeyedLimiter::<str, Gcra, _>::with_clock(Quota::per_second(1)?, 1_000, ManualClock::new())?;
    /// let allowed: Vec<bool> = limiter
    ///     .check_keys(["alice", "bob", "alice"], 1)
    ///     .map(|decision| decision.is_ok_and(|d| d.is_allowed()))
    ///     .collect();
    /// assert_eq!(allowed, [true, true, false]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_keys<'q, Q, I>(
        &self,
        keys: I,
        cost: u64,
    ) -> CheckKeys<'_, 'q, K, Q, A, C, I::IntoIter>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized + 'q,
        I: IntoIterator<Item = &'q Q>,
    {
        CheckKeys::new(self, keys.into_iter(), cost)
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
        self.decide(self.place(self.hasher.hash_one(key)), None, now, cost)
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
            Scan::Found(_, found) => self
                .algorithm_for(found.tier())
                .decide(found.state, now, cost)
                .map(|t| t.decision),
            Scan::Missing { room: true } => self.algorithm.decide(0, now, cost).map(|t| t.decision),
            Scan::Missing { room: false } => {
                self.stripes[place.stripe]
                    .overflow
                    .peek(&self.algorithm, now, cost)
            }
        }
    }

    /// Gives `key` its own `quota` instead of the default (e.g. a premium API key), keeping its
    /// current state word. The key's slot is pinned: never evicted while it has an override.
    ///
    /// Overrides live in the table itself: a 4-bit tier in the slot's tag indexes one of at most
    /// [`MAX_OVERRIDE_QUOTAS`] override quotas. Keys sharing a quota share its tier.
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
        let place = self.place(self.hasher.hash_one(key));
        let _guard = lock(&self.stripes[place.stripe].insert);
        let now = self.clock.now();
        loop {
            let (found, candidate) = self.scan_locked(place, now);
            let (index, old, new) = match (found, candidate) {
                (Some((index, old)), _) => (index, old, old.with_tier(tier)),
                (None, Some((index, old))) => (index, old, SlotWord::new(place.hash_part, tier, 0)),
                (None, None) => return Err(KeyedError::WindowFull),
            };
            if self.replace(index, old, new) {
                if old.is_empty() {
                    self.count_insert(place.stripe);
                }
                return Ok(());
            }
        }
    }

    /// Returns `key` to the default quota (its state word is kept) and unpins its slot. Returns whether
    /// the key had an override.
    pub fn remove_override<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let place = self.place(self.hasher.hash_one(key));
        let _guard = lock(&self.stripes[place.stripe].insert);
        loop {
            let (found, _) = self.scan_locked(place, 0);
            let Some((index, old)) = found else {
                return false;
            };
            if old.tier() == 0 {
                return false;
            }
            if self.replace(index, old, old.with_tier(0)) {
                return true;
            }
        }
    }

    /// The quota `key` is limited by: its override, or the default.
    pub fn quota_for<Q>(&self, key: &Q) -> &Quota
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let place = self.place(self.hasher.hash_one(key));
        match self.scan(place, None, None) {
            Scan::Found(_, found) => self.algorithm_for(found.tier()).quota(),
            Scan::Missing { .. } => self.algorithm.quota(),
        }
    }

    // ---- internals -------------------------------------------------------------------------------

    #[inline]
    fn place(&self, hash: u64) -> Place {
        // Stripe from the top bits; home slot from the low 32 bits by multiply-shift (no division);
        // the tag keeps the high 60 bits. `checked_shr` gives stripe 0 when there is one stripe.
        let stripe = hash.checked_shr(self.stripe_shift).unwrap_or(0) as usize;
        let home = (((hash & 0xFFFF_FFFF) * self.slots_per_stripe as u64) >> 32) as usize;
        Place {
            stripe,
            hash_part: tag_hash(hash),
            base: stripe * self.slots_per_stripe,
            home,
        }
    }

    /// Absolute slot indices of `place`'s window, in probe order (wrapping within the stripe).
    #[inline]
    fn window_indices(&self, place: Place) -> impl Iterator<Item = usize> + use<K, A, C> {
        let (base, home, per) = (place.base, place.home, self.slots_per_stripe);
        (0..self.window).map(move |i| {
            let offset = home + i;
            base + if offset >= per { offset - per } else { offset }
        })
    }

    #[inline]
    fn load(&self, index: usize) -> SlotWord {
        // Acquire: pairs with the Release exchange that wrote a tier into a tag (`replace`, from
        // set_override), so a reader that sees tier t also sees `tiers[t - 1]` initialised. Slots
        // publish nothing else. (loom-tests/tests/sharded.rs: `a_lookup_racing_set_override_*`.)
        SlotWord::unpack(self.slots[index].load(Ordering::Acquire))
    }

    /// One exchange of a whole slot, for the writes made under the stripe lock (inserts, evictions,
    /// tier changes); whether it took.
    #[inline]
    fn replace(&self, index: usize, old: SlotWord, new: SlotWord) -> bool {
        // Release on success: publishes a newly set tier's quota (see `load`); the first write of a
        // tier into a tag is always this one. Failure Relaxed: the word found is dropped (callers
        // rescan with `load`).
        self.slots[index]
            .compare_exchange(old.pack(), new.pack(), Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// The admission exchange (`apply`): on failure returns the word found.
    #[inline]
    fn exchange(&self, index: usize, old: SlotWord, new: SlotWord) -> Result<SlotWord, SlotWord> {
        // Success Relaxed: an admission only changes the state half and publishes nothing; being a
        // read-modify-write it continues the release sequence of the `replace` that wrote the tier,
        // so a reader of our word still synchronises with that `replace`. (Nor is an Acquire needed:
        // `old`, carrying the tier we decided with, was read with Acquire.) Failure Acquire: the word
        // we get back may carry a tier we then read (see `load`). On x86_64 every 128-bit access is
        // a locked instruction or an aligned vector load whatever the ordering.
        self.slots[index]
            .compare_exchange(old.pack(), new.pack(), Ordering::Relaxed, Ordering::Acquire)
            .map(SlotWord::unpack)
            .map_err(SlotWord::unpack)
    }

    #[inline]
    fn algorithm_for(&self, tier: u8) -> &A {
        match tier {
            0 => &self.algorithm,
            // A set tier is always initialised (see `load`); the default is only a non-panicking
            // fallback that cannot be reached. The loom build panics there instead, so the models
            // check that claim (and the orderings it rests on).
            t => match self.tiers[usize::from(t) - 1].get() {
                Some(algorithm) => algorithm,
                None if cfg!(tollgate_loom) => {
                    panic!("tier {t} read before its quota was published")
                }
                None => &self.algorithm,
            },
        }
    }

    /// Lock-free scan: stops at the key or at the first empty slot (slots are claimed in probe order and
    /// never emptied, so a key is never stored past an empty slot).
    /// The decision path: find the key lock-free and apply, or insert it. `home` is the key's home
    /// slot if the caller already loaded it.
    // `always`: once check_keys became a further caller the compiler outlined it, and check_key at
    // 1 M keys ran 1.1–1.4× slower in interleaved A/B runs.
    #[inline(always)]
    pub(crate) fn decide(
        &self,
        place: Place,
        mut home: Option<SlotWord>,
        now: Nanos,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        loop {
            match self.scan(place, home.take(), None) {
                Scan::Found(index, found) => {
                    if let Some(result) = self.apply(index, found, now, cost) {
                        return result;
                    }
                    // The slot was re-tagged (the key was evicted) under us: look again.
                }
                Scan::Missing { .. } => return self.insert(place, now, cost),
            }
        }
    }

    /// `home`: the home slot's word if already loaded. `room` is only worked out when `room_at` is
    /// given (peeks); the decision path does not need it.
    #[inline]
    fn scan(&self, place: Place, mut home: Option<SlotWord>, room_at: Option<Nanos>) -> Scan {
        let mut room = false;
        for index in self.window_indices(place) {
            let word = home.take().unwrap_or_else(|| self.load(index));
            if word.is_empty() {
                return Scan::Missing { room: true };
            }
            if word.hash_part() == place.hash_part {
                return Scan::Found(index, word);
            }
            if let Some(now) = room_at {
                room = room || (word.tier() == 0 && self.algorithm.is_fresh(word.state, now));
            }
        }
        Scan::Missing { room }
    }

    /// Applies the key's algorithm to the slot with the pair CAS loop. `None`: the slot no longer
    /// holds the key (evicted under us); the caller rescans.
    #[inline]
    fn apply(
        &self,
        index: usize,
        mut current: SlotWord,
        now: Nanos,
        cost: u64,
    ) -> Option<Result<Decision, CheckError>> {
        let hash_part = current.hash_part();
        loop {
            let transition =
                match self
                    .algorithm_for(current.tier())
                    .decide(current.state, now, cost)
                {
                    Ok(transition) => transition,
                    Err(error) => return Some(Err(error)),
                };
            let Some(next) = transition.next.filter(|&next| next != current.state) else {
                return Some(Ok(transition.decision));
            };
            match self.exchange(index, current, current.with_state(next)) {
                Ok(_) => return Some(Ok(transition.decision)),
                // Same key (another admission, or a tier change): re-decide against what we found.
                Err(actual) if actual.hash_part() == hash_part => current = actual,
                Err(_) => return None,
            }
        }
    }

    /// Under the stripe lock: the key's slot if present, and the slot a new key may take: the first
    /// empty one, or when the window has none, the first holding an unpinned key fresh at `now`.
    /// Empty first, so idle keys stay resident (and are found lock-free when they come back) for as
    /// long as there is room: evicting them early only turns their next decision into an insert.
    fn scan_locked(&self, place: Place, now: Nanos) -> (Option<SlotAt>, Option<SlotAt>) {
        let mut candidate = None;
        for index in self.window_indices(place) {
            let word = self.load(index);
            if word.is_empty() {
                return (None, Some((index, word)));
            }
            if word.hash_part() == place.hash_part {
                return (Some((index, word)), None);
            }
            if candidate.is_none() && word.tier() == 0 && self.algorithm.is_fresh(word.state, now) {
                candidate = Some((index, word));
            }
        }
        (None, candidate)
    }

    /// A key the lock-free scan did not find: under the stripe lock, find it (a racing insert may have
    /// added it), or claim a slot for it, or decide it by the stripe's overflow state.
    #[cold]
    fn insert(&self, place: Place, now: Nanos, cost: u64) -> Result<Decision, CheckError> {
        let stripe = &self.stripes[place.stripe];
        let _guard = lock(&stripe.insert);
        loop {
            match self.scan_locked(place, now) {
                (Some((index, found)), _) => {
                    if let Some(result) = self.apply(index, found, now, cost) {
                        return result;
                    }
                    // Only inserts re-tag slots and we hold the stripe's lock: unreachable, but
                    // rescanning is correct anyway.
                }
                (None, Some((index, old))) => {
                    let transition = self.algorithm.decide(0, now, cost)?;
                    let Some(next) = transition.next else {
                        // A decision that writes nothing (cost 0) does not insert the key.
                        return Ok(transition.decision);
                    };
                    // Evicting a fresh key: this exchange fails if an admission on it landed after
                    // our load (its state is then no longer `old.state`), and we rescan.
                    if self.replace(index, old, SlotWord::new(place.hash_part, 0, next)) {
                        if old.is_empty() {
                            self.count_insert(place.stripe);
                        }
                        return Ok(transition.decision);
                    }
                }
                (None, None) => {
                    // Relaxed: a monitoring counter; publishes nothing.
                    stripe.overflowed.fetch_add(1, Ordering::Relaxed);
                    return stripe.overflow.apply(&self.algorithm, now, cost);
                }
            }
        }
    }

    fn count_insert(&self, stripe: usize) {
        // Relaxed: a monitoring counter, written under the stripe lock; publishes nothing.
        self.stripes[stripe].len.fetch_add(1, Ordering::Relaxed);
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

impl<K: ?Sized, A: Algorithm + fmt::Debug, C> fmt::Debug for KeyedLimiter<K, A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("algorithm", &self.algorithm)
            .field("capacity", &self.capacity)
            .field("slots", &self.slots.len())
            .field("stripes", &self.stripes.len())
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

/// Default stripe count: ≥ 4 stripes per thread of parallelism (so two threads rarely share a stripe
/// lock when inserting), fewer when stripes would hold under 4 windows.
fn default_stripes(slots: usize, window: usize) -> usize {
    let threads = std::thread::available_parallelism().map_or(4, usize::from);
    let mut stripes = (threads * 4).next_power_of_two().min(MAX_STRIPES);
    while stripes > 1 && slots / stripes < 4 * window {
        stripes /= 2;
    }
    stripes
}

/// A per-limiter random seed from std's randomly keyed SipHash (no extra dependency).
fn random_seed() -> u64 {
    std::hash::RandomState::new().hash_one(0x746f_6c6c_6761_7465_u64)
}

//! [`Builder`]: a keyed limiter's options, validated once and turned into its preallocated table.

use std::hash::BuildHasher;
use std::marker::PhantomData;

use crossbeam_utils::CachePadded;
use tollgate_core::{Algorithm, AtomicState, Clock, Gcra, MonotonicClock, Quota};

use crate::defaults::Defaults;
use crate::error::KeyedError;
use crate::hot_config::HotKeyConfig;
use crate::hot_table::HotTable;
use crate::ledger::OverflowLedger;
use crate::limiter::{
    DEFAULT_WINDOW, KeyedLimiter, MAX_OVERRIDE_QUOTAS, MAX_STRIPES, MAX_WINDOW, MIN_WINDOW, Stripe,
};
use crate::sync::{AtomicPair, AtomicUsize, Mutex, OnceLock};

/// Slots allocated per key of capacity, as a fraction: the table runs at most 70 % full at its
/// configured capacity (16 B / 0.7 ≈ 22.9 B per key).
const SLOTS_PER_KEY_NUM: usize = 10;
const SLOTS_PER_KEY_DEN: usize = 7;

/// Options for a [`KeyedLimiter`], from [`KeyedLimiter::builder`].
pub struct Builder<K: ?Sized, A, C = MonotonicClock> {
    quota: Quota,
    capacity: usize,
    clock: C,
    seed: Option<u64>,
    stripes: Option<usize>,
    window: usize,
    /// Hot-key promotion (`hot.rs`; set only on GCRA builders).
    hot: Option<HotKeyConfig>,
    _key: PhantomData<fn(&K)>,
    _algorithm: PhantomData<A>,
}

impl<K: ?Sized, A: Algorithm, C: Clock> Builder<K, A, C> {
    /// The defaults: random seed, default stripes and window. The one place a builder is written out.
    pub(crate) fn new(quota: Quota, capacity: usize, clock: C) -> Self {
        Builder {
            quota,
            capacity,
            clock,
            seed: None,
            stripes: None,
            window: DEFAULT_WINDOW,
            hot: None,
            _key: PhantomData,
            _algorithm: PhantomData,
        }
    }

    /// Uses `clock` instead of the default [`MonotonicClock`].
    pub fn clock<C2: Clock>(self, clock: C2) -> Builder<K, A, C2> {
        Builder {
            seed: self.seed,
            stripes: self.stripes,
            window: self.window,
            hot: self.hot,
            ..Builder::new(self.quota, self.capacity, clock)
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
    /// [`KeyedError`] for an invalid quota, capacity, stripe count or window;
    /// [`KeyedError::CapacityTooLarge`] also when the allocator cannot provide the table (the
    /// process does not abort).
    pub fn build(self) -> Result<KeyedLimiter<K, A, C>, KeyedError> {
        let algorithm = A::from_quota(self.quota)?;
        let capacity = self.capacity;
        if capacity == 0 {
            return Err(KeyedError::ZeroCapacity);
        }
        let window = self.window;
        if !(MIN_WINDOW..=MAX_WINDOW).contains(&window) {
            return Err(KeyedError::InvalidWindow { window });
        }
        let too_large = KeyedError::CapacityTooLarge { capacity };
        let wanted_slots = capacity
            .checked_mul(SLOTS_PER_KEY_NUM)
            .ok_or(too_large)?
            .div_ceil(SLOTS_PER_KEY_DEN);
        let stripes = match self.stripes {
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
        let slots = AtomicPair::zeroed_slice(total).ok_or(too_large)?;
        let stripe_list: Box<[CachePadded<Stripe>]> = (0..stripes)
            .map(|_| {
                CachePadded::new(Stripe {
                    insert: Mutex::new(OverflowLedger::new()),
                    len: AtomicUsize::new(0),
                    overflow: AtomicState::new(0),
                    overflowed: AtomicUsize::new(0),
                })
            })
            .collect();
        let seed = self.seed.unwrap_or_else(random_seed);
        Ok(KeyedLimiter {
            slots,
            stripes: stripe_list,
            stripe_shift: 64 - stripes.trailing_zeros(),
            slots_per_stripe,
            window,
            defaults: Defaults::new(algorithm),
            requota: Mutex::new(()),
            tiers: (0..MAX_OVERRIDE_QUOTAS).map(|_| OnceLock::new()).collect(),
            tiers_lock: Mutex::new(()),
            hasher: foldhash::quality::FixedState::with_seed(seed),
            capacity,
            clock: self.clock,
            hot: self.hot.map(|config| Box::new(HotTable::new(config))),
            _key: PhantomData,
        })
    }
}

impl<K: ?Sized, C> Builder<K, Gcra, C> {
    /// Promotes hot keys automatically (off by default): a key whose slot keeps losing its
    /// compare-and-swap is served by a leased striped limiter continuing its own GCRA timeline until
    /// it cools, never admitting more than the plain key would. GCRA only. See `hot.rs`'s module
    /// docs (in the repository) for the proof and what is not done yet.
    pub fn promote_hot_keys(mut self, config: HotKeyConfig) -> Self {
        self.hot = Some(config);
        self
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

// The constructors that start a builder live here, beside it, so the limiter's module does not
// name the builder's (no import circle between the two).
impl<K: ?Sized, A: Algorithm> KeyedLimiter<K, A, MonotonicClock> {
    /// Options beyond [`new`](Self::new): clock, seed, stripes, window.
    pub fn builder(quota: Quota, capacity: usize) -> Builder<K, A, MonotonicClock> {
        Builder::new(quota, capacity, MonotonicClock::new())
    }
}

impl<K: ?Sized, A: Algorithm, C: Clock> KeyedLimiter<K, A, C> {
    /// Options as [`builder`](KeyedLimiter::builder), reading `clock` (no default clock is created).
    pub fn builder_with_clock(quota: Quota, capacity: usize, clock: C) -> Builder<K, A, C> {
        Builder::new(quota, capacity, clock)
    }
}

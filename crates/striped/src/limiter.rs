//! [`StripedLimiter`]: the stripes, the fast path and the lease refill.

use std::fmt;

use crossbeam_utils::CachePadded;
use tollgate_core::algorithm::Algorithm;
use tollgate_core::algorithm::gcra::Timeline;
use tollgate_core::{
    AtomicState, CheckError, Clock, Decision, Gcra, Limiter, MonotonicClock, Nanos, Quota,
    QuotaError,
};

use crate::grant::{Grant, alive_units, grant};
use crate::lease::LeaseWord;
use crate::sync::{AtomicBool, AtomicU64, Ordering, thread_ordinal};

/// The most stripes a limiter may have.
pub const MAX_STRIPES: usize = 1 << 12;

/// A lease is replaced sooner than this after it was taken → the stripe is "refilling often" and an
/// adaptive lease doubles.
const REFILL_TARGET_NANOS: Nanos = 20_000;

/// Refills in a row by one stripe with nobody else taking from the shared word in between, after
/// which the limiter returns to the alone path (crate docs, "One thread alone").
const ALONE_AFTER: u64 = 4;

/// Where an admission's units came from, so that [`StripedLimiter::refund`] can give them back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LeaseReceipt {
    /// Nothing was taken (a denial, or a cost of 0).
    #[default]
    Nothing,
    /// From stripe `stripe`'s lease of generation `generation`.
    Lease {
        /// The stripe index.
        stripe: usize,
        /// The lease's generation (see [`LeaseWord`]).
        generation: u64,
    },
    /// From the shared state directly, as the segment ending at `end`.
    Shared {
        /// The end of the granted segment on the shared timeline.
        end: Nanos,
    },
}

/// How big each stripe's lease is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseSize {
    /// Starts at 1 unit; doubles while the stripe replaces its lease within 20 µs of taking it (used
    /// up, or expired before the next request), halves when an older lease expires with none of its
    /// units used; never above `max` (nor the caps described on [`StripedConfig`]).
    Adaptive {
        /// The largest lease, in units.
        max: u64,
    },
    /// Always this many units (capped as described on [`StripedConfig`]).
    Fixed(u64),
}

/// How a [`StripedLimiter`] is laid out. `Default`: one stripe per available core (rounded up to a
/// power of two) and an adaptive lease of at most `burst / (4 × stripes)` units, at most 65 536.
///
/// Every lease size is also capped by `burst / stripes` (so all leases together never hold more than
/// one burst) and by [`LeaseWord::UNITS_MASK`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StripedConfig {
    /// Number of stripes (rounded up to a power of two); `None`: `available_parallelism`.
    pub stripes: Option<usize>,
    /// Lease size; `None`: adaptive, capped at `burst / (4 × stripes)` and 65 536.
    pub lease: Option<LeaseSize>,
    /// Never take the alone path (see [`StripedLimiter`]'s crate docs, "One thread alone"): every
    /// decision goes through the calling thread's stripe. `false` (the default): a thread that finds
    /// the limiter uncontended decides on the shared word directly, as plain GCRA.
    pub always_lease: bool,
}

impl StripedConfig {
    /// This configuration with `stripes` stripes (rounded up to a power of two).
    pub fn stripes(mut self, stripes: usize) -> Self {
        self.stripes = Some(stripes);
        self
    }

    /// This configuration with lease size `lease`.
    pub fn lease(mut self, lease: LeaseSize) -> Self {
        self.lease = Some(lease);
        self
    }

    /// This configuration with the alone path off (`true`) or on (`false`, the default).
    pub fn always_lease(mut self, always: bool) -> Self {
        self.always_lease = always;
        self
    }
}

/// Why a [`StripedLimiter`] could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StripedError {
    /// The quota cannot be represented by GCRA.
    Quota(QuotaError),
    /// Zero stripes, or more than [`MAX_STRIPES`].
    Stripes(usize),
    /// A lease size of zero units.
    ZeroLease,
}

impl fmt::Display for StripedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StripedError::Quota(error) => write!(f, "invalid quota: {error}"),
            StripedError::Stripes(n) => {
                write!(f, "{n} stripes: a striped limiter needs 1 to {MAX_STRIPES}")
            }
            StripedError::ZeroLease => f.write_str("a lease must hold at least one unit"),
        }
    }
}

impl std::error::Error for StripedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StripedError::Quota(error) => Some(error),
            _ => None,
        }
    }
}

impl From<QuotaError> for StripedError {
    fn from(error: QuotaError) -> Self {
        StripedError::Quota(error)
    }
}

/// One stripe: its lease word and the lease's bookkeeping, alone on its cache line(s).
///
/// Only `word` is written outside the lock; every other field is written by the thread holding the
/// stripe's lock (see [`LeaseWord`]) before it publishes the unlocked word with `Release`.
#[derive(Debug)]
struct Stripe {
    /// The packed [`LeaseWord`].
    word: AtomicU64,
    /// End of the current lease's segment on the shared timeline (ns).
    end: AtomicU64,
    /// Current lease size in units (adaptive).
    size: AtomicU64,
    /// When the current lease was taken.
    taken_at: AtomicU64,
    /// Units the current lease held when installed.
    installed: AtomicU64,
    /// The shared TAT right after the current lease was taken (for the approximate `reset_after`).
    tat_seen: AtomicU64,
    /// Units the shared state had free right after the current lease was taken (for the approximate
    /// `remaining`).
    free_seen: AtomicU64,
    /// Units that expired unused or could not be given back (diagnostics; monotone).
    wasted: AtomicU64,
    /// Refills in a row that found the shared TAT at this stripe's previous lease end (nobody else
    /// took from the shared word in between); at [`ALONE_AFTER`] the limiter takes the alone path.
    alone_streak: AtomicU64,
}

impl Stripe {
    fn new(size: u64) -> Self {
        Stripe {
            word: AtomicU64::new(LeaseWord::new(0, 0).bits()),
            end: AtomicU64::new(0),
            size: AtomicU64::new(size),
            taken_at: AtomicU64::new(0),
            installed: AtomicU64::new(0),
            tat_seen: AtomicU64::new(0),
            free_seen: AtomicU64::new(0),
            wasted: AtomicU64::new(0),
            alone_streak: AtomicU64::new(0),
        }
    }
}

/// The shared GCRA word and the alone flag, on one cache line: the alone path reads both.
#[derive(Debug)]
struct Shared {
    /// The shared TAT (all `Relaxed`: see [`AtomicState`]).
    tat: AtomicState,
    /// Whether threads decide on `tat` directly (the alone path). A hint only: every decision is
    /// exact on either path, so a stale read costs speed, never a unit (crate docs, "One thread
    /// alone").
    alone: AtomicBool,
}

impl Shared {
    fn new(tat: Nanos, alone: bool) -> Self {
        Shared {
            tat: AtomicState::new(tat),
            alone: AtomicBool::new(alone),
        }
    }

    /// The shared TAT.
    #[inline]
    fn load(&self) -> Nanos {
        self.tat.load()
    }

    /// [`AtomicState::update`] on the shared TAT.
    #[inline]
    fn update<T, E>(
        &self,
        current: Nanos,
        transition: impl FnMut(Nanos) -> Result<(T, Option<Nanos>), E>,
    ) -> Result<(T, Nanos), E> {
        self.tat.update(current, transition)
    }

    /// Another thread wrote the shared word under us: leave the alone path.
    #[cold]
    fn contended(&self) {
        // Relaxed: a hint that publishes nothing (see `alone`).
        self.alone.store(false, Ordering::Relaxed);
    }
}

/// One GCRA quota shared by many threads, scaled by per-stripe leases.
///
/// See the [crate docs](crate) for the design, the exact bounds and their proofs, and how to choose
/// the lease size.
///
/// ```
/// use tollgate_core::{Limiter, ManualClock, Quota};
/// use tollgate_striped::{StripedConfig, StripedLimiter};
///
/// let clock = ManualClock::new();
/// let limiter = StripedLimiter::with_config(
///     Quota::per_second(1_000)?,
///     StripedConfig::default().stripes(4),
///     clock.clone(),
/// )?;
/// assert!(limiter.check().is_allowed());
/// assert!(limiter.check_n(5)?.is_allowed());
/// assert!(limiter.check_n(5_000).is_err()); // above the burst: an error, not a denial
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct StripedLimiter<C = MonotonicClock> {
    shared: CachePadded<Shared>,
    /// `config.always_lease`.
    always_lease: bool,
    gcra: Gcra,
    /// The GCRA timeline arithmetic (core's, shared with `Gcra` and the shaper).
    timeline: Timeline,
    stripes: Box<[CachePadded<Stripe>]>,
    mask: usize,
    min_lease: u64,
    max_lease: u64,
    clock: C,
}

impl<C> fmt::Debug for StripedLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StripedLimiter")
            .field("quota", self.gcra.quota())
            .field("stripes", &self.stripes.len())
            .field("lease", &(self.min_lease..=self.max_lease))
            .finish_non_exhaustive()
    }
}

impl StripedLimiter<MonotonicClock> {
    /// A limiter with the default layout on the default monotonic clock.
    ///
    /// # Errors
    /// [`StripedError::Quota`] when GCRA cannot represent `quota`.
    pub fn new(quota: Quota) -> Result<Self, StripedError> {
        Self::with_config(quota, StripedConfig::default(), MonotonicClock::new())
    }
}

impl<C: Clock> StripedLimiter<C> {
    /// A limiter with the default layout reading `clock`.
    ///
    /// # Errors
    /// As [`with_config`](Self::with_config).
    pub fn with_clock(quota: Quota, clock: C) -> Result<Self, StripedError> {
        Self::with_config(quota, StripedConfig::default(), clock)
    }

    /// A limiter laid out by `config`, reading `clock`.
    ///
    /// # Errors
    /// [`StripedError`] for an unrepresentable quota, a stripe count of 0 or above
    /// [`MAX_STRIPES`], or a zero lease.
    pub fn with_config(
        quota: Quota,
        config: StripedConfig,
        clock: C,
    ) -> Result<Self, StripedError> {
        let gcra = Gcra::from_quota(quota)?;
        let wanted = config.stripes.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        });
        if wanted == 0 || wanted > MAX_STRIPES {
            return Err(StripedError::Stripes(wanted));
        }
        let count = wanted.next_power_of_two();
        let stripes_u64 = count as u64;
        let cap = (quota.burst() / stripes_u64).clamp(1, LeaseWord::UNITS_MASK);
        let (min_lease, max_lease) = match config.lease {
            None => (
                1,
                (quota.burst() / (4 * stripes_u64))
                    .clamp(1, 1 << 16)
                    .min(cap),
            ),
            Some(LeaseSize::Adaptive { max: 0 } | LeaseSize::Fixed(0)) => {
                return Err(StripedError::ZeroLease);
            }
            Some(LeaseSize::Adaptive { max }) => (1, max.min(cap)),
            Some(LeaseSize::Fixed(size)) => (size.min(cap), size.min(cap)),
        };
        let stripes = (0..count)
            .map(|_| CachePadded::new(Stripe::new(min_lease)))
            .collect();
        Ok(StripedLimiter {
            shared: CachePadded::new(Shared::new(0, !config.always_lease)),
            always_lease: config.always_lease,
            timeline: *gcra.timeline(),
            gcra,
            stripes,
            mask: count - 1,
            min_lease,
            max_lease,
            clock,
        })
    }

    /// This (fresh) limiter with its shared GCRA word set to `tat`: how a reconfigured limiter takes
    /// over a predecessor's position on the timeline (read with
    /// [`shared_tat`](Self::shared_tat)), so that a quota change hands nobody a fresh burst. Units the
    /// predecessor's stripes still hold are not carried (stricter); admissions the predecessor makes
    /// after the read are not seen (looser by at most what its in-flight callers take).
    pub fn with_shared_tat(self, tat: Nanos) -> Self {
        StripedLimiter {
            shared: CachePadded::new(Shared::new(tat, !self.always_lease)),
            ..self
        }
    }

    /// Moves the shared GCRA word up to `tat` if it is below (never down): how a limiter replacing
    /// another (see [`retire`](Self::retire)) takes over the predecessor's place on the timeline
    /// before anyone decides on it. Only stricter, so safe on a live limiter too.
    pub fn raise_shared_tat(&self, tat: Nanos) {
        let raised: Result<((), u64), std::convert::Infallible> =
            self.shared.update(self.shared.load(), |current| {
                Ok(((), (tat > current).then_some(tat)))
            });
        let _ = raised;
    }

    /// Stops this limiter granting anything more from its shared word, for good, and returns the word
    /// as it was: for a limiter being replaced (a reload with a new quota) while threads may still be
    /// deciding on it. Those threads use up the leases their stripes already hold (units the
    /// returned word accounts for) and are denied beyond them, so the successor, started from the
    /// returned word (carried over as the caller sees fit), never shares a unit with it.
    ///
    /// The word is moved two bucket depths past `max(word, at)`: a grant then needs a caller's `now`
    /// more than one depth past `at`, far beyond any decision already under way at `at`, and a
    /// denial's `retry_after` stays within two depths.
    pub fn retire(&self, at: Nanos) -> Nanos {
        let closed = |tat: Nanos| {
            tat.max(at)
                .saturating_add(self.gcra.depth().saturating_mul(2))
        };
        let retired: Result<(Nanos, u64), std::convert::Infallible> = self
            .shared
            .update(self.shared.load(), |tat| Ok((tat, Some(closed(tat)))));
        match retired {
            Ok((tat, _)) => tat,
            Err(never) => match never {},
        }
    }

    /// The number of stripes (a power of two).
    pub fn stripes(&self) -> usize {
        self.stripes.len()
    }

    /// The largest lease a stripe may hold, in units: the stranded-capacity bound is this times
    /// [`stripes`](Self::stripes).
    pub fn max_lease(&self) -> u64 {
        self.max_lease
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The stripe the calling thread uses.
    #[inline]
    pub fn current_stripe(&self) -> usize {
        thread_ordinal() & self.mask
    }

    /// [`check_at`](Limiter::check_at) on stripe `stripe` (masked to the stripe count), for models
    /// and tests that place requests on stripes explicitly (feature `diagnostics`).
    ///
    /// # Errors
    /// [`CheckError::CostExceedsCapacity`] when `cost` is above the burst.
    #[cfg(feature = "diagnostics")]
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
    #[cfg(feature = "diagnostics")]
    pub fn check_on_stripe_with_receipt(
        &self,
        stripe: usize,
        now: Nanos,
        cost: u64,
    ) -> Result<(Decision, LeaseReceipt), CheckError> {
        self.on_stripe(stripe, now, cost)
    }

    /// [`peek_at`](Limiter::peek_at) as seen from stripe `stripe` (feature `diagnostics`).
    ///
    /// # Errors
    /// As `check_on_stripe`.
    #[cfg(feature = "diagnostics")]
    pub fn peek_on_stripe(
        &self,
        stripe: usize,
        now: Nanos,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        self.peek_stripe(stripe, now, cost)
    }

    /// [`check_at`](Limiter::check_at) on the calling thread's stripe, with the [`LeaseReceipt`] that
    /// [`refund`](Self::refund) needs to give the admission back.
    ///
    /// # Errors
    /// [`CheckError::CostExceedsCapacity`] when `cost` is above the burst.
    #[inline]
    pub fn check_at_with_receipt(
        &self,
        now: Nanos,
        cost: u64,
    ) -> Result<(Decision, LeaseReceipt), CheckError> {
        // Relaxed: a hint (see `Shared::alone`); either path decides exactly.
        if self.shared.alone.load(Ordering::Relaxed) {
            let (decision, word) = self.alone(now, cost)?;
            // An admission of `cost > 0` always moves the TAT (by `cost × T`), so `word` is the
            // end of the units it took; a cost of 0 took nothing.
            let receipt = if decision.is_allowed() && cost > 0 {
                LeaseReceipt::Shared { end: word }
            } else {
                LeaseReceipt::Nothing
            };
            return Ok((decision, receipt));
        }
        self.on_stripe(self.current_stripe(), now, cost)
    }

    /// The alone path: plain GCRA on the shared word (the same CAS loop and transition as
    /// [`tollgate_core::GcraLimiter`]), for a thread that found the limiter uncontended. A compare
    /// and swap that fails (another thread wrote the word between our load and our CAS) is the
    /// contention this path watches for: the limiter turns to its stripes for everyone's next
    /// decision. The decision itself is still exact (the loop re-decides on the word it found).
    /// Returns the decision and the word it was based on or wrote.
    #[inline(always)]
    fn alone(&self, now: Nanos, cost: u64) -> Result<(Decision, Nanos), CheckError> {
        let mut tries = 0u32;
        let result = self.shared.update(self.shared.load(), |tat| {
            tries += 1;
            let transition = self.gcra.decide(tat, now, cost)?;
            Ok((transition.decision, transition.next))
        });
        if tries > 1 {
            // A failed exchange: another thread wrote the word between our read and our CAS.
            self.shared.contended();
        }
        result
    }

    /// `on_stripe` on the calling thread's stripe, kept out of line so that `check_at`'s alone path
    /// inlines into its caller as plain GCRA's does. The cached denial is tried first, so that a
    /// denial builds no receipt.
    #[inline(never)]
    fn check_on_own_stripe(&self, now: Nanos, cost: u64) -> Result<Decision, CheckError> {
        let index = self.current_stripe();
        if !(1..=self.max_lease).contains(&cost) {
            return self
                .on_stripe(index, now, cost)
                .map(|(decision, _)| decision);
        }
        // `1 ≤ cost ≤ max_lease ≤ burst`: the cost checks of `on_stripe` cannot fail.
        // Acquire: as the word's load in `on_stripe` (the `end` we may read next must be at least
        // the one installed with this word).
        let word = LeaseWord::from_bits(self.stripes[index].word.load(Ordering::Acquire));
        if let Some(denied) = self.cached_denial(word, now, cost) {
            return Ok(denied);
        }
        self.on_lease(index, word, now, cost)
            .map(|(decision, _)| decision)
    }

    /// The cached denial: `Some` when the stripe's `word` holds no unit and the shared word refuses
    /// `cost` at `now`. With no unit in the lease there is nothing to give back, so a refill would
    /// be exactly GCRA on the shared word; the shared word is what remembers until when this stripe
    /// is refused (its TAT, which a refusal never writes), so we answer from it: one load and a
    /// compare, no lock and no CAS, the same work as plain GCRA's denial. When it could grant, the
    /// caller locks the stripe and takes a lease. A locked word is not answered here either (the
    /// caller decides on the shared word directly). The load is `Relaxed` (`AtomicState::load`): a
    /// denial publishes nothing and reads nothing but the word; whatever value coherence lets us
    /// read, the denial is one the shared word gave at some point since our own last operation on
    /// it, and it writes nothing, so it cannot over-admit; and it is not remembered anywhere, so a
    /// give-back or refund that lowers the TAT is seen by the next decision (crate docs,
    /// "Denials"; loom-tests: `a_cached_denial_does_not_outlive_a_refund`).
    #[inline(always)]
    fn cached_denial(&self, word: LeaseWord, now: Nanos, cost: u64) -> Option<Decision> {
        if word.units() != 0 || word.is_locked() {
            return None;
        }
        let transition = self.timeline.transition(self.shared.load(), now, cost);
        (!transition.decision.is_allowed()).then_some(transition.decision)
    }

    /// A decision on stripe `stripe` (masked to the stripe count), with the receipt of where the
    /// units came from: the one decision path (`check_at` and `check_at_with_receipt` pick the
    /// calling thread's stripe).
    #[inline]
    pub(crate) fn on_stripe(
        &self,
        stripe: usize,
        now: Nanos,
        cost: u64,
    ) -> Result<(Decision, LeaseReceipt), CheckError> {
        self.gcra.check_cost(cost)?;
        if cost == 0 {
            return self
                .peek_stripe(stripe, now, 0)
                .map(|decision| (decision, LeaseReceipt::Nothing));
        }
        let index = stripe & self.mask;
        let stripe = &self.stripes[index];
        if cost > self.max_lease {
            return Ok(self.direct(now, cost));
        }
        // Acquire: pairs with the lock holder's Release store of the word, so the `end` we read next
        // is at least the one installed with this word (loom-tests/tests/striped.rs: the
        // `a_reader_*` models).
        let word = LeaseWord::from_bits(stripe.word.load(Ordering::Acquire));
        self.on_lease(index, word, now, cost)
    }

    /// The lease path of `on_stripe` for `1 ≤ cost ≤ max_lease` on stripe `index` (in range), from
    /// its word `word` read with `Acquire`.
    #[inline]
    fn on_lease(
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
                            // Units whose positions time has passed left the lease unused: count
                            // them as wasted. Relaxed RMW: a diagnostic counter that publishes
                            // nothing; an RMW because other threads on this stripe add to it too.
                            let dead = word.units().saturating_sub(alive);
                            if dead > 0 {
                                stripe.wasted.fetch_add(dead, Ordering::Relaxed);
                            }
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

    /// [`peek_at`](Limiter::peek_at) as seen from stripe `stripe`.
    pub(crate) fn peek_stripe(
        &self,
        stripe: usize,
        now: Nanos,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        self.gcra.check_cost(cost)?;
        let stripe = &self.stripes[stripe & self.mask];
        // Acquire (both): as in `on_stripe`, so the pair is never older than the word. Peek
        // is advisory and its answer may be stale under concurrent checks anyway, so no model
        // asserts on it: these two are argued, not loom-checked (loom-tests/README.md).
        let word = LeaseWord::from_bits(stripe.word.load(Ordering::Acquire));
        let end = stripe.end.load(Ordering::Acquire);
        let alive = if word.is_locked() {
            0
        } else {
            alive_units(word.units(), end, now, &self.timeline).unwrap_or(0)
        };
        let tat = self.shared.load();
        if alive >= cost {
            let free = self.timeline.available(tat, now);
            return Ok(Self::allowed(alive - cost, free, tat.max(end), now));
        }
        Ok(self.gcra.decide(tat, now, cost)?.decision)
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
                    // nobody else is deciding. Relaxed: a hint (see `Shared::alone`).
                    self.shared.alone.store(true, Ordering::Relaxed);
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
                // RMW: fast-path callers that won their CAS before our lock may still be adding.
                stripe.wasted.fetch_add(lost, Ordering::Relaxed);
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
                // RMW: as above.
                stripe.wasted.fetch_add(dead, Ordering::Relaxed);
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
    fn direct(&self, now: Nanos, cost: u64) -> (Decision, LeaseReceipt) {
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

    /// Gives back `cost` units admitted with `receipt` (from
    /// [`check_at_with_receipt`](Self::check_at_with_receipt)). Returns whether anything was given
    /// back.
    ///
    /// * Units taken from a stripe's lease go back into that lease if it is still the same lease (its
    ///   generation unchanged, not being replaced): exact, as if the request had not come, because a
    ///   lease's units are interchangeable top positions of one segment.
    /// * Units taken from the shared state directly go back when nothing was granted above them
    ///   since (the shared TAT is still their end): exact.
    /// * Otherwise (the lease was replaced in between, or a later grant sits above the units) nothing
    ///   is given back: the units are lost to this quota, exactly like a lease's expired units —
    ///   stricter by at most `cost`, never looser.
    ///
    /// ```
    /// use tollgate_core::{Limiter, ManualClock, Quota};
    /// use tollgate_striped::{StripedConfig, StripedLimiter};
    /// let limiter = StripedLimiter::with_config(
    ///     Quota::per_second(1)?.with_burst(4)?,
    ///     StripedConfig::default().stripes(1),
    ///     ManualClock::new(),
    /// )?;
    /// let (decision, receipt) = limiter.check_at_with_receipt(0, 4)?;
    /// assert!(decision.is_allowed());
    /// assert!(limiter.refund(receipt, 4));
    /// assert!(limiter.check_at(0, 4)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund(&self, receipt: LeaseReceipt, cost: u64) -> bool {
        match receipt {
            LeaseReceipt::Nothing => false,
            LeaseReceipt::Lease { stripe, generation } => {
                let Some(stripe) = self.stripes.get(stripe) else {
                    return false;
                };
                // Relaxed: giving units back publishes nothing (the lease's `end` and bookkeeping
                // are unchanged within a generation); the CAS itself orders us against the fast
                // path's and the lock holder's writes of this word.
                let mut word = LeaseWord::from_bits(stripe.word.load(Ordering::Relaxed));
                loop {
                    let units = word.units().saturating_add(cost);
                    if word.is_locked()
                        || word.generation() != generation
                        || units > LeaseWord::UNITS_MASK
                    {
                        return false;
                    }
                    match stripe.word.compare_exchange_weak(
                        word.bits(),
                        word.with_units(units).bits(),
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => return true,
                        Err(actual) => word = LeaseWord::from_bits(actual),
                    }
                }
            }
            LeaseReceipt::Shared { end } => {
                let back = cost.saturating_mul(self.timeline.interval());
                self.shared
                    .update(self.shared.load(), |tat| {
                        let next = (tat == end && cost > 0).then(|| tat.saturating_sub(back));
                        Ok::<_, std::convert::Infallible>((next.is_some(), next))
                    })
                    .map(|(written, _)| written)
                    .unwrap_or_else(|never| match never {})
            }
        }
    }

    /// Counts `cost` units at `now` without a decision (see [`Algorithm::charge`]: a settlement's
    /// overdraft): the shared TAT moves `cost × T` past `max(TAT, now)`, past the bucket's depth if
    /// need be, so every stripe's next lease waits for the debt to refill. Units the stripes'
    /// leases already hold are theirs to use (they were granted before the debt). Returns whether
    /// the shared word changed (`false` for a cost of 0).
    ///
    /// ```
    /// use tollgate_core::{Limiter, ManualClock, Quota};
    /// use tollgate_striped::{StripedConfig, StripedLimiter};
    /// let limiter = StripedLimiter::with_config(
    ///     Quota::per_second(1)?.with_burst(4)?,
    ///     StripedConfig::default().stripes(1),
    ///     ManualClock::new(),
    /// )?;
    /// assert!(limiter.charge_at(0, 6)); // 2 units beyond the burst
    /// assert_eq!(limiter.check_at(0, 1)?.retry_after(), Some(std::time::Duration::from_secs(3)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge_at(&self, now: Nanos, cost: u64) -> bool {
        self.shared.tat.charge(&self.gcra, now, cost)
    }

    /// An admission with `lease_left` units left in the stripe's lease, `shared_free` units free in
    /// the shared state when last looked at, and `tat` the latest shared TAT the stripe knows of.
    #[inline]
    fn allowed(lease_left: u64, shared_free: u64, tat: Nanos, now: Nanos) -> Decision {
        Decision::allowed(
            lease_left.saturating_add(shared_free),
            tat.saturating_sub(now),
        )
    }

    /// The denial the shared GCRA gives `cost` at `now` from `tat`.
    fn denied(&self, tat: Nanos, now: Nanos, cost: u64) -> Decision {
        match self.gcra.decide(tat, now, cost) {
            Ok(transition) if !transition.decision.is_allowed() => transition.decision,
            // The shared state freed up between our attempt and this call's arithmetic (cannot
            // happen: same inputs); fail closed with the shortest honest wait.
            _ => Decision::denied(self.timeline.interval(), tat.saturating_sub(now)),
        }
    }

    /// Units currently held by leases (live or expired-but-not-yet-retired) plus units wasted so
    /// far: the quantity the lower-bound property test subtracts. Not synchronised with concurrent
    /// callers. Feature `diagnostics`.
    #[cfg(feature = "diagnostics")]
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
    #[cfg(feature = "diagnostics")]
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
    #[cfg(feature = "diagnostics")]
    pub fn is_alone(&self) -> bool {
        // Relaxed: a diagnostic snapshot of a hint.
        self.shared.alone.load(Ordering::Relaxed)
    }

    /// Leaves the alone path as a failed compare-and-swap on it does, for models and tests that
    /// cannot make one fail on purpose (feature `diagnostics`).
    #[cfg(feature = "diagnostics")]
    pub fn mark_contended(&self) {
        self.shared.contended();
    }

    /// The shared GCRA state: the instant the quota's bucket would be full again if every lease
    /// were used. A limiter rebuilt with [`with_shared_tat`](Self::with_shared_tat) at this value
    /// continues the same timeline (the policy engine's reload of a striped rule does this).
    pub fn shared_tat(&self) -> Nanos {
        self.shared.load()
    }

    /// The GCRA parameters.
    pub fn gcra(&self) -> &Gcra {
        &self.gcra
    }
}

impl<C: Clock> Limiter for StripedLimiter<C> {
    #[inline]
    fn now(&self) -> Nanos {
        self.clock.now()
    }

    fn quota(&self) -> &Quota {
        self.gcra.quota()
    }

    /// Decides on the calling thread's stripe. `remaining` is approximate: this stripe's lease plus
    /// what the shared state had free when the lease was taken (other stripes' leases and later
    /// grants are not seen).
    #[inline(always)]
    fn check_at(&self, now: Nanos, cost: u64) -> Result<Decision, CheckError> {
        // Relaxed: a hint (see `Shared::alone`); either path decides exactly.
        if self.shared.alone.load(Ordering::Relaxed) {
            return self.alone(now, cost).map(|(decision, _)| decision);
        }
        self.check_on_own_stripe(now, cost)
    }

    /// What the calling thread's stripe would decide; approximate, as for `check_at`.
    fn peek_at(&self, now: Nanos, cost: u64) -> Result<Decision, CheckError> {
        self.peek_stripe(self.current_stripe(), now, cost)
    }
}

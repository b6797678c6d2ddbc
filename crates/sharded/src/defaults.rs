//! Changing a table's default quota while it is in use: the generations of the default algorithm,
//! the two slot tiers that mark which generation wrote a word, and the carry-over of every key's
//! state ([`Algorithm::carry_over`]: as-is in units at the change).
//!
//! # The protocol
//! Generation `g` of the default quota decides the slots whose tier is `default_tier(g)`: tier 0 for
//! even generations, tier 15 for odd ones (overrides use tiers 1..=14). A change to generation
//! `g + 1`, under every stripe lock (so no insert, override change or overflow decision is under
//! way), appends the new algorithm with its instant `at`, publishes `g + 1`, and carries each
//! stripe's overflow state over. From then on a slot still in the old tier is read as its carried
//! state: every decision, peek or refund that meets such a word decides on
//! `old.carry_over(state, at, new)` and, when it writes, writes that in the new tier, in the same
//! compare-and-swap as its own change. A sweep then carries over every slot still in the old tier,
//! so that when the change returns no slot holds the old tier: the next change can reuse it.
//!
//! Why it is exact: the tier and the state are one 128-bit word, so no word is ever read under a
//! generation other than the one that wrote it (or carried from the one before). A thread that read
//! `current` before the switch and meets a word written after it cannot happen: a word changes tier
//! only with a Release exchange made after an Acquire load saw the new generation, and every reader
//! loads the word (Acquire) before it loads `current`. A decision computed on a stale word is
//! discarded by its failed exchange.

use tollgate_core::state::cas_loop;
use tollgate_core::{Algorithm, Clock, Nanos};

use crate::limiter::KeyedLimiter;
use crate::slot::{SlotWord, TIER_MASK};
use crate::sync::{AtomicUsize, Ordering, lock};

/// The tier of the slots generation `generation` of the default quota decides.
#[inline]
pub(crate) const fn default_tier(generation: usize) -> u8 {
    if generation % 2 == 0 {
        0
    } else {
        TIER_MASK as u8
    }
}

/// Whether `tier` is one of the two default-quota tiers (not an override).
#[inline]
pub(crate) const fn is_default_tier(tier: u8) -> bool {
    tier == 0 || tier == TIER_MASK as u8
}

/// Every default algorithm a table has had. The first is a plain field, so a table whose quota
/// never changes pays one load and a predictable branch; later ones live in an append-only list
/// whose entries never move, so a decision borrows one without a lock or a reference count (about a
/// hundred bytes per change, kept for the table's life).
pub(crate) struct Defaults<A> {
    first: A,
    /// Generation `g ≥ 1` at index `g − 1`, with the instant it took over.
    later: boxcar::Vec<(A, Nanos)>,
    current: AtomicUsize,
}

impl<A: Algorithm> Defaults<A> {
    pub(crate) fn new(first: A) -> Self {
        Defaults {
            first,
            later: boxcar::Vec::new(),
            current: AtomicUsize::new(0),
        }
    }

    /// The generation in force.
    #[inline]
    pub(crate) fn generation(&self) -> usize {
        // Acquire: pairs with the Release store in `push`, so the entry it names is written before we
        // read it (boxcar's own entry flag makes this doubly sure).
        self.current.load(Ordering::Acquire)
    }

    /// Generation `generation`'s algorithm.
    #[inline]
    pub(crate) fn get(&self, generation: usize) -> &A {
        match generation {
            0 => &self.first,
            // Entries are pushed before they are named, so this is always there; the first
            // generation is a non-panicking fallback that cannot be reached.
            g => self.later.get(g - 1).map_or(&self.first, |(a, _)| a),
        }
    }

    /// The instant generation `generation` took over (0 for the first).
    fn since(&self, generation: usize) -> Nanos {
        match generation {
            0 => 0,
            g => self.later.get(g - 1).map_or(0, |(_, at)| *at),
        }
    }

    /// The algorithm in force.
    #[inline]
    pub(crate) fn current(&self) -> &A {
        self.get(self.generation())
    }

    /// Appends `algorithm` as of `at` and makes it current; its generation.
    fn push(&self, algorithm: A, at: Nanos) -> usize {
        let generation = self.later.push((algorithm, at)) + 1;
        // Release: publishes the pushed entry to the Acquire load in `generation`.
        self.current.store(generation, Ordering::Release);
        generation
    }
}

impl<K: ?Sized, A: Algorithm, C: Clock> KeyedLimiter<K, A, C> {
    /// The algorithm a slot word is decided under now, and the word in its terms: a word in the
    /// previous default generation's tier comes back carried over to the current one (in the current
    /// tier), every other word as it is.
    // The carry-over is out of line, so that this stays small enough to inline: the compiler
    // outlined the whole function, a call with its pair returned through memory on every decision
    // (results/keyed/floor.md).
    #[inline]
    pub(crate) fn resolve(&self, word: SlotWord) -> (&A, SlotWord) {
        let tier = word.tier();
        if !is_default_tier(tier) {
            return (self.override_algorithm(tier), word);
        }
        let generation = self.defaults.generation();
        let current = self.defaults.get(generation);
        if tier == default_tier(generation) || generation == 0 {
            return (current, word);
        }
        self.carry_over_word(word, generation, current)
    }

    /// `resolve` for a word of the previous default generation (rare: once per key after a quota
    /// change).
    #[cold]
    #[inline(never)]
    fn carry_over_word<'a>(
        &'a self,
        word: SlotWord,
        generation: usize,
        current: &'a A,
    ) -> (&'a A, SlotWord) {
        let previous = self.defaults.get(generation - 1);
        let at = self.defaults.since(generation);
        let state = previous.carry_over(word.state, at, current);
        (
            current,
            word.with_tier(default_tier(generation)).with_state(state),
        )
    }

    /// Makes `algorithm` the default quota from now on, for every key without an override and for new
    /// keys. Each key's state carries over **as-is in units** at this instant
    /// ([`Algorithm::carry_over`]): a key keeps `min(what it had, the new capacity)` available and
    /// refills under the new quota from there, so a change never hands a key more than it had, nor
    /// more than the new quota allows. The stripes' overflow states carry over the same way.
    ///
    /// Decisions on known keys go on lock-free throughout; inserts of new keys wait while the change
    /// holds every stripe lock (a few microseconds per thousand stripes). Then one sweep of the table
    /// (a load per slot, an exchange per key) carries over the keys nobody decided meanwhile; keys
    /// it has not reached yet are carried over by their own next decision. Changes are serialised.
    ///
    /// ```
    /// use tollgate_core::{Gcra, ManualClock, Quota};
    /// use tollgate_sharded::KeyedLimiter;
    /// let limiter =
    ///     KeyedLimiter::<str, Gcra, _>::with_clock(Quota::per_second(10)?, 100, ManualClock::new())?;
    /// let now = limiter.now();
    /// assert!(limiter.check_key_at("alice", now, 10)?.is_allowed()); // the whole burst
    /// limiter.set_quota(Quota::per_minute(10)?)?;
    /// // She had nothing left, so she has nothing now (in time she would have had 9 back).
    /// assert!(!limiter.check_key_at("alice", now, 1)?.is_allowed());
    /// assert!(limiter.check_key_at("bob", now, 10)?.is_allowed()); // a new key: a full burst
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_default(&self, algorithm: A) {
        let _serial = lock(&self.requota);
        let at = self.clock.now();
        let old = self.defaults.generation();
        {
            let _stripes: Vec<_> = self.stripes.iter().map(|s| lock(&s.insert)).collect();
            let new = self.defaults.push(algorithm, at);
            let (from, to) = (self.defaults.get(old), self.defaults.get(new));
            for stripe in self.stripes.iter() {
                // Every writer of an overflow state holds its stripe lock (decisions in `insert`,
                // refunds in `refund_key_at`), so this loop runs once; it is a loop for the form.
                let carried: Result<((), u64), std::convert::Infallible> =
                    stripe.overflow.update(stripe.overflow.load(), |word| {
                        Ok((
                            (),
                            Some(from.carry_over(word, at, to)).filter(|&w| w != word),
                        ))
                    });
                let _ = carried;
            }
        }
        let stale = default_tier(old);
        for index in 0..self.slots.len() {
            let word = self.load(index);
            if word.is_empty() || word.tier() != stale {
                continue;
            }
            let swept: Result<((), SlotWord), ()> = cas_loop(
                word,
                |word: SlotWord| {
                    if word.is_empty() || word.tier() != stale {
                        return Ok(((), None));
                    }
                    Ok(((), Some(self.resolve(word).1)))
                },
                |old, new| self.exchange(index, old, new).map(drop),
            );
            let _ = swept;
        }
    }

    /// [`set_default`](Self::set_default) for a quota.
    ///
    /// # Errors
    /// [`KeyedError::Quota`](crate::KeyedError::Quota) when the algorithm cannot hold it; nothing
    /// changes then.
    pub fn set_quota(&self, quota: tollgate_core::Quota) -> Result<(), crate::KeyedError> {
        self.set_default(A::from_quota(quota)?);
        Ok(())
    }
}

//! A keyed table's default quota changed while it is in use: reading a slot word under the current
//! generation, and the change itself (the protocol is in `defaults.rs`).

use tollgate_core::state::cas_loop;
use tollgate_core::{Algorithm, Clock};

use crate::defaults::{default_tier, is_default_tier};
use crate::limiter::KeyedLimiter;
use crate::slot::SlotWord;
use crate::sync::lock;

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
            // Promoted keys go back to their slots first, so the sweep carries their state over
            // (`hot.rs`); a promotion needs a stripe lock, so none happens until we are done.
            self.demote_all_locked(at);
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

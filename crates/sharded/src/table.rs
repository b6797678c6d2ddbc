//! The table's slot operations and the lock-free decision path: place a hash, scan a window, load and
//! exchange slot words, apply a key's algorithm with the pair CAS loop.

use tollgate_core::state::cas_loop;
use tollgate_core::{Algorithm, CheckError, Clock, Decision, Nanos};

use crate::headroom::Headroom;
use crate::limiter::{KeyedLimiter, Place, Scan};
use crate::slot::{SlotWord, tag_hash};
use crate::sync::Ordering;

impl<K: ?Sized, A: Algorithm, C: Clock> KeyedLimiter<K, A, C> {
    #[inline]
    pub(crate) fn place(&self, hash: u64) -> Place {
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
    pub(crate) fn window_indices(
        &self,
        place: Place,
    ) -> impl Iterator<Item = usize> + use<K, A, C> {
        let (base, home, per) = (place.base, place.home, self.slots_per_stripe);
        (0..self.window).map(move |i| {
            let offset = home + i;
            base + if offset >= per { offset - per } else { offset }
        })
    }

    #[inline]
    pub(crate) fn load(&self, index: usize) -> SlotWord {
        // Acquire: pairs with the Release exchange that wrote a tier into a tag (`replace`, from
        // set_override), so a reader that sees tier t also sees `tiers[t - 1]` initialised. Slots
        // publish nothing else. (loom-tests/tests/sharded.rs: `a_lookup_racing_set_override_*`.)
        SlotWord::unpack(self.slots[index].load(Ordering::Acquire))
    }

    /// One exchange of a whole slot, for the writes made under the stripe lock (inserts, evictions,
    /// tier changes); whether it took.
    #[inline]
    pub(crate) fn replace(&self, index: usize, old: SlotWord, new: SlotWord) -> bool {
        // Release on success: publishes a newly set tier's quota (see `load`); the first write of a
        // tier into a tag is always this one. Failure Relaxed: the word found is dropped (callers
        // rescan with `load`).
        self.slots[index]
            .compare_exchange(old.pack(), new.pack(), Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// The admission exchange (`apply`, refunds): on failure returns the word found.
    #[inline]
    pub(crate) fn exchange(
        &self,
        index: usize,
        old: SlotWord,
        new: SlotWord,
    ) -> Result<SlotWord, SlotWord> {
        // Success Relaxed when the tag stays: an admission only changes the state half and
        // publishes nothing; being a read-modify-write it continues the release sequence of the
        // exchange that wrote the tier, so a reader of our word still synchronises with that one.
        // (Nor is an Acquire needed: `old`, carrying the tier we decided with, was read with
        // Acquire.) Success Release when the tag changes (a word carried over to a new default
        // generation, see `defaults.rs`): a reader of the new tier must also see the generation
        // we carried it to. Failure Acquire: the word we get back may carry a tier we then read
        // (see `load`). On x86_64 every 128-bit access is a locked instruction or an aligned
        // vector load whatever the ordering.
        let success = if old.tag == new.tag {
            Ordering::Relaxed
        } else {
            Ordering::Release
        };
        self.slots[index]
            .compare_exchange(old.pack(), new.pack(), success, Ordering::Acquire)
            .map(SlotWord::unpack)
            .map_err(SlotWord::unpack)
    }

    /// An override tier's algorithm (`tier` in 1..=14; see `resolve` for every tier).
    #[inline]
    pub(crate) fn override_algorithm(&self, tier: u8) -> &A {
        // A set tier is always initialised (see `load`); the default is only a non-panicking
        // fallback that cannot be reached. The loom build panics there instead, so the models
        // check that claim (and the orderings it rests on).
        match self
            .tiers
            .get(usize::from(tier).wrapping_sub(1))
            .and_then(|t| t.get())
        {
            Some(algorithm) => algorithm,
            None if cfg!(tollgate_loom) => {
                panic!("tier {tier} read before its quota was published")
            }
            None => self.algorithm(),
        }
    }

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
        reserve: impl Headroom,
    ) -> Result<Decision, CheckError> {
        loop {
            match self.scan(place, home.take(), None) {
                Scan::Found(index, found) => {
                    if let Some(result) = self.apply(index, found, now, cost, reserve) {
                        return result;
                    }
                    // The slot was re-tagged (the key was evicted) under us: look again.
                }
                Scan::Missing { .. } => return self.insert(place, now, cost, reserve),
            }
        }
    }

    /// Lock-free scan: stops at the key or at the first empty slot (slots are claimed in probe order and
    /// never emptied, so a key is never stored past an empty slot).
    /// `home`: the home slot's word if already loaded. `room` is only worked out when `room_at` is
    /// given (peeks); the decision path does not need it.
    #[inline]
    pub(crate) fn scan(
        &self,
        place: Place,
        mut home: Option<SlotWord>,
        room_at: Option<Nanos>,
    ) -> Scan {
        let mut room = false;
        // Only read for `room`: the current generation's tier holds the evictable keys.
        let default = room_at.map(|_| {
            let generation = self.defaults.generation();
            (
                crate::defaults::default_tier(generation),
                self.defaults.get(generation),
            )
        });
        for index in self.window_indices(place) {
            let word = home.take().unwrap_or_else(|| self.load(index));
            if word.is_empty() {
                return Scan::Missing { room: true };
            }
            if word.hash_part() == place.hash_part {
                return Scan::Found(index, word);
            }
            if let (Some(now), Some((tier, algorithm))) = (room_at, default) {
                room = room || (word.tier() == tier && algorithm.is_fresh(word.state, now));
            }
        }
        Scan::Missing { room }
    }

    /// Applies the key's algorithm to the slot with the pair CAS loop, keeping `reserve`'s headroom
    /// ([`Plain`](crate::headroom::Plain): none). `None`: the slot no longer holds the key (evicted under us), or
    /// a promoted key was demoted (`hot.rs`); the caller rescans.
    ///
    /// Always inlined: with the promotion paths beside it the compiler stopped inlining it, and
    /// the call (its prologue, and the decision returned through memory) cost a keyed check about
    /// 40 instructions of ~290 (`results/keyed/floor.md`).
    #[inline(always)]
    pub(crate) fn apply(
        &self,
        index: usize,
        current: SlotWord,
        now: Nanos,
        cost: u64,
        reserve: impl Headroom,
    ) -> Option<Result<Decision, CheckError>> {
        // A promoted key's marker, seen in the word we scanned, goes to its leased limiter at once
        // rather than through a GCRA denial on the marker first (`hot.rs`). Tested only where
        // promotion is on: a window algorithm's state may have the top bits set.
        if self.hot.is_some() {
            if let Some(promoted) = self.promoted(index, current) {
                return self.decide_promoted(promoted, index, current, now, cost, reserve.units());
            }
        }
        let hash_part = current.hash_part();
        let outcome = cas_loop(
            current,
            |word: SlotWord| {
                // Only a failed exchange hands us a word we did not scan: another key's means the
                // slot was re-tagged (evicted) under us.
                if word.hash_part() != hash_part {
                    return Err(None);
                }
                // A word of the previous default generation is decided as its carried-over state,
                // and written (if at all) in the current generation's tier.
                let (algorithm, seen) = self.resolve(word);
                let transition = reserve
                    .decide(algorithm, seen.state, now, cost)
                    .map_err(|error| Some(Err(error)))?;
                let next = transition.next.map(|state| seen.with_state(state));
                Ok((transition.decision, next))
            },
            // Same key (another admission, or a tier change): the loop re-decides against it. A
            // failure is what hot-key detection counts (`hot.rs`, out of line).
            |old, new| {
                self.exchange(index, old, new)
                    .map(drop)
                    .inspect_err(|_| self.note_contention(index, now))
            },
        );
        match outcome {
            // A word re-read by the loop may have become a marker (a promotion racing us): only a
            // denial can be one (`hot.rs`), so an admission pays one test of the decision's variant,
            // a denial also a test of two bits of the word it read.
            Ok((decision, word)) if !decision.is_allowed() => match self.promoted(index, word) {
                Some(promoted) => {
                    self.decide_promoted(promoted, index, word, now, cost, reserve.units())
                }
                None => Some(Ok(decision)),
            },
            Ok((decision, _)) => Some(Ok(decision)),
            Err(stopped) => stopped,
        }
    }
}

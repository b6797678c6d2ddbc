//! Hot keys promoted to a leased sub-limiter: a GCRA key whose slot keeps losing its
//! compare-and-swap is served, until it cools, by a [`StripedLimiter`] (per-stripe leases of one
//! shared GCRA word, see `tollgate-striped`) that continues the key's own timeline.
//!
//! Opt-in ([`Builder::promote_hot_keys`](crate::Builder::promote_hot_keys)), and only for
//! [`Gcra`] tables: GCRA is the one algorithm promoted (its state word is the key's theoretical
//! arrival time, TAT, which is what the striped limiter's shared word holds). Other algorithms never
//! promote.
//!
//! # Detection, off the fast path
//! Only a *failed* admission exchange (another thread wrote the key's slot between our read and our
//! CAS) is counted, in a small table of cells indexed by slot; a slot that fails
//! [`HotKeyConfig::failures`] times within [`HotKeyConfig::within`] of its first counted failure is
//! promoted by the thread that counted the last one, if it gets the stripe lock at once
//! (`try_lock`: detection is a hint, never waited for). Admissions that succeed and denials (which
//! write nothing) do no extra work. A promoted key's slot holds a *marker* state (two top bits set,
//! the entry number below). In a table with promotion on, a decision tests the word it scanned for
//! the marker (two bits, before any GCRA work) and goes straight to the entry; a word the CAS loop
//! re-reads is decided as GCRA decides any state (a marker is a TAT 2⁶² ns ahead: a denial, no
//! write) and tested only on a denial. A table without promotion never tests.
//! [`KeyedLimiter::promote_key`] promotes by hand.
//!
//! # Why a promoted key never admits more than the plain key would
//! Write `T` for the key's emission interval and `D` for its bucket depth. Plain GCRA on the slot is
//! the striped design's lease transition with `want = cost` used at once: an admission at `u` takes
//! the positions `[max(TAT, u), max(TAT, u) + cost·T)` of the key's timeline, each `≥ u` and below
//! `u + D`, and moves the TAT to their end. The striped limiter's Invariant I (crate docs of
//! `tollgate-striped`) says the same of its leases: every position used or held is below its shared
//! TAT, each is used at most once, each is `≥` the time it is used and below the time its lease was
//! taken `+ D`. So it is enough that the key has **one timeline** at every instant, handed over
//! exactly:
//!
//! * **Promotion** (under the slot's stripe lock): a fresh striped limiter's shared word is raised to
//!   the slot's TAT `t`, then one CAS replaces the slot's `(tag, t)` by `(tag, marker)`. If the CAS
//!   fails, an admission moved the TAT to `t' > t` (or a refund lowered it): the shared word is
//!   raised to `t'` (never lowered, so a racing refund is lost, stricter) and the CAS retried. When it
//!   succeeds the slot's last TAT is the shared word's, so every position the slot used is below the
//!   shared TAT (Invariant I holds from the start) and nothing the slot held is lost: the striped
//!   limiter's free capacity at that instant is exactly the slot's.
//! * **While promoted** nothing writes the slot's state: a decision denies on the marker (no write)
//!   and goes to the striped limiter; refunds and charges, also lock-free, test for the marker and
//!   never write it (a charge is made on the striped limiter; a refund is refused, stricter). Only
//!   stripe-lock holders rewrite a marker.
//! * **Demotion** (under the stripe lock): the striped limiter is
//!   [retired](StripedLimiter::retire), which returns its shared TAT `W` and moves its word two
//!   depths ahead (it grants nothing more to a decision within a depth of the demotion), then one
//!   CAS writes `(tag, W)` back. Every position ever used or held by the limiter is below `W`, so
//!   the slot's next grants (at `≥ W`) overlap none of them. Units its stripes still hold may be
//!   used by decisions already under way on the limiter: they are positions below `W`, counted in
//!   it, so they are used once. Hence the key's whole admitted stream, before, during and after the
//!   promotion, uses disjoint positions, each `≥` its use time and below its grant time `+ D`; the
//!   striped crate's conformance proof applies word for word: **fed only the admitted requests,
//!   an exact GCRA admits every one of them**.
//!
//! A key cools when its striped limiter's shared TAT is at or before `now −`
//! [`HotKeyConfig::cool_after`] (its bucket has been full again that long). Its next decision then
//! demotes it: every lease ends at or before the shared TAT, so every
//! unit still held by a stripe has a position before `now` and has **expired** (an exact GCRA would
//! have lost that idle capacity too), and `W ≤ now` is a full bucket, as the plain key would have.
//! So a demotion of a cooled key carries its state exactly: nothing lost, nothing duplicated. A
//! default quota change ([`KeyedLimiter::set_default`]) or an override change of a promoted key
//! demotes it first, at that instant: the units its stripes held then are dropped (stricter by at
//! most the striped limiter's stranded-capacity bound, `max_lease × stripes`).
//!
//! The one assumption is the striped crate's for [`StripedLimiter::retire`]: decisions racing a
//! demotion carry a `now` within one bucket depth of the demoting decision's.
//!
//! # What a promoted key costs and what is missing
//! A decision on a promoted key reads its slot (a shared, no longer written line), the entry, and
//! then decides on its stripe as the striped limiter does (its alone path while one thread uses it).
//! Reserving decisions ([`KeyedLimiter::check_key_reserving_at`]) on a promoted key probe
//! `cost + reserve` with a peek and then take `cost`: the key's quota bound is exact, the headroom
//! is best-effort (a racing admission may take part of it between the two).
//!
//! Entries are **not reused**: each promotion takes a new one, allocated then (a striped limiter,
//! about `stripes × 128` bytes), and at most [`HotKeyConfig::max_promotions`] promotions happen
//! over the table's lifetime; after that, hot keys stay on their slots. Reusing an entry needs to
//! know that no decision that read the old marker is still on its limiter (a reader count or epoch):
//! not done yet.
//!
//! [`Gcra`]: tollgate_core::Gcra
//! [`HotKeyConfig::failures`]: crate::HotKeyConfig::failures
//! [`HotKeyConfig::within`]: crate::HotKeyConfig::within
//! [`HotKeyConfig::cool_after`]: crate::HotKeyConfig::cool_after
//! [`HotKeyConfig::max_promotions`]: crate::HotKeyConfig::max_promotions

use tollgate_core::{Algorithm, CheckError, Clock, Decision, Limiter, ManualClock, Nanos};
use tollgate_striped::{StripedConfig, StripedLimiter};

use crate::hot_table::{HotTable, MARK, Promoted, is_marker, marker};
use crate::limiter::{KeyedLimiter, Place, Scan};
use crate::slot::SlotWord;
use crate::sync::{Mutex, MutexGuard, Ordering, lock};

/// The stripe lock if free now (poisoning ignored, as `sync::lock`).
fn try_lock<T>(mutex: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

impl<K: ?Sized, A: Algorithm, C: Clock> KeyedLimiter<K, A, C> {
    /// The entry a slot word names, if the word is a promoted key's marker for this very slot and
    /// key. A plain test of two bits on the word already loaded; the rest is out of line.
    #[inline(always)]
    pub(crate) fn promoted(&self, index: usize, word: SlotWord) -> Option<&Promoted> {
        if !is_marker(word.state) {
            return None;
        }
        self.promoted_entry(index, word)
    }

    #[cold]
    #[inline(never)]
    fn promoted_entry(&self, index: usize, word: SlotWord) -> Option<&Promoted> {
        let hot = self.hot.as_deref()?;
        let entry = usize::try_from(word.state & !MARK).ok()?;
        // The entry was set before the Release exchange that wrote the marker, and the marker was
        // read with Acquire (`load`, or a failed `exchange`), so it is visible here.
        let promoted = hot.entries.get(entry)?.get()?;
        (promoted.slot == index && promoted.hash_part == word.hash_part()).then_some(&**promoted)
    }

    /// A failed admission exchange on slot `index` at `now` (the only caller is `apply`'s failure
    /// path): counts it and promotes the slot's key once it is hot.
    #[cold]
    #[inline(never)]
    pub(crate) fn note_contention(&self, index: usize, now: Nanos) {
        let Some(hot) = self.hot.as_deref() else {
            return;
        };
        if hot.count_failure(index, now) {
            if let Some(_guard) = try_lock(&self.stripes[index / self.slots_per_stripe].insert) {
                self.promote_locked(hot, index);
            }
        }
    }

    /// A decision on a promoted key whose slot `index` holds `word`; `reserve` units of headroom.
    /// `None` when the key cooled and was demoted: the caller decides on the slot again.
    #[cold]
    #[inline(never)]
    pub(crate) fn decide_promoted(
        &self,
        promoted: &Promoted,
        index: usize,
        word: SlotWord,
        now: Nanos,
        cost: u64,
        reserve: u64,
    ) -> Option<Result<Decision, CheckError>> {
        let limiter = &promoted.limiter;
        let cool_after = self.hot.as_deref().map_or(0, |hot| hot.config.cool_after);
        if limiter.is_idle_at(now, cool_after) {
            if let Some(_guard) = try_lock(&self.stripes[index / self.slots_per_stripe].insert) {
                // Cooled (bucket full): carried back exactly (module docs).
                self.demote_locked(index, word, promoted, now);
                return None;
            }
        }
        if reserve == 0 {
            return Some(limiter.check_at(now, cost));
        }
        Some(reserving(limiter, now, cost, reserve))
    }

    /// Promotes the key in slot `index` (the stripe lock held). Whether it was promoted.
    fn promote_locked(&self, hot: &HotTable, index: usize) -> bool {
        let mut word = self.load(index);
        if !self.promotable(word) {
            return false;
        }
        let quota = *self.resolve(word).0.quota();
        let mut config = StripedConfig::default();
        if let Some(stripes) = hot.config.stripes {
            config = config.stripes(stripes);
        }
        let Ok(limiter) = StripedLimiter::with_config(quota, config, ManualClock::new()) else {
            return false;
        };
        let Some(entry) = hot.claim() else {
            return false;
        };
        limiter.raise_shared_tat(word.state);
        let promoted = Box::new(Promoted {
            limiter,
            slot: index,
            hash_part: word.hash_part(),
        });
        if hot.entries[entry].set(promoted).is_err() {
            return false;
        }
        let Some(promoted) = hot.entries[entry].get() else {
            return false;
        };
        loop {
            // `replace` is Release: a reader that sees the marker sees the entry and the raised
            // shared word.
            if self.replace(index, word, word.with_state(marker(entry))) {
                return true;
            }
            // Only lock-free admissions, refunds and charges write a promotable word while we hold
            // the stripe lock: carry the newer TAT (never lowered) and try again.
            word = self.load(index);
            if !self.promotable(word) || word.hash_part() != promoted.hash_part {
                return false;
            }
            promoted.limiter.raise_shared_tat(word.state);
        }
    }

    /// Whether `word` holds a key that may be promoted now: not a marker, and in the tier of the
    /// quota it is decided under (a word awaiting a default change's carry-over is left to it).
    fn promotable(&self, word: SlotWord) -> bool {
        !word.is_empty() && !is_marker(word.state) && self.resolve(word).1 == word
    }

    /// Demotes the promoted key in slot `index`, whose word was `word` (the stripe lock held): retires
    /// its limiter and writes the limiter's TAT back. Whether it demoted.
    fn demote_locked(&self, index: usize, word: SlotWord, promoted: &Promoted, now: Nanos) -> bool {
        if self.load(index) != word {
            return false;
        }
        let tat = promoted.limiter.retire(now);
        let mut current = word;
        loop {
            // Nobody else rewrites a marker (module docs): this succeeds first time; a loop for the
            // form, as `cas_loop` callers are.
            match self.exchange(index, current, current.with_state(tat)) {
                Ok(_) => break,
                Err(found) if found.hash_part() == word.hash_part() && is_marker(found.state) => {
                    current = found;
                }
                Err(_) => return false,
            }
        }
        if let Some(hot) = self.hot.as_deref() {
            // Relaxed: a monitoring count.
            hot.demoted.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Demotes every promoted key (every stripe lock held): before a default quota change.
    pub(crate) fn demote_all_locked(&self, now: Nanos) {
        let Some(hot) = self.hot.as_deref() else {
            return;
        };
        // Relaxed: entries claimed later than this read are published by their own Release
        // exchange, which needs a stripe lock we hold: there are none.
        let claimed = hot.claimed.load(Ordering::Relaxed).min(hot.entries.len());
        for entry in &hot.entries[..claimed] {
            if let Some(promoted) = entry.get() {
                let word = self.load(promoted.slot);
                if self
                    .promoted(promoted.slot, word)
                    .is_some_and(|p| std::ptr::eq(p, &**promoted))
                {
                    self.demote_locked(promoted.slot, word, promoted, now);
                }
            }
        }
    }

    /// Demotes `key` if it is promoted in the window at `place` (its stripe lock held): before an
    /// override change of the key.
    pub(crate) fn demote_at_locked(&self, place: Place, now: Nanos) {
        if self.hot.is_none() {
            return;
        }
        if let Scan::Found(index, word) = self.scan(place, None, None) {
            if let Some(promoted) = self.promoted(index, word) {
                self.demote_locked(index, word, promoted, now);
            }
        }
    }

    /// Promotes `key` now, as detection would: its slot's state moves to a new striped limiter
    /// continuing its timeline. Whether it was promoted (`false`: promotion is off, the key is not
    /// in the table, already promoted, or every promotion entry is used).
    pub fn promote_key<Q>(&self, key: &Q) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + ?Sized,
    {
        use std::hash::BuildHasher;
        let Some(hot) = self.hot.as_deref() else {
            return false;
        };
        let place = self.place(self.hasher.hash_one(key));
        let _guard = lock(&self.stripes[place.stripe].insert);
        match self.scan(place, None, None) {
            Scan::Found(index, _) => self.promote_locked(hot, index),
            Scan::Missing { .. } => false,
        }
    }

    /// Demotes `key` at `now` if it is promoted: its striped limiter is retired and its TAT written
    /// back to the slot (units its stripes still hold are dropped unless the key had cooled). Whether
    /// it was promoted.
    pub fn demote_key_at<Q>(&self, key: &Q, now: Nanos) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + ?Sized,
    {
        use std::hash::BuildHasher;
        let place = self.place(self.hasher.hash_one(key));
        let _guard = lock(&self.stripes[place.stripe].insert);
        match self.scan(place, None, None) {
            Scan::Found(index, word) => self
                .promoted(index, word)
                .is_some_and(|promoted| self.demote_locked(index, word, promoted, now)),
            Scan::Missing { .. } => false,
        }
    }

    /// Keys promoted now (promotions minus demotions; 0 when promotion is off).
    pub fn promoted_keys(&self) -> usize {
        self.hot.as_deref().map_or(0, |hot| {
            // Relaxed: a monitoring figure; an entry claimed but not yet published is skipped by
            // the marker test below.
            let claimed = hot.claimed.load(Ordering::Relaxed).min(hot.entries.len());
            hot.entries[..claimed]
                .iter()
                .filter_map(|entry| entry.get())
                .filter(|p| {
                    self.promoted(p.slot, self.load(p.slot))
                        .is_some_and(|q| std::ptr::eq(q, &***p))
                })
                .count()
        })
    }

    /// Promotion entries used over the table's lifetime (at most
    /// [`HotKeyConfig::max_promotions`](crate::HotKeyConfig::max_promotions); an attempt whose
    /// key changed under it uses one too).
    pub fn promotions(&self) -> usize {
        // Relaxed: a monitoring figure.
        self.hot
            .as_deref()
            .map_or(0, |hot| hot.claimed.load(Ordering::Relaxed))
    }
}

/// A reserving decision on a promoted key: the probe `cost + reserve` by a peek, then `cost` taken
/// (as [`Algorithm::decide_reserving`], but in two steps: the headroom is best-effort, the quota
/// bound exact).
fn reserving(
    limiter: &StripedLimiter<ManualClock>,
    now: Nanos,
    cost: u64,
    reserve: u64,
) -> Result<Decision, CheckError> {
    let burst = limiter.gcra().quota().burst();
    let Some(probe) = cost.checked_add(reserve).filter(|&probe| probe <= burst) else {
        let reset_after = limiter.peek_at(now, cost)?.reset_after();
        return Ok(Decision::Denied {
            retry_after: Decision::NEVER,
            reset_after,
        });
    };
    let probed = limiter.peek_at(now, probe)?;
    if !probed.is_allowed() {
        return Ok(probed);
    }
    let mut decision = limiter.check_at(now, cost)?;
    if let Decision::Allowed { remaining, .. } = &mut decision {
        *remaining = remaining.saturating_sub(reserve);
    }
    Ok(decision)
}

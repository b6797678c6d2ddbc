//! One atomic state word and the one CAS loop that applies an algorithm to it.
//!
//! # Ordering
//! Every access is `Relaxed`. The word publishes no other memory — a decision depends only on the
//! word's own value — and all read-modify-writes of one atomic location are totally ordered by its
//! modification order (coherence), whatever their ordering argument. So concurrent admissions are
//! each applied exactly once, in some total order, and a thread that learns of another's admission
//! by any synchronising means (a join, a channel) then reads a state at least that new. Stronger
//! orderings would buy nothing and cost fences on weakly ordered CPUs. The loom models in
//! `loom-tests/` explore these interleavings.

use crate::algorithm::{Algorithm, Transition};
use crate::clock::Nanos;
use crate::decision::{CheckError, Decision};
use crate::sync::{AtomicU64, Ordering};

/// A limiter's whole state: one `u64` word interpreted by an [`Algorithm`].
///
/// This is what a single limiter wraps in a `CachePadded`, and what a keyed table stores per key
/// (8 bytes). A fresh state is `0`.
#[derive(Debug, Default)]
pub struct AtomicState(AtomicU64);

impl AtomicState {
    /// A state holding `word` (0 for fresh).
    pub fn new(word: u64) -> Self {
        AtomicState(AtomicU64::new(word))
    }

    /// The current word.
    #[inline]
    pub fn load(&self) -> u64 {
        // Relaxed: see the module's ordering notes.
        self.0.load(Ordering::Relaxed)
    }

    /// Decides `cost` at `now` and, if the algorithm says so, stores the new word.
    ///
    /// One load, then a `compare_exchange_weak` only when the decision writes; a failed exchange
    /// re-decides against the value it found (no reload), so no admission is lost and none is counted
    /// twice. A denial writes nothing.
    ///
    /// # Errors
    /// [`CheckError`] from the algorithm (cost above capacity), before anything is written.
    #[inline]
    pub fn apply<A: Algorithm>(
        &self,
        algorithm: &A,
        now: Nanos,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        self.update(self.load(), |word| {
            let Transition { decision, next } = algorithm.decide(word, now, cost)?;
            Ok((decision, next))
        })
        .map(|(decision, _)| decision)
    }

    /// [`apply`](Self::apply) with headroom ([`Algorithm::decide_reserving`]): admits only if
    /// `reserve` more units would still fit afterwards. The same loop; a denial writes nothing.
    ///
    /// # Errors
    /// As [`apply`](Self::apply).
    #[inline]
    pub fn apply_reserving<A: Algorithm>(
        &self,
        algorithm: &A,
        now: Nanos,
        cost: u64,
        reserve: u64,
    ) -> Result<Decision, CheckError> {
        self.update(self.load(), |word| {
            let Transition { decision, next } =
                algorithm.decide_reserving(word, now, cost, reserve)?;
            Ok((decision, next))
        })
        .map(|(decision, _)| decision)
    }

    /// The CAS loop itself, for any pure transition: `transition(word)` returns a result and the word
    /// to store (`None`: store nothing). Starting from `current`, it retries against the value a failed
    /// exchange found, and returns the result with the word it was based on (or wrote).
    ///
    /// # Errors
    /// Whatever `transition` returns, before anything is written.
    #[inline]
    pub fn update<T, E>(
        &self,
        current: u64,
        transition: impl FnMut(u64) -> Result<(T, Option<u64>), E>,
    ) -> Result<(T, u64), E> {
        cas_loop(current, transition, |current, next| {
            // Relaxed on both paths: the exchange itself is the whole synchronisation (see the module
            // notes); on failure we re-decide against `actual` instead of reloading.
            self.0
                .compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed)
                .map(drop)
        })
    }

    /// Gives back an admission of `cost` units decided at `now` (see [`Algorithm::refund`]), through
    /// the same CAS loop as [`apply`](Self::apply): a concurrent admission in between is re-read, not
    /// overwritten. Returns whether a word was written.
    #[inline]
    pub fn refund<A: Algorithm>(&self, algorithm: &A, now: Nanos, cost: u64) -> bool {
        let result: Result<(bool, u64), std::convert::Infallible> =
            self.update(self.load(), |word| {
                let next = algorithm
                    .refund(word, now, cost)
                    .filter(|&next| next != word);
                Ok((next.is_some(), next))
            });
        match result {
            Ok((written, _)) => written,
            Err(never) => match never {},
        }
    }

    /// Counts `cost` units at `now` without a decision (see [`Algorithm::charge`]: a settlement's
    /// overdraft), through the same CAS loop as [`apply`](Self::apply). Returns whether a word was
    /// written.
    #[inline]
    pub fn charge<A: Algorithm>(&self, algorithm: &A, now: Nanos, cost: u64) -> bool {
        let result: Result<(bool, u64), std::convert::Infallible> =
            self.update(self.load(), |word| {
                let next = algorithm
                    .charge(word, now, cost)
                    .filter(|&next| next != word);
                Ok((next.is_some(), next))
            });
        match result {
            Ok((written, _)) => written,
            Err(never) => match never {},
        }
    }

    /// What [`apply`](Self::apply) would decide, without writing.
    ///
    /// # Errors
    /// As [`apply`](Self::apply).
    #[inline]
    pub fn peek<A: Algorithm>(
        &self,
        algorithm: &A,
        now: Nanos,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        algorithm
            .decide(self.load(), now, cost)
            .map(|transition| transition.decision)
    }
}

/// The one compare-and-swap loop every storage shares, over any cell word `W` (this module's `u64`,
/// the keyed table's 128-bit (tag, state) pair).
///
/// Starting from `current`, `transition(word)` gives a result and the word to store (`None`: store
/// nothing, as a denial must). A word equal to the one read is not written either. `exchange(old,
/// new)` is the cell's compare-and-swap: `Ok` once `new` is stored, `Err(actual)` with the word found
/// instead, against which the loop decides again (no reload), so no admission is lost and none is
/// counted twice. Returns the result with the word it was based on, or wrote. A `transition` error
/// ends the loop before anything is written (the keyed table also uses it to stop when `actual`
/// belongs to another key).
///
/// The orderings are the cell's business: `exchange` chooses them, and its own docs argue them.
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use tollgate_core::state::cas_loop;
///
/// // A counter that admits while below 3: the same loop over a cell of another width.
/// let cell = AtomicU32::new(2);
/// let admit = |count: u32| Ok::<_, ()>((count < 3, (count < 3).then_some(count + 1)));
/// let exchange = |old, new| {
///     cell.compare_exchange(old, new, Ordering::Relaxed, Ordering::Relaxed).map(drop)
/// };
/// assert_eq!(cas_loop(cell.load(Ordering::Relaxed), admit, exchange), Ok((true, 3)));
/// assert_eq!(cas_loop(cell.load(Ordering::Relaxed), admit, exchange), Ok((false, 3)));
/// ```
///
/// # Errors
/// Whatever `transition` returns, before anything is written.
#[inline(always)]
pub fn cas_loop<W: Copy + PartialEq, T, E>(
    mut current: W,
    mut transition: impl FnMut(W) -> Result<(T, Option<W>), E>,
    mut exchange: impl FnMut(W, W) -> Result<(), W>,
) -> Result<(T, W), E> {
    loop {
        let (result, next) = transition(current)?;
        let Some(next) = next.filter(|&next| next != current) else {
            return Ok((result, current));
        };
        match exchange(current, next) {
            Ok(()) => return Ok((result, next)),
            Err(actual) => current = actual,
        }
    }
}

//! [`KeyedLimiter::check_keys`]: decisions for a stream of keys, each key's slot requested from
//! memory a few keys before it is decided, so that the lookups' memory latency overlaps.

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::iter::FusedIterator;
use std::marker::PhantomData;

use tollgate_core::{Algorithm, CheckError, Clock, Decision};

use crate::headroom::Plain;
use crate::limiter::{KeyedLimiter, Place};

impl<K: ?Sized, A: Algorithm, C: Clock> KeyedLimiter<K, A, C> {
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
}

/// How many keys [`KeyedLimiter::check_keys`] locates and prefetches ahead of the one it decides.
///
/// With one memory round trip per lookup, up to this many round trips are in flight at once; 8 covers
/// the ≈ 150 ns DRAM latency of a VM at ≈ 20 ns of work per decision, and stays well inside the CPU's
/// fill buffers.
pub const CHECK_KEYS_LOOKAHEAD: usize = 8;

/// The iterator returned by [`KeyedLimiter::check_keys`]: one `Result<Decision, CheckError>` per key,
/// in order.
pub struct CheckKeys<'l, 'q, K: ?Sized, Q: ?Sized, A, C, I> {
    limiter: &'l KeyedLimiter<K, A, C>,
    keys: std::iter::Fuse<I>,
    cost: u64,
    /// Keys located and prefetched but not yet decided: `len` of them from `head`, wrapping.
    pending: [Place; CHECK_KEYS_LOOKAHEAD],
    head: usize,
    len: usize,
    _key: PhantomData<&'q Q>,
}

impl<'l, K: ?Sized, Q: ?Sized, A, C, I: Iterator> CheckKeys<'l, '_, K, Q, A, C, I> {
    pub(crate) fn new(limiter: &'l KeyedLimiter<K, A, C>, keys: I, cost: u64) -> Self {
        CheckKeys {
            limiter,
            keys: keys.fuse(),
            cost,
            pending: [Place::default(); CHECK_KEYS_LOOKAHEAD],
            head: 0,
            len: 0,
            _key: PhantomData,
        }
    }
}

impl<'q, K, Q, A, C, I> Iterator for CheckKeys<'_, 'q, K, Q, A, C, I>
where
    K: Borrow<Q> + ?Sized,
    Q: Hash + ?Sized + 'q,
    A: Algorithm,
    C: Clock,
    I: Iterator<Item = &'q Q>,
{
    type Item = Result<Decision, CheckError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        while self.len < CHECK_KEYS_LOOKAHEAD {
            let Some(key) = self.keys.next() else { break };
            self.pending[(self.head + self.len) % CHECK_KEYS_LOOKAHEAD] = self.limiter.locate(key);
            self.len += 1;
        }
        if self.len == 0 {
            return None;
        }
        let place = self.pending[self.head];
        self.head = (self.head + 1) % CHECK_KEYS_LOOKAHEAD;
        self.len -= 1;
        let now = self.limiter.now();
        Some(self.limiter.decide(place, None, now, self.cost, Plain))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let (low, high) = self.keys.size_hint();
        (
            low.saturating_add(self.len),
            high.and_then(|high| high.checked_add(self.len)),
        )
    }
}

impl<'q, K, Q, A, C, I> FusedIterator for CheckKeys<'_, 'q, K, Q, A, C, I>
where
    K: Borrow<Q> + ?Sized,
    Q: Hash + ?Sized + 'q,
    A: Algorithm,
    C: Clock,
    I: Iterator<Item = &'q Q>,
{
}

impl<K: ?Sized, Q: ?Sized, A, C, I> fmt::Debug for CheckKeys<'_, '_, K, Q, A, C, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckKeys")
            .field("cost", &self.cost)
            .field("pending", &self.len)
            .finish_non_exhaustive()
    }
}

//! [`Reloadable`]: an algorithm whose quota a reload can change while its state words stay where
//! they are.

use std::fmt;
use std::sync::Arc;

use tollgate_core::{Algorithm, CheckError, Nanos, Quota, QuotaError, Transition};

use crate::sync::{AtomicUsize, Ordering};

/// The generations of one rule's parameters: every quota it has had, in order, and which is current.
///
/// Entries are only appended and never move (`boxcar`), so a decision borrows the current one with no
/// lock and no reference count. A reload that changes a rule's quota appends one entry (about a
/// hundred bytes) that lives as long as the rule does.
struct Generations<A> {
    list: boxcar::Vec<A>,
    current: AtomicUsize,
}

/// An [`Algorithm`] whose parameters can be replaced while limiters built on it keep their state
/// words: what lets [`Policy::reload`](crate::Policy::reload) change a rule's quota for keys already
/// in its table without handing them a fresh burst.
///
/// A state word written under one quota is read under the next as it stands: for GCRA and the leaky
/// bucket the word is the instant the key's bucket is full again, so a key keeps its debt *in time*
/// (a key that just spent its burst stays empty until its old full-again instant, then refills at the
/// new rate; it can never be handed more than the new quota's burst). The window algorithms keep
/// their counts, compared against the new limit; a window *length* change makes a new state layout,
/// so the policy treats it as a new rule (see [`Policy::reload`](crate::Policy::reload)).
///
/// Clones share the generations.
pub struct Reloadable<A> {
    generations: Arc<Generations<A>>,
}

impl<A> Clone for Reloadable<A> {
    fn clone(&self) -> Self {
        Reloadable {
            generations: Arc::clone(&self.generations),
        }
    }
}

impl<A: Algorithm> Reloadable<A> {
    /// Wraps `algorithm` as the first generation.
    pub fn new(algorithm: A) -> Self {
        let list = boxcar::Vec::new();
        list.push(algorithm);
        Reloadable {
            generations: Arc::new(Generations {
                list,
                current: AtomicUsize::new(0),
            }),
        }
    }

    /// The parameters decisions use now.
    #[inline]
    pub fn current(&self) -> &A {
        // Acquire: pairs with the Release store in `replace`, so the entry it names is fully
        // written before we read it (boxcar's own entry flag makes this doubly sure).
        let index = self.generations.current.load(Ordering::Acquire);
        let list = &self.generations.list;
        match list.get(index) {
            Some(algorithm) => algorithm,
            // Unreachable (entries are pushed before they are named); the first generation is always
            // there, so this never panics.
            None => &list[0],
        }
    }

    /// Makes `algorithm` current for every limiter sharing these generations.
    pub fn replace(&self, algorithm: A) {
        let index = self.generations.list.push(algorithm);
        // Release: publishes the pushed entry to the Acquire load in `current`.
        self.generations.current.store(index, Ordering::Release);
    }
}

impl<A: Algorithm + fmt::Debug> fmt::Debug for Reloadable<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Reloadable").field(self.current()).finish()
    }
}

impl<A: Algorithm> Algorithm for Reloadable<A> {
    const NAME: &'static str = A::NAME;

    fn from_quota(quota: Quota) -> Result<Self, QuotaError> {
        A::from_quota(quota).map(Reloadable::new)
    }

    fn quota(&self) -> &Quota {
        self.current().quota()
    }

    #[inline]
    fn capacity(&self) -> u64 {
        self.current().capacity()
    }

    #[inline]
    fn decide(&self, state: u64, now: Nanos, cost: u64) -> Result<Transition, CheckError> {
        self.current().decide(state, now, cost)
    }

    #[inline]
    fn is_fresh(&self, state: u64, now: Nanos) -> bool {
        self.current().is_fresh(state, now)
    }

    #[inline]
    fn refund(&self, state: u64, now: Nanos, cost: u64) -> Option<u64> {
        self.current().refund(state, now, cost)
    }
}

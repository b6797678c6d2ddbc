//! Leaky bucket as a meter (policing): water drains at the quota's rate; a request adds `cost` units
//! of water and is refused if the bucket would overflow its capacity.
//!
//! Stored as the instant the bucket will be empty, `empty_at`; the water level at `now` is
//! `(empty_at - now) / T`. Admitting `cost` is allowed iff `level + cost ≤ capacity`, i.e. iff
//! `max(empty_at, now) + cost × T ≤ now + capacity × T` — which is, term for term, GCRA's test with
//! `empty_at` as the TAT. The continuous-state leaky bucket and GCRA are the same algorithm (ITU-T
//! I.371 states the equivalence), so this type reuses GCRA's arithmetic; the property tests check it
//! against a plain water-level model. For the shaping role (callers wait for their slot instead of
//! being refused) see [`Shaper`](crate::Shaper).

use crate::algorithm::gcra::Gcra;
use crate::algorithm::{Algorithm, Transition};
use crate::clock::Nanos;
use crate::decision::CheckError;
use crate::quota::{Quota, QuotaError};

/// Leaky bucket meter: capacity `quota.burst()` units, draining one unit every
/// `quota.emission_interval()`.
///
/// State word: the instant the bucket is empty, in [`Nanos`] (0 = fresh). `remaining` is the free
/// room in the bucket. Memory: 8 bytes per limiter or key.
///
/// ```
/// use tollgate_core::{algorithm::Algorithm, LeakyBucket, Quota};
/// let bucket = LeakyBucket::from_quota(Quota::per_second(2)?.with_burst(3)?)?;
/// let t = bucket.decide(0, 0, 3)?; // fill it
/// assert_eq!(t.decision.remaining(), 0);
/// let t = bucket.decide(t.next.unwrap(), 0, 1)?;
/// assert_eq!(t.decision.retry_after(), Some(std::time::Duration::from_millis(500)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeakyBucket(Gcra);

impl Algorithm for LeakyBucket {
    const NAME: &'static str = "leaky_bucket";

    fn from_quota(quota: Quota) -> Result<Self, QuotaError> {
        Gcra::from_quota(quota).map(LeakyBucket)
    }

    fn quota(&self) -> &Quota {
        self.0.quota()
    }

    #[inline]
    fn capacity(&self) -> u64 {
        self.0.capacity()
    }

    /// `empty_at` plays GCRA's TAT (see the module docs for the equivalence).
    #[inline]
    fn decide(&self, empty_at: u64, now: Nanos, cost: u64) -> Result<Transition, CheckError> {
        self.0.decide(empty_at, now, cost)
    }

    #[inline]
    fn is_fresh(&self, empty_at: u64, now: Nanos) -> bool {
        self.0.is_fresh(empty_at, now)
    }

    /// Pours the water back out: GCRA's refund on `empty_at`.
    #[inline]
    fn refund(&self, empty_at: u64, now: Nanos, cost: u64) -> Option<u64> {
        self.0.refund(empty_at, now, cost)
    }

    /// Pours `cost` units in whatever the level (GCRA's charge on `empty_at`): an overflowing
    /// bucket admits nothing until it has drained below its capacity again.
    #[inline]
    fn charge(&self, empty_at: u64, now: Nanos, cost: u64) -> Option<u64> {
        self.0.charge(empty_at, now, cost)
    }
}

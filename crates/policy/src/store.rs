//! Where rules keep their state. The engine ([`crate::engine`]) decides every request against one
//! store through these traits, so the rule semantics (atomic over a request's rules, shadow, the
//! two-stage delay, which rule decides) are written once:
//!
//! * [`Store`]: in-process state answered synchronously ([`MemoryStore`]: keyed tables, atomic
//!   words and striped limiters, one per rule).
//! * [`AsyncStore`]: state behind a network round trip (Redis, per request or leased; the
//!   `redis` feature).
//!
//! Both decide one rule for one key at a time with check / peek / refund. A store that cannot
//! answer (Redis down) applies its own failure policy: a denial (fail closed) or `None` (fail
//! open: the rule does not apply to this request).

#[cfg(feature = "redis")]
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{CheckError, Decision, Nanos, Quota};

use crate::config::AlgorithmKind;
use crate::limiter::{Receipt, RuleLimiter};

/// One rule applied to one request's key: what a store decides against.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct RuleKey<'a> {
    /// The rule's position in its rule set: stores index their per-rule state by it.
    pub index: usize,
    /// The rule's name.
    pub rule: &'static str,
    /// Its algorithm.
    pub algorithm: AlgorithmKind,
    /// The quota for this key: its override, or the rule's effective quota.
    pub quota: Quota,
    /// The key bytes: empty for a global rule; length-prefixed values when `composite`.
    pub key: &'a [u8],
    /// Whether the key is made of several descriptors (binary, not always UTF-8).
    pub composite: bool,
    /// Units this request must leave in the key's quota for higher priority classes (0: none).
    pub reserve: u64,
    /// The request's value of the rule set's hash tag descriptor, for a rule keyed by it (a Redis
    /// store puts it in a hash tag so that a request's keys share one cluster slot); `None`
    /// otherwise.
    pub tag: Option<&'a str>,
}

/// In-process state, answered without waiting.
pub(crate) trait Store {
    /// What a refund needs besides the key.
    type Receipt: Copy;
    /// Decides `cost` units and records an admission.
    fn check(
        &self,
        at: &RuleKey<'_>,
        now: Nanos,
        cost: u64,
    ) -> Result<Option<(Decision, Self::Receipt)>, CheckError>;
    /// Decides `cost` units without recording anything.
    fn peek(&self, at: &RuleKey<'_>, now: Nanos, cost: u64)
    -> Result<Option<Decision>, CheckError>;
    /// Gives an admission of `cost` units back.
    fn refund(&self, at: &RuleKey<'_>, now: Nanos, cost: u64, receipt: Self::Receipt);
    /// [`refund`](Self::refund) of rule `index`'s admission where its receipt alone says where
    /// it goes (no key to build): `false` when the receipt does not, and nothing was done.
    #[inline]
    fn refund_by_receipt(
        &self,
        index: usize,
        now: Nanos,
        cost: u64,
        receipt: Self::Receipt,
    ) -> bool {
        let _ = (index, now, cost, receipt);
        false
    }
    /// How long until more than an admission's `remaining` units pass (the `RateLimit` field's
    /// `t`); `None` when unknown or not limited.
    fn next_unit(&self, at: &RuleKey<'_>, now: Nanos, decision: &Decision) -> Option<Duration>;
}

#[cfg(feature = "redis")]
/// State behind a round trip. The same contract as [`Store`]; `now: None` reads the store's own
/// clock (Redis's `TIME`), `Some` is for simulation and tests.
pub(crate) trait AsyncStore: Sync {
    /// What a refund needs besides the key.
    type Receipt: Copy + Default + Send + Sync;
    /// As [`Store::check`].
    fn check(
        &self,
        at: &RuleKey<'_>,
        now: Option<Nanos>,
        cost: u64,
    ) -> impl Future<Output = Result<Option<(Decision, Self::Receipt)>, CheckError>> + Send;
    /// As [`Store::peek`].
    fn peek(
        &self,
        at: &RuleKey<'_>,
        now: Option<Nanos>,
        cost: u64,
    ) -> impl Future<Output = Result<Option<Decision>, CheckError>> + Send;
    /// As [`Store::refund`].
    fn refund(
        &self,
        at: &RuleKey<'_>,
        now: Option<Nanos>,
        cost: u64,
        receipt: Self::Receipt,
    ) -> impl Future<Output = ()> + Send;
    /// As [`Store::next_unit`], from the admission alone (no round trip): rule `index`'s limiter
    /// for `quota` (the key's, as the tally kept it), so no key is built again.
    fn next_unit(&self, index: usize, quota: &Quota, decision: &Decision) -> Option<Duration>;

    /// Whether [`check_batch`](Self::check_batch) can answer at all: `false` (lease mode) lets the
    /// engine skip building a batch (every rule's key, copied) that the store would refuse.
    fn batches(&self) -> bool {
        true
    }

    /// Decides every rule of one request in one round trip, atomically: each `(rule, enforced)`
    /// checked (or peeked) at one instant, and every admission written only when every enforcing
    /// rule admits. Per rule as [`check`](Self::check) answers (`None`: the store failed open for
    /// it). `Err((i, _))`: enforcing rule `i` can never admit `cost`; nothing was written. `None`:
    /// this store has no such call (the engine then goes rule by rule, refunding on a denial).
    fn check_batch(
        &self,
        rules: &[(RuleKey<'_>, bool)],
        now: Option<Nanos>,
        cost: u64,
    ) -> impl Future<Output = Option<BatchAnswer>> + Send;
}

/// Per rule of a batch, its decision (`None`: failed open), or the enforcing rule whose cost can
/// never be admitted.
#[cfg(feature = "redis")]
pub(crate) type BatchAnswer = Result<Vec<Option<Decision>>, (usize, CheckError)>;

/// In-process state: one limiter per rule (a bounded keyed table, an atomic word or a striped
/// limiter), indexed like the rule set.
pub(crate) struct MemoryStore {
    pub(crate) limiters: Box<[Arc<dyn RuleLimiter>]>,
}

impl Store for MemoryStore {
    type Receipt = Receipt;

    #[inline]
    fn check(
        &self,
        at: &RuleKey<'_>,
        now: Nanos,
        cost: u64,
    ) -> Result<Option<(Decision, Receipt)>, CheckError> {
        let limiter = &self.limiters[at.index];
        // Most rules keep no headroom: their plain check skips the reserving path's test.
        if at.reserve == 0 {
            limiter.check(at.key, now, cost)
        } else {
            limiter.check_reserving(at.key, now, cost, at.reserve)
        }
        .map(Some)
    }

    #[inline]
    fn peek(
        &self,
        at: &RuleKey<'_>,
        now: Nanos,
        cost: u64,
    ) -> Result<Option<Decision>, CheckError> {
        self.limiters[at.index].peek(at.key, now, cost).map(Some)
    }

    #[inline]
    fn refund(&self, at: &RuleKey<'_>, now: Nanos, cost: u64, receipt: Receipt) {
        self.limiters[at.index].refund(at.key, now, cost, receipt);
    }

    #[inline]
    fn refund_by_receipt(&self, index: usize, now: Nanos, cost: u64, receipt: Receipt) -> bool {
        self.limiters[index].refund_by_receipt(now, cost, receipt)
    }

    #[inline]
    fn next_unit(&self, at: &RuleKey<'_>, now: Nanos, decision: &Decision) -> Option<Duration> {
        if let Some(known) = next_unit(at.algorithm, &at.quota, decision) {
            return known;
        }
        // The sliding window's next unit depends on the previous window's weight: ask the slot.
        let more = decision.remaining().checked_add(1)?;
        self.limiters[at.index]
            .peek(at.key, now, more)
            .ok()
            .and_then(|peeked| peeked.retry_after())
    }
}

/// How long until more than an admission's `remaining` units pass, worked out from the admission
/// alone (no second look at the state): `Some(None)` when `remaining + 1` would pass now or never
/// can, `Some(Some(wait))` otherwise. Exact for the buckets (`reset_after` is how far the bucket
/// runs ahead of now, so `remaining + 1` units fit once it has drained to
/// `depth − (remaining + 1) × T`) and for the fixed window (its end). `None` for the sliding window,
/// whose next unit depends on the previous window's weight.
#[inline]
pub(crate) fn next_unit(
    algorithm: AlgorithmKind,
    quota: &Quota,
    decision: &Decision,
) -> Option<Option<Duration>> {
    let Decision::Allowed {
        remaining,
        reset_after,
    } = *decision
    else {
        return Some(None);
    };
    match algorithm {
        AlgorithmKind::Gcra | AlgorithmKind::LeakyBucket => {
            let Some(more) = remaining.checked_add(1).filter(|&m| m <= quota.burst()) else {
                return Some(None);
            };
            let interval = u128::from(quota.emission_interval_nanos());
            let wait = (reset_after.as_nanos() + u128::from(more) * interval)
                .saturating_sub(u128::from(quota.burst_nanos()));
            Some((wait > 0).then(|| Duration::from_nanos(u64::try_from(wait).unwrap_or(u64::MAX))))
        }
        AlgorithmKind::FixedWindow => {
            Some((remaining < quota.limit() && !reset_after.is_zero()).then_some(reset_after))
        }
        AlgorithmKind::SlidingWindow => None,
    }
}

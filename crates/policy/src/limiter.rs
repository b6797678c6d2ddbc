//! One interface over the three storages a rule may use, so the decision loop is not generic over
//! every (algorithm, storage) pair.

use tollgate_core::{
    Algorithm, CheckError, Clock, Decision, FixedWindow, Gcra, LeakyBucket, Limiter, Nanos, Quota,
    SlidingWindow,
};
use tollgate_sharded::{KeyedError, KeyedLimiter, MIN_WINDOW};
use tollgate_striped::{LeaseReceipt, StripedConfig, StripedLimiter};

use crate::config::{AlgorithmKind, ConfigErrorKind, Storage};

/// What a refund needs besides the key: where a striped admission's units came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Receipt {
    #[default]
    Plain,
    Striped(LeaseReceipt),
}

/// A rule's limiter, keyed or global. `key` is ignored by global limiters.
pub(crate) trait RuleLimiter: Send + Sync {
    fn check(&self, key: &[u8], now: Nanos, cost: u64) -> Result<(Decision, Receipt), CheckError>;
    fn peek(&self, key: &[u8], now: Nanos, cost: u64) -> Result<Decision, CheckError>;
    fn refund(&self, key: &[u8], now: Nanos, cost: u64, receipt: Receipt);
    /// Decisions made by a keyed table's shared overflow states.
    fn overflow_decisions(&self) -> u64 {
        0
    }
    /// Makes `quota` the default from now on, every key's state carried over as-is in units. `false`:
    /// this storage cannot (striped: the policy rebuilds it and calls `take_over`).
    fn set_quota(&self, quota: Quota) -> bool;
    fn set_override(&self, _key: &[u8], _quota: Quota) -> Result<(), KeyedError> {
        Err(KeyedError::WindowFull)
    }
    fn remove_override(&self, _key: &[u8]) -> bool {
        false
    }
    /// Keeps `key` in a keyed table (unevictable) until `unpin_key`, so that a later
    /// `set_override` cannot fail for want of room. Global limiters have no keys.
    fn pin_key(&self, _key: &[u8]) -> Result<(), KeyedError> {
        Ok(())
    }
    fn unpin_key(&self, _key: &[u8]) {}
    /// Whether overrides with these quotas would find tiers (see
    /// `KeyedLimiter::check_override_quotas`).
    fn check_override_quotas(&self, _quotas: &[Quota]) -> Result<(), KeyedError> {
        Ok(())
    }
    /// A striped limiter being replaced: stops granting from its shared word (decisions still
    /// running on it deny) and returns that word and its quota.
    fn retire(&self, _at: Nanos) -> Option<(Nanos, Quota)> {
        None
    }
    /// A rebuilt (striped) limiter, not yet published, takes over `old`'s state at `at`: `old` is
    /// retired and its shared word carried over as-is in units.
    fn take_over(&self, _old: &dyn RuleLimiter, _at: Nanos) {}
}

/// A keyed rule, or a global rule on `atomic` storage: a table of one key (the empty one), so that
/// both change their quota the same way (`KeyedLimiter::set_default`: each key's state carried over
/// as-is in units, exact under concurrent decisions, since the slot's tier says which quota wrote it).
struct Keyed<A, C> {
    limiter: KeyedLimiter<[u8], A, C>,
}

impl<A: Algorithm, C: Clock> RuleLimiter for Keyed<A, C> {
    #[inline]
    fn check(&self, key: &[u8], now: Nanos, cost: u64) -> Result<(Decision, Receipt), CheckError> {
        self.limiter
            .check_key_at(key, now, cost)
            .map(|d| (d, Receipt::Plain))
    }
    fn peek(&self, key: &[u8], now: Nanos, cost: u64) -> Result<Decision, CheckError> {
        self.limiter.peek_key_at(key, now, cost)
    }
    fn refund(&self, key: &[u8], now: Nanos, cost: u64, _: Receipt) {
        self.limiter.refund_key_at(key, now, cost);
    }
    fn overflow_decisions(&self) -> u64 {
        self.limiter.overflow_decisions() as u64
    }
    fn set_quota(&self, quota: Quota) -> bool {
        self.limiter.set_quota(quota).is_ok()
    }
    fn set_override(&self, key: &[u8], quota: Quota) -> Result<(), KeyedError> {
        self.limiter.set_override(key, quota)
    }
    fn remove_override(&self, key: &[u8]) -> bool {
        self.limiter.remove_override(key)
    }
    fn pin_key(&self, key: &[u8]) -> Result<(), KeyedError> {
        self.limiter.pin_key(key)
    }
    fn unpin_key(&self, key: &[u8]) {
        self.limiter.unpin_key(key);
    }
    fn check_override_quotas(&self, quotas: &[Quota]) -> Result<(), KeyedError> {
        self.limiter.check_override_quotas(quotas)
    }
}

struct Striped<C> {
    limiter: StripedLimiter<C>,
}

impl<C: Clock> RuleLimiter for Striped<C> {
    #[inline]
    fn check(&self, _: &[u8], now: Nanos, cost: u64) -> Result<(Decision, Receipt), CheckError> {
        self.limiter
            .check_at_with_receipt(now, cost)
            .map(|(d, r)| (d, Receipt::Striped(r)))
    }
    fn peek(&self, _: &[u8], now: Nanos, cost: u64) -> Result<Decision, CheckError> {
        self.limiter.peek_at(now, cost)
    }
    fn refund(&self, _: &[u8], _: Nanos, cost: u64, receipt: Receipt) {
        if let Receipt::Striped(receipt) = receipt {
            self.limiter.refund(receipt, cost);
        }
    }
    fn set_quota(&self, _: Quota) -> bool {
        false
    }
    fn retire(&self, at: Nanos) -> Option<(Nanos, Quota)> {
        Some((self.limiter.retire(at), *self.limiter.quota()))
    }
    fn take_over(&self, old: &dyn RuleLimiter, at: Nanos) {
        let Some((tat, quota)) = old.retire(at) else {
            return;
        };
        // As-is in units at `at`, as for every other storage.
        if let Ok(from) = Gcra::from_quota(quota) {
            let tat = from.carry_over(tat, at, self.limiter.gcra());
            self.limiter.raise_shared_tat(tat);
        }
    }
}

/// How to build a rule's limiter.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spec {
    pub algorithm: AlgorithmKind,
    pub storage: Storage,
    pub quota: Quota,
    pub capacity: Option<usize>,
    pub stripes: Option<usize>,
}

/// Builds the limiter `spec` describes, fresh, on `clock`.
pub(crate) fn build<C: Clock + Clone + 'static>(
    spec: &Spec,
    clock: &C,
) -> Result<Box<dyn RuleLimiter>, ConfigErrorKind> {
    fn keyed<A: Algorithm, C: Clock + Clone + 'static>(
        spec: &Spec,
        capacity: usize,
        clock: &C,
    ) -> Result<Box<dyn RuleLimiter>, ConfigErrorKind> {
        let builder =
            KeyedLimiter::<[u8], A, C>::builder_with_clock(spec.quota, capacity, clock.clone());
        // Loom replays a model many times and needs every run to touch the same slots; everywhere
        // else each table gets its own random seed.
        #[cfg(tollgate_loom)]
        let builder = builder.hasher_seed(0).stripes(1);
        let limiter = builder.build().map_err(ConfigErrorKind::Keyed)?;
        Ok(Box::new(Keyed { limiter }))
    }
    /// A global rule: a table of one key (the empty one) in one window of the smallest size.
    fn global<A: Algorithm, C: Clock + Clone + 'static>(
        spec: &Spec,
        clock: &C,
    ) -> Result<Box<dyn RuleLimiter>, ConfigErrorKind> {
        let limiter = KeyedLimiter::<[u8], A, C>::builder_with_clock(spec.quota, 1, clock.clone())
            .stripes(1)
            .window(MIN_WINDOW)
            .hasher_seed(0)
            .build()
            .map_err(|e| match e {
                KeyedError::Quota(e) => ConfigErrorKind::Quota(e),
                e => ConfigErrorKind::Keyed(e),
            })?;
        Ok(Box::new(Keyed { limiter }))
    }
    match (spec.capacity, spec.storage) {
        (Some(capacity), _) => match spec.algorithm {
            AlgorithmKind::Gcra => keyed::<Gcra, C>(spec, capacity, clock),
            AlgorithmKind::LeakyBucket => keyed::<LeakyBucket, C>(spec, capacity, clock),
            AlgorithmKind::FixedWindow => keyed::<FixedWindow, C>(spec, capacity, clock),
            AlgorithmKind::SlidingWindow => keyed::<SlidingWindow, C>(spec, capacity, clock),
        },
        (None, Storage::Striped) => {
            let config = match spec.stripes {
                Some(stripes) => StripedConfig::default().stripes(stripes),
                None => StripedConfig::default(),
            };
            let limiter = StripedLimiter::with_config(spec.quota, config, clock.clone())
                .map_err(ConfigErrorKind::Striped)?;
            Ok(Box::new(Striped { limiter }))
        }
        (None, Storage::Atomic) => match spec.algorithm {
            AlgorithmKind::Gcra => global::<Gcra, C>(spec, clock),
            AlgorithmKind::LeakyBucket => global::<LeakyBucket, C>(spec, clock),
            AlgorithmKind::FixedWindow => global::<FixedWindow, C>(spec, clock),
            AlgorithmKind::SlidingWindow => global::<SlidingWindow, C>(spec, clock),
        },
    }
}

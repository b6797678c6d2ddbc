//! One interface over the three storages a rule may use, so the decision loop is not generic over
//! every (algorithm, storage) pair.

use tollgate_core::{
    Algorithm, AtomicLimiter, CheckError, Clock, Decision, FixedWindow, Gcra, LeakyBucket, Limiter,
    Nanos, Quota, SlidingWindow,
};
use tollgate_sharded::{KeyedError, KeyedLimiter};
use tollgate_striped::{LeaseReceipt, StripedConfig, StripedLimiter};

use crate::config::{AlgorithmKind, ConfigErrorKind, Storage};
use crate::reloadable::Reloadable;

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
    /// The quota this key is limited by (its override, or the default).
    fn quota_for(&self, key: &[u8]) -> Quota;
    /// The default quota.
    fn quota(&self) -> Quota;
    /// Decisions made by a keyed table's shared overflow states.
    fn overflow_decisions(&self) -> u64 {
        0
    }
    /// Makes `quota` the default from now on, keeping every state word. `false`: this storage cannot
    /// (striped: the policy rebuilds it, carrying the shared word).
    fn set_quota(&self, quota: Quota) -> bool;
    fn set_override(&self, _key: &[u8], _quota: Quota) -> Result<(), KeyedError> {
        Err(KeyedError::WindowFull)
    }
    fn remove_override(&self, _key: &[u8]) -> bool {
        false
    }
    /// The striped limiter's shared word, to carry into a rebuilt one.
    fn shared_tat(&self) -> Option<Nanos> {
        None
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
    /// A rebuilt (striped) limiter, not yet published, moves up to where `old` stands now.
    fn take_over(&self, _old: &dyn RuleLimiter) {}
}

struct Keyed<A, C> {
    limiter: KeyedLimiter<[u8], Reloadable<A>, C>,
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
    fn quota_for(&self, key: &[u8]) -> Quota {
        *self.limiter.quota_for(key)
    }
    fn quota(&self) -> Quota {
        *self.limiter.quota()
    }
    fn overflow_decisions(&self) -> u64 {
        self.limiter.overflow_decisions() as u64
    }
    fn set_quota(&self, quota: Quota) -> bool {
        match A::from_quota(quota) {
            Ok(algorithm) => {
                self.limiter.algorithm().replace(algorithm);
                true
            }
            Err(_) => false,
        }
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

struct Global<A, C> {
    limiter: AtomicLimiter<Reloadable<A>, C>,
}

impl<A: Algorithm, C: Clock> RuleLimiter for Global<A, C> {
    #[inline]
    fn check(&self, _: &[u8], now: Nanos, cost: u64) -> Result<(Decision, Receipt), CheckError> {
        self.limiter
            .check_at(now, cost)
            .map(|d| (d, Receipt::Plain))
    }
    fn peek(&self, _: &[u8], now: Nanos, cost: u64) -> Result<Decision, CheckError> {
        self.limiter.peek_at(now, cost)
    }
    fn refund(&self, _: &[u8], now: Nanos, cost: u64, _: Receipt) {
        self.limiter.refund_at(now, cost);
    }
    fn quota_for(&self, _: &[u8]) -> Quota {
        self.quota()
    }
    fn quota(&self) -> Quota {
        *self.limiter.algorithm().quota()
    }
    fn set_quota(&self, quota: Quota) -> bool {
        match A::from_quota(quota) {
            Ok(algorithm) => {
                self.limiter.algorithm().replace(algorithm);
                true
            }
            Err(_) => false,
        }
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
    fn quota_for(&self, _: &[u8]) -> Quota {
        self.quota()
    }
    fn quota(&self) -> Quota {
        *self.limiter.quota()
    }
    fn set_quota(&self, _: Quota) -> bool {
        false
    }
    fn shared_tat(&self) -> Option<Nanos> {
        Some(self.limiter.shared_tat())
    }
    fn take_over(&self, old: &dyn RuleLimiter) {
        if let Some(tat) = old.shared_tat() {
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

/// Builds the limiter `spec` describes, on `clock`; a striped one starts at `carry_tat` if given.
pub(crate) fn build<C: Clock + Clone + 'static>(
    spec: &Spec,
    clock: &C,
    carry_tat: Option<Nanos>,
) -> Result<Box<dyn RuleLimiter>, ConfigErrorKind> {
    fn keyed<A: Algorithm, C: Clock + Clone + 'static>(
        spec: &Spec,
        capacity: usize,
        clock: &C,
    ) -> Result<Box<dyn RuleLimiter>, ConfigErrorKind> {
        let builder = KeyedLimiter::<[u8], Reloadable<A>, C>::builder_with_clock(
            spec.quota,
            capacity,
            clock.clone(),
        );
        // Loom replays a model many times and needs every run to touch the same slots; everywhere
        // else each table gets its own random seed.
        #[cfg(tollgate_loom)]
        let builder = builder.hasher_seed(0).stripes(1);
        let limiter = builder.build().map_err(ConfigErrorKind::Keyed)?;
        Ok(Box::new(Keyed { limiter }))
    }
    fn global<A: Algorithm, C: Clock + Clone + 'static>(
        spec: &Spec,
        clock: &C,
    ) -> Result<Box<dyn RuleLimiter>, ConfigErrorKind> {
        let limiter = AtomicLimiter::<Reloadable<A>, C>::with_clock(spec.quota, clock.clone())
            .map_err(ConfigErrorKind::Quota)?;
        Ok(Box::new(Global { limiter }))
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
            let limiter = match carry_tat {
                Some(tat) => limiter.with_shared_tat(tat),
                None => limiter,
            };
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

//! One interface over the three storages a rule may use, so the decision loop is not generic over
//! every (algorithm, storage) pair.

use std::sync::{Arc, OnceLock};

use crossbeam_utils::CachePadded;
use tollgate_core::{
    Algorithm, CheckError, Clock, Decision, FixedWindow, Gcra, LeakyBucket, Limiter, Nanos, Quota,
    SlidingWindow,
};
use tollgate_sharded::{KeyedError, KeyedLimiter, SlotReceipt};
use tollgate_striped::{LeaseReceipt, StripedConfig, StripedLimiter};

use crate::config::{AlgorithmKind, Storage};
use crate::config_error::ConfigErrorKind;
use crate::sync::{AtomicU64, Ordering, fence};

/// What a refund needs besides the key: where a keyed admission was recorded (its slot, so the
/// refund neither hashes the key nor probes for it again), or where a striped admission's units
/// came from (the lease, and how many successors along a chain of reloads decided it: 0 for the
/// limiter itself).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Receipt {
    #[default]
    Plain,
    Keyed(SlotReceipt),
    Striped {
        receipt: LeaseReceipt,
        hops: u8,
    },
}

/// A rule's limiter, keyed or global. `key` is ignored by global limiters.
pub(crate) trait RuleLimiter: Send + Sync {
    fn check(&self, key: &[u8], now: Nanos, cost: u64) -> Result<(Decision, Receipt), CheckError>;
    /// `check` leaving `reserve` units for higher priority classes. Storages that cannot keep
    /// headroom (striped) decide plainly; validation refuses a `priority` on them.
    #[inline]
    fn check_reserving(
        &self,
        key: &[u8],
        now: Nanos,
        cost: u64,
        reserve: u64,
    ) -> Result<(Decision, Receipt), CheckError> {
        let _ = reserve;
        self.check(key, now, cost)
    }
    fn peek(&self, key: &[u8], now: Nanos, cost: u64) -> Result<Decision, CheckError>;
    fn refund(&self, key: &[u8], now: Nanos, cost: u64, receipt: Receipt);
    /// `refund` where `receipt` alone says where the admission goes (a keyed rule's slot): `false`
    /// when it does not (the key is needed), and nothing was done.
    fn refund_by_receipt(&self, _now: Nanos, _cost: u64, _receipt: Receipt) -> bool {
        false
    }
    /// Counts `cost` units for `key` at `now` without a decision (a settlement's overdraft: see
    /// `Algorithm::charge`).
    fn charge(&self, key: &[u8], now: Nanos, cost: u64);
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
    /// Hands this (striped) limiter over to `successor`, a rebuilt one not yet published, at `at`:
    /// this one stops granting from its shared word, the successor starts from that word carried
    /// over as-is in units, and decisions still running on this one that its own leases cannot
    /// admit are decided by the successor (so a reload neither over-admits nor denies them).
    fn hand_over(&self, _successor: Arc<dyn RuleLimiter>, _at: Nanos) {}
    /// The successor's half of `hand_over`: starts from the predecessor's shared word `tat`, written
    /// under `quota`, carried over at `at`.
    fn take_over(&self, _tat: Nanos, _quota: Quota, _at: Nanos) {}
}

/// A keyed rule: a bounded table, whose quota changes in place (`KeyedLimiter::set_default`: each
/// key's state carried over as-is in units, exact under concurrent decisions, since the slot's tier
/// says which quota wrote it).
struct Keyed<A, C> {
    limiter: KeyedLimiter<[u8], A, C>,
}

impl<A: Algorithm, C: Clock> RuleLimiter for Keyed<A, C> {
    #[inline]
    fn check(&self, key: &[u8], now: Nanos, cost: u64) -> Result<(Decision, Receipt), CheckError> {
        self.limiter
            .check_key_at_with_receipt(key, now, cost)
            .map(|(d, receipt)| (d, Receipt::Keyed(receipt)))
    }
    #[inline]
    fn check_reserving(
        &self,
        key: &[u8],
        now: Nanos,
        cost: u64,
        reserve: u64,
    ) -> Result<(Decision, Receipt), CheckError> {
        self.limiter
            .check_key_reserving_at_with_receipt(key, now, cost, reserve)
            .map(|(d, receipt)| (d, Receipt::Keyed(receipt)))
    }
    fn peek(&self, key: &[u8], now: Nanos, cost: u64) -> Result<Decision, CheckError> {
        self.limiter.peek_key_at(key, now, cost)
    }
    fn refund(&self, key: &[u8], now: Nanos, cost: u64, receipt: Receipt) {
        if !self.refund_by_receipt(now, cost, receipt) {
            self.limiter.refund_key_at(key, now, cost);
        }
    }
    #[inline]
    fn refund_by_receipt(&self, now: Nanos, cost: u64, receipt: Receipt) -> bool {
        // Back to the state that recorded the admission (or nowhere, if its slot changed hands
        // since: stricter).
        let Receipt::Keyed(receipt) = receipt else {
            return false;
        };
        self.limiter.refund_receipt_at(receipt, now, cost);
        true
    }
    fn charge(&self, key: &[u8], now: Nanos, cost: u64) {
        self.limiter.charge_key_at(key, now, cost);
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

/// The word of a [`Global`] limiter that a reload replaced: it holds no state any more, and every
/// decision, peek or refund that reads it goes to the successor. No algorithm state is ever stored
/// as this value: an admission that would write it is denied instead (an algorithm could only
/// produce it within one burst or window of the end of the clock's 584 years).
const RETIRED: u64 = u64::MAX;

/// A global rule on `atomic` storage: the algorithm on one cache-padded word (one load and, when
/// admitting, one 64-bit compare-and-swap per decision).
///
/// A quota change builds a new one and, at the commit, [`hand_over`](RuleLimiter::hand_over)
/// retires this one: in one compare-and-swap its word becomes [`RETIRED`], after the successor was
/// given this word's state carried over as-is in units ([`Algorithm::carry_over`]). So every
/// admission made here either landed before the retire (and is in the carried state) or failed its
/// exchange and is decided again by the successor: the reload is exact under concurrent decisions,
/// and a decision still running on the retired limiter is neither over-admitted nor denied for it.
///
/// # Ordering
/// Decisions, peeks and refunds use `Relaxed`, as `tollgate_core::AtomicState` argues: the word
/// publishes nothing but itself. The one exception is the retire: the successor's word and the
/// `successor` cell are written before the `Release` exchange that stores [`RETIRED`], and a thread
/// that reads [`RETIRED`] (a load or a failed exchange) issues an `Acquire` fence before it looks at
/// the successor, so it finds both (loom-tests/tests/policy.rs: `a_global_rule_reloaded_*`).
struct Global<A> {
    word: CachePadded<AtomicU64>,
    algorithm: A,
    /// Set once, just before this limiter is retired.
    successor: OnceLock<Arc<dyn RuleLimiter>>,
}

impl<A: Algorithm> Global<A> {
    fn new(algorithm: A) -> Self {
        Global {
            word: CachePadded::new(AtomicU64::new(0)),
            algorithm,
            successor: OnceLock::new(),
        }
    }

    /// The successor of a retired limiter (the word read was [`RETIRED`]).
    #[inline(never)]
    #[cold]
    fn retired(&self) -> Option<&Arc<dyn RuleLimiter>> {
        // Acquire: pairs with the Release exchange that stored RETIRED (`hand_over`), so the
        // successor cell and the successor's carried word written before it are visible.
        fence(Ordering::Acquire);
        self.successor.get()
    }
}

/// The answer where no state can admit: a retired word with no successor, or an admission that
/// would store [`RETIRED`].
fn closed() -> Decision {
    Decision::denied(Nanos::MAX, Nanos::MAX)
}

impl<A: Algorithm> Global<A> {
    /// A check, leaving `reserve` units for higher priority classes when there is one (`None`, a
    /// constant at each call site, compiles to exactly `Algorithm::decide`).
    #[inline(always)]
    fn check_with(
        &self,
        key: &[u8],
        now: Nanos,
        cost: u64,
        reserve: Option<u64>,
    ) -> Result<(Decision, Receipt), CheckError> {
        // Relaxed (load and exchange): see the type's ordering notes.
        let mut current = self.word.load(Ordering::Relaxed);
        loop {
            if current == RETIRED {
                return match (self.retired(), reserve) {
                    (Some(next), None) => next.check(key, now, cost),
                    (Some(next), Some(reserve)) => next.check_reserving(key, now, cost, reserve),
                    (None, _) => Ok((closed(), Receipt::Plain)),
                };
            }
            let transition = match reserve {
                None => self.algorithm.decide(current, now, cost)?,
                Some(reserve) => self
                    .algorithm
                    .decide_reserving(current, now, cost, reserve)?,
            };
            let Some(next) = transition.next.filter(|&next| next != current) else {
                return Ok((transition.decision, Receipt::Plain));
            };
            if next == RETIRED {
                return Ok((closed(), Receipt::Plain));
            }
            match self.word.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok((transition.decision, Receipt::Plain)),
                Err(actual) => current = actual,
            }
        }
    }
    /// Stores `step(word)` (`None`, or the word itself: nothing to write) in one compare-and-swap
    /// loop, for a write that is not a decision (a refund, a charge); on a retired word, hands the
    /// write to the successor instead (`retired`).
    fn write(
        &self,
        step: impl Fn(u64) -> Option<u64>,
        retired: impl FnOnce(&Arc<dyn RuleLimiter>),
    ) {
        // Relaxed (load and exchange): see the type's ordering notes.
        let mut current = self.word.load(Ordering::Relaxed);
        loop {
            if current == RETIRED {
                if let Some(next) = self.retired() {
                    retired(next);
                }
                return;
            }
            let Some(next) = step(current).filter(|&next| next != current) else {
                return;
            };
            match self.word.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }
}

impl<A: Algorithm> RuleLimiter for Global<A> {
    #[inline]
    fn check(&self, key: &[u8], now: Nanos, cost: u64) -> Result<(Decision, Receipt), CheckError> {
        self.check_with(key, now, cost, None)
    }
    fn check_reserving(
        &self,
        key: &[u8],
        now: Nanos,
        cost: u64,
        reserve: u64,
    ) -> Result<(Decision, Receipt), CheckError> {
        self.check_with(key, now, cost, Some(reserve))
    }
    fn peek(&self, key: &[u8], now: Nanos, cost: u64) -> Result<Decision, CheckError> {
        // Relaxed: see the type's ordering notes.
        let current = self.word.load(Ordering::Relaxed);
        if current == RETIRED {
            return match self.retired() {
                Some(next) => next.peek(key, now, cost),
                None => Ok(closed()),
            };
        }
        self.algorithm
            .decide(current, now, cost)
            .map(|transition| transition.decision)
    }
    fn refund(&self, key: &[u8], now: Nanos, cost: u64, receipt: Receipt) {
        // A retired word's admission is in the successor's carried state (or was made there): it
        // goes back there, in the quota in force.
        self.write(
            |word| {
                self.algorithm
                    .refund(word, now, cost)
                    .filter(|&next| next != RETIRED)
            },
            |next| next.refund(key, now, cost, receipt),
        );
    }
    fn charge(&self, key: &[u8], now: Nanos, cost: u64) {
        // A charge saturating into the sentinel stays one short of it (still the strictest state a
        // word holds); a retired word's debt goes to the successor, where the quota lives now.
        self.write(
            |word| {
                self.algorithm
                    .charge(word, now, cost)
                    .map(|next| if next == RETIRED { RETIRED - 1 } else { next })
            },
            |next| next.charge(key, now, cost),
        );
    }
    fn set_quota(&self, _: Quota) -> bool {
        false
    }
    fn hand_over(&self, successor: Arc<dyn RuleLimiter>, at: Nanos) {
        // The successor is unreachable until our word reads RETIRED (and the policy publishing it
        // comes after this returns), so it can be set here and its word written on every round.
        let _ = self.successor.set(Arc::clone(&successor));
        // Relaxed load: the exchange below checks it.
        let mut current = self.word.load(Ordering::Relaxed);
        while current != RETIRED {
            successor.take_over(current, *self.algorithm.quota(), at);
            // Release: publishes the successor cell and its carried word to whoever reads RETIRED
            // (see `retired`). Failure Relaxed: we only retry with the word found.
            match self
                .word
                .compare_exchange(current, RETIRED, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }
    fn take_over(&self, word: Nanos, quota: Quota, at: Nanos) {
        // As-is in units at `at`. This limiter is not reachable yet (see `hand_over`): a plain
        // store sets it, published by the predecessor's Release exchange.
        let carried = match A::from_quota(quota) {
            Ok(from) if from.quota() == self.algorithm.quota() => word,
            Ok(from) => from.carry_over(word, at, &self.algorithm),
            // Unreachable (the predecessor held this quota); the strictest state is no state.
            Err(_) => RETIRED,
        };
        // Relaxed: see above.
        self.word.store(carried, Ordering::Relaxed);
    }
}

struct Striped<C> {
    limiter: StripedLimiter<C>,
    /// Set once a reload replaced this limiter (`hand_over`): decisions still running on it go on
    /// there when its own leases cannot admit them.
    successor: OnceLock<Arc<dyn RuleLimiter>>,
}

impl<C: Clock> RuleLimiter for Striped<C> {
    #[inline]
    fn check(&self, key: &[u8], now: Nanos, cost: u64) -> Result<(Decision, Receipt), CheckError> {
        let own = self.limiter.check_at_with_receipt(now, cost);
        if let Ok((decision, receipt)) = own {
            if decision.is_allowed() {
                return Ok((decision, Receipt::Striped { receipt, hops: 0 }));
            }
        }
        match self.successor.get() {
            // Retired: what our leases could not admit is decided where the quota lives now.
            Some(next) => next.check(key, now, cost).map(|(decision, receipt)| {
                let receipt = match receipt {
                    Receipt::Striped { receipt, hops } => Receipt::Striped {
                        receipt,
                        hops: hops.saturating_add(1),
                    },
                    other => other,
                };
                (decision, receipt)
            }),
            None => {
                own.map(|(decision, receipt)| (decision, Receipt::Striped { receipt, hops: 0 }))
            }
        }
    }
    fn peek(&self, key: &[u8], now: Nanos, cost: u64) -> Result<Decision, CheckError> {
        match self.successor.get() {
            Some(next) => next.peek(key, now, cost),
            None => self.limiter.peek_at(now, cost),
        }
    }
    fn refund(&self, key: &[u8], now: Nanos, cost: u64, receipt: Receipt) {
        match receipt {
            Receipt::Striped { receipt, hops: 0 } => {
                self.limiter.refund(receipt, cost);
            }
            Receipt::Striped { receipt, hops } => {
                if let Some(next) = self.successor.get() {
                    let hops = hops - 1;
                    next.refund(key, now, cost, Receipt::Striped { receipt, hops });
                }
            }
            Receipt::Plain | Receipt::Keyed(_) => {}
        }
    }
    fn charge(&self, key: &[u8], now: Nanos, cost: u64) {
        match self.successor.get() {
            // Retired: the quota lives in the successor now.
            Some(next) => next.charge(key, now, cost),
            None => {
                self.limiter.charge_at(now, cost);
            }
        }
    }
    fn set_quota(&self, _: Quota) -> bool {
        false
    }
    fn hand_over(&self, successor: Arc<dyn RuleLimiter>, at: Nanos) {
        // In this order: the successor is reachable only once it holds the carried word (a denial
        // here forwarded to a fresh successor would over-admit). Between `retire` and `set`, a
        // decision here that its leases cannot admit is denied: a window of a few instructions.
        let tat = self.limiter.retire(at);
        successor.take_over(tat, *self.limiter.quota(), at);
        let _ = self.successor.set(successor);
    }
    fn take_over(&self, tat: Nanos, quota: Quota, at: Nanos) {
        // As-is in units at `at`, as for every other storage. This limiter is fresh and not yet
        // published, so raising its word sets it.
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
    /// A global rule on one atomic word.
    fn global<A: Algorithm>(spec: &Spec) -> Result<Box<dyn RuleLimiter>, ConfigErrorKind> {
        let algorithm = A::from_quota(spec.quota).map_err(ConfigErrorKind::Quota)?;
        Ok(Box::new(Global::new(algorithm)))
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
            Ok(Box::new(Striped {
                limiter,
                successor: OnceLock::new(),
            }))
        }
        (None, Storage::Atomic) => match spec.algorithm {
            AlgorithmKind::Gcra => global::<Gcra>(spec),
            AlgorithmKind::LeakyBucket => global::<LeakyBucket>(spec),
            AlgorithmKind::FixedWindow => global::<FixedWindow>(spec),
            AlgorithmKind::SlidingWindow => global::<SlidingWindow>(spec),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::ManualClock;

    fn striped(limit: u64, clock: &ManualClock) -> Arc<dyn RuleLimiter> {
        let spec = Spec {
            algorithm: AlgorithmKind::Gcra,
            storage: Storage::Striped,
            quota: Quota::per_second(limit).unwrap(),
            capacity: None,
            stripes: Some(1),
        };
        Arc::from(build(&spec, clock).unwrap())
    }

    fn atomic(limit: u64, clock: &ManualClock) -> Arc<dyn RuleLimiter> {
        let spec = Spec {
            algorithm: AlgorithmKind::Gcra,
            storage: Storage::Atomic,
            quota: Quota::per_second(limit).unwrap(),
            capacity: None,
            stripes: None,
        };
        Arc::from(build(&spec, clock).unwrap())
    }

    #[test]
    fn a_replaced_atomic_limiter_hands_its_units_over_and_forwards_everything() {
        let clock = ManualClock::new();
        let (old, new) = (atomic(10, &clock), atomic(20, &clock));
        let now = clock.now();
        for _ in 0..4 {
            assert!(old.check(&[], now, 1).unwrap().0.is_allowed());
        }
        old.hand_over(Arc::clone(&new), now);
        // As-is: the 6 units left, whichever limiter is asked (the old one forwards), not the new
        // burst of 20 nor 16 (in time).
        assert_eq!(old.peek(&[], now, 6).unwrap().remaining(), 0);
        assert!(!new.peek(&[], now, 7).unwrap().is_allowed());
        let (decision, receipt) = old.check(&[], now, 2).unwrap();
        assert_eq!(decision.remaining(), 4, "decided by the successor");
        // A refund through the old limiter lands on the successor.
        old.refund(&[], now, 2, receipt);
        assert_eq!(new.peek(&[], now, 6).unwrap().remaining(), 0);
        let mut admitted = 0;
        while new.check(&[], now, 1).unwrap().0.is_allowed() {
            admitted += 1;
        }
        assert_eq!(admitted, 6);
        assert!(!old.check(&[], now, 1).unwrap().0.is_allowed());
    }

    #[test]
    fn a_racing_atomic_hand_over_never_admits_more_than_the_old_limiter_had() {
        for round in 0..50 {
            let clock = ManualClock::new();
            let (old, new) = (atomic(10, &clock), atomic(1000, &clock));
            let now = clock.now();
            // One unit spent first: a state still fresh at the hand-over carries over fresh, with
            // the new quota's whole burst (`Algorithm::carry_over`), which is not the race under
            // test here.
            assert!(old.check(&[], now, 1).unwrap().0.is_allowed());
            let admitted = std::sync::atomic::AtomicU64::new(1);
            std::thread::scope(|s| {
                for _ in 0..3 {
                    s.spawn(|| {
                        for _ in 0..10 {
                            if old.check(&[], now, 1).unwrap().0.is_allowed() {
                                admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                    });
                }
                s.spawn(|| old.hand_over(Arc::clone(&new), now));
            });
            let mut total = admitted.into_inner();
            while new.check(&[], now, 1).unwrap().0.is_allowed() {
                total += 1;
            }
            assert_eq!(
                total, 10,
                "round {round}: exactly the old burst, racing or not"
            );
        }
    }

    #[test]
    fn a_decision_on_a_replaced_striped_limiter_goes_to_its_successor() {
        let clock = ManualClock::new();
        let (old, new) = (striped(10, &clock), striped(20, &clock));
        let now = clock.now();
        // The old limiter spent 4 of 10 (some of them may sit in its stripe's lease).
        for _ in 0..4 {
            assert!(old.check(&[], now, 1).unwrap().0.is_allowed());
        }
        old.hand_over(Arc::clone(&new), now);
        // A decision still on the old limiter is neither denied for the reload nor given more than
        // the key had: 6 units in all, leases and successor together, then denials. The first unit
        // the successor admits is refunded through the old limiter at once: it goes back there.
        let (mut admitted, mut refunded) = (0, false);
        while let Ok((d, receipt)) = old.check(&[], now, 1) {
            if !d.is_allowed() {
                break;
            }
            if !refunded && matches!(receipt, Receipt::Striped { hops: 1, .. }) {
                old.refund(&[], now, 1, receipt);
                refunded = true;
                continue;
            }
            admitted += 1;
            assert!(admitted <= 6, "more than the 6 units left");
        }
        assert!(refunded, "the successor admitted some");
        assert_eq!(admitted, 6);
        assert!(
            !new.check(&[], now, 1).unwrap().0.is_allowed(),
            "one timeline"
        );
    }
}

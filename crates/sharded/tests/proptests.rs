//! Property tests: a keyed limiter over random multi-key traces agrees exactly with one pure reference
//! state per key (the core algorithm's `decide`), including across automatic evictions.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use tollgate_core::{
    Algorithm, CheckError, Decision, FixedWindow, Gcra, LeakyBucket, ManualClock, Nanos, Quota,
    SlidingWindow,
};
use tollgate_sharded::KeyedLimiter;

const MS: u64 = 1_000_000;

/// One request: time step (ns) before it, key, cost.
type Step = (u64, u8, u64);

fn trace(max_step: u64, keys: u8, max_cost: u64) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec((0..=max_step, 0..keys, 0..=max_cost), 1..200)
}

/// A per-key reference: the pure algorithm and one state word per key (0 = fresh).
struct Reference<A> {
    algorithm: A,
    states: HashMap<u8, u64>,
}

impl<A: Algorithm> Reference<A> {
    fn decide(&mut self, key: u8, now: Nanos, cost: u64) -> Result<Decision, CheckError> {
        let state = self.states.entry(key).or_insert(0);
        let transition = self.algorithm.decide(*state, now, cost)?;
        if let Some(next) = transition.next {
            *state = next;
        }
        Ok(transition.decision)
    }
}

/// Runs `trace` through `limiter` and the reference; every decision for a key that never went through
/// the overflow state must be identical. Returns how many keys overflowed.
fn agree<A: Algorithm>(
    limiter: &KeyedLimiter<u8, A, ManualClock>,
    clock: &ManualClock,
    trace: &[Step],
) -> Result<usize, TestCaseError> {
    let mut reference = Reference {
        algorithm: limiter.algorithm().clone(),
        states: HashMap::new(),
    };
    let mut tainted = HashSet::new();
    let mut now = 0;
    for (i, &(step, key, cost)) in trace.iter().enumerate() {
        now += step;
        clock.set(now);
        let overflowed = limiter.overflow_decisions();
        let got = limiter.check_key(&key, cost);
        if limiter.overflow_decisions() != overflowed {
            tainted.insert(key);
        }
        let expected = reference.decide(key, now, cost);
        if !tainted.contains(&key) {
            prop_assert_eq!(
                got,
                expected,
                "step {} key {} at {} cost {}",
                i,
                key,
                now,
                cost
            );
        }
        prop_assert!(limiter.len() <= limiter.slots());
    }
    Ok(tainted.len())
}

fn roomy<A: Algorithm>(quota: Quota, seed: u64) -> (KeyedLimiter<u8, A, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::builder_with_clock(quota, 64, clock.clone())
        .hasher_seed(seed)
        .build()
        .expect("valid limiter");
    (limiter, clock)
}

/// One stripe of 4 slots: with up to 12 keys, idle keys are evicted all the time.
fn cramped<A: Algorithm>(
    quota: Quota,
    seed: u64,
) -> (KeyedLimiter<u8, A, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::builder_with_clock(quota, 1, clock.clone())
        .stripes(1)
        .window(4)
        .hasher_seed(seed)
        .build()
        .expect("valid limiter");
    (limiter, clock)
}

fn quota() -> Quota {
    // 4 per 100 ms, burst 3 for the bucket algorithms.
    Quota::per(std::time::Duration::from_millis(100), 4)
        .and_then(|q| q.with_burst(3))
        .expect("valid quota")
}

fn window_quota() -> Quota {
    Quota::per(std::time::Duration::from_millis(100), 4).expect("valid quota")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn gcra_agrees_per_key_with_room(seed: u64, steps in trace(40 * MS, 8, 4)) {
        let (limiter, clock) = roomy::<Gcra>(quota(), seed);
        prop_assert_eq!(agree(&limiter, &clock, &steps)?, 0);
    }

    #[test]
    fn leaky_bucket_agrees_per_key_with_room(seed: u64, steps in trace(40 * MS, 8, 4)) {
        let (limiter, clock) = roomy::<LeakyBucket>(quota(), seed);
        prop_assert_eq!(agree(&limiter, &clock, &steps)?, 0);
    }

    #[test]
    fn fixed_window_agrees_per_key_with_room(seed: u64, steps in trace(40 * MS, 8, 5)) {
        let (limiter, clock) = roomy::<FixedWindow>(window_quota(), seed);
        prop_assert_eq!(agree(&limiter, &clock, &steps)?, 0);
    }

    #[test]
    fn sliding_window_agrees_per_key_with_room(seed: u64, steps in trace(40 * MS, 8, 5)) {
        let (limiter, clock) = roomy::<SlidingWindow>(window_quota(), seed);
        prop_assert_eq!(agree(&limiter, &clock, &steps)?, 0);
    }

    /// Eviction invisibility: in a 4-slot table over 12 keys, keys are evicted whenever idle, and every
    /// key that was never decided by the overflow state still agrees exactly with its reference.
    #[test]
    fn gcra_eviction_is_invisible(seed: u64, steps in trace(120 * MS, 12, 3)) {
        let (limiter, clock) = cramped::<Gcra>(quota(), seed);
        agree(&limiter, &clock, &steps)?;
        prop_assert!(limiter.len() <= 4);
    }

    #[test]
    fn fixed_window_eviction_is_invisible(seed: u64, steps in trace(120 * MS, 12, 3)) {
        let (limiter, clock) = cramped::<FixedWindow>(window_quota(), seed);
        agree(&limiter, &clock, &steps)?;
    }

    #[test]
    fn sliding_window_eviction_is_invisible(seed: u64, steps in trace(120 * MS, 12, 3)) {
        let (limiter, clock) = cramped::<SlidingWindow>(window_quota(), seed);
        agree(&limiter, &clock, &steps)?;
    }
}

/// Never looser than a lone limiter per key: every admission the table makes for a key (through its
/// slot or its stripe's overflow state), replayed into an independent limiter that sees only that
/// key's admitted requests, is admitted there too, so each key's admitted stream conforms to its own
/// quota, under any mix of floods, evictions and overflow (issue 11, finding 1). Returns how many
/// decisions the overflow state made, so callers can check the trace exercised it.
fn never_looser_than_a_lone_limiter<A: Algorithm>(
    limiter: &KeyedLimiter<u8, A, ManualClock>,
    clock: &ManualClock,
    trace: &[Step],
) -> Result<usize, TestCaseError> {
    let mut admitted = Reference {
        algorithm: limiter.algorithm().clone(),
        states: HashMap::new(),
    };
    let mut now = 0;
    for (i, &(step, key, cost)) in trace.iter().enumerate() {
        now += step;
        clock.set(now);
        if let Ok(Decision::Allowed { .. }) = limiter.check_key(&key, cost) {
            let lone = admitted.decide(key, now, cost);
            prop_assert!(
                matches!(lone, Ok(Decision::Allowed { .. })),
                "step {} key {} at {} cost {}: admitted, a lone limiter says {:?}",
                i,
                key,
                now,
                cost,
                lone
            );
        }
    }
    Ok(limiter.overflow_decisions())
}

/// A flood: one stripe of 4 slots and up to `keys` keys arriving in bursts; with more than
/// 32 keys the stripe's overflow ledger saturates too.
fn flood(max_step: u64, keys: u8) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec((0..=max_step, 0..keys, 0..=3u64), 50..400)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn gcra_keys_are_never_looser_than_alone(seed: u64, steps in flood(30 * MS, 12)) {
        let (limiter, clock) = cramped::<Gcra>(quota(), seed);
        never_looser_than_a_lone_limiter(&limiter, &clock, &steps)?;
    }

    #[test]
    fn gcra_keys_are_never_looser_than_alone_when_the_ledger_saturates(
        seed: u64,
        steps in flood(2 * MS, 60),
    ) {
        let (limiter, clock) = cramped::<Gcra>(quota(), seed);
        never_looser_than_a_lone_limiter(&limiter, &clock, &steps)?;
    }

    #[test]
    fn leaky_bucket_keys_are_never_looser_than_alone(seed: u64, steps in flood(30 * MS, 12)) {
        let (limiter, clock) = cramped::<LeakyBucket>(quota(), seed);
        never_looser_than_a_lone_limiter(&limiter, &clock, &steps)?;
    }

    #[test]
    fn fixed_window_keys_are_never_looser_than_alone(seed: u64, steps in flood(30 * MS, 12)) {
        let (limiter, clock) = cramped::<FixedWindow>(window_quota(), seed);
        never_looser_than_a_lone_limiter(&limiter, &clock, &steps)?;
    }

    #[test]
    fn sliding_window_keys_are_never_looser_than_alone(seed: u64, steps in flood(30 * MS, 40)) {
        let (limiter, clock) = cramped::<SlidingWindow>(window_quota(), seed);
        never_looser_than_a_lone_limiter(&limiter, &clock, &steps)?;
    }
}

/// The flood properties must actually flood: a fixed trace sends keys through the overflow state,
/// lets the table free up, and brings them back; each is held to its own quota.
#[test]
fn the_flood_trace_exercises_overflow_and_reinsertion() -> Result<(), Box<dyn std::error::Error>> {
    let (limiter, clock) = cramped::<Gcra>(quota(), 5);
    // 12 keys, cost 3 each, every 5 ms, for 600 ms: slots fill, keys overflow, idle keys come back.
    let steps: Vec<Step> = (0..120u64).map(|i| (5 * MS, (i % 12) as u8, 3)).collect();
    let overflowed =
        never_looser_than_a_lone_limiter(&limiter, &clock, &steps).map_err(|e| e.to_string())?;
    assert!(overflowed > 10, "{overflowed} overflow decisions");
    Ok(())
}

/// The eviction properties above must actually evict: a fixed trace over 12 keys through 4 slots with
/// idle gaps decides every key exactly, with no overflow.
#[test]
fn a_long_idle_trace_recycles_slots_without_overflow() -> Result<(), Box<dyn std::error::Error>> {
    let (limiter, clock) = cramped::<Gcra>(quota(), 3);
    let steps: Vec<Step> = (0..600u64).map(|i| (30 * MS, (i % 12) as u8, 1)).collect();
    // Each key comes back every 360 ms; its state (≤ 75 ms ahead) is fresh by then.
    let overflowed = agree(&limiter, &clock, &steps).map_err(|e| e.to_string())?;
    assert_eq!(overflowed, 0);
    assert_eq!(limiter.overflow_decisions(), 0);
    assert_eq!(limiter.len(), 4);
    Ok(())
}

/// One batch: time step (ns) before it, the keys, one cost for all of them.
type Batch = (u64, Vec<u8>, u64);

fn batches() -> impl Strategy<Value = Vec<Batch>> {
    prop::collection::vec(
        (0..=40 * MS, prop::collection::vec(0..12u8, 0..20), 0..=4u64),
        1..30,
    )
}

/// Runs every batch through `batched.check_keys` and, key by key, through `single.check_key` (two
/// limiters built alike); the results must be identical item for item, and the tables alike after.
fn batches_agree<A: Algorithm>(
    (batched, batched_clock): (KeyedLimiter<u8, A, ManualClock>, ManualClock),
    (single, single_clock): (KeyedLimiter<u8, A, ManualClock>, ManualClock),
    batches: &[Batch],
) -> Result<(), TestCaseError> {
    let mut now = 0;
    for (step, keys, cost) in batches {
        now += step;
        batched_clock.set(now);
        single_clock.set(now);
        let got: Vec<_> = batched.check_keys(keys, *cost).collect();
        let expected: Vec<_> = keys
            .iter()
            .map(|key| single.check_key(key, *cost))
            .collect();
        prop_assert_eq!(got, expected, "at {} cost {}", now, cost);
        prop_assert_eq!(batched.len(), single.len());
        prop_assert_eq!(batched.overflow_decisions(), single.overflow_decisions());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// `check_keys` is `check_key` per key, in order, including inserts, evictions and overflow
    /// (a 4-slot table over 12 keys) and errors (cost 4 exceeds the burst of 3).
    #[test]
    fn check_keys_decides_exactly_as_check_key_one_by_one(seed: u64, batches in batches()) {
        batches_agree(cramped::<Gcra>(quota(), seed), cramped::<Gcra>(quota(), seed), &batches)?;
    }

    #[test]
    fn check_keys_agrees_for_the_sliding_window_too(seed: u64, batches in batches()) {
        batches_agree(
            cramped::<SlidingWindow>(window_quota(), seed),
            cramped::<SlidingWindow>(window_quota(), seed),
            &batches,
        )?;
    }
}

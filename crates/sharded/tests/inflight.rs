//! The keyed in-flight limit: permits, eviction, overflow, stuck holders, bad input, threads.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::{CheckError, InFlight, MAX_IN_FLIGHT, ManualClock, Quota, QuotaError};
use tollgate_sharded::{KeyPermit, KeyedError, KeyedInFlight, KeyedLimiter};

const HOLD: Duration = Duration::from_secs(10);

/// A table for `capacity` keys on a manual clock; one stripe and a 4-slot window when `tiny`.
fn limits(limit: u64, capacity: usize, tiny: bool) -> Arc<KeyedInFlight<u64, ManualClock>> {
    let mut builder = KeyedLimiter::<u64, InFlight, _>::builder_with_clock(
        Quota::per(HOLD, limit).unwrap(),
        capacity,
        ManualClock::starting_at(1_000),
    )
    .hasher_seed(7);
    if tiny {
        builder = builder.stripes(1).window(4);
    }
    Arc::new(KeyedInFlight::from_table(builder.build().unwrap()))
}

#[test]
fn a_zero_limit_or_one_above_what_a_slot_counts_is_a_typed_error() {
    assert_eq!(
        KeyedInFlight::<u64>::new(0, HOLD, 10).unwrap_err(),
        KeyedError::Quota(QuotaError::ZeroLimit)
    );
    assert_eq!(
        KeyedInFlight::<u64>::new(MAX_IN_FLIGHT + 1, HOLD, 10).unwrap_err(),
        KeyedError::Quota(QuotaError::LimitTooLarge { max: MAX_IN_FLIGHT })
    );
    assert_eq!(
        KeyedInFlight::<u64>::new(1, Duration::ZERO, 10).unwrap_err(),
        KeyedError::Quota(QuotaError::ZeroPeriod)
    );
    assert_eq!(
        KeyedInFlight::<u64>::new(1, HOLD, 0).unwrap_err(),
        KeyedError::ZeroCapacity
    );
    let limits = limits(2, 10, false);
    assert!(matches!(
        limits.try_acquire(&1, 3),
        Err(CheckError::CostExceedsCapacity {
            cost: 3,
            capacity: 2
        })
    ));
    assert_eq!(limits.in_flight(&1), 0);
}

#[test]
fn a_permit_is_given_back_once_when_dropped_and_a_denial_takes_nothing() {
    let limits = limits(2, 10, false);
    let a = limits.try_acquire(&1, 1).unwrap().unwrap();
    let b = limits.try_acquire(&1, 1).unwrap().unwrap();
    assert_eq!(b.decision().remaining(), 0);
    let denied = limits.try_acquire(&1, 1).unwrap().unwrap_err();
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(limits.in_flight(&1), 2);
    drop(a);
    assert_eq!(limits.in_flight(&1), 1);
    drop(b);
    assert_eq!(limits.in_flight(&1), 0);
    assert_eq!(limits.late_releases(), 0);
}

#[test]
fn a_panicking_holder_gives_its_permit_back_while_unwinding() {
    let limits = limits(1, 10, false);
    let inside = Arc::clone(&limits);
    let result = std::thread::spawn(move || {
        let _permit = inside.try_acquire(&5, 1).unwrap().unwrap();
        panic!("handler failed");
    })
    .join();
    assert!(result.is_err());
    assert_eq!(limits.in_flight(&5), 0);
    assert!(limits.try_acquire(&5, 1).unwrap().is_ok());
}

#[test]
fn a_stuck_holder_is_reclaimed_after_its_hold_time_and_its_late_release_does_not_count_twice() {
    let limits = limits(1, 10, false);
    let clock = limits.table().clock().clone();
    let stuck = limits.try_acquire(&9, 1).unwrap().unwrap();
    clock.advance(HOLD);
    // Held one hold time: not reclaimed yet (reclaim comes between 1 and 2 hold times).
    assert!(limits.try_acquire(&9, 1).unwrap().is_err());
    clock.advance(HOLD);
    let fresh = limits.try_acquire(&9, 1).unwrap().unwrap();
    assert_eq!(limits.reclaimed(), 1);
    drop(stuck); // late: a no-op, counted
    assert_eq!(limits.late_releases(), 1);
    assert_eq!(limits.in_flight(&9), 1, "the new holder still counts");
    assert!(limits.try_acquire(&9, 1).unwrap().is_err());
    drop(fresh);
    assert_eq!(limits.in_flight(&9), 0);
}

#[test]
fn a_flood_of_new_keys_never_evicts_a_holder_and_new_keys_get_the_overflow_answer() {
    // One stripe, 4-slot window: at most 4 keys hold slots.
    let limits = limits(1, 2, true);
    assert_eq!(limits.table().slots(), 4);
    let mut holders: Vec<KeyPermit> = Vec::new();
    let mut key = 0;
    while holders.len() < 4 {
        let permit = limits.try_acquire(&key, 1).unwrap().unwrap();
        assert!(!permit.in_overflow());
        holders.push(permit);
        key += 1;
    }
    // The window is full of keys with permits out: the next new key takes the stripe's overflow
    // count (limit 1 for all new keys together), the one after is denied.
    let overflow = limits.try_acquire(&100, 1).unwrap().unwrap();
    assert!(overflow.in_overflow());
    for flood in 101..1_000u64 {
        assert!(limits.try_acquire(&flood, 1).unwrap().is_err());
    }
    for holder in 0..4u64 {
        assert_eq!(
            limits.in_flight(&holder),
            1,
            "holder {holder} kept its count"
        );
    }
    // The overflow permit goes back to the overflow count, not to some key's slot.
    drop(overflow);
    assert_eq!(limits.late_releases(), 0);
    assert!(limits.try_acquire(&101, 1).unwrap().unwrap().in_overflow());
    // Once a holder is done its key is idle and a new key may take its slot.
    holders.pop();
    let newcomer = limits.try_acquire(&500, 1).unwrap().unwrap();
    assert!(!newcomer.in_overflow());
    drop(newcomer);
    holders.clear();
    for k in (0..4u64).chain([100, 101, 500]) {
        assert_eq!(limits.in_flight(&k), 0);
    }
    assert_eq!(limits.late_releases(), 0);
}

#[test]
fn threads_taking_and_releasing_never_exceed_the_limit_and_the_count_returns_to_zero() {
    // Shared and borrowed permits alike.
    const THREADS: usize = 4;
    const KEYS: u64 = 8;
    const LIMIT: usize = 3;
    const ROUNDS: u64 = 20_000;
    let limits = Arc::new(KeyedInFlight::<u64>::new(LIMIT as u64, HOLD * 100, 1_000).unwrap());
    let holding: Arc<Vec<AtomicUsize>> = Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let admitted = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..THREADS as u64)
        .map(|t| {
            let (limits, holding, admitted) = (
                Arc::clone(&limits),
                Arc::clone(&holding),
                Arc::clone(&admitted),
            );
            std::thread::spawn(move || {
                for round in 0..ROUNDS {
                    let key = (round * 7 + t) % KEYS;
                    // Half the threads share the table (`Arc`), half borrow it.
                    let taken = if t % 2 == 0 {
                        limits.try_acquire(&key, 1)
                    } else {
                        limits.try_acquire_scoped(&key, 1)
                    };
                    if let Ok(permit) = taken.unwrap() {
                        // SeqCst: a test-side count of holders, checked against the limit.
                        let now = holding[key as usize].fetch_add(1, Ordering::SeqCst) + 1;
                        assert!(now <= LIMIT, "{now} holders of key {key}");
                        admitted.fetch_add(1, Ordering::Relaxed);
                        std::hint::spin_loop();
                        holding[key as usize].fetch_sub(1, Ordering::SeqCst);
                        drop(permit);
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    assert!(admitted.load(Ordering::Relaxed) > 0);
    for key in 0..KEYS {
        assert_eq!(limits.in_flight(&key), 0, "key {key}");
    }
    assert_eq!(limits.late_releases(), 0);
}

#[derive(Clone, Debug)]
enum Op {
    Take {
        key: u64,
        cost: u64,
    },
    /// Drop the n-th (modulo) permit held.
    Release(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..4u64, 0..4u64).prop_map(|(key, cost)| Op::Take { key, cost }),
        any::<usize>().prop_map(Op::Release),
    ]
}

proptest! {
    /// Against a model (units held per key): a take is admitted iff it fits, the count is never
    /// negative nor above the limit, and releasing everything brings every key back to 0.
    #[test]
    fn the_count_follows_the_model_and_never_exceeds_the_limit(
        limit in 1..6u64,
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let limits = limits(limit, 100, false);
        let mut model: HashMap<u64, u64> = HashMap::new();
        let mut held: Vec<(u64, KeyPermit)> = Vec::new();
        for op in ops {
            match op {
                Op::Take { key, cost } => {
                    let before = model.get(&key).copied().unwrap_or(0);
                    match limits.try_acquire(&key, cost) {
                        Err(CheckError::CostExceedsCapacity { .. }) => prop_assert!(cost > limit),
                        Err(other) => prop_assert!(false, "unexpected {other:?}"),
                        Ok(Ok(permit)) => {
                            prop_assert!(before + cost <= limit);
                            prop_assert_eq!(permit.decision().remaining(), limit - before - cost);
                            *model.entry(key).or_default() += cost;
                            held.push((key, permit));
                        }
                        Ok(Err(_)) => prop_assert!(before + cost > limit),
                    }
                }
                Op::Release(n) if !held.is_empty() => {
                    let (key, permit) = held.swap_remove(n % held.len());
                    *model.get_mut(&key).unwrap() -= permit.cost();
                    drop(permit);
                }
                Op::Release(_) => {}
            }
            for (key, units) in &model {
                prop_assert_eq!(limits.in_flight(key), *units);
                prop_assert!(*units <= limit);
            }
        }
        held.clear();
        for key in 0..4u64 {
            prop_assert_eq!(limits.in_flight(&key), 0);
        }
        prop_assert_eq!(limits.late_releases(), 0);
    }
}

//! `decide_reserving`: headroom for higher priority classes, as a pure check over every algorithm.

use proptest::prelude::*;
use tollgate_core::algorithm::Algorithm;
use tollgate_core::{
    Clock, Decision, FixedWindow, Gcra, LeakyBucket, ManualClock, Quota, SlidingWindow,
};

/// For any state reached by admissions: a reserving decision admits iff `cost + reserve` would be
/// admitted, writes exactly what a plain decision of `cost` writes, writes nothing when it denies,
/// and reports the reserve taken off `remaining`.
fn check<A: Algorithm>(algorithm: &A, steps: &[(u64, u64)], cost: u64, reserve: u64) {
    let capacity = algorithm.capacity();
    let (mut state, mut now) = (0u64, 1_000_000_000u64);
    for &(gap, c) in steps {
        now += gap;
        if let Ok(t) = algorithm.decide(state, now, c % (capacity + 1)) {
            state = t.next.unwrap_or(state);
        }
    }
    let cost = cost % (capacity + 1);
    let reserving = algorithm
        .decide_reserving(state, now, cost, reserve)
        .unwrap();
    let plain = algorithm.decide(state, now, cost).unwrap();
    let probe = cost
        .checked_add(reserve)
        .filter(|&p| p <= capacity)
        .map(|p| {
            algorithm
                .decide(state, now, p)
                .unwrap()
                .decision
                .is_allowed()
        });
    match reserving.decision {
        Decision::Allowed { remaining, .. } => {
            assert_eq!(probe, Some(true));
            assert_eq!(reserving.next, plain.next);
            assert_eq!(
                remaining,
                plain.decision.remaining().saturating_sub(reserve)
            );
        }
        Decision::Denied { retry_after, .. } => {
            assert_ne!(probe, Some(true));
            assert_eq!(reserving.next, None, "a denial writes nothing");
            if probe.is_none() {
                assert_eq!(retry_after, Decision::NEVER);
            }
        }
    }
}

proptest! {
    #[test]
    fn reserving_is_a_check_with_headroom(
        steps in proptest::collection::vec((0u64..200_000_000, 0u64..12), 0..20),
        cost in 0u64..12,
        reserve in 0u64..12,
    ) {
        let quota = Quota::per_second(10).unwrap();
        check(&Gcra::from_quota(quota).unwrap(), &steps, cost, reserve);
        check(&LeakyBucket::from_quota(quota).unwrap(), &steps, cost, reserve);
        check(&FixedWindow::from_quota(quota).unwrap(), &steps, cost, reserve);
        check(&SlidingWindow::from_quota(quota).unwrap(), &steps, cost, reserve);
    }
}

#[test]
fn a_flood_of_a_lower_class_leaves_the_reserve_to_a_higher_one() {
    // One atomic word, as a single limiter stores it: 10 per second, 2 kept back.
    let gcra = Gcra::from_quota(Quota::per_second(10).unwrap()).unwrap();
    let state = tollgate_core::AtomicState::default();
    let clock = ManualClock::new();
    let now = clock.now();
    let admitted = (0..1000)
        .filter(|_| {
            state
                .apply_reserving(&gcra, now, 1, 2)
                .unwrap()
                .is_allowed()
        })
        .count();
    assert_eq!(admitted, 8);
    assert!(state.apply(&gcra, now, 2).unwrap().is_allowed());
    assert!(!state.apply(&gcra, now, 1).unwrap().is_allowed());
}

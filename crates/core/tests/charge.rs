//! Property tests of `Algorithm::charge`: counting units without a decision only ever makes a state
//! stricter, never panics on absurd costs, and a bucket's debt lasts exactly its refill time.

use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::{Algorithm, FixedWindow, Gcra, LeakyBucket, Nanos, Quota, SlidingWindow};

const SECOND: Nanos = 1_000_000_000;

fn stricter<A: Algorithm>(algorithm: &A, trace: &[(u64, u64)], charge: u64, probe: u64) {
    let mut now = 100 * SECOND;
    let mut state = 0;
    for &(step, cost) in trace {
        now += step * SECOND / 8;
        if let Ok(t) = algorithm.decide(state, now, cost % (algorithm.capacity() + 1)) {
            state = t.next.unwrap_or(state);
        }
    }
    let charged = algorithm.charge(state, now, charge).unwrap_or(state);
    for later in [0, SECOND / 3, SECOND, 5 * SECOND] {
        let cost = probe % (algorithm.capacity() + 1);
        let before = algorithm.decide(state, now + later, cost).unwrap();
        let after = algorithm.decide(charged, now + later, cost).unwrap();
        if after.decision.is_allowed() {
            assert!(
                before.decision.is_allowed(),
                "a charge made the state looser"
            );
            assert!(after.decision.remaining() <= before.decision.remaining());
        }
    }
}

proptest! {
    #[test]
    fn a_charge_never_loosens_a_state(
        trace in prop::collection::vec((0u64..16, 0u64..12), 0..20),
        charge in prop_oneof![0u64..30, Just(u64::MAX)],
        probe in 0u64..12,
    ) {
        let quota = Quota::per_second(10).unwrap();
        stricter(&Gcra::from_quota(quota).unwrap(), &trace, charge, probe);
        stricter(&LeakyBucket::from_quota(quota).unwrap(), &trace, charge, probe);
        stricter(&FixedWindow::from_quota(quota).unwrap(), &trace, charge, probe);
        stricter(&SlidingWindow::from_quota(quota).unwrap(), &trace, charge, probe);
    }

    #[test]
    fn a_bucket_debt_lasts_exactly_its_refill_time(spent in 0u64..=10, debt in 1u64..100) {
        // 10 per second, burst 10: T = 100 ms.
        let gcra = Gcra::from_quota(Quota::per_second(10).unwrap()).unwrap();
        let now = 100 * SECOND;
        let state = gcra.decide(0, now, spent).unwrap().next.unwrap_or(0);
        let charged = gcra.charge(state, now, 10 - spent + debt).unwrap();
        let wait = gcra.decide(charged, now, 1).unwrap().decision.retry_after();
        prop_assert_eq!(wait, Some(Duration::from_millis(100 * (debt + 1))));
    }
}

#[test]
fn a_charge_of_zero_writes_nothing() {
    let quota = Quota::per_second(10).unwrap();
    assert_eq!(Gcra::from_quota(quota).unwrap().charge(5, 7, 0), None);
    assert_eq!(
        FixedWindow::from_quota(quota).unwrap().charge(5, 7, 0),
        None
    );
    assert_eq!(
        SlidingWindow::from_quota(quota).unwrap().charge(5, 7, 0),
        None
    );
}

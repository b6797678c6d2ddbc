//! Property tests of `Algorithm::carry_over`: at the carry instant the new state admits exactly
//! `min(what the old state admitted, the new capacity)`, and a carried bucket is never looser
//! afterwards than a fresh one of the new quota. Fake time only.

use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::{Algorithm, FixedWindow, Gcra, LeakyBucket, Nanos, Quota, SlidingWindow};

/// A quota with small limits, periods from 1 ms to 5 s, and a burst.
fn quota() -> impl Strategy<Value = Quota> {
    (1u64..=40, 1u64..=5_000, 1u64..=60).prop_map(|(limit, period_ms, burst)| {
        Quota::per(Duration::from_millis(period_ms), limit)
            .and_then(|q| q.with_burst(burst))
            .expect("valid by construction")
    })
}

/// The largest cost `state` admits at `now`, by asking every cost (the definition, not `remaining`).
fn admissible<A: Algorithm>(a: &A, state: u64, now: Nanos) -> u64 {
    (1..=a.capacity())
        .take_while(|&c| {
            a.decide(state, now, c)
                .is_ok_and(|t| t.decision.is_allowed())
        })
        .last()
        .unwrap_or(0)
}

/// A state of `a` built by a trace of (step in ms, cost) admissions; the time it ends at.
fn warm<A: Algorithm>(a: &A, start: Nanos, trace: &[(u64, u64)]) -> (u64, Nanos) {
    let (mut state, mut now) = (0, start);
    for &(step_ms, cost) in trace {
        now += step_ms * 1_000_000;
        let cost = cost % (a.capacity() + 1);
        if let Ok(t) = a.decide(state, now, cost) {
            state = t.next.unwrap_or(state);
        }
    }
    (state, now)
}

fn check<A: Algorithm>(
    old: Quota,
    new: Quota,
    trace: &[(u64, u64)],
    gap_ms: u64,
) -> Result<(), TestCaseError> {
    let (Ok(from), Ok(to)) = (A::from_quota(old), A::from_quota(new)) else {
        return Ok(()); // a quota this algorithm cannot hold: nothing to carry
    };
    let (state, end) = warm(&from, 7_000_000_000, trace);
    let at = end + gap_ms * 1_000_000;
    let before = admissible(&from, state, at);
    let carried = from.carry_over(state, at, &to);
    let kept = admissible(&to, carried, at);
    if from.is_fresh(state, at) {
        prop_assert_eq!(carried, 0, "a fresh state stays fresh, as a new key");
        prop_assert_eq!(kept, to.capacity());
    } else {
        prop_assert_eq!(kept, before.min(to.capacity()), "as-is in units, capped");
    }
    // `remaining` of cost 0 is that same figure (what the default implementation relies on).
    prop_assert_eq!(
        to.decide(carried, at, 0)
            .map_or(0, |t| t.decision.remaining()),
        kept
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn carry_over_keeps_min_of_old_and_new_capacity(
        old in quota(),
        new in quota(),
        trace in prop::collection::vec((0u64..300, 0u64..60), 0..12),
        gap_ms in 0u64..500,
    ) {
        check::<Gcra>(old, new, &trace, gap_ms)?;
        check::<LeakyBucket>(old, new, &trace, gap_ms)?;
        check::<FixedWindow>(old, new, &trace, gap_ms)?;
        check::<SlidingWindow>(old, new, &trace, gap_ms)?;
    }

    /// A bucket's carried state never admits more, at any later time, than a fresh bucket of the new
    /// quota that started at the carry instant: the new quota's bound holds after the reload.
    #[test]
    fn a_carried_bucket_is_never_looser_than_a_fresh_one_afterwards(
        old in quota(),
        new in quota(),
        trace in prop::collection::vec((0u64..300, 0u64..60), 0..12),
        probes in prop::collection::vec((0u64..3_000, 1u64..60), 1..8),
    ) {
        let (from, to) = (Gcra::from_quota(old).unwrap(), Gcra::from_quota(new).unwrap());
        let (state, at) = warm(&from, 7_000_000_000, &trace);
        let carried = from.carry_over(state, at, &to);
        for (step_ms, cost) in probes {
            let now = at + step_ms * 1_000_000;
            let cost = cost.min(to.capacity());
            let carried_allows = to.decide(carried, now, cost).unwrap().decision.is_allowed();
            let fresh_allows = to.decide(at, now, cost).unwrap().decision.is_allowed();
            prop_assert!(!carried_allows || fresh_allows);
        }
    }
}

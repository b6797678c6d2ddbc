//! The single in-flight limiter: permits across threads, stuck holders, bad input.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tollgate_core::{
    CheckError, InFlight, InFlightLimiter, MAX_IN_FLIGHT, ManualClock, QuotaError,
};

const HOLD: Duration = Duration::from_secs(5);

#[test]
fn bad_limits_are_typed_errors() {
    assert_eq!(
        InFlightLimiter::new(0, HOLD).unwrap_err(),
        QuotaError::ZeroLimit
    );
    assert_eq!(
        InFlightLimiter::new(MAX_IN_FLIGHT + 1, HOLD).unwrap_err(),
        QuotaError::LimitTooLarge { max: MAX_IN_FLIGHT }
    );
    let limiter = Arc::new(InFlightLimiter::new(2, HOLD).unwrap());
    assert!(matches!(
        limiter.try_acquire(3),
        Err(CheckError::CostExceedsCapacity {
            cost: 3,
            capacity: 2
        })
    ));
    assert_eq!(limiter.in_flight(), 0);
}

#[test]
fn a_stuck_permit_is_reclaimed_and_counted_and_its_late_release_changes_nothing() {
    let clock = ManualClock::starting_at(7);
    let limiter = Arc::new(InFlightLimiter::from_algorithm(
        InFlight::new(1, HOLD).unwrap(),
        clock.clone(),
    ));
    let stuck = limiter.try_acquire(1).unwrap().unwrap();
    clock.advance(HOLD);
    assert!(limiter.try_acquire(1).unwrap().is_err());
    clock.advance(HOLD);
    let next = limiter.try_acquire(1).unwrap().unwrap();
    assert_eq!(limiter.reclaimed(), 1);
    drop(stuck);
    assert_eq!(limiter.late_releases(), 1);
    assert_eq!(limiter.in_flight(), 1);
    drop(next);
    assert_eq!(limiter.in_flight(), 0);
}

#[test]
fn threads_never_hold_more_than_the_limit_and_the_count_returns_to_zero() {
    const LIMIT: usize = 3;
    let limiter = Arc::new(InFlightLimiter::new(LIMIT as u64, HOLD * 100).unwrap());
    let holding = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (limiter, holding) = (Arc::clone(&limiter), Arc::clone(&holding));
            std::thread::spawn(move || {
                let mut admitted = 0;
                for _ in 0..20_000 {
                    if let Ok(permit) = limiter.try_acquire(1).unwrap() {
                        // SeqCst: the test's own count of holders, checked against the limit.
                        let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                        assert!(now <= LIMIT, "{now} holders");
                        holding.fetch_sub(1, Ordering::SeqCst);
                        drop(permit);
                        admitted += 1;
                    }
                }
                admitted
            })
        })
        .collect();
    let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(admitted > 0);
    assert_eq!(limiter.in_flight(), 0);
    assert_eq!(limiter.late_releases(), 0);
}

mod properties {
    use proptest::prelude::*;
    use tollgate_core::{Algorithm, InFlight, Nanos, Release};

    const HOLD: Nanos = 10_000;

    #[derive(Clone, Debug)]
    enum Op {
        Take(u64),
        Release(usize),
        Wait(Nanos),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..4u64).prop_map(Op::Take),
            any::<usize>().prop_map(Op::Release),
            (0..HOLD * 3 / 2).prop_map(Op::Wait),
        ]
    }

    proptest! {
        /// With time moving forward: the count is exactly the units of permits not yet released
        /// and taken in this epoch or the one before (so never reclaimed before `max_hold`, always
        /// by `2 × max_hold`), never above the limit; a take is admitted iff it fits; a release
        /// is a no-op exactly for a permit already reclaimed.
        #[test]
        fn the_count_is_exact_and_within_the_limit_as_time_passes(
            limit in 1..6u64,
            start in 0..HOLD * 4,
            ops in prop::collection::vec(op(), 1..100),
        ) {
            let algorithm = InFlight::new(limit, std::time::Duration::from_nanos(HOLD)).unwrap();
            let (mut state, mut now) = (0u64, start);
            let mut out: Vec<(Nanos, u64)> = Vec::new();
            let live = |out: &[(Nanos, u64)], now: Nanos| -> u64 {
                out.iter()
                    .filter(|(t, _)| now / HOLD - t / HOLD <= 1)
                    .map(|(_, c)| c)
                    .sum()
            };
            for op in ops {
                match op {
                    Op::Take(cost) => {
                        let before = live(&out, now);
                        let Ok(transition) = algorithm.decide(state, now, cost) else {
                            prop_assert!(cost > limit);
                            continue;
                        };
                        prop_assert_eq!(transition.decision.is_allowed(), before + cost <= limit);
                        if let Some(next) = transition.next {
                            state = next;
                        }
                        if transition.decision.is_allowed() && cost > 0 {
                            out.push((now, cost));
                        }
                    }
                    Op::Release(n) if !out.is_empty() => {
                        let (taken, cost) = out.swap_remove(n % out.len());
                        let reclaimed = now / HOLD - taken / HOLD >= 2;
                        match algorithm.release(state, taken, cost) {
                            Release::Released(next) => state = next,
                            Release::Reclaimed => prop_assert!(reclaimed, "a live permit's release was lost"),
                        }
                    }
                    Op::Release(_) => {}
                    Op::Wait(by) => now += by,
                }
                let in_flight = algorithm.in_flight(state, now);
                prop_assert_eq!(in_flight, live(&out, now));
                prop_assert!(in_flight <= limit);
                // Nothing taken less than max_hold ago is ever reclaimed.
                let young: u64 = out.iter().filter(|(t, _)| now - t < HOLD).map(|(_, c)| c).sum();
                prop_assert!(in_flight >= young);
            }
        }
    }
}

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

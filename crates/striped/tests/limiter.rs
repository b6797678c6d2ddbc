//! Unit tests of `StripedLimiter` on a manual clock.

use std::time::Duration;

use tollgate_core::{CheckError, Limiter, ManualClock, Nanos, Quota};
use tollgate_striped::{LeaseSize, StripedConfig, StripedError, StripedLimiter};

const T: Nanos = 100_000_000; // 10 per second

fn limiter(burst: u64, stripes: usize, lease: LeaseSize) -> StripedLimiter<ManualClock> {
    let quota = Quota::per_second(10).unwrap().with_burst(burst).unwrap();
    let config = StripedConfig::default().stripes(stripes).lease(lease);
    StripedLimiter::with_config(quota, config, ManualClock::new()).unwrap()
}

#[test]
fn one_stripe_admits_exactly_the_burst_at_a_frozen_instant() {
    let l = limiter(10, 1, LeaseSize::Fixed(4));
    let allowed = (0..20)
        .filter(|_| l.check_on_stripe(0, 0, 1).unwrap().is_allowed())
        .count();
    assert_eq!(allowed, 10);
    let denied = l.check_on_stripe(0, 0, 1).unwrap();
    assert_eq!(denied.retry_after(), Some(Duration::from_nanos(T)));
    // One emission interval later exactly one more unit.
    assert!(l.check_on_stripe(0, T, 1).unwrap().is_allowed());
    assert!(!l.check_on_stripe(0, T, 1).unwrap().is_allowed());
}

#[test]
fn cost_above_burst_is_an_error_and_consumes_nothing() {
    let l = limiter(10, 2, LeaseSize::Fixed(4));
    assert_eq!(
        l.check_on_stripe(0, 0, 11),
        Err(CheckError::CostExceedsCapacity {
            cost: 11,
            capacity: 10
        })
    );
    assert_eq!(l.shared_tat(), 0);
    assert!(l.peek_on_stripe(0, 0, 11).is_err());
    assert!(l.check_on_stripe(0, 0, 10).unwrap().is_allowed());
}

#[test]
fn a_denial_writes_nothing_to_the_shared_word() {
    let l = limiter(10, 1, LeaseSize::Fixed(4));
    assert!(l.check_on_stripe(0, 0, 8).unwrap().is_allowed()); // direct: 8 > lease 4
    let tat = l.shared_tat();
    assert_eq!(tat, 8 * T);
    assert!(!l.check_on_stripe(0, 0, 3).unwrap().is_allowed());
    assert_eq!(l.shared_tat(), tat);
}

#[test]
fn stripes_together_never_exceed_the_burst_and_conserve_it() {
    let l = limiter(10, 4, LeaseSize::Fixed(2));
    let mut admitted = 0;
    for round in 0..10 {
        for stripe in 0..4 {
            if l.check_on_stripe(stripe, 0, 1).unwrap().is_allowed() {
                admitted += 1;
            }
            let _ = round;
        }
    }
    assert!(admitted <= 10);
    // Whatever was not admitted is held by some stripe: nothing was invented or lost.
    assert_eq!(admitted + l.stranded_units(), 10);
    assert!(l.stranded_units() <= l.max_lease() * l.stripes() as u64);
}

#[test]
fn live_units_are_given_back_when_the_lease_is_the_tail() {
    let l = limiter(10, 1, LeaseSize::Fixed(4));
    assert!(l.check_on_stripe(0, 0, 1).unwrap().is_allowed()); // lease [0, 4T), 3 left
    assert_eq!(l.shared_tat(), 4 * T);
    // Cost 4 > 3 left: give back [T, 4T) and take [T, 5T) in one CAS.
    assert!(l.check_on_stripe(0, 0, 4).unwrap().is_allowed());
    assert_eq!(l.shared_tat(), 5 * T);
    assert_eq!(l.stranded_units(), 0);
}

#[test]
fn stranded_units_come_back_within_one_lease_lifetime() {
    let l = limiter(10, 4, LeaseSize::Fixed(2));
    for stripe in 0..4 {
        assert!(l.check_on_stripe(stripe, 0, 1).unwrap().is_allowed());
    }
    assert_eq!(l.held_units(0), 4);
    // Stripe 0 cannot have the whole burst now: 4 units sit in leases.
    assert!(!l.check_on_stripe(0, 0, 7).unwrap().is_allowed());
    // Every lease ended by 8T (the shared TAT); by then the full burst is back.
    let end = l.shared_tat();
    assert_eq!(end, 8 * T);
    assert_eq!(l.held_units(end), 0);
    assert!(l.check_on_stripe(0, end, 10).unwrap().is_allowed());
}

#[test]
fn positions_behind_now_expire() {
    let l = limiter(10, 1, LeaseSize::Fixed(4));
    assert!(l.check_on_stripe(0, 0, 1).unwrap().is_allowed()); // [0, 4T), positions T..4T left
    assert_eq!(l.held_units(0), 3);
    assert_eq!(l.held_units(2 * T + 1), 1);
    assert_eq!(l.held_units(4 * T), 0);
}

#[test]
fn a_backwards_clock_never_admits_more() {
    let l = limiter(10, 2, LeaseSize::Fixed(4));
    let at = 10 * T;
    let first = (0..30)
        .filter(|i| l.check_on_stripe(i % 2, at, 1).unwrap().is_allowed())
        .count();
    assert!(first <= 10);
    let later = (0..30)
        .filter(|i| l.check_on_stripe(i % 2, 0, 1).unwrap().is_allowed())
        .count();
    assert_eq!(later, 0, "going back in time must not free capacity");
}

#[test]
fn zero_cost_consumes_nothing() {
    let l = limiter(10, 1, LeaseSize::Fixed(4));
    assert!(l.check_on_stripe(0, 0, 0).unwrap().is_allowed());
    assert_eq!(l.shared_tat(), 0);
}

#[test]
fn adaptive_lease_grows_while_refilling_often() {
    let quota = Quota::per_second(1_000_000_000).unwrap();
    let l = StripedLimiter::with_config(
        quota,
        StripedConfig::default().stripes(1),
        ManualClock::new(),
    )
    .unwrap();
    // At a frozen instant every lease is used up at once: sizes double 1, 2, 4, ...
    for _ in 0..1_000 {
        assert!(l.check_on_stripe(0, 0, 1).unwrap().is_allowed());
    }
    // 1 + 2 + 4 + ... + 512 = 1023 ≥ 1000: ten leases, so at most 512 units left in the last one.
    assert!(l.shared_tat() <= 1_023);
    assert!(l.stranded_units() < 512);
}

#[test]
fn bad_configs_are_typed_errors() {
    let quota = Quota::per_second(10).unwrap();
    let clock = ManualClock::new();
    assert_eq!(
        StripedLimiter::with_config(quota, StripedConfig::default().stripes(0), clock.clone())
            .err(),
        Some(StripedError::Stripes(0))
    );
    assert_eq!(
        StripedLimiter::with_config(
            quota,
            StripedConfig::default().lease(LeaseSize::Fixed(0)),
            clock.clone()
        )
        .err(),
        Some(StripedError::ZeroLease)
    );
    let l = StripedLimiter::with_config(quota, StripedConfig::default().stripes(3), clock).unwrap();
    assert_eq!(l.stripes(), 4);
    assert!(!StripedError::Stripes(0).to_string().is_empty());
}

#[test]
fn threads_at_a_frozen_instant_conserve_the_burst() {
    let quota = Quota::per_second(1_000).unwrap().with_burst(1_000).unwrap();
    let clock = ManualClock::starting_at(5 * T);
    let l = StripedLimiter::with_config(quota, StripedConfig::default().stripes(4), clock).unwrap();
    let admitted: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut n = 0;
                    for _ in 0..2_000 {
                        if l.check().is_allowed() {
                            n += 1;
                        }
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert!(admitted <= 1_000);
    assert_eq!(admitted + l.stranded_units(), 1_000);
}

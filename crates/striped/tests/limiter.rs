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

// Lease arithmetic that cargo-mutants found untested (results/mutants/README.md).

/// T = 1 µs, burst 1000, one stripe, adaptive leases up to 8 units.
fn adaptive() -> StripedLimiter<ManualClock> {
    let quota = Quota::per_second(1_000_000)
        .unwrap()
        .with_burst(1_000)
        .unwrap();
    let config = StripedConfig::default()
        .stripes(1)
        .lease(LeaseSize::Adaptive { max: 8 });
    StripedLimiter::with_config(quota, config, ManualClock::new()).unwrap()
}

const US: Nanos = 1_000;

/// `n` checks of one unit on stripe 0 at `now`, each admitted; the shared TAT after each.
fn tats(l: &StripedLimiter<ManualClock>, now: Nanos, n: usize) -> Vec<Nanos> {
    (0..n)
        .map(|_| {
            assert!(l.check_on_stripe(0, now, 1).unwrap().is_allowed());
            l.shared_tat() / US
        })
        .collect()
}

#[test]
fn adaptive_leases_double_while_refilled_within_the_target_and_stop_at_the_cap() {
    let l = adaptive();
    // Leases of 2, 4, 8, 8 units, each taken when the last one ran out.
    let mut expected = vec![2; 2];
    expected.extend([6; 4]);
    expected.extend([14; 8]);
    expected.extend([22; 8]);
    assert_eq!(tats(&l, 0, 22), expected);
}

#[test]
fn a_refill_exactly_the_target_interval_later_does_not_grow() {
    let l = adaptive();
    assert_eq!(tats(&l, 0, 2), [2, 2]); // a lease of 2 taken at 0, used up
    // 20 µs later: not "often" any more, and nothing expired unused: the size stays 2.
    assert_eq!(tats(&l, 20 * US, 1), [22]);
    let l = adaptive();
    assert_eq!(tats(&l, 0, 2), [2, 2]);
    // 1 ns earlier it still counts as often: 4.
    assert_eq!(
        l.check_on_stripe(0, 20 * US - 1, 1).map(|d| d.is_allowed()),
        Ok(true)
    );
    assert_eq!(l.shared_tat(), 20 * US - 1 + 4 * US);
}

/// Grows the lease to 8 at t = 0 (used up), then takes a lease of 8 at 100 µs and uses `used` of it.
fn a_lease_of_8_at_100us(used: usize) -> StripedLimiter<ManualClock> {
    let l = adaptive();
    tats(&l, 0, 22);
    assert_eq!(tats(&l, 100 * US, 1), [108]);
    tats(&l, 100 * US, used);
    l
}

#[test]
fn a_lease_that_expires_unused_halves_the_next_one() {
    let l = a_lease_of_8_at_100us(0);
    // At 1 s its 7 unused units have expired: the next lease is 4.
    assert_eq!(
        l.check_on_stripe(0, 1_000 * US, 1).map(|d| d.is_allowed()),
        Ok(true)
    );
    assert_eq!(l.shared_tat(), 1_004 * US);
}

#[test]
fn a_lease_partly_used_before_it_expired_keeps_its_size() {
    let l = a_lease_of_8_at_100us(1);
    assert_eq!(
        l.check_on_stripe(0, 1_000 * US, 1).map(|d| d.is_allowed()),
        Ok(true)
    );
    assert_eq!(l.shared_tat(), 1_008 * US);
}

#[test]
fn remaining_counts_the_lease_and_what_the_shared_state_had_free() {
    let l = adaptive();
    let remaining: Vec<u64> = (0..3)
        .map(|_| l.check_on_stripe(0, 0, 1).unwrap().remaining())
        .collect();
    // As a lone GCRA of burst 1000 would say: 999 after the first (a refill: 1 left in the lease
    // of 2, 998 free), 998 after the second (the lease's last unit), 997 after the third (a refill).
    assert_eq!(remaining, [999, 998, 997]);
}

#[test]
fn a_peek_decides_from_the_stripes_lease_before_the_shared_state() {
    // Burst 4 and a lease of 4: one check takes the whole burst into stripe 0's lease.
    let l = limiter(4, 1, LeaseSize::Fixed(4));
    assert!(l.check_on_stripe(0, 0, 1).unwrap().is_allowed());
    assert_eq!(l.shared_tat(), 4 * T);
    let peek = l.peek_on_stripe(0, 0, 1).unwrap();
    assert!(peek.is_allowed());
    assert_eq!(peek.remaining(), 2);
    assert!(!l.peek_on_stripe(0, 0, 4).unwrap().is_allowed());
    // Peeking changed nothing.
    assert_eq!(l.check_on_stripe(0, 0, 3).unwrap().remaining(), 0);
}

#[test]
fn stripe_indices_wrap_at_the_stripe_count() {
    let l = limiter(8, 4, LeaseSize::Fixed(2));
    assert!(l.check_on_stripe(1, 0, 1).unwrap().is_allowed());
    assert_eq!(l.peek_on_stripe(5, 0, 1), l.peek_on_stripe(1, 0, 1));
    assert_eq!(l.peek_on_stripe(5, 0, 1).unwrap().remaining(), 6);
    assert_eq!(l.check_on_stripe(5, 0, 1).unwrap().remaining(), 6);
    assert_eq!(
        l.shared_tat(),
        2 * T,
        "stripe 5 is stripe 1: its lease served it"
    );
}

#[test]
fn with_shared_tat_continues_the_given_timeline() {
    let l = limiter(10, 1, LeaseSize::Fixed(4)).with_shared_tat(10 * T);
    assert_eq!(l.shared_tat(), 10 * T);
    assert!(!l.check_on_stripe(0, 0, 1).unwrap().is_allowed());
    assert!(l.check_on_stripe(0, T, 1).unwrap().is_allowed());
}

#[test]
fn a_lease_refund_may_fill_the_unit_count_exactly_but_not_past_it() {
    use tollgate_striped::LeaseWord;
    let mask = LeaseWord::UNITS_MASK;
    let quota = Quota::per_second(10).unwrap().with_burst(2 * mask).unwrap();
    let config = StripedConfig::default()
        .stripes(1)
        .lease(LeaseSize::Fixed(mask));
    let l = StripedLimiter::with_config(quota, config, ManualClock::new()).unwrap();
    let (decision, receipt) = l.check_on_stripe_with_receipt(0, 0, 1).unwrap();
    assert!(decision.is_allowed());
    let (_, second) = l.check_on_stripe_with_receipt(0, 0, 1).unwrap();
    assert_eq!(receipt, second, "both from the same lease");
    // The lease holds mask − 2: one unit back fills it to mask − 1, a second to mask, a third
    // would pass the 20-bit count and is refused.
    assert!(l.refund(receipt, 1));
    assert!(l.refund(receipt, 1));
    assert!(!l.refund(receipt, 1));
}

#[test]
fn a_lease_replaced_while_all_its_units_are_still_ahead_keeps_its_size() {
    let l = adaptive();
    tats(&l, 0, 22); // leases grown to 8, used up at t = 0; shared TAT 22 µs
    // A direct grant of 100 pushes the shared TAT to 122 µs, so the next leases lie ahead of now.
    assert!(l.check_on_stripe(0, 0, 100).unwrap().is_allowed());
    assert_eq!(tats(&l, 50 * US, 1), [130]); // lease [122, 130) µs taken at 50 µs
    // At 80 µs a cost of 8 finds 7 units, all still ahead (none expired): the lease is replaced
    // (its 7 given back) without shrinking, and the next one, at 200 µs, is still 8.
    assert!(l.check_on_stripe(0, 80 * US, 8).unwrap().is_allowed());
    assert_eq!(l.shared_tat(), 131 * US);
    assert_eq!(tats(&l, 200 * US, 1), [208]);
}

#[test]
fn a_shared_refund_gives_back_only_a_nonzero_cost_still_on_top() {
    let l = limiter(10, 1, LeaseSize::Fixed(2));
    // Above the lease size: decided on the shared state, with a `Shared` receipt.
    let (_, first) = l.check_on_stripe_with_receipt(0, 0, 4).unwrap();
    assert_eq!(l.shared_tat(), 4 * T);
    assert!(!l.refund(first, 0), "nothing to give back");
    let (_, second) = l.check_on_stripe_with_receipt(0, 0, 3).unwrap();
    assert_eq!(l.shared_tat(), 7 * T);
    assert!(!l.refund(first, 4), "a later grant sits above it");
    assert_eq!(l.shared_tat(), 7 * T);
    assert!(l.refund(second, 3));
    assert_eq!(l.shared_tat(), 4 * T);
}

#[test]
fn a_denial_reports_the_exact_wait_for_its_cost() {
    let l = limiter(10, 1, LeaseSize::Fixed(4));
    assert!(l.check_on_stripe(0, 0, 10).unwrap().is_allowed());
    let denied = l.check_on_stripe(0, 0, 3).unwrap();
    assert_eq!(denied.retry_after(), Some(Duration::from_nanos(3 * T)));
    assert_eq!(denied.reset_after(), Duration::from_nanos(10 * T));
}

#[test]
fn the_limiter_reads_its_clock() {
    let clock = ManualClock::starting_at(5 * T);
    let quota = Quota::per_second(10).unwrap().with_burst(1).unwrap();
    let l = StripedLimiter::with_config(quota, StripedConfig::default().stripes(1), clock.clone())
        .unwrap();
    assert_eq!(l.now(), 5 * T);
    assert!(l.check().is_allowed());
    assert_eq!(l.shared_tat(), 6 * T, "admitted at the clock's 5 T");
    assert!(!l.check().is_allowed());
    clock.advance(Duration::from_nanos(T));
    assert!(l.check().is_allowed());
}

#[test]
fn a_retired_limiter_grants_nothing_more_but_its_stripes_use_their_leases() {
    // Burst 10, leases of 4: stripe 0 leases 4 and uses 1; 6 remain in the shared word.
    let l = limiter(10, 2, LeaseSize::Fixed(4));
    assert!(l.check_on_stripe(0, 0, 1).unwrap().is_allowed());
    let tat = l.shared_tat();
    assert_eq!(tat, 4 * T);
    assert_eq!(l.retire(0), tat, "the word as it was");
    // Stripe 0 still has its 3 leased units (accounted for in `tat`); then nothing, anywhere.
    let leased = (0..10)
        .filter(|_| l.check_on_stripe(0, 0, 1).unwrap().is_allowed())
        .count();
    assert_eq!(leased, 3);
    assert!(!l.check_on_stripe(1, 0, 1).unwrap().is_allowed());
    // Within one bucket depth of the retirement nothing is granted, and the wait stays bounded.
    let denied = l.check_on_stripe(1, 10 * T, 1).unwrap();
    assert!(!denied.is_allowed());
    assert!(denied.retry_after().unwrap() <= Duration::from_nanos(20 * T + 4 * T));
    // raise_shared_tat only ever moves the word up.
    let fresh = limiter(10, 1, LeaseSize::Fixed(4));
    fresh.raise_shared_tat(7 * T);
    fresh.raise_shared_tat(2 * T);
    assert_eq!(fresh.shared_tat(), 7 * T);
}

#[test]
fn a_cached_denial_writes_nothing_not_even_the_stripes_word() {
    // Burst 4, one stripe, leases of 4: the lease takes the whole burst and is used up at 0.
    let l = limiter(4, 1, LeaseSize::Fixed(4));
    let (decision, receipt) = l.check_on_stripe_with_receipt(0, 0, 1).unwrap();
    assert!(decision.is_allowed());
    for _ in 0..3 {
        assert!(l.check_on_stripe(0, 0, 1).unwrap().is_allowed());
    }
    // A flood of denials on the used-up lease: each answered from the shared word.
    for _ in 0..100 {
        let denied = l.check_on_stripe(0, T / 2, 1).unwrap();
        assert_eq!(denied.retry_after(), Some(Duration::from_nanos(T / 2)));
        assert_eq!(denied.reset_after(), Duration::from_nanos(4 * T - T / 2));
    }
    assert_eq!(l.shared_tat(), 4 * T);
    // The lease word kept its generation (a denied refill used to lock it and bump it), so a
    // refund against the lease still lands in it, and the unit is used again without the shared
    // word.
    assert!(l.refund(receipt, 1));
    assert!(l.check_on_stripe(0, T / 2, 1).unwrap().is_allowed());
    assert_eq!(l.shared_tat(), 4 * T);
}

#[test]
fn one_thread_alone_takes_no_lease_and_contention_sends_it_to_the_stripes() {
    let quota = Quota::per_second(10).unwrap().with_burst(8).unwrap();
    let config = StripedConfig::default()
        .stripes(2)
        .lease(LeaseSize::Fixed(4));
    let l = StripedLimiter::with_config(quota, config, ManualClock::new()).unwrap();
    assert!(l.is_alone());
    let (decision, receipt) = l.check_at_with_receipt(0, 1).unwrap();
    assert!(decision.is_allowed());
    assert_eq!(receipt, tollgate_striped::LeaseReceipt::Shared { end: T });
    assert_eq!(
        (l.shared_tat(), l.stranded_units()),
        (T, 0),
        "no lease taken"
    );
    l.mark_contended();
    assert!(l.check().is_allowed());
    assert_eq!(
        l.shared_tat(),
        5 * T,
        "a lease of 4 on the calling thread's stripe"
    );
    assert_eq!(l.stranded_units(), 3);
    // The config can keep every decision on the stripes.
    let config = StripedConfig::default().stripes(2).always_lease(true);
    let l = StripedLimiter::with_config(quota, config, ManualClock::new()).unwrap();
    assert!(!l.is_alone());
}

/// The alone path takes the costs `0..=burst` (its switch is that bound); a cost above the burst
/// goes to the stripes' path, which refuses it as plain GCRA does. Every cost is answered as GCRA
/// answers it, with no lease taken.
#[test]
fn every_cost_on_the_alone_path_is_answered_as_gcra_answers_it() {
    let quota = Quota::per_second(10).unwrap().with_burst(8).unwrap();
    let config = StripedConfig::default()
        .stripes(2)
        .lease(LeaseSize::Fixed(4));
    let l = StripedLimiter::with_config(quota, config, ManualClock::new()).unwrap();
    let gcra = tollgate_core::GcraLimiter::with_clock(quota, ManualClock::new()).unwrap();
    for (now, cost) in [(0, 3), (0, 0), (0, 8), (0, 0), (T, 1), (T, 9), (T, 0)] {
        assert_eq!(
            l.check_at(now, cost),
            gcra.check_at(now, cost),
            "cost {cost} at {now}"
        );
        assert!(l.is_alone(), "cost {cost} at {now}");
    }
    assert_eq!(
        l.check_at(T, 9),
        Err(CheckError::CostExceedsCapacity {
            cost: 9,
            capacity: 8
        })
    );
    assert_eq!(
        (l.shared_tat(), l.stranded_units()),
        (4 * T, 0),
        "3 and 1 admitted, no lease"
    );
    // In debt (a charge 16 T past the depth), a cost of 0 is refused too, as GCRA refuses it.
    assert!(l.charge_at(T, 20));
    assert_eq!(
        l.check_at(T, 0).unwrap().retry_after(),
        Some(Duration::from_nanos(15 * T))
    );
    assert!(l.is_alone());
}

#[test]
fn is_idle_at_answers_from_the_callers_lease_and_never_before_the_shared_word() {
    let quota = Quota::per_second(10).unwrap().with_burst(8).unwrap();
    let config = StripedConfig::default()
        .stripes(2)
        .lease(LeaseSize::Fixed(4))
        .always_lease(true);
    let l = StripedLimiter::with_config(quota, config, ManualClock::new()).unwrap();
    let now = 100 * T;
    // A lease of 4 on the calling thread's stripe: [now, now + 4T), the shared TAT its end.
    assert!(l.check_at(now, 1).unwrap().is_allowed());
    assert_eq!(l.shared_tat(), now + 4 * T);
    // Busy: the lease ends after `now − idle`.
    assert!(!l.is_idle_at(now + 4 * T, 1));
    // Idle exactly when the shared TAT is at `now − idle`, not a nanosecond before.
    assert!(!l.is_idle_at(now + 9 * T - 1, 5 * T));
    assert!(l.is_idle_at(now + 9 * T, 5 * T));
    // Another stripe's lease moves the shared TAT past this stripe's lease: the shared word answers.
    let other = 1 - l.current_stripe();
    assert!(
        l.check_on_stripe(other, now + 9 * T, 1)
            .unwrap()
            .is_allowed()
    );
    assert_eq!(l.shared_tat(), now + 13 * T);
    assert!(!l.is_idle_at(now + 13 * T - 1, 0));
    assert!(l.is_idle_at(now + 13 * T, 0));
    // Not idle for longer than time has run.
    assert!(!l.is_idle_at(T, 2 * T));
}

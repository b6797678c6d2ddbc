//! `KeyedLimiter::refund_key_at`: the key's own slot (default and override tiers) and the stripe's
//! overflow state for keys decided there.

use tollgate_core::{Gcra, ManualClock, Quota, SlidingWindow};
use tollgate_sharded::KeyedLimiter;

const NOW: u64 = 7_000_000_000;

#[test]
fn a_refund_restores_the_keys_own_slot_and_nothing_else() {
    let limiter = KeyedLimiter::<str, Gcra, _>::with_clock(
        Quota::per_second(10).unwrap().with_burst(2).unwrap(),
        1_000,
        ManualClock::new(),
    )
    .unwrap();
    assert!(limiter.check_key_at("a", NOW, 2).unwrap().is_allowed());
    assert!(limiter.check_key_at("b", NOW, 1).unwrap().is_allowed());
    assert!(limiter.refund_key_at("a", NOW, 1));
    assert_eq!(limiter.peek_key_at("a", NOW, 1).unwrap().remaining(), 0);
    assert!(limiter.check_key_at("a", NOW, 1).unwrap().is_allowed());
    assert!(!limiter.check_key_at("a", NOW, 1).unwrap().is_allowed());
    // "b" untouched; a key never seen has nothing to give back.
    assert_eq!(limiter.peek_key_at("b", NOW, 1).unwrap().remaining(), 0);
    assert!(!limiter.refund_key_at("never", NOW, 1));
}

#[test]
fn a_refund_uses_the_keys_override_quota() {
    let limiter = KeyedLimiter::<str, SlidingWindow, _>::with_clock(
        Quota::per_second(2).unwrap(),
        1_000,
        ManualClock::new(),
    )
    .unwrap();
    limiter
        .set_override("pro", Quota::per_second(5).unwrap())
        .unwrap();
    assert!(limiter.check_key_at("pro", NOW, 5).unwrap().is_allowed());
    assert!(!limiter.check_key_at("pro", NOW, 1).unwrap().is_allowed());
    assert!(limiter.refund_key_at("pro", NOW, 3));
    assert!(limiter.check_key_at("pro", NOW, 3).unwrap().is_allowed());
    assert!(!limiter.check_key_at("pro", NOW, 1).unwrap().is_allowed());
}

#[test]
fn a_key_decided_by_the_overflow_state_refunds_that_state() {
    // One stripe of four slots (window 4): four live keys fill it; later keys overflow.
    let limiter = KeyedLimiter::<u64, Gcra, _>::builder_with_clock(
        Quota::per_second(1).unwrap().with_burst(2).unwrap(),
        1,
        ManualClock::new(),
    )
    .stripes(1)
    .window(4)
    .hasher_seed(1)
    .build()
    .unwrap();
    assert_eq!(limiter.slots(), 4);
    for key in 0..4u64 {
        assert!(limiter.check_key_at(&key, NOW, 1).unwrap().is_allowed());
    }
    assert_eq!(limiter.overflow_decisions(), 0);
    assert!(limiter.check_key_at(&100, NOW, 2).unwrap().is_allowed());
    assert_eq!(limiter.overflow_decisions(), 1);
    // The overflow state is empty now: another new key is denied ...
    assert!(!limiter.peek_key_at(&101, NOW, 1).unwrap().is_allowed());
    // ... until the overflowed admission is given back.
    assert!(limiter.refund_key_at(&100, NOW, 2));
    assert_eq!(limiter.peek_key_at(&101, NOW, 2).unwrap().remaining(), 0);
    assert!(limiter.peek_key_at(&101, NOW, 2).unwrap().is_allowed());
    // The keys in their slots kept their own states.
    for key in 0..4u64 {
        assert_eq!(limiter.peek_key_at(&key, NOW, 1).unwrap().remaining(), 0);
    }
}

//! `KeyedLimiter::refund_key_at`: the key's own slot (default and override tiers) and the stripe's
//! overflow state for keys decided there. `check_key_at_with_receipt` and `refund_receipt_at`: an
//! admission goes back to the state that recorded it, or nowhere when the slot changed hands since
//! (or never held the key).

use tollgate_core::{Gcra, ManualClock, Quota, SlidingWindow};
use tollgate_sharded::KeyedLimiter;

const NOW: u64 = 7_000_000_000;
const SECOND: u64 = 1_000_000_000;

/// One stripe of four slots (window 4), 1/s with a burst of 2: four live keys fill it; later keys
/// overflow.
fn four_slots() -> KeyedLimiter<u64, Gcra, ManualClock> {
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
    limiter
}

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
    let limiter = four_slots();
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

#[test]
fn a_receipt_refund_restores_the_keys_slot_as_a_refund_by_key_does() {
    let by_receipt = KeyedLimiter::<str, Gcra, _>::with_clock(
        Quota::per_second(10).unwrap().with_burst(3).unwrap(),
        1_000,
        ManualClock::new(),
    )
    .unwrap();
    let (decision, receipt) = by_receipt.check_key_at_with_receipt("a", NOW, 2).unwrap();
    assert!(decision.is_allowed());
    assert!(by_receipt.check_key_at("b", NOW, 1).unwrap().is_allowed());
    assert!(by_receipt.refund_receipt_at(receipt, NOW, 2));
    // The whole burst again for "a"; "b" untouched.
    assert_eq!(by_receipt.peek_key_at("a", NOW, 1).unwrap().remaining(), 2);
    assert_eq!(by_receipt.peek_key_at("b", NOW, 1).unwrap().remaining(), 1);
    assert!(by_receipt.check_key_at("a", NOW, 3).unwrap().is_allowed());
    assert!(!by_receipt.check_key_at("a", NOW, 1).unwrap().is_allowed());
}

#[test]
fn a_receipt_that_names_no_slot_of_the_key_gives_nothing_back() {
    let limiter = four_slots();
    assert!(limiter.check_key_at(&1, NOW, 2).unwrap().is_allowed());
    // A cost of 0 for a new key inserts nothing: its receipt names a slot the key does not hold.
    let (zero, receipt) = limiter.check_key_at_with_receipt(&2, NOW, 0).unwrap();
    assert!(zero.is_allowed());
    assert!(!limiter.refund_receipt_at(receipt, NOW, 1));
    // The default receipt names nothing.
    let nothing = tollgate_sharded::SlotReceipt::default();
    assert!(nothing.is_nothing());
    assert!(!limiter.refund_receipt_at(nothing, NOW, 1));
    // Key 1 is still spent; key 2 still has its burst.
    assert!(!limiter.peek_key_at(&1, NOW, 1).unwrap().is_allowed());
    assert_eq!(limiter.peek_key_at(&2, NOW, 1).unwrap().remaining(), 1);
}

#[test]
fn a_slot_that_changed_hands_gets_nothing_back() {
    let limiter = four_slots();
    // Key 0 takes a slot, spends its burst, and turns fresh a few seconds later.
    let (decision, receipt) = limiter.check_key_at_with_receipt(&0, NOW, 2).unwrap();
    assert!(decision.is_allowed());
    let later = NOW + 5 * SECOND;
    // Keys 1..=3 fill the other slots and spend their bursts; key 4 then evicts the fresh key 0.
    for key in 1..=4u64 {
        assert!(limiter.check_key_at(&key, later, 2).unwrap().is_allowed());
    }
    assert_eq!(limiter.overflow_decisions(), 0);
    // Key 0's receipt names a slot key 4 holds now: nothing is given back, to anyone.
    assert!(!limiter.refund_receipt_at(receipt, later, 2));
    for key in 1..=4u64 {
        assert!(!limiter.peek_key_at(&key, later, 1).unwrap().is_allowed());
    }
}

#[test]
fn an_overflow_admission_goes_back_to_the_overflow_state() {
    let limiter = four_slots();
    for key in 0..4u64 {
        assert!(limiter.check_key_at(&key, NOW, 1).unwrap().is_allowed());
    }
    let (decision, receipt) = limiter.check_key_at_with_receipt(&100, NOW, 2).unwrap();
    assert!(decision.is_allowed());
    assert_eq!(limiter.overflow_decisions(), 1);
    assert!(!limiter.peek_key_at(&101, NOW, 1).unwrap().is_allowed());
    assert!(limiter.refund_receipt_at(receipt, NOW, 2));
    assert_eq!(limiter.peek_key_at(&101, NOW, 2).unwrap().remaining(), 0);
    assert!(limiter.peek_key_at(&101, NOW, 2).unwrap().is_allowed());
    for key in 0..4u64 {
        assert_eq!(limiter.peek_key_at(&key, NOW, 1).unwrap().remaining(), 0);
    }
}

#[test]
fn a_receipt_of_another_limiter_beyond_this_table_gives_nothing_back_and_does_not_panic() {
    let big = KeyedLimiter::<u64, Gcra, _>::with_clock(
        Quota::per_second(1).unwrap(),
        100_000,
        ManualClock::new(),
    )
    .unwrap();
    let small = four_slots();
    // Find a key of the big table whose slot lies beyond the small table's four.
    let receipt = (0..1_000u64)
        .map(|key| big.check_key_at_with_receipt(&key, NOW, 1).unwrap().1)
        .find(|receipt| !small.refund_receipt_at(*receipt, NOW, 1))
        .expect("a receipt the small table refuses");
    assert!(!receipt.is_nothing());
}

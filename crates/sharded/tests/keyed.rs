//! Unit tests of the keyed limiter on a manual clock.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use tollgate_core::{
    Algorithm, CheckError, Decision, FixedWindow, Gcra, Limiter, ManualClock, Quota, SlidingWindow,
};
use tollgate_sharded::{KeyedError, KeyedLimiter, MAX_OVERRIDE_QUOTAS};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const MS: u64 = 1_000_000;

fn gcra<K: ?Sized>(
    per_second: u64,
    capacity: usize,
    clock: &ManualClock,
) -> Result<KeyedLimiter<K, Gcra, ManualClock>> {
    Ok(
        KeyedLimiter::builder_with_clock(Quota::per_second(per_second)?, capacity, clock.clone())
            .hasher_seed(7)
            .build()?,
    )
}

/// A tiny table: one stripe of exactly `window` slots, so every key's window is the whole table.
fn tiny(
    quota: Quota,
    window: usize,
    clock: &ManualClock,
) -> Result<KeyedLimiter<u64, Gcra, ManualClock>> {
    Ok(KeyedLimiter::builder_with_clock(quota, 1, clock.clone())
        .stripes(1)
        .window(window)
        .hasher_seed(1)
        .build()?)
}

#[test]
fn keys_are_limited_independently() -> Result {
    let clock = ManualClock::new();
    let limiter = gcra::<u64>(3, 100, &clock)?;
    for key in 0..10u64 {
        for i in 0..3 {
            let decision = limiter.check_key(&key, 1)?;
            assert_eq!(decision.remaining(), 2 - i, "key {key}");
        }
        assert!(!limiter.check_key(&key, 1)?.is_allowed());
    }
    assert_eq!(limiter.len(), 10);
    clock.advance(Duration::from_millis(334));
    assert!(limiter.check_key(&3, 1)?.is_allowed());
    assert!(!limiter.check_key(&3, 1)?.is_allowed());
    Ok(())
}

#[test]
fn decisions_match_a_single_core_limiter() -> Result {
    let clock = ManualClock::new();
    let quota = Quota::per_second(5)?.with_burst(2)?;
    let limiter: KeyedLimiter<str, Gcra, _> =
        KeyedLimiter::builder_with_clock(quota, 10, clock.clone()).build()?;
    let reference = Gcra::from_quota(quota)?;
    let mut state = 0;
    for step in 0..50u64 {
        let now = step * 37 * MS;
        let expected = reference.decide(state, now, 1)?;
        state = expected.next.unwrap_or(state);
        assert_eq!(
            limiter.check_key_at("k", now, 1)?,
            expected.decision,
            "step {step}"
        );
    }
    Ok(())
}

#[test]
fn string_keys_accept_borrowed_lookups() -> Result {
    let clock = ManualClock::new();
    let limiter = gcra::<String>(1, 10, &clock)?;
    assert!(limiter.check_key("api-key-1", 1)?.is_allowed());
    assert!(!limiter.check_key(&"api-key-1".to_string(), 1)?.is_allowed());
    assert!(limiter.check_key("api-key-2", 1)?.is_allowed());
    let bytes = gcra::<[u8]>(1, 10, &clock)?;
    assert!(bytes.check_key(b"abc".as_slice(), 1)?.is_allowed());
    assert!(!bytes.check_key(b"abc".as_slice(), 1)?.is_allowed());
    Ok(())
}

#[test]
fn ip_keys_v4_and_v6() -> Result {
    let clock = ManualClock::new();
    let limiter = gcra::<IpAddr>(1, 10, &clock)?;
    let v4 = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    assert!(limiter.check_key(&v4, 1)?.is_allowed());
    assert!(limiter.check_key(&v6, 1)?.is_allowed());
    assert!(!limiter.check_key(&v4, 1)?.is_allowed());
    assert!(!limiter.check_key(&v6, 1)?.is_allowed());
    Ok(())
}

#[test]
fn peek_writes_nothing() -> Result {
    let clock = ManualClock::new();
    let limiter = gcra::<u64>(2, 10, &clock)?;
    assert_eq!(limiter.peek_key(&1, 1)?.remaining(), 1);
    assert_eq!(limiter.len(), 0, "peeking a new key does not insert it");
    limiter.check_key(&1, 2)?;
    let denied = limiter.peek_key(&1, 1)?;
    assert!(!denied.is_allowed());
    assert_eq!(limiter.peek_key(&1, 1)?, denied);
    clock.advance(Duration::from_millis(500));
    assert!(limiter.check_key(&1, 1)?.is_allowed());
    Ok(())
}

#[test]
fn cost_above_capacity_is_an_error_and_records_nothing() -> Result {
    let clock = ManualClock::new();
    let limiter = gcra::<u64>(5, 10, &clock)?;
    assert_eq!(
        limiter.check_key(&1, 6),
        Err(CheckError::CostExceedsCapacity {
            cost: 6,
            capacity: 5
        })
    );
    assert_eq!(limiter.len(), 0);
    limiter.check_key(&1, 1)?;
    assert!(limiter.check_key(&1, 6).is_err());
    assert_eq!(limiter.check_key(&1, 1)?.remaining(), 3);
    Ok(())
}

#[test]
fn cost_zero_inserts_nothing() -> Result {
    let clock = ManualClock::new();
    let limiter = gcra::<u64>(5, 10, &clock)?;
    assert_eq!(limiter.check_key(&1, 0)?.remaining(), 5);
    assert_eq!(limiter.len(), 0);
    Ok(())
}

#[test]
fn invalid_configuration_is_a_typed_error() -> Result {
    let quota = Quota::per_second(1)?;
    let clock = ManualClock::new();
    let build = |capacity, stripes, window| {
        KeyedLimiter::<u64, Gcra, _>::builder_with_clock(quota, capacity, clock.clone())
            .stripes(stripes)
            .window(window)
            .build()
            .map(|_| ())
    };
    assert_eq!(build(0, 1, 8), Err(KeyedError::ZeroCapacity));
    assert_eq!(
        build(10, 3, 8),
        Err(KeyedError::InvalidStripes { stripes: 3 })
    );
    assert_eq!(
        build(10, 0, 8),
        Err(KeyedError::InvalidStripes { stripes: 0 })
    );
    assert_eq!(
        build(10, 1, 2),
        Err(KeyedError::InvalidWindow { window: 2 })
    );
    assert_eq!(
        build(10, 1, 65),
        Err(KeyedError::InvalidWindow { window: 65 })
    );
    assert!(matches!(
        build(usize::MAX, 1, 8),
        Err(KeyedError::CapacityTooLarge { .. })
    ));
    assert!(matches!(
        build(usize::MAX / 16, 1, 8),
        Err(KeyedError::CapacityTooLarge { .. })
    ));
    assert!(KeyedError::ZeroCapacity.to_string().contains("capacity"));
    Ok(())
}

#[test]
fn memory_is_fixed_and_within_24_bytes_per_key() -> Result {
    let clock = ManualClock::new();
    let limiter = gcra::<u64>(1, 100_000, &clock)?;
    let bytes = limiter.memory_bytes();
    assert!(limiter.slots() >= 100_000 * 10 / 7);
    assert!(bytes >= limiter.slots() * 16);
    assert!(bytes <= 24 * 100_000, "{bytes} bytes for 100 000 keys");
    for key in 0..50_000u64 {
        limiter.check_key(&key, 1)?;
    }
    assert_eq!(limiter.memory_bytes(), bytes);
    assert_eq!(limiter.len(), 50_000);
    assert_eq!(limiter.overflow_decisions(), 0);
    Ok(())
}

#[test]
fn idle_keys_are_evicted_and_their_next_decision_is_fresh() -> Result {
    let clock = ManualClock::new();
    // 4 slots, 1 per second, burst 2: a key is fresh 1 s after its last single admission.
    let limiter = tiny(Quota::per_second(1)?.with_burst(2)?, 4, &clock)?;
    assert_eq!(limiter.slots(), 4);
    for key in 0..4u64 {
        assert!(limiter.check_key(&key, 1)?.is_allowed());
    }
    assert_eq!(limiter.len(), 4);
    clock.advance(Duration::from_secs(1));
    // All four are fresh now: 100 new keys recycle the slots without overflowing.
    for key in 100..200u64 {
        assert_eq!(limiter.check_key(&key, 1)?.remaining(), 1);
        clock.advance(Duration::from_secs(1));
    }
    assert_eq!(limiter.len(), 4);
    assert_eq!(limiter.overflow_decisions(), 0);
    // An evicted key starts again exactly as a new key would.
    assert_eq!(limiter.check_key(&0, 1)?, Decision::allowed(1, 1_000 * MS));
    Ok(())
}

#[test]
fn idle_keys_are_kept_while_the_window_has_an_empty_slot() -> Result {
    let clock = ManualClock::new();
    let limiter = tiny(Quota::per_second(1)?.with_burst(2)?, 4, &clock)?;
    assert!(limiter.check_key(&0, 1)?.is_allowed());
    clock.advance(Duration::from_secs(1)); // key 0 is fresh (evictable) from here on
    // Three new keys take the three empty slots; none evicts key 0, so none of them, and not key 0
    // when it comes back, pays for a new insert.
    for key in 1..4u64 {
        assert!(limiter.check_key(&key, 1)?.is_allowed());
    }
    assert_eq!(limiter.len(), 4);
    // Only a full window makes a new key take the idle key's slot.
    assert!(limiter.check_key(&4, 1)?.is_allowed());
    assert_eq!(limiter.len(), 4);
    assert_eq!(limiter.overflow_decisions(), 0);
    Ok(())
}

#[test]
fn a_full_window_of_live_keys_sends_new_keys_to_the_shared_overflow_state() -> Result {
    let clock = ManualClock::new();
    let limiter = tiny(Quota::per_second(1)?.with_burst(3)?, 4, &clock)?;
    for key in 0..4u64 {
        assert_eq!(limiter.check_key(&key, 1)?.remaining(), 2);
    }
    // Live keys (TAT ahead of now) are never evicted: new keys share one overflow bucket of 3.
    let overflow: Vec<bool> = (10..15u64)
        .map(|key| limiter.check_key(&key, 1).map(|d| d.is_allowed()))
        .collect::<std::result::Result<_, _>>()?;
    assert_eq!(overflow, [true, true, true, false, false]);
    assert_eq!(limiter.overflow_decisions(), 5);
    assert_eq!(limiter.len(), 4);
    // The live keys kept their own states (no fresh burst): 2 left each.
    for key in 0..4u64 {
        assert_eq!(limiter.check_key(&key, 1)?.remaining(), 1);
    }
    Ok(())
}

#[test]
fn racing_eviction_never_takes_a_live_key_with_window_algorithms() -> Result {
    let clock = ManualClock::new();
    let limiter: KeyedLimiter<u64, FixedWindow, _> =
        KeyedLimiter::builder_with_clock(Quota::per_second(2)?, 1, clock.clone())
            .stripes(1)
            .window(4)
            .build()?;
    for key in 0..4u64 {
        limiter.check_key(&key, 1)?;
    }
    assert!(limiter.check_key(&9, 1)?.is_allowed());
    assert_eq!(limiter.overflow_decisions(), 1);
    clock.advance(Duration::from_secs(1)); // next window: all four are fresh
    assert!(limiter.check_key(&9, 1)?.is_allowed());
    assert_eq!(
        limiter.overflow_decisions(),
        1,
        "key 9 took an expired key's slot"
    );

    let sliding: KeyedLimiter<u64, SlidingWindow, _> =
        KeyedLimiter::builder_with_clock(Quota::per_second(2)?, 1, clock.clone())
            .stripes(1)
            .window(4)
            .build()?;
    for key in 0..4u64 {
        sliding.check_key(&key, 1)?;
    }
    clock.advance(Duration::from_secs(1)); // previous window still weighs: not fresh
    assert!(sliding.check_key(&9, 1)?.is_allowed());
    assert_eq!(sliding.overflow_decisions(), 1);
    clock.advance(Duration::from_secs(1));
    assert!(sliding.check_key(&9, 1)?.is_allowed());
    assert_eq!(sliding.overflow_decisions(), 1);
    Ok(())
}

#[test]
fn overrides_give_a_key_its_own_quota_and_pin_it() -> Result {
    let clock = ManualClock::new();
    let limiter = tiny(Quota::per_second(1)?, 4, &clock)?;
    let premium = Quota::per_second(10)?;
    limiter.set_override(&42, premium)?;
    assert_eq!(limiter.quota_for(&42), &premium);
    assert_eq!(limiter.quota_for(&1), &Quota::per_second(1)?);
    for i in 0..10 {
        assert_eq!(limiter.check_key(&42, 1)?.remaining(), 9 - i);
    }
    assert!(!limiter.check_key(&42, 1)?.is_allowed());
    // Pinned: long idle, then three other keys plus a flood of new keys never evict it.
    clock.advance(Duration::from_secs(10));
    for key in 0..50u64 {
        limiter.check_key(&key, 1)?;
        clock.advance(Duration::from_secs(1));
    }
    assert_eq!(limiter.quota_for(&42), &premium);
    assert_eq!(limiter.check_key(&42, 1)?.remaining(), 9);
    // A second premium key shares the tier; remove_override unpins and restores the default.
    limiter.set_override(&43, premium)?;
    assert!(limiter.remove_override(&42));
    assert!(!limiter.remove_override(&42));
    assert!(!limiter.remove_override(&7_777));
    assert_eq!(limiter.quota_for(&42), &Quota::per_second(1)?);
    Ok(())
}

#[test]
fn override_errors() -> Result {
    let clock = ManualClock::new();
    let limiter = tiny(Quota::per_second(1)?.with_burst(5)?, 4, &clock)?;
    for i in 0..MAX_OVERRIDE_QUOTAS as u64 {
        limiter.set_override(&(i % 2), Quota::per_second(i + 2)?)?;
    }
    assert_eq!(
        limiter.set_override(&0, Quota::per_second(1_000)?),
        Err(KeyedError::TooManyOverrideQuotas)
    );
    // Reusing an existing override quota needs no new tier.
    limiter.set_override(&2, Quota::per_second(2)?)?;
    limiter.check_key(&3, 1)?; // live key fills the last slot
    assert_eq!(
        limiter.set_override(&4, Quota::per_second(2)?),
        Err(KeyedError::WindowFull)
    );
    Ok(())
}

#[test]
fn a_table_at_capacity_rarely_overflows() -> Result {
    let clock = ManualClock::new();
    // A fixed seed keeps the figures reproducible; over random seeds they vary by a few tens.
    for (window, max_overflow) in [(8, 500), (16, 200), (32, 50)] {
        let limiter: KeyedLimiter<u32, Gcra, _> =
            KeyedLimiter::builder_with_clock(Quota::per_second(1)?, 10_000, clock.clone())
                .stripes(64)
                .window(window)
                .hasher_seed(2026)
                .build()?;
        assert_eq!(limiter.stripes(), 64);
        for key in 0..10_000u32 {
            limiter.check_key(&key, 1)?;
        }
        // 10 000 live keys in 14 336 slots: nearly all get their own slot.
        let overflowed = limiter.overflow_decisions();
        assert_eq!(limiter.len() + overflowed, 10_000);
        assert!(
            overflowed <= max_overflow,
            "window {window}: {overflowed} overflowed"
        );
        eprintln!("window {window}: {overflowed} of 10 000 keys overflowed at capacity");
    }
    Ok(())
}

#[test]
fn the_limiter_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<KeyedLimiter<str, Gcra, ManualClock>>();
    assert_send_sync::<KeyedLimiter<IpAddr, SlidingWindow>>();
}

#[test]
fn threads_racing_on_shared_keys_at_a_frozen_instant_admit_exactly_each_burst() -> Result {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u64, Gcra, _>::builder_with_clock(
        Quota::per_second(1)?.with_burst(500)?,
        64,
        clock.clone(),
    )
    .build()?;
    // 4 threads × 2 000 checks over 8 keys, all at one instant: each key admits exactly its burst.
    let admitted: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let limiter = &limiter;
                scope.spawn(move || {
                    (0..2_000u64)
                        .filter(|i| {
                            limiter
                                .check_key(&((i + t) % 8), 1)
                                .is_ok_and(|d| d.is_allowed())
                        })
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    assert_eq!(admitted, 8 * 500);
    assert_eq!(limiter.len(), 8);
    for key in 0..8u64 {
        assert!(!limiter.check_key(&key, 1)?.is_allowed());
    }
    Ok(())
}

#[test]
fn check_keys_yields_one_result_per_key_in_order_and_nothing_after() -> Result {
    let clock = ManualClock::new();
    let limiter = gcra::<str>(2, 100, &clock)?;
    // More keys than the lookahead, so some are located while others are decided.
    let keys: Vec<String> = (0..20).map(|i| format!("key-{}", i % 7)).collect();
    let mut decisions = limiter.check_keys(keys.iter().map(String::as_str), 1);
    assert_eq!(decisions.size_hint(), (20, Some(20)));
    let remaining: Vec<u64> = decisions
        .by_ref()
        .map(|d| d.map(|d| d.remaining()))
        .collect::<std::result::Result<_, _>>()?;
    // Each of the 7 keys appears 3 times (2 for the last one): burst 2, so 1, 0, then denied (0).
    assert_eq!(&remaining[..7], &[1; 7]);
    assert_eq!(&remaining[7..14], &[0; 7]);
    assert_eq!(&remaining[14..], &[0; 6]);
    assert_eq!(decisions.next(), None);
    assert_eq!(limiter.len(), 7);
    // A cost above the burst is an error for that key only.
    let results: Vec<_> = limiter.check_keys(["a", "b"], 3).collect();
    assert_eq!(
        results,
        [Err(CheckError::CostExceedsCapacity {
            cost: 3,
            capacity: 2
        }); 2]
    );
    assert_eq!(limiter.check_keys(std::iter::empty::<&str>(), 1).count(), 0);
    Ok(())
}

/// Issue 11, finding 1: a key decided by its stripe's overflow state, then inserted once the table has
/// room again, must not get a second burst. Capacity 1 (one stripe of 32 slots), 10/s burst 10:
/// 32 fillers at t = 0, key K takes 10 through the overflow state; at t = 100 ms the fillers are fresh
/// and K is inserted: a lone limiter would have 1 unit for K, so a cost of 10 must be denied.
#[test]
fn a_key_inserted_after_overflowing_gets_no_second_burst() -> Result {
    let clock = ManualClock::new();
    let quota = Quota::per_second(10)?.with_burst(10)?;
    let limiter: KeyedLimiter<u64, Gcra, _> =
        KeyedLimiter::builder_with_clock(quota, 1, clock.clone())
            .hasher_seed(7)
            .build()?;
    assert_eq!((limiter.stripes(), limiter.window()), (1, 32));
    for filler in 0..32u64 {
        assert!(limiter.check_key(&filler, 1)?.is_allowed());
    }
    let k = 1_000u64;
    let lone = tollgate_core::AtomicLimiter::<Gcra, _>::with_clock(quota, clock.clone())?;
    assert!(lone.check_n(10)?.is_allowed());
    assert!(limiter.check_key(&k, 10)?.is_allowed());
    assert_eq!(limiter.overflow_decisions(), 1);

    clock.advance(Duration::from_millis(100));
    assert!(!lone.check_n(10)?.is_allowed());
    assert!(!limiter.check_key(&k, 10)?.is_allowed(), "second burst");
    assert_eq!(
        limiter.overflow_decisions(),
        1,
        "K was inserted, not overflowed"
    );
    Ok(())
}

/// A peek for a new key whose window is full of idle (fresh) keys predicts the check that will evict
/// one of them: the key's own fresh state, not the stripe's overflow state (which is still busy).
#[test]
fn a_peek_for_a_new_key_counts_fresh_keys_as_room() -> Result {
    let clock = ManualClock::new();
    // T = D = 100 ms.
    let limiter = tiny(Quota::per_second(10)?.with_burst(1)?, 4, &clock)?;
    for key in 0..4u64 {
        assert!(limiter.check_key(&key, 1)?.is_allowed());
    }
    clock.set(50 * MS);
    assert!(limiter.check_key(&10, 1)?.is_allowed());
    assert_eq!(limiter.overflow_decisions(), 1);
    // At 120 ms the four keys are fresh; the overflow state (TAT 150 ms) is not.
    clock.set(120 * MS);
    assert!(limiter.peek_key(&20, 1)?.is_allowed());
    assert!(limiter.check_key(&20, 1)?.is_allowed());
    assert_eq!(limiter.overflow_decisions(), 1, "20 took a slot");
    Ok(())
}

#[test]
fn a_pinned_key_is_never_evicted_and_its_override_always_fits() -> Result {
    let clock = ManualClock::new();
    // One window of 4 slots: key 0 pinned while fresh, then three live keys fill the rest.
    let limiter = tiny(Quota::per_second(1)?, 4, &clock)?;
    limiter.pin_key(&0)?;
    assert_eq!(limiter.len(), 1, "a pin makes the key resident");
    assert!(
        limiter.check_key(&0, 1)?.is_allowed(),
        "and changes no decision"
    );
    clock.advance(Duration::from_secs(5));
    for key in 1..4 {
        limiter.check_key(&key, 1)?;
    }
    // Key 0 is fresh again, so a new key would evict it, but it is pinned: the new key overflows.
    let before = limiter.overflow_decisions();
    limiter.check_key(&4, 1)?;
    assert_eq!(limiter.overflow_decisions(), before + 1);
    // Its override fits although the window is full of live keys; key 5's does not.
    limiter.set_override(&0, Quota::per_second(2)?)?;
    assert_eq!(
        limiter.set_override(&5, Quota::per_second(2)?),
        Err(KeyedError::WindowFull)
    );
    assert_eq!(limiter.pin_key(&5), Err(KeyedError::WindowFull));
    assert!(limiter.unpin_key(&0));
    assert!(!limiter.unpin_key(&0), "pins count");
    Ok(())
}

#[test]
fn check_override_quotas_counts_the_new_quotas_against_the_free_tiers() -> Result {
    let clock = ManualClock::new();
    let limiter = tiny(Quota::per_second(1)?, 4, &clock)?;
    for i in 0..MAX_OVERRIDE_QUOTAS as u64 - 2 {
        limiter.set_override(&0, Quota::per_second(i + 2)?)?;
    }
    let (known, new1, new2) = (
        Quota::per_second(2)?,
        Quota::per_second(500)?,
        Quota::per_second(600)?,
    );
    limiter.check_override_quotas(&[known, new1, new1, new2])?;
    assert_eq!(
        limiter.check_override_quotas(&[new1, new2, Quota::per_second(700)?]),
        Err(KeyedError::TooManyOverrideQuotas)
    );
    Ok(())
}

#[test]
fn a_table_the_allocator_cannot_provide_is_an_error_not_an_abort() {
    // 2^45 keys: ~800 TB of slots, within isize::MAX but beyond any address space, so the
    // allocation itself fails (under any overcommit setting) and must come back as an error.
    let capacity = 1usize << 45;
    let built = KeyedLimiter::<u64, Gcra>::new(Quota::per_second(1).unwrap(), capacity);
    assert_eq!(built.err(), Some(KeyedError::CapacityTooLarge { capacity }));
}

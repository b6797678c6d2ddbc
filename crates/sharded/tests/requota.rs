//! Changing a keyed table's default quota while it is in use (`set_default` / `set_quota`): every
//! key's state carries over as-is in units, capped by the new capacity. Manual clock only.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_core::{FixedWindow, Gcra, LeakyBucket, ManualClock, Quota, SlidingWindow};
use tollgate_sharded::KeyedLimiter;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

fn taken<A: tollgate_core::Algorithm>(
    limiter: &KeyedLimiter<str, A, ManualClock>,
    key: &str,
    now: u64,
) -> u64 {
    let mut n = 0;
    while limiter
        .check_key_at(key, now, 1)
        .is_ok_and(|d| d.is_allowed())
    {
        n += 1;
    }
    n
}

#[test]
fn a_key_that_spent_its_burst_gets_nothing_back_whatever_the_new_quota() -> Result {
    let ten_per_second = Quota::per_second(10)?;
    for new in [
        Quota::per_minute(10)?, // tighter: in time it had 9 back at once
        Quota::per_second(10)?.with_burst(30)?, // deeper: in time it had 20 back at once
        Quota::per_second(100)?, // faster
        Quota::per_hour(1)?,    // a burst of one
    ] {
        let clock = ManualClock::new();
        let limiter =
            KeyedLimiter::<str, Gcra, _>::with_clock(ten_per_second, 1_000, clock.clone())?;
        let now = limiter.now();
        assert!(limiter.check_key_at("spent", now, 10)?.is_allowed());
        assert!(limiter.check_key_at("half", now, 5)?.is_allowed());
        limiter.set_quota(new)?;
        assert_eq!(limiter.quota(), &new);
        assert_eq!(taken(&limiter, "spent", now), 0, "{new:?}");
        assert_eq!(taken(&limiter, "half", now), 5.min(new.burst()), "{new:?}");
        // A new key gets the new quota's whole burst.
        assert_eq!(taken(&limiter, "new", now), new.burst(), "{new:?}");
        // And the spent key refills at the new rate from the change on.
        let later = now + new.emission_interval_nanos();
        assert_eq!(taken(&limiter, "spent", later), 1, "{new:?}");
    }
    Ok(())
}

#[test]
fn every_algorithm_and_the_overflow_state_carry_over() -> Result {
    fn case<A: tollgate_core::Algorithm>(old: Quota, new: Quota) -> Result<(u64, u64, u64)> {
        let clock = ManualClock::new();
        // One stripe, a window of 4 slots and capacity 1: key "a" takes a slot, "b".."d" fill
        // the window, and "z" is decided by the overflow state.
        let limiter = KeyedLimiter::<str, A, _>::builder_with_clock(old, 1, clock.clone())
            .stripes(1)
            .window(4)
            .hasher_seed(7)
            .build()?;
        clock.advance(Duration::from_secs(100));
        let now = limiter.now();
        for key in ["a", "b", "c", "d", "e", "f", "g"] {
            limiter.check_key_at(key, now, 1)?;
        }
        let overflowed = limiter.overflow_decisions();
        assert!(overflowed > 0, "some key overflowed");
        limiter.set_quota(new)?;
        let a = taken(&limiter, "a", now);
        let before = limiter.overflow_decisions();
        let z = taken(&limiter, "z", now);
        assert!(
            limiter.overflow_decisions() > before,
            "z is an overflow key"
        );
        Ok((a, z, overflowed as u64))
    }
    let (old, new) = (Quota::per_second(4)?, Quota::per_second(8)?);
    // "a" spent 1 of 4: it keeps 3 (as-is; in place, the window counters would have handed 7).
    let (a, _, _) = case::<FixedWindow>(old, new)?;
    assert_eq!(a, 3);
    let (a, _, _) = case::<SlidingWindow>(old, new)?;
    assert_eq!(a, 3);
    let (old, new) = (Quota::per_second(4)?, Quota::per_minute(4)?);
    let (a, z, overflowed) = case::<Gcra>(old, new)?;
    assert_eq!(a, 3);
    // The overflow state spent one unit per overflowed decision: it keeps what it had.
    assert_eq!(z, 4 - overflowed);
    let (a, _, _) = case::<LeakyBucket>(old, new)?;
    assert_eq!(a, 3);
    Ok(())
}

#[test]
fn overrides_carry_over_both_ways() -> Result {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<str, Gcra, _>::with_clock(Quota::per_second(10)?, 100, clock)?;
    let now = limiter.now();
    assert!(limiter.check_key_at("k", now, 10)?.is_allowed());
    // A tighter override for a key that just spent its burst: still nothing (in place: 9).
    limiter.set_override("k", Quota::per_minute(10)?)?;
    assert_eq!(taken(&limiter, "k", now), 0);
    limiter.remove_override("k");
    assert_eq!(taken(&limiter, "k", now), 0);
    // A fresh key given an override starts with the override's whole burst.
    limiter.set_override("vip", Quota::per_second(50)?)?;
    assert_eq!(taken(&limiter, "vip", now), 50);
    Ok(())
}

#[test]
fn a_key_decided_before_the_sweep_reaches_it_is_carried_over_by_its_decision() -> Result {
    // Two generations in a row: each change finishes its sweep, so the third quota's carry-over is
    // from the second, never from the first.
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<str, Gcra, _>::with_clock(Quota::per_second(3)?, 100, clock)?;
    let now = limiter.now();
    assert!(limiter.check_key_at("k", now, 2)?.is_allowed());
    limiter.set_quota(Quota::per_minute(3)?)?;
    limiter.set_quota(Quota::per_second(3)?.with_burst(6)?)?;
    limiter.set_quota(Quota::per_hour(3)?)?;
    assert_eq!(taken(&limiter, "k", now), 1);
    Ok(())
}

#[test]
fn alternating_quotas_under_concurrent_decisions_never_admit_more_than_one_burst() -> Result {
    // Four threads take from one key at a frozen instant while the main thread alternates two
    // quotas of burst 3. At one instant no carry-over can add a unit, so the key gets 3 in all.
    let a = Quota::per_second(3)?;
    let b = Quota::per_minute(3)?;
    for round in 0..20 {
        let clock = ManualClock::new();
        let limiter = Arc::new(KeyedLimiter::<str, Gcra, _>::with_clock(a, 64, clock)?);
        let now = limiter.now();
        let admitted = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (limiter, admitted) = (Arc::clone(&limiter), Arc::clone(&admitted));
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        if limiter
                            .check_key_at("k", now, 1)
                            .is_ok_and(|d| d.is_allowed())
                        {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for i in 0..100 {
            limiter.set_quota(if i % 2 == 0 { b } else { a })?;
        }
        for thread in threads {
            thread.join().map_err(|_| "a deciding thread panicked")?;
        }
        assert!(
            admitted.load(Ordering::Relaxed) <= 3,
            "round {round}: {} admitted",
            admitted.load(Ordering::Relaxed)
        );
    }
    Ok(())
}

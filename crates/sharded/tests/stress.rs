//! Std-threads stress tests beside the loom models of `loom-tests/tests/sharded.rs`: 8 threads,
//! started together, hammer one key of a keyed table at a frozen `ManualClock` instant, round after
//! round; each round must admit exactly the key's allowance. A lost update on the slot (a
//! read-modify-write of the 128-bit pair that is not one compare-and-swap) admits more, so plain
//! `cargo test` catches a broken slot CAS.
//!
//! Each round moves the clock 10 s on, so every key is fresh (fully refilled) again.

use tollgate_core::{Gcra, ManualClock, Nanos, Quota, SlidingWindow};
use tollgate_sharded::KeyedLimiter;
use tollgate_test_support::stress::{Stress, assert_exact_every_round};

const SEC: Nanos = 1_000_000_000;
/// The allowance per key per round.
const LIMIT: u64 = 2048;
/// Checks per thread per round: the threads together ask for twice the allowance.
const CHECKS: usize = 2 * LIMIT as usize / Stress::DEFAULT.threads;

fn round_instant(round: usize) -> Nanos {
    (round as Nanos + 1) * 10 * SEC
}

/// Cost-1 checks of `key`: odd threads through `check_keys` (the prefetching stream), even threads
/// through `check_key`; returns how many were admitted.
fn hammer_key<A: tollgate_core::Algorithm>(
    limiter: &KeyedLimiter<u64, A, ManualClock>,
    key: u64,
    thread: usize,
) -> u64 {
    if thread % 2 == 1 {
        let keys = vec![key; CHECKS];
        limiter
            .check_keys(&keys, 1)
            .filter(|decision| decision.as_ref().unwrap().is_allowed())
            .count() as u64
    } else {
        (0..CHECKS)
            .filter(|_| limiter.check_key(&key, 1).unwrap().is_allowed())
            .count() as u64
    }
}

#[test]
fn one_hot_key_admits_exactly_its_burst_every_round() {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u64, Gcra, _>::builder_with_clock(
        Quota::per_second(LIMIT).unwrap(),
        1_000,
        clock.clone(),
    )
    .hasher_seed(3)
    .build()
    .unwrap();
    assert_exact_every_round(
        |round| {
            clock.set(round_instant(round));
            LIMIT
        },
        |_, thread| hammer_key(&limiter, 42, thread),
    );
    assert_eq!(limiter.len(), 1);
    assert_eq!(limiter.overflow_decisions(), 0);
}

#[test]
fn a_new_key_raced_into_a_full_window_admits_exactly_its_limit_every_round() {
    // One stripe of 8 slots, every key's window the whole stripe: from round 8 on each round's new key
    // evicts an idle one (the previous rounds' keys are fresh 10 s later) while all 8 threads race its
    // insert. Sliding window, so the eviction path runs with a second algorithm too.
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u64, SlidingWindow, _>::builder_with_clock(
        Quota::per_second(LIMIT).unwrap(),
        1,
        clock.clone(),
    )
    .stripes(1)
    .window(8)
    .hasher_seed(5)
    .build()
    .unwrap();
    assert_eq!(limiter.slots(), 8);
    assert_exact_every_round(
        |round| {
            clock.set(round_instant(round));
            LIMIT
        },
        |round, thread| hammer_key(&limiter, 1_000 + round as u64, thread),
    );
    assert_eq!(limiter.len(), 8);
    assert_eq!(limiter.overflow_decisions(), 0);
}
